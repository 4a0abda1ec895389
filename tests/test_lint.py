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
