"""benchmarks/same_noise.py: given the same noise, the frameworks train to the same model; the
report says so. (Its bad options are tests/test_entry_points.py's.)"""
import json
import subprocess
import sys

import pytest

from mnist_dp.assets import REPO

SAME_NOISE = REPO / "benchmarks" / "same_noise.py"


@pytest.mark.slow
def test_with_the_same_noise_every_framework_reaches_the_same_accuracy(tmp_path):
    result = subprocess.run([sys.executable, str(SAME_NOISE), "--seeds", "1", "--train-size",
                             "500", "--set", "epochs=3", "--set", "ema_decay=0.0", "--output",
                             str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    records = json.loads((tmp_path / "same-noise.json").read_text())
    shared = {r["framework"]: r["accuracy"] for r in records if r["noise"] == "shared noise"}
    own = {r["framework"]: r["accuracy"] for r in records if r["noise"] == "own noise"}
    assert sorted(shared) == sorted(own) == ["mindspore", "tf", "torch"]
    # one mechanism: the noise draws were all that differed
    assert len(set(shared.values())) == 1, shared
    assert min(shared.values()) > 0.3  # it learnt something (ten classes)
    assert ("The same accuracy in every framework at 1 of 1 "
            "seeds." in (tmp_path / "same-noise.md").read_text())
