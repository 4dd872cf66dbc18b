"""The layout is the architecture: ``agents`` knows nothing of ``benchmark``; ``benchmark``'s wings
import only downward (ground < training < execution < analysis < tuning < perf < cli)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WINGS = ("ground", "training", "execution", "analysis", "tuning", "perf", "cli")
"""Bottom up: a module may import its own wing and the wings below it."""
LONG_FILES: set[str] = {"agents/algos/maml.py", "agents/algos/pearl.py"}
"""Files allowed over the size a newcomer reads in one sitting, still to split (the algorithm
bases and the meta-learners, with their seed batches: issue 54); none new."""
MAX_LINES = 500


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (function-local imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def wing(module: str) -> str:
    if module == "benchmark.__main__":
        return "cli"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in WINGS else "ground"


def _benchmark_modules() -> dict[str, Path]:
    return {_module(path): path for path in (ROOT / "benchmark").rglob("*.py")}


def test_agents_imports_nothing_of_benchmark():
    offenders = {_module(path): sorted(name for name in _imports(path) if name.split(".")[0] == "benchmark") for path in (ROOT / "agents").rglob("*.py")}
    assert not {module: names for module, names in offenders.items() if names}


def test_no_wing_imports_a_wing_above_it():
    modules = _benchmark_modules()
    upward = []
    for module, path in modules.items():
        level = WINGS.index(wing(module))
        for name in _imports(path):
            if name in modules and name != "benchmark" and WINGS.index(wing(name)) > level:
                upward.append(f"{module} ({wing(module)}) imports {name} ({wing(name)})")
    assert not upward, "\n".join(sorted(upward))


def test_every_module_belongs_to_a_wing_or_the_ground():
    """The ground is the few modules every wing needs: what to run and where results live."""
    ground = sorted(module for module in _benchmark_modules() if wing(module) == "ground")
    assert ground == [
        "benchmark",
        "benchmark.bundle_rows",
        "benchmark.bundles",
        "benchmark.config",
        "benchmark.devices",
        "benchmark.distributed_config",
        "benchmark.metric_names",
        "benchmark.provenance",
        "benchmark.results_layout",
        "benchmark.run_record",
        "benchmark.stores",
        "benchmark.tables",
        "benchmark.task_defaults",
        "benchmark.tracking",
        "benchmark.tracking.queries",
        "benchmark.tracking.runs",
        "benchmark.tracking.store",
        "benchmark.yaml_input",
    ]


def test_the_wing_check_catches_an_upward_import(tmp_path):
    """The checker itself: a training module importing the CLI is found."""
    assert wing("benchmark.training.loop") == "training" and wing("benchmark.cli.app") == "cli" and wing("benchmark.config") == "ground"
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from benchmark.cli import app\n")
    assert "benchmark.cli.app" in _imports(sample)


AGENTS_INTERFACE = {
    "agents",
    "agents.api",
    "agents.registry",
    "agents.meta",
    "agents.envs",
    "agents.env_state",
    "agents.env_setup",
    "agents.errors",
    "agents.hyperparameters",
    "agents.policy_file",
}
"""What training may import of ``agents``: the learner interface, the registry, the envs; never
the algorithms, networks, buffers or batches behind them (a plug-in is trained, distributed
included, through the same interface)."""


def _agents_module(name: str) -> str:
    """The module of ``agents`` an imported name lives in (its longest prefix that is a file or package)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ROOT.joinpath(*parts[:end])
        if candidate.with_suffix(".py").exists() or (candidate / "__init__.py").exists():
            return ".".join(parts[:end])
    return name


def _behind_the_interface(path: Path) -> list[str]:
    return sorted({module for module in map(_agents_module, _imports(path)) if module.split(".")[0] == "agents" and module not in AGENTS_INTERFACE})


def test_training_reaches_the_algorithms_only_through_their_interface():
    offenders = {module: _behind_the_interface(path) for module, path in _benchmark_modules().items() if wing(module) == "training"}
    assert not {module: names for module, names in offenders.items() if names}


def test_the_interface_check_finds_an_algorithm_imported_by_name(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import agents\nfrom agents.api import Algorithm\n\ndef f():\n    from agents.algos.onpolicy import OneSeed\n")
    assert _behind_the_interface(sample) == ["agents.algos.onpolicy"]


KNOWN_CIRCLES: set[frozenset[str]] = set()
"""Import circles still to break (none: keep it so)."""


def import_circles(packages: tuple[str, ...] = ("agents", "benchmark", "reprorl")) -> set[frozenset[str]]:
    """The sets of modules that import one another in a circle (strongly connected components of
    the import graph, imports at any depth and typing-only ones included; a module importing a
    package it lives in does not count: Python finishes the package first)."""
    modules = {_module(path): path for package in packages for path in (ROOT / package).rglob("*.py")}

    def target(name: str) -> str | None:  # ``from a.b import c``: the module a.b.c, else a.b
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        found = {target(name) for name in _imports(path)}
        graph[module] = {name for name in found if name and name != module and not module.startswith(f"{name}.")}
    return _components(graph)


def _components(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """Tarjan's strongly connected components of more than one node, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: set[frozenset[str]] = set()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.add(member)
                        if member == node:
                            break
                    if len(members) > 1:
                        circles.add(frozenset(members))
    return circles


def test_no_module_imports_itself_through_others():
    circles = import_circles()
    new = [sorted(circle) for circle in circles - KNOWN_CIRCLES]
    assert not new, f"import circles: {new}"
    assert not KNOWN_CIRCLES - circles, f"broken already, remove from KNOWN_CIRCLES: {[sorted(c) for c in KNOWN_CIRCLES - circles]}"


def test_the_circle_check_finds_circles_and_only_circles():
    assert _components({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}
    assert _components({"a": {"b"}, "b": set()}) == set()


def test_files_stay_readable_in_one_sitting():
    sizes = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for package in ("agents", "benchmark") for path in (ROOT / package).rglob("*.py")}
    over = {name for name, lines in sizes.items() if lines > MAX_LINES}
    assert over <= LONG_FILES, f"new files over {MAX_LINES} lines: {sorted(over - LONG_FILES)}"
    assert not LONG_FILES - over, f"split already, remove from LONG_FILES: {sorted(LONG_FILES - over)}"


def test_the_command_line_answers_help_without_loading_the_heavy_libraries():
    """``--help`` and argument errors come before torch, MLflow, Optuna or Ray are imported (each
    costs seconds): building the parser imports none of them."""
    import subprocess
    import sys

    heavy = ("torch", "mlflow", "optuna", "ray", "submitit", "gymnasium", "scipy")
    probe = f"import sys; from benchmark.cli import app; app.build_parser(); print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == ""


def bad_suite(tmp_path: Path) -> Path:
    path = tmp_path / "typo.yaml"
    path.write_text(
        "seeds: 1\nbudget: {total_steps: 1000, eval_every: 500}\nexperiments:\n  - {algo: ppo, envs: [CartPole-v1], hyperparameters: {clip_rang: 0.1}}\n"
    )
    return path


def test_suites_are_checked_and_planned_without_torch(tmp_path):
    """``import agents`` and its ``ConfigError`` load no torch (the package's face loads on first
    use), and the registry, the Config classes and a suite's validation are torch-free: a command
    refusing a results directory, a suite name or a suite's hyperparameter, and a dry run's plan on
    a fresh results directory, answer in a fraction of a second; the learners resolve on first use."""
    import subprocess
    import sys

    probe = (
        "import sys, runpy; import agents; from agents import ConfigError; from agents.errors import suggest; "
        "assert ConfigError is __import__('agents.errors').errors.ConfigError; before = 'torch' in sys.modules; "
        "sys.argv = ['benchmark', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('benchmark', run_name='__main__')\n"
        "except SystemExit as end:\n    print(before, 'torch' in sys.modules, end.code)"
    )
    for command in (
        ["run", "--suite", "no-such-suite"],
        ["regress", "--results-dir", str(tmp_path / "nowhere")],
        ["tune", "show", "ppo-CartPole-v1", "--results-dir", str(tmp_path / "nowhere")],
    ):
        refused = subprocess.run([sys.executable, "-c", probe, *command], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert refused.stdout.split() == ["False", "False", "2"], (command, refused.stdout, refused.stderr)
    for command in (
        ["run", "--suite", "smoke", "--dry-run", "--results-dir", str(tmp_path / "fresh")],
        ["run", "--suite", str(bad_suite(tmp_path)), "--results-dir", str(tmp_path / "fresh")],
    ):
        planned = subprocess.run([sys.executable, "-c", probe, *command], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert planned.stdout.split()[-3:] == ["False", "False", "0" if "--dry-run" in command else "2"], (command, planned.stdout, planned.stderr)
    assert "clip_range" in planned.stderr and "did you mean 'clip_range'" in planned.stderr
    face = "import agents; print(agents.make.__module__, agents.ALGORITHMS['ppo'].__name__, agents.envs.__name__)"
    loaded = subprocess.run([sys.executable, "-c", face], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert loaded.stdout.split() == ["agents.registry", "PPO", "agents.envs"], loaded.stderr


def test_a_launching_process_asks_which_runs_resume_without_torch(tmp_path):
    """The process that launches a suite plans, creates the store and hands runs to the workers;
    telling which runs have a checkpoint to resume from is a file check, so it never loads torch
    (the workers do)."""
    import subprocess
    import sys

    probe = (
        "import sys; from pathlib import Path; from benchmark.config import load_suite; "
        "from benchmark.execution import plan, suite; spec = load_suite('smoke').specs[0]; results = Path(sys.argv[1]); "
        "(results / 'checkpoints' / spec.run_key).mkdir(parents=True); "
        "print(suite._has_resumable_checkpoint(results, spec), plan._checkpoint_step(results / 'checkpoints', spec.run_key), "
        "'torch' in sys.modules)"
    )
    answered = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert answered.stdout.split() == ["False", "None", "False"], answered.stderr
