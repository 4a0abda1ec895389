"""The hyperparameters file every algo asset ships (``hyperparameters.json``): same keys everywhere.

| key              | meaning                                                                  |
|------------------|--------------------------------------------------------------------------|
| epochs           | passes over the data; each has ceil(n / batch_size) Poisson-sampled steps|
| batch_size       | expected batch size (sampling probability q = 1 / steps per epoch)       |
| learning_rate    | SGD learning rate                                                        |
| momentum         | SGD momentum                                                             |
| max_grad_norm    | per-example clipping norm C                                              |
| noise_multiplier | σ (noise std = σ·C, σ ≤ 1000); this **or** target_epsilon, not both      |
| target_epsilon   | calibrate σ so that the model's ε at delta (PLD) ends at this value      |
| max_epsilon      | budget (null: none): training stops at the last step that keeps the      |
|                  | model's ε at delta (input model's steps included) within it              |
| delta            | δ of the reported (ε, δ); must be < 1/n                                  |
| seed             | seeds the (data-independent) initialisation only                         |
| noise_seed       | null (default): batches and noise from fresh OS entropy, never stored;   |
|                  | an integer: replayable batches and noise, for tests and experiments (the |
|                  | model records it; ε holds only while it stays secret)                    |
| dp               | false trains the non-private baseline (no clipping, no noise, ε = inf)   |
| secure_mode      | floating-point-attack-resistant noise (Opacus' secure mode, in torch and |
|                  | mindspore); tf refuses it: TF Privacy has none                           |
| features         | what the network is given: "scattering", fixed scattering features       |
|                  | (Tramèr & Boneh 2021, features.py), or "pixels"                          |
| network          | "cnn": on scattering features Tramèr & Boneh's ScatterNet CNN with a     |
|                  | linear shortcut, on pixels the TF Privacy / Opacus tutorial CNN;         |
|                  | "linear": a linear classifier on scattering features                     |
| activation       | the CNN's: "tanh" (tempered sigmoid, Papernot et al. 2021) or "relu"     |
| optimizer        | "sgd" (with momentum) or "adam" (β = 0.9, 0.999): both only post-process |
|                  | the noisy gradient, so ε does not depend on the choice                   |
| ema_decay        | the saved weights are an exponential moving average of the iterates with |
|                  | this decay (0: the last iterate); post-processing, free in privacy       |
| noise_decay      | σ of epoch e is noise_multiplier · noise_decay^e (1: constant); the      |
|                  | accountant composes the epochs as they ran                               |
| clip_quantile    | adaptive clipping (Andrew et al. 2021): C follows this quantile of the   |
|                  | per-example gradient norms, estimated by a noisy count that ε includes;  |
|                  | null keeps C = max_grad_norm fixed                                       |
| clip_learning_rate | adaptive clipping's step: C ← C · exp(-rate · (noisy fraction unclipped |
|                  | - clip_quantile))                                                        |
| clip_count_stddev | std of the count's noise (null: E[B] / 20, the paper's choice)          |
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from mnist_dp import architectures
from mnist_dp.utils import json_input
from mnist_dp.utils.errors import UserError
from mnist_dp.utils.options import MAX_SEED
from mnist_dp.utils.words import noun_for

FILE_NAME = "hyperparameters.json"


@dataclass(frozen=True)
class Training:
    """What an algo's optimizer is made of (Hyperparameters.training): the settings a framework's
    optimizer hook reads, none that the privacy plan decides."""

    optimizer: str  # "sgd" (with momentum) or "adam"
    learning_rate: float
    momentum: float
    ema_decay: float  # the moving average of the weights saved in their place; 0: none


@dataclass(frozen=True)
class Hyperparameters:
    epochs: int
    batch_size: int
    learning_rate: float
    momentum: float
    max_grad_norm: float
    noise_multiplier: float | None
    target_epsilon: float | None
    max_epsilon: float | None
    delta: float
    seed: int
    dp: bool
    secure_mode: bool
    features: str = "pixels"
    network: str = "cnn"
    activation: str = "tanh"
    optimizer: str = "sgd"
    ema_decay: float = 0.0
    noise_decay: float = 1.0
    clip_quantile: float | None = None
    clip_learning_rate: float = 0.2
    clip_count_stddev: float | None = None
    noise_seed: int | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def training(self) -> Training:
        """The optimizer's settings."""
        return Training(self.optimizer, self.learning_rate, self.momentum, self.ema_decay)


# Bounds that catch typos and absurd values before any work starts: beyond them a run would
# take days or hours of accounting (epochs = 10^9), ε would protect nothing (target_epsilon =
# 10^9), or every step would overflow (learning_rate = 10^300). batch_size is bounded by the
# data (task_plan.SamplingPlan).
MAX_EPOCHS = 10_000
MAX_EPSILON = 100.0
MAX_STEP_SIZE = 1_000.0  # learning_rate, clip_learning_rate
# max_grad_norm, clip_count_stddev: beyond it the noise (σ ≤ 1,000 times it) would overflow float32
MAX_NORM = 1e30
# The most noise a user may ask: a step at σ = 1000 spends ε < 0.01 at any q, and RDP's numerics
# fail above ~3e4 (q = 1e-3). The least is privacy.events.MIN_NOISE_MULTIPLIER, where the
# accountant's numerics stop.
MAX_NOISE_MULTIPLIER = 1000.0
FEATURES = tuple(architectures.INPUT_MAPS)  # what the network is given (learning/features.py)
NETWORKS = architectures.NETWORKS
ACTIVATIONS = ("tanh", "relu")
OPTIMIZERS = ("sgd", "adam")


def _within(low: float, high: float):
    return lambda v: low < v <= high


# name -> (JSON type, may be null, test of the value, what it must be). Types are exact: 1.0 is not
# an integer and "false" is not a boolean (a string "false" would be truthy, i.e. DP *on*).
_RULES = {
    "epochs": (int, False, lambda v: 1 <= v <= MAX_EPOCHS, f"an integer from 1 to {MAX_EPOCHS:,}"),
    "batch_size": (int, False, lambda v: v >= 1, "a positive integer"),
    "learning_rate": (float, False, _within(0, MAX_STEP_SIZE),
                      f"a number in (0, {MAX_STEP_SIZE:g}]"),
    "momentum": (float, False, lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "max_grad_norm": (float, False, _within(0, MAX_NORM), f"a number in (0, {MAX_NORM:g}]"),
    "noise_multiplier": (float, True, _within(0, MAX_NOISE_MULTIPLIER),
                         f"a number in (0, {MAX_NOISE_MULTIPLIER:g}] or null"),
    "target_epsilon": (float, True, _within(0, MAX_EPSILON),
                       f"a number in (0, {MAX_EPSILON:g}] or null"),
    "max_epsilon": (float, True, _within(0, MAX_EPSILON),
                    f"a number in (0, {MAX_EPSILON:g}] or null"),
    "delta": (float, False, lambda v: 0 < v < 1, "a number in (0, 1)"),
    "seed": (int, False, lambda v: 0 <= v <= MAX_SEED, f"an integer from 0 to {MAX_SEED}"),
    "dp": (bool, False, None, "true or false"), "secure_mode": (bool, False, None, "true or false"),
    "features": (str, False, lambda v: v in FEATURES, f"one of {list(FEATURES)}"),
    "network": (str, False, lambda v: v in NETWORKS, f"one of {list(NETWORKS)}"),
    "activation": (str, False, lambda v: v in ACTIVATIONS, f"one of {list(ACTIVATIONS)}"),
    "optimizer": (str, False, lambda v: v in OPTIMIZERS, f"one of {list(OPTIMIZERS)}"),
    "ema_decay": (float, False, lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "noise_decay": (float, False, _within(0, 1), "a number in (0, 1]"),
    "clip_quantile": (float, True, lambda v: 0 < v < 1, "a number in (0, 1) or null"),
    "clip_learning_rate": (float, False, _within(0, MAX_STEP_SIZE),
                           f"a number in (0, {MAX_STEP_SIZE:g}]"),
    "clip_count_stddev": (float, True, _within(0, MAX_NORM),
                          f"a number in (0, {MAX_NORM:g}] or null"),
    "noise_seed": (int, True, lambda v: 0 <= v <= MAX_SEED,
                   f"an integer from 0 to {MAX_SEED} or null"),
}
KEYS = tuple(_RULES)


def kind(name: str) -> type:
    """The JSON type of hyperparameter `name`: int, float, bool or str."""
    return _RULES[name][0]


_JSON_NAMES = {bool: "a boolean", int: "an integer", float: "a decimal number", str: "a string",
               list: "an array", dict: "an object", type(None): "null"}
_NOISE = ("noise_multiplier", "target_epsilon", "max_epsilon", "noise_decay", "clip_quantile",
          "clip_learning_rate",
          # ignored by the non-private baseline (and secure_mode: it draws no noise)
          "clip_count_stddev")


def check_value(name: str, value, where: str, check_range: bool = True) -> None:
    """One hyperparameter's exact JSON type (and range): a UserError naming `where` otherwise.

    Args:
      name: the hyperparameter.
      value: its value (null allowed where the hyperparameter may be null).
      where: names the value's source in the error.
      check_range: check its range too, not only its type.
    """
    kind, nullable, test, what = _RULES[name]
    if value is None and nullable:
        return
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is str:
        ok = isinstance(value, str)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value,
                        bool) and math.isfinite(value)
    if not ok:
        found = _JSON_NAMES.get(type(value), type(value).__name__)
        raise UserError(f"{where}: {name} = {json.dumps(value)} is {found}; it must be {what}")
    if check_range and test is not None and not test(value):
        raise UserError(f"{where}: {name} = {json.dumps(value)} must be {what}")


def check_values(values: dict, where: str) -> None:
    """Every key known, every value of its exact type and in range (a non-private run's noise
    settings are ignored, so only their types are checked)."""
    unknown = set(values) - set(_RULES)
    if unknown:
        raise UserError(f"{where}: unknown {noun_for(len(unknown), 'hyperparameter')} "
                        f"{sorted(unknown)}; known: {sorted(_RULES)}")
    dp = values.get("dp", True)
    check_value("dp", dp, where)
    for name, value in values.items():
        check_value(name, value, where, check_range=dp or name not in _NOISE)


def parse(values: dict, where: str) -> Hyperparameters:
    """Validate a dict of hyperparameters; `where` names its source in error messages."""
    check_values(values, where)
    missing = set(_RULES) - set(values)
    if missing:
        raise UserError(f"{where}: missing {noun_for(len(missing), 'hyperparameter')} "
                        f"{sorted(missing)}")
    hp = Hyperparameters(**values)
    if hp.dp and (hp.noise_multiplier is None) == (hp.target_epsilon is None):
        raise UserError(f"{where}: give exactly one of noise_multiplier and target_epsilon (the "
                        "other null)")
    architectures.of(hp, where)
    if hp.secure_mode and hp.noise_seed is not None:
        raise UserError(f"{where}: noise_seed = {hp.noise_seed} makes the noise replayable, "
                        "secure_mode asks for noise nobody can predict; set noise_seed to null or "
                        "secure_mode to false")
    return hp


def load(path: Path, overrides: Overrides | None = None) -> Hyperparameters:
    """Read a hyperparameters file, optionally with some keys replaced (errors in a replaced key
    name the file it came from)."""
    path = Path(path)
    values = _read_object(path, "hyperparameters file")
    if not overrides:
        return parse(values, str(path))
    hp = parse({**values, **overrides.values}, f"{path} with {overrides.source}")
    # a key the user changed must change something
    for key, (has_effect, unless) in _EFFECT.items():
        if key in overrides.values and not has_effect(hp):
            raise UserError(f"{overrides.source}: {key} has no effect {unless}; drop it")
    return hp


# key -> (whether it has an effect on these hyperparameters, when it has none). Every file holds
# every key, so only a change a user asks for is refused where it would be ignored. (The noise keys
# with dp = false are not: run_local's --baseline trains the same hyperparameters without DP.)
_EFFECT = {
    "momentum": (lambda hp: hp.optimizer == "sgd",
                 "with optimizer \"adam\" (its own β = 0.9, 0.999)"),
    "activation": (lambda hp: architectures.of(hp).has_activation,
                   "with a network of one layer such as \"linear\" (no activation)"),
    "clip_learning_rate": (lambda hp: hp.clip_quantile is not None,
                           "with clip_quantile null (C stays fixed)"),
    "clip_count_stddev": (lambda hp: hp.clip_quantile is not None,
                          "with clip_quantile null (no count is drawn)"),
}


@dataclass(frozen=True)
class Overrides:
    """Keys a user replaces in every algo's hyperparameters, and where they come from."""

    values: dict
    source: str

    def __bool__(self) -> bool:
        return bool(self.values)

    def replace(self, **values) -> Overrides:
        return Overrides({**self.values, **values}, self.source)


def parse_assignments(items: list, option: str = "--set") -> dict:
    """Command-line changes ["key=value", ...] (each value JSON; a bare word is a string:
    activation=relu) -> {key: value}, each key known and each value checked as a hyperparameters
    file's."""
    changes = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"{option} {item!r}: expected key=value (a JSON value)")
        if key in changes:  # as in a JSON file: the last would win silently
            raise UserError(f"{option} {key}: given twice; keep one")
        try:
            changes[key] = json_input.loads(value, f"{option} {key}")
        except json.JSONDecodeError:
            changes[key] = value
    check_values(changes, option)
    return changes


def refuse_keys(changes: dict, keys, why: str, option: str = "--set") -> None:
    """Refuse changes of `keys`, in one line: a change silently overwritten would be reported as
    applied.

    Args:
      changes: the user's changes, {key: value}.
      keys: the keys the caller sets itself or does not use.
      why: says which, in the error.
      option: the option that gave the changes, which the error names.
    """
    refused = [key for key in changes if key in keys]
    if refused:
        raise UserError(f"{option} {', '.join(refused)}: {why}; drop "
                        f"{'it' if len(refused) == 1 else 'them'}")


def load_overrides(path: Path | None) -> Overrides:
    """A user's JSON file of keys to replace in every algo's hyperparameters (None: no change).
    Each key is checked here (known, exact type, range), so that an error names the user's file."""
    if path is None:
        return Overrides({}, "no overrides")
    values = _read_object(Path(path), "hyperparameters JSON file")
    check_values(values, str(path))
    return Overrides(values, str(path))


def _read_object(path: Path, what: str) -> dict:
    values = json_input.read(path, what)
    if not isinstance(values, dict):
        raise UserError(f"{path}: must hold a JSON object of hyperparameters")
    return values
