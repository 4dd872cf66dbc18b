"""A study after the fact: its best trials and importances, plots, and the best setting exported
as a suite (``suites/tuned/<algo>-<env>.yaml``)."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

import yaml

from agents.errors import ConfigError
from benchmark import config
from benchmark.tuning.settings import TUNED_DIR
from benchmark.tuning.storage import study_settings


def export_suite(study: Any, seeds: int, output: Path | None, force: bool = False) -> tuple[Path, Any]:
    """Write the best trial's setting as a suite (``suites/tuned/<algo>-<env>.yaml``) that
    ``make bench SUITE=tuned/<algo>-<env>`` runs over ``seeds`` seeds (0..seeds-1: none of
    them was used while tuning). The file is validated as a suite before it replaces anything."""
    settings = study_settings(study)
    best = best_trial(study)
    if best is None:
        raise ConfigError(f"study {study.study_name!r} has no completed trial to export yet")
    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")
    stem = config.name_from(f"{settings.algo}-{settings.env_id.replace('/', '-')}")
    if not settings.env.plain:  # beside the plain env's export, not over it
        stem += "-" + hashlib.sha256(json.dumps([settings.env_kwargs, settings.wrappers], sort_keys=True).encode()).hexdigest()[:8]
    output = output or TUNED_DIR / f"{stem}.yaml"
    if output.exists() and not force:
        raise ConfigError(f"{output} exists; pass --force to replace it, or --output PATH")
    overrides = best.user_attrs["overrides"]
    suite = {
        "name": f"tuned-{stem}",
        "description": (
            f"{settings.algo} on {settings.env.describe()} tuned by Optuna study {study.study_name!r}: trial {best.number} "
            f"of {len(study.trials)}, normalized score {best.value:.3f} over {settings.seeds_per_trial} seed(s) "
            f"at {settings.budget.total_steps:,} steps"
        ),
        "seeds": seeds,
        "budget": dataclasses.asdict(settings.budget),
        "experiments": [
            {"algo": settings.algo, "envs": [settings.env_id], "hyperparameters": overrides}
            | {key: value for key, value in (("env_kwargs", settings.env_kwargs), ("wrappers", settings.wrappers)) if value}
        ],
    }
    header = (
        f"# exported by `python -m benchmark tune export {study.study_name}` on "
        f"{datetime.date.today().isoformat()}\n# base setting: {settings.base_suite or 'published defaults'}; "
        f"tuned: {', '.join(best.user_attrs.get('tuned', best.params))}\n"
    )
    text = header + yaml.safe_dump(suite, sort_keys=False, default_flow_style=None, width=1000)
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(f".{output.stem}.tmp.yaml")
    temporary.write_text(text)
    try:
        config.load_suite(str(temporary))
    except ConfigError:
        temporary.unlink()
        raise
    temporary.replace(output)
    return output, best


def importances(study: Any) -> dict[str, float] | None:
    """fANOVA parameter importances over the completed trials, seeded (the plot shows the same
    numbers); None with fewer than two, or when every completed trial scored the same."""
    import optuna

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(complete) < 2:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return optuna.importance.get_param_importances(study, evaluator=_importance_evaluator())
        except RuntimeError:  # "zero total variance": nothing to attribute
            return None


def _importance_evaluator() -> Any:
    import optuna

    return optuna.importance.FanovaImportanceEvaluator(seed=0)


def write_plots(study: Any, directory: Path, with_importances: bool = True) -> list[Path]:
    """Optimization history, intermediate values and (``with_importances``) parameter
    importances as PNG files in ``directory``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as plots

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    drawings: dict[str, Any] = {"optimization_history": plots.plot_optimization_history, "intermediate_values": plots.plot_intermediate_values}
    if with_importances:
        drawings["param_importances"] = lambda study: plots.plot_param_importances(study, evaluator=_importance_evaluator())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, draw in drawings.items():
            axes = draw(study)
            figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
            figure.set_size_inches(9, 5)
            figure.tight_layout()
            path = directory / f"{name}.png"
            figure.savefig(path, dpi=100)
            plt.close(figure)
            written.append(path)
    return written


def summary(study: Any, top: int = 10) -> dict[str, Any]:
    """The numbers ``tune show`` prints: the setting, counts by state, the best trials."""
    import optuna

    settings = study_settings(study)
    counts: dict[str, int] = {}
    for trial in study.trials:
        counts[trial.state.name] = counts.get(trial.state.name, 0) + 1
    complete = sorted((t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE), key=lambda t: t.value, reverse=True)
    return {"settings": settings, "counts": counts, "best": complete[:top]}


def best_trial(study: Any) -> Any | None:
    """The COMPLETE trial with the highest value (None: none completed)."""
    import optuna

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    return max(complete, key=lambda t: t.value) if complete else None
