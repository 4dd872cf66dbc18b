"""Our hyperparameters as Stable-Baselines3's arguments (``benchmark.perf.sb3_names``): hand-worked
translations, the settings SB3 cannot express refused by name, and every argument of every
case and parity setting one that its SB3 class takes."""

import inspect

import pytest

from benchmark.perf import cases, parity_settings, sb3_names
from benchmark.perf.sb3_names import Untranslatable, peer_runner_of, to_sb3


def test_on_policy_sizes_and_coefficients_are_converted():
    peer = to_sb3("ppo", {"num_envs": 4, "num_steps": 512, "num_minibatches": 8, "value_coef": 1.0, "hidden_sizes": (32,), "activation": "tanh"})
    # 4 envs x 512 steps in 8 minibatches; our 0.5 (V - R)^2 at 1.0 is SB3's (V - R)^2 at 0.5
    assert peer == {
        "n_steps": 512,
        "batch_size": 256,
        "vf_coef": 0.5,
        "policy_kwargs": {"net_arch": {"pi": [32], "vf": [32]}, "activation_fn": "tanh", "log_std_init": 0.0},
    }
    assert to_sb3("trpo", {"num_steps": 2048, "value_num_minibatches": 16, "center_adv": False, "max_kl": 0.01}) == {
        "n_steps": 2048,
        "batch_size": 128,
        "normalize_advantage": False,
        "target_kl": 0.01,
    }
    assert to_sb3("a2c", {"optimizer": "rmsprop", "rmsprop_eps": 1e-5}) == {"use_rms_prop": True, "rms_prop_eps": 1e-5}


def test_off_policy_rates_temperature_and_target_copies_are_converted():
    assert to_sb3("sac", {"actor_lr": 3e-4, "critic_lr": 3e-4, "alpha_lr": 3e-4, "initial_alpha": 0.5}) == {"learning_rate": 3e-4, "ent_coef": "auto_0.5"}
    assert to_sb3("sac", {"alpha": 0.2}) == {"ent_coef": 0.2}
    # ours counts the target's period in gradient steps (one per 4 env steps), SB3 in env steps
    assert to_sb3("dqn", {"update_every": 4, "gradient_steps": 1, "target_update_every": 2_500})["target_update_interval"] == 10_000
    # a copy after each burst of 128 gradient steps, 256 env steps apart
    assert to_sb3("dqn", {"update_every": 256, "gradient_steps": 128, "target_update_every": 128})["target_update_interval"] == sb3_names.BURST_TARGET_INTERVAL


@pytest.mark.parametrize(
    "algo,ours,named",
    [
        ("dqn", {"double_q": True}, "double_q=True"),
        ("sac", {"actor_lr": 1e-3, "critic_lr": 3e-4}, "one learning_rate"),
        ("td3", {"start_steps": 100, "learning_starts": 1_000}, "start_steps must equal it"),
        ("td3", {"num_critics": 3}, "trains 2 critics"),
        ("trpo", {"entropy_coef": 0.01}, "takes no ent_coef"),
        ("ddpg", {"policy_delay": 2}, "takes no policy_delay"),
        ("ppo", {"center_adv": False}, "always normalizes"),
        ("ppo", {"value_clip_range": 0.2}, "value_clip_range=0.2"),
        ("ppo", {"recurrent": "gru"}, "recurrent has no SB3 argument"),
        ("dqn", {"update_every": 4, "gradient_steps": 3, "target_update_every": 5}, "no whole number"),
    ],
)
def test_a_setting_sb3_cannot_express_is_refused_by_name(algo, ours, named):
    with pytest.raises(Untranslatable, match=named):
        to_sb3(algo, ours)


def test_the_parity_runner_gets_its_envs_and_normalization():
    ours = {"num_envs": 2, "num_steps": 8, "normalize_observations": True, "normalize_rewards": True}
    assert peer_runner_of("ppo", ours) == {"n_envs": 2, "normalize": True, "n_steps": 8}
    with pytest.raises(Untranslatable, match="together"):
        peer_runner_of("ppo", {**ours, "normalize_rewards": False})
    with pytest.raises(Untranslatable, match="clips"):
        peer_runner_of("ppo", {**ours, "clip_observations": 5.0})
    with pytest.raises(Untranslatable, match="one env"):
        peer_runner_of("sac", {"num_envs": 4})


RUNNER_KEYS = {"n_envs", "normalize", "action_noise_sigma"}  # the peer runners' own (benchmark.perf.peers, parity_worker)


def constructor_arguments(algo: str) -> set[str]:
    module, name = parity_settings.PEERS[algo]
    peer_class = getattr(pytest.importorskip(module), name)
    return set(inspect.signature(peer_class.__init__).parameters)


@pytest.mark.parametrize("algo", sorted(parity_settings.SETTINGS))
def test_every_parity_argument_is_one_its_sb3_class_takes(algo):
    arguments = set(parity_settings.SETTINGS[algo].peer) - RUNNER_KEYS
    assert arguments <= constructor_arguments(algo), arguments - constructor_arguments(algo)


@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_every_perf_case_argument_is_one_its_sb3_class_takes(name):
    arguments = set(cases.CASES[name].sb3) - RUNNER_KEYS
    assert arguments <= constructor_arguments(cases.CASES[name].name), arguments - constructor_arguments(name)
