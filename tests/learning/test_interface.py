"""mnist_dp/learning/interface.py: the template every algo fills (Framework's hooks, read from the
algos' source so that no ML library is imported), the shared new_model, and what passes between an
algo and the skeleton."""
import ast
import inspect

import numpy as np
import pytest
from conftest import ALGO_ASSETS, StepsThatLearnNothing

from mnist_dp.learning import initial_weights, interface


def hook_signatures(algo_path):
    """{hook: its parameter names} of the interface.Framework subclass in an algo.py, without
    importing it; a hook given as `name = staticmethod(function)` has that module-level function's
    parameters."""
    module = ast.parse(algo_path.read_text())
    functions = {node.name: node for node in module.body if isinstance(node, ast.FunctionDef)}
    [cls] = [node for node in module.body if isinstance(node, ast.ClassDef)
             and any(ast.unparse(base) == "interface.Framework" for base in node.bases)]
    signatures = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef):
            signatures[node.name] = [a.arg for a in node.args.args][1:]
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and ast.unparse(node.value.func) == "staticmethod":
            target = functions[ast.unparse(node.value.args[0])]
            signatures[node.targets[0].id] = [a.arg for a in target.args.args]
    return signatures


def template_signatures():
    return {hook: list(inspect.signature(getattr(interface.Framework, hook)).parameters)[1:]
            for hook in interface.HOOKS}


@pytest.mark.parametrize("framework", list(ALGO_ASSETS))
def test_every_algo_fills_the_templates_hooks_with_the_same_signatures(framework):
    """The three algos differ only in framework code: the same hook names, the same parameters,
    nothing else the skeleton calls (notices is optional)."""
    filled = hook_signatures(ALGO_ASSETS[framework] / "algo.py")
    template = template_signatures()
    assert set(filled) - {"notices"} == set(template) - {"notices"}, framework
    for hook, parameters in filled.items():
        assert parameters == template[hook], f"{framework}'s {hook}{tuple(parameters)}"


def test_every_hook_is_the_frameworks_to_fill_but_notices():
    framework = interface.Framework()
    for hook, parameters in template_signatures().items():
        if hook != "notices":
            with pytest.raises(NotImplementedError):
                getattr(framework, hook)(*[None] * len(parameters))
    assert framework.notices(None) == []


class Arrays(StepsThatLearnNothing):
    """A model that is its weight arrays."""

    def network(self, network):
        return []

    def set_weight_arrays(self, model, arrays):
        return list(arrays)


def test_a_new_model_has_the_initial_weights_every_framework_draws():
    network = interface.Network("scattering", "tanh", "linear")
    model = Arrays().new_model(3, network)
    for mine, drawn in zip(model, initial_weights.draw(network, 3), strict=True):
        np.testing.assert_array_equal(mine, drawn)
