"""Privacy per person (a data sample's subjects.npy): the mechanism in every framework that clips
per person, a train task end to end, and a one-line refusal wherever a part cannot work per person
yet.

Learning rate 1 and no momentum, as in test_mechanism.py: a step moves the weights by exactly the
noisy clipped sum divided by the expected batch size, here in persons."""
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import torch
import torch.nn.functional as F
from conftest import (
    ALGO_ASSETS,
    assert_one_line_error,
    extract_function,
    independent_epsilon,
    run_function,
    samples,
    tiny_hyperparameters,
)

from mnist_dp import hyperparameters, search_space
from mnist_dp.assets import load_asset_module
from mnist_dp.data import dataset
from mnist_dp.learning import interface, training
from mnist_dp.learning import search as learning_search
from mnist_dp.privacy import data_ledger, model_file
from mnist_dp.privacy import search as search_privacy
from mnist_dp.privacy.events import PER_PERSON
from mnist_dp.privacy.examples import persons_of
from mnist_dp.privacy.randomness import RunRandomness
from mnist_dp.privacy.task_plan import SamplingPlan, TaskPlan
from mnist_dp.report import results

PER_PERSON_FRAMEWORKS = ("torch", "tf", "mindspore")
ALGOS = {name: load_asset_module(ALGO_ASSETS[name] / "algo.py", f"algo_{name}_per_person")
         for name in PER_PERSON_FRAMEWORKS}
C = 1.0
rng = np.random.default_rng(0)
IMAGES = rng.random((8, 28, 28), dtype=np.float32) * 100  # gradients far above C
LABELS = np.arange(8) % 10
PERSONS = np.array([0, 0, 0, 1, 2, 2, 3, 3])  # 4 persons of 3, 1, 2 and 2 images
NETWORK = interface.Network("pixels", "relu", "cnn")
NORM_NETWORKS = [("pixels", "cnn"), ("scattering", "cnn"), ("scattering", "linear")]


def make_hp(**changes):
    return hyperparameters.parse({
        "epochs": 1, "batch_size": 4, "learning_rate": 1.0, "momentum": 0.0, "max_grad_norm": C,
        "noise_multiplier": 1.0, "target_epsilon": None, "max_epsilon": None, "delta": 1e-5,
        "seed": 0, "dp": True, "secure_mode": False, "features": "pixels", "network": "cnn",
        "activation": "relu", "optimizer": "sgd", "ema_decay": 0.0, "noise_decay": 1.0,
        "clip_quantile": None, "clip_learning_rate": 0.2, "clip_count_stddev": None,
        "noise_seed": 0, **changes}, "test")


def person_plan(framework, hp, persons, sigma):
    """A plan per person on the persons of `persons` (indices 0..P-1)."""
    sampling = SamplingPlan.from_hyperparameters(int(persons.max()) + 1, hp, "test")
    return dataclasses.replace(TaskPlan.of(framework, hp, sampling, sigma),
                               privacy_unit=PER_PERSON)


def fit(framework, images, labels, persons, sigma):
    """The update one step on every person applies (q = 1), and what ran."""
    persons = np.unique(persons, return_inverse=True)[1]
    hp = make_hp(batch_size=int(persons.max()) + 1)
    algo = ALGOS[framework].FRAMEWORK
    model = algo.new_model(0, NETWORK)
    before = interface.flat_weights(algo, model)
    ran = training.fit(algo, model, NETWORK.inputs(images), labels,
                       person_plan(framework, hp, persons, sigma), RunRandomness.for_run(0),
                       persons=persons)
    return before - interface.flat_weights(algo, model), ran


@pytest.mark.parametrize("framework", PER_PERSON_FRAMEWORKS)
def test_a_persons_images_are_summed_then_clipped_as_one_and_a_person_moves_the_sum_by_c(
        framework):
    alone, ran = fit(framework, IMAGES[:3], LABELS[:3], PERSONS[:3], sigma=0.0)
    assert ran.batch_sizes == [1] and ran.clipping == PER_PERSON
    assert np.linalg.norm(alone) == pytest.approx(C, rel=1e-3)  # three images, one C
    everyone, ran = fit(framework, IMAGES, LABELS, PERSONS, sigma=0.0)
    assert ran.batch_sizes == [4]
    for person in range(4):  # the clipped sums (update × E[B]) with and without one person
        kept = PERSONS != person
        without, _ = fit(framework, IMAGES[kept], LABELS[kept], PERSONS[kept], sigma=0.0)
        assert np.linalg.norm(4 * everyone - 3 * without) <= C * (1 + 1e-4)


@pytest.mark.parametrize("framework", PER_PERSON_FRAMEWORKS)
def test_noise_has_standard_deviation_sigma_c_over_the_expected_persons(framework):
    sigma = 2.0
    clean, _ = fit(framework, IMAGES, LABELS, PERSONS, sigma=0.0)
    noisy, _ = fit(framework, IMAGES, LABELS, PERSONS, sigma=sigma)
    noise = noisy - clean
    assert np.std(noise) == pytest.approx(sigma * C / 4, rel=0.03)  # E[B] = 4 persons, not 8


def test_a_batchs_persons_lay_out_each_persons_examples_in_a_padded_row():
    persons = training.BatchPersons.of(np.array([7, 3, 7, 9, 3, 7]))
    assert persons.groups.tolist() == [1, 0, 1, 2, 0, 1] and persons.count == 3
    assert persons.slots.tolist() == [[1, 4, 6], [0, 2, 5], [3, 6, 6]]  # 6: the zero row
    alone = training.BatchPersons.of(np.arange(3))
    assert alone.slots.tolist() == [[0], [1], [2]] and alone.count == 3


def test_batches_sample_persons_with_all_their_images():
    persons = np.repeat(np.arange(200), np.arange(200) % 5 + 1)  # 200 persons of 1 to 5 images
    hp = make_hp(batch_size=50, epochs=100)  # q = 1/4, 400 steps
    plan = person_plan("torch", hp, persons, 1.0)
    batches = list(training.sampled_batches(plan, RunRandomness.for_run(0), lambda steps: "",
                                            False, persons))
    assert len(batches) == 400
    taken = np.zeros(200)
    for batch in batches:
        members = np.unique(persons[batch])
        assert np.array_equal(np.sort(batch), np.flatnonzero(np.isin(persons, members)))
        taken[members] += 1
    assert taken.mean() / 400 == pytest.approx(0.25, rel=0.05)


def assert_person_norms(norms, per_example):
    """`norms` [4] are the norms of PERSONS' sums of the naive per-example gradients
    (per_example[i]: example i's, one flat array per parameter); every parameter's cross terms
    between a person's images are large against the tolerance, so a dropped one fails."""
    summed = [np.zeros((4, g[0].size)) for g in zip(*per_example)]  # per parameter [persons, size]
    for s, g in zip(summed, zip(*per_example)):
        np.add.at(s, PERSONS, np.stack(g).astype(np.float64))
    naive = np.sqrt(sum(np.square(s).sum(1) for s in summed))
    np.testing.assert_allclose(norms, naive, rtol=2e-6)  # squares: 4e-6
    for s, g in zip(summed, zip(*per_example)):
        alone = np.bincount(PERSONS, np.square(np.stack(g).astype(np.float64)).sum(1))
        cross = np.square(s).sum(1) - alone  # what the pairs add to each person
        assert np.abs(cross).max() > 1e-5 * np.square(naive).max()


@pytest.mark.parametrize("features, network", NORM_NETWORKS)
def test_torch_per_person_norms_are_the_norms_of_the_summed_naive_gradients(features, network):
    torch.manual_seed(0)
    algo = ALGOS["torch"]
    model = algo.build_network(interface.Network(features, "tanh", network))
    x = algo.as_input(interface.Network(features, "tanh", network).inputs(IMAGES / 100))
    y = torch.from_numpy(LABELS)
    per_example = []
    for i in range(len(y)):
        model.zero_grad()
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1], reduction="sum").backward()
        per_example.append([p.grad.numpy().flatten() for p in model.parameters()])
    norms = algo.clip_and_sum(model, x, y, 1e9, None, training.BatchPersons.of(PERSONS))
    assert_person_norms(norms.numpy(), per_example)


@pytest.mark.parametrize("features, network", NORM_NETWORKS)
def test_tf_per_person_norms_are_the_norms_of_the_summed_naive_gradients(features, network):
    tf.keras.utils.set_random_seed(0)
    algo = ALGOS["tf"]
    model = algo.build_network(interface.Network(features, "tanh", network))
    x = algo.as_input(interface.Network(features, "tanh", network).inputs(IMAGES / 100))
    y = tf.constant(LABELS)
    per_example = []
    for i in range(len(LABELS)):
        with tf.GradientTape() as tape:
            loss = model.loss(y[i:i + 1], model(x[i:i + 1], training=True))
        per_example.append([g.numpy().flatten() for g in
                            tape.gradient(loss, model.trainable_variables)])
    persons = training.BatchPersons.of(PERSONS)
    tensors = tf.constant(persons.groups), tf.constant(persons.slots)
    _, norms = algo.clipped_gradient_sum(model, algo.make_layer_registry(persons=tensors), x, y,
                                         1e9, tensors[0])
    assert_person_norms(norms.numpy(), per_example)


def test_a_train_task_is_private_per_person_and_its_ledgers_name_persons(tmp_path, opener_path):
    """The skeleton's path, the same in every framework (their steps per person: above)."""
    framework = "torch"
    dataset.generate(tmp_path / "data", train_size=300, test_size=100, train_samples=2, seed=1,
                     images_per_subject=(2, 5))
    folders = list(map(Path, samples(tmp_path / "data", "train")))
    persons = len(np.unique(np.concatenate([np.load(f / "subjects.npy") for f in folders])))
    trainer = extract_function(ALGO_ASSETS[framework], "train", tmp_path / "fn",
                               tiny_hyperparameters(framework))
    outputs = {"model": tmp_path / "model", "epsilon": tmp_path / "epsilon.json"}
    run_function(trainer / "algo.py", "train", {"opener": opener_path, "datasamples": folders},
                 outputs)
    saved = model_file.load(outputs["model"], framework)
    [event] = saved.ledger.events
    steps = -(-persons // 64)  # q = 1 / ceil(P / 64), one epoch
    assert (event.clipping, event.n, event.steps) == (PER_PERSON, persons, steps)
    assert event.sample_rate == pytest.approx(1 / steps)
    assert not saved.ledger.names_examples  # released: how many persons is not said
    assert json.loads(outputs["epsilon"].read_text())["all"] == pytest.approx(
        independent_epsilon(1.0, 1 / steps, steps, 1e-4), rel=1e-6)
    own = data_ledger.read(folders)  # the organisation's own record, naming each person
    [recorded] = own.events
    assert recorded.clipping == PER_PERSON and recorded.n == persons
    assert len(np.unique(np.concatenate([e.array for e in own.examples.values()]))) == persons
    record = results.model_record(outputs["model"], framework, {"MyOrg1MSP": None})
    assert record["privacy_unit"] == "person" and "one person" in record["neighbouring_relation"]


def test_a_search_per_person_holds_out_whole_persons_and_composes_over_persons(tmp_path,
                                                                              opener_path):
    """The tune task on data that names persons: its plan counts persons on each side of the
    validation split (a person's images all on one side), its candidates clip per person, and its
    σ is the search's over that many persons, as plan_search computes it."""
    dataset.generate(tmp_path / "data", train_size=300, test_size=100, seed=1,
                     images_per_subject=(3, 3))
    base = tiny_hyperparameters("torch", noise_multiplier=None, target_epsilon=3.0)
    fn = extract_function(ALGO_ASSETS["torch"], "tune", tmp_path / "fn", base)
    space = {"space": {"learning_rate": [0.05, 0.1]}, "mean_candidates": 2}
    (fn / "search.json").write_text(json.dumps(space))
    folders = samples(tmp_path / "data", "train")
    outputs = {"model": tmp_path / "model", "epsilon": tmp_path / "epsilon.json"}
    run_function(fn / "algo.py", "tune", {"opener": opener_path, "datasamples": folders}, outputs)
    [event] = model_file.load(outputs["model"], "torch").ledger.events
    opener = load_asset_module(opener_path, "opener_for_per_person_search").MnistOpener()
    data = opener.get_data(folders)
    persons = persons_of(data)
    held_out = search_privacy.validation_split(data, event.search.validation_permille)
    assert all(len(set(held_out[persons == p])) == 1 for p in range(persons.max() + 1))
    # the split's public size, its expected share of the 100 declared persons, not its count
    plan = search_privacy.plan_search("torch", hyperparameters.parse(base, "test"),
                                      search_space.parse(space, "test"), 100,
                                      search_privacy.public_validation(
                                          100, event.search.validation_permille), "test",
                                      PER_PERSON)
    assert (event.clipping, event.n, event.search.validation_n) == (PER_PERSON, 100,
                                                                    plan.validation_n)
    assert event.noise_multiplier in plan.sigmas.values()
    assert 2.5 < json.loads(outputs["epsilon"].read_text())["all"] <= 3.0


def test_a_persons_score_moves_a_searchs_count_by_at_most_one():
    """Per person, the validation score sums each person's fraction right: sensitivity 1, as the
    score's noise is calibrated for, however many images a person has."""
    algo = ALGOS["torch"]
    model = algo.FRAMEWORK.new_model(0, NETWORK)
    inputs, labels = NETWORK.inputs(IMAGES / 100), LABELS
    whole = learning_search.correct(algo.FRAMEWORK, model, inputs, labels, PERSONS)
    right = learning_search.correct(algo.FRAMEWORK, model, inputs, labels)
    assert whole <= 4 and right <= 8
    for person in range(4):
        kept = PERSONS != person
        without = learning_search.correct(algo.FRAMEWORK, model, inputs[kept], labels[kept],
                                          np.unique(PERSONS[kept], return_inverse=True)[1])
        assert 0 <= whole - without <= 1


def test_a_bad_subjects_file_is_one_line_and_nothing_is_written(tmp_path, opener_path):
    dataset.generate(tmp_path / "data", train_size=300, test_size=100, seed=1)
    [folder] = map(Path, samples(tmp_path / "data", "train"))
    np.save(folder / "subjects.npy", np.arange(7))
    fn = extract_function(ALGO_ASSETS["torch"], "train", tmp_path / "fn",
                          tiny_hyperparameters("torch"))
    outputs = {"model": tmp_path / "model", "epsilon": tmp_path / "epsilon.json"}
    proc = run_function(fn / "algo.py", "train", {"opener": opener_path, "datasamples": [folder]},
                        outputs, check=False)
    assert_one_line_error(proc, f"{folder / 'subjects.npy'}: one subject id per image: shape "
                                "[300], got [7]")
    assert not outputs["model"].exists() and not outputs["epsilon"].exists()
    assert not (folder / data_ledger.LEDGER_FILE).exists()


def test_a_change_of_unit_on_data_that_has_spent_is_refused(tmp_path, opener_path):
    """Per image, then per person on the same images: neither account would see the other's runs."""
    dataset.generate(tmp_path / "data", train_size=300, test_size=100, seed=1)
    [folder] = map(Path, samples(tmp_path / "data", "train"))
    trainer = extract_function(ALGO_ASSETS["torch"], "train", tmp_path / "fn",
                               tiny_hyperparameters("torch"))
    inputs = {"opener": opener_path, "datasamples": [folder]}
    run_function(trainer / "algo.py", "train", inputs,
                 {"model": tmp_path / "first", "epsilon": tmp_path / "first-epsilon.json"})
    np.save(folder / "subjects.npy", np.arange(300) // 3)
    outputs = {"model": tmp_path / "second", "epsilon": tmp_path / "second-epsilon.json"}
    proc = run_function(trainer / "algo.py", "train", inputs, outputs, check=False)
    assert_one_line_error(proc, "this data's own ledger records runs clipped per-example on this "
                                "organisation's data, and this run would clip per-person")
    assert not outputs["model"].exists() and len(data_ledger.read([folder]).events) == 1
