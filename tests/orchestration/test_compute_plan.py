import pytest

from mnist_dp.orchestration import compute_plan
from mnist_dp.utils.errors import UserError

ORG1, ORG2 = compute_plan.Share("Org1", "d1", ("s1",)), compute_plan.Share("Org2", "d2", ("s2",))
TEST = compute_plan.Share("Org1", "d1", ("t1",))
KEYS = {"train": "train-fn", "predict": "predict-fn", "score": "score-fn",
        "aggregate": "aggregate-fn"}


def build(share_with=(), score_train=False):
    builder = compute_plan.PlanBuilder(share_with=share_with)
    stages = [(r, share) for r in (1, 2) for share in (ORG1, ORG2)]
    trained = builder.chain("torch", KEYS, stages, TEST, score_train)
    return builder, trained


def test_by_default_nothing_is_scored_on_the_training_data():
    builder, trained = build()
    assert len(builder.tasks) == 4 * 3  # train + predict + score on the test data
    assert {r.split for r in builder.roles.values() if r.split} == {"test"}
    assert all(ref.asset_key != ORG2.samples[0] for t in builder.tasks if t["worker"] == "Org2" and
               t["function_key"] != "train-fn" for ref in t["inputs"])


def test_chain_trains_in_rounds_passing_the_model_and_evaluates_after_each_task():
    builder, trained = build(score_train=True)
    assert len(trained) == 4 and len(builder.tasks) == 4 * 5  # train + 2 × (predict + score)
    roles = [builder.roles[t] for t in trained]
    assert [(r.round_idx, r.organization)
            for r in roles] == [(1, "Org1"), (1, "Org2"), (2, "Org1"), (2, "Org2")]
    by_id = {t["task_id"]: t for t in builder.tasks}
    for parent, child in zip(trained, trained[1:]):
        (model,) = [ref for ref in by_id[child]["inputs"] if ref.identifier == "model"]
        assert model.parent_task_key == parent
    assert not [ref for ref in by_id[trained[0]]["inputs"] if ref.identifier == "model"]
    assert by_id[trained[1]]["worker"] == "Org2"


def test_outputs_get_least_privilege():
    builder, trained = build()
    spec = builder.spec("p", compute_plan.new_key())
    tasks = {t.task_id: t for t in spec.tasks}
    # Org1's model goes to Org2 (next trainer) and is evaluated at Org1 (test
    # data): both, no one else.
    assert tasks[trained[0]].outputs["model"].permissions.authorized_ids == ["Org1", "Org2"]
    # the last model is read only by predict tasks at Org2 (its train share) and Org1 (test)
    assert tasks[trained[-1]].outputs["model"].permissions.authorized_ids == ["Org1", "Org2"]
    assert tasks[trained[0]].outputs["epsilon"].permissions.public
    for task in spec.tasks:
        if "predictions" in task.outputs:  # scored where they are made
            assert task.outputs["predictions"].permissions.authorized_ids == [task.worker]
            assert not task.outputs["predictions"].permissions.public
        if "performance" in task.outputs:
            assert task.outputs["performance"].permissions.public
        assert task.metadata["round_idx"] in ("1", "2")

    single = compute_plan.PlanBuilder()
    single.chain("tf", KEYS, [(1, TEST)], TEST)
    for task in single.spec("p", compute_plan.new_key()).tasks:
        for output in task.outputs.values():
            assert output.permissions.public or output.permissions.authorized_ids == ["Org1"]

    shared, trained = build(share_with=("Auditor",))
    tasks = {t.task_id: t for t in shared.spec("p", compute_plan.new_key()).tasks}
    assert "Auditor" in tasks[trained[0]].outputs["model"].permissions.authorized_ids


def test_describe_role():
    builder, trained = build()
    assert compute_plan.describe_role(builder.roles[trained[1]]) == "torch train, round 1 at Org2"
    scores = [r for r in builder.roles.values() if r.step == "score" and r.split == "test"]
    assert compute_plan.describe_role(scores[0]) == "torch score, round 1 at Org1 on test"


def test_fedavg_trains_every_organisation_from_the_global_model_and_evaluates_each_average():
    builder = compute_plan.PlanBuilder()
    aggregated = builder.fedavg("torch", KEYS, [ORG1, ORG2], 2, TEST)
    by_id = {t["task_id"]: t for t in builder.tasks}
    # per round: 2 train + aggregate + predict + score
    assert len(aggregated) == 2 and len(builder.tasks) == 2 * 5
    for round_idx, average in enumerate(aggregated, 1):
        task, role = by_id[average], builder.roles[average]
        assert (role.step, role.round_idx, task["worker"], task["function_key"]) == (
            "aggregate", round_idx, "Org1", "aggregate-fn")  # at the test data's organisation
        assert [ref.identifier for ref in task["inputs"]] == ["models", "models"]
        trained = [ref.parent_task_key for ref in task["inputs"]]
        assert [by_id[t]["worker"] for t in trained] == ["Org1", "Org2"]
        starts = {ref.parent_task_key for t in trained for ref in by_id[t]["inputs"]
                  if ref.identifier == "model"}
        # the round's global model
        assert starts == (set() if round_idx == 1 else {aggregated[round_idx - 2]})
        evaluations = [r for r in builder.roles.values() if r.train_task == average]
        assert [(r.step, r.split, r.organization) for r in evaluations] == [
            ("predict", "test", "Org1"), ("score", "test", "Org1")]

    tasks = {t.task_id: t for t in builder.spec("p", compute_plan.new_key()).tasks}
    org2_model = by_id[aggregated[0]]["inputs"][1].parent_task_key
    # Org2's round model is read by the aggregating organisation only; the average by both trainers.
    assert tasks[org2_model].outputs["model"].permissions.authorized_ids == ["Org1", "Org2"]
    assert tasks[aggregated[0]].outputs["model"].permissions.authorized_ids == ["Org1", "Org2"]
    # evaluated at Org1 only
    assert tasks[aggregated[-1]].outputs["model"].permissions.authorized_ids == ["Org1"]
    assert (
        compute_plan.describe_role(builder.roles[aggregated[
            1]]) == "torch aggregate, round 2 at Org1")


@pytest.mark.parametrize("strategy, score_train",
                         [("cyclic", False), ("cyclic", True), ("fedavg", False)])
def test_the_task_count_bound_is_the_plans_own(strategy, score_train):
    builder = compute_plan.PlanBuilder()
    for run in ("torch", "torch-baseline"):
        if strategy == "fedavg":
            builder.fedavg(run, KEYS, [ORG1, ORG2], 3, TEST)
        else:
            builder.chain(run, KEYS, [(r, s) for r in (1, 2, 3) for s in (ORG1, ORG2)], TEST,
                          score_train)
    assert compute_plan.count_tasks(strategy, 3, 2, 2, score_train) == len(builder.tasks)


def test_a_plan_of_more_than_max_tasks_is_refused_naming_what_sized_it():
    # MAX_TASKS
    compute_plan.check_size(compute_plan.count_tasks("fedavg", compute_plan.MAX_TASKS // 5, 2), "x")
    with pytest.raises(UserError, match=r"^--rounds 1000000000 make 5,000,000,000 tasks, more than "
                                        r"the 10,000"):
        compute_plan.check_size(compute_plan.count_tasks("fedavg", 10**9, 2), "--rounds 1000000000")


def two_rounds_at_two_organisations(builder, strategy: str, keys: dict) -> None:
    """Two rounds through ORG1 and ORG2 (one search each), tested on TEST."""
    if strategy == "cyclic":
        builder.chain("torch", keys, [(r, s) for r in (1, 2) for s in (ORG1, ORG2)], TEST)
    elif strategy == "fedavg":
        builder.fedavg("torch", keys, [ORG1, ORG2], 2, TEST)
    else:
        builder.search("torch", keys, [ORG1, ORG2], TEST)


@pytest.mark.parametrize("strategy", ["cyclic", "fedavg", "search"])
def test_each_organisations_spending_tasks_pass_its_data_ledger_to_its_next_and_to_no_one_else(
        strategy):
    builder = compute_plan.PlanBuilder(share_with=("Auditor",),
                                       ledgers={"Org2": ["tip-1", "tip-2"]})
    keys = {**KEYS, "tune": "tune-fn"}
    two_rounds_at_two_organisations(builder, strategy, keys)
    by_id = {t["task_id"]: t for t in builder.tasks}
    specs = {t.task_id: t for t in builder.spec("p", compute_plan.new_key()).tasks}
    for org, earlier in (("Org1", []), ("Org2", ["tip-1", "tip-2"])):
        chain = builder.spending(org)
        assert len(chain) == (1 if strategy == "search"
                              else 2) and builder.ledgers[org] == [chain[-1]]
        for previous, task in zip([earlier, *([t] for t in chain)], chain):
            ledgers = [ref for ref in by_id[task]["inputs"] if ref.identifier == "ledger"]
            assert [(r.parent_task_key, r.parent_task_output_identifier) for r in ledgers] == [
                (p, "ledger") for p in previous]
            output = specs[task].outputs["ledger"].permissions
            # not the Auditor, not the aggregator
            assert not output.public and output.authorized_ids == [org]
            assert "Auditor" in specs[task].outputs["model"].permissions.authorized_ids
    spending = {t["function_key"] for t in builder.tasks if "ledger" in t["outputs"]}
    assert spending == ({"tune-fn"} if strategy == "search" else {"train-fn"})


@pytest.mark.parametrize("strategy", ["cyclic", "fedavg", "search"])
def test_with_a_genesis_each_organisation_with_no_ledger_starts_its_chain_with_one(strategy):
    """Where data samples are read-only, an organisation's first train or tune task takes the
    genesis task's ledger; an organisation whose chain the builder knows takes its tips instead."""
    builder = compute_plan.PlanBuilder(ledgers={"Org2": ["tip"]})
    keys = {**KEYS, "tune": "tune-fn", "genesis": "genesis-fn"}
    two_rounds_at_two_organisations(builder, strategy, keys)
    geneses = [t for t in builder.tasks if t["function_key"] == "genesis-fn"]
    assert [(t["worker"], t["outputs"]) for t in geneses] == [("Org1", ["ledger"])]
    assert [r.asset_key for r in geneses[0]["inputs"]] == ["d1", *ORG1.samples]
    first = builder.spending("Org1")[1]
    assert [r.parent_task_key for r in next(t for t in builder.tasks if t["task_id"] == first)[
        "inputs"] if r.identifier == "ledger"] == [geneses[0]["task_id"]]
    assert builder.roles[geneses[0]["task_id"]].step == "genesis"
