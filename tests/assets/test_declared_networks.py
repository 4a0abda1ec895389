"""Every declared network (mnist_dp/architectures.py), a new one included, in every framework: the
common layout, one function, and one clipped update, per example and per person. The mechanism
tests (test_mechanism.py, test_per_person.py, test_same_mechanism.py) cover the networks they list
in more depth."""
import dataclasses

import numpy as np
import pytest
import torch
from conftest import ALGO_ASSETS, FRAMEWORKS

from mnist_dp import architectures, hyperparameters
from mnist_dp.assets import load_asset_module
from mnist_dp.learning import initial_weights, interface, training
from mnist_dp.privacy.events import PER_PERSON
from mnist_dp.privacy.randomness import RunRandomness
from mnist_dp.privacy.task_plan import SamplingPlan, TaskPlan

NETWORKS = [interface.Network(a.features, "tanh", a.network) for a in architectures.ARCHITECTURES]
IDS = [f"{n.features}-{n.network}" for n in NETWORKS]
PERSONS = np.array([0, 0, 1, 2, 2, 2, 3, 4, 4, 5, 5, 5])  # 12 images of 6 persons


@pytest.fixture(scope="module")
def algos():
    return {f: load_asset_module(ALGO_ASSETS[f] / "algo.py", f"algo_{f}_declared_networks")
            for f in FRAMEWORKS}


def scaled_weights(network, rng):
    """The drawn weights × 4 (out of the activations' linear regime), random where they start at
    zero."""
    return [a * 4 if a.any() else rng.normal(0, 0.05, a.shape).astype(np.float32)
            for a in initial_weights.draw(network, 0)]


@pytest.mark.parametrize("network", NETWORKS, ids=IDS)
def test_every_framework_builds_the_declared_network_as_one_function(algos, network):
    drawn = initial_weights.draw(network, 5)
    rng = np.random.default_rng(0)
    arrays, images = scaled_weights(network, rng), rng.random((6, 28, 28), dtype=np.float32)
    inputs = network.inputs(images)
    logits = {}
    for name, algo in algos.items():
        framework = algo.FRAMEWORK
        started = framework.weight_arrays(framework.new_model(5, network))
        assert [a.shape for a in started] == [a.shape for a in drawn], name
        assert all(np.array_equal(a, b) for a, b in zip(started, drawn)), name
        model = framework.set_weight_arrays(framework.new_model(1, network), arrays)
        logits[name] = np.asarray(framework.batch_logits(model, inputs))
    assert logits["torch"].std() > 0.1
    for name in FRAMEWORKS:
        np.testing.assert_allclose(logits[name], logits["torch"], atol=2e-4, err_msg=name)


@pytest.mark.parametrize("network", NETWORKS, ids=IDS)
@pytest.mark.parametrize("per_person", [False, True], ids=["per-example", "per-person"])
def test_torchs_clipping_norms_are_the_naive_per_unit_gradient_norms(algos, network, per_person):
    """torch's book-keeping norms, one rule per layer type, against autograd's gradient of each
    example (each person's summed)."""
    algo, rng = algos["torch"], np.random.default_rng(2)
    model = algo.FRAMEWORK.set_weight_arrays(algo.build_network(network),
                                             scaled_weights(network, rng))
    x = algo.as_input(network.inputs(rng.random((len(PERSONS), 28, 28), dtype=np.float32)))
    y = torch.from_numpy(np.arange(len(PERSONS)) % 10)
    naive = []
    for i in range(len(PERSONS)):
        loss = torch.nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1], reduction="sum")
        naive.append(torch.cat([g.flatten() for g in torch.autograd.grad(
            loss, list(model.parameters()))]))
    naive = torch.stack(naive)
    persons = training.BatchPersons.of(PERSONS) if per_person else None
    if per_person:
        naive = torch.stack([naive[PERSONS == p].sum(0) for p in range(PERSONS.max() + 1)])
    norms = algo.clip_and_sum(model, x, y, 1e9, algo.data_grams(model, x.numpy()) if not
                              per_person else None, persons)
    np.testing.assert_allclose(norms.numpy(), naive.norm(dim=1).numpy(), rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("network", NETWORKS, ids=IDS)
@pytest.mark.parametrize("per_person", [False, True], ids=["per-example", "per-person"])
def test_noise_free_clipped_steps_are_one_update_in_every_framework(algos, network, per_person):
    """Three DP steps on the full batch with σ = 0 from the same weights, every unit's gradient norm
    far above C: the clipping, the division by E[B], the momentum and the weight average are the
    same update in every framework, to float precision."""
    rng = np.random.default_rng(1)
    images, labels = rng.random((len(PERSONS), 28, 28), dtype=np.float32), np.arange(12) % 10
    units = PERSONS.max() + 1 if per_person else len(labels)
    hp = hyperparameters.parse({
        **dataclasses.asdict(hyperparameters.load(ALGO_ASSETS["torch"] / "hyperparameters.json")),
        **dataclasses.asdict(network), "epochs": 3, "batch_size": int(units),
        "noise_multiplier": 1.0, "target_epsilon": None, "noise_seed": 0}, "test")
    sampling = SamplingPlan.from_hyperparameters(int(units), hp, "test")
    moved = {}
    for name, algo in algos.items():
        framework = algo.FRAMEWORK
        plan = TaskPlan.of(name, hp, sampling, 0.0)
        if per_person:
            plan = dataclasses.replace(plan, privacy_unit=PER_PERSON)
        model = framework.new_model(hp.seed, network)
        start = interface.flat_weights(framework, model)
        training.fit(framework, model, network.inputs(images), labels, plan,
                     RunRandomness.for_run(0), persons=PERSONS if per_person else None)
        moved[name] = interface.flat_weights(framework, model) - start
    scale = np.abs(moved["torch"]).max()
    assert scale > 1e-4  # the steps moved the weights
    for name in FRAMEWORKS:
        np.testing.assert_allclose(moved[name], moved["torch"], atol=1e-3 * scale, err_msg=name)
