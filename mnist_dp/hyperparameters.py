"""The hyperparameters file every algo asset ships (``hyperparameters.json``): same keys everywhere.

| key              | meaning                                                                  |
|------------------|--------------------------------------------------------------------------|
| epochs           | passes over the data; each has ceil(n / batch_size) Poisson-sampled steps|
| batch_size       | expected batch size (sampling probability q = 1 / steps per epoch)       |
| learning_rate    | SGD learning rate                                                        |
| momentum         | SGD momentum                                                             |
| max_grad_norm    | per-example clipping norm C                                              |
| noise_multiplier | σ (noise std = σ·C); give this **or** target_epsilon, not both           |
| target_epsilon   | calibrate σ so that the model's ε at delta (PLD) ends at this value      |
| max_epsilon      | budget (null: none): training stops at the last step that keeps the      |
|                  | model's ε at delta (input model's steps included) within it              |
| delta            | δ of the reported (ε, δ); must be < 1/n                                  |
| seed             | seeds initialisation, sampling and noise (a continued run: seed + runs   |
|                  | already in the input model's ledger, so noise is never replayed)         |
| dp               | false trains the non-private baseline (no clipping, no noise, ε = inf)   |
| secure_mode      | unpredictable, never replayed noise and sampling (torch, mindspore; tf   |
|                  | refuses: TF Privacy has none); see each algo's description.md            |
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from mnist_dp.errors import UserError

FILE_NAME = "hyperparameters.json"


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

    def to_json(self) -> dict:
        return asdict(self)


def _positive(name, value, kind, where):
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0 or not math.isfinite(value):
        raise UserError(f"{where}: {name} = {value!r} must be a positive {'integer' if kind is int else 'number'}")


def parse(values: dict, where: str) -> Hyperparameters:
    """Validate a dict of hyperparameters; `where` names its source in error messages."""
    fields = Hyperparameters.__dataclass_fields__
    unknown = set(values) - set(fields)
    if unknown:
        raise UserError(f"{where}: unknown hyperparameter(s) {sorted(unknown)}; known: {sorted(fields)}")
    missing = set(fields) - set(values)
    if missing:
        raise UserError(f"{where}: missing hyperparameter(s) {sorted(missing)}")
    hp = Hyperparameters(**values)
    for name in ("epochs", "batch_size"):
        _positive(name, getattr(hp, name), int, where)
    for name in ("learning_rate", "max_grad_norm", "delta"):
        _positive(name, getattr(hp, name), (int, float), where)
    if not isinstance(hp.momentum, (int, float)) or not 0 <= hp.momentum < 1:
        raise UserError(f"{where}: momentum = {hp.momentum!r} must be in [0, 1)")
    if not isinstance(hp.seed, int) or isinstance(hp.seed, bool):
        raise UserError(f"{where}: seed = {hp.seed!r} must be an integer")
    for name in ("dp", "secure_mode"):
        if not isinstance(getattr(hp, name), bool):
            raise UserError(f"{where}: {name} = {getattr(hp, name)!r} must be true or false")
    if hp.dp:
        if (hp.noise_multiplier is None) == (hp.target_epsilon is None):
            raise UserError(f"{where}: give exactly one of noise_multiplier and target_epsilon (the other null)")
        if hp.noise_multiplier is not None:
            _positive("noise_multiplier", hp.noise_multiplier, (int, float), where)
        else:
            _positive("target_epsilon", hp.target_epsilon, (int, float), where)
        if hp.max_epsilon is not None:
            _positive("max_epsilon", hp.max_epsilon, (int, float), where)
    return hp


def load(path: Path, overrides: dict | None = None) -> Hyperparameters:
    """Read a hyperparameters file, optionally with some keys replaced."""
    path = Path(path)
    try:
        values = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: hyperparameters file not found") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(values, dict):
        raise UserError(f"{path}: must hold a JSON object of hyperparameters")
    return parse({**values, **(overrides or {})}, str(path))


def load_overrides(path: Path | None) -> dict:
    """A user's JSON file of keys to replace in every algo's hyperparameters (None: no change)."""
    if path is None:
        return {}
    try:
        overrides = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: cannot read hyperparameters JSON ({exc})") from None
    if not isinstance(overrides, dict):
        raise UserError(f"{path}: must hold a JSON object of hyperparameters")
    return overrides
