"""Training: ONE run (or one batch of seeds) in this process, knowing nothing of pools, MLflow
stores or suites. Bottom up: ``results`` (what a run reports), ``checkpoint_paths`` (where
checkpoints live, without torch), ``checkpoint`` (payloads and files), ``control`` (seeding,
devices, stop signal, counters, a run's end), ``evaluate``, ``hooks``, then the loops:
``meta_loop`` (meta-learners), ``seed_run`` (one run's part of the loop) and ``loop``
(everything else, and the entry point ``loop.run``). A run over workers (its ``distributed:``
settings) is a ``distributed.DistributedRun``: its envs in ``collectors`` (``async_collection``
when they never wait), its gradient steps taken by ``gradient_workers`` through the learner's
step strategy. Imports only the ground (``benchmark.config``, ``benchmark.distributed_config``)
and the interface of ``agents`` (its face, ``api``, ``registry``, ``meta``, the envs; never the
algorithms, networks or buffers behind it)."""
