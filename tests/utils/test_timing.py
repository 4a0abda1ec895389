import json
import subprocess
import sys
import time

import pytest

from mnist_dp.utils import timing


def test_a_task_records_its_phases_and_peak_memory(tmp_path, monkeypatch):
    path = tmp_path / "timings.jsonl"
    monkeypatch.setenv(timing.TIMINGS_VARIABLE, str(path))
    for _ in range(2):  # appended, one line per task
        timing.begin_task("train", framework="torch")
        time.sleep(0.05)
        timing.mark("first step")
        time.sleep(0.1)
        timing.mark("training")
        time.sleep(0.05)
        timing.mark("training")  # a phase marked twice adds up
        timing.end_task("saving", dp=True)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 2
    record = records[0]
    assert (record["function"], record["framework"], record["dp"]) == ("train", "torch", True)
    assert list(record["phases"]) == ["start", "first step", "training", "saving"]
    assert record["phases"]["first step"] == pytest.approx(0.05, abs=0.04)
    assert record["phases"]["training"] == pytest.approx(0.15, abs=0.06)
    assert record["phases"]["start"] > 0  # this process started before the test
    assert 10 < record["peak_rss_mb"] < 100_000


def test_without_a_task_marks_do_nothing_and_nothing_is_written(tmp_path, monkeypatch):
    # without a task: whatever an earlier test in this process began and never ended
    monkeypatch.setattr(timing, "_task", None)
    path = tmp_path / "timings.jsonl"
    monkeypatch.setenv(timing.TIMINGS_VARIABLE, str(path))
    timing.mark("training")
    assert timing.end_task("saving") is None and not path.exists()


def test_process_age_counts_from_the_process_start():
    code = ("import time; time.sleep(0.5); from mnist_dp.utils import timing; "
            "print(timing.process_age())")
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               check=True).stdout)
    assert 0.5 <= age < 5
