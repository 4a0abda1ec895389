"""The bundle's own Dockerfile builds, and the tests run green inside it.

The whole suite (`docker run --rm mnist-dp`) takes as long inside as outside (see docs/docker.md),
so here the image runs the part that goes end to end: one local Substra plan training, predicting
and scoring every framework (tests/scripts/test_run_local.py's tests of that plan; its refusals and
federated plans run outside only), the accountant and the README's commands.
"""
import docker
from conftest import REPO

IMAGE = "mnist-dp:tests"
# The tests of test_run_local.py's `local_run` plan.
END_TO_END = [f"tests/scripts/test_run_local.py::test_{name}" for name in (
    "results_json_has_a_record_per_framework_and_baseline",
    "epsilon_reached_substra_and_matches_the_model_ledger",
    "replayable_noise_and_training_data_scores_are_flagged",
    "table_and_reports_and_no_files_leak_into_the_working_directory")]
INSIDE = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
          "tests/privacy/test_accountant.py", "tests/test_readme.py", *END_TO_END]


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
