"""mnist_dp/utils/words.py: a noun that matches its number."""
from mnist_dp.utils.words import counted


def test_a_noun_is_plural_unless_there_is_one():
    assert counted(1, "organisation") == "1 organisation"
    assert counted(2, "round") == "2 rounds" and counted(0, "round") == "0 rounds"
    assert counted(3, "person", "persons") == "3 persons"
