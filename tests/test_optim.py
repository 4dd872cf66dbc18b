"""Conjugate gradient against a direct solve; Fisher-vector products against the explicit Fisher
matrix; FusedAdam's direct steps against torch's fused Adam, bit for bit."""

import copy

import pytest
import torch

from agents.optim import (
    FusedAdam,
    adam,
    conjugate_gradient,
    fisher_vector_product,
    flatten,
)


def test_conjugate_gradient_matches_a_direct_solve_on_random_spd_matrices():
    generator = torch.Generator().manual_seed(0)
    for size in (3, 10, 25):
        factor = torch.randn(size, size, generator=generator, dtype=torch.float64)
        matrix = factor @ factor.T + 0.1 * torch.eye(size, dtype=torch.float64)
        b = torch.randn(size, generator=generator, dtype=torch.float64)
        x = conjugate_gradient(lambda v: matrix @ v, b, iterations=size * 3, residual_tolerance=1e-20)
        torch.testing.assert_close(x, torch.linalg.solve(matrix, b), rtol=1e-6, atol=1e-8)


def test_conjugate_gradient_with_few_iterations_still_reduces_the_residual():
    generator = torch.Generator().manual_seed(1)
    factor = torch.randn(40, 40, generator=generator, dtype=torch.float64)
    matrix = factor @ factor.T + torch.eye(40, dtype=torch.float64)
    b = torch.randn(40, generator=generator, dtype=torch.float64)
    x = conjugate_gradient(lambda v: matrix @ v, b, iterations=10)
    assert torch.linalg.vector_norm(matrix @ x - b) < 0.5 * torch.linalg.vector_norm(b)


def test_fisher_vector_product_matches_the_explicit_fisher_of_a_tiny_categorical_policy():
    torch.manual_seed(0)
    states = torch.randn(5, 3, dtype=torch.float64)
    policy = torch.nn.Linear(3, 4, dtype=torch.float64)
    parameters = list(policy.parameters())
    old_log_probs = torch.log_softmax(policy(states), dim=-1).detach()

    log_probs = torch.log_softmax(policy(states), dim=-1)
    mean_kl = (old_log_probs.exp() * (old_log_probs - log_probs)).sum(-1).mean()
    product = fisher_vector_product(mean_kl, parameters, damping=0.1)

    # explicit F = mean_s sum_a pi(a|s) grad log pi(a|s) grad log pi(a|s)^T
    size = sum(p.numel() for p in parameters)
    fisher = torch.zeros(size, size, dtype=torch.float64)
    for s in range(5):
        for a in range(4):
            score = flatten(torch.autograd.grad(torch.log_softmax(policy(states[s]), -1)[a], parameters))
            fisher += old_log_probs[s, a].exp() * torch.outer(score, score) / 5
    vector = torch.randn(size, dtype=torch.float64)
    torch.testing.assert_close(product(vector), fisher @ vector + 0.1 * vector)
    torch.testing.assert_close(product(2 * vector), 2 * (fisher @ vector + 0.1 * vector))  # reusable


def _adam_pair(**kwargs):
    """Two copies of a small network: one under torch's fused Adam, one under FusedAdam."""
    torch.manual_seed(0)
    reference_net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    fast_net = copy.deepcopy(reference_net)
    reference = torch.optim.Adam(reference_net.parameters(), fused=True, **kwargs)
    fast = FusedAdam(fast_net.parameters(), **kwargs)
    return reference_net, reference, fast_net, fast


def _count_parent_steps(monkeypatch) -> list[int]:
    """A one-element list counting calls of torch's Adam.step (FusedAdam's fallback path)."""
    calls = [0]
    parent = torch.optim.Adam.step

    def counted(self, *args, **kwargs):
        if isinstance(self, FusedAdam):
            calls[0] += 1
        return parent(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", counted)
    return calls


def _train_step(net, optimizer, inputs):
    optimizer.zero_grad()
    net(inputs).pow(2).mean().backward()
    optimizer.step()


@pytest.mark.parametrize("kwargs", [dict(lr=1e-2), dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-5, weight_decay=0.1, maximize=True)])
def test_fused_adam_direct_steps_match_torch_bit_for_bit(kwargs, monkeypatch):
    reference_net, reference, fast_net, fast = _adam_pair(**kwargs)
    parent_steps = _count_parent_steps(monkeypatch)
    generator = torch.Generator().manual_seed(1)
    for step in range(20):
        inputs = torch.randn(16, 5, generator=generator)
        _train_step(reference_net, reference, inputs)
        _train_step(fast_net, fast, inputs)
        if step == 10:  # a schedule changes the learning rate between steps
            for optimizer in (reference, fast):
                optimizer.param_groups[0]["lr"] *= 0.5
    assert parent_steps == [1]  # only the first step took the parent's path
    for a, b in zip(reference_net.parameters(), fast_net.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(reference.state.values(), fast.state.values()):
        assert all(torch.equal(a[key], b[key]) for key in ("step", "exp_avg", "exp_avg_sq"))


def test_fused_adam_falls_back_where_the_direct_call_would_differ():
    reference_net, reference, fast_net, fast = _adam_pair(lr=1e-2)
    inputs = torch.randn(16, 5)
    for _ in range(3):
        _train_step(reference_net, reference, inputs)
        _train_step(fast_net, fast, inputs)
    # a parameter without a gradient is skipped, as torch does
    hidden = torch.randn(4, 8)
    for net, optimizer in ((reference_net, reference), (fast_net, fast)):
        optimizer.zero_grad()
        net[2](hidden).sum().backward()
        optimizer.step()
    # loading a state dict replaces the state tensors the direct path holds
    fast.load_state_dict(copy.deepcopy(reference.state_dict()))  # as from a checkpoint file
    assert fast._tensor_lists is None
    for _ in range(3):
        _train_step(reference_net, reference, inputs)
        _train_step(fast_net, fast, inputs)
    for a, b in zip(reference_net.parameters(), fast_net.parameters()):
        assert torch.equal(a, b)


def test_adam_is_fused_on_cpu():
    layer = torch.nn.Linear(3, 2)
    assert isinstance(adam(layer.parameters(), lr=1e-3), FusedAdam)
    assert not isinstance(adam([torch.zeros(2, dtype=torch.complex64, requires_grad=True)], lr=1e-3), FusedAdam)


def test_fused_adam_resumes_a_state_saved_by_an_unfused_adam(monkeypatch):
    """An older checkpoint's optimizer state (torch's default Adam: fused=None, CPU step
    counts) loads into a FusedAdam that then continues on the fused kernel, directly, exactly
    as torch's fused Adam continues from the same state."""
    torch.manual_seed(0)
    old_net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    old = torch.optim.Adam(old_net.parameters(), lr=1e-2)
    inputs = torch.randn(16, 5)
    for _ in range(3):
        _train_step(old_net, old, inputs)
    reference_net, fast_net = copy.deepcopy(old_net), copy.deepcopy(old_net)
    reference = torch.optim.Adam(reference_net.parameters(), lr=1e-2, fused=True)
    fast = FusedAdam(fast_net.parameters(), lr=1e-2)
    reference.load_state_dict(copy.deepcopy(old.state_dict()))
    fast.load_state_dict(copy.deepcopy(old.state_dict()))
    for group in reference.param_groups:
        group["fused"] = True  # what torch's own load leaves at None
    parent_steps = _count_parent_steps(monkeypatch)
    for _ in range(4):
        _train_step(reference_net, reference, inputs)
        _train_step(fast_net, fast, inputs)
    assert parent_steps == [1] and all(group["fused"] for group in fast.param_groups)
    for a, b in zip(reference_net.parameters(), fast_net.parameters()):
        assert torch.equal(a, b)
    copied = copy.deepcopy(fast)  # pickling keeps state and groups, not the gathered lists
    copied.step()


def test_fused_adam_runs_step_hooks_once_per_step_on_the_parents_path():
    """Step hooks turn the direct path off: they run once per step, as torch runs them."""
    _, _, net, optimizer = _adam_pair(lr=1e-2)
    calls = []
    optimizer.register_step_pre_hook(lambda *args: calls.append("pre"))
    optimizer.register_step_post_hook(lambda *args: calls.append("post"))
    for _ in range(3):
        _train_step(net, optimizer, torch.randn(4, 5))
    assert calls == ["pre", "post"] * 3


def test_fused_adam_reads_a_non_contiguous_gradient_by_its_strides():
    """torch's fused CPU kernel reads a gradient as laid out like its parameter: the gradient
    of a weight used transposed (what ``autograd.grad`` gives a stacked recurrent cell) must
    step as its contiguous copy does, on the first (parent's) step and on direct ones."""
    torch.manual_seed(0)
    weight = torch.randn(2, 3, 4)
    fused, plain = torch.nn.Parameter(weight.clone()), torch.nn.Parameter(weight.clone())
    ours, reference = adam([fused], lr=0.1), torch.optim.Adam([plain], lr=0.1, foreach=False)
    for _ in range(3):
        gradient = torch.randn(2, 4, 3).transpose(1, 2)
        assert not gradient.is_contiguous()
        fused.grad, plain.grad = gradient, gradient.contiguous()
        ours.step()
        reference.step()
        torch.testing.assert_close(fused.detach(), plain.detach())
