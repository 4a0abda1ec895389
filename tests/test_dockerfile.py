"""The bundle's own Dockerfile builds, and the tests run green inside it.

The whole suite (`docker run --rm mnist-dp`) takes as long inside as outside (see docs/docker.md), so
here the image runs the part that goes end to end: one local Substra plan training, predicting and
scoring every framework (tests/scripts/test_run_local.py's first tests), the accountant and the README's commands.
"""
import docker
from conftest import REPO

IMAGE = "mnist-dp:tests"
INSIDE = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/privacy/test_accountant.py",
          "tests/test_readme.py", "tests/scripts/test_run_local.py", "-k", "not organisations and not failing"]


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
