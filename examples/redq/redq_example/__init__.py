"""An example of an algorithm and an environment kept in a package of their own and benchmarked
with reprorl: REDQ (``redq_example.redq``), a variant of SAC with an ensemble of ten critics,
and a point-mass reaching task (``redq_example.envs:PointReach-v0``). docs/benchmark-your-own.md
walks through it."""
