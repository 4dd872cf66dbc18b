"""How N seeds should share one process: stacked networks against ``torch.func.vmap``.

Issue 27 asked for each loss to be written once and used for any number of seeds, by one of
two means, measured on CPU and GPU before choosing:

* **stacked** (chosen): the losses are written over a leading seed dimension (S, B, ...); one
  run evaluates them with its own networks (S = 1), a batch of seeds with ``agents.nets.stacked``
  networks, whose layers are batched matrix products over the seeds' stacked weights;
* **vmap**: the loss written for one seed, mapped over stacked parameters with
  ``torch.func.vmap`` and ``functional_call``.

This script times one update step of each, for SAC (256x256 critics and actor, batch 256:
compute-bound) and PPO (64x64 networks, minibatch 64: per-op overhead), at N = 1, 3, 10 (and
30 on a GPU), against today's single-seed step. The vmap losses below are restated here for the
measurement only (noise drawn outside, the same arithmetic as ``agents.algos.sac`` and
``agents.algos.ppo``); the algorithms do not use them.

    python microbenchmarks/seed_batching.py [cpu|cuda] [--counts 1 3 10] [--output results/perf/seed_batching-cpu.json]

Run it on an idle machine, one torch thread (as the suite's runs).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.func import functional_call, stack_module_state, vmap

import agents
from agents.algos.seeds import clip_per_seed, stack_batches
from agents.envs import env_spec


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _milliseconds(step: Callable[[], Any], repeats: int, device: torch.device) -> float:
    """Mean wall time of ``step`` in ms after warm-up steps."""
    for _ in range(10):
        step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    _sync(device)
    return (time.perf_counter() - start) / repeats * 1e3


def _members(algo: str, count: int, device: torch.device) -> list[Any]:
    members = []
    for seed in range(count):
        torch.manual_seed(seed)
        members.append(agents.make(algo, env_spec("HalfCheetah-v5"), agents.resolve_config(algo, {}), total_steps=10**6, seed=seed, device=device))
    return members


def _single_run(algo: str, batch: dict[str, torch.Tensor], repeats: int, device: torch.device) -> float:
    """ms of one run's update step (``compute_gradients`` and ``apply_gradients``) on ``batch``."""
    single = _members(algo, 1, device)[0]

    def step() -> None:
        gradients, _ = single.compute_gradients(batch)
        single.apply_gradients(gradients)

    return _milliseconds(step, repeats, device)


# -- SAC ---------------------------------------------------------------------------------------


def _sac_batch(shape: tuple[int, ...], device: torch.device) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    batch = {
        "obs": torch.randn(*shape, 17, generator=generator),
        "next_obs": torch.randn(*shape, 17, generator=generator),
        "actions": torch.rand(*shape, 6, generator=generator) * 2 - 1,
        "rewards": torch.randn(*shape, generator=generator),
        "discounts": torch.full(shape, 0.99),
        "terminated": torch.zeros(shape),
        "weights": torch.ones(shape),
    }
    return {key: value.to(device) for key, value in batch.items()}


def _sac_vmap_loss(member: Any) -> Callable[..., tuple[torch.Tensor, ...]]:
    actor, critic, target, target_entropy = member.actor, member.critic, member.critic_target, member.target_entropy

    def loss(actor_params, critic_params, target_params, log_alpha, batch, next_noise, noise):
        alpha = log_alpha.exp().detach()
        next_dist = functional_call(actor, actor_params, (batch["next_obs"],))
        next_actions, next_log_probs = next_dist.rsample_with_log_prob(next_noise)
        next_q = functional_call(target, target_params, (batch["next_obs"], next_actions)).min(dim=0).values
        targets = (batch["rewards"] + batch["discounts"] * (1 - batch["terminated"]) * (next_q - alpha * next_log_probs)).detach()
        q_values = functional_call(critic, critic_params, (batch["obs"], batch["actions"]))
        critic_loss = ((q_values - targets).pow(2) * batch["weights"]).mean(-1).sum()
        dist = functional_call(actor, actor_params, (batch["obs"],))
        actions, log_probs = dist.rsample_with_log_prob(noise)
        frozen = {key: value.detach() for key, value in critic_params.items()}
        actor_loss = (alpha * log_probs - functional_call(critic, frozen, (batch["obs"], actions)).min(dim=0).values).mean()
        alpha_loss = -(log_alpha * (log_probs.detach() + target_entropy)).mean()
        return critic_loss, actor_loss, alpha_loss

    return loss


def measure_sac(counts: list[int], device: torch.device) -> dict[str, float]:
    rows = {"single": _single_run("sac", _sac_batch((256,), device), 50, device)}
    for count in counts:
        members = _members("sac", count, device)
        stacked_batch = _sac_batch((count, 256), device)
        seed_batch = type(members[0]).seed_batch(members)

        def stacked_step() -> None:
            gradients, logs = seed_batch.compute_gradients(stacked_batch)
            seed_batch.apply_gradients(gradients)
            logs["critic_loss"].cpu()

        rows[f"stacked N={count}"] = _milliseconds(stacked_step, 30, device)
        actor_params = stack_module_state([member.actor for member in members])[0]
        critic_params = stack_module_state([member.critic for member in members])[0]
        target_params = {key: value.detach() for key, value in stack_module_state([member.critic_target for member in members])[0].items()}
        log_alpha = torch.stack([member.log_alpha.detach() for member in members]).requires_grad_(True)
        groups = [list(critic_params.values()), list(actor_params.values()), [log_alpha]]
        optimizers = [torch.optim.Adam(group, 3e-4) for group in groups]
        mapped = vmap(_sac_vmap_loss(members[0]))

        def vmap_step() -> None:
            noises = torch.randn(2, count, 256, 6, device=device)
            losses = mapped(actor_params, critic_params, target_params, log_alpha, stacked_batch, noises[0], noises[1])
            gradients = [torch.autograd.grad(loss.sum(), group, retain_graph=True) for loss, group in zip(losses, groups)]
            for group, group_gradients, optimizer in zip(groups, gradients, optimizers):
                for parameter, gradient in zip(group, group_gradients):
                    parameter.grad = gradient
                optimizer.step()
            with torch.no_grad():
                for key in target_params:
                    target_params[key].lerp_(critic_params[key], 0.005)
            losses[0].detach().cpu()

        rows[f"vmap N={count}"] = _milliseconds(vmap_step, 30, device)
    return rows


# -- PPO ---------------------------------------------------------------------------------------


def _ppo_minibatch(seed: int, device: torch.device) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    batch = {
        "obs": torch.randn(64, 17, generator=generator),
        "actions": torch.randn(64, 6, generator=generator),
        "log_probs": torch.randn(64, generator=generator) - 8,
        "advantages": torch.randn(64, generator=generator),
        "values": torch.randn(64, generator=generator),
        "returns": torch.randn(64, generator=generator),
        "dist_params": torch.randn(64, 12, generator=generator),
    }
    return {key: value.to(device) for key, value in batch.items()}


def _ppo_vmap_loss(member: Any) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    network, clip, value_coef = member.actor_critic, member.config.clip_range, member.config.value_coef

    def loss(params, batch):
        outputs, values, _ = functional_call(network, params, (batch["obs"],))
        dist = network.distribution(outputs)
        advantages = (batch["advantages"] - batch["advantages"].mean()) / (batch["advantages"].std() + 1e-8)
        log_ratio = dist.log_prob(batch["actions"]) - batch["log_probs"]
        ratio = log_ratio.exp()
        policy_loss = -torch.min(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages).mean()
        value_loss = 0.5 * (values - batch["returns"]).pow(2).mean()
        return policy_loss + value_coef * value_loss, ((ratio - 1) - log_ratio).mean().detach()

    return loss


def measure_ppo(counts: list[int], device: torch.device) -> dict[str, float]:
    rows = {"single": _single_run("ppo", _ppo_minibatch(0, device), 200, device)}
    for count in counts:
        members = _members("ppo", count, device)
        stacked_batch = stack_batches([_ppo_minibatch(seed, device) for seed in range(count)])
        seed_batch = type(members[0]).seed_batch(members)

        def stacked_step() -> None:
            loss, logs = members[0].seeds_loss(seed_batch.network, stacked_batch)
            seed_batch.step(loss)
            logs["policy_loss"].cpu()

        rows[f"stacked N={count}"] = _milliseconds(stacked_step, 100, device)
        params = stack_module_state([member.actor_critic for member in members])[0]
        tensors = list(params.values())
        optimizer = torch.optim.Adam(tensors, 3e-4, eps=1e-5)
        mapped = vmap(_ppo_vmap_loss(members[0]))

        def vmap_step() -> None:
            loss, approx_kl = mapped(params, stacked_batch)
            for tensor, gradient in zip(tensors, torch.autograd.grad(loss.sum(), tensors)):
                tensor.grad = gradient.contiguous()
            clip_per_seed([tensor.grad for tensor in tensors], count, 0.5)
            optimizer.step()
            approx_kl.cpu()

        rows[f"vmap N={count}"] = _milliseconds(vmap_step, 100, device)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("device", nargs="?", default="cpu")
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 3, 10])
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    results = {"sac": measure_sac(args.counts, device), "ppo": measure_ppo(args.counts, device)}
    for algo, rows in results.items():
        print(f"{algo}: one update step, ms (ms per seed)")
        for name, milliseconds in rows.items():
            count = int(name.split("=")[1]) if "=" in name else 1
            print(f"  {name:<14} {milliseconds:8.3f}  ({milliseconds / count:7.3f})")
    if args.output is not None:
        machine = {
            "device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        }
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"machine": machine, "milliseconds_per_step": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
