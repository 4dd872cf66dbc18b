"""Conjugate gradient against a direct solve; Fisher-vector products against the explicit Fisher matrix."""

import torch

from agents.optim import conjugate_gradient, fisher_vector_product, flatten


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
