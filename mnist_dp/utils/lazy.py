"""A module imported on first use, by the standard library's `importlib.util.LazyLoader`."""
from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_import(name: str) -> ModuleType:
    """Top-level module `name`, run only when one of its attributes is first read (at once if it
    is already imported): the accountant's libraries load much of scipy, which a task that computes
    no ε (a predict task) need not wait for."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module
