"""benchmarks/audit.py: the white-box audit through each framework's own DP step must hold as built
and catch the mechanism broken on purpose; the black-box audit still runs; records are merged, bad
options refused."""
import json
import subprocess
import sys

import pytest

from mnist_dp.assets import REPO

AUDIT = REPO / "benchmarks" / "audit.py"
# every weight a canary: as strong as 10 steps
SMALL = ["--train-size", "64", "--steps", "2", "--epsilons", "2"]


def run_audit(*options):
    """The script as a user runs it (its runs are in child processes, which need it as __main__)."""
    return subprocess.run([sys.executable, str(AUDIT), *options], capture_output=True, text=True)


def records(folder):
    return {(r["framework"], r["mode"], r["mechanism"]): r
            for r in json.loads((folder / "audit.json").read_text())}


@pytest.mark.parametrize("framework", ["torch", "tf", "mindspore"])
def test_the_white_box_audit_holds_as_built_and_catches_half_the_noise(framework, tmp_path):
    result = run_audit("--white-box", "--frameworks", framework, *SMALL, "--output", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    built, broken = records(tmp_path)[
        framework, "white-box", "as-built"], records(tmp_path)[framework, "white-box", "broken"]
    assert built["canaries"] == broken["canaries"] == 72756  # the default network's weights
    assert built["claimed_epsilon"] == pytest.approx(2.0, abs=0.01)
    assert 0.5 * built["claimed_epsilon"] <= built["lower_bound"] <= built["claimed_epsilon"]
    assert broken["noise_added"] == 0.5 and broken["lower_bound"] > broken["claimed_epsilon"]
    assert "| as-built | 2.00 |" in (tmp_path / "audit.md").read_text()


def test_the_white_box_audit_holds_per_person_with_a_person_for_each_canary(tmp_path):
    """Persons of 4 images, the run private per person: each canary is one person's clipped
    contribution, and the claim per person holds as built and is caught when broken."""
    result = run_audit("--white-box", "--frameworks", "torch", *SMALL, "--images-per-person", "4",
                       "--output", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    built, broken = (records(tmp_path)["torch", "white-box", mechanism]
                     for mechanism in ("as-built", "broken"))
    assert built["privacy_unit"] == broken["privacy_unit"] == "person"
    assert 0.5 * built["claimed_epsilon"] <= built["lower_bound"] <= built["claimed_epsilon"]
    assert broken["lower_bound"] > broken["claimed_epsilon"]
    assert "| torch | white-box | person | as-built | 2.00 |" in (tmp_path / "audit.md").read_text()


def test_a_broken_mechanism_the_audit_cannot_tell_apart_fails_the_run(tmp_path):
    result = run_audit("--white-box", "--frameworks", "torch", *SMALL, "--broken-noise-scale",
                       "0.95", "--output", str(tmp_path))
    assert result.returncode == 1, result.stderr
    assert "torch broken at ε 2.00: NOT CAUGHT" in result.stdout
    # still written, for the record
    assert records(tmp_path)["torch", "white-box", "broken"]["lower_bound"] < 2.0


def test_the_black_box_audit_still_runs_and_later_runs_replace_only_their_own_records(tmp_path):
    tiny = ["--frameworks", "torch", "--epsilons", "8", "--canaries", "20", "--guesses", "5",
            "--train-size", "50", "--epochs", "1", "--batch-size", "25", "--output", str(tmp_path)]
    assert run_audit(*tiny).returncode == 0
    first = records(tmp_path)
    assert set(first) == {("torch", "black-box", "as-built"), ("torch", "black-box", "non-private")}
    assert first["torch", "black-box", "non-private"]["claimed_epsilon"] is None
    second = run_audit(*tiny, "--no-baseline", "--seed", "1")
    assert "1 earlier record of the same runs replaced" in second.stdout
    again = json.loads((tmp_path / "audit.json").read_text())
    assert len(again) == 2 and records(tmp_path)["torch", "black-box", "non-private"] == first[
        "torch", "black-box", "non-private"]


@pytest.mark.parametrize("options, message", [
    (["--frameworks", "jax"], "--frameworks: unknown 'jax'"),
    (["--epsilons", "two"], "--epsilons: 'two' is not a number in (0, 100]"),
    (["--epsilons", ","], "--epsilons: ',': give at least 1"),
    (["--seed", "-1"], "--seed: -1 is not an integer from 0"),
    (["--white-box", "--canaries", "50"], "--canaries has no effect with --white-box"),
    (["--steps", "3"], "--steps has no effect without --white-box"),
    (["--broken-noise-scale", "1"], "--broken-noise-scale"),
    (["--output", "/nonexistent"], "is not a folder"),
    (["--white-box", "--frameworks", "torch", "--guesses", "40000", "--steps", "1", "--train-size",
      "8"], "2k must be at most the 72756 canaries"),
])
def test_bad_options_are_one_line_errors(options, message):
    result = run_audit(*options)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
