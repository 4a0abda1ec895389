"""Connecting to Substra the Substra way: a backend and a client name, never a credential in code.

`--backend subprocess|docker` runs everything on this machine (Substra's local mode; with a URL
configured for the client name it is Substra's hybrid mode). `--backend remote` talks to a node: its
URL and credentials come only from SUBSTRA_<CLIENT>_URL and SUBSTRA_<CLIENT>_TOKEN (or _USERNAME and
_PASSWORD), or from the clients YAML file named by SUBSTRA_CLIENTS_CONFIGURATION_FILE_PATH.
Error messages name the setting to fix and never repeat a secret.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path
from urllib.parse import urlparse

import substra
from substra.sdk.client import _get_env_var, get_client_configuration

from mnist_dp.utils.errors import UserError

# substra's REST client logs every refused request's response body (which may echo a token) at
# ERROR, and nothing configures its logger, so Python printed it unmasked beside our one error line.
# The refusal reaches the user through the exception, masked (see run_cli).
logging.getLogger("substra").addHandler(logging.NullHandler())
logging.getLogger("substra").propagate = False

BACKENDS = ("subprocess", "docker", "remote")
LOCAL_BACKENDS = ("subprocess", "docker")
# where a task sees its data samples read-only, and so needs its organisation's ledger input
READ_ONLY_DATA = ("docker", "remote")
CONFIG_FILE_VARIABLE = "SUBSTRA_CLIENTS_CONFIGURATION_FILE_PATH"
_SECRETS = ("token", "password")


def add_arguments(parser, client_name_help: str = "") -> None:
    """--backend and --client-name, the same on every script."""
    parser.add_argument("--backend", choices=BACKENDS, default="subprocess",
                        help="subprocess: run locally with this Python (default); docker: run "
                             "locally in each function's Docker image (needs a Docker daemon); "
                             "remote: register and run on a Substra node (needs --client-name)")
    parser.add_argument("--client-name", default=None,
                        help="Substra client name; its settings come from SUBSTRA_<NAME>_URL and "
                             "SUBSTRA_<NAME>_TOKEN (or _USERNAME and _PASSWORD), or from the "
                             f"clients YAML file named by {CONFIG_FILE_VARIABLE}. "
                             + client_name_help)


def _configuration(client_name: str) -> dict:
    """{setting: value} for a client name, as substra resolves it (environment first, then the YAML
    file)."""
    config_file = os.environ.get(CONFIG_FILE_VARIABLE)
    if config_file:
        path = Path(config_file)
        if not path.is_file():
            raise UserError(f"{CONFIG_FILE_VARIABLE}={config_file}: no such file; fix the path or "
                            "unset it")
    try:
        settings = get_client_configuration(config_file=Path(config_file) if config_file else None,
                                            client_name=client_name, code_values={})
    except Exception as exc:  # YAML syntax, a value of the wrong type...
        raise UserError(f"{config_file or 'environment'}: cannot read the settings of client "
                        f"{client_name!r} ({type(exc).__name__}); check the file's YAML") from None
    return {name: setting.value for name, setting in settings.items()}


# Characters a token or password may be made of: a secret is masked where it stands alone between
# other characters, not inside every word that happens to contain it (a token "x" in "exited").
_SECRET_CHARACTERS = r"[A-Za-z0-9_-]"


def redact(text: str, secrets) -> str:
    for secret in sorted({str(s) for s in secrets if s}, key=len, reverse=True):
        text = re.sub(f"(?<!{_SECRET_CHARACTERS}){re.escape(secret)}(?!{_SECRET_CHARACTERS})",
                      "***", text)
    return text


def _where(client_name: str, setting: str) -> str:
    return (f"{_get_env_var(setting, client_name)} (or {setting!r} under {client_name!r} in the "
            f"{CONFIG_FILE_VARIABLE} file)")


def check_settings(backend: str, client_name: str | None = None) -> dict:
    """The settings of `client_name` for `backend`, refused in one line when they cannot work:
    remote without a name, a URL or credentials; a local backend given a name without a URL, which
    would have no effect. Called before anything is written (connect calls it too)."""
    if backend not in BACKENDS:
        raise UserError(f"--backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    settings = _configuration(client_name) if client_name else {}
    if backend == "remote":
        if not client_name:
            raise UserError("--backend remote needs --client-name NAME; the node's URL and "
                            "credentials come from SUBSTRA_<NAME>_URL and SUBSTRA_<NAME>_TOKEN (or "
                            "_USERNAME and _PASSWORD)")
        if not settings.get("url"):
            raise UserError(f"client {client_name!r}: no URL; set {_where(client_name, 'url')}")
        url = urlparse(str(settings["url"]))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise UserError(f"client {client_name!r}: URL "
                            f"{redact(str(settings['url']), known_secrets())!r} is not an http(s) "
                            f"URL; set {_where(client_name, 'url')} to e.g. "
                            "https://substra.example.org")
        if not settings.get("token") and not (settings.get("username")
                                              and settings.get("password")):
            raise UserError(f"client {client_name!r}: no credentials; set "
                            f"{_where(client_name, 'token')}, or "
                            f"{_get_env_var('username', client_name)} and "
                            f"{_get_env_var('password', client_name)}")
    elif client_name and not settings.get("url"):
        raise UserError(f"--client-name {client_name} with --backend {backend}: no URL is set for "
                        "it, so the name has no effect (a local backend is its own organisation); "
                        f"drop --client-name, or set {_where(client_name, 'url')} to use that node "
                        "in Substra's hybrid mode")
    return settings


def connect(backend: str, client_name: str | None = None,
            work_dir: Path | None = None) -> substra.Client:
    """A Substra client for `backend`.

    Args:
      backend: the backend type: "remote", or a local one ("subprocess", "docker").
      client_name: the client's name in the settings (its URL and credentials), or None.
      work_dir: where local backends keep their files (`work_dir`/local-worker); None: the working
        directory.

    Returns:
      The client (a node it talks to has answered). Raises UserError when the settings, the local
      work folder or the node fail (the node's message with any secret masked).
    """
    settings = check_settings(backend, client_name)
    if backend == "docker":
        _check_docker_daemon()
    where = (f"client {client_name!r} at {settings.get('url')}" if settings.get("url")
             else "local Substra client")
    if backend in LOCAL_BACKENDS:
        local_worker = Path(work_dir or Path.cwd()) / "local-worker"
        # made here, where a failure can be said in one line (substra's own attempt is a traceback)
        try:
            local_worker.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"{local_worker}: cannot create Substra's local work folder "
                            f"({exc.strerror}); run from (or point the keys file / --output to) a "
                            "folder you can write") from None
    try:
        with contextlib.chdir(work_dir or Path.cwd()):  # the local backend puts ./local-worker here
            client = substra.Client(client_name=client_name, backend_type=backend)
        if settings.get("url"):
            # fail here, clearly, rather than half-way through registering
            client.organization_info()
    except substra.exceptions.SDKException as exc:
        raise UserError(f"{where}: {type(exc).__name__}: "
                        f"{redact(str(exc), known_secrets())}") from None
    return client


def known_secrets() -> list:
    """Every token and password the environment (or the clients file) holds, to keep out of
    messages."""
    secrets = [value for name, value in os.environ.items()
               if name.startswith("SUBSTRA_") and name.endswith(("_TOKEN", "_PASSWORD"))]
    try:
        import yaml

        clients = yaml.safe_load(Path(os.environ[CONFIG_FILE_VARIABLE]).read_text()) or {}
        secrets += [str(c.get(key)) for c in clients.values() if isinstance(c, dict)
                    for key in _SECRETS if c.get(key)]
    except Exception:  # no file, or not one we can read: nothing more to hide
        pass
    return secrets


def explain_refusal(exc: BaseException) -> str | None:
    """For errors.run_cli in the scripts that talk to Substra: a node's refusal (HTTP error,
    timeout...) is a one-line error naming the exception, with any secret masked, not a
    traceback."""
    if isinstance(exc, substra.exceptions.SDKException):
        return f"Substra refused: {type(exc).__name__}: {redact(str(exc), known_secrets())}"
    return None


def _check_docker_daemon() -> None:
    import docker

    try:
        docker.from_env().ping()
    except docker.errors.DockerException as exc:
        raise UserError(f"--backend docker: no Docker daemon answers ({exc}); start Docker or use "
                        "--backend subprocess") from None
