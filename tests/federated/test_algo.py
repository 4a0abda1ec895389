"""The substrafl algos (mnist_dp/federated/algo.py, torch_algo.py) task by task, in this process:
each call is what one substrafl task does (a new algo from its arguments, the organisation's local
state loaded, one method, the local state saved), on the opener's data of the tiny samples."""
import copy
import json
import math
import shutil
import zipfile

import cloudpickle
import numpy as np
import pytest
from conftest import (
    NEIGHBOURS_PUBLIC_SIZE,
    independent_epsilon,
    masked,
    samples,
    tiny_hyperparameters,
)
from substrafl.strategies.schemas import FedAvgAveragedState

from mnist_dp.assets import DATASET_ASSET, load_asset_module
from mnist_dp.federated.algo import METRICS, DpFedAvgAlgo, check_hyperparameters
from mnist_dp.federated.strategy import DpFedAvg, LedgerAveragedState
from mnist_dp.federated.torch_algo import TorchDpFedAvgAlgo
from mnist_dp.privacy import model_file, policy
from mnist_dp.utils.errors import UserError

TARGET = 3.0


@pytest.fixture(scope="module")
def opener_data(tiny_data):
    opener = load_asset_module(DATASET_ASSET / "opener.py",
                               "opener_for_substrafl_tests").MnistOpener()
    return opener.get_data(samples(tiny_data, "train")[:1]), opener.get_data(samples(tiny_data,
                                   "test"))


def hyperparameters(**changes):
    """Tiny, with σ = 1 (or calibrated, given target_epsilon)."""
    return tiny_hyperparameters("torch", delta=1e-5, **changes)


CALIBRATED = {"noise_multiplier": None, "target_epsilon": TARGET}


def new_algo(kind, rounds, hp=None):
    """kind: "torch-subclass" (TorchDpFedAvgAlgo), or a framework for DpFedAvgAlgo."""
    hp = hp or hyperparameters()
    return TorchDpFedAvgAlgo(hp, rounds) if kind == "torch-subclass" else DpFedAvgAlgo(kind, hp,
                                                                                       rounds)


def aggregate(shared_states):
    """The aggregator's task: DpFedAvg's average of the shared states, with their merged ledgers."""
    return DpFedAvg(algo=new_algo("torch",
                                  1)).avg_shared_states(shared_states=shared_states, _skip=True)


def halved(shared_state):
    """An average of this state and a zero change from an organisation that holds the same
    ledger."""
    return LedgerAveragedState(avg_parameters_update=[u / 2
                                                      for u in shared_state.parameters_update],
                               ledger=shared_state.ledger)


def task(kind, rounds, state, method, *args, hp=None, **kwargs):
    """One substrafl task: a new algo, the local state (if any) loaded, the method, the state saved
    again."""
    algo = new_algo(kind, rounds, hp)
    if state.exists():
        algo = algo.load_local_state(state)
    out = getattr(algo, method)(*args, **kwargs)
    algo.save_local_state(state)
    return algo, out


@pytest.mark.parametrize("unit", ["image", "person"])
def test_fedavg_spends_at_most_the_target_over_its_rounds_and_refuses_more(tmp_path, opener_data,
                                                                           unit):
    """FedAvg's rounds + 1 train tasks: `rounds` trainings at a σ calibrated for them (ε at the
    target, as dp_accounting recomputes from σ, q and steps alone), FedAvg's last task trains
    nothing, one more is refused. Per person (persons of 2 images), σ is calibrated over persons."""
    train, _ = opener_data
    if unit == "person":
        train = copy.deepcopy(train)
        [sample] = train["samples"]
        sample["persons"] = np.arange(sample["n"], dtype=np.uint64) // 2
        # as a sample with subjects.npy does, it declares its persons
        sample["folder"] = str(shutil.copytree(sample["folder"], tmp_path / "persons"))
        policy.declare_size(sample["folder"], math.ceil(sample["n"] / 2))
    kind, rounds, state, hp = "torch", 2, tmp_path / "local", hyperparameters(**CALIBRATED)
    task(kind, rounds, state, "initialize", hp=hp, _skip=True)
    algo, sent = task(kind, rounds, state, "train", hp=hp, data_from_opener=train, _skip=True)
    updates = [sent]
    for _ in range(rounds):
        average = halved(updates[-1])
        algo, sent = task(kind, rounds, state, "train", hp=hp, data_from_opener=train,
                          shared_state=average, _skip=True)
        updates.append(sent)
    events = model_file.load(state, "torch").ledger.events
    assert len(events) == rounds
    assert {(e.clipping, e.n) for e in events} == {
        ("per-example", len(train["labels"])) if unit == "image" else
        ("per-person", math.ceil(len(train["labels"]) / 2))}
    assert all(any(np.abs(u).max() > 0 for u in s.parameters_update) for s in updates[:-1])
    # FedAvg's last, never averaged
    assert all(not np.any(u) for u in updates[-1].parameters_update)
    assert all(s.n_samples == events[0].n for s in updates)  # FedAvg's weight: the public size
    sigma, q, steps = events[0].noise_multiplier, events[0].sample_rate, sum(e.steps
                                                                             for e in events)
    assert {e.noise_multiplier for e in events} == {sigma}
    assert TARGET - 0.05 < algo.epsilon() <= TARGET
    assert math.isclose(algo.epsilon(), independent_epsilon(sigma, q, steps, 1e-5), rel_tol=1e-6)
    with pytest.raises(UserError, match=f"calibrated for rounds = {rounds}"):
        task(kind, rounds, state, "train", hp=hp, data_from_opener=train, shared_state=average,
             _skip=True)


@pytest.mark.parametrize("kind", ["torch", "tf", "mindspore", "torch-subclass"])
def test_train_sends_the_change_and_keeps_the_global_model(kind, tmp_path, opener_data):
    """Every organisation holds the global model after its train task (in every framework:
    MindSpore's weight arrays once followed the training, and each organisation kept its own
    model)."""
    train, _ = opener_data
    algo = new_algo(kind, rounds=1, hp=tiny_hyperparameters(kind.split("-")[0], delta=1e-5))
    start = algo._weights()
    sent = algo.train(data_from_opener=train, _skip=True)
    # every organisation: w_r
    assert all(np.array_equal(a, b) for a, b in zip(algo._weights(), start))
    assert len(sent.parameters_update) == len(start)
    assert all(np.isfinite(u).all() for u in sent.parameters_update)
    assert sum(float(np.abs(u).sum()) for u in sent.parameters_update) > 0
    average = aggregate([sent])
    # FedAvg's last: the average, no training
    algo.train(data_from_opener=train, shared_state=average, _skip=True)
    assert all(np.allclose(w, s + u, atol=1e-6) for w, s,
               u in zip(algo._weights(), start, sent.parameters_update))


def test_evaluation_reports_accuracy_and_the_organisations_epsilon(tmp_path, opener_data):
    train, test = opener_data
    state = tmp_path / "local"
    algo, _ = task("torch", 1, state, "initialize", _skip=True)
    before = algo.predict(test)
    assert METRICS["epsilon"](test, before) == 0.0  # round 0: the seeded start
    task("torch", 1, state, "train", data_from_opener=train, _skip=True)
    algo = new_algo("torch", 1).load_local_state(state)
    predictions = algo.predict(test)
    accuracy = METRICS["accuracy"](test, predictions)
    assert 0 <= accuracy <= 1 and isinstance(accuracy, float)
    assert accuracy == pytest.approx(np.mean(predictions["labels"] == test["labels"]))
    assert METRICS["epsilon"](test, predictions) == algo.epsilon() > 0


def test_the_local_state_is_the_bundles_model_file_and_nothing_else_loads(tmp_path, opener_data):
    train, _ = opener_data
    state = tmp_path / "local"
    task("torch", 1, state, "initialize", _skip=True)
    with pytest.raises(UserError, match="empty ledger|not a valid model file"):
        model_file.load(state)  # nothing trained: no model file, the seeded start is rebuilt
    algo, _ = task("torch", 1, state, "train", data_from_opener=train, _skip=True)
    saved = model_file.load(state, "torch")
    assert saved.ledger.events == algo.ledger.events
    assert new_algo("torch", 1).load_local_state(state).train_tasks == 1
    with pytest.raises(UserError, match="trained with 'torch', cannot load it into 'tf'"):
        model_file.load(state, "tf")
    (tmp_path / "other").write_text('{"format": "something else"}')
    with pytest.raises(UserError, match="not a local state of this bundle's torch algo"):
        new_algo("torch", 1).load_local_state(tmp_path / "other")


@pytest.mark.parametrize("kind", ["torch", "torch-subclass"])
def test_the_algo_pickles_as_its_arguments(kind):
    """substrafl pickles the algo inside its strategy and deep-copies it: it comes back built from
    its arguments."""
    algo = new_algo(kind, rounds=3)
    for again in (cloudpickle.loads(cloudpickle.dumps(algo)), copy.deepcopy(algo)):
        assert type(again) is type(algo) and again.kwargs == algo.kwargs and again.rounds == 3
        # the seeded start
        assert all(np.array_equal(a, b) for a, b in zip(again._weights(), algo._weights()))


def test_refused_up_front():
    with pytest.raises(UserError, match="max_epsilon is not supported"):
        check_hyperparameters(hyperparameters(**CALIBRATED, max_epsilon=5.0), 1)
    with pytest.raises(UserError, match="rounds = 0"):
        check_hyperparameters(hyperparameters(), 0)
    with pytest.raises(UserError, match="framework 'jax'"):
        DpFedAvgAlgo("jax", hyperparameters(), 1)


def organisation_data(tmp_path, tiny_data, sizes, shared=0):
    """The opener's data of one sample per organisation, each under its own identity key:
    organisation k holds `sizes[k]` of tiny_data's train examples, the first `shared` of them held
    by every organisation."""
    from mnist_dp.data import dataset
    from mnist_dp.data import keys as identity_keys

    opener = load_asset_module(DATASET_ASSET / "opener.py",
                               "opener_for_substrafl_tests").MnistOpener()
    folder = samples(tiny_data, "train")[0]
    images, labels = np.load(f"{folder}/images.npy"), np.load(f"{folder}/labels.npy")
    data, start = [], shared
    for k, size in enumerate(sizes):
        picked = [*range(shared), *range(start, start + size - shared)]
        start += size - shared
        dataset.write_sample(tmp_path / f"org{k}", images[picked], labels[picked],
                             identity_keys.new_key(), public=True)
        data.append(opener.get_data([str(tmp_path / f"org{k}")]))
    return data


def test_every_organisation_keeps_every_runs_ledger_and_reports_its_own_epsilon(tmp_path,
                                                                                tiny_data):
    """Uneven shares (100 and 50 examples, σ = 1, one round): both local states hold the same global
    weights, so both ledgers hold both runs, and each headline figure is the worst organisation's,
    not the holder's own."""
    data = organisation_data(tmp_path, tiny_data, [100, 50])
    hp = hyperparameters(batch_size=10)
    states = [tmp_path / f"local{k}" for k in range(2)]
    for state in states:
        task("torch", 1, state, "initialize", hp=hp, _skip=True)
    sent = [task("torch", 1, state, "train", hp=hp, data_from_opener=d, _skip=True)[1]
            for state, d in zip(states, data)]
    average = aggregate(sent)
    algos = [task("torch", 1, state, "train", hp=hp, data_from_opener=d, shared_state=average,
                  _skip=True)[0]
             for state, d in zip(states, data)]
    own = [independent_epsilon(1.0, 1 / -(-n // 10), -(-n // 10), 1e-5) for n in (100, 50)]
    both = [model_file.load(state, "torch").ledger for state in states]
    assert [len(ledger.events) for ledger in both] == [2, 2] and len(both[0].keys()) == 2
    for algo, ledger, mine in zip(algos, both, own):
        # the evaluation's metric: its own examples
        assert math.isclose(algo.epsilon(), mine, rel_tol=1e-6)
        # the model's: the worst organisation
        assert math.isclose(ledger.epsilon(1e-5), max(own), rel_tol=1e-6)
    assert all(np.array_equal(a, b) for a, b in zip(algos[0]._weights(), algos[1]._weights()))


def test_a_train_task_on_d_and_on_d_less_one_example_sends_and_keeps_the_same(neighbours,
                                                                              tmp_path):
    """substrafl's train task on neighbouring data (201 and 200 images, both declaring 200, a
    noise_seed): the same shared state but the weight change (its ledger, released, and its FedAvg
    weight, the public size), the same local state but the weights, the same ε metric."""
    opener = load_asset_module(DATASET_ASSET / "opener.py",
                               "opener_for_substrafl_tests").MnistOpener()
    released = {}
    for name, folder in neighbours.items():
        algo = new_algo("torch", 1, hyperparameters(batch_size=50, noise_seed=7))
        sent = algo.train(data_from_opener=opener.get_data(samples(folder, "train")), _skip=True)
        algo.save_local_state(tmp_path / name)
        with zipfile.ZipFile(tmp_path / name) as state:
            meta = json.loads(state.read("meta.json"))
            kept = [state.read("ledger.json").decode(), meta["hyperparameters"]]
        released[name] = [sent.n_samples, masked(json.dumps(sent.ledger)), masked(str(kept)),
                          algo.epsilon()]
    assert released["D"] == released["D-1"] and released["D"][0] == NEIGHBOURS_PUBLIC_SIZE
    assert '"ids"' not in released["D"][1]
    assert sent.ledger["events"][0]["n"] == NEIGHBOURS_PUBLIC_SIZE


def test_a_plain_fedavg_average_without_ledgers_is_refused(tmp_path, opener_data):
    train, _ = opener_data
    algo = new_algo("torch", rounds=1)
    sent = algo.train(data_from_opener=train, _skip=True)
    plain = FedAvgAveragedState(avg_parameters_update=sent.parameters_update)
    with pytest.raises(UserError, match="carries no privacy ledger.*use "
                                        "mnist_dp.federated.strategy.DpFedAvg"):
        algo.train(data_from_opener=train, shared_state=plain, _skip=True)
