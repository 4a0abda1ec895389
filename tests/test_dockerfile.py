"""The bundle's own Dockerfile builds, and the tests run green inside it.

The whole suite (`docker run --rm mnist-dp`) takes as long inside as outside (see docs/docker.md),
so here the image runs a part that reaches every library it installs: every framework's network
and DP steps (tests/assets/test_same_mechanism.py), one local Substra plan (a torch train task
that runs, diverges as its settings make it, and is named with the log Substra kept, the reports
written) and the README's checks. The plans of every framework run outside, and in the functions'
own images (tests/scripts/test_run_local.py).
"""
import docker
from conftest import REPO

IMAGE = "mnist-dp:tests"
# One process (-n 0): beside CI's own workers, xdist's inside would only compete for the cores.
INSIDE = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
          "tests/test_readme.py",
          "tests/assets/test_same_mechanism.py",
          "tests/scripts/test_run_local.py::test_a_failing_task_is_named_and_exits_non_zero"]


def test_the_bundle_image_builds_and_runs_the_tests_inside(docker_daemon):
    client = docker.from_env()
    client.images.build(path=str(REPO), tag=IMAGE, rm=True)
    container = client.containers.run(IMAGE, INSIDE, detach=True)
    try:
        status = container.wait()["StatusCode"]
        log = container.logs().decode(errors="replace")
    finally:
        container.remove()
    assert status == 0, log[-3000:]
    assert " passed" in log.splitlines()[-1] and "failed" not in log.splitlines()[-1]
