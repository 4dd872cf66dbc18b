"""One learning test per algorithm: the smoke suite's settings reach a score on a small task.

Budgets (seed 0, CPU): PPO on CartPole-v1, 100k steps (about 30 s); SAC on Pendulum-v1, 10k
steps with 1k random warm-up steps (about 2 min). Thresholds are on the final deterministic
evaluation over 10 episodes.
"""

import pytest

from benchmark.config import load_suite
from benchmark.train import run

THRESHOLDS = {("ppo", "CartPole-v1"): 475.0, ("sac", "Pendulum-v1"): -250.0}


def smoke_spec(algo: str, env_id: str):
    specs = [s for s in load_suite("smoke", seeds=[0], device="cpu").specs if (s.algo, s.env_id) == (algo, env_id)]
    assert len(specs) == 1
    return specs[0]


@pytest.mark.learning
@pytest.mark.parametrize("algo,env_id", sorted(THRESHOLDS))
def test_learns(algo, env_id):
    spec = smoke_spec(algo, env_id)
    result = run(spec)
    final = result.evaluations[-1]
    assert final.step == spec.budget.total_steps
    assert final.mean >= THRESHOLDS[(algo, env_id)], [round(e.mean, 1) for e in result.evaluations]
