"""The code passes the linter configured in pyproject.toml (ruff), so CI runs it with the tests."""
import re
import runpy
import subprocess
import sys

from conftest import REPO


def test_the_code_passes_the_linter():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(REPO)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


MAX_MODULE_LINES = 450


def test_no_module_of_the_package_or_the_assets_is_longer_than_a_newcomer_reads_at_once():
    """A module that grows past MAX_MODULE_LINES holds more than one concern: split it by
    concern."""
    modules = [*(REPO / "mnist_dp").rglob("*.py"), *(REPO / "assets").rglob("*.py")]
    long = {str(m.relative_to(REPO)): n for m in modules
            if (n := len(m.read_text().splitlines())) > MAX_MODULE_LINES}
    assert len(modules) > 30 and not long, long


def module_imports() -> dict:
    """{module of mnist_dp ("learning.skeleton", "hyperparameters"; a package by its folder): the
    other modules of mnist_dp it imports}. `from mnist_dp.x import y` names module x.y when y is
    one, else module x."""
    import ast

    paths = {".".join(path.relative_to(REPO / "mnist_dp").with_suffix("").parts).removesuffix(
        "__init__")
             .rstrip("."): path for path in (REPO / "mnist_dp").rglob("*.py")}
    graph = {}
    for module, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mnist_dp"):
                base = node.module.removeprefix("mnist_dp").lstrip(".")
                names = [f"{base}.{a.name}".lstrip(".") for a in node.names]
                imported = [name if name in paths else base for name in names]
            elif isinstance(node, ast.Import):
                imported = [a.name.removeprefix("mnist_dp.") for a in node.names
                            if a.name.startswith("mnist_dp.")]
            else:
                continue
            graph.setdefault(module,
                             set()).update(name for name in imported if name and name != module)
    return graph


def package_imports() -> dict:
    """{part of mnist_dp (a subpackage, or a top-level module): the other parts it imports}."""
    graph = {}
    for module, imported in module_imports().items():
        part = module.split(".")[0]
        graph.setdefault(part, set()).update(name.split(".")[0] for name in imported
                                             if name.split(".")[0] != part)
    return graph


def assert_no_cycle(graph: dict) -> None:
    below = {}

    def reach(node, path):
        assert node not in path, f"import cycle: {' -> '.join([*path, node])}"
        if node not in below:
            below[node] = set().union(*({n} | reach(n, [*path, node]) for n in graph.get(node, ())))
        return below[node]

    for node in graph:
        reach(node, [])


def test_no_two_test_modules_share_a_name():
    """pytest imports test modules by their basename (no packages under tests/): a second module of
    the same name stops the whole run at collection."""
    names = [path.name for path in (REPO / "tests").rglob("test_*.py")]
    assert sorted({name for name in names if names.count(name) > 1}) == []


def test_the_parts_of_the_package_import_each_other_in_one_direction_only():
    """No cycle between subpackages: each can be read, tested and changed knowing only the parts
    below it."""
    graph = package_imports()
    assert {"privacy", "learning", "data", "orchestration"} <= set(graph)
    assert_no_cycle(graph)
    assert graph.get("architectures", set()) <= {"utils"}
    assert graph.get("hyperparameters", set()) <= {"utils", "architectures"}
    assert graph.get("assets", set()) == set()


def test_no_two_modules_import_each_other_even_through_others():
    graph = module_imports()
    assert {"learning.functions", "learning.skeleton", "learning.search"} <= set(graph)
    assert "learning.skeleton" in graph["learning.search"]
    assert_no_cycle(graph)


FIRST_COMMIT_OF_THE_SUBJECT_RULE = "8ac0a85"  # earlier subjects predate the rule


COMMIT_MSG_HOOK = REPO / ".githooks" / "commit-msg"


def commit_msg_refusal(message_file) -> str | None:
    """What .githooks/commit-msg says refusing `message_file`, or None if it accepts it: the hook's
    own file run in this process (a process per commit took seconds over the whole history)."""
    argv = sys.argv
    sys.argv = [str(COMMIT_MSG_HOOK), str(message_file)]
    try:
        runpy.run_path(str(COMMIT_MSG_HOOK), run_name="__main__")
    except SystemExit as refused:
        return None if refused.code in (None, 0) else str(refused.code)
    finally:
        sys.argv = argv
    return None


def test_every_commit_subject_since_the_rule_passes_the_commit_msg_hook(tmp_path):
    """.githooks/commit-msg (≤ 72 characters) on each commit after the rule began."""
    import pytest

    listed = subprocess.run(["git", "log", "--format=%s",
                             f"{FIRST_COMMIT_OF_THE_SUBJECT_RULE}^..HEAD"], capture_output=True,
                            text=True, cwd=REPO)
    if listed.returncode != 0:
        pytest.skip(f"no git history reaching {FIRST_COMMIT_OF_THE_SUBJECT_RULE} here: "
                    f"{listed.stderr.strip()}")
    subjects = listed.stdout.splitlines()
    refused = []
    for subject in subjects:
        (tmp_path / "message").write_text(subject + "\n\nbody\n", encoding="utf-8")
        refused.append(commit_msg_refusal(tmp_path / "message"))
    assert subjects and not any(refused), "\n".join(filter(None, refused))
    (tmp_path / "message").write_text("x" * 73 + "\n", encoding="utf-8")
    assert "73 characters" in commit_msg_refusal(tmp_path / "message")
    # as git runs it: its own process, exit code 1
    assert subprocess.run([sys.executable, str(COMMIT_MSG_HOOK), str(tmp_path / "message")],
                          capture_output=True).returncode == 1


# A measured time or speed-up in prose: "1.4 ms", "0.5 s", "2 minutes", "5× faster",
# "300x slower" (not "7 × 7").
TIMING = re.compile(
    r"\b\d(?:[\d,.]*\d)?(?:\s*(?:ms|µs|seconds?|minutes?|hours?)|\s+(?:s|min|h))\b"
    r"|\b\d(?:\.\d+)?\s*×(?!\s*\d)|\b\d+(?:\.\d+)?x (?:faster|slower)")


def prose_of(path):
    """(line, text) of every comment and docstring of a Python file."""
    import ast
    import io
    import tokenize

    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            docstring = ast.get_docstring(node, clean=False)
            for k, line in enumerate((docstring or "").splitlines()):
                yield node.body[0].lineno + k, line


def test_no_comment_or_docstring_of_the_code_quotes_a_timing():
    """Timings change with the code and the machine: they belong in docs/benchmarks.md or
    docs/design.md, which name the command that measured them, not in the code they describe."""
    found = [f"{path.relative_to(REPO)}:{line}: {text.strip()}"
             for path in sorted([*(REPO / "mnist_dp").rglob("*.py"),
                                 *(REPO / "assets").rglob("*.py")])
             for line, text in prose_of(path) if TIMING.search(text)]
    assert not found, "\n".join(found)
    assert TIMING.search("cost 1–1.4 ms "
                         "more") and TIMING.search("5× faster") and not TIMING.search("7 × 7")
