"""Replay buffers: ring storage, n-step returns, sum-tree and PER, ERE windows, HER, sequences."""

import math
import os

import numpy as np
import pytest
import torch
from scipy import stats

from agents.buffers import (
    HindsightRelabeler,
    PrioritizedSampler,
    RecentExperience,
    ReplayBuffer,
    SequenceReplayBuffer,
    SumTree,
    Window,
)
from agents.envs import env_spec, goal_functions, make_vector_env, true_next_obs


def _add(buffer: ReplayBuffer, value: float, terminated=None, truncated=None, reward=None) -> None:
    """One vector step whose obs are ``value`` (+ env index / 4), next_obs value + 0.5."""
    n = buffer.num_envs
    ids = value + torch.arange(n) / 4
    buffer.add(
        ids[:, None],
        ids[:, None],
        ids if reward is None else torch.as_tensor(reward, dtype=torch.float32),
        ids[:, None] + 0.5,
        torch.as_tensor(terminated if terminated is not None else [False] * n),
        torch.as_tensor(truncated if truncated is not None else [False] * n),
    )


def test_replay_wraps_around_and_overwrites_oldest():
    buffer = ReplayBuffer(capacity=5, num_envs=1, obs_shape=(1,), action_shape=(1,))
    for value in range(3):
        _add(buffer, value)
    assert len(buffer) == 3 and buffer.position == 3
    for value in range(3, 7):  # 3, 4 fill rows 3, 4; 5, 6 overwrite rows 0, 1
        _add(buffer, value)
    assert len(buffer) == 5 and buffer.position == 2
    assert buffer.storage["obs"].flatten().tolist() == [5.0, 6.0, 2.0, 3.0, 4.0]
    batch = buffer.sample(1000, torch.Generator().manual_seed(0))
    assert set(batch["obs"].flatten().tolist()) == {2.0, 3.0, 4.0, 5.0, 6.0}
    torch.testing.assert_close(batch["next_obs"], batch["obs"] + 0.5)  # fields stay aligned
    torch.testing.assert_close(batch["discounts"], torch.full((1000,), 0.99))


def test_replay_layout_is_time_by_env_and_capacity_rounds_up_to_rows():
    buffer = ReplayBuffer(capacity=7, num_envs=2, obs_shape=(1,), action_shape=(1,))
    assert buffer.num_rows == 4 and buffer.capacity == 8
    with pytest.raises(RuntimeError, match="empty"):
        buffer.sample(4)
    _add(buffer, 0)
    _add(buffer, 1)
    assert buffer.storage["obs"][:2, :, 0].tolist() == [[0.0, 0.25], [1.0, 1.25]]
    assert set(buffer.sample(200)["obs"].flatten().tolist()) == {0.0, 0.25, 1.0, 1.25}
    with pytest.raises(ValueError, match="2 envs"):
        buffer.add(torch.zeros(3, 1), torch.zeros(3, 1), torch.zeros(3), torch.zeros(3, 1), torch.zeros(3, dtype=torch.bool))


def test_replay_state_dict_round_trip():
    buffer = ReplayBuffer(4, 1, (1,), (1,), sampler=PrioritizedSampler(4))
    for value in range(6):
        _add(buffer, value, terminated=[value == 2])
    restored = ReplayBuffer(4, 1, (1,), (1,), sampler=PrioritizedSampler(4))
    restored.load_state_dict(buffer.state_dict())
    assert restored.position == buffer.position == 2 and len(restored) == len(buffer) == 4
    for name in buffer.storage:
        torch.testing.assert_close(restored.storage[name], buffer.storage[name])
    torch.testing.assert_close(restored.sampler.tree.nodes, buffer.sampler.tree.nodes)


# -- n-step returns ------------------------------------------------------------------------


def test_n_step_returns_match_hand_computed_trajectory_with_termination_and_truncation():
    gamma, n = 0.5, 3
    buffer = ReplayBuffer(100, 2, (1,), (1,), gamma=gamma, n_step=n)
    # env 0: rewards 1..6, terminated at t=2, truncated (time limit) at t=4; env 1: rewards 1, no ends
    for t in range(6):
        _add(buffer, t, terminated=[t == 2, False], truncated=[t == 4, False], reward=[t + 1.0, 1.0])
    # (env, t) -> (n-step return, discount gamma^m, terminated of the last step, row of next_obs)
    expected = {
        (0, 0): (1 + 0.5 * 2 + 0.25 * 3, 0.125, 1.0, 2),  # cut at the termination: no bootstrap
        (0, 1): (2 + 0.5 * 3, 0.25, 1.0, 2),
        (0, 2): (3.0, 0.5, 1.0, 2),
        (0, 3): (4 + 0.5 * 5, 0.25, 0.0, 4),  # cut at the truncation: bootstrap from its final obs
        (0, 4): (5.0, 0.5, 0.0, 4),
        (0, 5): (6.0, 0.5, 0.0, 5),  # newest step: nothing stored after it yet
        (1, 0): (1.75, 0.125, 0.0, 2),
        (1, 3): (1.75, 0.125, 0.0, 5),
        (1, 4): (1.5, 0.25, 0.0, 5),
        (1, 5): (1.0, 0.5, 0.0, 5),
    }
    batch = buffer.sample(2000, torch.Generator().manual_seed(0))
    seen = set()
    for i, index in enumerate(batch["indices"].tolist()):
        key = (index % 2, index // 2)
        if key not in expected:
            continue
        seen.add(key)
        ret, discount, terminated, next_row = expected[key]
        assert batch["rewards"][i].item() == pytest.approx(ret), key
        assert batch["discounts"][i].item() == pytest.approx(discount), key
        assert batch["terminated"][i].item() == terminated, key
        assert batch["next_obs"][i].item() == pytest.approx(next_row + key[0] / 4 + 0.5), key
    assert seen == set(expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_cuda_buffer_keeps_the_same_episodes_from_host_or_device_flags():
    """The loop hands a CUDA buffer its flags on the host (no device sync per insert): the
    episode bookkeeping and the n-step batches equal those from device flags and on the CPU."""
    buffers = {where: ReplayBuffer(8, 2, (1,), (1,), "cpu" if where == "cpu" else "cuda", gamma=0.5, n_step=3) for where in ("cpu", "host", "device")}
    for t in range(13):  # wraps; env 0 terminates at 2 and 9, is truncated at 5; env 1 never ends
        ids = t + torch.arange(2) / 4
        for where, buffer in buffers.items():
            flags = "cuda" if where == "device" else "cpu"
            on = buffer.device
            buffer.add(
                ids[:, None].to(on),
                ids[:, None].to(on),
                ids.to(on),
                ids[:, None].to(on) + 0.5,
                torch.tensor([t in (2, 9), False], device=flags),
                torch.tensor([t == 5, False], device=flags),
            )
    reference = buffers["cpu"]
    for where in ("host", "device"):
        buffer = buffers[where]
        assert torch.equal(buffer.episode_start.cpu(), reference.episode_start)
        assert torch.equal(buffer.episode_end.cpu(), reference.episode_end)
        assert torch.equal(buffer._current_start.cpu(), reference._current_start)
        indices = torch.arange(len(reference))
        rows, envs = indices // 2, indices % 2
        for got, expected in zip(buffer._n_step_returns(rows.cuda(), envs.cuda()), reference._n_step_returns(rows, envs), strict=True):
            assert torch.equal(got.cpu(), expected)


def test_n_step_never_reads_past_the_write_head_after_wrapping():
    buffer = ReplayBuffer(4, 1, (1,), (1,), gamma=1.0, n_step=3)
    for t in range(6):  # rows hold steps 4, 5, 2, 3; the write head is at row 2
        _add(buffer, t, reward=[1.0])
    batch = buffer.sample(500, torch.Generator().manual_seed(0))
    for i, index in enumerate(batch["indices"].tolist()):
        step = int(batch["obs"][i].item())
        assert batch["rewards"][i].item() == min(3, 6 - step), (index, step)


# -- sum-tree and prioritized replay --------------------------------------------------------


def test_sum_tree_sampling_frequencies_match_priorities():
    priorities = torch.tensor([1.0, 2.0, 0.0, 4.0, 8.0, 3.0, 0.5, 6.5, 5.0, 10.0])
    tree = SumTree(len(priorities))
    tree.update(torch.arange(len(priorities)), priorities)
    draws = 40_000
    masses = torch.rand(draws, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * tree.total
    counts = torch.bincount(tree.find(masses), minlength=len(priorities)).double()
    assert counts[2] == 0  # a zero priority is never drawn
    keep = priorities > 0
    expected = priorities[keep].double() / priorities.sum() * draws
    chi_square = stats.chisquare(counts[keep].numpy(), expected.numpy())
    assert chi_square.pvalue > 0.01, chi_square


def test_sum_tree_updates_keep_every_node_the_sum_of_its_children():
    tree = SumTree(13)
    generator = torch.Generator().manual_seed(1)
    leaves = torch.zeros(13, dtype=torch.float64)
    for _ in range(20):
        indices = torch.randint(0, 13, (5,), generator=generator)
        values = torch.rand(5, generator=generator, dtype=torch.float64)
        tree.update(indices, values)
        for index, value in zip(indices.tolist(), values.tolist()):
            leaves[index] = value  # sequential semantics: the last write wins
    inner = torch.arange(1, tree.num_leaves)
    torch.testing.assert_close(tree.nodes[inner], tree.nodes[2 * inner] + tree.nodes[2 * inner + 1])
    torch.testing.assert_close(tree.get(torch.arange(13)), leaves)
    assert tree.total == pytest.approx(float(leaves.sum()))
    prefix = torch.cat([torch.zeros(1, dtype=torch.float64), leaves.cumsum(0)])
    torch.testing.assert_close(tree.prefix_sum(torch.arange(14)), prefix)


def test_prioritized_importance_weights_match_hand_computation():
    sampler = PrioritizedSampler(2, alpha=1.0, beta=0.5, eps=0.0)
    sampler.on_insert(torch.arange(2))
    sampler.update_priorities(torch.tensor([0, 1]), torch.tensor([-1.0, 3.0]))  # |delta|: 1 and 3
    # P = [1/4, 3/4], N = 2: w = (N P)^-beta = [sqrt(2), sqrt(2/3)], divided by the max sqrt(2)
    indices, weights = sampler.sample(2000, Window(0, 2, 2), torch.Generator().manual_seed(0))
    expected = {0: 1.0, 1: math.sqrt(1 / 3)}
    for index, weight in zip(indices.tolist(), weights.tolist()):
        assert weight == pytest.approx(expected[index], rel=1e-6)
    assert (indices == 1).float().mean().item() == pytest.approx(0.75, abs=0.02)
    sampler.set_progress(1.0)
    assert sampler.beta == 1.0


def test_prioritized_new_data_gets_max_priority_and_alpha_applies():
    buffer = ReplayBuffer(8, 1, (1,), (1,), sampler=PrioritizedSampler(8, alpha=0.5, eps=0.01))
    _add(buffer, 0)
    _add(buffer, 1)
    buffer.update_priorities(torch.tensor([0, 1]), torch.tensor([3.99, 0.0]))
    _add(buffer, 2)  # new: the max priority seen so far, 3.99 + 0.01 = 4, to the power alpha
    torch.testing.assert_close(buffer.sampler.tree.get(torch.arange(3)), torch.tensor([2.0, 0.1, 2.0], dtype=torch.float64))


def test_prioritized_stratified_sampling_within_a_wrapped_window():
    sampler = PrioritizedSampler(6, alpha=1.0)
    sampler.tree.update(torch.arange(6), torch.tensor([1.0, 1.0, 1.0, 1.0, 2.0, 4.0]))
    indices, _ = sampler.sample(7000, Window(start=4, count=3, modulus=6), torch.Generator().manual_seed(0))
    counts = torch.bincount(indices, minlength=6)
    assert counts[1:4].sum() == 0  # only flat indices 4, 5, 0
    assert counts[[4, 5, 0]].tolist() == [2000, 4000, 1000]  # stratified draws hit the masses exactly


# -- emphasizing recent experience -----------------------------------------------------------


def test_ere_window_shrinks_over_a_cycle_and_respects_c_min():
    ere = RecentExperience(eta=0.996, c_min=100, updates_per_cycle=1000, anneal="none")
    sizes = [ere.window_size(10_000) for _ in range(1000)]
    assert sizes[0] == math.ceil(10_000 * 0.996)
    assert sizes[-1] == math.ceil(10_000 * 0.996**1000)  # 182 > c_min
    assert all(a >= b for a, b in zip(sizes, sizes[1:]))
    assert ere.window_size(10_000) == sizes[0]  # a new cycle starts wide again
    small = RecentExperience(eta=0.9, c_min=100, updates_per_cycle=1, anneal="none")
    assert small.window_size(10_000) == 100 and small.window_size(50) == 50


def test_ere_samples_only_the_newest_rows():
    buffer = ReplayBuffer(10, 1, (1,), (1,), recent=RecentExperience(eta=0.5, c_min=3, updates_per_cycle=1, anneal="none"))
    for value in range(13):  # rows hold steps 10, 11, 12, 3, ..., 9
        _add(buffer, value)
    batch = buffer.sample(300, torch.Generator().manual_seed(0))
    assert set(batch["obs"].flatten().tolist()) == {10.0, 11.0, 12.0}


def test_ere_eta_anneals_to_uniform_when_progress_stops():
    ere = RecentExperience(eta=0.99, window_episodes=2, anneal="performance")
    for episode_return in (0, 0, 10, 10):  # improving: full emphasis
        ere.record_episode(episode_return)
    assert ere.eta == pytest.approx(0.99)
    for episode_return in (10, 10):  # no gain over the previous window: uniform
        ere.record_episode(episode_return)
    assert ere.eta == pytest.approx(1.0)
    linear = RecentExperience(eta=0.99, anneal="linear")
    linear.set_progress(0.5)
    assert linear.eta == pytest.approx(0.995)


def test_ere_combines_with_prioritized_and_n_step():
    buffer = ReplayBuffer(
        10,
        1,
        (1,),
        (1,),
        gamma=1.0,
        n_step=2,
        sampler=PrioritizedSampler(10),
        recent=RecentExperience(eta=0.5, c_min=4, updates_per_cycle=1, anneal="none"),
    )
    for value in range(10):
        _add(buffer, value, reward=[1.0])
    batch = buffer.sample(400, torch.Generator().manual_seed(0))
    assert set(batch["obs"].flatten().tolist()) == {6.0, 7.0, 8.0, 9.0}
    assert set(batch["rewards"].tolist()) == {2.0, 1.0}  # two-step returns, one at the newest step


# -- hindsight experience replay -------------------------------------------------------------


def _bit_flipping_buffer(strategy: str, steps: int = 60, k: int = 4) -> ReplayBuffer:
    env_id = "reprorl/BitFlipping5-v0"
    spec = env_spec(env_id)
    compute_reward, compute_terminated = goal_functions(env_id)
    relabeler = HindsightRelabeler(spec.goal, compute_reward, compute_terminated, strategy=strategy, k=k)
    buffer = ReplayBuffer(1000, 2, spec.observation_shape, (), action_dtype=torch.long, relabeler=relabeler)
    envs = make_vector_env(env_id, 2)
    obs, _ = envs.reset(seed=0)
    generator = np.random.default_rng(0)
    for _ in range(steps):
        actions = generator.integers(0, spec.num_actions, 2)
        next_obs, rewards, terminated, truncated, infos = envs.step(actions)
        buffer.add(
            torch.as_tensor(obs),
            torch.as_tensor(actions),
            torch.as_tensor(rewards, dtype=torch.float32),
            torch.as_tensor(true_next_obs(next_obs, infos)),
            torch.as_tensor(terminated),
            torch.as_tensor(truncated),
        )
        obs = next_obs
    return buffer


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_her_relabeled_rewards_equal_compute_reward_of_the_substituted_goals(strategy):
    buffer = _bit_flipping_buffer(strategy)
    layout = buffer.relabeler.layout
    compute_reward, compute_terminated = goal_functions("reprorl/BitFlipping5-v0")
    batch = buffer.sample(512, torch.Generator().manual_seed(0))
    achieved = batch["next_obs"][:, layout.achieved_goal[0] : layout.achieved_goal[1]].numpy()
    desired = batch["next_obs"][:, layout.desired_goal[0] : layout.desired_goal[1]].numpy()
    np.testing.assert_array_equal(batch["rewards"].numpy(), compute_reward(achieved, desired, {}))
    np.testing.assert_array_equal(batch["terminated"].numpy(), compute_terminated(achieved, desired, {}).astype(np.float32))
    # the goal is the same in obs and next_obs, and most of the batch was relabeled
    torch.testing.assert_close(batch["obs"][:, 5:10], batch["next_obs"][:, 5:10])
    original = buffer.storage["obs"][batch["indices"] // 2, batch["indices"] % 2][:, 5:10]
    relabeled = (batch["obs"][:, 5:10] != original).any(dim=1).float().mean().item()
    assert 0.3 < relabeled <= 0.8 + 0.05
    assert (batch["rewards"] == 0).float().mean().item() > 0.1  # relabeling creates successes


def test_her_goals_come_from_the_same_episode_and_the_future():
    buffer = _bit_flipping_buffer("future", k=1_000_000)  # relabel (nearly) everything
    batch = buffer.sample(256, torch.Generator().manual_seed(1))
    rows, envs = batch["indices"] // 2, batch["indices"] % 2
    for i in range(256):
        row, env = int(rows[i]), int(envs[i])
        end = int(buffer.episode_end[row, env]) if buffer.episode_end[row, env] >= 0 else buffer.rows_written - 1
        candidates = buffer.storage["next_obs"][row : end + 1, env, 0:5]  # achieved goals from step t on
        assert (candidates == batch["obs"][i, 5:10]).all(dim=1).any(), (row, env)


def test_her_cannot_combine_with_n_step():
    spec = env_spec("reprorl/BitFlipping5-v0")
    relabeler = HindsightRelabeler(spec.goal, *goal_functions(spec.env_id))
    with pytest.raises(ValueError, match="n_step"):
        ReplayBuffer(100, 1, spec.observation_shape, (), n_step=3, relabeler=relabeler)


# -- sequences for recurrent agents ----------------------------------------------------------


def test_sequences_start_on_the_overlap_grid_carry_stored_state_and_mark_resets():
    buffer = SequenceReplayBuffer(100, 2, (1,), (1,), hidden_shape=(3,), sequence_length=4, burn_in=2, overlap=0.5)
    assert buffer.stride == 2 and buffer.total_length == 6
    assert buffer.num_sequences() == 0
    for t in range(20):
        n = buffer.num_envs
        buffer.add(
            torch.full((n, 1), float(t)),
            torch.zeros(n, 1),
            torch.zeros(n),
            torch.full((n, 1), t + 0.5),
            torch.tensor([t == 8, False]),
            torch.tensor([False, False]),
            extras={"hidden": torch.full((n, 3), float(t)) + torch.arange(n)[:, None] * 100},
        )
    assert buffer.num_sequences() == 8  # starts 0, 2, ..., 14
    batch = buffer.sample(64, torch.Generator().manual_seed(0))
    assert batch["obs"].shape == (6, 64, 1) and batch["resets"].shape == (6, 64)
    assert set(batch["starts"].tolist()) <= set(range(0, 15, 2))
    torch.testing.assert_close(batch["obs"][:, :, 0], batch["starts"][None, :].float() + torch.arange(6.0)[:, None])
    torch.testing.assert_close(batch["initial_hidden"][:, 0], batch["starts"].float() + 100 * batch["envs"])
    # env 0's episode ended at step 8, so step 9 starts a new one
    expected_resets = (batch["obs"][:, :, 0] == 9) & (batch["envs"] == 0)[None, :]
    expected_resets |= batch["obs"][:, :, 0] == 0
    assert torch.equal(batch["resets"], expected_resets)


def test_sum_tree_incremental_sums_match_an_exact_rebuild():
    tree = SumTree(1000)
    generator = torch.Generator().manual_seed(2)
    for _ in range(50):
        tree.update(torch.randint(0, 1000, (64,), generator=generator), torch.rand(64, generator=generator, dtype=torch.float64))
    incremental = tree.nodes.clone()
    tree.rebuild()
    torch.testing.assert_close(incremental, tree.nodes, rtol=1e-12, atol=1e-12)


_COMMITTED_PROBE = """
import json, os, torch
from agents.buffers import ReplayBuffer

def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

before = resident()
buffer = ReplayBuffer(1_000_000, 1, (17,), (6,))
grown = resident() - before
for step in range(3):
    row = torch.full((1, 17), float(step))
    buffer.add(row, torch.zeros(1, 6), torch.ones(1), row + 1, torch.tensor([False]))
print(json.dumps({
    "grown": grown,
    "total": sum(tensor.numel() * tensor.element_size() for tensor in buffer.storage.values()),
    "held": len(buffer),
    "third": float(buffer.storage["obs"][2, 0, 0]),
    "rest_zero": not bool(buffer.storage["obs"][3:].any()),
}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads resident memory from /proc")
def test_cpu_replay_memory_is_committed_only_where_written():
    """A 1M-transition HalfCheetah buffer (~158 MiB of fields) costs little until written
    (torch.zeros committed all of it), and what is written is what it holds. Measured in a fresh
    interpreter: how much of the C heap an earlier test freed (and glibc must zero again on
    reuse) depends on what ran before in this process."""
    import json
    import subprocess
    import sys

    probe = subprocess.run(
        [sys.executable, "-c", _COMMITTED_PROBE], capture_output=True, text=True, timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    # the large fields come from mmap, always lazy; glibc may serve the ones under its mmap
    # threshold (up to 32 MiB: actions, flags, episode bookkeeping; 27% here) from its heap, zeroed
    assert found["total"] > 150 * 2**20 and found["grown"] < 0.5 * found["total"], found
    assert found["held"] == 3 and found["third"] == 2.0 and found["rest_zero"], found


def test_rewritten_since_marks_the_rows_stored_again_after_a_count_of_rows():
    """Three rows of two envs: after 2 rows, 2 more go to rows 2 and 0 (the ring wraps), so flat
    indices 0, 1 (row 0) and 4, 5 (row 2) hold newer transitions and 2, 3 (row 1) do not; once a
    whole ring's worth of rows has been written, every index has."""
    buffer = ReplayBuffer(capacity=6, num_envs=2, obs_shape=(1,), action_shape=(1,))
    for value in range(2):
        _add(buffer, float(value))
    then = buffer.rows_written
    for value in range(2):
        _add(buffer, float(value))
    indices = torch.arange(6)
    assert buffer.rewritten_since(indices, then).tolist() == [True, True, False, False, True, True]
    assert not buffer.rewritten_since(indices, buffer.rows_written).any()
    _add(buffer, 9.0)
    assert buffer.rewritten_since(indices, then).all()
