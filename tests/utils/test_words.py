"""mnist_dp/utils/words.py: a noun that matches its number, in everything the bundle prints."""
import io
import re
import tokenize

from conftest import REPO

from mnist_dp.utils.words import counted, noun_for


def test_a_noun_is_plural_unless_there_is_one():
    assert counted(1, "organisation") == "1 organisation"
    assert counted(2, "round") == "2 rounds" and counted(0, "round") == "0 rounds"
    assert counted(3, "person", "persons") == "3 persons"
    assert noun_for(1, "run") == "run" and noun_for(2, "run") == "runs"


def test_no_message_leaves_its_reader_a_plural_in_brackets():
    """'1 run(s)': every string the product's code holds (docstrings aside) counts its nouns in
    words (counted)."""
    product = [p for folder in ("mnist_dp", "assets", "scripts", "examples", "benchmarks")
               for p in sorted((REPO / folder).rglob("*.py"))]
    found = [f"{path.relative_to(REPO)}:{token.start[0]}: {token.string.strip()[:60]}"
             for path in product
             for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
             if token.type == tokenize.STRING and not token.string.endswith('"""')
             and re.search(r"\b(?!tuple|http)[a-z]+\(s\)", token.string)]
    assert not found, "\n".join(found)
