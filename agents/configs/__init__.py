"""Every algorithm's hyperparameters: published defaults (with their source), ranges, and what
the algorithm accepts of an environment. One module per algorithm family, named as in
``agents/algos/``. Torch-free: ``agents.registry`` and ``benchmark.config`` check a whole suite
with these before the deep-learning stack is loaded."""
