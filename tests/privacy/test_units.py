"""mnist_dp/privacy/units.py: each privacy unit under the ledger's name of its clipping, with the
words the statement and results.json print, and how it counts a run's images."""
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
    assert (units.of(None), units.of(persons)) == (units.IMAGE, units.PERSON)
    assert units.IMAGE.count(6, None) == 6 and units.PERSON.count(6, persons) == 3
    batch = np.array([0, 1, 5])
    assert units.PERSON.in_batch(batch, persons) == 2 and units.IMAGE.in_batch(batch, None) == 3
