"""The CPU kernels of the networks' linear layers (``agents.nets.gemm``): oneDNN and torch's own
give the same products up to float32 rounding, each deterministically, stacked copies the bits
of single layers, and the backward differentiates again."""

import pytest
import torch
import torch.nn.functional as F
from conftest import run_cli_subprocess

from agents.errors import ConfigError
from agents.nets import gemm

needs_onednn = pytest.mark.skipif(not gemm._onednn_available(), reason="this torch build has no oneDNN")


@pytest.fixture
def use_kernel(monkeypatch):
    """Pick the kernel for the test (the choice is made once per process: forgotten after)."""

    def use(name: str) -> str:
        monkeypatch.setenv("REPRORL_CPU_GEMM", name)
        gemm.kernel.cache_clear()
        return gemm.kernel()

    yield use
    gemm.kernel.cache_clear()


def _layer(batch: int, fan_in: int, fan_out: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, fan_in, generator=generator).requires_grad_()
    weight = torch.randn(fan_out, fan_in, generator=generator).div(fan_in**0.5).requires_grad_()
    bias = torch.randn(fan_out, generator=generator).requires_grad_()
    return x, weight, bias


@needs_onednn
def test_onednn_products_and_gradients_equal_torchs_up_to_rounding(use_kernel):
    assert use_kernel("onednn") == "onednn"
    x, weight, bias = _layer(64, 23, 256)
    x3 = x.detach().view(4, 16, 23).requires_grad_()  # leading dimensions are kept
    ours, reference = gemm.linear(x3, weight, bias), F.linear(x3, weight, bias)
    assert ours.shape == (4, 16, 256)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)
    loss = lambda out: (out.square() * torch.linspace(0, 1, 256)).sum()  # noqa: E731 - distinct gradients per output
    first = torch.autograd.grad(loss(ours), [x3, weight, bias], create_graph=True)
    expected = torch.autograd.grad(loss(reference), [x3, weight, bias], create_graph=True)
    for got, want in zip(first, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    # second order (TRPO's Fisher-vector products, MAML's meta-gradient)
    second = torch.autograd.grad(first[1].square().sum(), [x3, weight])
    second_expected = torch.autograd.grad(expected[1].square().sum(), [x3, weight])
    for got, want in zip(second, second_expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)


@needs_onednn
def test_each_kernel_is_deterministic_and_stacked_copies_give_the_single_layers_bits(use_kernel):
    for name in ("onednn", "mkl"):
        use_kernel(name)
        x, weight, bias = _layer(256, 256, 256)
        assert torch.equal(gemm.linear(x, weight, bias), gemm.linear(x.clone(), weight.clone(), bias.clone()))
        inputs, weights, biases = torch.randn(3, 32, 23), torch.randn(3, 256, 23), torch.randn(3, 256)
        stacked = gemm.stacked_linear(inputs, weights, biases)
        for k in range(3):
            assert torch.equal(stacked[k], gemm.linear(inputs[k], weights[k], biases[k])), (name, k)


@needs_onednn
def test_narrow_layers_small_batches_and_other_dtypes_keep_torchs_kernel(use_kernel):
    use_kernel("onednn")
    x, weight, bias = _layer(64, 256, gemm.ONEDNN_MIN_OUT - 1)
    assert torch.equal(gemm.linear(x, weight, bias), F.linear(x, weight, bias))
    x, weight, bias = _layer(gemm.ONEDNN_MIN_ROWS - 1, 256, 256)  # acting on a few observations
    assert torch.equal(gemm.linear(x, weight, bias), F.linear(x, weight, bias))
    x, weight, bias = (t.detach().double() for t in _layer(32, 16, 256))
    assert torch.equal(gemm.linear(x, weight, bias), F.linear(x, weight, bias))
    assert use_kernel("mkl") == "mkl"
    x, weight, bias = _layer(64, 256, 256)
    assert torch.equal(gemm.linear(x, weight, bias), F.linear(x, weight, bias))


def test_the_kernel_setting_is_checked(use_kernel, monkeypatch):
    assert use_kernel("auto") in ("onednn", "mkl")
    monkeypatch.setenv("REPRORL_CPU_GEMM", "cublas")
    gemm.kernel.cache_clear()
    with pytest.raises(ConfigError, match="REPRORL_CPU_GEMM must be one of auto, onednn, mkl, not 'cublas'"):
        gemm.kernel()


@needs_onednn
@pytest.mark.parametrize(
    "vendor,flags,machine,expected",
    [
        ("AuthenticAMD", "fpu avx avx2 avx512f avx512bw", "x86_64", "onednn"),  # MKL leaves AVX-512 unused on AMD
        ("AuthenticAMD", "fpu avx avx2", "x86_64", "mkl"),  # AVX2 only: MKL is the faster
        ("GenuineIntel", "fpu avx avx2 avx512f", "x86_64", "mkl"),
        ("", "", "arm64", "mkl"),
    ],
)
def test_auto_takes_onednn_on_amd_cpus_with_avx512_only(use_kernel, monkeypatch, vendor, flags, machine, expected):
    fields = {"vendor_id": vendor, "flags": flags}
    monkeypatch.setattr(gemm.settings, "cpu_info", lambda field: fields.get(field, ""))
    monkeypatch.setattr(gemm.platform, "machine", lambda: machine)
    assert use_kernel("auto") == expected


def test_a_bad_kernel_setting_is_refused_in_one_line_before_anything_runs(tiny_suite, tmp_path, monkeypatch):
    monkeypatch.setenv("REPRORL_CPU_GEMM", "onedn")
    completed = run_cli_subprocess("run", "--suite", str(tiny_suite), "--results-dir", str(tmp_path / "results"))
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == ["error: REPRORL_CPU_GEMM must be one of auto, onednn, mkl, not 'onedn' (did you mean 'onednn'?)"]
    assert not (tmp_path / "results").exists()


@needs_onednn
def test_the_backward_computes_only_the_gradients_the_engine_passes_on(use_kernel, monkeypatch):
    """An actor's loss differentiated through the critics wants no critic weight gradient: the
    oneDNN backward skips that product, as torch's own layers do."""
    use_kernel("onednn")
    products = []
    product = gemm._product
    monkeypatch.setattr(gemm, "_product", lambda *args: products.append(args[1].shape) or product(*args))
    x, weight, bias = _layer(32, 23, 256)
    inputs = x * 1.0  # not a leaf: its gradient flows on
    torch.autograd.grad(gemm.linear(inputs, weight, bias).sum(), [x])
    assert products == [(256, 23), (23, 256)]  # the forward, then grad @ W alone
    products.clear()
    torch.autograd.grad(gemm.linear(x * 1.0, weight, bias).sum(), [weight])  # a captured leaf: its gradient alone
    assert products == [(256, 23), (23, 32)]  # the forward, then grad^T @ x
    products.clear()
    gemm.linear(x * 1.0, weight, bias).sum().backward()
    assert len(products) == 3 and weight.grad is not None and bias.grad is not None and x.grad is not None


@needs_onednn
def test_any_bias_layout_and_no_grad_give_the_same_products(use_kernel):
    """oneDNN reads a bias as if it were contiguous: an expanded or strided one is copied first;
    without autograd the op runs without a node, with the same bits."""
    use_kernel("onednn")
    x, weight, _ = _layer(64, 32, 256)
    for bias in (torch.randn(1).expand(256), torch.randn(512)[::2]):
        torch.testing.assert_close(gemm.linear(x, weight, bias), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    bias = torch.randn(256)
    with torch.no_grad():
        quiet = gemm.linear(x, weight, bias)
        quiet_stacked = gemm.stacked_linear(x.expand(2, 64, 32), weight.expand(2, 256, 32), bias.expand(2, 256))
    recorded = gemm.linear(x, weight, bias)
    assert recorded.grad_fn is not None and quiet.grad_fn is None
    assert torch.equal(quiet, recorded) and torch.equal(quiet_stacked[1], recorded)
