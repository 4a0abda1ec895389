"""Results of a run: one record per trained model, printed as a table and written to results.json."""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

from mnist_dp import model_file
from mnist_dp.privacy import NEIGHBOURING_RELATION, SAMPLING
from mnist_dp.training import privacy_summary

COLUMNS = [  # (key, header, format)
    ("framework", "framework", "{}"),
    ("dp", "DP", "{}"),
    ("train_accuracy", "train acc", "{:.4f}"),
    ("test_accuracy", "test acc", "{:.4f}"),
    ("epsilon", "ε (PLD)", "{:.3f}"),
    ("epsilon_rdp", "ε (RDP)", "{:.3f}"),
    ("delta", "δ", "{:g}"),
    ("accountant", "accountant", "{}"),
    ("noise_multiplier", "σ", "{:.3f}"),
    ("sample_rate", "q", "{:.4g}"),
    ("steps", "steps", "{}"),
]


def model_record(path: Path, framework: str, organization: str) -> dict:
    """Privacy figures recomputed from a saved model's ledger (never copied from a log)."""
    saved = model_file.load(path, framework)
    delta = saved.hyperparameters["delta"]
    last = saved.ledger.events[-1]
    summary = privacy_summary(saved.ledger, delta)
    return {
        "framework": framework,
        "organization": organization,
        "dp": all(e.is_private for e in saved.ledger.events),
        "epsilon": summary["epsilon"],
        "epsilon_rdp": summary["epsilon_rdp"],
        "delta": delta,
        "accountant": summary["accountant"],
        "noise_multiplier": last.noise_multiplier,
        "sample_rate": last.sample_rate,
        "steps": sum(e.steps for e in saved.ledger.events),
        "clipping": last.clipping,
        "max_grad_norm": last.max_grad_norm,
        "sampling": SAMPLING,
        "neighbouring_relation": NEIGHBOURING_RELATION,
        "model_file": str(path),
    }


def _cell(record: dict, key: str, fmt: str) -> str:
    value = record.get(key)
    if value is None or (isinstance(value, float) and math.isinf(value)):
        return "∞" if key.startswith("epsilon") else "-"
    if key == "dp":
        return "yes" if value else "no"
    return fmt.format(value)


def table(records: list) -> str:
    rows = [[header for _, header, _ in COLUMNS]] + [[_cell(r, k, f) for k, _, f in COLUMNS] for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_results(path: Path, records: list) -> None:
    """results.json: JSON has no infinity, so a non-private model's ε is written as null."""
    write_json(path, [{k: None if isinstance(v, float) and math.isinf(v) else v for k, v in r.items()}
                      for r in records])


def write_json(path: Path, payload) -> None:
    """Write JSON atomically (temporary file + rename): a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=2, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
