"""Perf: the side-by-side harness against Stable-Baselines3: throughput (``throughput``,
``worker``) and learning at identical settings (``parity``, ``parity_worker``)."""
