"""mnist_dp/privacy/units.py: each privacy unit under the ledger's name of its clipping, with the
words the statement and results.json print."""
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
