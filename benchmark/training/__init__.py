"""Training: ONE run (or one batch of seeds) in this process, knowing nothing of pools, MLflow
stores or suites: the collect -> update -> evaluate loop, the meta-learning loop, checkpoint
payloads. Imports only the ground (``benchmark.config``, ``benchmark.tracking``) and ``agents``."""
