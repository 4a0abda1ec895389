"""The bundle's DP training as a subclass of substrafl's TorchFedAvgAlgo, for users who know that
class.

substrafl's `train` does the FedAvg part (apply the average, train, send the change, keep the global
model); the DP part replaces the two places it leaves open: `_local_train` runs the skeleton's
training run (Opacus' DP step on the book-keeping clipping of assets/algo_torch_dp), and the index
generator is `PoissonIndexGenerator`, through which the skeleton's Poisson batches pass, so that
substrafl's count of local updates is the run's steps. The local state is the bundle's model file
(algo.DpTraining), not a torch checkpoint: it holds no optimizer or random generator state (the
noise of every run is fresh), and torch.load never unpickles it.
"""
from __future__ import annotations

import numpy as np
import torch
from substrafl.algorithms.pytorch import TorchFedAvgAlgo
from substrafl.index_generator.base import BaseIndexGenerator
from substrafl.remote import remote_data

from mnist_dp.federated.algo import DpTraining, check_hyperparameters, load_framework
from mnist_dp.federated.strategy import LedgerSharedState
from mnist_dp.learning.interface import Network


class OpenerDataset(torch.utils.data.Dataset):
    """The opener's data (images, labels and the samples' identities the ledger needs), as TorchAlgo
    wants a dataset class."""

    def __init__(self, data_from_opener: dict, is_inference: bool):
        self.data = data_from_opener
        self.is_inference = is_inference

    def __len__(self) -> int:
        return len(self.data["labels"])

    def __getitem__(self, index):
        image = torch.from_numpy(np.asarray(self.data["images"][index]))
        return image if self.is_inference else (image, int(self.data["labels"][index]))


class PoissonIndexGenerator(BaseIndexGenerator):
    """substrafl's index generator fed with the run's batches (training.sampled_batches: Poisson
    sampling with rate q, or shuffled batches without DP): its number of updates is the run's steps,
    which TorchFedAvgAlgo checks after training. It draws nothing itself."""

    def __init__(self):
        # both set by `feed`; it draws nothing
        super().__init__(batch_size=1, num_updates=0, seed=None)
        self._batches = iter(())

    def feed(self, batches, plan):
        """training.fit's `through`: this run's batches, every one of them handed on unchanged."""
        self._num_updates, self._batches = plan.steps, batches
        # E[B]: only TorchAlgo's predict would read it
        self._batch_size = max(1, round(plan.expected_batch_size))
        return self

    def reset_counter(self) -> None:
        super().reset_counter()
        self._num_updates = 0  # until `feed` brings a run's batches (FedAvg's last task has none)

    def __next__(self) -> np.ndarray:
        if self._counter >= self._num_updates:
            raise StopIteration
        batch = next(self._batches)
        self._counter += 1
        return batch


class TorchDpFedAvgAlgo(DpTraining, TorchFedAvgAlgo):
    """TorchFedAvgAlgo with the bundle's DP-SGD, Poisson sampling and privacy ledger; σ for `rounds`
    rounds (algo.DpFedAvgAlgo says how). `hyperparameters`: a full set, as
    assets/algo_torch_dp/hyperparameters.json."""

    def __init__(self, hyperparameters: dict, rounds: int):
        hp = check_hyperparameters(hyperparameters, rounds)
        # the same at every organisation
        model = load_framework("torch").new_model(hp.seed, Network.of(hp))
        super().__init__(model=model, criterion=torch.nn.CrossEntropyLoss(), optimizer=None,
                         index_generator=PoissonIndexGenerator(), dataset=OpenerDataset,
                         disable_gpu=True,
                         # substrafl re-creates the algo with these
                         hyperparameters=hyperparameters, rounds=rounds)
        self._setup("torch", hyperparameters, rounds)

    @remote_data
    def train(self, data_from_opener: dict, shared_state=None) -> LedgerSharedState:
        """TorchFedAvgAlgo's train, with the ledgers: the aggregator's merge kept, this
        organisation's sent."""
        self._receive(shared_state)
        sent = TorchFedAvgAlgo.train(self, data_from_opener=data_from_opener,
                                     shared_state=shared_state, _skip=True)
        # FedAvg's weight: the public size, not substrafl's count of the data
        return self._shared_state(self._public_size, sent.parameters_update)

    def _local_train(self, train_dataset: OpenerDataset) -> None:
        # The Opacus optimizer is the DP step's own, built per run:
        # TorchAlgo's optimizer stays None.
        self._public_size = self._train_run(train_dataset.data, through=self._index_generator.feed)

    def load_local_state(self, path):
        DpTraining.load_local_state(self, path)
        # TorchFedAvgAlgo.train applies an average only to a generator that knows n
        if self.ledger.events:
            self._index_generator.n_samples = self.ledger.events[-1].n
        return self
