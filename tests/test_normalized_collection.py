"""A run that normalizes its observations and rewards, over collectors: in lock-step with the
learner's normalization, it trains exactly as one process with all their envs (inline
collectors here; Ray ones in test_distributed)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_collectors import Recorder

import agents
from benchmark import metric_names
from benchmark.config import Budget, RunSpec
from benchmark.training import checkpoint, loop

NORMALIZED = {
    # PPO as the record's MuJoCo settings run it (both normalizations), small
    "ppo": ("Pendulum-v1", {"hidden_sizes": [32], "num_steps": 25, "num_envs": 4, "num_minibatches": 2, "num_epochs": 2}),
    # A2C normalizing observations only; an episode ends inside a round (Pendulum: 200 steps)
    "a2c": ("Pendulum-v1", {"hidden_sizes": [32], "num_steps": 25, "num_envs": 4, "normalize_rewards": False}),
}


def spec_of(algo: str, collectors: int | None, budget: Budget, **distributed: object) -> RunSpec:
    env_id, overrides = NORMALIZED[algo]
    config = agents.resolve_config(algo, {"normalize_observations": True, "normalize_rewards": True, **overrides})
    settings = {"collectors": collectors, "backend": "inline", **distributed} if collectors else None
    return RunSpec("t", algo, env_id, 3, config.to_dict(), budget, device="cpu", distributed=settings)


@pytest.mark.parametrize("algo", sorted(NORMALIZED))
def test_a_normalized_run_over_collectors_equals_one_process_with_their_envs(algo):
    """2 collectors of 2 envs against one process of 4: the same evaluations (the eval envs use
    the learner's statistics), training episodes, losses and final statistics, bit for bit."""
    _, overrides = NORMALIZED[algo]
    rollout = overrides["num_steps"] * overrides["num_envs"]
    budget = Budget(10 * rollout, 5 * rollout, 2)
    runs = {}
    for collectors in (None, 2):
        tracker = Recorder()
        runs[collectors] = (loop.run(spec_of(algo, collectors, budget), tracker=tracker), tracker)
    (alone, alone_log), (spread, spread_log) = runs[None], runs[2]
    assert [e.step for e in spread.evaluations] == [e.step for e in alone.evaluations] == [5 * rollout, 10 * rollout]
    assert [e.returns for e in spread.evaluations] == [e.returns for e in alone.evaluations]
    episodes = (metric_names.TRAIN_EPISODE_RETURN, metric_names.TRAIN_EPISODE_LENGTH)
    assert spread_log.logged(*episodes) == alone_log.logged(*episodes) and alone_log.logged(*episodes)
    losses = sorted({k for _, m in alone_log.metrics for k in m if k.startswith("train/")})
    assert losses and spread_log.logged(*losses) == alone_log.logged(*losses)


class _Stop(Exception):
    pass


def test_a_normalized_run_over_collectors_resumes_exactly_from_its_checkpoint(tmp_path):
    """Stopped after its checkpoint in the middle of the budget (which holds the statistics,
    the reward normalizer's running returns and the observations to act on), then resumed:
    the evaluations of the run never stopped."""
    _, overrides = NORMALIZED["ppo"]
    rollout = overrides["num_steps"] * overrides["num_envs"]
    spec = replace(spec_of("ppo", 2, Budget(6 * rollout, 3 * rollout, 2)), checkpoint_every=2 * rollout)
    whole = loop.run(spec)

    def die(step: int, total: int, last_eval: object) -> None:
        if step > 3 * rollout:
            raise _Stop()

    with pytest.raises(_Stop):
        loop.run(spec, progress=die, checkpoint_dir=tmp_path)
    payload = checkpoint.load(tmp_path / spec.run_key / checkpoint.LATEST)
    assert payload["loop"]["step"] == 2 * rollout and payload["exact"]
    resumed = loop.run(spec, checkpoint_dir=tmp_path, resume=payload)
    assert [(e.step, e.returns) for e in resumed.evaluations] == [(e.step, e.returns) for e in whole.evaluations]


def test_an_asynchronous_rollout_is_absorbed_as_its_envs_wrappers_would_absorb_it():
    """The asynchronous rule on one arrival (collector 1 of 2, 2 envs each, 3 steps, an episode
    ending): the learner's observation statistics and the normalized rewards are those of
    gymnasium's own wrappers stepped with these 2 envs' raw steps; the observations stay as the
    collector normalized them."""
    import numpy as np
    import torch

    from benchmark.training.collected import Collected
    from benchmark.training.normalized_collection import JoinedNormalization, StepFeed

    spec = spec_of("ppo", 2, Budget(100, 100, 1))
    config = agents.resolve_config("ppo", spec.hyperparameters)
    joined = JoinedNormalization(spec, config)
    generator = np.random.default_rng(0)
    joined.start(generator.normal(size=(4, 3)))
    before = joined.snapshot()
    raw_obs, raw_rewards = generator.normal(size=(3, 2, 3)), generator.normal(size=(3, 2))
    terminated = torch.tensor([[False, False], [False, True], [False, False]])
    acted_on = torch.zeros(3, 2, 3)
    fields = {"obs": acted_on, "next_obs": acted_on, "rewards": torch.zeros(3, 2), "terminated": terminated, "truncated": torch.zeros(3, 2, dtype=torch.bool)}
    part = Collected(fields, np.zeros((3, 2, 1)), {}, collector=1, raw={"obs": raw_obs, "rewards": raw_rewards})
    joined.absorb(part, slice(2, 4))

    # gymnasium's wrappers over these 2 envs, their statistics started where the learner's were
    feed = StepFeed((3,), 2)
    envs = agents.envs.add_normalization(feed, normalize_observations=True, normalize_rewards=True, gamma=config.gamma)
    observations = envs.env.env
    feed.fed = np.zeros((2, 3))
    envs.reset()
    observations.obs_rms.mean, observations.obs_rms.var = before["mean"], before["var"]
    observations.obs_rms.count = 4 + 1e-4  # the 4 first observations, and gymnasium's initial 1e-4
    expected = []
    for t in range(3):
        feed.fed = (raw_obs[t], raw_rewards[t], terminated[t].numpy(), np.zeros(2, bool), {})
        expected.append(envs.step(None)[1])
    torch.testing.assert_close(part.fields["rewards"], torch.as_tensor(np.stack(expected), dtype=torch.float32))
    ours = joined.state()["statistics"]["obs_rms"]
    np.testing.assert_allclose(ours["mean"].numpy(), observations.obs_rms.mean, rtol=1e-12)
    np.testing.assert_allclose(ours["var"].numpy(), observations.obs_rms.var, rtol=1e-12)
    assert torch.equal(part.fields["obs"], acted_on)
