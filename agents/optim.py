"""Optimizer building blocks: Adam on its fused kernel; conjugate gradient and Fisher-vector products.

TRPO (Schulman, Levine, Moritz, Jordan, Abbeel 2015, "Trust Region Policy Optimization",
App. C) solves F x = g for the search direction without forming the Fisher matrix F: conjugate
gradient needs only products F v, and F v is the Hessian-vector product of the mean KL
divergence between the old and the current policy at the old parameters (two backward passes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import torch
from torch.optim import optimizer as optimizer_module
from torch.optim.optimizer import Optimizer

FUSED_DEVICES = ("cpu", "cuda")

#: per parameter group of a FusedAdam: (params, exp_avgs, exp_avg_sqs, steps)
TensorLists = list[tuple[list[torch.Tensor], ...]]


def adam(parameters: Iterable[torch.Tensor], lr: float, **kwargs: Any) -> torch.optim.Adam:
    """``torch.optim.Adam`` on PyTorch's fused kernel wherever it has one (floating-point
    parameters on CPU or CUDA; a :class:`FusedAdam`), else its default implementation. The
    arithmetic is Adam's either way; on the small networks of RL the fused step is about three
    times faster on CPU (one kernel per step instead of about ten ops per tensor)."""
    parameters = list(parameters)
    fused = bool(parameters) and all(p.device.type in FUSED_DEVICES and p.dtype.is_floating_point for p in parameters)
    if fused:
        return FusedAdam(parameters, lr=lr, **kwargs)
    return torch.optim.Adam(parameters, lr=lr, **kwargs)


class FusedAdam(torch.optim.Adam):
    """``torch.optim.Adam(fused=True)`` whose steps, once its state exists, call the fused kernel
    directly on tensor lists gathered once.

    ``Optimizer.step`` spends about 40 us in Python per call (grouping tensors by device,
    checking every parameter's state, profiler and hook bookkeeping) against about 7 us in the
    kernel for a 64x64 network. The kernel, its arguments and
    hence every parameter are exactly those of the parent's step (a test checks bit equality);
    the parent's step still runs for the first step, a closure, hooks, a missing gradient, a
    tensor learning rate, amsgrad or parameters spread over devices or dtypes, and after
    ``load_state_dict`` or ``add_param_group``. State dicts are the parent's."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, **kwargs: Any):
        super().__init__(params, lr=lr, fused=True, **kwargs)
        self._tensor_lists: TensorLists | None = None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The parent's, then fused again: a state saved by an unfused Adam (an older checkpoint)
        brings ``fused=None`` into the groups and its step counts on the CPU, where the fused
        kernel wants them on the parameter's device."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            group["fused"] = True
            for parameter in group["params"]:
                state = self.state.get(parameter)
                if state and "step" in state:
                    state["step"] = torch.as_tensor(state["step"], dtype=torch.float32).to(parameter.device)
        self._tensor_lists = None

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        self._tensor_lists = None

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        self._contiguous_gradients()
        if closure is None and self._direct_step_possible():
            # _direct_step_possible: the lists are gathered and every parameter has its gradient
            with torch.no_grad():
                for group, (params, exp_avgs, exp_avg_sqs, steps) in zip(self.param_groups, cast("TensorLists", self._tensor_lists)):
                    beta1, beta2 = group["betas"]
                    torch._foreach_add_(steps, 1)
                    torch._fused_adam_(
                        params,
                        cast("list[torch.Tensor]", [p.grad for p in params]),
                        exp_avgs,
                        exp_avg_sqs,
                        [],
                        steps,
                        amsgrad=False,
                        lr=group["lr"],
                        beta1=beta1,
                        beta2=beta2,
                        weight_decay=group["weight_decay"],
                        eps=group["eps"],
                        maximize=group["maximize"],
                        grad_scale=None,
                        found_inf=None,
                    )
            return None
        # the parent's step as torch runs it: with the profiler label and the step hooks
        parent = torch.optim.Adam.step
        parent = getattr(parent, "__wrapped__", parent) if getattr(parent, "hooked", False) else parent
        loss = Optimizer.profile_hook_step(parent)(self, closure)
        self._tensor_lists = self._gather()
        return loss

    step.hooked = True  # type: ignore[attr-defined]  # Optimizer.__init__ must not wrap it: the direct path has no hooks to run

    def _contiguous_gradients(self) -> None:
        """The fused kernel reads a gradient as if it were laid out like its parameter (torch
        2.13 on the CPU): a non-contiguous one, such as ``autograd.grad`` returns for a weight
        used transposed, would be read permuted. Such gradients are made contiguous first."""
        for group in self.param_groups:
            for parameter in group["params"]:
                gradient = parameter.grad
                if gradient is not None and not gradient.is_contiguous():
                    parameter.grad = gradient.contiguous()

    def _direct_step_possible(self) -> bool:
        lists = getattr(self, "_tensor_lists", None)  # a pickled optimizer comes back without it
        return (
            lists is not None
            and not (
                self._optimizer_step_pre_hooks
                or self._optimizer_step_post_hooks
                or optimizer_module._global_optimizer_pre_hooks
                or optimizer_module._global_optimizer_post_hooks
            )
            # AMP's GradScaler hands the fused step these to unscale and skip infinite steps
            and getattr(self, "grad_scale", None) is None
            and getattr(self, "found_inf", None) is None
            and not any(isinstance(group["lr"], torch.Tensor) for group in self.param_groups)
            and all(p.grad is not None for params, *_ in lists for p in params)
        )

    def _gather(self) -> TensorLists | None:
        """Per group (params, exp_avgs, exp_avg_sqs, steps) when every parameter has its state
        and the group is one the direct call reproduces exactly; else None."""
        lists: TensorLists = []
        for group in self.param_groups:
            params = group["params"]
            if (
                not group["fused"]
                or group["amsgrad"]
                or group.get("decoupled_weight_decay", False)
                or group["capturable"]
                or group["differentiable"]
                or any(isinstance(value, torch.Tensor) for value in (*group["betas"], group["eps"], group["weight_decay"]))
                or not params
                or len({(p.device, p.dtype) for p in params}) != 1
                or any(p not in self.state or "exp_avg" not in self.state[p] for p in params)
                or any(self.state[p]["step"].device != p.device for p in params)
            ):
                return None
            states = [self.state[p] for p in params]
            lists.append((list(params), [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [s["step"] for s in states]))
        return lists


def clip_gradients(gradients: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale ``gradients`` in place so their global L2 norm is at most ``max_norm`` (as
    ``torch.nn.utils.clip_grad_norm_``, in four ops whatever their number); the norm before, a
    0-dim tensor (no device sync unless the caller reads it)."""
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(list(gradients))))
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(list(gradients), scale)
    return norm


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenate tensors into one vector (P,)."""
    return torch.cat([t.reshape(-1) for t in tensors])


def flatten_seeds(tensors: Sequence[torch.Tensor], seeds: int) -> torch.Tensor:
    """Each seed's tensors concatenated: (S, P). Tensors are stacked (S, ...) or, for S = 1,
    one run's own (...)."""
    return torch.cat([t.reshape(seeds, -1) for t in tensors], dim=1)


def split_seeds(vector: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The inverse of ``flatten_seeds``: each seed's row of (S, P) cut into tensors shaped as
    ``like`` (stacked (S, ...) or, for S = 1, one run's own (...))."""
    parts, offset = [], 0
    for tensor in like:
        size = tensor.numel() // vector.shape[0]
        parts.append(vector[:, offset : offset + size].reshape(tensor.shape))
        offset += size
    return parts


def conjugate_gradient(
    matrix_vector_product: Callable[[torch.Tensor], torch.Tensor],
    b: torch.Tensor,
    iterations: int = 10,
    residual_tolerance: float = 1e-10,
) -> torch.Tensor:
    """Approximately solve A x = b for symmetric positive-definite A given only v -> A v, for
    every row of b (S, P) at once (A block-diagonal over the rows: the seeds' systems), or b (P,).

    Nocedal and Wright (2006), Algorithm 5.2, from x = 0; a row stops once its squared residual
    norm falls below ``residual_tolerance``. Exact after dim(b) iterations in exact arithmetic.
    """
    x = torch.zeros_like(b)
    residual = b.clone()
    direction = b.clone()
    residual_norm = (residual * residual).sum(-1, keepdim=True)
    for _ in range(iterations):
        going = residual_norm >= residual_tolerance
        if not going.any():
            break
        product = matrix_vector_product(direction)
        step = torch.where(going, residual_norm / (direction * product).sum(-1, keepdim=True), torch.zeros_like(residual_norm))
        x += step * direction
        residual -= step * product
        new_residual_norm = (residual * residual).sum(-1, keepdim=True)
        direction = torch.where(going, residual + (new_residual_norm / residual_norm) * direction, direction)
        residual_norm = torch.where(going, new_residual_norm, residual_norm)
    return x


def fisher_vector_product(mean_kl: torch.Tensor, parameters: Sequence[torch.Tensor], damping: float = 0.0) -> Callable[[torch.Tensor], torch.Tensor]:
    """v -> (F + damping I) v, with F the Hessian of ``mean_kl`` w.r.t. ``parameters``, for each
    seed: mean_kl (S,) and v (S, P) (the seeds share no parameter, so F is block-diagonal), or
    mean_kl () and v (P,).

    ``mean_kl`` is KL(pi_old || pi_theta) averaged over states, computed with pi_old detached
    so that it and its gradient vanish at theta = theta_old, where its Hessian is the Fisher
    information matrix. The first backward pass is kept, so each product costs one more.
    """
    seeds = mean_kl.numel()
    gradients = flatten_seeds(torch.autograd.grad(mean_kl.sum(), parameters, create_graph=True), seeds)

    def product(vector: torch.Tensor) -> torch.Tensor:
        hessian_vector = torch.autograd.grad((gradients * vector.reshape(seeds, -1)).sum(), parameters, retain_graph=True)
        return flatten_seeds(hessian_vector, seeds).reshape(vector.shape) + damping * vector

    return product


def trust_region_step(
    surrogate: torch.Tensor,
    mean_kl: torch.Tensor,
    parameters: Sequence[torch.Tensor],
    max_kl: float,
    cg_iterations: int,
    damping: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The full step s of TRPO's quadratic model and the surrogate's gradient g: (S, P) each
    for per-seed surrogates and KLs (S,), or (P,) for scalars.

    x = F^-1 g by conjugate gradient; s = sqrt(2 max_kl / x^T F x) x, the step along x whose
    quadratic KL model equals max_kl. Both graphs (``surrogate``, ``mean_kl``) are kept.
    """
    seeds = surrogate.numel()
    gradient = flatten_seeds(torch.autograd.grad(surrogate.sum(), parameters, retain_graph=True), seeds)
    if surrogate.dim() == 0:
        gradient = gradient[0]
    fisher_product = fisher_vector_product(mean_kl, parameters, damping)
    direction = conjugate_gradient(fisher_product, gradient, cg_iterations)
    curvature = (direction * fisher_product(direction)).sum(-1, keepdim=True).clamp_min(1e-12)  # x^T F x
    return (torch.sqrt(2 * max_kl / curvature) * direction).detach(), gradient.detach()


@torch.no_grad()
def assign_flat(parameters: Sequence[torch.Tensor], vector: torch.Tensor) -> None:
    """Write a flat vector (P,), or each seed's row of (S, P), into ``parameters``, in order."""
    offset = 0
    for parameter in parameters:
        size = parameter.numel() // (vector.shape[0] if vector.dim() == 2 else 1)
        parameter.copy_(vector[..., offset : offset + size].reshape(parameter.shape))
        offset += size


def backtracking_line_search(
    parameters: Sequence[torch.Tensor],
    objective: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    full_step: torch.Tensor,
    surrogate_before: torch.Tensor | float,
    max_kl: float,
    shrink: float,
    max_steps: int,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The first of shrink^j * ``full_step`` (j < max_steps) whose (surrogate, mean KL) from
    ``objective()`` improves the surrogate within the KL bound; zeros if none. The parameters
    are left as they were. Per seed when ``full_step`` is (S, P) and ``objective()`` gives (S,)
    tensors (each seed accepts its own first fraction; the info is then (S,) tensors), else for
    one run (P,) with float info."""
    single = full_step.dim() == 1
    steps = full_step.reshape(1, -1) if single else full_step
    seeds = steps.shape[0]
    start = flatten_seeds([p.detach() for p in parameters], seeds).clone()
    before = torch.as_tensor(surrogate_before, dtype=steps.dtype, device=steps.device).reshape(seeds)
    accepted = torch.zeros_like(steps)
    done = torch.zeros(seeds, dtype=torch.bool, device=steps.device)
    fraction_taken, kl_taken, improvement_taken = (torch.zeros(seeds, device=steps.device) for _ in range(3))
    try:
        for j in range(max_steps):
            fraction = shrink**j
            assign_flat(parameters, start + fraction * steps)
            surrogate, mean_kl = objective()
            improvement = surrogate.detach().reshape(seeds) - before
            kl = mean_kl.detach().reshape(seeds)
            newly = ~done & (kl <= max_kl) & (improvement > 0)
            accepted = torch.where(newly[:, None], fraction * steps, accepted)
            fraction_taken = torch.where(newly, torch.full_like(fraction_taken, fraction), fraction_taken)
            kl_taken = torch.where(newly, kl, kl_taken)
            improvement_taken = torch.where(newly, improvement, improvement_taken)
            done |= newly
            if bool(done.all()):
                break
    finally:
        assign_flat(parameters, start)
    info = {"line_search_fraction": fraction_taken, "kl": kl_taken, "surrogate_improvement": improvement_taken}
    if single:
        return accepted[0], {key: float(value[0]) for key, value in info.items()}
    return accepted, info


@torch.no_grad()
def subtract_gradients(parameters: Sequence[torch.nn.Parameter]) -> None:
    """theta <- theta - theta.grad, then clear the gradients (a step stored as minus a gradient)."""
    for parameter in parameters:
        if parameter.grad is not None:
            parameter.sub_(parameter.grad)
            parameter.grad = None
