"""The model artefact: one zip file holding the framework weights and the privacy ledger.

Substra hands out output paths without an extension, so everything is written through an open file
handle (no saver gets the chance to append a suffix). The ledger and metadata are JSON, readable
with nothing but the standard library, so ε can be recomputed without any ML framework installed.

Reading a model checks it before anything is computed from it: every ledger field (events.py,
ledger.py), the sha256 of the ledger and of the weights recorded in the metadata, and the last
training run of the ledger against the settings the metadata says it ran with. This catches a
hand-edited or damaged file; it cannot stop whoever controls the training code, who can write any
file (see docs/privacy.md).
"""
from __future__ import annotations

import hashlib
import json
import math
import shutil
import zipfile
from dataclasses import dataclass, field

from mnist_dp import hyperparameters
from mnist_dp.assets import capabilities
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.privacy.task_plan import check_delta, count_stddev
from mnist_dp.utils import atomic, json_input
from mnist_dp.utils.errors import UserError

# 2: digests in the metadata, provenance in every ledger event; 3: the examples;
# 4: MindSpore's noise from numpy; 5: the released ledger, naming no example.
FORMAT = "mnist-dp-model/5"
# Read too: a /2 ledger records no samples, so each of its runs counts for every example, and a /3
# or /4 one names its examples (ledger.Ledger.accounts); a format whose noise its framework's
# library drew from repeating numbers is refused (assets.Capabilities, see `load`).
READABLE = (FORMAT, "mnist-dp-model/4", "mnist-dp-model/3", "mnist-dp-model/2")
_META = "meta.json"
_LEDGER = "ledger.json"
_WEIGHTS = "weights.bin"
# What a train task records about its own run next to the ledger (see skeleton.train).
RUN_SETTINGS = ("delta", "batch_size", "max_grad_norm", "noise_multiplier", "max_epsilon",
                "secure_mode")


@dataclass
class ModelFile:
    framework: str
    weights: bytes  # framework-native serialisation
    ledger: Ledger = field(default_factory=Ledger)
    hyperparameters: dict = field(default_factory=dict)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def save(path, model: ModelFile) -> None:
    """Write `model` atomically, its ledger in the released form (Ledger.released): a full disk or
    a crash never leaves half a model, nor harms the one at `path`."""
    # load refuses NaN
    ledger = json.dumps(model.ledger.released().to_json(), indent=2, allow_nan=False).encode()
    meta = {"format": FORMAT, "framework": model.framework,
            "hyperparameters": model.hyperparameters, "ledger_sha256": _sha256(ledger),
            "weights_sha256": _sha256(model.weights)}
    with atomic.replacing(path) as tmp, open(tmp, "wb") as f, \
            zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(_META, json.dumps(meta, indent=2))
        archive.writestr(_LEDGER, ledger)
        archive.writestr(_WEIGHTS, model.weights)


def copy(source, path) -> None:
    """The model file at `source`, unchanged, to `path` (atomically, as `save`)."""
    with atomic.replacing(path) as tmp:
        shutil.copyfile(source, tmp)


def load(path, framework: str | None = None) -> ModelFile:
    """Read and check a model file; `framework` checks that the weights are for the caller's
    framework."""
    try:
        with open(path, "rb") as f, zipfile.ZipFile(f) as archive:
            meta = json_input.loads(archive.read(_META), f"{path}: its metadata")
            ledger_bytes = archive.read(_LEDGER)
            weights = archive.read(_WEIGHTS)
    except FileNotFoundError:
        raise UserError(f"{path}: model file not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder; give the path of a model file") from None
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise UserError(f"{path}: not a valid model file of this bundle ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") not in READABLE:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise UserError(f"{path}: unknown model format {found!r}, expected {FORMAT!r} (a model "
                        "written by another version of this bundle: train it again)")
    for name, kind in (("framework", str), ("hyperparameters", dict), ("ledger_sha256", str),
                       ("weights_sha256", str)):
        if not isinstance(meta.get(name), kind):
            raise UserError(f"{path}: its metadata has no {name} ({kind.__name__}): the file was "
                            "edited or damaged; its privacy figure cannot be trusted")
    library = capabilities(meta["framework"])
    if meta["format"] in library.repeated_noise_formats:
        raise UserError(f"{path}: a {meta['framework']} model of format {meta['format']!r} drew "
                        f"{library.noise_library}'s noise, whose numbers repeat within a run "
                        "(docs/design.md, where the randomness comes from): its ε does not hold; "
                        "train it again")
    if framework is not None and meta["framework"] != framework:
        raise UserError(f"{path}: model was trained with {meta['framework']!r}, cannot load it "
                        f"into {framework!r}")
    for name, content in (("ledger", ledger_bytes), ("weights", weights)):
        if meta.get(f"{name}_sha256") != _sha256(content):
            raise UserError(f"{path}: its {name} does not match the sha256 recorded in its "
                            "metadata: the file was edited or damaged; its privacy figure cannot "
                            "be trusted")
    try:
        ledger = Ledger.from_json(json_input.loads(ledger_bytes, "its ledger"))
        check_run_settings(ledger, meta)
    except (UserError, ValueError) as exc:
        raise UserError(f"{path}: {exc}") from None
    # a metadata value of another shape than the one written
    except (KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{path}: its metadata is not as a train task writes it "
                        f"({type(exc).__name__}: {exc}): the file was edited or damaged; its "
                        "privacy figure cannot be trusted") from None
    return ModelFile(meta["framework"], weights, ledger, meta["hyperparameters"])


# The metadata of an averaged model (skeleton.aggregate): each input's metadata, with the id and
# examples of the run it added.
AGGREGATED = "aggregate_of"


def aggregate_metadata(inputs: list, run_ids: list, examples: list, code: dict) -> dict:
    """An averaged model's metadata: the settings its inputs share (the first input's),
    `stopped_by_budget` if any input's was, and under AGGREGATED every input's own metadata with the
    run it added and its weight in the average.

    Args:
      inputs: each input model's metadata (its hyperparameters).
      run_ids: the run each input added (None: it trained nothing).
      examples: each input's weight in the average (its run's n: the data's public size).
      code: what averaged them (its provenance), kept as "aggregated_by".

    Returns:
      The metadata, a dict.
    """
    return {**{k: v for k, v in inputs[0].items() if k != AGGREGATED},
            "stopped_by_budget": any(hp.get("stopped_by_budget") for hp in inputs),
            # An input that trained nothing may be an average itself: its own inputs are not needed.
            AGGREGATED: [{**{k: v for k, v in hp.items() if k != AGGREGATED}, "run_id": run_id,
                          "examples": n}
                         for hp, run_id, n in zip(inputs, run_ids, examples)],
            "aggregated_by": code}


def check_run_settings(ledger: Ledger, meta: dict) -> None:
    """The ledger's last run must be the metadata's framework and have run with the settings
    recorded beside it: σ, batch size, clipping norm and planned steps (earlier runs may be any
    framework's: the data's runs that a continued model's weights may hold). An averaged model:
    each input's run, with that input's settings."""
    hp = meta.get("hyperparameters")
    if not isinstance(hp, dict) or not ledger.events:
        raise ValueError("metadata without hyperparameters, or an empty ledger")
    missing = [k for k in (*RUN_SETTINGS, "planned_steps", "stopped_by_budget") if k not in hp]
    if missing:
        raise ValueError(f"metadata lacks {missing}")
    for name in ("delta", "batch_size", "max_grad_norm", "max_epsilon", "secure_mode"):
        hyperparameters.check_value(name, hp[name], "metadata")
    check_delta(hp["delta"], max(e.n for e in ledger.events), "metadata: delta")
    if AGGREGATED in hp:
        _check_aggregated(ledger, meta)
        return
    last = ledger.events[-1]
    wrong = [last.framework] if last.framework != meta["framework"] else []
    expected = {"batch_size": hp["batch_size"], "planned_steps": hp["planned_steps"],
                "max_grad_norm": hp["max_grad_norm"], "noise_multiplier": hp["noise_multiplier"]}
    differ = [f"{name} {getattr(last, name)!r} (metadata: {value!r})" for name,
              value in expected.items()
              if not (isinstance(value, (int, float))
                      and math.isclose(getattr(last, name), value, rel_tol=1e-9))]
    # Adaptive clipping's count noise, as the skeleton derives it (models saved
    # before the option: none).
    expected_count = (2 * count_stddev(hp.get("clip_count_stddev"),
                                       last.trained_n * last.sample_rate)
                      if hp.get("clip_quantile") is not None else 0.0)
    if not math.isclose(last.count_noise_multiplier, expected_count, rel_tol=1e-9):
        differ.append(f"count_noise_multiplier {last.count_noise_multiplier!r} (metadata: "
                      f"{expected_count!r})")
    if last.noise_decay != hp.get("noise_decay", 1.0):
        differ.append(f"noise_decay {last.noise_decay!r} (metadata: "
                      f"{hp.get('noise_decay', 1.0)!r})")
    # Models saved before noise_seed existed have no such key, and their runs
    # are all marked replayable.
    if "noise_seed" in hp and last.replayable_noise is not (hp["noise_seed"] is not None):
        differ.append(f"replayable_noise {last.replayable_noise!r} (metadata: noise_seed "
                      f"{hp['noise_seed']!r})")
    stopped = hp["stopped_by_budget"]
    if stopped is not (last.steps < last.planned_steps):
        differ.append(f"steps {last.steps} of {last.planned_steps} planned (metadata: "
                      f"stopped_by_budget {stopped!r})")
    if wrong or differ:
        raise ValueError("its ledger disagrees with its metadata: "
                         + "; ".join(differ + [f"a {f!r} run in a {meta['framework']!r} model"
                                               for f in wrong])
                         + "; the file was edited or damaged, its privacy figure cannot be trusted")


def _check_aggregated(ledger: Ledger, meta: dict) -> None:
    inputs = meta["hyperparameters"][AGGREGATED]
    if not isinstance(inputs, list) or not inputs or not all(isinstance(hp, dict) for hp in inputs):
        raise ValueError(f"metadata: {AGGREGATED} must be a non-empty list of the input models' "
                         "metadata")
    position = {e.run_id: i for i, e in enumerate(ledger.events) if e.run_id}
    for k, hp in enumerate(inputs, 1):
        run_id = hp.get("run_id")
        # that input trained nothing: its settings describe no run of this ledger
        if run_id is None:
            continue
        if run_id not in position:
            raise ValueError(f"its metadata names input {k}'s run {run_id!r}, which its ledger "
                             "does not have; the file was edited or damaged, its privacy figure "
                             "cannot be trusted")
        # The input's own ledger ended with that run: check it as that input's file was checked.
        check_run_settings(Ledger(ledger.events[: position[run_id] + 1]),
                           {**meta, "hyperparameters": hp})
