"""The data owner's policy (privacy/policy.py): read from the data's folders, the strictest of
several, its opt-ins refused in one line, a run that cannot stop early held to every budget by
basic composition, and written by generate_data.py."""
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, dp_event

from mnist_dp.privacy import accountant, policy, units
from mnist_dp.privacy.budgets import check_whole_run
from mnist_dp.utils.errors import UserError

OWNER = {"max_epsilon": 2.0, "delta": 1e-5, "privacy_unit": None, "allow": ["baseline"]}


def folder_with(tmp_path, name, values):
    folder = tmp_path / name
    folder.mkdir()
    (folder / policy.POLICY_FILE).write_text(json.dumps(values))
    return folder


@pytest.mark.parametrize("values, message", [
    ({**OWNER, "surprise": 1}, "unknown: surprise"),
    ({**OWNER, "max_epsilon": -1}, "max_epsilon = -1 must be a positive number"),
    ({**OWNER, "delta": None}, "delta = null must be a number in .0, 1. with max_epsilon"),
    ({**OWNER, "privacy_unit": "pixel"}, "privacy_unit = \"pixel\" must be null or one of"),
    ({**OWNER, "allow": ["everything"]}, "allow must be a list of opt-ins among"),
    ({**OWNER, "public_size": 0}, "public_size = 0 must be null or an integer from 1"),
    ({**OWNER, "public_size": 4000.0}, "public_size = 4000.0 must be null or an integer"),
    ({**OWNER, "public_size": True}, "public_size = true must be null or an integer"),
    ([], "must be an object with the keys"),
])
def test_a_bad_policy_file_is_refused_naming_it(tmp_path, values, message):
    folder = folder_with(tmp_path, "s", values)
    with pytest.raises(UserError, match=message) as caught:
        policy.of_folders([folder])
    assert str(folder / policy.POLICY_FILE) in str(caught.value)


def test_samples_of_several_policies_keep_every_budget_and_only_what_all_allow(tmp_path):
    first = folder_with(tmp_path, "a", OWNER)
    second = folder_with(tmp_path, "b", {"max_epsilon": 5.0, "delta": 1e-6,
                                         "privacy_unit": "person",
                                         "allow": ["baseline", "noise_seed"]})
    none = tmp_path / "c"
    none.mkdir()
    both = policy.of_folders([first, second, none])
    assert both.budgets == ((2.0, 1e-5), (5.0, 1e-6))
    assert both.privacy_unit == "person" and both.allow == {"baseline"}
    assert policy.of_folders([none]) == policy.Policy()  # no file: no limit


def test_a_tasks_public_size_is_its_samples_declarations_summed_and_never_its_count(tmp_path):
    first = folder_with(tmp_path, "a", {"public_size": 200})
    second = folder_with(tmp_path, "b", {**OWNER, "public_size": 300})
    data = {"samples": [{"folder": str(first)}, {"folder": str(second)}]}
    assert policy.plan_size(data, units.IMAGE, 1234) == 500
    persons = units.of(np.arange(1234) // 2)  # 617 persons, whatever the samples declare
    assert policy.plan_size(data, persons, 1234) == 500
    # data made in memory (no folder) declares its own count, in its unit
    assert policy.plan_size({"samples": [{"identity": "x"}]}, persons, 1234) == 617


def test_a_sample_that_declares_no_size_is_refused_naming_it(tmp_path):
    declared, undeclared = folder_with(tmp_path, "a", {"public_size": 200}), tmp_path / "b"
    undeclared.mkdir()
    for folders in ([declared, undeclared], [undeclared]):
        with pytest.raises(UserError, match="no public size declared for this data") as caught:
            policy.plan_size({"samples": [{"folder": str(f)} for f in folders]}, units.IMAGE,
                             300)
        assert str(undeclared) in str(caught.value) and "--public-size" in str(caught.value)


@pytest.mark.parametrize("real, refused", [(3600, False), (4400, False), (3599, True),
                                           (4401, True)])
def test_the_scripts_refuse_a_count_more_than_a_tenth_from_its_declared_size(tmp_path, real,
                                                                             refused):
    folder = folder_with(tmp_path, "a", {"public_size": 4000})
    if not refused:
        assert policy.declared_size([folder], real, "fold 1") == 4000
        return
    with pytest.raises(UserError, match=f"fold 1: holds {real:,} images but declares a public "
                                        "size of 4,000, more than 10% away"):
        policy.declared_size([folder], real, "fold 1")


def test_declaring_a_size_or_writing_a_policy_keeps_the_other(tmp_path):
    folder = folder_with(tmp_path, "a", OWNER)
    policy.declare_size(folder, 300)
    assert policy.read(folder) == policy.parse({**OWNER, "public_size": 300},
                                               str(folder / policy.POLICY_FILE))
    policy.write_into([folder], policy.parse({**OWNER, "max_epsilon": 1.0}, "the options"))
    assert (policy.read(folder).public_size, policy.read(folder).budgets) == (300, ((1.0, 1e-5),))


@pytest.mark.parametrize("run, message", [
    ({"dp": False, "noise_seed": None, "per_person": False}, "a non-private model"),
    ({"dp": True, "noise_seed": 3, "per_person": False}, "replayable noise"),
])
def test_an_opt_in_the_owner_does_not_allow_is_refused_in_one_line(tmp_path, run, message):
    owner = policy.of_folders([folder_with(tmp_path, "s", {**OWNER, "allow": []})])
    with pytest.raises(UserError, match=f"the data's owner does not allow {message}") as caught:
        owner.check_allowed(**run)
    assert "\n" not in str(caught.value)
    policy.of_folders([folder_with(tmp_path, "t", {
        **OWNER, "allow": list(policy.OPT_INS)})]).check_allowed(**run)  # allowed


def test_a_person_unit_refuses_a_run_per_image(tmp_path):
    owner = policy.of_folders([folder_with(tmp_path, "s", {**OWNER, "privacy_unit": "person"})])
    with pytest.raises(UserError, match="asks for privacy per person"):
        owner.check_allowed(dp=True, noise_seed=None, per_person=False)
    owner.check_allowed(dp=True, noise_seed=None, per_person=True)


def test_a_run_that_cannot_stop_early_is_held_to_the_budget_by_basic_composition(tmp_path):
    owner = policy.of_folders([folder_with(tmp_path, "s", OWNER)])
    earlier = [dp_event(n=60000, batch=250, epochs=3, sigma=1.1)]
    # the history at the δ the search leaves, plus the search's own target
    room = 2.0 - accountant.compose_epsilon(earlier, 1e-5 - 5e-6)
    assert 0 < room < 2.0
    check_whole_run(owner, [earlier], room * 0.99, 5e-6, "a search")
    with pytest.raises(UserError, match="a search cannot stop early, and its ε"):
        check_whole_run(owner, [earlier], room * 1.01, 5e-6, "a search")
    with pytest.raises(UserError, match="could pass it"):  # its δ leaves none for the history
        check_whole_run(owner, [earlier], 0.1, 1e-5, "a search")
    check_whole_run(owner, [[]], 2.0, 1e-5, "a search")  # fresh data: its target at its δ


def test_generate_data_writes_the_owners_policy_into_every_train_sample(tmp_path):
    proc = subprocess.run([sys.executable, "scripts/generate_data.py", "--output",
                           str(tmp_path / "data"), "--train-size", "200", "--test-size", "50",
                           "--train-samples", "2", "--budget", "4", "--budget-delta", "1e-5",
                           "--allow", "score_train"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "privacy policy written to 2 train sample folders" in proc.stdout
    for k in (0, 1):
        written = json.loads((tmp_path / "data" / "train" / str(k) / policy.POLICY_FILE)
                             .read_text())
        assert written == {"max_epsilon": 4.0, "delta": 1e-5, "privacy_unit": None,
                           "allow": ["score_train"], "public_size": 100}
    assert not (tmp_path / "data" / "test" / "0" / policy.POLICY_FILE).exists()
    proc = subprocess.run([sys.executable, "scripts/generate_data.py", "--output",
                           str(tmp_path / "other"), "--budget", "4"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "give both" in proc.stderr
    assert not (tmp_path / "other").exists()
