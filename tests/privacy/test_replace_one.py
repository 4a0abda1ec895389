"""The replace-one figure (privacy/replace_one.py): the group-of-two bound of the add-or-remove ε,
checked against its definition and against a lower bound on the default run's true figure."""
import math

import pytest
from conftest import dp_event

from mnist_dp.privacy import accountant, replace_one
from mnist_dp.privacy.ledger import Ledger

DEFAULT_RUN = dp_event(4000, 500, 30, sigma=2.866)  # σ, q = 1/8 and 240 steps: ε = 2.999


def test_the_default_run_replacing_one_example_is_the_group_of_two_bound_above_its_lower_bound():
    figure = replace_one.of_ledger(Ledger([DEFAULT_RUN]), 1e-5)
    half = figure / 2
    # ε' = figure / 2 is (ε', δ')-DP at δ' = δ / (1 + e^ε'): so (figure, δ) for a group of two
    assert accountant.compose_epsilon([DEFAULT_RUN], 1e-5 / (1 + math.exp(half))) <= half
    # and no lower than needed: half a margin less is not one
    assert accountant.compose_epsilon([DEFAULT_RUN], 1e-5 / (1 + math.exp(half - 0.01))) > \
        half - 0.01
    # far above the add-or-remove figure, which does not bound it (a replace-one audit of this run
    # found ε ≥ 6.18)
    assert figure == pytest.approx(7.196, abs=1e-3) and 6.18 <= figure


def test_a_curve_whose_fixed_point_is_known_gives_it_and_a_non_private_one_infinity():
    # ε(δ) = -ln(δ) / 10: the fixed point x = (ln(1 + e^x) - ln δ) / 10
    figure = replace_one.group_of_two(lambda d: -math.log(d) / 10, 1e-5)
    x = figure / 2
    assert x == pytest.approx((math.log(1 + math.exp(x)) - math.log(1e-5)) / 10, abs=2e-4)
    assert replace_one.group_of_two(lambda d: math.inf, 1e-5) == math.inf
