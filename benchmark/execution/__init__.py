"""Execution: MANY runs, somewhere: the suite's plan (skip finished, resume, claims, batched
seeds, cost estimates), the worker, the executors (local process pool, Ray), devices and
progress. Imports training and the ground."""
