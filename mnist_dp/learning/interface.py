"""What an algo asset supplies, a `Framework`, and what passes between it and the shared code
(skeleton.py, training.py): the `Network` it builds and the `Ran` it reports back; the settings
each of its DP steps applies are training.DpStep. An asset holds framework code only; everything
else is shared.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from mnist_dp.hyperparameters import Hyperparameters, Training
from mnist_dp.learning import features as feature_maps
from mnist_dp.learning import initial_weights
from mnist_dp.privacy.model_file import ModelFile
from mnist_dp.privacy.task_plan import SamplingPlan

# The network's input normalisation (MNIST's pixel mean and std), the first layer
# of every framework's CNN.
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
# The ScatterNet CNN's group normalisation of each convolution's output, the same in
# every framework: channels per group, and the ε added to the variance (each
# framework has its own default).
GROUP_SIZE, NORM_EPS = 4, 1e-5
# Images per forward pass at prediction (bounds the memory); a framework may set its
# own `predict_batch_size`.
PREDICT_BATCH_SIZE = 1024


@dataclass(frozen=True)
class Network:
    """Which network a framework builds, the same in every framework: on "pixels" the TF Privacy /
    Opacus tutorial CNN; on "scattering" features (features.py, the inputs the skeleton gives it)
    Tramèr & Boneh's ScatterNet CNN with a linear shortcut ("cnn") or a linear classifier
    ("linear"); `activation` is the CNNs'."""

    features: str = "pixels"
    activation: str = "tanh"
    network: str = "cnn"

    @classmethod
    def of(cls, hp: Hyperparameters) -> Network:
        return cls(hp.features, hp.activation, hp.network)

    @classmethod
    def of_saved(cls, saved: ModelFile) -> Network:
        # Models saved before these options existed: the ReLU CNN on pixels; before "network",
        # scattering features always fed the linear classifier.
        hp = saved.hyperparameters
        features = hp.get("features", "pixels")
        return cls(features, hp.get("activation", "relu"),
                   hp.get("network", "linear" if features == "scattering" else "cnn"))

    def describe(self) -> str:
        return (f"network {self.network!r} on features {self.features!r}, activation "
                f"{self.activation!r}")

    def inputs(self, images: np.ndarray) -> np.ndarray:
        """Images [N, 28, 28] -> what the network takes: the same, or scattering features
        [N, 3969]."""
        return feature_maps.transform(images, self.features)


@dataclass
class Ran:
    """What a training run really ran: the batch size of every step taken and the library's ε
    (training.train_steps), σ, the clipping unit and the noise's source (training.fit); the ledger's
    event is made from it (TaskPlan.event)."""

    batch_sizes: list  # units (examples or persons) in each step taken: one entry per step
    # the DP library's own ε for this run, for comparison
    library_epsilon: dict = field(default_factory=dict)
    # the effective σ per example (0 without DP): training.fit's
    noise_multiplier: float | None = None
    # the clipping unit (events.PER_EXAMPLE or PER_PERSON, NO_CLIPPING without DP): fit's
    clipping: str | None = None
    # batches and noise from noise_seed (randomness.py): training.fit's
    replayable_noise: bool = False

    @property
    def steps(self) -> int:
        return len(self.batch_sizes)


# Called after each epoch with the number of steps run so far; returns a short progress text (ε so
# far) for the progress bar.
EpochCallback = Callable[[int], str]


class Framework:
    """What an algo asset fills in: a subclass with the same hooks (HOOKS), of the same signatures,
    in every framework; `new_model` is made from them, once for all. The shared training run
    (training.py) calls the hooks and owns everything else: the batches, σ and the clipping norm of
    each step, the loop over the steps, when the weight average takes the model's place, whether a
    library's ε is asked, and the ledger. `model` is the framework's network object; `optimizer`
    what its `optimizer` hook returned. No hook is given the hyperparameters or the privacy plan:
    each gets the settings it applies (Network, Training, training.DpStep, the SamplingPlan).

    A fourth framework is one asset whose algo.py fills these hooks, for example::

        class JaxPrivacy(interface.Framework):
            name = "jax"

            def network(self, network): return build(network)
            def optimizer(self, model, training): return optax_with_average(training)
            def dp_step(self, model, optimizer, inputs, labels, step):
                return lambda batch, clip, sigma: clip_noise_and_apply(
                    model, optimizer, inputs[batch], ...)
            def plain_step(self, model, optimizer, inputs, labels): ...
            def end_training(self, model, optimizer, training): ...
            def library_epsilon(self, sampling, delta, steps, sigma): return {}
            def load_model(self, weights, network): ...
            def dump_model(self, model): ...
            def weight_arrays(self, model): ...
            def set_weight_arrays(self, model, arrays): ...
            def batch_logits(self, model, inputs): ...
    """

    name: str
    # Whether dp_step clips per person (step.persons): a framework without it refuses data with
    # subjects.npy before anything runs.
    per_person: bool = False

    # 1. The network.
    def network(self, network: Network):
        """`network` untrained, as the framework builds it (`new_model` sets its initial
        weights)."""
        raise NotImplementedError

    # 2. Training: training.train_steps calls these, in this order.
    def optimizer(self, model, training: Training):
        """The optimizer `training` names (SGD with momentum, or Adam, at its learning_rate) over
        `model`'s weights, keeping after every step its ema_decay's moving average of them (none
        at 0)."""
        raise NotImplementedError

    def dp_step(self, model, optimizer, inputs: np.ndarray, labels: np.ndarray,
                step) -> Callable[[np.ndarray, float, float], int]:
        """The DP-SGD step.

        Args:
          model: the framework's model, trained in place.
          optimizer: what the `optimizer` hook returned.
          inputs: the network's inputs [n, ...].
          labels: the labels [n].
          step: the mechanism's settings (training.DpStep): the "gradient noise" stream of
            step.randomness, step.secure_mode, step.expected_batch_size, which divides the noisy
            sum, step.canaries, passed the clipped sum before the noise when set, and
            step.persons, each example's person when the unit is a person (per_person).

        Returns:
          A function of (batch, C, σ): `batch` the indices of one Poisson batch (maybe none), C
          the clipping norm, σ the noise multiplier. It clips each unit's gradient to C (an
          example's, or with step.persons the sum of a person's examples'), sums them, adds
          N(0, σ²C²), divides by step.expected_batch_size, applies `optimizer`, and
          returns how many units had a gradient norm ≤ C.
        """
        raise NotImplementedError

    def plain_step(self, model, optimizer, inputs: np.ndarray,
                   labels: np.ndarray) -> Callable[[np.ndarray], None]:
        """The non-private step.

        Args:
          model: the framework's model, trained in place.
          optimizer: what the `optimizer` hook returned.
          inputs: the network's inputs [n, ...].
          labels: the labels [n].

        Returns:
          A function of one batch's indices that applies the batch's mean-loss gradient.
        """
        raise NotImplementedError

    def end_training(self, model, optimizer, training: Training) -> None:
        """After the last step: the weight average takes the weights' place in `model`.

        Args:
          model: the framework's model.
          optimizer: what the `optimizer` hook returned.
          training: the optimizer's settings: ema_decay is the weight average's.
        """
        raise NotImplementedError

    def library_epsilon(self, sampling: SamplingPlan, delta: float, steps: int,
                        sigma: float) -> dict:
        """The DP library's own ε, shown beside ours for comparison (the skeleton asks only where a
        library can account the run).

        Args:
          sampling: the run's sampling plan (n, q, the batch size and epochs it declares).
          delta: δ.
          steps: the steps the run took.
          sigma: its constant noise multiplier.

        Returns:
          {name of the library's accountant: ε at `delta`}.
        """
        raise NotImplementedError

    # 3. Weights in and out.
    def load_model(self, weights: bytes, network: Network):
        """The model of `network` with the weights `dump_model` wrote."""
        raise NotImplementedError

    def dump_model(self, model) -> bytes:
        """The model's weights as bytes (the model file's weights)."""
        raise NotImplementedError

    def weight_arrays(self, model) -> list:
        """Every weight of the model as numpy arrays in the common layout of initial_weights.py (the
        same order and shapes in every framework): initial weights, federated averaging, the audit's
        canaries, tests."""
        raise NotImplementedError

    def set_weight_arrays(self, model, arrays: list):
        """The model with its weights replaced by `arrays` (the order of `weight_arrays`); returns
        it."""
        raise NotImplementedError

    def batch_logits(self, model, inputs: np.ndarray) -> np.ndarray:
        """Class scores [B, 10] (before softmax) of one batch of the network's inputs (images [B,
        28, 28], or features [B, 3969]); `predict_in_batches` calls it with `predict_batch_size` of
        them (a framework's own attribute, else PREDICT_BATCH_SIZE)."""
        raise NotImplementedError

    def notices(self, hp: Hyperparameters) -> list:
        """What a run of `hp` warns the user about (lines), said once per task before any step
        (default: none)."""
        return []

    def new_model(self, seed: int, network: Network):
        """`network` with the initial weights initial_weights.draw(network, seed): the same in every
        framework."""
        return self.set_weight_arrays(self.network(network), initial_weights.draw(network, seed))


HOOKS = ("network", "optimizer", "dp_step", "plain_step", "end_training", "library_epsilon",
         "load_model", "dump_model", "weight_arrays", "set_weight_arrays", "batch_logits",
         "notices")


def check_shapes(arrays: list, shapes: list) -> None:
    """Refuse weight arrays that are not shaped as a network's parameters (`shapes`), one for
    one."""
    if [tuple(np.shape(a)) for a in arrays] != [tuple(shape) for shape in shapes]:
        raise ValueError(f"weights shaped {[np.shape(a) for a in arrays]}, the network's "
                         f"{[tuple(s) for s in shapes]}")


def flat_weights(framework: Framework, model) -> np.ndarray:
    """All weights in one vector (the mechanism tests measure updates with it)."""
    return np.concatenate([a.ravel() for a in framework.weight_arrays(model)])
