"""The shell commands the README and docs/*.md give a user (their ```bash blocks), and how a test
runs one as written, on tiny data: in a folder that looks like a fresh clone, whose default data
folders (`data`, `data-2-organizations`) the test fills with tiny data, with one epoch at a batch of
at most 64 merged into its hyperparameters (a file it names keeps every other setting) and data it
generates cut to 600 / 100 images.

Every documented command is run by a test that calls `run_documented(document, prefix, folder)`, or
is in NOT_RUN with the reason and the test that covers it instead (tests/test_readme.py checks)."""
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO, TINY_HYPERPARAMETERS

DOCUMENTS = ("README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")))
# What a fresh clone holds that a command may name (data, results and the like are the run's own).
CLONE = ("assets", "benchmarks", "docs", "examples", "mnist_dp", "scripts", "README.md",
         "requirements.txt", "requirements-dev.txt", "pyproject.toml", "Dockerfile",
         ".dockerignore")
TINY_GENERATED = ["--train-size", "600", "--test-size", "100"]
SET_UP = re.compile(r"^pip install -r requirements(-dev)?\.txt && ")

NOT_RUN = {  # (document, command prefix): why not, and what runs it instead
    ("README.md", "pip install -r requirements-dev.txt && python -m pytest tests"):
        "CI's own command (.ci/run)",
    ("docs/federated.md", "python examples/substrafl_fedavg.py --framework torch --organizations"):
        "three rounds of substrafl for CI's time: tests/federated/test_experiment.py runs the "
        "example on tiny data, one round, in every framework and at two organisations",
    ("docs/federated.md", "python examples/substrafl_fedavg.py --framework torch --rounds 1"):
        "substrafl's images: tests/federated/test_experiment.py runs it in docker",
    ("docs/privacy.md", "python scripts/run_local.py --search default"):
        "a search in three frameworks for CI's time: tests/assets/test_algos.py runs the default "
        "search's tune task in every framework, tests/scripts/test_run_local_search.py a search "
        "through run_local.py",
    ("docs/privacy.md", "python scripts/run_local.py --search my_search.json"):
        "my_search.json is the reader's own file: tests/scripts/test_run_local_search.py runs "
        "search files",
    ("docs/docker.md", "python scripts/run_local.py --backend docker"):
        "tests/scripts/test_run_local.py runs the main job in the functions' images on tiny data",
    ("docs/remote.md", "export SUBSTRA_ORG_1_URL="): "a Substra node's address",
    ("docs/remote.md", "python scripts/add_dataset_objective.py --backend remote"):
        "a Substra node: tests/scripts/test_remote.py runs it against an HTTP stub of one",
    ("docs/remote.md", "python scripts/add_train_algo_cnn_dp.py --backend remote"):
        "a Substra node: tests/scripts/test_remote.py runs it against an HTTP stub of one",
}


def blocks() -> list:
    """[(document, [command, ...])]: each ```bash block of the documents, its commands in order (a
    line continued by a backslash joined, a trailing comment dropped)."""
    found = []
    for document in DOCUMENTS:
        text = (REPO / document).read_text()
        for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
            found.append((document, _commands(re.sub(r"\\\n\s*", " ", block))))
    return found


def _commands(block: str) -> list:
    """A block's commands: its lines, a line inside an open quote joined to the next, a trailing
    comment dropped."""
    commands, pending = [], ""
    for line in block.splitlines():
        pending = f"{pending}\n{line}" if pending else re.sub(r"\s+#\s.*$", "", line).strip()
        try:
            shlex.split(pending)
        except ValueError:  # a quote still open
            continue
        if pending:
            commands.append(pending)
        pending = ""
    return commands


def commands() -> list:
    """Every documented command, as (document, command)."""
    return [(document, command) for document, block in blocks() for command in block]


def not_run(document: str, command: str) -> str | None:
    """Why the test suite does not run `command` of `document` (NOT_RUN), or None."""
    return next((why for (d, prefix), why in NOT_RUN.items()
                 if d == document and command.startswith(prefix)), None)


def journey(document: str, prefix: str) -> list:
    """The commands `run_documented(document, prefix, ...)` runs: the block's command that starts
    with `prefix`, and those after it, up to one NOT_RUN names."""
    [(block, at)] = [(block, i) for d, block in blocks() if d == document
                     for i, command in enumerate(block) if command.startswith(prefix)]
    end = next((j for j in range(at, len(block)) if not_run(document, block[j])), len(block))
    return block[at:end]


def fresh_clone(folder: Path, data_2: Path | None = None) -> Path:
    """`folder` made to look like a fresh clone of the repository (links to its files), with a copy
    of the two organisations' data `data_2` as its `data-2-organizations` where given."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in CLONE:
        (folder / name).symlink_to(REPO / name)
    if data_2 is not None:
        shutil.copytree(data_2, folder / "data-2-organizations", symlinks=True)
    return folder


def run_documented(document: str, prefix: str, folder: Path) -> subprocess.CompletedProcess:
    """Run the journey of `document` from its command that starts with `prefix` (`journey`) in
    `folder` (fresh_clone), in one bash, each command as written but for tiny data (the module's
    docstring) and its set-up (`pip install ... &&`: the test command's own)."""
    script = "\n".join(["set -e", *(_tiny(command, folder) for command in journey(document,
                                                                                     prefix))])
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(["bash", "-c", script], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PATH": path})  # `python` is this one


def _tiny(command: str, folder: Path) -> str:
    """`command` on tiny data, one epoch (the module's docstring)."""
    command = SET_UP.sub("", command)
    words = shlex.split(command)
    if words[:2] == ["python", "scripts/run_local.py"]:
        return _one_epoch(words, folder)
    if words[:2] == ["python", "scripts/generate_data.py"] and "--output" in words:
        return shlex.join(words + TINY_GENERATED)
    return command


def _one_epoch(words: list, folder: Path) -> str:
    """A run_local.py command's words, as a command with one epoch at a batch of at most 64 merged
    into its hyperparameters when it runs (an earlier command of its block may write its file)."""
    named = ""
    if "--hyperparameters" in words:
        at = words.index("--hyperparameters") + 1
        named, words = words[at], words[:at - 1] + words[at + 1:]
    tiny = str(folder / "tiny-hyperparameters.json")
    merge = (f"import json, sys; given = json.load(open(sys.argv[1])) if sys.argv[1] else {{}}; "
             f"json.dump({{**{TINY_HYPERPARAMETERS!r}, **given, 'epochs': 1, 'batch_size': "
             f"min(given.get('batch_size', 64), 64)}}, open({tiny!r}, 'w'))")
    return (f"python -c {shlex.quote(merge)} {shlex.quote(named)}\n"
            f"{shlex.join(words)} --hyperparameters {shlex.quote(tiny)}")
