"""The model artefact: one zip file holding the framework weights and the privacy ledger.

Substra hands out output paths without an extension, so everything is written through an open file
handle (no saver gets the chance to append a suffix). The ledger and metadata are JSON, readable
with nothing but the standard library, so ε can be recomputed without any ML framework installed.

Reading a model checks it before anything is computed from it: every ledger field (privacy.py), the
sha256 of the ledger and of the weights recorded in the metadata, and the last training run of the
ledger against the settings the metadata says it ran with. This catches a hand-edited or damaged
file; it cannot stop whoever controls the training code, who can write any file (see README).
"""
from __future__ import annotations

import hashlib
import json
import math
import zipfile
from dataclasses import dataclass, field

from mnist_dp import hyperparameters as hp_file
from mnist_dp.errors import UserError
from mnist_dp.privacy import Ledger, check_delta, count_stddev

FORMAT = "mnist-dp-model/2"  # 2: digests in the metadata, provenance in every ledger event
_META = "meta.json"
_LEDGER = "ledger.json"
_WEIGHTS = "weights.bin"
# What a train task records about its own run next to the ledger (see training.train).
RUN_SETTINGS = ("delta", "batch_size", "max_grad_norm", "noise_multiplier", "max_epsilon", "secure_mode")


@dataclass
class ModelFile:
    framework: str
    weights: bytes  # framework-native serialisation
    ledger: Ledger = field(default_factory=Ledger)
    hyperparameters: dict = field(default_factory=dict)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def save(path, model: ModelFile) -> None:
    ledger = json.dumps(model.ledger.to_json(), indent=2).encode()
    meta = {"format": FORMAT, "framework": model.framework, "hyperparameters": model.hyperparameters,
            "ledger_sha256": _sha256(ledger), "weights_sha256": _sha256(model.weights)}
    with open(path, "wb") as f, zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(_META, json.dumps(meta, indent=2))
        archive.writestr(_LEDGER, ledger)
        archive.writestr(_WEIGHTS, model.weights)


def load(path, framework: str | None = None) -> ModelFile:
    """Read and check a model file; `framework` checks that the weights are for the caller's framework."""
    try:
        with open(path, "rb") as f, zipfile.ZipFile(f) as archive:
            meta = json.loads(archive.read(_META))
            ledger_bytes = archive.read(_LEDGER)
            weights = archive.read(_WEIGHTS)
    except FileNotFoundError:
        raise UserError(f"{path}: model file not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder; give the path of a model file") from None
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise UserError(f"{path}: not a valid model file of this bundle ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise UserError(f"{path}: unknown model format {found!r}, expected {FORMAT!r} (a model written by another "
                        "version of this bundle: train it again)")
    if framework is not None and meta["framework"] != framework:
        raise UserError(f"{path}: model was trained with {meta['framework']!r}, cannot load it into {framework!r}")
    for name, content in (("ledger", ledger_bytes), ("weights", weights)):
        if meta.get(f"{name}_sha256") != _sha256(content):
            raise UserError(f"{path}: its {name} does not match the sha256 recorded in its metadata: the file was "
                            "edited or damaged; its privacy figure cannot be trusted")
    try:
        ledger = Ledger.from_json(json.loads(ledger_bytes))
        check_run_settings(ledger, meta)
    except (UserError, ValueError) as exc:
        raise UserError(f"{path}: {exc}") from None
    return ModelFile(meta["framework"], weights, ledger, meta["hyperparameters"])


def check_run_settings(ledger: Ledger, meta: dict) -> None:
    """The ledger's runs must be the metadata's framework, and its last run must have run with the
    settings recorded beside it: σ, batch size, clipping norm and planned steps."""
    hp = meta.get("hyperparameters")
    if not isinstance(hp, dict) or not ledger.events:
        raise ValueError("metadata without hyperparameters, or an empty ledger")
    missing = [k for k in (*RUN_SETTINGS, "planned_steps", "stopped_by_budget") if k not in hp]
    if missing:
        raise ValueError(f"metadata lacks {missing}")
    for name in ("delta", "batch_size", "max_grad_norm", "max_epsilon", "secure_mode"):
        hp_file.check_value(name, hp[name], "metadata")
    check_delta(hp["delta"], max(e.n for e in ledger.events), "metadata: delta")
    last = ledger.events[-1]
    wrong = [e.framework for e in ledger.events if e.framework != meta["framework"]]
    expected = {"batch_size": hp["batch_size"], "planned_steps": hp["planned_steps"],
                "max_grad_norm": hp["max_grad_norm"], "noise_multiplier": hp["noise_multiplier"]}
    differ = [f"{name} {getattr(last, name)!r} (metadata: {value!r})" for name, value in expected.items()
              if not (isinstance(value, (int, float)) and math.isclose(getattr(last, name), value, rel_tol=1e-9))]
    # Adaptive clipping's count noise, as the skeleton derives it (models saved before the option: none).
    expected_count = (2 * count_stddev(hp.get("clip_count_stddev"), last.n * last.sample_rate)
                      if hp.get("clip_quantile") is not None else 0.0)
    if not math.isclose(last.count_noise_multiplier, expected_count, rel_tol=1e-9):
        differ.append(f"count_noise_multiplier {last.count_noise_multiplier!r} (metadata: {expected_count!r})")
    if last.noise_decay != hp.get("noise_decay", 1.0):
        differ.append(f"noise_decay {last.noise_decay!r} (metadata: {hp.get('noise_decay', 1.0)!r})")
    stopped = hp["stopped_by_budget"]
    if stopped is not (last.steps < last.planned_steps):
        differ.append(f"steps {last.steps} of {last.planned_steps} planned (metadata: stopped_by_budget {stopped!r})")
    if wrong or differ:
        raise ValueError("its ledger disagrees with its metadata: "
                         + "; ".join(differ + [f"a {f!r} run in a {meta['framework']!r} model" for f in wrong])
                         + "; the file was edited or damaged, its privacy figure cannot be trusted")
