"""Natural-gradient building blocks: conjugate gradient and Fisher-vector products.

TRPO (Schulman, Levine, Moritz, Jordan, Abbeel 2015, "Trust Region Policy Optimization",
App. C) solves F x = g for the search direction without forming the Fisher matrix F: conjugate
gradient needs only products F v, and F v is the Hessian-vector product of the mean KL
divergence between the old and the current policy at the old parameters (two backward passes).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenate tensors into one vector (P,)."""
    return torch.cat([t.reshape(-1) for t in tensors])


def conjugate_gradient(
    matrix_vector_product: Callable[[torch.Tensor], torch.Tensor],
    b: torch.Tensor,
    iterations: int = 10,
    residual_tolerance: float = 1e-10,
) -> torch.Tensor:
    """Approximately solve A x = b for symmetric positive-definite A given only v -> A v.

    Nocedal and Wright (2006), Algorithm 5.2, from x = 0; stops early once the squared
    residual norm falls below ``residual_tolerance``. Exact after dim(b) iterations in exact
    arithmetic.
    """
    x = torch.zeros_like(b)
    residual = b.clone()
    direction = b.clone()
    residual_norm = residual.dot(residual)
    for _ in range(iterations):
        if residual_norm < residual_tolerance:
            break
        product = matrix_vector_product(direction)
        step = residual_norm / direction.dot(product)
        x += step * direction
        residual -= step * product
        new_residual_norm = residual.dot(residual)
        direction = residual + (new_residual_norm / residual_norm) * direction
        residual_norm = new_residual_norm
    return x


def fisher_vector_product(
    mean_kl: torch.Tensor, parameters: Sequence[torch.nn.Parameter], damping: float = 0.0
) -> Callable[[torch.Tensor], torch.Tensor]:
    """v -> (F + damping I) v, with F the Hessian of ``mean_kl`` w.r.t. ``parameters``.

    ``mean_kl`` is KL(pi_old || pi_theta) averaged over states, computed with pi_old detached
    so that it and its gradient vanish at theta = theta_old, where its Hessian is the Fisher
    information matrix. The first backward pass is kept, so each product costs one more.
    """
    gradients = flatten(torch.autograd.grad(mean_kl, parameters, create_graph=True))

    def product(vector: torch.Tensor) -> torch.Tensor:
        hessian_vector = torch.autograd.grad(gradients.dot(vector), parameters, retain_graph=True)
        return flatten(hessian_vector) + damping * vector

    return product
