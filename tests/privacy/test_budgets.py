"""mnist_dp/privacy/budgets.py: what a run may spend, known before its plan (the unit, the data's
public size in it, the earlier runs it counts, the owner's policy), and the owner's budgets."""
import numpy as np
import pytest
from conftest import dict_hp

from mnist_dp.assets import load_asset_module
from mnist_dp.privacy import budgets, units
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.utils.errors import UserError


def fake_data(opener_path, n):
    return load_asset_module(opener_path, "opener_for_budget_tests").MnistOpener().fake_data(n)


def test_an_algo_that_does_not_clip_per_person_refuses_subjects(opener_path):
    """A framework's dp_step that would ignore step.persons would clip per image under a ledger per
    person: Framework.per_person (False by default), passed as clips_per_person, gates it."""
    data = fake_data(opener_path, 6)
    hp = dict_hp(noise_multiplier=1.0, target_epsilon=None)
    assert budgets.per_person("torch", False, data, hp, {}) == units.IMAGE  # no subjects
    data["samples"][0]["persons"] = np.array([5, 5, 7, 7, 7, 9], np.uint64)
    with pytest.raises(UserError, match="subjects.npy: torch does not clip per person; train "
                                        "this data with an algo that does"):
        budgets.per_person("torch", False, data, hp, {})
    unit = budgets.per_person("torch", True, data, hp, {})
    assert unit == units.PERSON and unit.groups.tolist() == [0, 0, 1, 1, 1, 2]


def test_a_tasks_budget_counts_its_unit_and_names_its_samples_in_the_input_models_ledger(
        opener_path):
    hp = dict_hp(noise_multiplier=1.0, target_epsilon=None)
    data, ledger = fake_data(opener_path, 6), Ledger()
    budget = budgets.of_task("torch", True, ledger, data, hp, None, continuing=False)
    assert (budget.n, budget.unit, budget.unit.groups, budget.passes_on) == (6, units.IMAGE, None,
                                                                              False)
    assert budget.identities == tuple(s["identity"] for s in data["samples"]) == tuple(
        ledger.examples)
    assert budget.histories == budget.counted == ((),)  # nothing ran on it before
    data["samples"][0]["persons"] = np.array([5, 5, 7, 7, 7, 9], np.uint64)
    per_person = budgets.of_task("torch", True, Ledger(), data, hp, None, continuing=False)
    assert (per_person.n, per_person.unit, per_person.unit.groups.tolist()) == (
        3, units.PERSON, [0, 0, 1, 1, 1, 2])


def test_a_searchs_budget_is_the_same_phase_on_the_datas_own_ledger(opener_path):
    hp = dict_hp(noise_multiplier=None, target_epsilon=2.0)
    data = fake_data(opener_path, 6)
    budget = budgets.of_search("torch", True, Ledger(), data, hp)
    assert (budget.n, budget.unit, budget.histories, budget.unit.groups) == (
        6, units.IMAGE, ((),), None)
    assert budget.identities == tuple(s["identity"] for s in data["samples"])
    data["copies"] = "images.npy: images 2 and 5 are the same example"
    with pytest.raises(UserError, match="^images.npy: images 2 and 5 are the same example$"):
        budgets.of_search("torch", True, Ledger(), data, hp)
