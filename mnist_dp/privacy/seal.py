"""A ledger output sealed by its organisation: only its own tasks can make one, and a forged,
foreign, edited or cut one is refused in one line.

A train or tune task's `ledger` output (data_ledger.Held.pass_on) is the journal of every run the
task knows on its organisation's data, then one last line, the seal:

    {"seal": {"extends": [digest, ...], "macs": {key id: mac, ...}}}

`extends` names the ledger outputs the task took as its `ledger` inputs, each by the sha256 of the
whole file (`digest`): the outputs of one organisation form a chain that starts at a genesis (a
ledger output extending none, made from what the data samples record) and that the organisation's
reconciliation follows (orchestration/reconcile.py). `macs` holds, under each of the organisation's
identity keys (by key id), an HMAC-SHA256 of the journal and of `extends` with the key's seal key
(the opener's `seal_keys`, a secret derived from the identity key, which never leaves the
organisation's tasks). Another organisation, the aggregator, or the builder of a compute plan holds
none of them: it can pass a sealed output on whole, or not at all.
"""
from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

from mnist_dp.utils import json_input
from mnist_dp.utils.errors import UserError

SEAL_START = b'{"seal": '  # how json.dumps begins the seal line (`seal`)


def digest(content: bytes) -> str:
    """The name of a ledger output in another's `extends`: the sha256 of the whole file."""
    return hashlib.sha256(content).hexdigest()


def _mac(seal_key: bytes, journal: bytes, extends: list) -> str:
    message = hashlib.sha256(journal).digest() + json.dumps(extends).encode()
    return hmac.new(seal_key, message, hashlib.sha256).hexdigest()


def seal(journal: bytes, extends: list, seal_keys: dict) -> bytes:
    """The ledger output of journal lines `journal` that extends the outputs whose digests are
    `extends`, sealed under every key of `seal_keys` ({key id: seal key})."""
    if not seal_keys:
        raise UserError("cannot seal this task's ledger output: its data samples hold no identity "
                        "key; give each its organisation's key (scripts/generate_data.py "
                        "--add-key)")
    extends = sorted(extends)
    macs = {key_id: _mac(k, journal, extends) for key_id, k in sorted(seal_keys.items())}
    line = json.dumps({"seal": {"extends": extends, "macs": macs}})
    return journal + line.encode() + b"\n"


def open_sealed(content: bytes, seal_keys: dict, path: Path) -> tuple:
    """(journal lines, the digests it extends) of the ledger output `content` read from `path`,
    once its seal is checked under the organisation's `seal_keys`. Refused in one line (UserError)
    when it carries no seal, is sealed by another organisation only, or its seal does not match."""
    body, _, last = content.rstrip(b"\n").rpartition(b"\n")
    body = body + b"\n" if body else b""
    if not last.startswith(SEAL_START):
        raise _refused(path, "it carries no seal: it is not a ledger output of this "
                             "organisation's tasks, or it was cut")
    try:
        record = json_input.loads(last, f"{path}: its seal")
    except (ValueError, UserError):
        raise _refused(path, "its seal line is cut or damaged") from None
    sealed = record.get("seal") if isinstance(record, dict) else None
    if not isinstance(sealed, dict) or not isinstance(sealed.get("macs"), dict) or not isinstance(
            sealed.get("extends"), list) or not all(isinstance(e, str)
                                                    for e in sealed["extends"]):
        raise _refused(path, "its seal is not one this bundle writes")
    mine = sorted(set(sealed["macs"]) & set(seal_keys))
    if not mine:
        raise _refused(path, "it is sealed by another organisation, not by one of this "
                             "organisation's tasks")
    expected = _mac(seal_keys[mine[0]], body, sealed["extends"])
    if not hmac.compare_digest(str(sealed["macs"][mine[0]]), expected):
        raise _refused(path, "its seal does not match its content: it was edited, forged or cut")
    return body, sealed["extends"]


def _refused(path: Path, why: str) -> UserError:
    return UserError(f"{path}: the ledger input is refused: {why}; nothing was trained: give the "
                     "task its organisation's last ledger output (python "
                     "scripts/privacy_report.py --reconcile finds it)")
