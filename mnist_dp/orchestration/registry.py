"""Registering assets on a Substra node, once: the keys file remembers what each key was made from.

The keys file (JSON) holds asset keys and, for each key, a fingerprint of what was registered (file
contents, name, permissions). An asset whose fingerprint is already in the file, and whose key the
node still knows, is reused instead of registered again. The file is rewritten atomically after
every new key, so a failure half-way keeps every key obtained so far. It holds no credential.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import substra
from substra.sdk.schemas import DataSampleSpec, DatasetSpec, FunctionSpec

from mnist_dp import search_space
from mnist_dp.assets import ALGO_ASSETS, DATASET_ASSET, OBJECTIVE_ASSET
from mnist_dp.data import samples
from mnist_dp.data.dataset import check_organization_keys, sample_folders, split_advice
from mnist_dp.orchestration import archive
from mnist_dp.orchestration.compute_plan import Share
from mnist_dp.orchestration.contract import CONTRACT, owner_only, public
from mnist_dp.utils import atomic, json_input
from mnist_dp.utils.errors import UserError
from mnist_dp.utils.words import counted


def fingerprint(*parts) -> str:
    """sha256 over bytes, paths (their content) and JSON-able values."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            part = part.read_bytes()
        elif not isinstance(part, bytes):
            part = json.dumps(part, sort_keys=True, default=str).encode()
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def _keys(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(k, str) and k for k in value)


def _texts(value) -> bool:
    """Whether `value` is a {text: text} object."""
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) and v
                                           for k, v in value.items())


def _plans(value) -> bool:
    return isinstance(value, dict) and all(
        isinstance(plan, dict) and set(plan) == {"key", "tasks"} and isinstance(plan["key"], str)
        and _texts(plan["tasks"]) for plan in value.values())


# The shape of each field a script reads back from a keys file (it may have been edited by hand).
_SHAPES = {
    "dataset_key": (lambda v: isinstance(v, str) and bool(v), "an asset key (a string)"),
    "objective_key": (lambda v: isinstance(v, str) and bool(v), "an asset key (a string)"),
    "organization_id": (lambda v: isinstance(v, str) and bool(v), "an organisation id (a string)"),
    "data": (lambda v: isinstance(v, str) and bool(v), "the path of the data folder"),
    "train_data_sample_keys": (lambda v: isinstance(v, list) and bool(v) and all(map(_keys, v)),
                               "a list of folds, each a list of data sample keys"),
    "test_data_sample_keys": (_keys, "a list of data sample keys"),
    "fingerprints": (_texts, "an object of {asset key: fingerprint}"),
    "algos": (lambda v: isinstance(v, dict) and all(map(_texts, v.values())),
              "an object of {framework: {function: key}}"),
    "compute_plans": (_plans, 'an object of {framework: {"key": plan key, "tasks": {...}}}'),
}


class KeysFile:
    """Asset keys obtained from a node. `path=None` keeps them in memory only (a one-off local
    run)."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path else None
        self.content = {}
        if self.path and self.path.exists():
            # moved away: everything is registered again
            self.content = json_input.read(self.path, "keys file")
            if not isinstance(self.content, dict):
                raise UserError(f"{self.path}: not a keys file (expected a JSON object); move it "
                                "away")
            for field in self.content:  # every field a script reads, before any work
                self._check(field)

    def get(self, field: str, default=None):
        return self.content.get(field, default)

    def require(self, field: str):
        if field not in self.content:
            raise UserError(f"{self.path}: no {field!r}; run scripts/add_dataset_objective.py "
                            "first")
        return self._check(field)

    def _check(self, field: str):
        """The value of `field`, refused (UserError) unless of its shape (_SHAPES)."""
        value = self.content[field]
        test, what = _SHAPES.get(field, (lambda v: True, ""))
        if not test(value):
            raise UserError(f"{self.path}: {field} = {json.dumps(value)[:60]} must be {what}; fix "
                            "the file, or move it away and run scripts/add_dataset_objective.py "
                            "again")
        return value

    def update(self, **fields) -> None:
        self.content.update(fields)
        self.save()

    def save(self) -> None:
        if self.path:  # the fingerprints last: the keys a reader wants come first
            content = {k: v for k, v in self.content.items() if k != "fingerprints"}
            atomic.write_json(self.path,
                              {**content, "fingerprints": self.content.get("fingerprints", {})})

    def add_algo(self, framework: str, functions: dict) -> None:
        """algos: {framework: {"train": key, "predict": key[, "aggregate": key]}}."""
        self.update(algos={**self.get("algos", {}), framework: dict(functions)})

    def add_compute_plan(self, framework: str, key: str, tasks: dict) -> None:
        """Record a compute plan: compute_plans: {framework: {"key": plan key, "tasks": {task key:
        what the task is}}}.

        Args:
          framework: the framework the plan trains.
          key: the plan's key.
          tasks: {task key: what the task is}.
        """
        self.update(compute_plans={**self.get("compute_plans", {}),
                                   framework: {"key": key, "tasks": tasks}})

    def reuse_or_register(self, client: substra.Client, kind: str, made_from: str, register) -> str:
        """The key of an asset made from `made_from`: reused if known and still on the node, else
        `register()`ed and written to the file at once.

        Args:
          client: the Substra client.
          kind: "dataset", "data_sample" or "function".
          made_from: a fingerprint of what the asset is made from.
          register: registers the asset and returns its key.

        Returns:
          The asset's key.
        """
        fingerprints = self.content.setdefault("fingerprints", {})
        for key, known in list(fingerprints.items()):
            if known == made_from:
                if _exists(client, kind, key):
                    return key
                del fingerprints[key]  # gone from the node (or another node): register again
        key = register()
        fingerprints[key] = made_from
        self.save()
        return key


def _exists(client: substra.Client, kind: str, key: str) -> bool:
    getter = {"dataset": client.get_dataset, "data_sample": client.get_data_sample,
              "function": client.get_function}[kind]
    try:
        getter(key)
        return True
    except substra.exceptions.NotFound:
        return False


def register_dataset(client: substra.Client, keys: KeysFile, name: str, owner: str) -> str:
    """Register the opener and its description, owned by and visible to organisation `owner` (the
    client's) only, or reuse the key `keys` holds for the same.

    Args:
      client: the Substra client.
      keys: the keys file.
      name: the dataset's name.
      owner: the client's organisation.

    Returns:
      The dataset's key.
    """
    spec = DatasetSpec(
        name=name, data_opener=DATASET_ASSET / "opener.py",
        description=DATASET_ASSET / "description.md", permissions=owner_only(owner),
        logs_permission=owner_only(owner),
    )
    made_from = fingerprint(spec.data_opener, spec.description, name, spec.permissions.model_dump(),
                            spec.logs_permission.model_dump())
    return keys.reuse_or_register(client, "dataset", made_from, lambda: client.add_dataset(spec))


def register_samples(client: substra.Client, keys: KeysFile, dataset_key: str,
                     folders: list) -> list:
    """One data sample per folder, linked to the dataset.

    Args:
      client: the Substra client.
      keys: the keys file.
      dataset_key: the dataset the samples are linked to.
      folders: the data sample folders.

    Returns:
      The samples' keys, in folder order.
    """
    found = []
    for folder in folders:
        spec = DataSampleSpec(path=Path(folder), data_manager_keys=[dataset_key])
        made_from = fingerprint("data sample", dataset_key, samples.sample_identity(folder))
        found.append(keys.reuse_or_register(client, "data_sample", made_from,
                                            lambda spec=spec: client.add_data_sample(spec)))
    return found


def register_function(client: substra.Client, keys: KeysFile, asset_dir: Path, function: str,
                      name: str, build_dir: Path, hyperparameters: dict | None = None,
                      search: dict | None = None) -> str:
    """Build the self-contained archive of a function of an asset and register it on `client`
    (public: any worker may run it), or reuse the key `keys` holds for the same archive.

    Args:
      client: the Substra client.
      keys: the keys file.
      asset_dir: the asset's folder.
      function: a function of the contract ("train", ..., "score", "genesis").
      name: the function's name on the node (the archive's, spaces as underscores).
      build_dir: where the archive is built.
      hyperparameters: put in place of the asset's hyperparameters file, if given.
      search: the search file (search_space.SearchSpace.to_json), put beside it if given.

    Returns:
      The function's key.
    """
    description = asset_dir / "description.md"
    if not description.is_file():
        raise UserError(f"{description}: missing; every asset needs a description.md")
    replace = None
    if hyperparameters is not None:
        replace = {"hyperparameters.json": (json.dumps(hyperparameters, indent=2) + "\n").encode()}
    add = None
    if search is not None:
        add = {search_space.FILE_NAME: (json.dumps(search, indent=2) + "\n").encode()}
    archive_path = archive.build(asset_dir, function,
                                 Path(build_dir) / f"{name.replace(' ', '_')}.tar.gz", replace, add)
    inputs, outputs = CONTRACT[function]
    spec = FunctionSpec(name=name, description=description, file=archive_path, permissions=public(),
                        inputs=inputs, outputs=outputs)
    made_from = fingerprint(name, archive_path, description, [i.model_dump() for i in inputs],
                            [o.model_dump() for o in outputs], spec.permissions.model_dump())
    return keys.reuse_or_register(client, "function", made_from, lambda: client.add_function(spec))


def register_data(client: substra.Client, keys: KeysFile, owner: str, name: str,
                  train_folders: list, test_folders: list = ()) -> tuple:
    """The dataset of `owner` with its train (and test) data samples.

    Args:
      client: the Substra client.
      keys: the keys file.
      owner: the client's organisation.
      name: the dataset's name.
      train_folders: its train data sample folders.
      test_folders: its test data sample folders (none: no test Share).

    Returns:
      (train Share, test Share or None).
    """
    dataset = register_dataset(client, keys, name, owner)
    train = Share(owner, dataset, tuple(register_samples(client, keys, dataset, train_folders)))
    test = Share(owner, dataset, tuple(register_samples(client, keys, dataset,
                                                        test_folders))) if test_folders else None
    return train, test


def register_organizations(clients: list, keys: KeysFile, data_dir: Path,
                           test_everywhere: bool = False) -> tuple:
    """Organisation k (of N clients) registers its own dataset with train data samples k, k+N, ...;
    the first one also holds the test samples (every one with `test_everywhere`). The caller
    compares every organisation's samples first (samples.check_examples), as run_local.py does.

    Args:
      clients: one Substra client per organisation.
      keys: the keys file.
      data_dir: the data folder.
      test_everywhere: every organisation holds the test samples.

    Returns:
      (train Shares, test Share, {organisation: folders}), or with `test_everywhere` a list of every
      organisation's test Share in the second place.
    """
    shares, tests, holdings = [], [], {}
    for client, own in zip(clients, split_among(data_dir, len(clients))):
        owner = client.organization_info().organization_id
        share, test_share = register_data(client, keys, owner, f"MNIST ({owner})", own,
                                          sample_folders(data_dir, "test") if test_everywhere
                                          or not shares else ())
        shares.append(share)
        tests.append(test_share)
        holdings[owner] = own
    return shares, tests if test_everywhere else tests[0], holdings


def split_among(data_dir: Path, organizations: int, flag: str | None = None) -> list:
    """The train data sample folders of each of `organizations` (or folds): number k holds samples
    k, k+N, ...

    Args:
      data_dir: the data folder.
      organizations: N, the organisations or folds.
      flag: the user's option that asked for `organizations`, which an error names.

    Returns:
      N lists of folders. Raises UserError when the data holds fewer than N train samples.
    """
    folders = sample_folders(data_dir, "train")
    if len(folders) < organizations:
        asked = f"{flag} {organizations}: " if flag else ""
        raise UserError(f"{asked}{data_dir} holds {counted(len(folders), 'train data sample')} for "
                        f"{organizations} organisations (one at least each); use at most "
                        f"{len(folders)}, or "
                        + split_advice(data_dir, organizations, organizations))
    return [folders[k::organizations] for k in range(organizations)]


def register_objective(client: substra.Client, keys: KeysFile, build_dir: Path) -> str:
    """Register the objective: the score function, named "accuracy" (register_function).

    Args:
      client: the Substra client.
      keys: the keys file.
      build_dir: where its archive is built.

    Returns:
      Its function key.
    """
    return register_function(client, keys, OBJECTIVE_ASSET, "score", "accuracy", build_dir)


def register_algo(client: substra.Client, keys: KeysFile, run: str, framework: str,
                  hyperparameters: dict, build_dir: Path, functions: tuple,
                  search: dict | None = None) -> dict:
    """Register the functions of the algo run `run` of `framework` (register_function).

    Args:
      client: the Substra client.
      keys: the keys file.
      run: the run's name, which begins each function's.
      framework: the algo's framework.
      hyperparameters: put inside each function.
      build_dir: where the archives are built.
      functions: those of the plan (compute_plan.functions).
      search: the search file, put in the "tune" function only.

    Returns:
      {function: key}.
    """
    asset = ALGO_ASSETS[framework]
    return {function: register_function(client, keys, asset, function, f"{run} {function}",
                                        build_dir, hyperparameters,
                                        search if function == "tune" else None)
            for function in functions}


def check_on_node(client: substra.Client, keys: KeysFile) -> None:
    """The keys file's dataset and objective must exist on the node the client talks to."""
    for field, kind in (("dataset_key", "dataset"), ("objective_key", "function")):
        if not _exists(client, kind, keys.require(field)):
            raise UserError(f"{keys.path}: {field} {keys.get(field)} is not on this Substra node; "
                            "run scripts/add_dataset_objective.py with the same --client-name "
                            "first")


def register_dataset_objective(client: substra.Client, keys: KeysFile, data_dir: Path, folds: int,
                               build_dir: Path) -> None:
    """Dataset, train / test data samples and objective of one organisation, into the keys file:
    dataset_key, objective_key, train_data_sample_keys (a list of folds, each a list of keys),
    test_data_sample_keys, organization_id and the data folder they came from.

    Args:
      client: the organisation's Substra client.
      keys: the keys file.
      data_dir: the data folder.
      folds: the folds the train samples are split into, from 1 to their number.
      build_dir: where the objective's archive is built.
    """
    train_folders = sample_folders(data_dir, "train")
    if not isinstance(folds, int) or not 1 <= folds <= len(train_folders):
        raise UserError(f"--folds {folds}: must be between 1 and the "
                        f"{counted(len(train_folders), 'train data sample')} in {data_dir}; use at "
                        f"most {len(train_folders)}, or "
                        + split_advice(data_dir, folds))
    check_organization_keys(data_dir, [train_folders])  # one organisation's samples, under one key,
    read = samples.check_examples(train_folders)  # compared before any is registered
    for k in range(folds):  # a fold is a train task's data: its declared size must be near it
        samples.public_size(train_folders[k::folds], read[k::folds], f"{data_dir}, fold {k + 1}")
    for folder in [*train_folders, *sample_folders(data_dir, "test")]:
        # every sample has its identity key, checked before any is registered
        samples.sample_identity(folder)
    owner = client.organization_info().organization_id
    train, test = register_data(client, keys, owner, "MNIST", train_folders,
                                sample_folders(data_dir, "test"))
    keys.update(organization_id=train.organization, data=str(Path(data_dir).resolve()),
                dataset_key=train.dataset,
                train_data_sample_keys=[list(train.samples[i::folds]) for i in range(folds)],
                test_data_sample_keys=list(test.samples))
    keys.update(objective_key=register_objective(client, keys, build_dir))
