"""On-policy rollout storage and generalized advantage estimation (Schulman et al. 2016)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from agents.batches import RolloutBatch


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(gamma, lambda) advantages and lambda-returns, all tensors (T, N).

    ``next_values[t]`` is V of the true next state of step t (for a truncated episode: of its
    final observation). ``terminated`` cuts the bootstrap; ``dones`` (terminated or truncated)
    cuts the advantage recursion at the episode boundary.

        delta_t = r_t + gamma * (1 - terminated_t) * V(s'_t) - V(s_t)
        A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}
    """
    not_terminated = 1.0 - terminated.float()
    not_done = 1.0 - dones.float()
    deltas = rewards + gamma * not_terminated * next_values - values
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        running = deltas[t] + gamma * gae_lambda * not_done[t] * running
        advantages[t] = running
    return advantages, advantages + values


class RolloutStorage:
    """Fixed-size (T steps x N envs) storage, preallocated on ``device``.

    Besides what GAE needs it keeps, per step, the policy's distribution parameters when acting
    (``dist_params``: the exact old policy for KL penalties and trust regions), the policy
    entropy (for entropy added to rewards) and, for recurrent policies, the recurrent state
    the step was acted from (``states``) and whether the step began an episode
    (``episode_starts``), from which whole sequences are replayed.
    """

    def __init__(
        self,
        num_steps: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        device: torch.device | str = "cpu",
        discrete: bool = False,
        dist_params_size: int = 0,
        state_size: int = 0,
    ):
        self.num_steps, self.num_envs = num_steps, num_envs
        T, N = num_steps, num_envs

        def zeros(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.obs = zeros(T, N, *obs_shape)
        self.actions = zeros(T, N, *action_shape, dtype=torch.long if discrete else torch.float32)
        self.log_probs = zeros(T, N)
        self.values = zeros(T, N)
        self.rewards = zeros(T, N)
        self.terminated = zeros(T, N, dtype=torch.bool)
        self.truncated = zeros(T, N, dtype=torch.bool)
        self.truncation_values = zeros(T, N)  # V(final obs) where an episode was truncated
        self.advantages = zeros(T, N)
        self.returns = zeros(T, N)
        self.complete = zeros(T, N, dtype=torch.bool)  # the step's episode ended within the rollout
        self.dist_params = zeros(T, N, dist_params_size)
        self.entropies = zeros(T, N)
        self.states = zeros(T, N, state_size)
        self.episode_starts = zeros(T, N, dtype=torch.bool)
        self._next_starts = torch.ones(N, dtype=torch.bool, device=device)  # the first step after reset starts an episode
        self.step = 0
        self._numpy = {name: getattr(self, name).numpy() for name in self._INSERTED} if self.obs.device.type == "cpu" else {}

    _INSERTED = (
        "obs",
        "actions",
        "log_probs",
        "values",
        "rewards",
        "terminated",
        "truncated",
        "truncation_values",
        "dist_params",
        "entropies",
        "states",
        "episode_starts",
    )

    @property
    def full(self) -> bool:
        return self.step >= self.num_steps

    def insert(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        log_probs: torch.Tensor,
        values: torch.Tensor | None,
        rewards: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        truncation_values: torch.Tensor | None = None,
        dist_params: torch.Tensor | None = None,
        entropies: torch.Tensor | None = None,
        states: torch.Tensor | None = None,
    ) -> None:
        """Store one vector step; ``values`` (N,) may be None when the algorithm fills ``values``
        for the whole rollout before ``compute_returns``; ``truncation_values`` (N,) is V(final obs), used where truncated;
        ``dist_params`` (N, P), ``entropies`` (N,) and ``states`` (N, S) where the algorithm uses them."""
        if self.full:
            raise RuntimeError("rollout storage is full; call compute_returns and reset first")
        t = self.step
        fields = {
            "obs": obs,
            "actions": actions,
            "log_probs": log_probs,
            "values": values,
            "rewards": rewards,
            "terminated": terminated,
            "truncated": truncated,
            "truncation_values": truncation_values,
            "dist_params": dist_params,
            "entropies": entropies,
            "states": states,
            "episode_starts": self._next_starts,
        }
        if self.obs.device.type == "cpu":  # NumPy indexing copies a small row several times faster than torch's
            for name, value in fields.items():
                if value is not None:
                    self._numpy[name][t] = value.detach().cpu().numpy()
        else:
            for name, value in fields.items():
                if value is not None:
                    getattr(self, name)[t] = value
        self._next_starts = terminated | truncated
        self.step += 1

    def compute_returns(self, last_values: torch.Tensor, gamma: float, gae_lambda: float) -> None:
        """Fill ``advantages`` and ``returns``; ``last_values`` (N,) is V of the obs after the last step."""
        next_values = torch.cat([self.values[1:], last_values.unsqueeze(0)])
        next_values = torch.where(self.truncated, self.truncation_values, next_values)
        dones = self.terminated | self.truncated
        self.advantages, self.returns = compute_gae(self.rewards, self.values, next_values, self.terminated, dones, gamma, gae_lambda)
        # a step is complete if its env reaches an episode end at that step or later
        self.complete = dones.int().flip(0).cummax(dim=0).values.flip(0).bool()

    def _per_step(self) -> RolloutBatch:
        """Every stored step (T, N, ...)."""
        return RolloutBatch(
            obs=self.obs,
            actions=self.actions,
            log_probs=self.log_probs,
            values=self.values,
            advantages=self.advantages,
            returns=self.returns,
            complete=self.complete,
            dist_params=self.dist_params,
        )

    def minibatches(self, num_minibatches: int, generator: torch.Generator | None = None) -> Iterator[RolloutBatch]:
        """One epoch of shuffled minibatches over all T*N samples, flattened to (B, ...)."""
        size = self.num_steps * self.num_envs
        order = torch.randperm(size, generator=generator).to(self.obs.device)
        # one gather per field and epoch; the minibatches are then views of consecutive rows
        # (exactly num_minibatches of them: tensor_split, unlike chunk, never gives fewer)
        splits = {key: tensor.flatten(0, 1)[order].tensor_split(num_minibatches) for key, tensor in self._per_step().items()}
        for i in range(num_minibatches):
            yield RolloutBatch(**{key: parts[i] for key, parts in splits.items()})

    def sequence_minibatches(
        self,
        num_minibatches: int,
        sequence_length: int,
        generator: torch.Generator | None = None,
        shuffle: bool = True,
    ) -> Iterator[RolloutBatch]:
        """One epoch of shuffled minibatches of whole sequences, for recurrent policies.

        Each env's T steps are cut into T / L sequences of ``sequence_length`` L (which must
        divide T); every minibatch holds (L, B, ...) per-step tensors, ``episode_starts`` (L, B)
        and ``states`` (B, S): the recurrent state each sequence was acted from.
        """
        T, N, L = self.num_steps, self.num_envs, sequence_length
        if T % L:
            raise ValueError(f"sequence_length {L} must divide the rollout length {T}")

        def to_sequences(tensor: torch.Tensor) -> torch.Tensor:
            # (T, N, ...) -> (T/L, L, N, ...) -> (L, T/L * N, ...): column j is chunk j // N of env j % N
            chunks = tensor.reshape(T // L, L, N, *tensor.shape[2:]).transpose(0, 1)
            return chunks.reshape(L, (T // L) * N, *tensor.shape[2:])

        sequences = self._per_step().apply(to_sequences).replace(episode_starts=to_sequences(self.episode_starts))
        initial_states = to_sequences(self.states)[0]
        count = (T // L) * N
        order = torch.randperm(count, generator=generator) if shuffle else torch.arange(count)
        for indices in order.to(self.obs.device).tensor_split(num_minibatches):
            yield sequences.apply(lambda tensor: tensor[:, indices]).replace(states=initial_states[indices])

    def full_batch(self, sequence_length: int | None = None) -> RolloutBatch:
        """Every stored step as one batch: flat (T*N, ...), or as sequences of ``sequence_length``
        (in a fixed order) when given."""
        if sequence_length is None:
            return self._per_step().apply(lambda tensor: tensor.flatten(0, 1))
        return next(self.sequence_minibatches(1, sequence_length, shuffle=False))

    def reset(self) -> None:
        """Empty the storage for the next rollout (episodes carry over across rollouts)."""
        self.step = 0
        self.truncation_values.zero_()

    def truncate_last_step(self, truncation_values: torch.Tensor) -> None:
        """The envs were restarted mid-episode: the newest stored step of every env whose
        episode was still running becomes a time-limit truncation with V(final obs)
        ``truncation_values`` (N,); every env's next step starts an episode."""
        if self.step > 0:
            t = self.step - 1
            running = ~(self.terminated[t] | self.truncated[t])
            self.truncated[t] |= running
            self.truncation_values[t] = torch.where(running, truncation_values, self.truncation_values[t])
        self._next_starts = torch.ones_like(self._next_starts)

    _STATE_FIELDS = (*_INSERTED, "_next_starts")

    def state_dict(self) -> dict[str, torch.Tensor | int]:
        """The steps stored so far of the current rollout (CPU copies) and the insert position."""
        state: dict[str, torch.Tensor | int] = {name: getattr(self, name).detach().cpu().clone() for name in self._STATE_FIELDS}
        state["step"] = self.step
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor | int]) -> None:
        """Restore what ``state_dict`` returned."""
        for name in self._STATE_FIELDS:
            getattr(self, name).copy_(state[name])
        self.step = int(state["step"])
