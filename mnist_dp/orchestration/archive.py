"""Self-contained function archives: an asset's files, its Dockerfile made to run the function, and
the shared modules.

A remote Substra node builds each function archive with Docker, so the archive must hold every
module of this repository that the asset imports. They are found by reading the asset's imports
(transitively through `mnist_dp` and its subpackages), not by copying the whole package.
"""
from __future__ import annotations

import ast
import gzip
import io
import re
import tarfile
from pathlib import Path

from mnist_dp.orchestration.contract import CONTRACT
from mnist_dp.privacy import provenance
from mnist_dp.utils import atomic
from mnist_dp.utils.errors import UserError

PACKAGE = "mnist_dp"
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # mnist_dp/
# The same patterns substra's subprocess backend uses to read a Dockerfile's ENTRYPOINT line.
_SCRIPT_REGEX = r"(?<=\")([^\"]*\.py)(?=\")"
_FUNCTION_REGEX = r"\"\-\-function-name\"\,\s*\"([^\"]*)\""
_SKIPPED = {"description.md", "__pycache__"}
DOCKERFILE = "Dockerfile"


def dockerfile_path(asset_dir: Path) -> Path:
    """An asset's one Dockerfile: every function of the asset runs in its image, the ENTRYPOINT
    naming which."""
    return Path(asset_dir) / DOCKERFILE


def parse_entrypoint(dockerfile: Path) -> tuple:
    """(script, function name) of a Dockerfile's ENTRYPOINT, read as substra's local mode reads
    it."""
    lines = [line for line in Path(dockerfile).read_text().splitlines() if "ENTRYPOINT" in line]
    if len(lines) != 1:
        raise UserError(f"{dockerfile}: expected exactly one line mentioning ENTRYPOINT, found "
                        f"{len(lines)}")
    scripts = re.findall(_SCRIPT_REGEX, lines[0])
    functions = re.findall(_FUNCTION_REGEX, lines[0])
    if len(scripts) != 1 or len(functions) != 1:
        raise UserError(f'{dockerfile}: ENTRYPOINT must look like ["python3", "algo.py", '
                        '"--function-name", "train"]')
    return scripts[0], functions[0]


def function_dockerfile(asset_dir: Path, function: str) -> bytes:
    """The Dockerfile of one function's archive: the asset's Dockerfile with its ENTRYPOINT running
    `function` (a function of the contract), so that an asset's functions cannot be built from
    images that drifted apart."""
    dockerfile = dockerfile_path(asset_dir)
    if not dockerfile.is_file():
        raise UserError(f"{dockerfile}: missing; every asset needs its Dockerfile")
    if function not in CONTRACT:
        raise UserError(f"{asset_dir}: no function {function!r} in the contract "
                        f"({', '.join(CONTRACT)})")
    parse_entrypoint(dockerfile)
    text = dockerfile.read_text()
    return re.sub(_FUNCTION_REGEX, f'"--function-name", "{function}"', text).encode()


def _module_file(dotted: str) -> Path | None:
    """The file of module ``mnist_dp.<dotted>`` (a module, or a package's ``__init__.py``); None for
    a name that is not a module (a function or class imported from one)."""
    path = PACKAGE_DIR.joinpath(*dotted.split("."))
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return None


def _shared_imports(source: str, filename: str) -> set:
    """The `mnist_dp` files a Python source imports, relative to the package ("privacy/ledger.py"),
    with the ``__init__.py`` of every subpackage on the way (Python runs them first)."""
    found = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != PACKAGE:
                continue
            for end in range(2, len(parts) + 1):  # mnist_dp.privacy, mnist_dp.privacy.ledger, ...
                module = _module_file(".".join(parts[1:end]))
                if module is not None:
                    found.add(module.relative_to(PACKAGE_DIR).as_posix())
    return found


def shared_modules(asset_files) -> list:
    """The `mnist_dp` files the given Python files need ("privacy/ledger.py", ...), following
    imports between modules; the package's own ``__init__.py`` is always needed and not listed."""
    todo = set()
    for path in asset_files:
        todo |= _shared_imports(Path(path).read_text(), str(path))
    done = set()
    while todo:
        name = todo.pop()
        done.add(name)
        module = PACKAGE_DIR / name
        todo |= _shared_imports(module.read_text(), str(module)) - done
    return sorted(done)


def build(asset_dir: Path, function: str, dest: Path, replace: dict | None = None,
          add: dict | None = None) -> Path:
    """Write ``dest`` (tar.gz): the asset's files, ``Dockerfile`` for `function`, the shared modules
    and the manifest of them all (provenance.py), whose digest identifies the archive.

    Args:
      asset_dir: the asset's folder.
      function: the function the archive runs ("train", "predict", ...), whose Dockerfile it holds.
      dest: the archive's path.
      replace: maps an asset file name to new bytes (e.g. a tuned hyperparameters.json).
      add: maps a file name the asset does not have to its bytes (a search file).

    Returns:
      `dest`.
    """
    asset_dir = Path(asset_dir)
    dockerfile = function_dockerfile(asset_dir, function)
    script, _ = parse_entrypoint(dockerfile_path(asset_dir))
    files = {p.name: p for p in sorted(asset_dir.iterdir())
             if p.is_file() and p.name not in _SKIPPED and not p.name.startswith(DOCKERFILE)}
    if script not in files:
        raise UserError(f"{dockerfile_path(asset_dir)}: ENTRYPOINT script {script!r} is not in "
                        f"{asset_dir}")
    replace = dict(replace or {})
    unknown = set(replace) - set(files)
    if unknown:
        raise UserError(f"{asset_dir}: cannot replace {sorted(unknown)}: no such file in the asset")

    contents = {name: replace.get(name) or path.read_bytes() for name, path in files.items()}
    clash = set(add or {}) & set(files)
    if clash:
        raise UserError(f"{asset_dir}: cannot add {sorted(clash)}: the asset has such a file")
    contents.update(add or {})
    contents[DOCKERFILE] = dockerfile
    python_files = [files[name] for name in files if name.endswith(".py")]
    for name in ["__init__.py"] + shared_modules(python_files):
        contents[f"{PACKAGE}/{name}"] = (PACKAGE_DIR / name).read_bytes()
    contents[provenance.MANIFEST_FILE] = provenance.manifest_bytes(contents)

    dest = Path(dest)
    # Byte-for-byte reproducible (no timestamps), so an unchanged function is recognised and reused;
    # a full disk is one line naming it, and leaves no half archive.
    with atomic.replacing(dest) as tmp, open(tmp, "wb") as f, \
            gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in sorted(contents.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return dest


def archive_digest(path: Path) -> str:
    """The digest a function running from the archive at `path` records in its ledger events."""
    with tarfile.open(path) as tar:
        return provenance.digest(tar.extractfile(provenance.MANIFEST_FILE).read())
