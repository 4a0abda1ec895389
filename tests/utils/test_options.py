"""mnist_dp/utils/options.py and json_input's integer bound: each bound accepts its edge and refuses
one past it."""
import argparse
import json

import pytest

from mnist_dp.utils import json_input, options
from mnist_dp.utils.errors import UserError


def test_an_integer_is_accepted_at_its_bounds_and_refused_past_them():
    parse = options.integer(1, 10)
    assert parse("1") == 1 and parse("10") == 10 and parse(" +7 ") == 7
    for text, says in [("0", "0 is not an integer from 1 to 10"), ("11", "11 is not"),
                       ("1.0", "'1.0' is not"), ("9" * 41, "'9999"), ("", "'' is not")]:
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            parse(text)


def test_a_number_is_finite_and_open_or_closed_at_each_end_as_asked():
    closed, open_low = options.number(0, 1), options.number(0, 1, low_open=True)
    assert closed("0") == 0 and closed("1") == 1 and open_low("1e-300") == 1e-300
    for parse, text in [(open_low, "0"), (closed, "1.0000001"), (closed, "nan"), (closed, "inf"),
                        (closed, "one")]:
        with pytest.raises(argparse.ArgumentTypeError, match="is not a number in"):
            parse(text)


def test_a_list_has_at_least_one_item_each_known_none_twice():
    names = options.names(["torch", "tf"])
    assert names(" tf , torch ") == ["tf", "torch"]
    for text, says in [("", "give at least 1"), (",", "give at least 1"),
                       ("tf,tf", "tf given twice"),
                       ("jax", "unknown 'jax'; choose among torch, tf")]:
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            names(text)


def test_the_parser_error_is_a_user_error_naming_the_option_and_help():
    parser = options.ArgumentParser("x", prog="tool.py")
    parser.add_argument("--rounds", type=options.integer(1, 3))
    assert parser.parse_args(["--rounds", "3"]).rounds == 3
    with pytest.raises(UserError, match=r"^argument --rounds: 4 is not an integer from 1 to 3 "
                                        r"\(see tool.py --help\)$"):
        parser.parse_args(["--rounds", "4"])


def test_an_option_given_where_it_has_no_effect_is_refused_even_when_zero():
    options.refuse_unused("with --x", {"--a": None, "--b": False, "--c": []})  # none given
    with pytest.raises(UserError, match=r"^--a and --b have no effect with --x; drop them$"):
        options.refuse_unused("with --x", {"--a": 0, "--b": 0.0, "--c": None})


def test_json_integers_are_read_up_to_max_digits_and_longer_ones_name_the_file():
    edge = "9" * options.MAX_DIGITS
    assert json_input.loads(f'{{"a": -{edge}}}', "f.json") == {"a": -int(edge)}
    with pytest.raises(UserError, match=r"^f.json: an integer of 5,000 digits; no value this "
                                        r"bundle reads has more"):
        json_input.loads(f'[{"9" * 5000}]', "f.json")
    with pytest.raises(json.JSONDecodeError):
        json_input.loads("{", "f.json")
