"""Neighbouring data sets, D and D minus one example, on either side of a batch boundary (201 and
200 images at a batch of 50), both declaring the public size 200: every framework's train task, and
the search's tune task, run the same mechanism on both (q, the steps, σ, the normaliser, ε), since
the data's owner declared the size and nothing counts the data."""
import json
import zipfile

import pytest
from conftest import (
    ALGO_ASSETS,
    FRAMEWORKS,
    NEIGHBOURS_PUBLIC_SIZE,
    extract_function,
    run_function,
    samples,
    tiny_hyperparameters,
)

from mnist_dp.privacy import model_file

RUN = {"batch_size": 50, "epochs": 1, "noise_seed": 7}


def released(path) -> dict:
    """What a model file releases besides its weights, with what names the data samples (keyed
    identities), the run's random id and the digests of the weights and ledger masked."""
    with zipfile.ZipFile(path) as archive:
        meta = json.loads(archive.read("meta.json"))
    for key in ("ledger_sha256", "weights_sha256"):
        meta.pop(key)
    events = [{**e.to_json(), "data": len(e.data), "run_id": None}
              for e in model_file.load(path).ledger.events]
    return {"meta": meta, "events": events}


def run(tmp_path, framework, function, data_dir, **changes):
    folder = extract_function(ALGO_ASSETS[framework], function, tmp_path / f"fn-{data_dir.name}",
                              tiny_hyperparameters(framework, **RUN, **changes))
    outputs = {"model": tmp_path / f"model-{data_dir.name}",
               "epsilon": tmp_path / f"epsilon-{data_dir.name}.json"}
    run_function(folder / "algo.py", function,
                 {"opener": str(ALGO_ASSETS[framework].parent / "dataset" / "opener.py"),
                  "datasamples": samples(data_dir, "train")}, outputs)
    return released(outputs["model"]), json.loads(outputs["epsilon"].read_text())


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_train_task_runs_the_same_mechanism_on_d_and_on_d_less_one_example(
        framework, tmp_path, neighbours):
    on_d, on_less = (run(tmp_path, framework, "train", neighbours[name]) for name in ("D", "D-1"))
    assert on_d == on_less
    (event,) = on_d[0]["events"]
    # the public size's plan: 4 steps at q = 1/4, as for 200 images; 201 counted would be 5 at 1/5
    assert (event["n"], event["sample_rate"], event["steps"]) == (NEIGHBOURS_PUBLIC_SIZE, 0.25, 4)
    assert event["public_size"] is True


def test_a_search_releases_the_same_privacy_figures_on_d_and_on_d_less_one_example(
        tmp_path, neighbours):
    on_d, on_less = (run(tmp_path, "torch", "tune", neighbours[name], noise_multiplier=None,
                         target_epsilon=3.0) for name in ("D", "D-1"))
    assert on_d[1] == on_less[1]  # ε
    search_d, search_less = on_d[0]["events"][0], on_less[0]["events"][0]
    assert search_d["search"] == search_less["search"] and search_d["n"] == NEIGHBOURS_PUBLIC_SIZE
    # the validation split's public size: its expected share of the declared size
    assert search_d["search"]["validation_n"] == round(NEIGHBOURS_PUBLIC_SIZE * 0.1)
