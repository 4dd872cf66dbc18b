"""Micro-benchmarks (pytest-benchmark): buffers, GAE, updates; run with `make perf`, never as timed tests."""

import torch

torch.set_num_threads(1)  # one core, as each benchmark worker gets; comparable across machines
