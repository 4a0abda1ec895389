"""The model artefact: one zip file holding the framework weights and the privacy ledger.

Substra hands out output paths without an extension, so everything is written through an open file
handle (no saver gets the chance to append a suffix). The ledger and metadata are JSON, readable
with nothing but the standard library, so ε can be recomputed without any ML framework installed.
"""
from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field

from mnist_dp.errors import UserError
from mnist_dp.privacy import Ledger

FORMAT = "mnist-dp-model/1"
_META = "meta.json"
_LEDGER = "ledger.json"
_WEIGHTS = "weights.bin"


@dataclass
class ModelFile:
    framework: str
    weights: bytes  # framework-native serialisation
    ledger: Ledger = field(default_factory=Ledger)
    hyperparameters: dict = field(default_factory=dict)


def save(path, model: ModelFile) -> None:
    meta = {"format": FORMAT, "framework": model.framework, "hyperparameters": model.hyperparameters}
    with open(path, "wb") as f, zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(_META, json.dumps(meta, indent=2))
        archive.writestr(_LEDGER, json.dumps(model.ledger.to_json(), indent=2))
        archive.writestr(_WEIGHTS, model.weights)


def load(path, framework: str | None = None) -> ModelFile:
    """Read a model file; `framework` checks that the weights are for the caller's framework."""
    try:
        with open(path, "rb") as f, zipfile.ZipFile(f) as archive:
            meta = json.loads(archive.read(_META))
            ledger = Ledger.from_json(json.loads(archive.read(_LEDGER)))
            weights = archive.read(_WEIGHTS)
    except FileNotFoundError:
        raise UserError(f"{path}: model file not found") from None
    except (zipfile.BadZipFile, KeyError, ValueError, UserError) as exc:
        raise UserError(f"{path}: not a valid model file of this bundle ({exc})") from None
    if meta.get("format") != FORMAT:
        raise UserError(f"{path}: unknown model format {meta.get('format')!r}, expected {FORMAT!r}")
    if framework is not None and meta["framework"] != framework:
        raise UserError(f"{path}: model was trained with {meta['framework']!r}, cannot load it into {framework!r}")
    return ModelFile(meta["framework"], weights, ledger, meta.get("hyperparameters", {}))
