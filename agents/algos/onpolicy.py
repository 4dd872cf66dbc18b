"""What every on-policy algorithm shares: acting, rollouts, advantages, entropy, recurrence.

    repeat:
        act for num_steps in each of num_envs envs (storing log-probs, values, the policy's
            distribution parameters and, for recurrent policies, the state acted from)
        [entropy_method == "max"]  r_t += entropy_coef * H[pi(.|s_t)]
        advantages A_t by GAE(gamma, gae_lambda); returns R_t = A_t + V(s_t)
        [center_adv]    A <- (A - mean A) / std A        [positive_adv]  A <- A - min A + 1e-8
        the algorithm's own optimization of its policy objective and value loss (optimize)

The options and their names follow garage's VPG family (center_adv, positive_adv,
entropy_coef, use_softplus_entropy, stop_entropy_gradient, entropy_method; Levine 2018,
arXiv:1805.00909, for "max"). The discount is ``gamma``, as for every algorithm in the suite.
Recurrent policies replay whole sequences of ``sequence_length`` steps from the recurrent state
they were acted from, with the state zeroed where an episode began.

Every loss is written once, over a leading seed dimension: batches are (S, M, ...), losses and
logs (S,). A run's own update sees itself as S = 1 (``OneSeed``: its networks, its optimizers);
N seeds trained as one batched model are S = N (``onpolicy_batch.OnPolicySeedBatch``: stacked
networks and optimizers). Each algorithm's ``optimize(seeds)`` (epochs, minibatches, value
fitting) runs unchanged on either, through the ``Seeds`` protocol. Beside this file:
``policy_gradient`` (advantages processing and the entropy terms) and ``onpolicy_shared`` (its
gradient steps taken by gradient workers).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from agents.algos.onpolicy_shared import SharedRolloutSteps
from agents.algos.policy_gradient import PARTS, Seeds, entropy_bonus, entropy_transform, gradient_step, process_advantages, rollout_batch
from agents.algos.seeds import per_seed_logs, seed_axis
from agents.api import Acted, Transitions, batched_by, parameters_of, set_gradients
from agents.batches import RolloutBatch
from agents.buffers import RolloutStorage
from agents.configs.onpolicy import OnPolicyConfig
from agents.envs import EnvSpec
from agents.nets import ActorCritic
from agents.nets.policies import PolicyDistribution
from agents.optim import adam, clip_gradients


class OnPolicyAlgorithm(SharedRolloutSteps):
    """Acting, rollout storage, returns and the shared losses; subclasses write ``optimize``.

    The default objective is the vanilla policy gradient -E[log pi(a|s) A]; subclasses
    override ``_policy_loss``. Optimizers are named (``joint``, or ``policy`` and ``value``);
    ``gradient_list(batch, parts)`` differentiates the chosen parts of the loss.
    """

    seed_batch = batched_by("agents.algos.onpolicy_batch:OnPolicySeedBatch")

    Config: ClassVar[type[OnPolicyConfig]] = OnPolicyConfig
    config: OnPolicyConfig
    tunable_parameters: ClassVar[tuple[str, ...]] = (
        "learning_rate",
        "entropy_coef",
        "value_coef",
        "value_clip_range",
        "max_grad_norm",
        "gae_lambda",
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_optimize" in cls.__dict__:  # a plug-in written before the rename would be ignored silently
            raise TypeError(f"{cls.__name__} defines _optimize: an on-policy algorithm's optimization is optimize(seeds)")

    @property
    def learns_value(self) -> bool:
        """Whether the value function is learned and used as the baseline."""
        return True

    def __init__(
        self,
        env_spec: EnvSpec,
        config: OnPolicyConfig,
        total_steps: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
    ):
        self.check_env_spec(env_spec)
        self.check_config(config, env_spec)
        self.spec, self.config, self.device = env_spec, config, torch.device(device)
        self.actor_critic = ActorCritic(
            env_spec,
            config.hidden_sizes,
            config.activation,
            config.initial_log_std,
            shared=config.shared_network,
            recurrent=None if config.recurrent == "none" else config.recurrent,
            recurrent_size=config.recurrent_size,
        ).to(self.device)
        self.parameters = parameters_of(self.actor_critic)
        self.sequence_length = config.sequence_length or config.num_steps
        params_size = env_spec.num_actions * (1 if env_spec.discrete else 2)
        self.storage = RolloutStorage(
            config.num_steps,
            config.num_envs,
            env_spec.observation_shape,
            env_spec.action_shape,
            self.device,
            env_spec.discrete,
            dist_params_size=params_size,
            state_size=self.actor_critic.state_size,
        )
        self.generator = torch.Generator().manual_seed(seed)
        self.num_updates_total = max(1, total_steps // (config.num_steps * config.num_envs))
        self.num_updates = 0
        self._last_next_obs: torch.Tensor | None = None
        self._last_state: torch.Tensor | None = None
        self.optimizers = self._make_optimizers()
        if not env_spec.discrete:
            self._action_low = np.asarray(env_spec.action_low, dtype=np.float32)
            self._action_high = np.asarray(env_spec.action_high, dtype=np.float32)

    # -- optimizers and schedules -----------------------------------------------------------

    def _make_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """One Adam over all parameters (eps 1e-5 as in baselines); subclasses may split it."""
        return {"joint": adam(self.parameters, lr=self.config.learning_rate, eps=1e-5)}

    def _base_learning_rates(self) -> dict[str, float]:
        """Each optimizer's configured learning rate (before annealing)."""
        return {name: self.config.learning_rate for name in self.optimizers}

    def _schedule_fraction(self) -> float:
        """1 at the first update, falling linearly to 0 at the last."""
        return max(1.0 - self.num_updates / self.num_updates_total, 0.0)

    def _apply_schedules(self) -> None:
        fraction = self._schedule_fraction() if self.config.anneal_lr else 1.0
        for name, learning_rate in self._base_learning_rates().items():
            for group in self.optimizers[name].param_groups:
                group["lr"] = learning_rate * fraction

    def _on_parameter_updated(self, name: str) -> None:
        self._apply_schedules()

    # -- acting and collecting --------------------------------------------------------------

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, state: Any = None, deterministic: bool = False) -> Acted:
        if state is None:
            state = self.actor_critic.initial_state(obs.shape[0], obs.device)
        if self.actor_critic.separate_feed_forward:
            # V of the whole rollout is computed in one pass when it is complete (_finish_rollout)
            params, values, next_state = self.actor_critic.policy_params(obs), None, None
        else:
            params, values, next_state = self.actor_critic(obs, state)
        dist = self.actor_critic.distribution(params)
        if deterministic:
            actions = dist.mode()
            log_probs = dist.log_prob(actions)
        else:
            actions, log_probs = dist.sample_with_log_prob(dist.draw_noise(self.generator))
        extras = {"log_prob": log_probs, "dist_params": params}
        if values is not None:
            extras["value"] = values if self.learns_value else torch.zeros_like(values)
        if self.config.entropy_method == "max":
            extras["entropy"] = dist.entropy()
        if state is not None:
            extras["state"] = state
        return Acted(actions, self.env_actions(actions), next_state, extras)

    def env_actions(self, actions: torch.Tensor) -> np.ndarray:
        """Policy actions -> what the env receives (Box actions clipped to its bounds)."""
        env_actions = actions.cpu().numpy()
        if not self.spec.discrete:
            env_actions = np.clip(env_actions, self._action_low, self._action_high)
        return env_actions

    def reset_state(self, state: Any, episode_ended: torch.Tensor) -> Any:
        if state is None:
            return None
        return torch.where(episode_ended.to(state.device).unsqueeze(-1), torch.zeros_like(state), state)

    @torch.inference_mode()
    def _values(self, obs: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
        """V(obs) (B,) from recurrent ``state``; zeros without a learned baseline."""
        if not self.learns_value:
            return torch.zeros(obs.shape[0], device=obs.device)
        if self.actor_critic.separate_feed_forward:
            return self.actor_critic.value(obs)
        return self.actor_critic(obs, state)[1]

    def observe(self, transitions: Transitions) -> None:
        acted = transitions.acted
        truncation_values = None
        if transitions.truncated.any():
            truncation_values = self._values(transitions.next_obs, acted.state)
        self.storage.insert(
            transitions.obs,
            acted.actions,
            acted.extras["log_prob"],
            acted.extras.get("value"),
            transitions.rewards,
            transitions.terminated,
            transitions.truncated,
            truncation_values,
            dist_params=acted.extras["dist_params"],
            entropies=acted.extras.get("entropy"),
            states=acted.extras.get("state"),
        )
        self._last_next_obs, self._last_state = transitions.next_obs, acted.state

    def ready_to_update(self) -> bool:
        return self.storage.full

    # -- the update template ----------------------------------------------------------------

    def update(self) -> dict[str, float]:
        """Returns and advantages for the full rollout, then the algorithm's optimization."""
        logs = self.begin_update()
        seeds = OneSeed(self)
        logs.update(per_seed_logs(self.optimize(seeds), 1)[0])
        seeds.finish()
        return self.end_update(logs)

    def loss_state(self) -> dict[str, Any]:
        """What the losses read besides the weights and the batch: the update count (the clip
        and learning-rate schedules) and the algorithm's coefficients (PPO-KL's beta). A gradient
        worker's copy takes the learner's on before it differentiates."""
        return {"num_updates": self.num_updates, **self.extra_state()}

    def load_loss_state(self, state: Mapping[str, Any]) -> None:
        self.num_updates = int(state["num_updates"])
        self.load_extra_state(state)

    def begin_update(self) -> dict[str, float]:
        """What precedes the optimization: returns and advantages, the schedules."""
        logs = self._finish_rollout()
        self._apply_schedules()
        return logs

    def end_update(self, logs: dict[str, float]) -> dict[str, float]:
        """What follows it: the fit of V and the learning rates logged, the rollout cleared."""
        if self.learns_value:
            values, returns = self.storage.values.flatten(), self.storage.returns.flatten()
            logs["explained_variance"] = float(1.0 - (returns - values).var() / returns.var().clamp_min(1e-8))
        for name, optimizer in self.optimizers.items():
            suffix = "" if name == "joint" else f"_{name}"
            logs[f"learning_rate{suffix}"] = optimizer.param_groups[0]["lr"]
        self.storage.reset()
        self.num_updates += 1
        return logs

    def optimize(self, seeds: Seeds) -> dict[str, torch.Tensor]:
        """The algorithm's optimization of every seed in ``seeds`` (this run's alone, or a
        batch's, this member standing for all: they share the configuration and schedules);
        each log per seed (S,). Here one gradient step on the whole rollout (VPG, A2C)."""
        return seeds.gradient_step(seeds.full_batch())

    def _finish_rollout(self) -> dict[str, float]:
        config, logs = self.config, {}
        if config.entropy_method == "max":
            bonus = config.entropy_coef * entropy_transform(self.config, self.storage.entropies)
            self.storage.rewards += bonus
            logs["entropy_reward"] = float(bonus.mean())
        if self.actor_critic.separate_feed_forward:
            # V(s_t) of the whole rollout in one batched pass, instead of a critic forward per env step
            self.storage.values.copy_(self._values(self.storage.obs.flatten(0, 1), None).view_as(self.storage.values))
        assert self._last_next_obs is not None  # observe() stored the rollout's last step
        last_values = self._values(self._last_next_obs, self._last_state)
        self.storage.compute_returns(last_values, config.gamma, config.gae_lambda)
        return logs

    def rollout_sequence_length(self) -> int | None:
        return self.sequence_length if self.config.recurrent != "none" else None

    def minibatches(self, num_minibatches: int) -> Iterator[RolloutBatch]:
        """One shuffled epoch over the rollout: samples, or whole sequences when recurrent."""
        if self.config.recurrent != "none":
            return self.storage.sequence_minibatches(num_minibatches, self.sequence_length, self.generator)
        return self.storage.minibatches(num_minibatches, self.generator)

    # -- losses: written once, over a leading seed dimension -------------------------------

    def evaluate_seeds(self, network: Any, batch: RolloutBatch) -> tuple[PolicyDistribution, torch.Tensor, RolloutBatch]:
        """Every seed's current policy and values on its batch (S, M), and the batch's per-step
        tensors flattened to (S, M, ...): recurrent sequences are unrolled from their states."""
        if self.config.recurrent != "none":
            dist, values = network.seeded(batch.obs, batch.states, batch.episode_starts)
            return dist, values, batch.replace(states=None, episode_starts=None).apply(lambda tensor: tensor.flatten(1, 2))
        dist, values = network.seeded(batch.obs)
        return dist, values, batch

    @property
    def value_clip_range(self) -> float | None:
        """The value clipping range in force now."""
        return self.config.value_clip_range

    def value_loss(self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
        """0.5 (V - R)^2, or with value_clip_range the max with the clipped update's error
        (ppo2), averaged over the last dimension: (..., M) -> (...,)."""
        errors = (values - returns).pow(2)
        clip = self.value_clip_range
        if clip is not None:
            clipped_values = old_values + (values - old_values).clamp(-clip, clip)
            errors = torch.max(errors, (clipped_values - returns).pow(2))
        return 0.5 * errors.mean(dim=-1)

    def _policy_loss(self, dist: PolicyDistribution, batch: RolloutBatch, advantages: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The algorithm's policy loss per seed (S,) and its logs (S,); here the vanilla policy
        gradient -mean(log pi(a|s) A)."""
        return -(dist.log_prob(batch.actions) * advantages).mean(dim=-1), {}

    def _policy_advantages(self, flat: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor | float]:
        """Processed advantages (S, M) and the weight (S,) that turns the loss's mean into the
        mean over the steps that count. Without a baseline there is no value to bootstrap an
        unfinished episode from, so only steps of episodes that ended within the rollout count
        (their returns-to-go are exact); the rest get advantage 0, as if whole episodes had
        been sampled."""
        advantages = flat.advantages
        if self.learns_value:
            return process_advantages(self.config, advantages), 1.0
        complete = flat.complete
        counted = process_advantages(self.config, advantages, complete)
        return counted, advantages.shape[-1] / complete.sum(dim=-1).clamp_min(1)

    def seeds_loss(self, network: Any, batch: RolloutBatch, parts: tuple[str, ...] = PARTS) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """policy loss - entropy bonus + value_coef * value loss (the parts asked for), per
        seed (S,), on a batch (S, M, ...); each log (S,)."""
        dist, values, flat = self.evaluate_seeds(network, batch)
        terms: list[torch.Tensor] = []
        info: dict[str, torch.Tensor] = {}
        if "policy" in parts:
            advantages, weight = self._policy_advantages(flat)
            policy_loss, info = self._policy_loss(dist, flat, advantages)
            policy_loss = weight * policy_loss
            entropy = dist.entropy()
            terms.append(policy_loss)
            if self.config.entropy_method == "regularized":
                terms.append(-entropy_bonus(self.config, entropy))
            info.update(policy_loss=policy_loss.detach(), entropy=entropy.detach().mean(dim=-1))
        if "value" in parts and self.learns_value:
            value_loss = self.value_loss(values, flat.values, flat.returns)
            terms.append(self.config.value_coef * value_loss)
            info["value_loss"] = value_loss.detach()
        loss = sum(terms[1:], terms[0]) if terms else values.new_zeros(values.shape[:1])
        return loss, info

    def fit_value(self, seeds: Seeds, epochs: int, num_minibatches: int) -> dict[str, torch.Tensor]:
        """Regress V on the returns: ``epochs`` passes of ``num_minibatches`` steps."""
        losses = []
        for _ in range(epochs):
            for batch in seeds.minibatches(num_minibatches):
                losses.append(seeds.gradient_step(batch, parts=("value",))["value_loss"])
        return {"value_loss": torch.stack(losses).mean(dim=0)} if losses else {}

    # -- one run's view of the losses (the seeds' Algorithm interface) ----------------------

    def evaluate(self, batch: RolloutBatch | Mapping[str, torch.Tensor]) -> tuple[PolicyDistribution, torch.Tensor, RolloutBatch]:
        """The current policy and values on one run's batch, and its per-step tensors flattened
        to (M, ...): a recurrent batch of sequences is unrolled from its initial states."""
        rollout = rollout_batch(batch)
        if self.config.recurrent != "none":
            dist, values, _ = self.actor_critic.policy_and_value(rollout.obs, rollout.states, rollout.episode_starts)
            return dist, values, rollout.replace(states=None, episode_starts=None).apply(lambda tensor: tensor.flatten(0, 1))
        dist, values, _ = self.actor_critic.policy_and_value(rollout.obs)
        return dist, values, rollout

    def loss(self, batch: Mapping[str, torch.Tensor], parts: tuple[str, ...] = PARTS) -> tuple[torch.Tensor, dict[str, float]]:
        """``seeds_loss`` on one run's batch: the scalar loss and its logs."""
        loss, info = self.seeds_loss(self.actor_critic, seed_axis(rollout_batch(batch)), parts)
        return loss[0], per_seed_logs(info, 1)[0]

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return self.parameters

    def gradient_list(self, batch: Mapping[str, torch.Tensor], parts: tuple[str, ...] = PARTS) -> tuple[list[torch.Tensor | None], dict[str, float]]:
        """Gradients of ``loss(batch, parts)`` for every parameter (None where unused)."""
        loss, info = self.loss(batch, parts)
        gradients = torch.autograd.grad(loss, self.parameters, allow_unused=True)
        return list(gradients), info

    def apply_gradient_list(self, gradients: list[torch.Tensor | None] | None = None) -> None:
        """Clip each optimizer's gradient norm, step every optimizer with gradients, clear them."""
        if gradients is not None:
            set_gradients(self.parameters, gradients)
        for optimizer in self.optimizers.values():
            with_gradients = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            if not with_gradients:
                continue
            if self.config.max_grad_norm is not None:
                clip_gradients([p.grad for p in with_gradients], self.config.max_grad_norm)
            optimizer.step()
        for parameter in self.parameters:
            parameter.grad = None

    # -- weights and state ------------------------------------------------------------------

    def modules(self) -> dict[str, torch.nn.Module]:
        return {"actor_critic": self.actor_critic}

    def extra_state(self) -> dict[str, Any]:
        """Algorithm-specific counters or coefficients to checkpoint."""
        return {}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizers, counters, RNG and the rollout collected so far (it is small)."""
        return {
            "actor_critic": self.actor_critic.state_dict(),
            "optimizers": {name: optimizer.state_dict() for name, optimizer in self.optimizers.items()},
            "num_updates": self.num_updates,
            "generator": self.generator.get_state(),
            "config": self.config.to_dict(),
            "rollout": self.storage.state_dict(),
            "last_next_obs": self._last_next_obs,
            "last_state": self._last_state,
            **self.extra_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.actor_critic.load_state_dict(state["actor_critic"])
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][name])
        self.num_updates = int(state["num_updates"])
        self.generator.set_state(state["generator"])
        if "rollout" in state:  # checkpoints written before the rollout was saved hold none
            self.storage.load_state_dict(state["rollout"])
            self._last_next_obs, self._last_state = (
                None if tensor is None else tensor.to(self.device) for tensor in (state["last_next_obs"], state["last_state"])
            )
        self.load_extra_state(state)

    def interrupt_episodes(self, final_obs: torch.Tensor, state: Any = None) -> None:
        """The last stored step of each running episode becomes a truncation, bootstrapped
        from V(``final_obs``); the next steps start new episodes."""
        values = self._values(final_obs.to(self.device), state) if self.storage.step > 0 else None
        self.storage.truncate_last_step(values if values is not None else torch.zeros(self.storage.num_envs, device=self.device))


class OneSeed:
    """A run's own seed as the ``Seeds`` of its optimization: its network, its rollout with a
    seed dimension of 1, its optimizers."""

    num_seeds = 1

    def __init__(self, algorithm: OnPolicyAlgorithm):
        self.algorithm = algorithm
        self.members = [algorithm]
        self.network = algorithm.actor_critic

    def full_batch(self) -> RolloutBatch:
        algorithm = self.algorithm
        return seed_axis(algorithm.storage.full_batch(algorithm.rollout_sequence_length()))

    def minibatches(self, num_minibatches: int, active: torch.Tensor | None = None) -> Iterator[RolloutBatch]:
        return (seed_axis(batch) for batch in self.algorithm.minibatches(num_minibatches))

    def step(self, loss: torch.Tensor, active: torch.Tensor | None = None) -> None:
        algorithm = self.algorithm
        algorithm.apply_gradient_list(list(torch.autograd.grad(loss.sum(), algorithm.parameters, allow_unused=True)))

    def gradient_step(self, batch: RolloutBatch, parts: tuple[str, ...] = PARTS, active: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Here, or by the run's ``step_strategy`` (gradient workers) when it has one."""
        strategy = self.algorithm.step_strategy
        if strategy is not None:
            logs: dict[str, torch.Tensor] = strategy.take(self.algorithm, (batch, parts))
            return logs
        return gradient_step(self, batch, parts, active)

    def finish(self) -> None:
        self.algorithm.finish_steps()

    def policy_parameters(self) -> Sequence[torch.Tensor]:
        return self.algorithm.actor_critic.policy_parameters()
