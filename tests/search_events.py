"""Searched ledger events as a tune task records them, and a search's ε recomputed with
dp_accounting alone, for the tests that build or report a search."""
import math

import dp_accounting
from dp_accounting import pld, rdp

from mnist_dp.privacy import accountant
from mnist_dp.privacy.events import Candidate, DpEvent, Search

DELTA = 1e-5


def dp_sgd(q, steps, sigma):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)


RELEASED = (Candidate(1 / 8, 240, 1.3),)


def search_then_run(search, q, steps, sigma):
    """ε at δ of a search (a dp_accounting event) then a DP-SGD run, recomputed with dp_accounting
    alone as the accountant reports it: the lower of RDP of both, and of the run's PLD composed with
    the search as the (ε, δ) pair its RDP gives, at each share of δ the accountant tries."""
    whole = rdp.RdpAccountant().compose(dp_accounting.ComposedDpEvent([search, dp_sgd(q, steps,
                                                                                        sigma)]))
    searched = rdp.RdpAccountant().compose(search)
    run = pld.privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=sigma, sampling_prob=q, value_discretization_interval=1e-4
    ).self_compose(steps)
    pairs = [run.compose(pld.privacy_loss_distribution.from_privacy_parameters(
        pld.common.DifferentialPrivacyParameters(searched.get_epsilon(DELTA * share),
                                                 DELTA * share))).get_epsilon_for_delta(DELTA)
        for share in accountant.SEARCH_DELTA_SHARES]
    return min(whole.get_epsilon(DELTA), *pairs), whole.get_epsilon(DELTA)


def search_event(candidates=RELEASED, mean=4.0, shape=0.0, score=3.0, permille=100, n=4000,
                 validation_n=400):
    """The ledger event of a search's released run: the first candidate's profile, as the tune task
    records it."""
    first = candidates[0]
    batch = math.ceil((n - validation_n) * first.sample_rate)
    return DpEvent("torch", ("s",), n, first.sample_rate, first.noise_multiplier, first.steps,
                   "per-example", 0.1, batch_size=batch, planned_steps=first.steps,
                   code={"function": "tune", "archive_digest": None},
                   search=Search(mean, shape, tuple(candidates), score, permille, validation_n))
