"""substrafl's FedAvg with the organisations' privacy ledgers passed along: every model file holds
every run.

substrafl's FedAvg sends the aggregator each organisation's weight change and weight (here its
data's public size, policy.py), and sends back the average. Averaged weights carry every
organisation's training, so their ledger must too: here each shared state also carries the
organisation's ledger (its runs and those it received), and the aggregator sends back their merge
(ledger.merge: each run once), which every organisation keeps with the global model. Each
organisation's ε is then computed as on the bundle's own federated paths: its records compose the
runs on its own data, and a local state's headline figure covers every organisation's examples in
its weights.

What the ledger adds to what leaves an organisation: its runs' public size, q, σ and steps, and its
data samples' keyed identities and key ids, in the released form (Ledger.released): no example's
id, nothing that counts the data.
"""
from __future__ import annotations

from substrafl.remote import remote
from substrafl.strategies import FedAvg
from substrafl.strategies.schemas import FedAvgAveragedState, FedAvgSharedState

from mnist_dp.privacy.ledger import Ledger, merge
from mnist_dp.utils.errors import UserError


class LedgerSharedState(FedAvgSharedState):
    """What an organisation sends the aggregator: FedAvg's weight change and examples, and its
    ledger."""

    ledger: dict  # Ledger.to_json(): the organisation's runs and every run it has received


class LedgerAveragedState(FedAvgAveragedState):
    """What the aggregator sends back: FedAvg's average, and the merge of every organisation's
    ledger."""

    ledger: dict


class DpFedAvg(FedAvg):
    """substrafl's FedAvg whose aggregation also merges the ledgers the bundle's DP algos send
    (algo.DpFedAvgAlgo, torch_algo.TorchDpFedAvgAlgo): `DpFedAvg(algo=..., metric_functions=...)`,
    as FedAvg."""

    @remote
    def avg_shared_states(self, shared_states: list) -> LedgerAveragedState:
        without = [k for k, state in enumerate(shared_states, 1)
                   if not isinstance(state, LedgerSharedState)]
        if without:
            raise UserError(f"shared state {without[0]} carries no privacy ledger: DpFedAvg "
                            "averages the bundle's DP algos (DpFedAvgAlgo, TorchDpFedAvgAlgo) only")
        average = FedAvg.avg_shared_states(self, shared_states=shared_states, _skip=True)
        merged = merge([Ledger.from_json(state.ledger) for state in shared_states])
        return LedgerAveragedState(avg_parameters_update=average.avg_parameters_update,
                                   ledger=merged.released().to_json())


def received_ledger(shared_state, own: Ledger) -> Ledger:
    """The ledger an organisation keeps after the aggregator's `shared_state`: every run of the
    merge, once, with its own last run last (its model file's settings describe that run; runs of
    one round are concurrent, so this is still an order they could have run in). Refuses an average
    without ledgers (plain FedAvg), whose weights would carry other organisations' runs that no
    ledger here records."""
    if not isinstance(shared_state, LedgerAveragedState):
        raise UserError("the averaged state carries no privacy ledger: the other organisations' "
                        "runs in the averaged weights would be in no ledger; use "
                        "mnist_dp.federated.strategy.DpFedAvg instead of FedAvg")
    merged = merge([Ledger.from_json(shared_state.ledger), own])
    if not own.events:
        return merged
    last = own.events[-1]
    return merged.copy([e for e in merged.events if e.run_id != last.run_id] + [last])
