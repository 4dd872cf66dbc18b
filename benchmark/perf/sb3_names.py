"""Our hyperparameters as Stable-Baselines3's constructor arguments (sb3-contrib's for TRPO; SBX
takes SB3's): one table of names and the few conversions, read by ``make perf``'s cases
(``benchmark.perf.cases``) and by ``parity``'s settings (``benchmark.perf.parity_settings``),
so that a setting is written once, in our names.

Where SB3 has no argument for one of our settings, the setting must hold the value SB3 builds
in (``FIXED``): a setting SB3 cannot express is refused rather than silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RENAMED: dict[str, str] = {
    "num_steps": "n_steps",
    "num_epochs": "n_epochs",
    "learning_rate": "learning_rate",
    "gamma": "gamma",
    "gae_lambda": "gae_lambda",
    "clip_range": "clip_range",
    "entropy_coef": "ent_coef",
    "max_grad_norm": "max_grad_norm",
    "buffer_size": "buffer_size",
    "batch_size": "batch_size",
    "learning_starts": "learning_starts",
    "update_every": "train_freq",
    "gradient_steps": "gradient_steps",
    "tau": "tau",
    "policy_delay": "policy_delay",
    "target_policy_noise": "target_policy_noise",
    "target_noise_clip": "target_noise_clip",
    "noise_sigma": "action_noise_sigma",
    "exploration_fraction": "exploration_fraction",
    "epsilon_start": "exploration_initial_eps",
    "epsilon_final": "exploration_final_eps",
    "rmsprop_eps": "rms_prop_eps",
    "value_epochs": "n_critic_updates",
    "max_kl": "target_kl",
    "cg_iterations": "cg_max_steps",
    "cg_damping": "cg_damping",
    "line_search_shrink": "line_search_shrinking_factor",
    "line_search_max_steps": "line_search_max_iter",
}
"""Our name -> SB3's, the value unchanged (``action_noise_sigma`` is the peer runner's: a
``NormalActionNoise`` of that scale per action dimension)."""

NORMALIZED_ADVANTAGES = {"a2c", "trpo"}
"""Where SB3 takes ``normalize_advantage`` (PPO's is always on: ours must be ``center_adv``)."""

VALUE_COEF_PER_SB3_VF_COEF = 2.0
"""Our value loss is 0.5 (V - R)^2 (as baselines' ppo2 and CleanRL write it); SB3's is
F.mse_loss, (V - R)^2: SB3's vf_coef 0.5 is our value_coef 1.0 (the weight matters through the
joint gradient-norm clip)."""

FIXED: dict[str, Any] = {
    "value_clip_range": None,  # SB3's clip_range_vf default (no value clipping)
    "anneal_lr": False,  # a constant learning rate
    "entropy_method": ("no_entropy", "regularized"),  # ent_coef carries the rest
    "rmsprop_alpha": 0.99,  # SB3's A2C builds RMSprop with alpha 0.99
    "critic_weight_decay": 0.0,
    "exploration_noise": "gaussian",
    "double_q": False,  # SB3's DQN: one network picks and values the target action
    "dueling": False,
    "huber": True,  # smooth L1
    "shared_network": False,  # separate policy and value networks (net_arch pi / vf)
}
"""Our settings without an SB3 argument: the value (or values) SB3's own matches."""

CONVERTED = {
    *("num_envs", "normalize_observations", "normalize_rewards", "clip_observations", "clip_rewards"),
    *("hidden_sizes", "activation", "initial_log_std", "num_minibatches", "value_num_minibatches", "value_coef", "center_adv", "optimizer"),
    *("actor_lr", "critic_lr", "alpha_lr", "alpha", "initial_alpha", "num_critics", "start_steps", "target_update_every"),
}
"""Our settings translated below (or, the env's, by ``peer_runner_of`` into the peer runner's
``n_envs`` and ``normalize``), not by name."""

NOT_TAKEN: dict[str, dict[str, Any]] = {
    "trpo": {"ent_coef": 0.0},  # sb3-contrib's TRPO has no entropy term
    "ddpg": {"policy_delay": 1, "target_policy_noise": 0.0},  # SB3's DDPG is TD3 with these fixed
}
"""Arguments an algorithm's SB3 class does not take: the value it builds in."""

BURST_TARGET_INTERVAL = 10
"""SB3's target_update_interval for a target copied once after each burst of gradient steps
(ours: ``target_update_every`` = ``gradient_steps``): SB3 counts env steps and copies at every
multiple of the interval, and between two bursts every copy after the first copies the same
weights, so any interval shorter than the bursts' spacing is one copy per burst."""

ON_POLICY = {"ppo", "a2c", "trpo"}
CRITICS = {"ddpg": 1, "td3": 2, "sac": 2}


class Untranslatable(ValueError):
    """A setting of ours that SB3 cannot express."""


def to_sb3(algo: str, ours: Mapping[str, Any]) -> dict[str, Any]:
    """``ours`` (our hyperparameter names and values for ``algo``) as SB3's constructor
    arguments; an ``Untranslatable`` naming the first setting SB3 cannot express."""
    ours = dict(ours)
    peer: dict[str, Any] = {}
    for name, value in ours.items():
        if name in RENAMED:
            peer[RENAMED[name]] = value
        elif name in FIXED:
            allowed = FIXED[name] if isinstance(FIXED[name], tuple) else (FIXED[name],)
            if value not in allowed:
                raise Untranslatable(f"{algo}: {name}={value!r} has no SB3 argument (SB3 builds in {FIXED[name]!r})")
        elif name not in CONVERTED:
            raise Untranslatable(f"{algo}: {name} has no SB3 argument in benchmark.perf.sb3_names")
    if algo in ON_POLICY:
        _on_policy(algo, ours, peer)
    else:
        _off_policy(algo, ours, peer)
    for argument, built_in in NOT_TAKEN.get(algo, {}).items():
        if peer.pop(argument, built_in) != built_in:
            raise Untranslatable(f"{algo}: SB3's {algo.upper()} takes no {argument} (it builds in {built_in!r})")
    return peer


def peer_runner_of(algo: str, ours: Mapping[str, Any]) -> dict[str, Any]:
    """``to_sb3`` with the parity runner's own two keys: ``n_envs`` (on-policy; off-policy runs
    step one env) and ``normalize`` (SB3's VecNormalize of observations and rewards, each
    clipped at 10)."""
    normalize = bool(ours.get("normalize_observations", False))
    if normalize != bool(ours.get("normalize_rewards", False)):
        raise Untranslatable(f"{algo}: VecNormalize normalizes observations and rewards together")
    if normalize and (ours.get("clip_observations", 10.0), ours.get("clip_rewards", 10.0)) != (10.0, 10.0):
        raise Untranslatable(f"{algo}: VecNormalize clips observations and rewards at 10")
    num_envs = int(ours.get("num_envs", 1))
    if algo not in ON_POLICY and num_envs != 1:
        raise Untranslatable(f"{algo}: the parity runner steps one env off-policy (num_envs={num_envs})")
    runner = {"n_envs": num_envs} if algo in ON_POLICY else {}
    return {**runner, **({"normalize": True} if normalize else {}), **to_sb3(algo, ours)}


def _on_policy(algo: str, ours: dict[str, Any], peer: dict[str, Any]) -> None:
    rollout = int(ours.get("num_steps", 0)) * int(ours.get("num_envs", 1))
    if "num_minibatches" in ours:
        peer["batch_size"] = rollout // int(ours["num_minibatches"])
    if "value_num_minibatches" in ours:
        peer["batch_size"] = rollout // int(ours["value_num_minibatches"])
    if "value_coef" in ours:
        peer["vf_coef"] = ours["value_coef"] / VALUE_COEF_PER_SB3_VF_COEF
    if "center_adv" in ours:
        if algo in NORMALIZED_ADVANTAGES:
            peer["normalize_advantage"] = ours["center_adv"]
        elif not ours["center_adv"]:
            raise Untranslatable(f"{algo}: SB3 always normalizes its advantages (center_adv=False)")
    if ours.get("optimizer", "adam") == "rmsprop":
        peer["use_rms_prop"] = True
    if "hidden_sizes" in ours:
        sizes = list(ours["hidden_sizes"])
        peer["policy_kwargs"] = {
            "net_arch": {"pi": sizes, "vf": sizes},
            "activation_fn": ours.get("activation", "tanh"),
            "log_std_init": ours.get("initial_log_std", 0.0),
        }


def _off_policy(algo: str, ours: dict[str, Any], peer: dict[str, Any]) -> None:
    if "start_steps" in ours and ours["start_steps"] != ours.get("learning_starts"):
        raise Untranslatable(f"{algo}: SB3 acts at random until learning_starts: start_steps must equal it")
    rates = {ours[name] for name in ("actor_lr", "critic_lr", "alpha_lr") if name in ours}
    if len(rates) > 1:
        raise Untranslatable(f"{algo}: SB3 trains every network at one learning_rate (actor_lr, critic_lr, alpha_lr differ)")
    if rates:
        peer["learning_rate"] = rates.pop()
    if algo in CRITICS and ours.get("num_critics", CRITICS[algo]) != CRITICS[algo]:
        raise Untranslatable(f"{algo}: SB3's {algo.upper()} trains {CRITICS[algo]} critics")
    if algo == "sac" and ("alpha" in ours or "initial_alpha" in ours):
        alpha = ours.get("alpha")
        peer["ent_coef"] = f"auto_{ours.get('initial_alpha', 1.0)}" if alpha is None else alpha
    if "target_update_every" in ours:
        # ours counts gradient steps, SB3 env steps
        every, steps, update_every = int(ours["target_update_every"]), int(ours.get("gradient_steps", 1)), int(ours.get("update_every", 1))
        if every == steps and update_every > BURST_TARGET_INTERVAL:
            peer["target_update_interval"] = BURST_TARGET_INTERVAL
        elif every * update_every % steps == 0:
            peer["target_update_interval"] = every * update_every // steps
        else:
            raise Untranslatable(f"{algo}: target_update_every={every} is no whole number of SB3's env steps")
    if "hidden_sizes" in ours:
        peer["policy_kwargs"] = {"net_arch": list(ours["hidden_sizes"]), "activation_fn": ours.get("activation", "relu")}
