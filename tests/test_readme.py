"""The README's commands are the ones CI runs and the scripts accept."""
import re

from conftest import REPO


def readme_commands():
    return re.findall(r"```(?:bash|sh)\n(.*?)\n```", (REPO / "README.md").read_text(), re.S)


def test_ci_runs_the_readme_test_command():
    ci_command = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_command in readme_commands()


def test_readme_run_command_is_the_main_job():
    assert "pip install -r requirements.txt && python scripts/run_local.py" in readme_commands()
