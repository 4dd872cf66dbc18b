"""Train one recorded run with the code of another commit: ``reproduce --at-recorded-commit``.

Run as a script (``python -P replay_at_commit.py SPECS_JSON BATCH_JSON RUN_KEY OUTPUT``) in a
process whose ``benchmark`` and ``agents`` packages are a worktree of the run's commit
(PYTHONPATH), so it may use only what every commit of the record has:
``benchmark.config.RunSpec.from_dict``, and ``run(spec)`` / ``run_seeds([SeedJob(spec)])`` from
``benchmark.training.loop`` (or, before the training wing, ``benchmark.train``). SPECS_JSON lists
the run's spec under this version's setting names and under the names runs were first recorded
with (a field renamed since is known to an old commit by its old name): the first the old code
reads with the recorded run key is trained. It writes the run key and the evaluations as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    candidates, batch, run_key, output = json.loads(argv[0]), [int(seed) for seed in json.loads(argv[1])], argv[2], Path(argv[3])
    from benchmark.config import RunSpec

    try:
        from benchmark.training import loop
    except ImportError:  # commits before the training wing
        from benchmark import train as loop  # type: ignore[attr-defined,no-redef]

    read = []
    for data in candidates:
        try:
            spec = RunSpec.from_dict(data)
            read.append(spec.run_key)
        except Exception as error:  # noqa: BLE001 - the old code refuses these names: try the next form
            read.append(f"refused ({type(error).__name__}: {error})")
            continue
        if spec.run_key == run_key:
            break
    else:
        output.write_text(json.dumps({"run_key": "", "read_as": read, "evaluations": []}))
        return 3
    if len(batch) > 1:
        jobs = [loop.SeedJob(dataclasses.replace(spec, seed=seed)) for seed in batch]
        result = loop.run_seeds(jobs)[batch.index(spec.seed)]
        if isinstance(result, BaseException):
            raise result
    else:
        result = loop.run(spec)
    output.write_text(json.dumps({"run_key": spec.run_key, "read_as": read, "evaluations": [[e.step, e.mean] for e in result.evaluations]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
