"""mnist_dp/federated/strategy.py: DpFedAvg averages the weight changes and merges the ledgers; an
organisation keeps the merge with its own run last; averages without ledgers are refused."""
import dataclasses

import numpy as np
import pytest
from conftest import ledger_event, tiny_hyperparameters
from substrafl.strategies.schemas import FedAvgAveragedState, FedAvgSharedState

from mnist_dp.federated.algo import DpFedAvgAlgo
from mnist_dp.federated.strategy import (
    DpFedAvg,
    LedgerAveragedState,
    LedgerSharedState,
    received_ledger,
)
from mnist_dp.privacy.events import new_run_id
from mnist_dp.privacy.examples import Examples
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.utils.errors import UserError

# Two organisations' samples, each under its own key id: 100 examples each.
EXAMPLES = {"fp-a": Examples.of("aaaaaaaaaaaaaaaa", range(100)),
            "fp-b": Examples.of("bbbbbbbbbbbbbbbb", range(100))}


def run(sample):
    """One training run of 100 examples on `sample`, with its own run id."""
    event = ledger_event(data=(sample,), n=100, batch_size=10)
    return dataclasses.replace(event, run_id=new_run_id())


HISTORY = run("fp-a")  # the global model's run, in both organisations' ledgers
RUN_A, RUN_B = run("fp-a"), run("fp-b")  # each organisation's new run from it


def strategy():
    return DpFedAvg(algo=DpFedAvgAlgo("torch", tiny_hyperparameters("torch", delta=1e-5), 1))


def state(n, update, events):
    return LedgerSharedState(n_samples=n, parameters_update=update,
                             ledger=Ledger(events, EXAMPLES).to_json())


def averaged(events):
    return LedgerAveragedState(avg_parameters_update=[np.zeros(2)],
                               ledger=Ledger(events, EXAMPLES).to_json())


def test_the_average_is_weighted_by_examples_and_carries_the_merged_ledger():
    """1 and 3 examples: (1·4 + 3·0) / 4 = 1, (8 + 12) / 4 = 5, (1 + 15) / 4 = 4; runs merged."""
    first = state(1, [np.array([4.0, 8.0]), np.array([[1.0]])], [HISTORY, RUN_A])
    second = state(3, [np.array([0.0, 4.0]), np.array([[5.0]])], [HISTORY, RUN_B])
    average = strategy().avg_shared_states(shared_states=[first, second], _skip=True)
    assert isinstance(average, LedgerAveragedState)
    assert [u.tolist() for u in average.avg_parameters_update] == [[1.0, 5.0], [[4.0]]]
    ledger = Ledger.from_json(average.ledger)
    assert ledger.events == [HISTORY, RUN_A, RUN_B]
    # released: each sample's key, no example (whatever the states sent)
    assert ledger.examples == {i: Examples(e.key) for i, e in EXAMPLES.items()}


def test_a_shared_state_without_a_ledger_is_refused_naming_its_position():
    """A plain FedAvg shared state among the inputs: the aggregator refuses to average it."""
    plain = FedAvgSharedState(n_samples=2, parameters_update=[np.zeros(2)])
    with pytest.raises(UserError,
                       match="^shared state 2 carries no privacy ledger: DpFedAvg averages"):
        strategy().avg_shared_states(shared_states=[state(1, [np.zeros(2)], [RUN_A]), plain],
                                     _skip=True)


@pytest.mark.parametrize("own, expected", [
    ([HISTORY, RUN_A], [HISTORY, RUN_B, RUN_A]), ([HISTORY, RUN_B], [HISTORY, RUN_A, RUN_B]),
    ([], [HISTORY, RUN_A, RUN_B]),
])
def test_an_organisation_keeps_every_run_of_the_merge_with_its_own_last_run_last(own, expected):
    """Organisation A ends on its own run, B on its own; with no run of its own, the merge's."""
    kept = received_ledger(averaged([HISTORY, RUN_A, RUN_B]), Ledger(own, EXAMPLES))
    assert kept.events == expected and kept.examples == EXAMPLES


def test_an_average_without_a_ledger_is_refused_by_the_organisation():
    """Plain FedAvg's averaged state: the runs in its weights would be in no ledger."""
    plain = FedAvgAveragedState(avg_parameters_update=[np.zeros(2)])
    with pytest.raises(UserError,
                       match="use mnist_dp.federated.strategy.DpFedAvg instead of FedAvg"):
        received_ledger(plain, Ledger([RUN_A], EXAMPLES))

