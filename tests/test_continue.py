"""``python -m benchmark continue RUN_ID --steps N``: a finished run trained further as a new run,
from its final checkpoint, linked to it; and what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import run_cli_in_process
from mlflow import MlflowClient

from benchmark.config import load_suite
from benchmark.training import checkpoint

# no observation normalization: the first evaluation of the continued run, before its first
# update (the rollout is 4 x 64 steps, evaluations every 64), must be the last of the old run
PPO = ("--set", "num_envs=4", "num_steps=64", "hidden_sizes=[16]", "normalize_observations=false", "normalize_rewards=false")


def runs_by_key(results: Path) -> dict[str, object]:
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.run_key != ''")
    return {run.data.tags["run_key"]: run for run in runs}


def curve(results: Path, run_id: str) -> list[tuple[int, float]]:
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, "eval/return_mean"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, str]:
    """A finished PPO run: (scratch directory, results directory, its MLflow run id)."""
    scratch = tmp_path_factory.mktemp("continue")
    results = scratch / "results"
    arguments = ("train", "--algo", "ppo", "--env", "CartPole-v1", "--steps", "512", "--eval-every", "64", "--eval-episodes", "3", "--published-defaults", *PPO)
    completed = run_cli_in_process(*arguments, "--results-dir", str(results), cwd=scratch)
    assert completed.returncode == 0, completed.stderr[-2000:]
    ((key, run),) = runs_by_key(results).items()
    return scratch, results, run.info.run_id


def test_continue_extends_a_finished_run_as_a_new_linked_run(trained):
    scratch, results, run_id = trained
    origin_key = next(iter(runs_by_key(results)))
    listed = sorted(str(path.relative_to(results)) for path in results.rglob("*") if "mlflow.db" not in path.name)
    dry = run_cli_in_process("continue", run_id, "--steps", "256", "--eval-every", "64", "--dry-run", "--results-dir", str(results), cwd=scratch)
    assert dry.returncode == 0 and "(not written: --dry-run)" in dry.stdout and "1 to train" in dry.stdout, dry.stdout[-2000:] + dry.stderr[-2000:]
    assert sorted(str(path.relative_to(results)) for path in results.rglob("*") if "mlflow.db" not in path.name) == listed, "--dry-run wrote a file"
    completed = run_cli_in_process("continue", run_id, "--steps", "256", "--eval-every", "64", "--results-dir", str(results), cwd=scratch)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert f"continues run {run_id}" in completed.stdout and "from env step 512 to 768" in completed.stdout
    assert "note: anneal_lr move with the fraction of the budget trained; over the new budget they start 67% of the way" in completed.stdout
    (suite,) = (results / "suites").glob("continue-ppo-CartPole-v1-*.yaml")
    (spec,) = load_suite(str(suite)).specs
    assert spec.continued_from == origin_key and spec.budget.total_steps == 768 and spec.run_key != origin_key
    runs = runs_by_key(results)
    assert set(runs) == {origin_key, spec.run_key}
    continued = runs[spec.run_key]
    assert continued.info.status == "FINISHED" and continued.data.tags["continued_from"] == origin_key
    before, after = curve(results, run_id), curve(results, continued.info.run_id)
    assert [step for step, _ in after] == [576, 640, 704, 768]  # from where the old run ended, N steps on
    assert after[0][1] == before[-1][1]  # its weights: no update before the first evaluation
    assert (results / "checkpoints" / spec.run_key / checkpoint.FINAL).is_file()
    assert (results / "checkpoints" / origin_key / checkpoint.FINAL).is_file()  # the old run stays as it was
    again = run_cli_in_process("continue", run_id, "--steps", "256", "--eval-every", "64", "--results-dir", str(results), cwd=scratch)
    assert again.returncode == 0 and "1/1 runs finished (1 of them in an earlier invocation)" in again.stdout, again.stdout[-2000:]
    reproduced = run_cli_in_process("reproduce", continued.info.run_id, "--results-dir", str(results), cwd=scratch)
    assert reproduced.returncode == 0 and "match: all 4 evaluations are bit-identical" in reproduced.stdout, reproduced.stdout + reproduced.stderr
    by_key = run_cli_in_process("continue", spec.run_key, "--steps", "256", "--eval-every", "128", "--results-dir", str(results), cwd=scratch)
    assert by_key.returncode == 0, by_key.stderr[-2000:]  # a continued run continues too, named by its run key
    (chained,) = [s for s in (results / "suites").glob("continue-*-to-1024.yaml")]
    assert yaml.safe_load(chained.read_text())["experiments"][0]["continued_from"] == spec.run_key


def test_the_final_checkpoint_comes_from_the_artifacts_when_the_local_one_is_gone(trained, tmp_path):
    """An off-policy run too: its learner refills its replay buffer before updating again."""
    scratch = tmp_path
    results = scratch / "results"
    arguments = (
        "train",
        "--algo",
        "dqn",
        "--env",
        "CartPole-v1",
        "--steps",
        "400",
        "--published-defaults",
        "--set",
        "learning_starts=100",
        "hidden_sizes=[16]",
    )
    assert run_cli_in_process(*arguments, "--eval-episodes", "2", "--results-dir", str(results), cwd=scratch).returncode == 0
    ((key, run),) = runs_by_key(results).items()
    (results / "checkpoints" / key / checkpoint.FINAL).unlink()
    completed = run_cli_in_process("continue", run.info.run_id, "--steps", "200", "--results-dir", str(results), cwd=scratch)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert (results / "checkpoints" / key / checkpoint.FINAL).is_file()
    continued = next(r for k, r in runs_by_key(results).items() if k != key)
    assert continued.info.status == "FINISHED" and curve(results, continued.info.run_id)[-1][0] == 600


def test_bad_input_is_one_line_and_changes_nothing(trained, tmp_path):
    scratch, results, run_id = trained
    suites = sorted((results / "suites").iterdir())
    for arguments, message in (
        (("not-a-run", "--steps", "10"), "no MLflow run 'not-a-run'"),
        (("0123456789abcdef", "--steps", "10"), "no finished run with run key 0123456789abcdef"),
        ((run_id, "--steps", "0"), "--steps must be a positive number"),
        ((run_id, "--steps", "10", "--eval-every", "0"), "--eval-every must be a positive number"),
    ):
        completed = run_cli_in_process("continue", *arguments, "--results-dir", str(results), cwd=scratch)
        assert completed.returncode == 2 and len(completed.stderr.strip().splitlines()) == 1, completed.stderr
        assert message in completed.stderr, completed.stderr
    # steps that end before the first update (PPO: one rollout of 4 x 64; DQN: its refilled buffer, then update_every)
    short = run_cli_in_process("continue", run_id, "--steps", "255", "--results-dir", str(results), cwd=scratch)
    assert short.returncode == 2 and short.stderr.strip().splitlines() == [
        "error: ppo on CartPole-v1: 255 env steps end before the first gradient step, at env step 256 "
        "(one rollout: num_envs 4 x num_steps 64): give --steps 256 or more, or lower those settings with --set"
    ], short.stderr
    elsewhere = run_cli_in_process("continue", run_id, "--steps", "10", "--results-dir", str(tmp_path / "none"), cwd=tmp_path)
    assert elsewhere.returncode == 2 and ("holds no tracking store" in elsewhere.stderr or "does not exist" in elsewhere.stderr)
    assert sorted((results / "suites").iterdir()) == suites and not (tmp_path / "none").exists()


def test_a_continued_run_killed_midway_resumes_exactly(tmp_path):
    """SAC continued from its final checkpoint, stopped after its first checkpoint and resumed:
    the same evaluations as the continued run never stopped."""
    import dataclasses

    import agents
    from benchmark.config import Budget, RunSpec
    from benchmark.training import loop

    settings = {"learning_starts": 100, "batch_size": 32, "hidden_sizes": [16, 16]}
    origin = RunSpec("origin", "sac", "Pendulum-v1", 0, agents.resolve_config("sac", settings).to_dict(), Budget(400, 200, 2), "cpu", 1, settings)
    for directory in ("a", "b"):
        loop.run(origin, checkpoint_dir=tmp_path / directory)
    continued = dataclasses.replace(origin, budget=Budget(1000, 200, 2), continued_from=origin.run_key, checkpoint_every=100, checkpoint_replay_buffer=True)
    never_stopped = loop.run(continued, checkpoint_dir=tmp_path / "a")
    assert [e.step for e in never_stopped.evaluations] == [600, 800, 1000]

    class Killed(Exception):
        pass

    def die(step, total, last_eval):
        if step >= 750:
            raise Killed()

    with pytest.raises(Killed):
        loop.run(continued, progress=die, checkpoint_dir=tmp_path / "b")
    payload = checkpoint.load(tmp_path / "b" / continued.run_key / checkpoint.LATEST)
    assert payload["loop"]["step"] == 700 and payload["loop"]["first_step"] == 400
    resumed = loop.run(continued, checkpoint_dir=tmp_path / "b", resume=payload)
    assert [(e.step, e.returns) for e in resumed.evaluations] == [(e.step, e.returns) for e in never_stopped.evaluations]
    with pytest.raises(Exception, match="no final checkpoint"):
        loop.run(dataclasses.replace(continued, continued_from="0123456789abcdef"), checkpoint_dir=tmp_path / "c")
