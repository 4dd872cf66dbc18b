"""Execution: MANY runs, somewhere: the suite's launch and plan (skip finished, resume, claims,
batched seeds, cost estimates), the worker, the executors behind one contract (``base``:
``local`` process pool, ``ray``, ``slurm``), devices and progress. Imports training and the ground."""
