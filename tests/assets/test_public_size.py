"""Neighbouring data sets, D and D minus one example, on either side of a batch boundary (201 and
200 images at a batch of 50), both declaring the public size 200: every framework's train task, the
search's tune task and the main job release the same artefacts on both but for the weights and what
they decide (the test accuracy; which candidate a search releases), the keyed ids and the timings:
the model file's ledger and metadata, its statement, ε, the logs, results.json, summary.md and
Substra's performances. Nothing counts the data: the data's owner declared its size."""
import json
import re
import subprocess
import sys
import zipfile

import pytest
from conftest import (
    ALGO_ASSETS,
    FRAMEWORKS,
    NEIGHBOURS_PUBLIC_SIZE,
    REPO,
    extract_function,
    masked,
    run_function,
    samples,
    tiny_hyperparameters,
)

from mnist_dp import search_space
from mnist_dp.privacy import model_file, statement

RUN = {"batch_size": 50, "epochs": 1, "noise_seed": 7}
def released(path) -> dict:
    """What a model file releases besides its weights: its metadata (the digests aside), its ledger
    and its statement, their keyed ids masked."""
    with zipfile.ZipFile(path) as archive:
        meta = json.loads(archive.read("meta.json"))
        ledger = archive.read("ledger.json").decode()
    for key in ("ledger_sha256", "weights_sha256"):
        meta.pop(key)
    return {"meta": meta, "ledger": masked(ledger),
            "statement": masked(statement.privacy_statement(model_file.load(path)))}


def run(tmp_path, framework, function, data_dir, **changes):
    """`function` of `framework` on data folder `data_dir`: what it released, masked (its model
    file's, its ε, its log at INFO), and the run's ledger event."""
    folder = extract_function(ALGO_ASSETS[framework], function, tmp_path / f"fn-{data_dir.name}",
                              tiny_hyperparameters(framework, **RUN, **changes))
    outputs = {"model": tmp_path / f"model-{data_dir.name}",
               "epsilon": tmp_path / f"epsilon-{data_dir.name}.json"}
    proc = run_function(folder / "algo.py", function,
                        {"opener": str(ALGO_ASSETS[framework].parent / "dataset" / "opener.py"),
                         "datasamples": samples(data_dir, "train")}, outputs, log_level="info")
    log = masked(proc.stderr.replace(str(tmp_path), "<tmp>"))
    assert "trained" in log or "search" in log, log
    # each line once, by substratools' handler: none again through a library's logging.basicConfig()
    assert ":substratools." not in log, log
    return ({**released(outputs["model"]), "epsilon": outputs["epsilon"].read_text(), "log": log},
            model_file.load(outputs["model"]).ledger.events[0])


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_train_task_releases_the_same_on_d_and_on_d_less_one_example(
        framework, tmp_path, neighbours):
    (on_d, event), (on_less, _) = (run(tmp_path, framework, "train", neighbours[name])
                                   for name in ("D", "D-1"))
    assert on_d == on_less
    # the public size's plan: 4 steps at q = 1/4, as for 200 images; 201 counted would be 5 at 1/5
    assert (event.n, event.sample_rate, event.steps) == (NEIGHBOURS_PUBLIC_SIZE, 0.25, 4)
    assert event.public_size is True
    assert '"ids"' not in on_d["ledger"]  # no example is named: their number would be n


def drawn_masked(released: dict) -> dict:
    """`released` with the released candidate's drawn hyperparameters masked: noisy scores of the
    data pick it, so they are the mechanism's output, as its weights are (the default search draws
    no setting that changes σ, q or the steps)."""
    drawn = search_space.DEFAULT["space"]
    assert not set(drawn) & set(search_space.PRIVACY_KEYS)
    values = released["meta"]["hyperparameters"]
    return {**released,
            "meta": {**released["meta"], "hyperparameters": {
                key: "<drawn>" if key in drawn else value for key, value in values.items()}},
            "ledger": re.sub(r'"max_grad_norm": [0-9.e+-]+', '"max_grad_norm": "<drawn>"',
                             released["ledger"]),
            "statement": released["statement"].replace(f"C = {values['max_grad_norm']:g}",
                                                       "C = <drawn>")}


def test_a_search_releases_the_same_on_d_and_on_d_less_one_example(tmp_path, neighbours):
    """The same but for the released candidate's drawn hyperparameters: on D - 1 another candidate
    may win (the validation split follows the data's identity key, new at every session)."""
    (on_d, event), (on_less, _) = (run(tmp_path, "torch", "tune", neighbours[name],
                                       noise_multiplier=None, target_epsilon=3.0)
                                   for name in ("D", "D-1"))
    assert drawn_masked(on_d) == drawn_masked(on_less)
    assert event.n == NEIGHBOURS_PUBLIC_SIZE
    # the validation split's public size: its expected share of the declared size
    assert event.search.validation_n == round(NEIGHBOURS_PUBLIC_SIZE * 0.1)


def test_the_main_job_reports_the_same_on_d_and_on_d_less_one_example(tmp_path, neighbours):
    """run_local.py, torch: its printed report, results.json, summary.md (the statement and
    Substra's performances in it) are the same but for the test accuracy, which the weights
    decide."""
    hp = tmp_path / "hp.json"
    hp.write_text(json.dumps(RUN))
    reports = {}
    for name in ("D", "D-1"):
        out = tmp_path / f"out-{name}"
        proc = subprocess.run([sys.executable, str(REPO / "scripts" / "run_local.py"),
                               "--frameworks", "torch", "--data", str(neighbours[name]),
                               "--output", str(out), "--hyperparameters", str(hp)],
                              capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        [record] = json.loads((out / "results.json").read_text())
        accuracy = record.pop("test_accuracy")
        texts = [proc.stdout, json.dumps(record), (out / "summary.md").read_text()]
        reports[name] = [masked(t.replace(str(tmp_path), "<tmp>").replace(f"{accuracy:.4f}",
                                                                            "<accuracy>"))
                         for t in texts]
        assert "<accuracy>" in reports[name][2]  # the performances' row
    assert reports["D"] == reports["D-1"]
