"""Suites: YAML grids of algorithm x environment x seed x hyperparameters, validated and expanded.

A suite file::

    name: smoke
    description: what it is for
    seeds: [0, 1, 2]            # or a count: 3 means [0, 1, 2]
    budget:                     # defaults for every experiment
      total_steps: 100000
      eval_every: 10000         # env steps between deterministic evaluations
      eval_episodes: 10
    checkpoint:                 # optional: resumable checkpoints (not part of the run key)
      every: 50000              # env steps; default: at every evaluation; 0: only the final one
      replay_buffer: false      # include the replay buffer (large) so off-policy resumes exactly
    seeds_per_process: 5         # optional: train up to 5 seeds of one configuration as one
                                # batched model in one process (not part of the run key)
    experiments:
      - algo: ppo
        envs: [CartPole-v1]
        budget: {total_steps: 150000}     # overrides the suite's budget
        hyperparameters: {num_envs: 4}    # fixed overrides of the published defaults
        env_kwargs: {max_episode_steps: 200}            # optional: for gymnasium.make
        wrappers: [gymnasium.wrappers:TimeAwareObservation]   # optional (agents.env_setup)
        continued_from: 3f2a...      # optional: the run key of a finished run this one trains further
        grid: {learning_rate: [2.5e-4, 1e-3]}   # optional: one run per combination
        seeds_per_process: 1               # overrides the suite's for this experiment

Each expanded RunSpec has a stable run key: a hash of the algorithm, environment (with its
env_kwargs and wrappers, where set), seed, fully resolved hyperparameters and budget.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import agents
from agents.env_setup import EnvSetup, parse_env_kwargs, parse_wrappers, setup_of
from agents.envs import check_env_id, env_spec
from agents.errors import ConfigError, suggest
from agents.registry import known_config
from benchmark.devices import check_device_name
from benchmark.distributed_config import check_capturable, check_distributable, check_distributed, check_seeds_per_process, check_slurm
from benchmark.yaml_input import OLD_KEY_NAMES, as_mapping, check_keys, read_yaml, renamed_keys

PROJECT_ROOT = Path(__file__).resolve().parent.parent
"""The checkout: suites/, results/ (reference scores, baselines, throughput) are found from here."""
SUITES_DIR = PROJECT_ROOT / "suites"
RUN_KEY_VERSION = 1  # bump when the meaning of a RunSpec field changes


def key_form(algo: str, hyperparameters: dict[str, Any]) -> dict[str, Any]:
    """``hyperparameters`` as run keys hash them: fields renamed since runs were first recorded
    under their recorded names (``Hyperparameters.key_form``), so a rename retrains nothing; as
    they are for an algorithm this installation does not have."""
    config = known_config(algo)
    return hyperparameters if config is None else config.key_form(hyperparameters)


def stored_hyperparameters(algo: str, hyperparameters: dict[str, Any]) -> dict[str, Any]:
    """Hyperparameters a stored run recorded, under this version's names (fields renamed since
    read under their new names); unchanged for an algorithm this version does not know."""
    config = known_config(algo)
    return hyperparameters if config is None else config.from_stored(hyperparameters)


@dataclass(frozen=True)
class Budget:
    """How long a run trains and how it is evaluated."""

    total_steps: int
    """Environment steps, summed over parallel envs."""
    eval_every: int
    """Environment steps between deterministic evaluations (one more at the end)."""
    eval_episodes: int = 10
    """Episodes per evaluation, on a separate env with frozen normalization statistics."""

    def __post_init__(self) -> None:
        for name in ("total_steps", "eval_every", "eval_episodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"budget.{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines one training run."""

    suite: str
    algo: str
    env_id: str
    seed: int
    hyperparameters: dict[str, Any]
    """Fully resolved: the algorithm's defaults with the suite's overrides applied."""
    budget: Budget
    device: str = "auto"
    """'auto' (CUDA when available, else CPU), 'cpu', 'cuda' or 'cuda:i'; not part of the run key."""
    torch_threads: int = 1
    """Intra-op threads per run; runs are parallel across processes instead."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """The hyperparameters the suite set explicitly (for display)."""
    checkpoint_every: int | None = None
    """Env steps between resumable checkpoints; None: at every evaluation; 0: only the final one.
    Not part of the run key (a resumed run continues the same run)."""
    checkpoint_replay_buffer: bool = False
    """Whether checkpoints hold the replay buffer (GBs for MuJoCo); without it a resumed
    off-policy run refills its buffer before updating again. Not part of the run key."""
    seeds_per_process: int = 1
    """Runs of this configuration that differ only by seed and train in one process as one
    batched model (``benchmark.training.loop.run_seeds``), at most this many. Each stays its own run,
    with its own run key and MLflow run. Not part of the run key."""
    distributed: dict[str, Any] | None = None
    """This run's workers (``check_distributed``: collectors, mode, backend), or None: it trains
    in one process. Synchronous collection trains exactly as one process: not part of the run key."""
    cuda_graphs: bool = False
    """Capture each gradient step as a CUDA graph and replay it (``agents.algos.graphs``: SAC,
    TD3 and DDPG on a GPU). A replay runs the eager step's kernels: not part of the run key."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``gymnasium.make``; part of the run key when set."""
    wrappers: list[dict[str, dict[str, Any]]] = field(default_factory=list)
    """Wrappers of each sub-env, innermost first, ``{import path: kwargs}``; in the key when set."""
    continued_from: str | None = None
    """The run key of the finished run this one continues from its ``final.pt`` (its budget
    counts the steps before); in the key when set."""

    def __post_init__(self) -> None:
        every = self.checkpoint_every
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 0):
            raise ConfigError(f"checkpoint.every must be a non-negative integer (0: only the final checkpoint), got {every!r}")
        check_seeds_per_process(self.seeds_per_process, "seeds_per_process")
        if self.distributed is not None:
            object.__setattr__(self, "distributed", check_distributed(self.distributed, "distributed"))
            if self.seeds_per_process > 1:
                raise ConfigError("distributed: a run over several workers trains one seed; set seeds_per_process to 1")
            check_distributable(self.algo, self.hyperparameters, self.distributed, self.device)
        if self.cuda_graphs:
            check_capturable(self.algo, self.hyperparameters, self.device, self.distributed)
        if self.wrappers and self.hyperparameters.get("her_strategy", "none") != "none":
            raise ConfigError("wrappers: hindsight relabeling recomputes rewards with the env's own compute_reward, which a wrapper may change")
        if self.continued_from is not None and (self.distributed is not None or agents.is_meta(self.algo)):
            raise ConfigError("continued_from: a continued run trains in one process, and not a meta-learner's (its task envs start anew)")

    @property
    def env(self) -> EnvSetup:
        """How this run makes its environment."""
        return setup_of(self.env_id, self.env_kwargs, self.wrappers)

    @property
    def checkpoint_interval(self) -> int:
        """Env steps between checkpoints (0: none before the final one)."""
        return self.budget.eval_every if self.checkpoint_every is None else self.checkpoint_every

    @property
    def run_key(self) -> str:
        identity = {
            "version": RUN_KEY_VERSION,
            "algo": self.algo,
            "env_id": self.env_id,
            "seed": self.seed,
            "hyperparameters": key_form(self.algo, self.hyperparameters),
            "budget": dataclasses.asdict(self.budget),
        }
        if self.env_kwargs:  # only when set: the keys of runs without them stay as they were
            identity["env_kwargs"] = self.env_kwargs
        if self.wrappers:
            identity["wrappers"] = self.wrappers
        if self.continued_from is not None:
            identity["continued_from"] = self.continued_from
        blob = json.dumps(identity, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def label(self) -> str:
        return f"{self.algo}/{self.env_id}/seed{self.seed}"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "run_key": self.run_key}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        """A spec as ``to_dict`` stored it (a checkpoint, an MLflow run's config.json), its
        hyperparameters under this version's names (``stored_hyperparameters``)."""
        data = {k: v for k, v in data.items() if k != "run_key"}
        if "seeds_in_process" in data:  # stored before the field took the flag's name
            data["seeds_per_process"] = data.pop("seeds_in_process")
        hyperparameters = stored_hyperparameters(data["algo"], data["hyperparameters"])
        return cls(**{**data, "hyperparameters": hyperparameters, "budget": Budget(**data["budget"])})


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    path: Path
    specs: list[RunSpec]
    slurm: dict[str, Any] = field(default_factory=dict)
    """The suite's ``slurm:`` options for ``--executor slurm`` (keys: SLURM_KEYS), checked."""

    def with_checkpointing(self, every: int | None = None, replay_buffer: bool | None = None) -> Suite:
        """The same runs with the checkpoint settings given (None keeps the suite's)."""
        changes: dict[str, Any] = {}
        if every is not None:
            changes["checkpoint_every"] = every
        if replay_buffer is not None:
            changes["checkpoint_replay_buffer"] = replay_buffer
        return dataclasses.replace(self, specs=[dataclasses.replace(spec, **changes) for spec in self.specs]) if changes else self

    def with_distributed(self, settings: dict[str, Any] | None) -> Suite:
        """The same runs over the workers of ``settings`` (merged into each experiment's; None
        keeps the suite's); ConfigError where a run cannot train so."""
        if settings is None:
            return self
        return dataclasses.replace(
            self, specs=[dataclasses.replace(spec, distributed={**(spec.distributed or {}), **settings}, seeds_per_process=1) for spec in self.specs]
        )

    def with_cuda_graphs(self, on: bool) -> Suite:
        """The same runs with their gradient steps captured as CUDA graphs (False keeps the suite's)."""
        return dataclasses.replace(self, specs=[_with_cuda_graphs(spec) for spec in self.specs]) if on else self

    def with_seeds_per_process(self, count: int | None) -> Suite:
        """The same runs trained ``count`` seeds to a process (None keeps the suite's)."""
        if count is None:
            return self
        return dataclasses.replace(self, specs=[dataclasses.replace(spec, seeds_per_process=count) for spec in self.specs])

    def select(self, algos: list[str] | None = None, envs: list[str] | None = None) -> Suite:
        """The runs of the given algorithms and environments only (None: all); ConfigError
        for a name the suite does not contain."""
        specs = self.specs
        for what, names, attribute in (("algorithm", algos, "algo"), ("environment", envs, "env_id")):
            if names is None:
                continue
            present = sorted({getattr(spec, attribute) for spec in self.specs})
            for name in names:
                if name not in present:
                    raise ConfigError(f"suite {self.name!r} has no {what} {name!r}{suggest(name, present)}; it has {', '.join(present)}")
            specs = [spec for spec in specs if getattr(spec, attribute) in names]
        return dataclasses.replace(self, specs=specs)


def configurations(specs: list[RunSpec]) -> list[tuple[str, list[RunSpec]]]:
    """The specs grouped by configuration (environment, algorithm, hyperparameters, budget): the
    seeds of one configuration together, in first-seen order, each group with its label: the
    algorithm, and where one algorithm has several configurations on an environment, the
    settings that tell them apart (``ppo [learning_rate=0.001]``)."""
    groups: dict[tuple[str, str, str], list[RunSpec]] = {}
    for spec in specs:
        identity = json.dumps({"hp": spec.hyperparameters, "budget": dataclasses.asdict(spec.budget), "env": [spec.env_kwargs, spec.wrappers]}, sort_keys=True)
        groups.setdefault((spec.env_id, spec.algo, identity), []).append(spec)
    labels = {key: key[1] for key in groups}
    by_algo_env: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for key in groups:
        by_algo_env.setdefault(key[:2], []).append(key)
    for variants in by_algo_env.values():
        if len(variants) < 2:
            continue
        settings = [_settings(groups[key][0]) for key in variants]
        differing = sorted({k for setting in settings for k in setting if any(setting.get(k) != other.get(k) for other in settings)})
        for number, (key, setting) in enumerate(zip(variants, settings), start=1):
            described = ", ".join(f"{k}={setting.get(k, 'default')}" for k in differing) or f"variant {number}"
            labels[key] = f"{key[1]} [{described}]"
    return [(labels[key], members) for key, members in groups.items()]


def _settings(spec: RunSpec) -> dict[str, Any]:
    """What a configuration sets, flat, for telling configurations apart in labels."""
    settings = {**spec.overrides, **{f"budget.{k}": v for k, v in dataclasses.asdict(spec.budget).items()}}
    settings.update({f"env_kwargs.{k}": v for k, v in spec.env_kwargs.items()})
    if spec.wrappers:
        settings["wrappers"] = "+".join(next(iter(w)).replace(":", ".").rpartition(".")[2] for w in spec.wrappers)
    return settings


# --------------------------------------------------------------------------------------------


def name_from(text: str) -> str:
    """``text`` as a suite or study name may hold it: letters, digits, '.', '_' and '-' (an
    import path's ':' and a namespace's '/' become '_')."""
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", text).strip("._-")


def available_suites() -> list[str]:
    """``suites/<name>.yaml``, then the suites ``tune export`` wrote: ``tuned/<algo>-<env>``."""
    return sorted(p.stem for p in SUITES_DIR.glob("*.yaml")) + sorted(f"tuned/{p.stem}" for p in (SUITES_DIR / "tuned").glob("*.yaml"))


def suite_path(name_or_path: str) -> Path:
    """``suites/<name>.yaml`` (``tuned/<name>`` is ``suites/tuned/<name>.yaml``), or a path to a YAML file."""
    candidate = Path(name_or_path)
    if candidate.is_dir():
        raise ConfigError(f"--suite {name_or_path} is a directory; give a suite file (a .yaml path) or a suite name")
    if candidate.suffix in (".yaml", ".yml"):
        if candidate.exists():
            return candidate
        if candidate.parent != Path("."):
            raise ConfigError(f"no suite file at {name_or_path}")
    path = SUITES_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        names = available_suites()
        raise ConfigError(f"unknown suite {name_or_path!r}{suggest(name_or_path, names)}; available: {', '.join(names)}")
    return path


_SUITE_KEYS = {"name", "description", "seeds", "budget", "experiments", "device", "checkpoint", "seeds_per_process", "slurm", "distributed", "cuda_graphs"}
_CHECKPOINT_KEYS = {"every", "replay_buffer"}
_BUDGET_KEYS = {field.name for field in dataclasses.fields(Budget)}
_EXPERIMENT_KEYS = {
    "algo",
    "envs",
    "source",  # where its settings come from (free text, shown by train; not part of a run key)
    "budget",
    "hyperparameters",
    "grid",
    "seeds",
    "seeds_per_process",
    "distributed",
    "env_kwargs",
    "wrappers",
    "continued_from",
}


def load_suite(name_or_path: str, seeds: list[int] | None = None, device: str | None = None) -> Suite:
    """Parse, validate and expand a suite; ConfigError (naming file and field) on any problem.

    ``seeds`` and ``device`` override the suite's own.
    """
    path = suite_path(name_or_path)
    data = read_yaml(path)
    try:
        return _parse_suite(data, path, seeds, device)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None


def _parse_suite(data: Any, path: Path, seed_override: list[int] | None, device_override: str | None) -> Suite:
    if not isinstance(data, dict):
        raise ConfigError("a suite must be a mapping with 'name', 'seeds', 'budget' and 'experiments'")
    data = renamed_keys(data, OLD_KEY_NAMES)
    check_keys(data, _SUITE_KEYS, "suite")
    for required in ("seeds", "budget", "experiments"):
        if required not in data:
            raise ConfigError(f"missing required key {required!r}")
    name = str(data.get("name", path.stem))
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name) or name.startswith("."):
        raise ConfigError(f"name {name!r}: use letters, digits, '.', '_' and '-' (it names the MLflow experiment and report files)")
    device = device_override or str(data.get("device", "auto"))
    check_device_name(device)
    suite_seeds = seed_override if seed_override is not None else _parse_seeds(data["seeds"], "seeds")
    suite_budget = as_mapping(data["budget"], "budget")
    check_keys(suite_budget, _BUDGET_KEYS, "budget")
    seeds_per_process = check_seeds_per_process(data.get("seeds_per_process", 1), "seeds_per_process")
    distributed = check_distributed(data["distributed"], "distributed") if data.get("distributed") is not None else None
    experiments = data["experiments"]
    if not isinstance(experiments, list) or not experiments:
        raise ConfigError("'experiments' must be a non-empty list")

    specs: list[RunSpec] = []
    for index, experiment in enumerate(experiments):
        where = f"experiments[{index}]"
        try:
            specs += _expand_experiment(experiment, name, suite_seeds, suite_budget, device, seed_override is not None, seeds_per_process, distributed)
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}") from None
    checkpoint = as_mapping(data.get("checkpoint", {}), "checkpoint")
    check_keys(checkpoint, _CHECKPOINT_KEYS, "checkpoint")
    replay_buffer = checkpoint.get("replay_buffer", False)
    if not isinstance(replay_buffer, bool):
        raise ConfigError(f"checkpoint.replay_buffer must be true or false, got {replay_buffer!r}")
    specs = [dataclasses.replace(spec, checkpoint_every=checkpoint.get("every"), checkpoint_replay_buffer=replay_buffer) for spec in specs]
    cuda_graphs = data.get("cuda_graphs", False)
    if not isinstance(cuda_graphs, bool):
        raise ConfigError(f"cuda_graphs must be true or false, got {cuda_graphs!r}")
    if cuda_graphs:
        specs = [_with_cuda_graphs(spec) for spec in specs]
    keys = [spec.run_key for spec in specs]
    duplicates = {spec.label for spec in specs if keys.count(spec.run_key) > 1}
    if duplicates:
        raise ConfigError(f"the same run appears more than once: {', '.join(sorted(duplicates))}")
    return Suite(name, str(data.get("description", "")), path, specs, check_slurm(as_mapping(data.get("slurm", {}), "slurm"), "slurm"))


def _with_cuda_graphs(spec: RunSpec) -> RunSpec:
    try:
        return dataclasses.replace(spec, cuda_graphs=True)
    except ConfigError as error:
        raise ConfigError(f"{spec.label}: {error}") from None


def _expand_experiment(
    experiment: Any,
    suite_name: str,
    suite_seeds: list[int],
    suite_budget: dict[str, Any],
    device: str,
    seeds_overridden: bool,
    seeds_per_process: int = 1,
    distributed: dict[str, Any] | None = None,
) -> list[RunSpec]:
    experiment = as_mapping(experiment, "experiment")
    experiment = renamed_keys(experiment, OLD_KEY_NAMES)
    check_keys(experiment, _EXPERIMENT_KEYS, "experiment")
    if "algo" not in experiment or "envs" not in experiment:
        raise ConfigError("each experiment needs 'algo' and 'envs'")
    algo = str(experiment["algo"])
    agents.config_class(algo)  # an unknown algorithm is named first
    envs = experiment["envs"]
    if isinstance(envs, str):
        envs = [envs]
    if not isinstance(envs, list) or not envs:
        raise ConfigError("'envs' must be a non-empty list of gymnasium ids")
    seeds = suite_seeds
    if "seeds" in experiment and not seeds_overridden:
        seeds = _parse_seeds(experiment["seeds"], "seeds")
    seeds_per_process = check_seeds_per_process(experiment.get("seeds_per_process", seeds_per_process), "seeds_per_process")
    if experiment.get("distributed") is not None:
        distributed = check_distributed(experiment["distributed"], "distributed")
    own_budget = as_mapping(experiment.get("budget", {}), "budget")
    check_keys(own_budget, _BUDGET_KEYS, "budget")
    merged = {**suite_budget, **own_budget}
    missing = [name for name in ("total_steps", "eval_every") if name not in merged]
    if missing:
        raise ConfigError(f"budget: {' and '.join(missing)} missing (in the suite's budget or the experiment's)")
    budget = Budget(**merged)

    fixed = as_mapping(experiment.get("hyperparameters", {}), "hyperparameters")
    grid = as_mapping(experiment.get("grid", {}), "grid")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"grid.{key} must be a non-empty list of values")
    combinations = [dict(zip(grid, values)) for values in itertools.product(*grid.values())] or [{}]

    env_kwargs = parse_env_kwargs(experiment.get("env_kwargs"))
    continued_from = experiment.get("continued_from")
    if continued_from is not None and not (isinstance(continued_from, str) and re.fullmatch(r"[0-9a-f]{16}", continued_from)):
        raise ConfigError(f"continued_from must be a run key (16 hex digits), got {continued_from!r}")
    wrappers = parse_wrappers(experiment.get("wrappers"))
    specs = []
    for env_id in envs:
        check_env_id(str(env_id))
        spec_of_env = env_spec(setup_of(str(env_id), env_kwargs, wrappers))
        agents.check_env_spec(algo, spec_of_env)
        for combination in combinations:
            overrides = {**fixed, **combination}
            config = agents.resolve_config(algo, overrides)
            agents.check_config(algo, config, spec_of_env)
            for seed in seeds:
                specs.append(
                    RunSpec(
                        suite_name,
                        algo,
                        str(env_id),
                        seed,
                        config.to_dict(),
                        budget,
                        device,
                        1,
                        overrides,
                        seeds_per_process=seeds_per_process,
                        distributed=distributed,
                        env_kwargs=env_kwargs,
                        wrappers=wrappers,
                        continued_from=continued_from,
                    )
                )
    if continued_from is not None and len(specs) != 1:
        raise ConfigError(f"continued_from names one run ({continued_from}): give one environment, one seed and no grid")
    return specs


def make_spec(
    algo: str, env_id: str, seed: int, budget: dict[str, int], hyperparameters: dict[str, Any] | None = None, suite: str = "adhoc", device: str = "cpu"
) -> RunSpec:
    """One RunSpec outside a suite file, checked exactly as a suite's experiment is."""
    return _expand_experiment({"algo": algo, "envs": [env_id], "hyperparameters": hyperparameters or {}}, suite, [seed], budget, device, False)[0]


def _parse_seeds(value: Any, where: str) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ConfigError(f"{where}: a seed count must be >= 1, got {value}")
        return list(range(value))
    if isinstance(value, list) and value and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value):
        if len(set(value)) != len(value):
            raise ConfigError(f"{where}: seeds repeat: {value}")
        return list(value)
    raise ConfigError(f"{where}: expected a count or a list of non-negative integers, got {value!r}")
