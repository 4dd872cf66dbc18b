"""Suite parsing, validation and expansion into run specs."""

import pytest

from agents.api import ConfigError
from benchmark.config import Budget, load_suite


def test_tiny_suite_expands_to_specs(tiny_suite):
    suite = load_suite(str(tiny_suite))
    assert [spec.label for spec in suite.specs] == ["ppo/CartPole-v1/seed0", "ppo/CartPole-v1/seed1", "sac/Pendulum-v1/seed0"]
    ppo = suite.specs[0]
    assert ppo.hyperparameters["num_envs"] == 2 and ppo.hyperparameters["clip_range"] == 0.2  # override + default
    assert ppo.budget == Budget(512, 256, 2)
    assert suite.specs[2].budget == Budget(300, 150, 2)  # experiment budget merged over the suite's


def test_run_keys_are_stable_and_distinct(tiny_suite):
    first, second = load_suite(str(tiny_suite)), load_suite(str(tiny_suite))
    assert [s.run_key for s in first.specs] == [s.run_key for s in second.specs]
    assert len({s.run_key for s in first.specs}) == 3


def test_run_key_changes_with_any_hyperparameter(write_suite, tiny_suite):
    base = load_suite(str(tiny_suite)).specs[0]
    changed = write_suite(open(tiny_suite).read().replace("num_epochs: 2", "num_epochs: 3"), "changed.yaml")
    assert load_suite(str(changed)).specs[0].run_key != base.run_key


def test_seed_override_and_grid(write_suite):
    path = write_suite(
        """
        seeds: 2
        budget: {total_steps: 100, eval_every: 50}
        experiments:
          - algo: ppo
            envs: [CartPole-v1, Acrobot-v1]
            grid: {learning_rate: [1.0e-3, 3.0e-4], num_epochs: [1, 2]}
        """
    )
    assert len(load_suite(str(path)).specs) == 2 * 4 * 2
    specs = load_suite(str(path), seeds=[5]).specs
    assert len(specs) == 8 and {s.seed for s in specs} == {5}
    assert {s.hyperparameters["learning_rate"] for s in specs} == {1e-3, 3e-4}


def test_shipped_suites_are_valid():
    smoke = load_suite("smoke")
    assert len(smoke.specs) == 6 and {s.env_id for s in smoke.specs} == {"CartPole-v1", "Pendulum-v1"}
    mujoco = load_suite("mujoco")
    assert len(mujoco.specs) == 400 and all(s.budget.total_steps == 1_000_000 for s in mujoco.specs)
    assert {s.algo for s in mujoco.specs} == {"ppo", "trpo", "a2c", "vpg", "ddpg", "td3", "sac", "mpo"}
    classic = load_suite("classic")
    on_policy = ("vpg", "reinforce", "a2c", "ppo", "ppo_kl", "surrogate_pg", "trpo")
    assert {(s.algo, s.env_id) for s in classic.specs} == {
        ("dqn", "CartPole-v1"),
        ("dqn", "Acrobot-v1"),
        ("ddpg", "Pendulum-v1"),
        ("td3", "Pendulum-v1"),
        ("sac", "Pendulum-v1"),
        ("mpo", "Pendulum-v1"),
        *((algo, env) for algo in on_policy for env in ("CartPole-v1", "Acrobot-v1", "Pendulum-v1", "InvertedPendulum-v5")),
    }
    assert len(classic.specs) == 5 * (6 + 4 * len(on_policy))
    memory = load_suite("memory")
    assert sorted(str(s.hyperparameters["recurrent"]) for s in memory.specs) == ["gru"] * 3 + ["none"] * 3
    her = load_suite("her")
    assert sorted(s.hyperparameters["her_strategy"] for s in her.specs) == ["future"] * 3 + ["none"] * 3


@pytest.mark.parametrize(
    "body,message",
    [
        (
            "experiments: [{algo: ppx, envs: [CartPole-v1]}]",
            r"experiments\[0\]: unknown algorithm 'ppx' \(did you mean 'ppo'\?\); "
            r"available: a2c, .*dqn, .*mpo, .*ppo, ppo_kl, .*reinforce, sac, surrogate_pg, td3, trpo, vpg",
        ),
        ("experiments: [{algo: ppo, envs: [CartPole-v7]}]", r"unknown environment 'CartPole-v7' \(did you mean 'CartPole-v1'\?\)"),
        ("experiments: [{algo: ppo, envs: [CartPole-v1], hyperparameters: {lr: 0.1}}]", r"unknown hyperparameter 'lr' for PPOConfig"),
        ("experiments: [{algo: ppo, envs: [CartPole-v1], hyperparameters: {gae_lambda: 2}}]", r"'gae_lambda' must be <= 1.0"),
        ("experiments: [{algo: td3, envs: [CartPole-v1]}]", r"td3 needs continuous \(Box\) actions; CartPole-v1 has Discrete\(2\)"),
        ("experiments: [{algo: sac, envs: [Pendulum-v1], hyperparameters: {her_strategy: future}}]", r"needs a goal env; Pendulum-v1 has no desired_goal"),
        ("experiments: [{algo: td3, envs: [Pendulum-v1], hyperparameters: {recurrent: gru}}]", r"td3 has no recurrent variant"),
        ("experiments: [{algo: ppo, envs: [CartPole-v1], budgett: {}}]", r"unknown experiment key 'budgett' \(did you mean 'budget'\?\)"),
        ("experiments: [{algo: ppo, envs: [CartPole-v1], grid: {learning_rate: 0.1}}]", r"grid.learning_rate must be a non-empty list"),
        ("experiments: []", r"'experiments' must be a non-empty list"),
        (
            "experiments: [{algo: ppo, envs: [CartPole-v1], budget: {total_step: 5}}]",
            r"experiments\[0\]: unknown budget key 'total_step' \(did you mean 'total_steps'\?\); valid: eval_episodes, eval_every, total_steps$",
        ),
        ("experiments: [{algo: ppo, envs: [CartPole-v1], budget: {total_steps: -5}}]", r"budget.total_steps must be a positive integer"),
    ],
)
def test_invalid_suites_name_the_problem(write_suite, body, message):
    """Each problem in one line, at its place (file, then experiment), with a close match where one is."""
    path = write_suite(f"seeds: [0]\nbudget: {{total_steps: 100, eval_every: 50}}\n{body}\n")
    with pytest.raises(ConfigError, match=message):
        load_suite(str(path))


def test_a_suite_level_budget_key_is_named_at_the_suite_level(write_suite):
    path = write_suite("seeds: [0]\nbudget: {total_step: 100, eval_every: 50}\nexperiments: [{algo: ppo, envs: [CartPole-v1]}]\n")
    with pytest.raises(ConfigError, match=r"suite.yaml: unknown budget key 'total_step' \(did you mean 'total_steps'\?\)"):
        load_suite(str(path))
    path = write_suite("seeds: [0]\nbudget: {eval_every: 50}\nexperiments: [{algo: ppo, envs: [CartPole-v1]}]\n")
    with pytest.raises(ConfigError, match=r"experiments\[0\]: budget: total_steps missing \(in the suite's budget or the experiment's\)"):
        load_suite(str(path))


def test_malformed_yaml_and_missing_keys(write_suite):
    with pytest.raises(ConfigError, match=r"suite.yaml:2:\d+: YAML syntax error: .*flow sequence opened at line 1"):
        load_suite(str(write_suite("seeds: [0\nbudget: {")))
    with pytest.raises(ConfigError, match="missing required key 'budget'"):
        load_suite(str(write_suite("seeds: [0]\nexperiments: []\n")))
    with pytest.raises(ConfigError, match="unknown suite key 'seed'"):
        load_suite(str(write_suite("seed: [0]\nbudget: {}\nexperiments: []\n")))
    with pytest.raises(ConfigError, match="seeds repeat"):
        load_suite(str(write_suite("seeds: [0, 0]\nbudget: {total_steps: 1, eval_every: 1}\nexperiments: [{algo: ppo, envs: [CartPole-v1]}]\n")))


def test_unknown_suite_lists_available():
    with pytest.raises(ConfigError, match=r"unknown suite 'smok' \(did you mean 'smoke'\?\); available: .*smoke"):
        load_suite("smok")


def test_seeds_per_process_is_read_per_suite_and_experiment_and_is_not_part_of_the_run_key(write_suite, tiny_suite):
    path = write_suite(
        """
        seeds: 3
        seeds_per_process: 3
        budget: {total_steps: 100, eval_every: 50}
        experiments:
          - algo: ppo
            envs: [CartPole-v1]
          - algo: dqn
            envs: [CartPole-v1]
            seeds_per_process: 2
        """
    )
    suite = load_suite(str(path))
    assert [(s.algo, s.seeds_per_process) for s in suite.specs] == [("ppo", 3)] * 3 + [("dqn", 2)] * 3
    assert {s.seeds_per_process for s in suite.with_seeds_per_process(5).specs} == {5}
    assert suite.with_seeds_per_process(None) is suite
    plain = write_suite("\n".join(line for line in path.read_text().splitlines() if "seeds_per_process" not in line), "plain.yaml")
    assert {s.seeds_per_process for s in load_suite(str(plain)).specs} == {1}
    assert [s.run_key for s in load_suite(str(plain)).specs] == [s.run_key for s in suite.specs]


@pytest.mark.parametrize(("where", "value"), [("suite", 0), ("suite", "four"), ("experiment", True), ("experiment", -2)])
def test_bad_seeds_per_process_is_a_clear_error(write_suite, where, value):
    suite_line = f"seeds_per_process: {value!r}\n" if where == "suite" else ""
    experiment_line = f", seeds_per_process: {str(value).lower()}" if where == "experiment" else ""
    path = write_suite(
        f"seeds: 2\n{suite_line}budget: {{total_steps: 100, eval_every: 50}}\nexperiments: [{{algo: ppo, envs: [CartPole-v1]{experiment_line}}}]\n"
    )
    with pytest.raises(ConfigError, match="seeds_per_process must be a positive integer"):
        load_suite(str(path))


# ---------------------------------------------------------------- one name per concept


def test_garage_names_are_accepted_as_aliases_and_other_old_names_are_refused_with_the_new_one():
    import agents

    ppo = agents.resolve_config("ppo", {"policy_ent_coeff": 0.01, "entropy_method": "regularized"})
    assert ppo.entropy_coef == 0.01 and "policy_ent_coeff" not in ppo.to_dict()
    pearl = agents.resolve_config("pearl", {"soft_target_tau": 0.01, "replay_buffer_size": 5000, "qf_lr": 1e-3})
    assert (pearl.tau, pearl.buffer_size, pearl.critic_lr) == (0.01, 5000, 1e-3)
    with pytest.raises(ConfigError, match="'entropy_coef' is given twice"):
        agents.resolve_config("ppo", {"policy_ent_coeff": 0.01, "entropy_coef": 0.02})
    with pytest.raises(ConfigError, match="did you mean 'entropy_coef'"):
        agents.resolve_config("vpg", {"entropy_coeff": 0.01})
    # YAML null, the earlier spelling of a feed-forward policy
    assert agents.resolve_config("ppo", {"recurrent": None}).recurrent == "none"


def test_a_renamed_field_is_refused_under_its_old_name_yet_stored_runs_keep_loading_and_their_key():
    """MAML's baseline_reg_coeff became baseline_reg_coef (one spelling of coefficient per
    config): a suite giving the old name is refused with the new one suggested; a spec stored
    under the old name (a checkpoint, an MLflow run) loads under the new name with the run key
    it was recorded under."""
    import agents
    from benchmark.config import Budget, RunSpec

    with pytest.raises(ConfigError, match="unknown hyperparameter 'baseline_reg_coeff' .*did you mean 'baseline_reg_coef'"):
        agents.resolve_config("maml_trpo", {"baseline_reg_coeff": 1e-4})
    with pytest.raises(ConfigError, match="unknown hyperparameter 'value_learning_rate' .*did you mean 'value_lr'"):
        agents.resolve_config("vpg", {"value_learning_rate": 1e-4})
    config = agents.resolve_config("maml_trpo", {"baseline_reg_coef": 1e-4}).to_dict()
    spec = RunSpec("meta", "maml_trpo", "reprorl/PointNav-v0", 0, config, Budget(1000, 500, 2))
    stored = {**spec.to_dict(), "hyperparameters": {("baseline_reg_coeff" if k == "baseline_reg_coef" else k): v for k, v in config.items()}}
    loaded = RunSpec.from_dict(stored)
    assert loaded.hyperparameters["baseline_reg_coef"] == 1e-4 and "baseline_reg_coeff" not in loaded.hyperparameters
    assert loaded.run_key == spec.run_key == stored["run_key"]
    assert agents.resolve_config("maml_trpo", loaded.hyperparameters).baseline_reg_coef == 1e-4
    # and an algorithm's saved state (a checkpoint) that recorded its settings under the old name
    from agents.envs import env_spec

    state = agents.make("maml_trpo", env_spec("reprorl/PointNav-v0"), config, total_steps=1).state_dict()
    state["config"] = stored["hyperparameters"]
    restored = agents.make("maml_trpo", env_spec("reprorl/PointNav-v0"), {}, total_steps=1)
    restored.load_state_dict(state)
    assert restored.config.baseline_reg_coef == 1e-4


@pytest.mark.parametrize(
    "algo,other,ours",
    [
        ("sac", "soft_target_tau", "tau"),
        ("td3", "target_update_tau", "tau"),
        ("ppo", "n_epochs", "num_epochs"),
        ("dqn", "target_update_interval", "target_update_every"),
    ],
)
def test_other_libraries_names_get_ours_suggested(algo, other, ours):
    import agents

    with pytest.raises(ConfigError, match=f"unknown hyperparameter '{other}' .*did you mean '{ours}'"):
        agents.resolve_config(algo, {other: 1})


def test_every_committed_run_keeps_its_run_key():
    """Each run of every committed bundle, configured again from its recorded overrides by the
    code as it is, has the run key it was recorded under: renamed fields are hashed under their
    recorded names (``key_names``), so no record needs retraining because a name changed."""
    import agents
    from benchmark import bundles
    from benchmark.config import PROJECT_ROOT, RunSpec

    checked = 0
    for directory in sorted((PROJECT_ROOT / "results" / "published").iterdir()):
        for key, run in bundles.read(directory).runs.items():
            spec = run.spec
            fresh = RunSpec(spec.suite, spec.algo, spec.env_id, spec.seed, agents.resolve_config(spec.algo, spec.overrides).to_dict(), spec.budget)
            assert fresh.run_key == key, (directory.name, spec.label)
            checked += 1
    assert checked >= 200


@pytest.mark.parametrize(
    "algo,env_id,overrides",
    [
        ("dqn", "CartPole-v1", {"learning_starts": 100, "update_every": 4, "batch_size": 16, "hidden_sizes": [8]}),
        ("sac", "Pendulum-v1", {"learning_starts": 60, "update_every": 3, "batch_size": 16, "hidden_sizes": [8]}),
        ("ppo", "CartPole-v1", {"num_envs": 2, "num_steps": 32, "hidden_sizes": [8]}),
        ("trpo", "Pendulum-v1", {"num_envs": 3, "num_steps": 20, "hidden_sizes": [8]}),
    ],
)
def test_the_first_update_is_where_the_config_says(algo, env_id, overrides):
    """``first_update()`` (what train and continue refuse below) against the loop itself: a budget
    one vector step short of it applies no gradient step, that budget applies one or more."""
    import agents
    from benchmark.config import Budget, RunSpec
    from benchmark.training.hooks import LoopHooks
    from benchmark.training.loop import run

    needed, why = agents.resolve_config(algo, overrides).first_update()
    assert why and needed == (
        overrides["num_envs"] * overrides["num_steps"] if "num_steps" in overrides else overrides["learning_starts"] + overrides["update_every"]
    )
    step = overrides.get("num_envs", 1)

    class Kept(LoopHooks):
        def algorithm(self, algo):
            self.algo = algo
            return algo

    updates = {}
    for steps in (needed - step, needed):
        hooks = Kept()
        run(RunSpec("t", algo, env_id, 0, overrides, Budget(steps, steps, 1), device="cpu"), hooks=hooks)
        updates[steps] = hooks.algo.num_updates
    assert updates[needed - step] == 0 and updates[needed] >= 1, updates


def test_a_config_variant_changes_defaults_only_keeping_each_fields_range_and_docs():
    """``@defaults`` (TD3's over DDPG's): the new defaults, the parent's bounds (a batch of 0 is
    refused as for DDPG), the parent's field docs; a field the parent lacks is a TypeError."""
    import dataclasses

    from agents.config_docs import field_docs
    from agents.configs.ddpg import DDPGConfig, TD3Config
    from agents.errors import ConfigError
    from agents.hyperparameters import defaults

    assert (TD3Config().batch_size, DDPGConfig().batch_size, TD3Config().tau) == (256, 64, 0.005)
    ours, theirs = ({f.name: f for f in dataclasses.fields(cls)} for cls in (TD3Config, DDPGConfig))
    assert list(ours) == list(theirs) and all(ours[name].metadata == theirs[name].metadata for name in ours)
    with pytest.raises(ConfigError, match="batch_size"):
        TD3Config.from_dict({"batch_size": 0})
    docs = {doc.name: doc for doc in field_docs(TD3Config)}
    assert docs["tau"].meaning == {doc.name: doc for doc in field_docs(DDPGConfig)}["tau"].meaning == "Polyak coefficient of the target networks."
    with pytest.raises(TypeError, match="no field 'tua'"):

        @dataclasses.dataclass
        @defaults(tua=0.1)
        class Misspelled(DDPGConfig):
            pass


def test_seeds_per_process_is_also_read_under_its_older_name_and_not_both(write_suite):
    """The suite key took the flag's name (--seeds-per-process): seeds_in_process still reads,
    in a suite and in an experiment, and in a stored spec; both at once is one line of error."""
    from benchmark.config import RunSpec

    body = "name: t\nseeds: [0]\nbudget: {{total_steps: 1000, eval_every: 500}}\n{suite}experiments:\n  - {{algo: ppo, envs: [CartPole-v1]{experiment}}}\n"
    assert load_suite(str(write_suite(body.format(suite="seeds_in_process: 3\n", experiment="")))).specs[0].seeds_per_process == 3
    assert load_suite(str(write_suite(body.format(suite="", experiment=", seeds_in_process: 2")))).specs[0].seeds_per_process == 2
    with pytest.raises(ConfigError, match="seeds_per_process and seeds_in_process are one setting"):
        load_suite(str(write_suite(body.format(suite="seeds_in_process: 3\nseeds_per_process: 3\n", experiment=""))))
    spec = load_suite(str(write_suite(body.format(suite="seeds_per_process: 4\n", experiment="")))).specs[0]
    stored = spec.to_dict()
    stored["seeds_in_process"] = stored.pop("seeds_per_process")
    assert RunSpec.from_dict(stored) == spec
