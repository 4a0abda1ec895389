"""mnist_dp/privacy/units.py: each privacy unit under the ledger's name of its clipping, with the
words the statement and results.json print, and how it counts, samples and groups a run's images."""
import numpy as np

from mnist_dp.privacy import events, statement, units


def test_each_clipping_names_one_unit_whose_words_the_statement_prints():
    assert units.UNITS == {events.PER_EXAMPLE: units.IMAGE, events.PER_PERSON: units.PERSON}
    assert [u.name for u in units.UNITS.values()] == ["image", "person"]
    for unit, mechanism in ((units.IMAGE, statement.MECHANISM),
                            (units.PERSON, statement.PERSON_MECHANISM)):
        text = "\n".join(mechanism)
        assert f"Neighbouring datasets: {unit.neighbouring_relation};" in text
        assert f"Sampling: {unit.sampling}, as the accountant assumes." in text
    assert "one person, with all their images" in units.PERSON.neighbouring_relation


def test_a_unit_counts_its_units_in_the_data_and_in_a_batch():
    """Six images of three persons: an image is its own unit; a person's images are counted
    together."""
    persons = np.array([0, 0, 1, 1, 1, 2])
    image, person = units.of(None), units.of(persons)
    assert (image, person) == (units.IMAGE, units.PERSON) and person.groups is persons
    assert image.count(6) == 6 and person.count(6) == 3
    batch = np.array([0, 1, 5])
    assert person.in_batch(batch) == 2 and image.in_batch(batch) == 3


def test_a_unit_within_some_images_numbers_their_groups_again():
    """A search's split: each side's persons numbered 0..P'-1 among its own images."""
    person = units.of(np.array([3, 3, 0, 1, 1, 2]))
    held_out = np.array([False, False, True, True, True, False])
    assert person.within(~held_out).groups.tolist() == [1, 1, 0]
    assert person.within(held_out).groups.tolist() == [0, 1, 1]
    assert units.IMAGE.within(held_out) is units.IMAGE


def test_a_unit_samples_its_units_each_at_rate_q_and_a_person_with_all_their_images():
    """Poisson batches of 2,000 steps at q = 0.3: each image, or each person, joins a batch at that
    rate, independently of the others; a person's images join together, one draw per person."""
    persons = np.repeat(np.arange(4), [1, 2, 3, 4])
    for unit, units_count in ((units.IMAGE, 10), (units.of(persons), 4)):
        rng = np.random.default_rng(5)
        batches = [unit.sample(rng, 0.3, units_count) for _ in range(2000)]
        member = np.array([np.isin(np.arange(10), b) for b in batches])  # [steps, images]
        if unit.grouped:
            for person in range(4):  # a person's images are all in, or all out
                rows = member[:, persons == person]
                assert (rows == rows[:, :1]).all()
            member = np.array([member[:, persons == p][:, 0] for p in range(4)]).T
        assert member.shape[1] == units_count
        np.testing.assert_allclose(member.mean(axis=0), 0.3, atol=0.04)
        # two units join together as often as independence says
        np.testing.assert_allclose((member[:, 0] & member[:, 1]).mean(), 0.09, atol=0.03)
        # one draw per unit a step: the next number after a step is the next step's first
        rng = np.random.default_rng(5)
        unit.sample(rng, 0.3, units_count)
        assert rng.random() == np.random.default_rng(5).random(units_count + 1)[-1]


def test_a_batchs_persons_lay_out_each_persons_examples_in_a_padded_row():
    groups, layout = units.person_rows(np.array([7, 3, 7, 9, 3, 7]), -1)
    assert groups.tolist() == [1, 0, 1, 2, 0, 1]
    assert layout.tolist() == [[1, 4, -1], [0, 2, 5], [3, -1, -1]]


def test_a_unit_groups_a_batch_a_person_a_row_and_an_image_not_at_all():
    persons = np.array([4, 4, 1, 1, 1, 0, 7])
    grouped = units.of(persons).group(np.array([6, 0, 2, 1]))
    # the batch's persons 7, 4, 1, 4 in order of their ids: 1 -> 0, 4 -> 1, 7 -> 2
    assert grouped.groups.tolist() == [2, 1, 0, 1] and grouped.count == 3
    assert grouped.slots.tolist() == [[2, 4], [1, 3], [0, 4]]  # 4: the batch's zero row
    assert units.IMAGE.group(np.array([6, 0])) is None
