"""``python -m benchmark fingerprint``: the behaviour fingerprint of an algorithm's code
(``benchmark.training.fingerprint``), of this checkout or of a commit; ``--backfill`` fills the
fingerprints that result bundles lack, each at its run's recorded commit.

    fingerprint --algo sac                      # this checkout's agents, in this process
    fingerprint --algo sac --at e50e3c4         # that commit's agents
    fingerprint --backfill results/published/mujoco_300k

At a commit, the fingerprint's file of this checkout runs as a script in a subprocess whose
``agents`` is the commit's, checked out in a temporary detached worktree (removed afterwards,
whatever happens), so that every commit is measured by the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.errors import ConfigError
from benchmark import provenance
from benchmark.cli.common import EXIT_RUNS_FAILED, add_format

if TYPE_CHECKING:
    from benchmark.bundles import Bundle
    from benchmark.tables import Output

TIMEOUT_SECONDS = 900
"""The most one commit's fingerprints may take (a few seconds each, and torch's import)."""


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "fingerprint",
        help="the behaviour fingerprint of an algorithm's code, here or at a commit; --backfill fills bundles' missing ones",
        description=(
            "Prints the behaviour fingerprint of an algorithm's code (a short fixed training run's numbers: equal within a tolerance "
            "when the code behaves the same). --at COMMIT measures that commit's code; --backfill DIR... fills the empty fingerprints "
            "of result bundles, each computed at its run's recorded git sha, and rewrites them with nothing else changed."
        ),
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--algo", metavar="NAME", help="a registry name or a plug-in's")
    what.add_argument("--backfill", nargs="+", type=Path, metavar="DIR", help="result bundles whose runs' empty fingerprints to fill")
    parser.add_argument("--at", metavar="COMMIT", help="measure this commit's code (a sha, tag or branch of this repository) instead of this checkout's")
    add_format(parser)


def command_fingerprint(args: argparse.Namespace, console: Output) -> int:

    if args.backfill is not None:
        if args.at is not None:
            raise ConfigError("--at goes with --algo: --backfill measures each run at its own recorded commit")
        return backfill(args.backfill, console)
    if args.at is None:
        from benchmark.training import fingerprint

        try:
            labelled = fingerprint.values(args.algo)
        except fingerprint.NoFingerprint as reason:
            return _show("", str(reason))
        return _show(fingerprint.text(labelled), "")
    repository = provenance.repository()
    commit = provenance.commit(repository, args.at)
    answer = fingerprints_at(repository, commit, [args.algo])[args.algo]
    if "error" in answer:
        if answer["bad_input"]:
            raise ConfigError(f"{args.algo} at {commit[:7]}: {answer['error']}")
        raise RuntimeError(f"the fingerprint of {args.algo} at {commit[:7]} failed: {answer['error']}")
    return _show(answer["fingerprint"], answer.get("note", ""))


def _show(fingerprint: str, note: str) -> int:
    """The fingerprint alone on stdout (an empty line when unknown, with the reason on stderr)."""
    if note:
        sys.stderr.write(f"no fingerprint: {note}\n")
    sys.stdout.write(fingerprint + "\n")
    return 0


# ------------------------------------------------------------------------------------ at a commit


def fingerprints_at(repository: Path, commit: str, algos: list[str]) -> dict[str, dict[str, Any]]:
    """Each algorithm's answer at ``commit`` (a full sha): {"fingerprint": ..., "note"?: ...}
    or {"error": ..., "bad_input": bool}, from this checkout's fingerprint file run as a script
    in a worktree of the commit, with that worktree's ``agents``."""
    from benchmark.training import fingerprint

    with provenance.worktree(repository, commit) as tree:
        if not (tree / "agents" / "__init__.py").is_file():
            raise ConfigError(f"commit {commit[:7]} has no agents package to fingerprint")
        script = "import runpy, sys; path = sys.argv[1]; sys.argv = sys.argv[1:]; runpy.run_path(path, run_name='__main__')"
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])]),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        command = [sys.executable, "-c", script, str(Path(fingerprint.__file__).resolve()), "--algo", *algos, "--json", "--agents-root", str(tree)]
        try:
            done = subprocess.run(command, cwd=tree, env=environment, capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the fingerprints at {commit[:7]} took over {TIMEOUT_SECONDS} s") from None
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"the fingerprint script failed at {commit[:7]}: {last}")
        return dict(json.loads(lines[-1]))


# ------------------------------------------------------------------------------------ backfill


def backfill(directories: list[Path], console: Output) -> int:
    """Fill the empty fingerprints of the bundles in ``directories``: each (commit, algorithm)
    measured once, at the run's recorded git sha; each bundle rewritten only if something was
    filled, after checking (on a copy) that nothing but fingerprints changed."""
    from benchmark import bundles
    from benchmark.tables import TableData

    read = {directory: bundles.read(directory) for directory in directories}  # every bundle checked before anything is measured
    wanted: dict[tuple[str, str], list[tuple[Path, str]]] = {}
    unrecorded = 0
    for directory, bundle in read.items():
        for run in bundle.runs.values():
            if run.fingerprint:
                continue
            sha = run.provenance.get("git_sha", "")
            if not sha:
                unrecorded += 1
                continue
            wanted.setdefault((sha, run.spec.algo), []).append((directory, run.run_key))
    repository = provenance.repository() if wanted else Path()
    found: dict[tuple[str, str], str] = {}
    table = TableData("fingerprints filled", ["commit", "algo", "runs", "fingerprint"], names={"commit", "algo"}, right={"runs"})
    failed = 0
    for sha in sorted({sha for sha, _ in wanted}):
        algos = sorted(algo for commit, algo in wanted if commit == sha)
        try:
            answers = fingerprints_at(repository, provenance.commit(repository, sha), algos)
        except Exception as error:  # noqa: BLE001 - this commit's runs stay unknown; the others are filled
            answers = {algo: {"error": str(error)} for algo in algos}
        for algo in algos:
            answer, runs = answers[algo], wanted[(sha, algo)]
            dirty = sum(1 for directory, key in runs if read[directory].runs[key].provenance.get("git_dirty") == "true")
            note = f" ({dirty} trained with uncommitted changes: the fingerprint is of the commit)" if dirty else ""
            if answer.get("fingerprint"):
                found[(sha, algo)] = answer["fingerprint"]
                table.add(sha[:7], algo, len(runs), answer["fingerprint"] + note)
            else:
                failed += "error" in answer
                table.add(sha[:7], algo, 0, f"unknown: {answer.get('error') or answer.get('note', '')}")
    for directory, bundle in read.items():
        filled = {
            key: replace(run, fingerprint=found[(run.provenance.get("git_sha", ""), run.spec.algo)])
            for key, run in bundle.runs.items()
            if not run.fingerprint and (run.provenance.get("git_sha", ""), run.spec.algo) in found
        }
        if filled:
            _rewrite(directory, bundle, filled)
    console.table(table)
    if unrecorded:
        console.print(f"{unrecorded} run(s) record no git sha: left unknown", highlight=False, markup=False)
    return EXIT_RUNS_FAILED if failed else 0


def _rewrite(directory: Path, bundle: Bundle, filled: dict[str, Any]) -> None:
    """Write ``bundle`` with the runs of ``filled`` replaced, after checking on a copy that it
    reads back with every field but those fingerprints as before."""
    from benchmark import bundles

    new = bundles.Bundle(bundle.suite, {**bundle.runs, **filled}, bundle.created, bundle.schema_version, bundle.origin)
    staging = Path(tempfile.mkdtemp(prefix="reprorl-fingerprint-check-"))
    try:
        _check(bundle, bundles.read(bundles.write(new, staging / "bundle")), filled, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    bundles.write(new, directory)
    try:
        _check(bundle, bundles.read(directory), filled, directory)
    except RuntimeError:
        bundles.write(bundle, directory)
        raise


def _check(before: Bundle, after: Bundle, filled: dict[str, Any], directory: Path) -> None:
    """RuntimeError unless ``after`` holds ``before``'s runs with only ``filled``'s fingerprints set."""
    changed = [key for key in before.runs if key not in after.runs or not _same_apart_from_fingerprint(before.runs[key], after.runs[key])]
    wrong = [key for key, run in filled.items() if after.runs.get(key) is None or after.runs[key].fingerprint != run.fingerprint]
    if changed or wrong or set(after.runs) != set(before.runs) or (after.suite, after.created) != (before.suite, before.created):
        raise RuntimeError(f"rewriting {directory} would change more than fingerprints (runs {', '.join((changed + wrong)[:3]) or 'added'}): left as it was")


def _same_apart_from_fingerprint(first: Any, second: Any) -> bool:
    kept = (replace(first, fingerprint="", origin=""), replace(second, fingerprint="", origin=""))
    return kept[0] == kept[1] or repr(kept[0]) == repr(kept[1])  # (repr: a NaN equals itself)


COMMANDS = {"fingerprint": command_fingerprint}
