"""mnist_dp/federated/torch_algo.py: the opener's data as a torch dataset, the index generator that
hands on the run's batches, and TorchDpFedAvgAlgo's local state across tasks."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import samples, tiny_hyperparameters
from substrafl.algorithms.pytorch import TorchFedAvgAlgo

from mnist_dp.assets import DATASET_ASSET, load_asset_module
from mnist_dp.federated.strategy import LedgerAveragedState
from mnist_dp.federated.torch_algo import OpenerDataset, PoissonIndexGenerator, TorchDpFedAvgAlgo


@pytest.fixture(scope="module")
def opener_data(tiny_data):
    opener = load_asset_module(DATASET_ASSET / "opener.py",
                               "opener_for_substrafl_tests").MnistOpener()
    return (opener.get_data(samples(tiny_data, "train")[:1]),
            opener.get_data(samples(tiny_data, "test")))


def new_algo(rounds):
    return TorchDpFedAvgAlgo(tiny_hyperparameters("torch", delta=1e-5), rounds)


def test_the_opener_dataset_gives_an_image_tensor_with_its_label_or_the_image_alone():
    """Training items are (image, int label); inference items the image only."""
    data = {"images": np.arange(3 * 28 * 28, dtype=np.float32).reshape(3, 28, 28) / 2352,
            "labels": np.array([4, 0, 9])}
    training, inference = OpenerDataset(data, is_inference=False), OpenerDataset(data, True)
    assert len(training) == len(inference) == 3
    image, label = training[2]
    assert torch.equal(image, torch.from_numpy(data["images"][2])) and label == 9
    assert type(label) is int
    assert torch.equal(inference[1], torch.from_numpy(data["images"][1]))


def test_the_index_generator_hands_on_exactly_the_runs_steps_batches_unchanged():
    """Fed 3 steps and 5 batches: the first 3, the same objects, then it stops; E[B] 63.6 -> 64."""
    batches = [np.array([k, k + 1]) for k in range(5)]
    generator = PoissonIndexGenerator()
    assert list(generator) == []  # nothing fed: no updates
    fed = generator.feed(iter(batches), SimpleNamespace(steps=3, expected_batch_size=63.6))
    assert fed is generator and generator.batch_size == 64 and generator.num_updates == 3
    handed = list(generator)
    assert len(handed) == 3 and all(a is b for a, b in zip(handed, batches))
    assert generator.counter == 3
    generator.check_num_updates()  # what TorchFedAvgAlgo checks after training
    generator.reset_counter()
    assert (generator.counter, generator.num_updates, list(generator)) == (0, 0, [])


def test_the_index_generators_batch_size_is_at_least_one():
    """An expected batch below one example still reports a batch size of 1."""
    plan = SimpleNamespace(steps=0, expected_batch_size=0.3)
    generator = PoissonIndexGenerator().feed(iter(()), plan)
    assert generator.batch_size == 1 and list(generator) == []


def test_the_torch_algo_is_a_torch_fed_avg_algo_whose_generator_passes_every_batch(tmp_path,
                                                                                   opener_data):
    """Its train is TorchFedAvgAlgo's, each of the run's steps one update of the generator."""
    train, _ = opener_data
    algo = new_algo(rounds=1)
    assert isinstance(algo, TorchFedAvgAlgo)
    algo.train(data_from_opener=train, _skip=True)
    steps = algo.ledger.events[-1].steps
    # ceil(150 / 64)
    assert algo._index_generator.counter == algo._index_generator.num_updates == steps == 3


def test_a_reloaded_local_state_applies_the_average_in_fedavgs_last_task(tmp_path, opener_data):
    """Reloaded, it knows n: the last task applies the average, trains nothing, sends a zero."""
    train, _ = opener_data
    algo = new_algo(rounds=1)
    sent = algo.train(data_from_opener=train, _skip=True)
    algo.save_local_state(tmp_path / "local")
    again = new_algo(rounds=1).load_local_state(tmp_path / "local")
    assert again._index_generator.n_samples == len(train["labels"]) == 150
    assert again.ledger.events == algo.ledger.events and len(again.ledger.events) == 1
    saved = again._weights()
    average = LedgerAveragedState(avg_parameters_update=[u / 2 for u in sent.parameters_update],
                                  ledger=sent.ledger)
    last = again.train(data_from_opener=train, shared_state=average, _skip=True)
    assert all(np.allclose(w, s + u / 2, atol=1e-6)
               for w, s, u in zip(again._weights(), saved, sent.parameters_update))
    assert last.n_samples == 150 and not any(np.any(u) for u in last.parameters_update)
    assert last.ledger == sent.ledger
