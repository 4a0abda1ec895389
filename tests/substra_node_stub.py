"""A Substra node on 127.0.0.1 for tests: the REST interface that substra's remote backend talks to.

A real node needs Kubernetes (its backend, orchestrator, database, object store and the workers
that build and run each function's image), so no test can start one. Faking the substra client
instead would test our code against our own idea of the SDK. This stub imitates the real interface
at its lowest layer, HTTP, so the real substra SDK (its rest client, request building, multipart
uploads, error mapping and pydantic models) runs unchanged: only the node is fake.

It answers what the remote backend of substra 1.0 asks for, in the shapes the node's serializers
give: token login / logout, /info/, data managers, data samples (uploaded as an archive, or a path
on the server), functions (archive + description), compute plans and their tasks (created by
`task/bulk_create/`), a plan's performances, task output assets, a failed task's logs and model
files. Every request is recorded; a path it does not know answers 404 with a JSON body and is kept
in `unexpected`, so a test can assert that nothing else was asked. Every route but login needs
`Authorization: Token <token>` (401 otherwise), as on a node.

It cannot run tasks. A submitted plan answers "doing" for `doing_polls` reads, then ends as the
test configured: every task done, or the first task for which `fail_when(task)` holds failed (its
log is `failure_log`), the ones before it done and the ones after it canceled. A done task's outputs
are `model_file(task, identifier)` (bytes) and `performance(task, identifier)` (a float), called
with the task as the node returns it, model files first. `refuse()` makes the next matching request
fail with any status and body.

    with SubstraNodeStub(token="t") as node:
        ...  # SUBSTRA_<NAME>_URL=node.url, SUBSTRA_<NAME>_TOKEN="t"
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import threading
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

ORGANIZATION = "MyOrg1MSP"
KEY = r"(?P<key>[0-9a-fA-F-]{32,36})"


class HttpError(Exception):
    def __init__(self, status: int, body):
        super().__init__(status)
        self.status, self.body = status, body


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def _is_archive(content: bytes) -> bool:
    """What a node accepts as a function or data sample archive: zip or tar (maybe compressed)."""
    if zipfile.is_zipfile(io.BytesIO(content)):
        return True
    try:
        with tarfile.open(fileobj=io.BytesIO(content)) as tar:
            return bool(tar.getnames())
    except tarfile.TarError:
        return False


def parse_multipart(body: bytes, content_type: str) -> dict:
    """multipart/form-data -> {field name: (file name or None, bytes)}. The SDK sends its spec as a
    `json` field and each file as a part named after the spec's attribute."""
    found = re.search(r'boundary="?([^";]+)"?', content_type)
    if not found:
        raise HttpError(400, {"detail": "multipart body without a boundary"})
    parts = {}
    for part in body.split(b"--" + found.group(1).encode())[1:-1]:
        head, _, content = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        disposition = next((line for line in head.decode("latin-1").split("\r\n")
                            if line.lower().startswith("content-disposition")), "")
        name = re.search(r'\bname="([^"]*)"', disposition)
        filename = re.search(r'\bfilename="([^"]*)"', disposition)
        if name:
            parts[name.group(1)] = (filename.group(1) if filename else None,
                                    content.removesuffix(b"\r\n"))
    return parts


@dataclass
class Asset:
    """One stored asset: the record the node returns, what the client sent, the files it
    uploaded."""

    record: dict
    sent: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)  # field name -> bytes
    state: dict = field(default_factory=dict)  # a plan's polls; a task's end, outputs and log


class SubstraNodeStub:
    """An in-memory Substra node behind a threaded HTTP server on 127.0.0.1 (a free port)."""

    def __init__(self, token: str, organization_id: str = ORGANIZATION, users: dict | None = None):
        self.organization_id = organization_id
        self.tokens = {token}
        self.users = dict(users or {})  # username -> password, for /api-token-auth/
        self.sessions = {}  # id -> token issued by a login
        # What a submitted plan does (see the module docstring).
        self.doing_polls = 0
        self.fail_when: Callable[[dict], bool] | None = None
        self.failure_log = ""
        self.model_file: Callable[[dict, str], bytes] = lambda task, identifier: b""
        self.performance: Callable[[dict, str], float] = lambda task, identifier: 0.0
        # The store.
        self.datasets, self.data_samples, self.functions = {}, {}, {}
        self.compute_plans, self.tasks, self.models = {}, {}, {}
        self.requests = []  # (method, path, query) of every request, in order
        self.unexpected = []  # (method, path) of requests no route knows
        self._refusals = []
        self._lock = threading.RLock()
        self._server = None

    # -- life cycle
    # ---------------------------------------------------------------------------------

    def __enter__(self):
        node = self

        class Handler(_Handler):
            stub = node

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()
        return False

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # -- test helpers
    # -------------------------------------------------------------------------------

    def refuse(self, method: str, path: str, status: int, body, times: int = 1) -> None:
        """The next `times` requests `method path` (`path`: a regular expression the whole path
        without the query matches) answer `status` with `body`."""
        self._refusals.append({"method": method, "path": path, "error": HttpError(status, body),
                               "left": times})

    def calls(self, method: str | None = None) -> list:
        """The (method, path) of every request received (of `method` only, if given), in order."""
        return [(m, p) for m, p, _ in self.requests if method is None or m == method]

    def plan_tasks(self, plan_key: str) -> list:
        """The Assets of a plan's tasks, in the order they were submitted."""
        return [task for task in self.tasks.values() if task.record["compute_plan_key"] == plan_key]

    # -- dispatch
    # -----------------------------------------------------------------------------------

    def _routes(self):
        return [
            ("POST", r"/api-token-auth/", self._login),
            ("DELETE", r"/active-api-tokens/", self._logout), ("GET", r"/info/", self._info),
            ("POST", r"/data_manager/", self._add_dataset),
            ("GET", rf"/data_manager/{KEY}/", self._get_dataset),
            ("GET", rf"/data_manager/{KEY}/(?P<file>opener|description)/", self._dataset_file),
            ("POST", r"/data_sample/", self._add_data_samples),
            ("GET", rf"/data_sample/{KEY}/", self._get_data_sample),
            ("POST", r"/function/", self._add_function),
            ("GET", rf"/function/{KEY}/", self._get_function),
            ("GET", rf"/function/{KEY}/(?P<file>file|description)/", self._function_file),
            ("POST", r"/compute_plan/", self._add_compute_plan),
            ("GET", rf"/compute_plan/{KEY}/", self._get_compute_plan),
            ("GET", rf"/compute_plan/{KEY}/perf/", self._performances),
            ("POST", r"/task/bulk_create/", self._add_tasks), ("GET", r"/task/", self._list_tasks),
            ("GET", rf"/task/{KEY}/", self._get_task),
            ("GET", rf"/task/{KEY}/output_assets/", self._output_assets),
            ("GET", rf"/task/{KEY}/logs/", self._logs), ("GET", rf"/model/{KEY}/", self._get_model),
            ("GET", rf"/model/{KEY}/file/", self._model_file),
        ]

    def handle(self, method: str, path: str, query: dict, headers, body: bytes):
        """-> (status, content type, bytes)."""
        with self._lock:
            self.requests.append((method, path, query))
            try:
                status, payload = self._dispatch(method, path, query, headers, body)
            except HttpError as exc:
                status, payload = exc.status, exc.body
        if isinstance(payload, str):  # a log
            return status, "text/plain; charset=utf-8", payload.encode()
        if isinstance(payload, bytes):  # a file
            return status, "application/octet-stream", payload
        return status, "application/json", json.dumps(payload).encode()

    def _dispatch(self, method, path, query, headers, body):
        found = next(((match, handler) for route_method, pattern, handler in self._routes()
                      if route_method == method and (match := re.fullmatch(pattern, path))), None)
        if found is None:
            self.unexpected.append((method, path))
            raise HttpError(404, {"detail": "Not found."})
        match, handler = found
        if handler != self._login:  # logging in is how a client without a token gets one
            self._authenticate(headers.get("Authorization"))
        for refusal in self._refusals:
            if (refusal["method"] == method and re.fullmatch(refusal["path"], path)
                and refusal["left"] > 0):
                refusal["left"] -= 1
                raise refusal["error"]
        return handler(query=query, body=body, content_type=headers.get("Content-Type", ""),
                       **match.groupdict())

    def _authenticate(self, header: str | None) -> None:
        # As the node's token authentication: a wrong token is refused even on /info/.
        if not header:
            raise HttpError(401, {"detail": "Authentication credentials were not provided."})
        scheme, _, token = header.partition(" ")
        if scheme != "Token" or token not in self.tokens:
            raise HttpError(401, {"detail": "Invalid token."})

    @staticmethod
    def _json(body: bytes, content_type: str) -> tuple:
        """(spec, files) of a request: a JSON body, or multipart with a `json` field and files."""
        if content_type.startswith("multipart/form-data"):
            parts = parse_multipart(body, content_type)
            if "json" not in parts:
                raise HttpError(400, {"detail": "missing field 'json'"})
            spec = json.loads(parts.pop("json")[1])
            return spec, {name: content for name, (_, content) in parts.items()}
        try:
            return json.loads(body or b"{}"), {}
        except ValueError:
            raise HttpError(400, {"detail": "JSON parse error"}) from None

    @staticmethod
    def _require(spec: dict, *names) -> None:
        missing = [name for name in names if name not in spec]
        if missing:
            raise HttpError(400, {name: ["This field is required."] for name in missing})

    def _get(self, store: dict, key: str) -> Asset:
        if key not in store:
            raise HttpError(404, {"detail": "Not found."})
        return store[key]

    def _permissions(self, permissions: dict, owner: str | None = None) -> dict:
        """A spec's {public, authorized_ids} as a node stores it: for processing and for download,
        the owner always among the authorized."""
        owner = owner or self.organization_id
        ids = sorted(set(permissions["authorized_ids"]) | {owner})
        return {"process": {"public": permissions["public"], "authorized_ids": ids},
                "download": {"public": permissions["public"], "authorized_ids": ids}}

    def _file(self, kind: str, key: str, name: str, content: bytes) -> dict:
        return {"checksum": _sha256(content), "storage_address": f"{self.url}/{kind}/{key}/{name}/"}

    # -- authentication and organisation ----------------------------------------------------------

    def _login(self, body, **_):
        form = parse_qs(body.decode())
        username, password = form.get("username", [""])[0], form.get("password", [""])[0]
        if username not in self.users or self.users[username] != password:
            raise HttpError(401, {"detail": "Invalid username/password"})
        token, session = uuid.uuid4().hex, str(uuid.uuid4())
        self.tokens.add(token)
        self.sessions[session] = token
        expires = (datetime.now(UTC) + timedelta(days=1)).isoformat()
        return 200, {"token": token, "expires_at": expires, "id": session, "created_at": _now()}

    def _logout(self, query, **_):
        session = query.get("id", [""])[0]
        if session not in self.sessions:
            raise HttpError(404, {"detail": "Token not found"})
        self.tokens.discard(self.sessions.pop(session))
        return 200, {"detail": "Token removed"}

    def _info(self, **_):
        return 200, {"host": self.url, "organization_id": self.organization_id,
                     "organization_name": self.organization_id, "channel": "mychannel",
                     "version": "stub", "orchestrator_version": "stub",
                     "config": {"model_export_enabled": True}, "auth": {}}

    # -- data managers and data samples
    # -------------------------------------------------------------

    def _add_dataset(self, body, content_type, **_):
        spec, files = self._json(body, content_type)
        self._require(spec, "name", "permissions", "logs_permission")
        self._require(files, "data_opener", "description")
        key = str(uuid.uuid4())
        record = {
            "key": key, "name": spec["name"], "owner": self.organization_id,
                  "creation_date": _now(), "permissions": self._permissions(spec["permissions"]),
            "metadata": spec.get("metadata")
                  or {}, "opener": self._file("data_manager", key, "opener", files["data_opener"]),
            "description": self._file("data_manager", key, "description", files["description"]),
            "logs_permission": self._permissions(spec["logs_permission"])["process"],
        }
        self.datasets[key] = Asset(record, spec, files)
        return 201, record

    def _get_dataset(self, key, **_):
        dataset = self._get(self.datasets, key)
        samples = [k for k, s in self.data_samples.items() if key in s.record["data_manager_keys"]]
        return 200, {**dataset.record, "data_sample_keys": samples}

    def _dataset_file(self, key, file, **_):
        return 200, self._get(self.datasets,
                              key).files["data_opener" if file == "opener" else "description"]

    def _add_data_samples(self, body, content_type, **_):
        # One route for both modes: uploaded archives (local=True), or paths
        # on the node (local=False).
        spec, files = self._json(body, content_type)
        managers = spec.get("data_manager_keys") or []
        if not managers or any(k not in self.datasets for k in managers):
            raise HttpError(400, {"detail": "One or more datamanager keys provided do not exist in "
                                       "local database. Please create them before. DataManager "
                                       f"keys: {managers}"})
        if files:
            sources = list(files.values())
            if not all(_is_archive(content) for content in sources):
                raise HttpError(400, {"detail": "Archive must be zip or tar"})
        else:
            paths = spec.get("paths") or ([spec["path"]] if spec.get("path") else [])
            if not paths:
                raise HttpError(400, {"detail": "no data sample file nor path"})
            sources = [str(p).encode() for p in paths]
        created = []
        for source in sources:
            key = str(uuid.uuid4())
            record = {"key": key, "owner": self.organization_id,
                      "data_manager_keys": list(managers), "creation_date": _now()}
            self.data_samples[key] = Asset(record, spec, {"archive": source} if files
                                           else {"path": source})
            created.append({**record, "checksum": _sha256(source)})
        return 201, created

    def _get_data_sample(self, key, **_):
        return 200, self._get(self.data_samples, key).record

    # -- functions
    # ----------------------------------------------------------------------------------

    def _add_function(self, body, content_type, **_):
        spec, files = self._json(body, content_type)
        self._require(spec, "name", "permissions", "inputs", "outputs")
        self._require(files, "file", "description")
        if not _is_archive(files["file"]):
            raise HttpError(400, {"detail": "Archive must be zip or tar"})
        key = str(uuid.uuid4())
        record = {
            "key": key, "name": spec["name"], "owner": self.organization_id,
                  "creation_date": _now(), "permissions": self._permissions(spec["permissions"]),
            "metadata": spec.get("metadata")
                  or {},
            "description": self._file("function", key, "description", files["description"]),
            "archive": self._file("function", key, "file", files["file"]), "inputs": spec["inputs"],
            "outputs": spec["outputs"], "status": "FUNCTION_STATUS_READY",
        }
        self.functions[key] = Asset(record, spec, files)
        return 201, record

    def _get_function(self, key, **_):
        return 200, self._get(self.functions, key).record

    def _function_file(self, key, file, **_):
        return 200, self._get(self.functions, key).files[file]

    # -- compute plans and tasks
    # --------------------------------------------------------------------

    def _add_compute_plan(self, body, content_type, **_):
        spec, _files = self._json(body, content_type)
        self._require(spec, "key", "name")
        key = spec["key"]
        if key in self.compute_plans:
            raise HttpError(409, {"key": key, "detail": "compute plan already exists"})
        record = {"key": key, "tag": spec.get("tag") or "", "name": spec["name"],
                  "owner": self.organization_id, "creator": "stub",
                  "metadata": spec.get("metadata") or {}, "creation_date": _now(),
                  "start_date": None, "end_date": None, "duration": None, "failed_task_key": None}
        self.compute_plans[key] = Asset(record, spec, state={"doing_polls": 0})
        return 201, self._plan_view(key)

    def _add_tasks(self, body, content_type, **_):
        spec, _files = self._json(body, content_type)
        batch = spec.get("tasks") or []
        plans = {task.get("compute_plan_key") for task in batch}
        if len(plans) != 1 or not plans <= set(self.compute_plans):
            raise HttpError(400, {"detail": "Invalid compute plan key" if len(plans) <= 1
                                  else "All tasks should have the same compute plan key"})
        known = dict(self.tasks)
        for task in batch:
            known[task["key"]] = Asset(self._task_record(task, known), task)
        for task in batch:
            self.tasks[task["key"]] = known[task["key"]]
        self._decide(plans.pop())
        return 200, [self._task_view(self.tasks[task["key"]]) for task in batch]

    def _task_record(self, task: dict, known: dict) -> dict:
        """A task as the orchestrator registers it, or 400 for what it would refuse: an unknown
        function, asset or parent; an input the function does not declare; a missing input; outputs
        other than the function's; data processed elsewhere than at their owner's."""
        self._require(task, "key", "function_key", "worker", "inputs", "outputs")
        if task["key"] in self.tasks:
            raise HttpError(409, [{"key": task["key"]}])
        function = self._get_or_400(self.functions, task["function_key"], "function").record
        declared, counts, ranks = function["inputs"], {}, [0]
        for ref in task["inputs"]:
            identifier = ref["identifier"]
            if identifier not in declared:
                raise HttpError(400, {"detail": f"task {task['key']}: function has no input "
                                                f"{identifier!r}"})
            counts[identifier] = counts.get(identifier, 0) + 1
            if ref.get("parent_task_key"):
                parent = self._get_or_400(known, ref["parent_task_key"], "parent task").record
                if ref.get("parent_task_output_identifier") not in parent["function"]["outputs"]:
                    raise HttpError(400, {"detail": f"task {task['key']}: parent has no output "
                                               f"{ref.get('parent_task_output_identifier')!r}"})
                ranks.append(parent["rank"] + 1)
            elif declared[identifier]["kind"] == "ASSET_DATA_MANAGER":
                owner = self._get_or_400(self.datasets, ref.get("asset_key"),
                                         "data manager").record["owner"]
                if owner != task["worker"]:
                    raise HttpError(400, {"detail": f"task {task['key']}: data of {owner} cannot "
                                                    f"be processed at {task['worker']}"})
            elif declared[identifier]["kind"] == "ASSET_DATA_SAMPLE":
                self._get_or_400(self.data_samples, ref.get("asset_key"), "data sample")
            else:
                raise HttpError(400, {"detail": f"task {task['key']}: input {identifier!r} needs a "
                                                "parent task"})
        for identifier, declaration in declared.items():
            if not declaration["optional"] and not counts.get(identifier):
                raise HttpError(400,
                                {"detail": f"task {task['key']}: missing input {identifier!r}"})
            if not declaration["multiple"] and counts.get(identifier, 0) > 1:
                raise HttpError(400, {"detail": f"task {task['key']}: input {identifier!r} is not "
                                                "multiple"})
        if set(task["outputs"]) != set(function["outputs"]):
            raise HttpError(400,
                            {"detail": f"task {task['key']}: outputs {sorted(task['outputs'])}, "
                                       f"function declares {sorted(function['outputs'])}"})
        return {
            "key": task["key"], "function": function, "owner": self.organization_id,
            "compute_plan_key": task["compute_plan_key"], "metadata": task.get("metadata") or {},
            "worker": task["worker"], "rank": max(ranks), "tag": task.get("tag") or "",
            "creation_date": _now(), "start_date": None, "end_date": None, "error_type": None,
            "inputs": [{"identifier": r["identifier"], "asset_key": r.get("asset_key"),
                        "parent_task_key": r.get("parent_task_key"),
                        "parent_task_output_identifier": r.get("parent_task_output_identifier")}
                       for r in task["inputs"]],
            "outputs": {name: {"permissions": self._permissions(output["permissions"], task[
                "worker"]), "transient": bool(output.get("transient", False))}
                        for name, output in task["outputs"].items()},
        }

    def _get_or_400(self, store: dict, key: str | None, what: str) -> Asset:
        if key not in store:
            raise HttpError(400, {"detail": f"{what} {key} not found"})
        return store[key]

    def _decide(self, plan_key: str) -> None:
        """Each task's end: done (with its outputs made) until the first that `fail_when` picks,
        which fails; the ones after it are canceled."""
        failed = any(t.state.get("status") == "STATUS_FAILED" for t in self.plan_tasks(plan_key))
        for task in self.plan_tasks(plan_key):
            if "status" in task.state:
                continue
            if failed:
                task.state["status"] = "STATUS_CANCELED"
            elif self.fail_when and self.fail_when(task.record):
                task.state.update(status="STATUS_FAILED", log=self.failure_log)
                self.compute_plans[plan_key].record["failed_task_key"] = task.record["key"]
                failed = True
            else:
                task.state.update(status="STATUS_DONE", outputs=self._make_outputs(task.record))

    def _make_outputs(self, task: dict) -> list:
        """The outputs of a done task, in identifier order. Model files are made first, so that
        `performance` may read what `model_file` made (a train task writes its model and its ε)."""
        outputs = {}
        declared = task["function"]["outputs"]
        for identifier in sorted(i for i, d in declared.items()
                                 if d["kind"] != "ASSET_PERFORMANCE"):
            key = str(uuid.uuid4())
            content = self.model_file(task, identifier)
            self.models[key] = Asset({
                "key": key, "compute_task_key": task["key"],
                                      "address": self._file("model", key, "file", content),
                "permissions": task["outputs"][identifier]["permissions"], "owner": task["worker"],
                "creation_date": _now()}, files={"file": content})
            outputs[identifier] = {"identifier": identifier, "kind": declared[identifier]["kind"],
                                   "asset": self.models[key].record}
        for identifier in sorted(i for i, d in declared.items()
                                 if d["kind"] == "ASSET_PERFORMANCE"):
            outputs[identifier] = {"identifier": identifier, "kind": "ASSET_PERFORMANCE", "asset": {
                "compute_task_key": task["key"], "compute_task_output_identifier": identifier,
                "performance_value": float(self.performance(
                    task, identifier)), "creation_date": _now()}}
        return [outputs[identifier] for identifier in sorted(outputs)]

    def _finished(self, plan_key: str) -> bool:
        return bool(
            self.plan_tasks(plan_key)) and self.compute_plans[plan_key].state[
                "doing_polls"] >= self.doing_polls

    def _task_status(self, task: Asset) -> str:
        if self._finished(task.record["compute_plan_key"]):
            return task.state["status"]
        return "STATUS_EXECUTING" if task.record["rank"] == 0 else "STATUS_WAITING_FOR_PARENT_TASKS"

    def _task_view(self, task: Asset) -> dict:
        status = self._task_status(task)
        error = {"STATUS_FAILED": "EXECUTION_ERROR"}.get(status)
        ended = status in ("STATUS_DONE", "STATUS_FAILED", "STATUS_CANCELED")
        return {**task.record, "status": status, "error_type": error,
                "start_date": task.record["creation_date"]
                if status != "STATUS_WAITING_FOR_PARENT_TASKS" else None,
                "end_date": _now() if ended else None}

    def _plan_view(self, key: str) -> dict:
        plan = self.compute_plans[key]
        tasks = [self._task_view(t) for t in self.plan_tasks(key)]
        count = {status: sum(t["status"] == status for t in tasks) for status in
                 ("STATUS_DONE", "STATUS_FAILED", "STATUS_CANCELED", "STATUS_EXECUTING",
                  "STATUS_WAITING_FOR_PARENT_TASKS")}
        if not tasks:
            status = "PLAN_STATUS_CREATED"
        elif not self._finished(key):
            status = "PLAN_STATUS_DOING"
        else:
            status = "PLAN_STATUS_FAILED" if count["STATUS_FAILED"] else "PLAN_STATUS_DONE"
        finished = status in ("PLAN_STATUS_DONE", "PLAN_STATUS_FAILED")
        return {**plan.record, "status": status, "task_count": len(tasks),
                "waiting_builder_slot_count": 0, "building_count": 0,
                "waiting_parent_tasks_count": count["STATUS_WAITING_FOR_PARENT_TASKS"],
                "waiting_executor_slot_count": 0, "executing_count": count["STATUS_EXECUTING"],
                "canceled_count": count["STATUS_CANCELED"], "failed_count": count["STATUS_FAILED"],
                "done_count": count["STATUS_DONE"],
                "failed_task_key": plan.record["failed_task_key"] if finished else None,
                "start_date": plan.record["creation_date"] if tasks else None,
                "end_date": _now() if finished else None}

    def _get_compute_plan(self, key, **_):
        self._get(self.compute_plans, key)
        view = self._plan_view(key)  # this read is one more poll while the plan is doing
        if view["status"] == "PLAN_STATUS_DOING":
            self.compute_plans[key].state["doing_polls"] += 1
        return 200, view

    def _performances(self, key, **_):
        self._get(self.compute_plans, key)
        rows = []
        for task in sorted(self.plan_tasks(key),
                           key=lambda t: (t.record["rank"], t.record["worker"])):
            if self._task_status(task) != "STATUS_DONE":
                continue
            for output in task.state["outputs"]:
                if output["kind"] == "ASSET_PERFORMANCE":
                    rows.append({"compute_task": {
                        "key": task.record["key"], "function_key": task.record["function"]["key"],
                        "rank": task.record["rank"], "round_idx": task.record["metadata"].get(
                                                      "round_idx"),
                        "worker": task.record["worker"]}, "identifier": output["identifier"],
                                 "perf": output["asset"]["performance_value"]})
        statistics = {"compute_tasks_distinct_ranks": sorted({t.record[
            "rank"] for t in self.plan_tasks(key)}),
                      "compute_tasks_distinct_rounds": sorted({t.record["metadata"].get("round_idx")
                                                               for t in self.plan_tasks(key)} - {
                                                                       None})}
        return 200, {"results": rows, "compute_plan_statistics": statistics}

    @staticmethod
    def _page(items: list) -> dict:
        return {"count": len(items), "next": None, "previous": None, "results": items}

    @staticmethod
    def _matches(query: dict, name: str, value) -> bool:
        """Django filter semantics: `?name=a,b` keeps items whose `name` is a or b."""
        return name not in query or str(value) in query[name][0].split(",")

    def _list_tasks(self, query, **_):
        views = [self._task_view(t) for t in self.tasks.values()]
        return 200, self._page([v for v in views
                                if all(self._matches(query, name, v[name]) for name in
                                                        ("key", "compute_plan_key", "worker",
                                                         "status", "rank"))])

    def _get_task(self, key, **_):
        return 200, self._task_view(self._get(self.tasks, key))

    def _output_assets(self, key, query, **_):
        task = self._get(self.tasks, key)
        outputs = task.state.get("outputs", []) if self._task_status(task) == "STATUS_DONE" else []
        return 200, self._page([o for o in outputs
                                if self._matches(query, "identifier", o["identifier"])
                                and self._matches(query, "kind", o["kind"])])

    def _logs(self, key, **_):
        task = self._get(self.tasks, key)
        if self._task_status(task) != "STATUS_FAILED":
            raise HttpError(410, {"detail": "Asset not available anymore"})
        return 200, task.state["log"]

    def _get_model(self, key, **_):
        return 200, self._get(self.models, key).record

    def _model_file(self, key, **_):
        return 200, self._get(self.models, key).files["file"]


class _Handler(BaseHTTPRequestHandler):
    stub: SubstraNodeStub  # set on a subclass per server

    def _answer(self):
        url = urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, content_type, content = self.stub.handle(
            self.command, url.path, parse_qs(url.query), self.headers, body)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args):  # the test output stays the scripts' own
        pass
