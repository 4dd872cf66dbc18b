"""One linear layer, forward, on one core: torch's own kernel (MKL) against oneDNN
(``agents.nets.gemm``). Which is faster depends on the CPU: oneDNN on AMD CPUs with AVX-512,
which MKL leaves unused there; MKL on AMD CPUs with AVX2 only (docs/performance.md, "The CPU
kernel of large layers"). ``auto`` is chosen from these rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agents.nets import gemm

# (rows, fan in, fan out): a critic's input layer on Pendulum, the classic suite's 128-wide
# hidden layer, a 256-wide one (SAC, TD3 on MuJoCo), DDPG's 400 -> 300
LAYERS = [(128, 3, 128), (128, 128, 128), (256, 256, 256), (256, 400, 300)]


@pytest.mark.skipif(not gemm._onednn_available(), reason="this torch build has no oneDNN")
@pytest.mark.parametrize("kernel", ["mkl", "onednn"])
@pytest.mark.parametrize("rows,fan_in,fan_out", LAYERS, ids=lambda value: str(value))
def test_linear_forward(benchmark, kernel, rows, fan_in, fan_out):
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(rows, fan_in, generator=generator)
    weight = torch.randn(fan_out, fan_in, generator=generator)
    bias = torch.randn(fan_out, generator=generator)
    if kernel == "mkl":
        benchmark(F.linear, inputs, weight, bias)
    else:
        benchmark(gemm._product, inputs, weight, bias)
