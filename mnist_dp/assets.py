"""Where the bundle's assets are, what each framework's algo offers, and how tests and benchmarks
import an asset's script."""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Capabilities:
    """What a framework's DP library offers, as shared code reads it without importing the
    framework: the scripts check a plan before anything is registered, and a model file is read
    where no framework is installed. A framework with none of these limits needs no entry."""

    # None: the library draws secure noise (secure_mode); else why secure_mode is refused
    secure_noise: str | None = None
    # model-file formats whose noise the library drew from numbers that repeat within a run (their
    # ε does not hold: model_file refuses them), and that library's name
    repeated_noise_formats: tuple = ()
    noise_library: str = ""


CAPABILITIES = {
    "tf": Capabilities(secure_noise="TF Privacy offers no secure noise generator; use the torch "
                                    "algo (Opacus secure_mode) or set secure_mode to false"),
    "mindspore": Capabilities(repeated_noise_formats=("mnist-dp-model/3", "mnist-dp-model/2"),
                              noise_library="MindArmour"),
}


def capabilities(framework: str) -> Capabilities:
    """What `framework`'s library offers (CAPABILITIES, or none of the limits)."""
    return CAPABILITIES.get(framework, Capabilities())


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
