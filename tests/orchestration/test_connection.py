"""Connection settings come only from the environment / clients file, and errors never echo a
secret."""
import subprocess
import sys

import pytest
from conftest import REPO

from mnist_dp.orchestration import connection
from mnist_dp.utils.errors import UserError, run_cli

SECRET = "s3cr3t-Pa55"
UNREACHABLE = "http://127.0.0.1:9"  # nothing listens on the discard port


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("SUBSTRA_"):
            monkeypatch.delenv(name)


def test_remote_needs_a_client_name_a_url_and_credentials(monkeypatch):
    with pytest.raises(UserError, match="needs --client-name"):
        connection.connect("remote")
    with pytest.raises(UserError, match="SUBSTRA_NODE_1_URL"):
        connection.connect("remote", "node-1")
    monkeypatch.setenv("SUBSTRA_NODE_1_URL", UNREACHABLE)
    with pytest.raises(UserError, match="SUBSTRA_NODE_1_TOKEN.*SUBSTRA_NODE_1_PASSWORD"):
        connection.connect("remote", "node-1")


def test_an_unreachable_node_fails_in_one_line_without_the_password(monkeypatch):
    monkeypatch.setenv("SUBSTRA_NODE_1_URL", UNREACHABLE)
    monkeypatch.setenv("SUBSTRA_NODE_1_USERNAME", "alice")
    monkeypatch.setenv("SUBSTRA_NODE_1_PASSWORD", SECRET)
    with pytest.raises(UserError) as caught:
        connection.connect("remote", "node-1")
    assert UNREACHABLE in str(caught.value) and SECRET not in str(caught.value)


def test_clients_file_settings_and_errors(monkeypatch, tmp_path):
    config = tmp_path / "clients.yaml"
    monkeypatch.setenv(connection.CONFIG_FILE_VARIABLE, str(config))
    with pytest.raises(UserError, match="no such file"):
        connection.connect("remote", "node-1")
    config.write_text(f"node-1:\n  url: {UNREACHABLE}\n  token: {SECRET}\n")
    with pytest.raises(UserError) as caught:
        connection.connect("remote", "node-1")  # read from the file: it gets as far as the network
    assert "ConnectionError" in str(caught.value) and SECRET not in str(caught.value)
    config.write_text(f"node-1: [url: {SECRET}\n")
    with pytest.raises(UserError, match="YAML") as caught:
        connection.connect("remote", "node-1")
    assert SECRET not in str(caught.value)


def test_redact():
    assert connection.redact(f"token {SECRET} refused", [SECRET, None]) == "token *** refused"


@pytest.mark.parametrize("script",
                         ["add_dataset_objective.py", "add_train_algo_cnn_dp.py", "run_local.py"])
def test_every_script_takes_the_backend_and_fails_cleanly_on_bad_settings(tmp_path, script):
    path = REPO / "scripts" / script
    assert "--client-name" in subprocess.run([sys.executable, path, "--help"], capture_output=True,
                                             text=True).stdout
    env = {"PATH": "/usr/bin:/bin", "SUBSTRA_NODE_1_URL": UNREACHABLE,
           "SUBSTRA_NODE_1_USERNAME": "alice", "SUBSTRA_NODE_1_PASSWORD": SECRET,
           "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    (tmp_path / "assets_keys.json").write_text("{}")
    proc = subprocess.run([sys.executable, path, "--backend", "remote", "--client-name", "node-1"],
                          capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert SECRET not in proc.stdout + proc.stderr


def test_a_node_refusal_is_one_line_with_secrets_masked(monkeypatch, capsys):
    import substra

    monkeypatch.setenv("SUBSTRA_NODE_1_TOKEN", SECRET)

    def refused():
        raise substra.exceptions.AuthorizationError(f"403 for token {SECRET}", 403)

    with pytest.raises(SystemExit) as exit_:
        run_cli(refused, explain=connection.explain_refusal)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: Substra refused: AuthorizationError")
    assert SECRET not in err and "***" in err


def test_a_short_token_is_masked_only_where_it_stands_as_the_token():
    message = "Container exited; header Authorization: Token x; token=x"
    assert connection.redact(
        message, ["x"]) == "Container exited; header Authorization: Token ***; token=***"


def test_a_url_that_is_not_http_is_one_line_naming_the_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("SUBSTRA_NODE_1_URL", "not-a-url")
    monkeypatch.setenv("SUBSTRA_NODE_1_TOKEN", SECRET)
    with pytest.raises(UserError,
                       match="URL 'not-a-url' is not an http.s. URL; set SUBSTRA_NODE_1_URL"):
        connection.connect("remote", "node-1")
    env = {"PATH": "/usr/bin:/bin", "SUBSTRA_NODE_1_URL": "not-a-url",
           "SUBSTRA_NODE_1_TOKEN": SECRET, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    proc = subprocess.run([sys.executable, REPO / "scripts" / "add_dataset_objective.py",
                           "--backend", "remote", "--client-name",
                           "node-1"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 2 and proc.stderr.startswith("error: client 'node-1': URL")
    assert "Traceback" not in proc.stderr
