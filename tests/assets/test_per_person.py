"""Privacy per person (a data sample's subjects.npy): the mechanism in torch, a train task end to
end, and a one-line refusal wherever a part cannot work per person yet.

Learning rate 1 and no momentum, as in test_mechanism.py: a step moves the weights by exactly the
noisy clipped sum divided by the expected batch size, here in persons."""
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
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

from mnist_dp import hyperparameters
from mnist_dp.assets import load_asset_module
from mnist_dp.data import dataset
from mnist_dp.learning import interface, training
from mnist_dp.privacy import data_ledger, model_file
from mnist_dp.privacy.events import PER_PERSON
from mnist_dp.privacy.randomness import RunRandomness
from mnist_dp.privacy.task_plan import SamplingPlan, TaskPlan
from mnist_dp.report import results

ALGO = load_asset_module(ALGO_ASSETS["torch"] / "algo.py", "algo_torch_per_person")
C = 1.0
rng = np.random.default_rng(0)
IMAGES = rng.random((8, 28, 28), dtype=np.float32) * 100  # gradients far above C
LABELS = np.arange(8) % 10
PERSONS = np.array([0, 0, 0, 1, 2, 2, 3, 3])  # 4 persons of 3, 1, 2 and 2 images
NETWORK = interface.Network("pixels", "relu", "cnn")


def make_hp(**changes):
    return hyperparameters.parse({
        "epochs": 1, "batch_size": 4, "learning_rate": 1.0, "momentum": 0.0, "max_grad_norm": C,
        "noise_multiplier": 1.0, "target_epsilon": None, "max_epsilon": None, "delta": 1e-5,
        "seed": 0, "dp": True, "secure_mode": False, "features": "pixels", "network": "cnn",
        "activation": "relu", "optimizer": "sgd", "ema_decay": 0.0, "noise_decay": 1.0,
        "clip_quantile": None, "clip_learning_rate": 0.2, "clip_count_stddev": None,
        "noise_seed": 0, **changes}, "test")


def person_plan(hp, persons, sigma):
    """A plan per person on the persons of `persons` (indices 0..P-1)."""
    sampling = SamplingPlan.from_hyperparameters(int(persons.max()) + 1, hp, "test")
    return dataclasses.replace(TaskPlan.of("torch", hp, sampling, sigma), privacy_unit=PER_PERSON)


def fit(images, labels, persons, sigma):
    """The update one step on every person applies (q = 1), and what ran."""
    persons = np.unique(persons, return_inverse=True)[1]
    hp = make_hp(batch_size=int(persons.max()) + 1)
    model = ALGO.FRAMEWORK.new_model(0, NETWORK)
    before = interface.flat_weights(ALGO.FRAMEWORK, model)
    ran = training.fit(ALGO.FRAMEWORK, model, NETWORK.inputs(images), labels,
                       person_plan(hp, persons, sigma), RunRandomness.for_run(0), persons=persons)
    return before - interface.flat_weights(ALGO.FRAMEWORK, model), ran


def test_a_persons_images_are_summed_then_clipped_as_one_and_a_person_moves_the_sum_by_c():
    alone, ran = fit(IMAGES[:3], LABELS[:3], PERSONS[:3], sigma=0.0)
    assert ran.batch_sizes == [1] and ran.clipping == PER_PERSON
    assert np.linalg.norm(alone) == pytest.approx(C, rel=1e-3)  # three images, one C
    everyone, ran = fit(IMAGES, LABELS, PERSONS, sigma=0.0)
    assert ran.batch_sizes == [4]
    for person in range(4):  # the clipped sums (update × E[B]) with and without one person
        kept = PERSONS != person
        without, _ = fit(IMAGES[kept], LABELS[kept], PERSONS[kept], sigma=0.0)
        assert np.linalg.norm(4 * everyone - 3 * without) <= C * (1 + 1e-4)


def test_noise_has_standard_deviation_sigma_c_over_the_expected_persons():
    sigma = 2.0
    clean, _ = fit(IMAGES, LABELS, PERSONS, sigma=0.0)
    noisy, _ = fit(IMAGES, LABELS, PERSONS, sigma=sigma)
    noise = noisy - clean
    assert np.std(noise) == pytest.approx(sigma * C / 4, rel=0.03)  # E[B] = 4 persons, not 8


def test_batches_sample_persons_with_all_their_images():
    persons = np.repeat(np.arange(200), np.arange(200) % 5 + 1)  # 200 persons of 1 to 5 images
    hp = make_hp(batch_size=50, epochs=100)  # q = 1/4, 400 steps
    plan = person_plan(hp, persons, 1.0)
    batches = list(training.sampled_batches(plan, RunRandomness.for_run(0), lambda steps: "",
                                            False, persons))
    assert len(batches) == 400
    taken = np.zeros(200)
    for batch in batches:
        members = np.unique(persons[batch])
        assert np.array_equal(np.sort(batch), np.flatnonzero(np.isin(persons, members)))
        taken[members] += 1
    assert taken.mean() / 400 == pytest.approx(0.25, rel=0.05)


@pytest.mark.parametrize("features, network", [("pixels", "cnn"), ("scattering", "cnn"),
                                               ("scattering", "linear")])
def test_per_person_norms_are_the_norms_of_the_summed_naive_gradients(features, network):
    """Term by term: every parameter's cross terms between a person's images are large against the
    tolerance, so a dropped one fails the comparison."""
    torch.manual_seed(0)
    model = ALGO.build_network(interface.Network(features, "tanh", network))
    inputs = interface.Network(features, "tanh", network).inputs(IMAGES / 100)
    x, y = ALGO.as_input(inputs), torch.from_numpy(LABELS)
    per_example = []
    for i in range(len(y)):
        model.zero_grad()
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1], reduction="sum").backward()
        per_example.append([p.grad.detach().clone().flatten() for p in model.parameters()])
    groups = torch.from_numpy(PERSONS)
    summed = [torch.zeros(4, g[0].numel()).index_add_(0, groups, torch.stack(g)) for g in
              zip(*per_example)]  # per parameter, [persons, size]
    naive = sum(s.square().sum(1) for s in summed).sqrt()
    norms = ALGO.clip_and_sum(model, x, y, 1e9, None, groups)
    np.testing.assert_allclose(norms.numpy(), naive.numpy(), rtol=2e-6)  # squares: 4e-6
    for s, g in zip(summed, zip(*per_example)):
        alone = torch.zeros(4).index_add_(0, groups, torch.stack(g).square().sum(1))
        cross = s.square().sum(1) - alone  # what the pairs add to each person
        assert cross.abs().max() > 1e-5 * naive.square().max()


def test_a_train_task_is_private_per_person_and_its_ledgers_name_persons(tmp_path, opener_path):
    dataset.generate(tmp_path / "data", train_size=300, test_size=100, train_samples=2, seed=1,
                     images_per_subject=(2, 5))
    folders = list(map(Path, samples(tmp_path / "data", "train")))
    persons = len(np.unique(np.concatenate([np.load(f / "subjects.npy") for f in folders])))
    trainer = extract_function(ALGO_ASSETS["torch"], "train", tmp_path / "fn",
                               tiny_hyperparameters("torch"))
    outputs = {"model": tmp_path / "model", "epsilon": tmp_path / "epsilon.json"}
    run_function(trainer / "algo.py", "train", {"opener": opener_path, "datasamples": folders},
                 outputs)
    saved = model_file.load(outputs["model"], "torch")
    [event] = saved.ledger.events
    steps = -(-persons // 64)  # q = 1 / ceil(P / 64), one epoch
    assert (event.clipping, event.n, event.steps) == (PER_PERSON, persons, steps)
    assert event.sample_rate == pytest.approx(1 / steps)
    assert sum(map(len, saved.ledger.examples.values())) == persons
    assert json.loads(outputs["epsilon"].read_text())["all"] == pytest.approx(
        independent_epsilon(1.0, 1 / steps, steps, 1e-4), rel=1e-6)
    [recorded] = data_ledger.read(folders).events
    assert recorded.clipping == PER_PERSON and recorded.n == persons
    record = results.model_record(outputs["model"], "torch", {"MyOrg1MSP": None})
    assert record["privacy_unit"] == "person" and "one person" in record["neighbouring_relation"]


@pytest.mark.parametrize("framework, function, message", [
    ("tf", "train", "subjects.npy: tf does not clip per person yet"),
    ("mindspore", "train", "subjects.npy: mindspore does not clip per person yet"),
    ("torch", "tune", "subjects.npy: the private search does not run per person yet"),
])
def test_what_cannot_work_per_person_refuses_subjects_in_one_line(tmp_path, opener_path, framework,
                                                                  function, message):
    dataset.generate(tmp_path / "data", train_size=300, test_size=100, seed=1,
                     images_per_subject=(3, 3))
    changes = {"noise_multiplier": None, "target_epsilon": 3.0} if function == "tune" else {}
    fn = extract_function(ALGO_ASSETS[framework], function, tmp_path / "fn",
                          tiny_hyperparameters(framework, **changes))
    outputs = {"model": tmp_path / "model", "epsilon": tmp_path / "epsilon.json"}
    proc = run_function(fn / "algo.py", function, {"opener": opener_path, "datasamples": samples(
        tmp_path / "data", "train")}, outputs, check=False)
    assert_one_line_error(proc, message)
    assert not outputs["model"].exists()


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
