"""An algo asset's command line: substratools' functions `train`, `predict`, `aggregate`, `tune`
and `genesis` (the contract's names), each bound to the asset's Framework and hyperparameters file
and refusing an input it does not use. Registering only here keeps several algo modules importable
in one process (substratools' registry is global)."""
from __future__ import annotations

import logging
from pathlib import Path

from mnist_dp.learning import search, skeleton
from mnist_dp.learning.interface import Framework
from mnist_dp.utils.errors import refuse_unknown_inputs, run_cli

# The inputs each function uses, as the function contract (orchestration/contract.py)
# declares them, but the opener.
FUNCTION_INPUTS = {"train": {"datasamples", "model", "ledger"}, "tune": {"datasamples", "ledger"},
                   "predict": {"datasamples", "model"}, "aggregate": {"models"},
                   "genesis": {"datasamples"}}


def run(framework: Framework, hyperparameters_path: Path) -> None:
    """Register the five functions of `framework`'s asset, whose hyperparameters are
    `hyperparameters_path`, and run the one substratools' command line asks for."""
    import substratools as tools

    # substratools logs through a handler of its own: a library that calls logging.basicConfig()
    # (importing Opacus or MindArmour does) would print every line again
    logging.getLogger("substratools").propagate = False
    bodies = {"train": lambda inputs,
              outputs: skeleton.train(framework, inputs, outputs, hyperparameters_path),
              "predict": lambda inputs, outputs: skeleton.predict(framework, inputs, outputs),
              "aggregate": lambda inputs, outputs: skeleton.aggregate(framework, inputs, outputs,
                                                                      hyperparameters_path),
              "tune": lambda inputs,
              outputs: search.tune(framework, inputs, outputs, hyperparameters_path),
              "genesis": lambda inputs, outputs: skeleton.genesis(inputs, outputs)}
    for name, body in bodies.items():
        def function(inputs, outputs, task_properties, name=name, body=body):
            """The substratools function `name`: refuses an input it does not use, then runs `body`.

            Args:
              inputs: the task's inputs, by identifier (FUNCTION_INPUTS[name] are the ones it uses).
              outputs: the task's output paths, by identifier.
              task_properties: substratools' task properties (not used).
              name: the function's name (a key of FUNCTION_INPUTS), bound per function.
              body: body(inputs, outputs), the function's work, bound per function.
            """
            refuse_unknown_inputs(name, inputs, FUNCTION_INPUTS[name])
            body(inputs, outputs)

        function.__name__ = name  # substratools logs it
        tools.register(function, name)
    run_cli(tools.execute, task=True)
