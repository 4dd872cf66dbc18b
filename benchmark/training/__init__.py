"""Training: ONE run (or one batch of seeds) in this process, knowing nothing of pools, MLflow
stores or suites. Bottom up: ``results`` (what a run reports), ``checkpoint_paths`` (where
checkpoints live, without torch), ``checkpoint`` (payloads and files), ``control`` (seeding,
devices, stop signal, counters, a run's end), ``evaluate``, ``hooks``, then the loops:
``meta_loop`` (meta-learners) and ``loop`` (everything else, and the entry point
``loop.run``). Imports only the ground (``benchmark.config``) and ``agents``."""
