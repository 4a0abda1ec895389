"""The function contract: each function's input and output identifiers, kinds and multiplicity,
written once, and the permissions assets are registered with (docs/design.md, "Function
contract")."""
from __future__ import annotations

from substra.sdk.schemas import AssetKind, FunctionInputSpec, FunctionOutputSpec, Permissions

_OPENER = FunctionInputSpec(identifier="opener", kind=AssetKind.data_manager, optional=False,
                            multiple=False)
_SAMPLES = FunctionInputSpec(identifier="datasamples", kind=AssetKind.data_sample, optional=False,
                             multiple=True)
# The data's own ledger (privacy/data_ledger.py) from the organisation's earlier tasks (its genesis,
# its previous train or tune task, and the last outputs of other parties' plans its reconciliation
# found, hence multiple), and passed on to its next: every run on the organisation's data that the
# task knows, sealed (privacy/seal.py), read by that organisation only (OWNER_ONLY). Optional, as a
# task on writable data holds its ledger beside it; on read-only data the task refuses to run
# without it.
_LEDGER_IN = FunctionInputSpec(identifier="ledger", kind=AssetKind.model, optional=True,
                               multiple=True)
_LEDGER_OUT = FunctionOutputSpec(identifier="ledger", kind=AssetKind.model, multiple=False)
# outputs no other organisation may read, whatever the plan shares
OWNER_ONLY = frozenset({"ledger"})

# function -> (inputs, outputs)
CONTRACT = {
    "train": (
        [_OPENER, _SAMPLES,
         FunctionInputSpec(identifier="model", kind=AssetKind.model, optional=True, multiple=False),
         _LEDGER_IN], [FunctionOutputSpec(identifier="model", kind=AssetKind.model, multiple=False),
         FunctionOutputSpec(identifier="epsilon", kind=AssetKind.performance, multiple=False),
         _LEDGER_OUT],
    ),
    # A private hyperparameter search: the best of its candidates, trained on the data,
    # with ε of the whole search.
    "tune": (
        [_OPENER, _SAMPLES, _LEDGER_IN],
        [FunctionOutputSpec(identifier="model", kind=AssetKind.model, multiple=False),
         FunctionOutputSpec(identifier="epsilon", kind=AssetKind.performance, multiple=False),
         _LEDGER_OUT],
    ),
    # The genesis of an organisation's ledger chain: what its data samples record, sealed (each algo
    # asset's, added by the plan before the organisation's first train or tune task on read-only
    # data: data_ledger.genesis).
    "genesis": ([_OPENER, _SAMPLES], [_LEDGER_OUT]),
    "predict": (
        [_OPENER, _SAMPLES,
         FunctionInputSpec(identifier="model", kind=AssetKind.model, optional=False,
                           multiple=False)],
        [FunctionOutputSpec(identifier="predictions", kind=AssetKind.model, multiple=False)],
    ),
    # Federated averaging: the models trained in one round (one input identifier, several models) ->
    # the next global model. No data: it runs where the plan says, on models only.
    "aggregate": (
        [FunctionInputSpec(identifier="models", kind=AssetKind.model, optional=False,
                           multiple=True)],
        [FunctionOutputSpec(identifier="model", kind=AssetKind.model, multiple=False)],
    ), "score": (
        [_OPENER, _SAMPLES,
         FunctionInputSpec(identifier="predictions", kind=AssetKind.model, optional=False,
                           multiple=False)],
        [FunctionOutputSpec(identifier="performance", kind=AssetKind.performance, multiple=False)],
    ),
}


def public() -> Permissions:
    return Permissions(public=True, authorized_ids=[])


def owner_only(owner: str) -> Permissions:
    return Permissions(public=False, authorized_ids=[owner])
