"""The docs' journeys a new user types first, run as written on tiny data from a folder that looks
like a fresh clone (tests/documented.py). The README's main job and the federated journeys are
tests/scripts/test_run_local.py's; tests/test_readme.py checks that every documented command is
run by a test or says why not."""
import json

from documented import fresh_clone, run_documented

from mnist_dp.data import dataset


def test_a_function_alone_through_substratools(tmp_path):
    """docs/usage.md's train function, with the asset's own hyperparameters (a batch of 500): on
    600 training images in the clone's data folder, as the main job writes it."""
    clone = fresh_clone(tmp_path / "clone")
    dataset.generate(clone / "data", train_size=600, test_size=100, train_samples=1, seed=3)
    proc = run_documented("docs/usage.md", "repo=$(pwd)", clone)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # what it writes stays in its own folder; its run is recorded beside the samples
    assert not list(clone.glob("*.model")) and (clone / "data" / "train" / "0" /
                                                 "privacy_ledger.jsonl").is_file()


def test_the_per_person_journey(tmp_path):
    """docs/data.md: its help, then per-person data and a run on it with its hyperparameters."""
    clone = fresh_clone(tmp_path / "clone")
    help_ = run_documented("docs/data.md", "python scripts/generate_data.py --help", clone)
    assert help_.returncode == 0 and "--images-per-subject" in help_.stdout
    proc = run_documented("docs/data.md", "python scripts/generate_data.py --output data-persons",
                          clone)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads((clone / "results-persons" / "results.json").read_text())
    assert [r["privacy_unit"] for r in records] == ["person"] * 3
    assert json.loads((clone / "persons.json").read_text()) == {"batch_size": 50}
