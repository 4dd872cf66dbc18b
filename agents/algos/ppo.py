"""Proximal Policy Optimization: clipped objective, adaptive KL penalty, and the plain surrogate.

Schulman, Wolski, Dhariwal, Radford, Klimov (2017), "Proximal Policy Optimization Algorithms",
arXiv:1707.06347, Algorithm 1 with the objectives of Sec. 3-4 (r_t = pi(a_t|s_t) / pi_old(a_t|s_t)):

    for iteration = 1, 2, ...:
        run the policy for T steps in each of N envs; compute GAE advantages A_t
        for K epochs, over minibatches of the N*T samples, maximize one of
            surrogate_pg:  E[r_t A_t]                                        (L^CPI, no constraint)
            ppo:           E[min(r_t A_t, clip(r_t, 1-eps, 1+eps) A_t)]       (L^CLIP)
            ppo_kl:        E[r_t A_t] - beta KL[pi_old(.|s_t), pi(.|s_t)]   (L^KLPEN)
        minus c1 L^VF, plus c2 H[pi]
        ppo_kl only: d = measured KL; beta /= 2 if d < d_targ / 1.5; beta *= 2 if d > d_targ * 1.5

Defaults are the paper's MuJoCo settings (Table 3: T=2048, Adam 3e-4, 10 epochs, minibatch
64, gamma 0.99, lambda 0.95, eps 0.2; Sec. 4: d_targ 0.01, beta_0 1) with the implementation
details of OpenAI baselines' ppo2 that reproduce its scores (Huang et al. 2022, "The 37
Implementation Details of PPO"): orthogonal init, separate 64x64 tanh networks, observation
and reward normalization, advantage normalization per minibatch, value clipping (ppo only),
gradient clipping at 0.5, linear learning-rate annealing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from agents.algos.onpolicy import OnPolicyAlgorithm
from agents.algos.policy_gradient import Seeds
from agents.batches import RolloutBatch
from agents.configs.ppo import PPOAdaptiveKLConfig, PPOConfig, SurrogateConfig
from agents.nets.policies import PolicyDistribution


class SurrogatePG(OnPolicyAlgorithm):
    """The unconstrained surrogate E[r_t A_t] (PPO paper Table 1, "no clipping or penalty")."""

    name = "surrogate_pg"
    Config: ClassVar[type[SurrogateConfig]] = SurrogateConfig
    tunable_parameters = (*OnPolicyAlgorithm.tunable_parameters, "target_kl")

    config: SurrogateConfig

    def optimize(self, seeds: Seeds) -> dict[str, torch.Tensor]:
        """K epochs of minibatch steps, each seed on its own shuffled minibatches; a seed stops
        its epochs once one's mean approximate KL passes target_kl (the others go on). Logs are
        each seed's means over the steps it took."""
        config = self.config
        active = torch.ones(seeds.num_seeds, dtype=torch.bool)
        sums: dict[str, torch.Tensor] = {}
        steps = torch.zeros(seeds.num_seeds)
        for _ in range(config.num_epochs):
            epoch_kls = []
            mask = None if bool(active.all()) else active
            for batch in seeds.minibatches(config.num_minibatches, mask):
                info = seeds.gradient_step(batch, active=mask)
                epoch_kls.append(info["approx_kl"])
                weight = active.to(info["approx_kl"].device, info["approx_kl"].dtype)
                for key, value in info.items():
                    sums[key] = sums.get(key, 0) + value * weight
                steps += active.float()
            if config.target_kl is not None:
                active &= torch.stack(epoch_kls).mean(dim=0).cpu() <= config.target_kl
                if not active.any():
                    break
        return {key: total / steps.to(total.device) for key, total in sums.items()}

    def _ratio(self, dist: PolicyDistribution, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """r_t (S, M) and the approximate KL E[(r - 1) - log r] (Schulman's low-variance estimator)."""
        log_ratio = dist.log_prob(batch.actions) - batch.log_probs
        ratio = log_ratio.exp()
        with torch.no_grad():
            approx_kl = ((ratio - 1) - log_ratio).mean(dim=-1)
        return ratio, {"approx_kl": approx_kl}

    def _policy_loss(self, dist: PolicyDistribution, batch: RolloutBatch, advantages: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ratio, info = self._ratio(dist, batch)
        return -(ratio * advantages).mean(dim=-1), info


class PPO(SurrogatePG):
    """PPO-clip for Discrete, MultiDiscrete and Box action spaces."""

    name = "ppo"
    Config = PPOConfig
    tunable_parameters = (*SurrogatePG.tunable_parameters, "clip_range")

    config: PPOConfig

    def _clip_fraction(self) -> float:
        return self._schedule_fraction() if self.config.anneal_clip_range else 1.0

    @property
    def clip_range(self) -> float:
        """The clip range in force now (annealed if anneal_clip_range)."""
        return self.config.clip_range * self._clip_fraction()

    @property
    def value_clip_range(self) -> float | None:
        """Annealed with the policy's clip range, as ppo2's value clipping."""
        clip = self.config.value_clip_range
        return None if clip is None else clip * self._clip_fraction()

    def _policy_loss(self, dist: PolicyDistribution, batch: RolloutBatch, advantages: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """-min(r A, clip(r, 1-eps, 1+eps) A), averaged."""
        ratio, info = self._ratio(dist, batch)
        eps = self.clip_range
        clipped = ratio.clamp(1 - eps, 1 + eps)
        loss = -torch.min(ratio * advantages, clipped * advantages).mean(dim=-1)
        with torch.no_grad():
            info["clip_fraction"] = ((ratio - 1).abs() > eps).float().mean(dim=-1)
        return loss, info


class PPOAdaptiveKL(SurrogatePG):
    """PPO with the adaptive KL penalty (L^KLPEN); each seed adapts its own beta."""

    name = "ppo_kl"
    Config = PPOAdaptiveKLConfig
    tunable_parameters = (*SurrogatePG.tunable_parameters, "kl_target")

    config: PPOAdaptiveKLConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.kl_coef = self.config.kl_penalty
        self._kl_coefs: torch.Tensor | None = None  # (S,): the betas of the seeds being optimized

    def _policy_loss(self, dist: PolicyDistribution, batch: RolloutBatch, advantages: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """-E[r A] + beta KL[pi_old, pi], the old policy rebuilt from the stored parameters."""
        ratio, info = self._ratio(dist, batch)
        kl = self.actor_critic.distribution(batch.dist_params).kl(dist).mean(dim=-1)
        info["kl"] = kl.detach()
        kl_coefs = self._kl_coefs if self._kl_coefs is not None else self.kl_coef
        return -(ratio * advantages).mean(dim=-1) + kl_coefs * kl, info

    def optimize(self, seeds: Seeds) -> dict[str, torch.Tensor]:
        device = next(self.actor_critic.parameters()).device
        self._kl_coefs = torch.tensor([member.kl_coef for member in seeds.members], device=device)
        try:
            logs = super().optimize(seeds)
        finally:
            self._kl_coefs = None
        with torch.no_grad():
            dist, _, flat = self.evaluate_seeds(seeds.network, seeds.full_batch())
            measured = self.actor_critic.distribution(flat.dist_params).kl(dist).mean(dim=-1)
        for member, member_kl in zip(seeds.members, measured.tolist()):
            member.kl_coef = self.adapt_kl_coef(member.kl_coef, member_kl, self.config.kl_target)
        logs.update(measured_kl=measured, kl_coef=torch.tensor([member.kl_coef for member in seeds.members], device=device))
        return logs

    @staticmethod
    def adapt_kl_coef(kl_coef: float, measured_kl: float, kl_target: float) -> float:
        """Sec. 4: halve beta when the KL fell below d_targ / 1.5, double it above d_targ * 1.5."""
        if measured_kl < kl_target / 1.5:
            return kl_coef / 2
        if measured_kl > kl_target * 1.5:
            return kl_coef * 2
        return kl_coef

    def extra_state(self) -> dict[str, Any]:
        return {"kl_coef": self.kl_coef}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.kl_coef = float(state["kl_coef"])
