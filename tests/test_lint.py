"""The code passes the linter configured in pyproject.toml (ruff), so CI runs it with the tests."""
import subprocess
import sys

from conftest import REPO


def test_the_code_passes_the_linter():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(REPO)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


MAX_MODULE_LINES = 450


def test_no_module_of_the_package_or_the_assets_is_longer_than_a_newcomer_reads_at_once():
    """A module that grows past MAX_MODULE_LINES holds more than one concern: split it by concern."""
    modules = [*(REPO / "mnist_dp").rglob("*.py"), *(REPO / "assets").rglob("*.py")]
    long = {str(m.relative_to(REPO)): n for m in modules if (n := len(m.read_text().splitlines())) > MAX_MODULE_LINES}
    assert len(modules) > 30 and not long, long


def package_imports() -> dict:
    """{part of mnist_dp (a subpackage, or a top-level module): the other parts it imports}."""
    import ast

    graph = {}
    for path in (REPO / "mnist_dp").rglob("*.py"):
        part = path.relative_to(REPO / "mnist_dp").parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            names += [f"{node.module}.{a.name}" for a in getattr(node, "names", []) if isinstance(node, ast.ImportFrom)
                      and node.module == "mnist_dp"]
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                parts = name.split(".")
                if parts[0] == "mnist_dp" and len(parts) > 1 and parts[1] != part:
                    graph.setdefault(part, set()).add(parts[1])
    return graph


def test_the_parts_of_the_package_import_each_other_in_one_direction_only():
    """No cycle between subpackages: each can be read, tested and changed knowing only the parts below it."""
    graph = package_imports()
    assert {"privacy", "learning", "data", "orchestration"} <= set(graph)
    below = {}

    def reach(part, path):
        assert part not in path, f"import cycle: {' -> '.join([*path, part])}"
        if part not in below:
            below[part] = set().union(*({p} | reach(p, [*path, part]) for p in graph.get(part, ())))
        return below[part]

    for part in graph:
        reach(part, [])
    assert graph.get("hyperparameters", set()) <= {"utils"} and graph.get("assets", set()) == set()


FIRST_COMMIT_OF_THE_SUBJECT_RULE = "8ac0a85"  # earlier subjects predate the rule


def test_every_commit_subject_since_the_rule_passes_the_commit_msg_hook(tmp_path):
    """.githooks/commit-msg (≤ 72 characters) on each commit after the rule began."""
    import pytest

    listed = subprocess.run(["git", "log", "--format=%s", f"{FIRST_COMMIT_OF_THE_SUBJECT_RULE}^..HEAD"],
                            capture_output=True, text=True, cwd=REPO)
    if listed.returncode != 0:
        pytest.skip(f"no git history reaching {FIRST_COMMIT_OF_THE_SUBJECT_RULE} here: {listed.stderr.strip()}")
    subjects = listed.stdout.splitlines()
    refused = []
    for subject in subjects:
        (tmp_path / "message").write_text(subject + "\n\nbody\n", encoding="utf-8")
        hook = subprocess.run([sys.executable, str(REPO / ".githooks" / "commit-msg"), str(tmp_path / "message")],
                              capture_output=True, text=True)
        if hook.returncode != 0:
            refused.append(hook.stderr.strip())
    assert subjects and not refused, "\n".join(refused)
    (tmp_path / "message").write_text("x" * 73 + "\n", encoding="utf-8")
    assert subprocess.run([sys.executable, str(REPO / ".githooks" / "commit-msg"), str(tmp_path / "message")],
                          capture_output=True).returncode == 1
