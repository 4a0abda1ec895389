"""The code passes the linter configured in pyproject.toml (ruff), so CI runs it with the tests."""
import subprocess
import sys

from conftest import REPO


def test_the_code_passes_the_linter():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(REPO)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
