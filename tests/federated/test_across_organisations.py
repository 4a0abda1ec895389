"""Privacy across organisations, end to end, on data laid out as a deployment has it: each
organisation's share under its own identity key, the test set under a third, and 50 examples that
both organisations hold.

The same plan (2 organisations, 1 round, σ = 1) runs on the three federated paths: the bundle's
cyclic plan and federated averaging (scripts/run_local.py), and substrafl's FedAvg with the bundle's
algo (examples/ substrafl_fedavg.py). All must report the unit's figures (each organisation's
record: its own runs) and the individual held by both (every run), recomputed from σ, q and steps by
dp_accounting alone; and an organisation holding everything it receives must not be able to tell
whether an example is in the other organisation's data."""
import json
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from conftest import REPO, TINY_HYPERPARAMETERS, independent_epsilon

from mnist_dp.assets import DATASET_ASSET, load_asset_module
from mnist_dp.data import dataset, samples
from mnist_dp.data import keys as identity_keys
from mnist_dp.privacy import data_ledger, model_file

ORGS = ["MyOrg1MSP", "MyOrg2MSP"]
HP = {**TINY_HYPERPARAMETERS, "ema_decay": 0.0}  # σ = 1, one epoch of batch 64, δ = 1e-4
SHARED = 50  # examples both organisations hold


def load(folder):
    """A data sample's (images, labels) as stored."""
    return np.load(folder / samples.IMAGES_FILE), np.load(folder / samples.LABELS_FILE)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, tiny_data):
    """train/0: organisation 1's 150 examples under key A; train/1: organisation 2's 100 others and
    50 of organisation 1's, under key B; test/0 under key T. Returns (data folder, the keys,
    organisation 1's own examples (images, labels) that organisation 2 does not hold)."""
    data = tmp_path_factory.mktemp("deployment") / "data"
    first, second = (dataset.sample_folders(tiny_data, "train")[k] for k in (0, 1))
    (x1, y1), (x2, y2) = load(first), load(second)
    keys = {"A": identity_keys.new_key(), "B": identity_keys.new_key(),
            "T": identity_keys.new_key()}
    dataset.write_sample(data / "train" / "0", x1, y1, keys["A"], public=True)
    dataset.write_sample(data / "train" / "1", np.concatenate([x2[:100], x1[:SHARED]]),
                         np.concatenate([y2[:100], y1[:SHARED]]), keys["B"], public=True)
    dataset.write_sample(data / "test" / "0", *load(dataset.sample_folders(tiny_data, "test")[0]),
                         keys["T"])
    (data.parent / "hp.json").write_text(json.dumps(HP))
    return data, keys, (x1[SHARED:], y1[SHARED:])


def run(script, data, out, *options):
    done = subprocess.run([sys.executable, str(REPO / script), "--data", str(data), "--output",
                           str(out), "--hyperparameters", str(data.parent / "hp.json"),
                           *map(str, options)], capture_output=True, text=True, cwd=out.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def paths(deployment):
    """{path: the record of its final model at each organisation that holds one} after the same
    plan."""
    data = deployment[0]
    local = ["scripts/run_local.py", "--frameworks", "torch", "--organizations", 2]
    cyclic = run(local[0], data, data.parent / "cyclic", *local[1:])
    fedavg = run(local[0], data, data.parent / "fedavg", *local[1:], "--strategy", "fedavg")
    substrafl = run("examples/substrafl_fedavg.py", data, data.parent / "substrafl", "--framework",
                    "torch", "--organizations", 2, "--rounds", 1)
    return {"cyclic": [cyclic[-1]], "fedavg": fedavg, "substrafl": substrafl}


def test_every_federated_path_reports_each_organisations_record_and_the_individual_in_both(paths):
    delta = HP["delta"]
    own = independent_epsilon(1.0, 1 / 3, 3, delta)  # 150 examples, q = 1/3, 3 steps: one run
    both = independent_epsilon(1.0, 1 / 3, 6, delta)  # both organisations' runs
    assert both > own + 0.5
    for path, records in paths.items():
        # substrafl: each organisation's state
        assert len(records) == (2 if path == "substrafl" else 1), path
        for record in records:
            # Each organisation's ε is its own run's, though 50 of its examples are
            # also the other's: they are another organisation's records, covered beside
            # by the individual's figure.
            assert record["epsilon_by_organization"] == {
                org: pytest.approx(own, rel=1e-6) for org in ORGS}, path
            assert record["epsilon"] == pytest.approx(own, rel=1e-6), path
            assert record["epsilon_in_every_organization"] == pytest.approx(both, rel=1e-6), path
            saved = model_file.load(record["model_file"], "torch")
            assert len(saved.ledger.events) == 2 and len(saved.ledger.keys()) == 2, path
    # each organisation's evaluation reported its own record's figure
    for record in paths["substrafl"]:
        assert record["epsilon_in_substra"] == pytest.approx(own, rel=1e-6)


def test_an_organisation_cannot_test_membership_in_the_others_data_from_what_it_receives(
        deployment, paths):
    """Organisation 2 holds its key B, the test set's key T (it evaluates on the test set), its
    data, and every model file and report it receives. No ledger it receives names an example, so
    there is nothing to look a candidate up in, under any key. Organisation 1's own record, which
    never leaves it, does name them: with its key A the same look-up finds the member there and not
    the non-member, so the test would catch a record that travels."""
    data, keys, (member_images, member_labels) = deployment
    opener = load_asset_module(DATASET_ASSET / "opener.py", "opener_for_the_membership_attack")
    members = opener.example_digests(member_images.astype(np.float32) / 255,
                                     member_labels.astype(np.int64))
    non_members = opener.read_sample(str(data / "test" / "0")).digests  # never trained on
    received = [record["model_file"] for records in paths.values() for record in records]
    ledgers = [model_file.load(path, "torch").ledger for path in received]
    assert not any(ledger.names_examples for ledger in ledgers)
    own_record = data_ledger.read([data / "train" / "0"])
    recorded = set().union(*(set(named.array.tolist()) for named in own_record.examples.values()))

    def found(key: str, digests) -> int:
        return len(recorded & set(opener.example_ids(bytes.fromhex(key), digests).tolist()))

    assert found(keys["A"], members) == len(members) and found(keys["A"], non_members) == 0
    assert found(keys["B"], members) == 0
    # Nothing received holds a key: not the ledgers, the metadata, the reports or the performances.
    texts = [zipfile.ZipFile(path).read(name) for path in received
             for name in ("ledger.json", "meta.json")]
    texts += [(p / name).read_bytes() for p in {data.parent / "cyclic", data.parent / "fedavg",
                                                 data.parent / "substrafl"}
              for name in ("results.json", "summary.md")]
    assert not any(key.encode() in text for key in (keys["A"], keys["B"]) for text in texts)
    assert all(len(ledger.keys()) == 2 for ledger in ledgers)


def test_the_substrafl_example_registers_every_organisations_data_under_its_own_key(paths):
    """The substrafl example (torch, two organisations): each local state holds both organisations'
    runs, the same global weights, and the runs' steps and q as planned."""
    states = [model_file.load(record["model_file"], "torch") for record in paths["substrafl"]]
    assert states[0].weights == states[1].weights
    # own run last
    assert [e.run_id
            for e in states[0].ledger.events] != [e.run_id for e in states[1].ledger.events]
    assert {e.run_id
            for e in states[0].ledger.events} == {e.run_id for e in states[1].ledger.events}
    assert all(e.steps == 3 and e.sample_rate == pytest.approx(1 / 3)
               for e in states[0].ledger.events)
