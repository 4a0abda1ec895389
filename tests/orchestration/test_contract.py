"""mnist_dp/orchestration/contract.py: the contract is the one docs/design.md gives, every output a
plan feeds to another task has the kind that task's input expects, and the permissions."""
import re

import pytest
from conftest import REPO
from substra.sdk.schemas import AssetKind, Permissions

from mnist_dp.orchestration.contract import CONTRACT, OWNER_ONLY, owner_only, public

# How compute_plan.py wires tasks: (function, output) -> (function, input) it feeds.
FEEDS = [
    (("train", "model"), ("train", "model")),  # a cyclic chain continues from the previous model
    (("train", "model"), ("aggregate", "models")),
    (("aggregate", "model"), ("train", "model")),  # the next FedAvg round starts from the average
    (("train", "model"), ("predict", "model")), (("aggregate", "model"), ("predict", "model")),
    (("tune", "model"), ("predict", "model")),
    (("predict", "predictions"), ("score", "predictions")),
    (("train", "ledger"), ("train", "ledger")),  # an organisation's data ledger, task to task
    (("train", "ledger"), ("tune", "ledger")), (("tune", "ledger"), ("train", "ledger")),
    (("tune", "ledger"), ("tune", "ledger")),
    (("genesis", "ledger"), ("train", "ledger")), (("genesis", "ledger"), ("tune", "ledger")),
]


def documented() -> dict:
    """{function: ({input: (kind, multiple, optional)}, {output: kind})} from the table of
    docs/design.md's "Function contract"."""
    text = (REPO / "docs" / "design.md").read_text()
    section = text[text.index("## 2. Function contract"):]
    table = {}
    for name, inputs, outputs in re.findall(r"^\| `(\w+)` \| (.+?) \| (.+?) \|$", section, re.M):
        table[name] = (
            {ident: (AssetKind[kind], "multiple" in words, "optional" in words)
             for ident, kind, words in re.findall(r"`(\w+)`: `(\w+)`((?:, [*\w]+)*)", inputs)},
            {ident: AssetKind[kind] for ident, kind in re.findall(r"`(\w+)`: `(\w+)`", outputs)})
    return table


def specs(function):
    inputs, outputs = CONTRACT[function]
    return {spec.identifier: spec for spec in inputs}, {spec.identifier: spec for spec in outputs}


def test_the_contract_is_the_one_docs_design_md_gives():
    """Each function's inputs (kind, multiplicity, optional) and outputs (kind, single)."""
    table = documented()
    assert set(table) == set(CONTRACT) == {"train", "tune", "predict", "aggregate", "score",
                                           "genesis"}
    for function, (inputs, outputs) in table.items():
        given_inputs, given_outputs = specs(function)
        assert {ident: (spec.kind, spec.multiple, spec.optional)
                for ident, spec in given_inputs.items()} == inputs, function
        assert {ident: spec.kind for ident, spec in given_outputs.items()} == outputs, function
        assert not any(spec.multiple for spec in given_outputs.values()), function
        assert len(CONTRACT[function][0]) == len(given_inputs), f"{function}: an input twice"


@pytest.mark.parametrize("source, target", FEEDS, ids=lambda pair: ".".join(pair))
def test_every_output_a_plan_feeds_to_a_task_has_the_kind_its_input_expects(source, target):
    """Substra links an output to an input of the same kind only."""
    output = specs(source[0])[1][source[1]]
    given = specs(target[0])[0][target[1]]
    assert output.kind == given.kind == AssetKind.model


def test_owner_only_outputs_chain_from_one_task_to_the_next_optional_input():
    """Each function taking it outputs it, takes it optional and multiple (the chain's tips); never
    a performance; the genesis makes the first."""
    assert OWNER_ONLY == {"ledger"}
    takers = [f for f in CONTRACT if set(specs(f)[0]) & OWNER_ONLY]
    assert sorted(takers) == ["train", "tune"]
    assert set(specs("genesis")[1]) == OWNER_ONLY
    for function in takers:
        inputs, outputs = specs(function)
        for ident in OWNER_ONLY:
            assert inputs[ident].optional and inputs[ident].multiple
            assert outputs[ident].kind == inputs[ident].kind != AssetKind.performance


def test_permissions_are_public_or_the_owners_alone():
    """public(): anyone, naming no one; owner_only(org): that organisation only."""
    assert public() == Permissions(public=True, authorized_ids=[])
    mine = owner_only("MyOrg1MSP")
    assert mine.public is False and mine.authorized_ids == ["MyOrg1MSP"]
