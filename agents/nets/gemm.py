"""The linear layers' matrix products on the CPU: torch's default kernel (MKL) or oneDNN.

torch multiplies float32 matrices on the CPU with MKL, which picks its code path by CPU vendor
and leaves AVX-512 unused on AMD processors: on an AMD EPYC with AVX-512 (family 26), one core
multiplied 256x256 by 256x256 at 107 GFLOPS with MKL and at 217 with oneDNN, the other matrix
library torch ships (``torch.ops.mkldnn._linear_pointwise``; XLA, under Stable Baselines Jax,
multiplies at the same rate). A SAC or TD3 update is mostly such products (forward and both
backward products of every 256- or 400-wide layer): oneDNN takes about half their time there.
On an AMD EPYC without AVX-512 (family 25, model 1: AVX2) MKL is the faster at every size
(256x256 by 256x256: 90 GFLOPS against 79; 128 rows through a 128 -> 128 layer: 53 us against
76), and TD3's first 4,000 steps on Pendulum-v1 took 10.9-12.4 CPU seconds with MKL, 19.5 with
oneDNN (2026-11-29).

``REPRORL_CPU_GEMM`` picks the kernel: ``onednn``, ``mkl`` (whatever torch's own matmul uses),
or ``auto`` (the default: oneDNN on AMD x86 CPUs with AVX-512 where torch's build has it, else
torch's own).
oneDNN takes only float32 layers on the CPU with at least ``ONEDNN_MIN_OUT`` outputs and
``ONEDNN_MIN_ROWS`` rows: narrower layers (a value head, PPO's 64-wide layers) and smaller
batches (acting) are faster with MKL (a 256 -> 1 head's forward and backward on 256 rows: 113 us
with oneDNN, 39 with MKL).

The oneDNN path has no forward-mode derivative and no ``torch.func`` transform rule
(``functional_call`` works; ``torch.func.grad``, ``vmap`` and ``forward_ad`` do not): set
``REPRORL_CPU_GEMM=mkl`` for code that needs them.

Both kernels are deterministic, and each run of a machine gives the same bits with either; the
two differ from each other in the last bits (their summation orders), as two CPU types do.
``kernel()`` names the one in use (runs record it).
"""

from __future__ import annotations

import platform
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F

from agents import settings

ONEDNN_MIN_OUT = 128
"""The narrowest layer (output features) oneDNN multiplies; narrower ones use torch's matmul."""
ONEDNN_MIN_ROWS = 16
"""The fewest rows (inputs in a batch) oneDNN multiplies: acting on a few observations is
faster with MKL (one observation through a 256 -> 256 layer: 14 us against 5)."""


def _onednn_available() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


@lru_cache(maxsize=1)
def kernel() -> str:
    """'onednn' or 'mkl' (torch's own matmul): the CPU kernel of this process's large layers."""
    wanted = settings.cpu_gemm()
    if wanted == "auto":
        amd = platform.machine() in ("x86_64", "AMD64") and settings.cpu_info("vendor_id") == "AuthenticAMD"
        wanted = "onednn" if amd and "avx512f" in settings.cpu_info("flags").split() else "mkl"
    if wanted == "onednn" and not _onednn_available():
        return "mkl"
    return wanted


def _onednn(inputs: torch.Tensor, weight: torch.Tensor, rows: int) -> bool:
    return (
        weight.shape[-2] >= ONEDNN_MIN_OUT
        and rows >= ONEDNN_MIN_ROWS
        and inputs.device.type == "cpu"
        and inputs.dtype == weight.dtype == torch.float32
        and kernel() == "onednn"
        and bool(torch.backends.mkldnn.enabled)  # (``torch.backends.mkldnn.flags(enabled=False)`` turns it off)
    )


def _product(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """inputs (B, in) @ weight (out, in)^T + bias, by oneDNN. Strided and transposed inputs and
    weights are read as they are; a bias must be contiguous (oneDNN reads it as if it were)."""
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    return torch.ops.mkldnn._linear_pointwise(inputs, weight, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    """y = x W^T + b with oneDNN for the forward and both backward products. The backward is
    built from this function itself, so that it differentiates again (TRPO's and MAML's
    second-order terms)."""

    @staticmethod
    def forward(ctx, inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # (the forward that takes ctx: one with setup_context costs an inspect.signature per call)
        ctx.save_for_backward(inputs, weight)
        return _product(inputs, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        wanted_x, wanted_weight, wanted_bias = _wanted(ctx)
        grad_x = _OneDNNLinear.apply(grad, weight.t(), None) if wanted_x else None  # grad @ W
        grad_weight = _OneDNNLinear.apply(grad.t(), x.t(), None) if wanted_weight else None  # grad^T @ x
        grad_bias = grad.sum(0) if wanted_bias else None
        return grad_x, grad_weight, grad_bias


def _wanted(ctx) -> tuple[bool, ...]:
    """Which inputs' gradients this backward pass uses. ``needs_input_grad`` says which inputs
    require one; the engine knows which of them it will pass on: ``autograd.grad`` of an actor's
    loss through the critics wants no critic weight gradient (torch's own layers skip those too)."""
    edges = [node for node, _ in ctx.next_functions]
    edges += [None] * (len(ctx.needs_input_grad) - len(edges))  # a bias of None has no edge
    return tuple(bool(needed) and node is not None and _will_execute(node) for needed, node in zip(ctx.needs_input_grad, edges))


def _will_execute(node: Any) -> bool:
    try:
        return bool(torch._C._will_engine_execute_node(node))
    except (RuntimeError, AttributeError):  # a leaf that autograd.grad captures (one asked for), or a torch without the query
        return True


def linear(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``: inputs (..., in), weight (out, in), bias (out,) -> (..., out), by the kernel
    this module picks."""
    if weight.shape[0] < ONEDNN_MIN_OUT or not _onednn(inputs, weight, inputs.numel() // max(inputs.shape[-1], 1)):  # (narrow: the cheapest no)
        return F.linear(inputs, weight, bias)
    flat = inputs.reshape(-1, inputs.shape[-1])
    product = _OneDNNLinear.apply if _differentiated(inputs, weight, bias) else _product
    return product(flat, weight, bias).view(*inputs.shape[:-1], weight.shape[0])


def _differentiated(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd records this product (else the op is called without a node: acting,
    targets and evaluation skip ``autograd.Function``'s few microseconds)."""
    return torch.is_grad_enabled() and any(tensor is not None and tensor.requires_grad for tensor in tensors)


def stacked_linear(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """K linear layers, each on its own inputs: inputs (K, B, in), weight (K, out, in), bias
    (K, out) -> (K, B, out). With oneDNN, copy k gives the bits ``linear(inputs[k], weight[k],
    bias[k])`` gives; torch's ``baddbmm`` matches ``F.linear`` to the bit for the layers tested
    here but not for every shape (a 256 -> 1 head differs by about 1e-7)."""
    if not _onednn(inputs, weight, inputs.shape[1]):
        return torch.baddbmm(bias.unsqueeze(1), inputs, weight.transpose(1, 2))
    product = _OneDNNLinear.apply if _differentiated(inputs, weight, bias) else _product
    # unbind, not indexing: the backward of K selections would add K zero-filled (K, ...) tensors
    copies = zip(inputs.unbind(0), weight.unbind(0), bias.unbind(0), strict=True)
    return torch.stack([product(x, w, b) for x, w, b in copies])
