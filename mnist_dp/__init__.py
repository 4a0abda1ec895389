"""Code shared by the Substra assets and the scripts of the DP-SGD MNIST bundle, by concern:

- ``privacy``: DP events, the accountant, the ledger, what a run may spend, statements and
  model-file checks;
- ``hyperparameters`` and ``assets`` (modules every part may use): the hyperparameters file every
  algo ships, and where the assets are;
- ``learning``: the task skeleton every algo asset shares, the interface an asset implements;
- ``data``: data sources, the dataset folders generate_data writes, the data samples a task reads;
- ``orchestration``: the Substra side (contract, archives, compute plans, registration, execution);
- ``report``: the results of a run and how they are shown;
- ``utils``: one-line errors, atomic writes, strict JSON input, timing.

Each subpackage's ``__init__`` imports nothing, and a module imports the libraries it needs and no
more (numpy; dp_accounting in privacy; substra in orchestration), so a function archive carries
exactly the modules its asset imports (``mnist_dp.orchestration.archive``) and a privacy report
needs no ML framework.
"""
