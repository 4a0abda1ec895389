from types import SimpleNamespace

import pytest
from test_compute_plan import build

from mnist_dp.orchestration import compute_plan, execution


class FakeNode:
    """What run_plan asks of a remote client: the plan fails at its first train task."""

    backend_mode = "remote"

    def __init__(self, builder):
        self.failed = next(t for t, r in builder.roles.items() if r.step == "train")
        self.polls = 0
        self.submitted = None

    def add_compute_plan(self, spec):
        self.submitted = spec

    def get_compute_plan(self, key):
        from substra.sdk.models import ComputePlanStatus

        self.polls += 1
        done = self.polls >= 3
        return SimpleNamespace(done_count=1 if done else 0, executing_count=0 if done else 1,
                               failed_count=int(done),
                               status=ComputePlanStatus.failed if done else ComputePlanStatus.doing,
                               failed_task_key=self.failed if done else None)

    def get_logs(self, task_key):
        return "\n".join(
            f"line {i}" for i in range(40)) + "\nerror: batch_size = 1000 is larger than the data\n"

    def get_task(self, task_key):
        from substra.sdk.models import ComputeTaskStatus

        return SimpleNamespace(status=ComputeTaskStatus.failed,
                               function=SimpleNamespace(name="torch train"))


def test_a_remote_plan_is_polled_and_its_failure_names_the_task_and_ends_with_its_log(monkeypatch):
    monkeypatch.setenv(execution.POLLING_VARIABLE, "0.001")
    builder, _ = build()
    node = FakeNode(builder)
    key = compute_plan.new_key()
    with pytest.raises(execution.PlanFailed) as caught:
        execution.run_plan(node, builder, "p", key)
    message = str(caught.value)
    assert node.submitted.key == key and node.polls == 3
    assert message.startswith("compute plan 'p' failed in task 'torch train, round 1 at Org1' "
                              f"({node.failed}), function 'torch train': plan status "
                              "PLAN_STATUS_FAILED")
    tail = message.split("last lines of its log:\n")[1].splitlines()
    assert len(tail) == execution.LOG_TAIL_LINES and tail[
            -1] == "  | error: batch_size = 1000 is larger than the data"


def failing_plan(backend: str, asset, script: str, docker_lines: str, tiny_data) -> tuple:
    """Run a one-task plan whose train function is `script` (ENTRYPOINT-run from a Dockerfile made
    of `docker_lines`) -> (the PlanFailed message, the organisation that trained)."""
    from mnist_dp.orchestration import connection, registry

    asset.mkdir()
    (asset / "description.md").write_text("A train function that fails on purpose.\n")
    (asset / "algo.py").write_text(script)
    (asset / "Dockerfile").write_text(f"FROM python:3.11.7-slim-bookworm\n{docker_lines}\n"
                                      'ENTRYPOINT ["python3", "algo.py", "--function-name", '
                                      '"train"]\n')
    client = connection.connect(backend, None, asset.parent)
    keys = registry.KeysFile()
    (share,), _, _ = registry.register_organizations([client], keys, tiny_data)
    builder = compute_plan.PlanBuilder()
    builder.train(asset.name,
                  registry.register_function(client, keys, asset, "train", f"{asset.name} train",
                                                         asset.parent), share, 1)
    with pytest.raises(execution.PlanFailed) as caught:
        execution.run_plan(client, builder, "p", compute_plan.new_key())
    return str(caught.value), share.organization


def exited_containers() -> set:
    import docker

    return {c.id for c in docker.from_env().containers.list(all=True, filters={"status": "exited"})}


@pytest.mark.parametrize("backend", ["subprocess", "docker"])
def test_a_task_failing_with_a_traceback_is_named_and_ends_with_its_own_log(
        backend, request, tmp_path, tiny_data):
    """A function that raises: the plan's error names the task and shows the end of its own output,
    traceback included; in docker mode that output is the container's log, and the container is
    removed."""
    if backend == "docker":
        request.getfixturevalue("docker_daemon")
        exited_before = exited_containers()
    message, organization = failing_plan(  # the image has nothing to install: it builds in a second
        backend, tmp_path / "boom",
        "print('loading the data', flush=True)\nraise RuntimeError('boom inside the task')\n",
        "COPY . .", tiny_data)
    status = ("its container exited with status 1" if backend == "docker"
              else "its process exited with status 1")
    assert message.startswith("compute plan 'p' failed in task 'boom train, round 1 at "
                              f"{organization}' (")
    assert f"function 'boom train': {status}\n" in message
    tail = message.split("last lines of its log:\n")[1].splitlines()
    assert "  | Traceback (most recent call last):" in tail
    assert tail[-1] == "  | RuntimeError: boom inside the task"
    assert "  | loading the data" in tail
    if backend == "docker":  # the failed task's container was read, then removed
        assert exited_containers() <= exited_before


def test_a_function_whose_image_does_not_build_is_named_with_the_end_of_the_build(
        docker_daemon, tmp_path, tiny_data):
    exited_before = exited_containers()
    message, organization = failing_plan("docker", tmp_path / "unbuildable", "",
                                         'RUN echo "installing the impossible" && false', tiny_data)
    assert f"task 'unbuildable train, round 1 at {organization}'" in message
    assert "function 'unbuildable train': its Docker image did not build\n" in message
    assert "installing the impossible" in message.split("last lines of its log:\n")[1]
    assert exited_containers() <= exited_before  # the failed build step's container was removed
