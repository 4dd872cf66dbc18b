"""Result bundles: the file format (round trip, checksums, schema versions, merging, size) and
bundles as first-class results through the real CLI (report, run, import, export)."""

import dataclasses
import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli_in_process as run_cli

from benchmark import bundles
from benchmark.bundles import Bundle, BundledRun, BundleError, Evaluation
from benchmark.config import Budget, RunSpec, load_suite

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"

SUITE = """
name: travel
seeds: [0, 1]
budget: {total_steps: 512, eval_every: 256, eval_episodes: 2}
experiments:
  - algo: ppo
    envs: [CartPole-v1]
    hyperparameters: {num_envs: 2, num_steps: 64, num_minibatches: 2, num_epochs: 2, hidden_sizes: [16, 16]}
  - algo: dqn
    envs: [CartPole-v1]
    seeds: [0]
    hyperparameters: {learning_starts: 100, buffer_size: 1000, hidden_sizes: [16, 16]}
"""


def fake_run(seed: int, final: float = 1.5, algo: str = "ppo", evaluations: int = 3, episodes: int = 2, steps: int = 300) -> BundledRun:
    spec = RunSpec("synthetic", algo, "CartPole-v1", seed, {"learning_rate": 0.001, "hidden_sizes": [16, 16]}, Budget(steps, 100, episodes))
    rng = np.random.default_rng(seed)
    curve = []
    for index in range(evaluations):
        returns = tuple(float(x) for x in rng.normal(100, 30, episodes))
        train = (float(rng.normal(80, 10)), 7) if index else (None, 0)
        curve.append(Evaluation(100 * (index + 1), float(np.mean(returns)), float(np.std(returns)), returns, tuple(range(10, 10 + episodes)), *train))
    provenance = {name: "" for name in bundles.PROVENANCE} | {"git_sha": "abc", "cpu_model": "Test CPU, 2 cores"}
    return BundledRun(
        spec,
        final,
        0.25,
        tuple(curve),
        wall_seconds=12.5,
        steps_per_second=1 / 3,
        device="cpu",
        provenance=provenance,
        versions={"torch": "2.13.0"},
        mlflow_run_id=f"run{seed}",
        started="2026-11-24T10:00:00+00:00",
        ended="2026-11-24T10:01:00+00:00",
        cpu_seconds=11.25 if seed % 2 else None,
    )


def test_a_bundle_reads_back_exactly_what_was_written(tmp_path):
    runs = [fake_run(0, 0.1 + 0.2), fake_run(1, -1e-17), fake_run(2, 123456.789)]
    bundles.write(Bundle("synthetic", {run.run_key: run for run in runs}), tmp_path / "b")
    back = bundles.read(tmp_path / "b")
    assert back.suite == "synthetic" and back.schema_version == bundles.SCHEMA_VERSION
    for run in runs:
        read = back.runs[run.run_key]
        assert read.origin == str(tmp_path / "b")
        assert {**vars(read), "origin": ""} == vars(run)  # floats round-trip bit for bit


def test_the_same_runs_give_the_same_bytes(tmp_path):
    runs = {run.run_key: run for run in (fake_run(0), fake_run(1))}
    bundles.write(Bundle("synthetic", runs, created="2026-11-24"), tmp_path / "a")
    bundles.write(Bundle("synthetic", dict(reversed(list(runs.items()))), created="2026-11-24"), tmp_path / "b")
    for name in (bundles.MANIFEST, bundles.RUNS_FILE, bundles.CURVES_FILE):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_damaged_or_foreign_bundles_are_refused_by_name(tmp_path):
    directory = tmp_path / "b"
    bundles.write(Bundle("synthetic", {fake_run(0).run_key: fake_run(0)}), directory)
    runs_csv = directory / bundles.RUNS_FILE
    original = runs_csv.read_bytes()
    runs_csv.write_bytes(original.replace(b"12.5", b"13.5"))
    with pytest.raises(BundleError, match="does not match the checksum"):
        bundles.read(directory)
    runs_csv.write_bytes(original[: len(original) // 2])
    with pytest.raises(BundleError, match="runs.csv does not match the checksum"):
        bundles.read(directory)
    runs_csv.write_bytes(original)
    manifest = json.loads((directory / bundles.MANIFEST).read_text())
    (directory / bundles.MANIFEST).write_text(json.dumps({**manifest, "schema_version": 99}))
    with pytest.raises(BundleError, match="schema version 99, newer than this reprorl reads"):
        bundles.read(directory)
    (directory / bundles.MANIFEST).write_text("{not json")
    with pytest.raises(BundleError, match="cannot be read"):
        bundles.read(directory)
    with pytest.raises(BundleError, match="has no manifest.json"):
        bundles.read(tmp_path)
    with pytest.raises(BundleError, match="does not exist"):
        bundles.read(tmp_path / "nowhere")


def test_an_edited_row_is_caught_by_its_run_key(tmp_path):
    """A row whose hyperparameters were changed by hand (checksums recomputed) no longer hashes to its run key."""
    directory = tmp_path / "b"
    run = fake_run(0)
    bundles.write(Bundle("synthetic", {run.run_key: run}), directory)
    runs_csv = directory / bundles.RUNS_FILE
    runs_csv.write_text(runs_csv.read_text().replace('"learning_rate"":0.001', '"learning_rate"":0.002'))
    manifest = json.loads((directory / bundles.MANIFEST).read_text())
    import hashlib

    manifest["files"][bundles.RUNS_FILE]["sha256"] = hashlib.sha256(runs_csv.read_bytes()).hexdigest()
    (directory / bundles.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"runs.csv row 2: run key .* does not match"):
        bundles.read(directory)


def test_merging_unions_by_run_key_and_refuses_a_conflict_naming_both(tmp_path):
    a, b, c = fake_run(0), fake_run(1), fake_run(2)
    bundles.write(Bundle("synthetic", {a.run_key: a, b.run_key: b}), tmp_path / "one")
    bundles.write(Bundle("synthetic", {b.run_key: b, c.run_key: c}), tmp_path / "two")
    merged = bundles.read_all([tmp_path / "one", tmp_path / "two"])
    assert set(merged) == {a.run_key, b.run_key, c.run_key}
    other = fake_run(1, final=99.0)
    bundles.write(Bundle("synthetic", {other.run_key: other}), tmp_path / "three")
    with pytest.raises(BundleError) as refused:
        bundles.read_all([tmp_path / "one", tmp_path / "three"])
    message = str(refused.value)
    assert b.run_key in message and str(tmp_path / "one") in message and str(tmp_path / "three") in message
    assert "1.5" in message and "99.0" in message


def test_an_older_schema_version_still_reads():
    """tests/data/bundle-v1 was written by schema 1 (before training returns were kept)."""
    old = bundles.read(DATA / "bundle-v1")
    assert old.schema_version == 1 and old.suite == "tiny" and len(old.runs) == 3
    for run in old.runs.values():
        assert run.curve and all(e.train_return_mean is None for e in run.curve)
        assert run.cpu_seconds is None  # (schema 5 adds it)
        assert run.spec.run_key in old.runs


def test_a_mujoco_sized_bundle_stays_under_20_mb(tmp_path):
    """The whole mujoco suite: 400 runs, an evaluation every 10k steps of 1M (101) with 10
    episodes each, returns at full precision: the budget of the issue is 20 MB."""
    suite = load_suite("mujoco")
    rng = np.random.default_rng(0)
    runs = {}
    for spec in suite.specs:
        curve = []
        for step in range(0, spec.budget.total_steps + 1, spec.budget.eval_every):
            returns = tuple(float(x) for x in rng.normal(3000, 500, spec.budget.eval_episodes))
            curve.append(
                Evaluation(
                    step,
                    float(np.mean(returns)),
                    float(np.std(returns)),
                    returns,
                    tuple(int(x) for x in rng.integers(50, 1001, spec.budget.eval_episodes)),
                    float(rng.normal(2500, 400)),
                    int(rng.integers(10, 200)),
                )
            )
        runs[spec.run_key] = BundledRun(
            spec,
            curve[-1].mean,
            curve[-1].std,
            tuple(curve),
            wall_seconds=3600.0,
            steps_per_second=300.0,
            device="cpu",
            provenance={"git_sha": "0" * 40},
            versions={"torch": "2.13.0"},
        )
    bundles.write(Bundle("mujoco", runs), tmp_path / "mujoco")
    size = sum(path.stat().st_size for path in (tmp_path / "mujoco").iterdir())
    assert size < 20e6, f"{size / 1e6:.1f} MB"
    assert len(bundles.read(tmp_path / "mujoco").runs) == 400


# ------------------------------------------------------------------------------------ through the CLI


def _numbers(report: Path) -> list[str]:
    """The report's lines without the generation line, the runs' source column and links (a run read
    from the store links to its MLflow page; one read from a bundle has no store to link to)."""
    lines = []
    for line in report.read_text().splitlines():
        line = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", line)
        if line.startswith(("Suite ", "|")) or not line.strip():
            line = re.sub(r"\| (store|bundle [^|]*) \|", "| |", line)
        if "Generated" in line:
            line = re.sub(r"Generated .*? from `[^`]*`", "Generated", line)
        lines.append(line)
    return lines


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small real suite trained once: its directory, results directory and exported bundle."""
    root = tmp_path_factory.mktemp("travel")
    (root / "travel.yaml").write_text(SUITE)
    completed = run_cli("run", "--suite", "travel.yaml", "--workers", "2", "--results-dir", "results", cwd=root)
    assert completed.returncode == 0, completed.stderr
    exported = run_cli("export", "--suite", "travel.yaml", "--results-dir", "results", "--output", "bundle", cwd=root)
    assert exported.returncode == 0, exported.stderr
    assert "3 runs of suite 'travel'" in exported.stdout
    return root


def test_a_report_from_the_bundle_alone_equals_the_report_from_the_store(trained, tmp_path):
    root = trained
    from_store = run_cli("report", "--suite", "travel.yaml", "--results-dir", "results", "--output", str(tmp_path / "store"), cwd=root)
    assert from_store.returncode == 0, from_store.stderr
    empty = tmp_path / "empty"
    empty.mkdir()  # no tracking store at all
    from_bundle = run_cli("report", "--suite", "travel.yaml", "--results-dir", str(empty), "--from", "bundle", "--output", str(tmp_path / "bundle"), cwd=root)
    assert from_bundle.returncode == 0, from_bundle.stderr
    assert "3/3 runs finished" in from_bundle.stdout
    assert _numbers(tmp_path / "store" / "report.md") == _numbers(tmp_path / "bundle" / "report.md")
    assert "| bundle " in (tmp_path / "bundle" / "report.md").read_text()
    assert not list(empty.iterdir()), "a report read from a bundle created a store"


def test_run_trains_nothing_a_bundle_holds_and_exactly_the_run_removed_from_it(trained, tmp_path):
    root = trained
    fresh = tmp_path / "fresh"
    nothing = run_cli("run", "--suite", "travel.yaml", "--results-dir", str(fresh), "--from", "bundle", cwd=root)
    assert nothing.returncode == 0, nothing.stderr
    assert "3 of 3 runs are held by result bundle" in nothing.stdout and "started " not in nothing.stdout
    bundle = bundles.read(root / "bundle")
    removed = next(run for run in bundle.runs.values() if run.spec.algo == "ppo" and run.spec.seed == 1)
    bundles.write(Bundle(bundle.suite, {k: r for k, r in bundle.runs.items() if k != removed.run_key}), tmp_path / "cut")
    dry = run_cli("run", "--suite", "travel.yaml", "--results-dir", str(fresh), "--from", str(tmp_path / "cut"), "--dry-run", cwd=root)
    assert dry.returncode == 0, dry.stderr
    assert "3 runs: 2 finished, 1 to train" in dry.stdout
    one = run_cli("run", "--suite", "travel.yaml", "--results-dir", str(fresh), "--from", str(tmp_path / "cut"), cwd=root)
    assert one.returncode == 0, one.stderr
    assert re.findall(r"^started (\S+)", one.stdout, re.M) == ["ppo/CartPole-v1/seed1"]
    forced = run_cli("run", "--suite", "travel.yaml", "--results-dir", str(tmp_path / "forced"), "--from", "bundle", "--force", "--algos", "dqn", cwd=root)
    assert forced.returncode == 0 and re.findall(r"^started (\S+)", forced.stdout, re.M) == ["dqn/CartPole-v1/seed0"]


def test_import_then_export_gives_the_same_bundle_and_import_is_idempotent(trained, tmp_path):
    root = trained
    store = tmp_path / "store"
    first = run_cli("import", "bundle", "--results-dir", str(store), cwd=root)
    assert first.returncode == 0, first.stderr
    assert "3 runs imported into experiment 'travel'" in first.stdout
    again = run_cli("import", "bundle", "--results-dir", str(store), cwd=root)
    assert again.returncode == 0 and "0 runs imported" in again.stdout and "3 already there" in again.stdout
    exported = run_cli("export", "--suite", "travel.yaml", "--results-dir", str(store), "--output", str(tmp_path / "again"), cwd=root)
    assert exported.returncode == 0, exported.stderr
    for name in (bundles.RUNS_FILE, bundles.CURVES_FILE):
        assert (tmp_path / "again" / name).read_bytes() == (root / "bundle" / name).read_bytes(), name
    with gzip.open(root / "bundle" / bundles.CURVES_FILE, "rt") as handle:
        rows = handle.read().splitlines()
    assert len(rows) == 1 + 3 * 2  # the header, then 3 runs x evaluations at steps 256 and 512
    header = rows[0].split(",")
    assert header == list(bundles.CURVE_COLUMNS)
    for row in rows[1:]:  # every evaluation holds its episodes and the training episodes before it
        values = dict(zip(header, row.split(",")))
        assert len(values["returns"].split()) == 2 and len(values["lengths"].split()) == 2
        assert int(values["train_episodes"]) > 0 and float(values["train_return_mean"]) > 0


def test_bad_bundles_get_one_line_and_change_nothing(trained, tmp_path):
    root = trained
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("[]")
    store = tmp_path / "store"
    a_file = tmp_path / "a-file"
    a_file.write_text("not a bundle")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    for args, fragment in (
        (["import", str(broken), "--results-dir", str(store)], "is not a reprorl bundle manifest"),
        (["export", "--suite", "travel.yaml", "--results-dir", "results", "--output", str(a_file)], "is a file, not a directory"),
        (["export", "--suite", "travel.yaml", "--results-dir", "results", "--output", str(other)], "holds no bundle"),
        (["export", "--suite", "travel.yaml", "--results-dir", "results", "--output", str(broken)], "is not a reprorl bundle manifest"),
        (["export", "--suite", "smoke", "--results-dir", "results", "--output", str(tmp_path / "smoke")], "has no finished run"),
        (["report", "--suite", "travel.yaml", "--results-dir", str(store), "--from", str(tmp_path / "none")], "does not exist"),
        (["merge", "bundle", str(broken), "--output", str(tmp_path / "merged")], "is not a reprorl bundle manifest"),
    ):
        completed = run_cli(*args, cwd=root)
        assert completed.returncode == 2, (args, completed.stderr)
        lines = completed.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], completed.stderr
    assert not store.exists() and not (tmp_path / "merged").exists() and not (tmp_path / "smoke").exists()
    assert a_file.read_text() == "not a bundle" and sorted(p.name for p in other.iterdir()) == ["notes.txt"]


def test_reproduce_and_regress_read_a_bundle(trained, tmp_path):
    """reproduce takes a run key a bundle holds and repeats it bit for bit; regress --from
    compares fresh seeds with the bundle's runs instead of a baseline JSON."""
    root = trained
    bundle = bundles.read(root / "bundle")
    run = next(r for r in bundle.runs.values() if r.spec.algo == "dqn")
    again = run_cli("reproduce", run.run_key, "--from", "bundle", "--results-dir", str(tmp_path / "none"), cwd=root)
    assert again.returncode == 0, again.stderr
    assert "from bundle bundle" in again.stdout and "match: all 2 evaluations are bit-identical" in again.stdout
    checked = run_cli("regress", "--suite", "travel.yaml", "--from", "bundle", "--algos", "dqn", "--results-dir", "results", cwd=root)
    assert checked.returncode in (0, 1), checked.stderr
    assert "seeds [100, 101]" in checked.stdout and "dqn @ CartPole-v1" in checked.stdout
    both = run_cli("regress", "--suite", "travel.yaml", "--from", "bundle", "--baseline", "x.json", "--results-dir", "results", cwd=root)
    assert both.returncode == 2 and "--from and --baseline" in both.stderr


def test_a_bundle_carries_env_options_and_a_continued_run(tmp_path):
    """Schema 3: env_kwargs, wrappers and continued_from travel, so the run keys that hold them check out."""
    run = fake_run(0)
    spec = dataclasses.replace(
        run.spec, env_kwargs={"max_episode_steps": 50}, wrappers=[{"gymnasium.wrappers:TimeAwareObservation": {}}], continued_from="0123456789abcdef"
    )
    changed = dataclasses.replace(run, spec=spec)
    bundles.write(Bundle("synthetic", {changed.run_key: changed}), tmp_path / "b")
    (back,) = bundles.read(tmp_path / "b").runs.values()
    assert back.spec.env_kwargs == spec.env_kwargs and back.spec.wrappers == spec.wrappers and back.spec.continued_from == spec.continued_from
    assert back.run_key == changed.run_key != run.run_key


def test_malformed_manifests_and_rows_are_named_in_one_line(tmp_path):
    """A manifest whose parts have the wrong form, rows of another suite, a non-finite score or
    a runs.csv that is not UTF-8: each is refused with what is wrong and where."""
    run = fake_run(0)
    directory = tmp_path / "b"
    bundles.write(Bundle("synthetic", {run.run_key: run}), directory)
    manifest_path = directory / bundles.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    for changed, fragment in (
        ({"files": ["runs.csv", "curves.csv.gz"]}, "'files' must map each data file's name to its"),
        ({"files": "runs.csv"}, "'files' must map each data file's name to its"),
        ({"files": {**manifest["files"], "extra.csv": {"sha256": "0"}}}, "lists 'extra.csv' under 'files'"),
        ({"runs": "1"}, "the manifest says '1' runs"),
        ({"suite": "elsewhere"}, "its manifest names suite 'elsewhere', but runs.csv holds runs of suite 'synthetic'"),
        ({"suite": None}, "'suite' must name the suite of its runs"),
        ({"weights": ["x"]}, "'weights' must map run keys to their weights file"),
        ({"weights": {"0123456789abcdef": {}}}, "lists weights of run key '0123456789abcdef', which runs.csv does not hold"),
        ({"weights": {run.run_key: {"file": "elsewhere.pt", "sha256": "0", "bytes": 1}}}, f'must be {{"file": "weights/{run.run_key}.pt"'),
        ({"weights": {run.run_key: {"file": f"weights/{run.run_key}.pt", "sha256": "0", "bytes": 1}}}, f"weights/{run.run_key}.pt is missing"),
    ):
        manifest_path.write_text(json.dumps({**manifest, **changed}))
        with pytest.raises(BundleError, match=re.escape(fragment)):
            bundles.read(directory)
    manifest_path.write_text(json.dumps(manifest))
    for broken, fragment in ((dataclasses.replace(run, final_return=float("nan")), "final_return is 'nan'"),):
        bundles.write(Bundle("synthetic", {run.run_key: broken}), tmp_path / "nan")
        with pytest.raises(BundleError, match=r"runs.csv row 2: " + re.escape(fragment)):
            bundles.read(tmp_path / "nan")
    runs_csv = directory / bundles.RUNS_FILE
    latin = runs_csv.read_bytes().replace(b"Test CPU", b"Test CPU \xe9")
    runs_csv.write_bytes(latin)
    import hashlib

    manifest["files"][bundles.RUNS_FILE]["sha256"] = hashlib.sha256(latin).hexdigest()
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"runs.csv is not UTF-8 text \(byte \d+\)"):
        bundles.read(directory)


def test_trained_agents_travel_in_a_bundle_with_weights(trained, tmp_path):
    """export --with-weights, import elsewhere: evaluate gives the run's final return, continue
    trains on from it, and load_policy acts in a plain gymnasium env with the same returns."""
    import reprorl
    from benchmark.training.evaluate import EVAL_SEED_OFFSET

    root = trained
    exported = run_cli(
        "export", "--suite", "travel.yaml", "--results-dir", "results", "--output", str(tmp_path / "agents"), "--with-weights", "--seeds", "0", "1", cwd=root
    )
    assert exported.returncode == 0, exported.stderr
    assert "3 runs of suite 'travel'" in exported.stdout and "3 with their weights" in exported.stdout
    bundle = bundles.read(tmp_path / "agents")
    assert sorted(bundle.weights) == sorted(bundle.runs) and all(w.path.is_file() for w in bundle.weights.values())
    assert (tmp_path / "agents" / bundles.RUNS_FILE).read_bytes() == (root / "bundle" / bundles.RUNS_FILE).read_bytes()
    store = tmp_path / "store"
    imported = run_cli("import", str(tmp_path / "agents"), "--results-dir", str(store), cwd=root)
    assert imported.returncode == 0, imported.stderr
    assert "3 runs imported into experiment 'travel' (3 with their weights)" in imported.stdout
    dqn = next(run for run in bundle.runs.values() if run.spec.algo == "dqn")
    evaluated = run_cli("evaluate", dqn.run_key, "--results-dir", str(store), cwd=root)
    assert evaluated.returncode == 0, evaluated.stderr
    assert f"return {dqn.final_return:.2f}" in evaluated.stdout
    ppo = next(run for run in bundle.runs.values() if run.spec.algo == "ppo" and run.spec.seed == 0)
    further = run_cli("continue", ppo.run_key, "--steps", "128", "--results-dir", str(store), cwd=root)
    assert further.returncode == 0, further.stderr
    assert f"from env step {ppo.spec.budget.total_steps}" in further.stdout and "1/1 runs finished" in further.stdout

    policy = reprorl.load_policy(tmp_path / "agents", ppo.run_key)
    assert list(policy.evaluate().returns) == list(ppo.curve[-1].returns)
    returns = []
    for episode in range(ppo.spec.budget.eval_episodes):  # by hand, one observation at a time
        env, total, done = policy.make_env(), 0.0, False
        observation, _ = env.reset(seed=ppo.spec.seed + EVAL_SEED_OFFSET + episode)
        policy.reset()
        while not done:
            observation, reward, terminated, truncated, _ = env.step(policy.act(observation))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    assert returns == list(ppo.curve[-1].returns)
    with pytest.raises(Exception, match="carries the weights of 3 runs: name one run key"):
        reprorl.load_policy(tmp_path / "agents")
    with pytest.raises(Exception, match="carries no weights: export it with --with-weights"):
        reprorl.load_policy(root / "bundle", ppo.run_key)


def test_weights_are_checked_and_join_runs_already_imported(trained, tmp_path):
    """A changed or missing weights file is refused before anything is written; a store that
    imported the runs without weights gets them from a bundle that has them; merge keeps them."""
    import shutil

    import reprorl

    root = trained
    assert (
        run_cli(
            "export",
            "--suite",
            "travel.yaml",
            "--results-dir",
            "results",
            "--output",
            str(tmp_path / "agents"),
            "--with-weights",
            "--seeds",
            "0",
            "1",
            cwd=root,
        ).returncode
        == 0
    )
    bundle = bundles.read(tmp_path / "agents")
    key = sorted(bundle.weights)[0]
    shutil.copytree(tmp_path / "agents", tmp_path / "changed")
    weights = tmp_path / "changed" / bundles.weights_file(key)
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    store = tmp_path / "store"
    refused = run_cli("import", str(tmp_path / "changed"), "--results-dir", str(store), cwd=root)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert f"weights/{key}.pt does not match the checksum in its manifest" in refused.stderr
    assert not store.exists()
    with pytest.raises(BundleError, match="does not match the checksum"):
        reprorl.load_policy(tmp_path / "changed", key)
    weights.unlink()
    with pytest.raises(BundleError, match=f"weights/{key}.pt is missing"):
        bundles.read(tmp_path / "changed")
    plain = run_cli("import", "bundle", "--results-dir", str(store), cwd=root)
    assert plain.returncode == 0, plain.stderr
    assert run_cli("evaluate", key, "--results-dir", str(store), cwd=root).returncode == 2  # no weights yet
    joined = run_cli("import", str(tmp_path / "agents"), "--results-dir", str(store), cwd=root)
    assert joined.returncode == 0, joined.stderr
    assert "0 runs imported" in joined.stdout and "3 already there (3 given the bundle's weights)" in joined.stdout
    assert run_cli("evaluate", key, "--results-dir", str(store), cwd=root).returncode == 0
    merged = run_cli("merge", "bundle", str(tmp_path / "agents"), "--output", str(tmp_path / "merged"), cwd=root)
    assert merged.returncode == 0, merged.stderr
    assert sorted(bundles.read(tmp_path / "merged").weights) == sorted(bundle.weights)


def test_importing_several_bundles_is_all_or_nothing(trained, tmp_path):
    """import A B, where B disagrees with the store, imports nothing of A either."""
    from mlflow import MlflowClient

    root = trained
    store = tmp_path / "store"
    assert run_cli("import", "bundle", "--results-dir", str(store), cwd=root).returncode == 0
    other = fake_run(0)
    bundles.write(Bundle("synthetic", {other.run_key: other}), tmp_path / "a")
    travel = bundles.read(root / "bundle")
    key = sorted(travel.runs)[0]
    conflicting = {**travel.runs, key: dataclasses.replace(travel.runs[key], final_return=travel.runs[key].final_return + 1)}
    bundles.write(Bundle("travel", conflicting), tmp_path / "b")
    refused = run_cli("import", str(tmp_path / "a"), str(tmp_path / "b"), "--results-dir", str(store), cwd=root)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert f"run key {key}" in refused.stderr and "nothing imported" in refused.stderr
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    assert client.get_experiment_by_name("synthetic") is None


def test_runs_of_seeds_outside_the_suite_are_seen_by_export_report_and_verdicts(trained, tmp_path):
    """run --seeds trains any seed of a suite's configurations; export, report and verdicts see it
    (no --seeds needed), and --seeds keeps only the seeds named."""
    root = trained
    store = tmp_path / "store"
    assert run_cli("import", "bundle", "--results-dir", str(store), cwd=root).returncode == 0
    seven = run_cli("run", "--suite", "travel.yaml", "--algos", "dqn", "--seeds", "7", "--results-dir", str(store), cwd=root)
    assert seven.returncode == 0, seven.stderr[-2000:]
    exported = run_cli("export", "--suite", "travel.yaml", "--results-dir", str(store), "--output", str(tmp_path / "all"), cwd=root)
    assert exported.returncode == 0 and "4 runs of suite 'travel'" in exported.stdout, exported.stdout + exported.stderr
    assert sorted(run.spec.seed for run in bundles.read(tmp_path / "all").runs.values()) == [0, 0, 1, 7]
    only = run_cli("export", "--suite", "travel.yaml", "--seeds", "7", "--results-dir", str(store), "--output", str(tmp_path / "seven"), cwd=root)
    assert only.returncode == 0 and "1 run of suite 'travel'" in only.stdout, only.stdout + only.stderr
    reported = run_cli("report", "--suite", "travel.yaml", "--results-dir", str(store), "--output", str(tmp_path / "report"), cwd=root)
    assert reported.returncode == 0 and "4/4 runs finished" in reported.stdout, reported.stdout + reported.stderr
    judged = run_cli("verdicts", "--suite", "travel.yaml", "--results-dir", str(store), "--format", "json", cwd=root)
    assert judged.returncode == 0, judged.stderr
    (dqn,) = [row for row in json.loads(judged.stdout)["rows"] if row["algorithm"] == "dqn"]
    assert dqn["ours (mean ± std)"].endswith("(2 seeds)"), dqn  # seeds 0 and 7
    only = run_cli("verdicts", "--suite", "travel.yaml", "--seeds", "0", "--results-dir", str(store), "--format", "json", cwd=root)
    (dqn,) = [row for row in json.loads(only.stdout)["rows"] if row["algorithm"] == "dqn"]
    assert "(2 seeds)" not in dqn["ours (mean ± std)"], dqn
