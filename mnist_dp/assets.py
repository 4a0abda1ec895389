"""Where the bundle's assets are, and how tests and benchmarks import an asset's script."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "assets"
DATASET_ASSET = ASSETS / "dataset"
OBJECTIVE_ASSET = ASSETS / "objective"
# framework name -> algo asset folder. A new framework is one more line here.
ALGO_ASSETS = {
    "torch": ASSETS / "algo_torch_dp", "tf": ASSETS / "algo_tf_dp",
    "mindspore": ASSETS / "algo_mindspore_dp",
}


def load_asset_module(script: Path, name: str):
    """Import an asset's script (e.g. an algo.py) as module `name`, for tests and benchmarks.

    It is registered in sys.modules: MindSpore's graph compiler re-imports a jitted function's
    module by name.
    """
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
