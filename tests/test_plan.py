import subprocess
import sys
from types import SimpleNamespace

import pytest

from mnist_dp import plan

ORG1, ORG2 = plan.Share("Org1", "d1", ("s1",)), plan.Share("Org2", "d2", ("s2",))
TEST = plan.Share("Org1", "d1", ("t1",))


def build(share_with=()):
    builder = plan.PlanBuilder(share_with=share_with)
    stages = [(r, share) for r in (1, 2) for share in (ORG1, ORG2)]
    trained = builder.chain("torch", "train-fn", "predict-fn", "score-fn", stages, TEST)
    return builder, trained


def test_chain_trains_in_rounds_passing_the_model_and_evaluates_after_each_task():
    builder, trained = build()
    assert len(trained) == 4 and len(builder.tasks) == 4 * 5  # train + 2 × (predict + score)
    roles = [builder.roles[t] for t in trained]
    assert [(r["round_idx"], r["organization"]) for r in roles] == [(1, "Org1"), (1, "Org2"), (2, "Org1"), (2, "Org2")]
    by_id = {t["task_id"]: t for t in builder.tasks}
    for parent, child in zip(trained, trained[1:]):
        (model,) = [ref for ref in by_id[child]["inputs"] if ref.identifier == "model"]
        assert model.parent_task_key == parent
    assert not [ref for ref in by_id[trained[0]]["inputs"] if ref.identifier == "model"]
    assert by_id[trained[1]]["worker"] == "Org2"


def test_outputs_get_least_privilege():
    builder, trained = build()
    spec = builder.spec("p", plan.new_key())
    tasks = {t.task_id: t for t in spec.tasks}
    # Org1's model goes to Org2 (next trainer) and is evaluated at Org1 (test data): both, no one else.
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

    single = plan.PlanBuilder()
    single.chain("tf", "t", "p", "s", [(1, TEST)], TEST)
    for task in single.spec("p", plan.new_key()).tasks:
        for output in task.outputs.values():
            assert output.permissions.public or output.permissions.authorized_ids == ["Org1"]

    shared, trained = build(share_with=("Auditor",))
    tasks = {t.task_id: t for t in shared.spec("p", plan.new_key()).tasks}
    assert "Auditor" in tasks[trained[0]].outputs["model"].permissions.authorized_ids


def test_describe_role():
    builder, trained = build()
    assert plan.describe_role(builder.roles[trained[1]]) == "torch train, round 1 at Org2"
    scores = [r for r in builder.roles.values() if r["step"] == "score" and r["split"] == "test"]
    assert plan.describe_role(scores[0]) == "torch score, round 1 at Org1 on test"


def test_output_tail_keeps_what_child_processes_print():
    child = ("import sys; print('hello', flush=True); "
             "sys.stderr.write('progress 10%\\rprogress 100%\\nerror: bad batch\\n')")
    with plan.OutputTail() as tail:
        subprocess.run([sys.executable, "-c", child])
    # a progress bar's redraws (carriage returns) keep their last state, as on a terminal
    assert [line for line in tail.lines() if line] == ["hello", "progress 100%", "error: bad batch"]


class FakeNode:
    """What run_plan asks of a remote client: the plan fails at its first train task."""

    backend_mode = "remote"

    def __init__(self, builder):
        self.failed = next(t for t, r in builder.roles.items() if r["step"] == "train")
        self.polls = 0
        self.submitted = None

    def add_compute_plan(self, spec):
        self.submitted = spec

    def get_compute_plan(self, key):
        from substra.sdk.models import ComputePlanStatus

        self.polls += 1
        done = self.polls >= 3
        return SimpleNamespace(done_count=1 if done else 0, executing_count=0 if done else 1, failed_count=int(done),
                               status=ComputePlanStatus.failed if done else ComputePlanStatus.doing,
                               failed_task_key=self.failed if done else None)

    def get_logs(self, task_key):
        return "\n".join(f"line {i}" for i in range(40)) + "\nerror: batch_size = 1000 is larger than the data\n"

    def get_task(self, task_key):
        from substra.sdk.models import ComputeTaskStatus

        return SimpleNamespace(status=ComputeTaskStatus.failed, function=SimpleNamespace(name="torch train"))


def test_a_remote_plan_is_polled_and_its_failure_names_the_task_and_ends_with_its_log(monkeypatch):
    monkeypatch.setenv(plan.POLLING_VARIABLE, "0.001")
    builder, _ = build()
    node = FakeNode(builder)
    key = plan.new_key()
    with pytest.raises(plan.PlanFailed) as caught:
        plan.run_plan(node, builder, "p", key)
    message = str(caught.value)
    assert node.submitted.key == key and node.polls == 3
    assert message.startswith(f"compute plan 'p' failed in task 'torch train, round 1 at Org1' ({node.failed}), "
                              "function 'torch train': plan status PLAN_STATUS_FAILED")
    tail = message.split("last lines of its log:\n")[1].splitlines()
    assert len(tail) == plan.LOG_TAIL_LINES and tail[-1] == "  | error: batch_size = 1000 is larger than the data"


def test_terminal_lines_read_a_tty_log_as_a_terminal_shows_it():
    # Substra's docker backend runs containers with a TTY: every line ends in CRLF.
    log = "epoch 1/2\r\nstep 3%\rstep 100%\r\nerror: bad batch\r\n"
    assert [line for line in plan.terminal_lines(log) if line] == ["epoch 1/2", "step 100%", "error: bad batch"]


def failing_plan(backend: str, asset, script: str, docker_lines: str, tiny_data) -> tuple:
    """Run a one-task plan whose train function is `script` (ENTRYPOINT-run from a Dockerfile made of
    `docker_lines`) -> (the PlanFailed message, the organisation that trained)."""
    from mnist_dp import connection, registry

    asset.mkdir()
    (asset / "description.md").write_text("A train function that fails on purpose.\n")
    (asset / "algo.py").write_text(script)
    (asset / "Dockerfile.train").write_text(f"FROM python:3.11.7-slim-bookworm\n{docker_lines}\n"
                                            'ENTRYPOINT ["python3", "algo.py", "--function-name", "train"]\n')
    client = connection.connect(backend, None, asset.parent)
    keys = registry.KeysFile()
    (share,), _, _ = registry.register_organizations([client], keys, tiny_data)
    builder = plan.PlanBuilder()
    builder.train(asset.name, registry.register_function(client, keys, asset, "train", f"{asset.name} train",
                                                         asset.parent), share, 1)
    with pytest.raises(plan.PlanFailed) as caught:
        plan.run_plan(client, builder, "p", plan.new_key())
    return str(caught.value), share.organization


def exited_containers() -> set:
    import docker

    return {c.id for c in docker.from_env().containers.list(all=True, filters={"status": "exited"})}


@pytest.mark.parametrize("backend", ["subprocess", "docker"])
def test_a_task_failing_with_a_traceback_is_named_and_ends_with_its_own_log(backend, request, tmp_path, tiny_data):
    """A function that raises: the plan's error names the task and shows the end of its own output,
    traceback included; in docker mode that output is the container's log, and the container is removed."""
    if backend == "docker":
        request.getfixturevalue("docker_daemon")
        exited_before = exited_containers()
    message, organization = failing_plan(  # the image has nothing to install: it builds in a second
        backend, tmp_path / "boom", "print('loading the data', flush=True)\nraise RuntimeError('boom inside the task')\n",
        "COPY . .", tiny_data)
    status = "its container exited with status 1" if backend == "docker" else "its process exited with status 1"
    assert message.startswith(f"compute plan 'p' failed in task 'boom train, round 1 at {organization}' (")
    assert f"function 'boom train': {status}\n" in message
    tail = message.split("last lines of its log:\n")[1].splitlines()
    assert "  | Traceback (most recent call last):" in tail
    assert tail[-1] == "  | RuntimeError: boom inside the task"
    assert "  | loading the data" in tail
    if backend == "docker":  # the failed task's container was read, then removed
        assert exited_containers() <= exited_before


def test_a_function_whose_image_does_not_build_is_named_with_the_end_of_the_build(docker_daemon, tmp_path, tiny_data):
    exited_before = exited_containers()
    message, organization = failing_plan("docker", tmp_path / "unbuildable", "",
                                         'RUN echo "installing the impossible" && false', tiny_data)
    assert f"task 'unbuildable train, round 1 at {organization}'" in message
    assert "function 'unbuildable train': its Docker image did not build\n" in message
    assert "installing the impossible" in message.split("last lines of its log:\n")[1]
    assert exited_containers() <= exited_before  # the failed build step's container was removed
