"""The bundle's DP training inside substrafl (Substra's federated-learning library): algos for its
FedAvg strategy (algo.py, torch_algo.py) and what an experiment around them needs
(experiment.py)."""
