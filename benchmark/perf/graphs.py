"""The CUDA-graph rows of ``make perf``: a run alone on a GPU with its gradient steps captured
(``cuda_graphs``) against the same run eager."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from benchmark.perf.cases import GRAPHS_CASES, GRAPHS_STEPS, GRAPHS_TARGET, batched_setting
from benchmark.perf.throughput import machine, median_entry, now, run_job


def measure_graphs(
    cases: Sequence[str] = GRAPHS_CASES,
    pairs: int = 3,
    scale: float = 1.0,
    threads: int = 1,
    device: str = "cuda",
    on_measurement: Callable[[str, str, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """For each case, one run alone on ``device`` with its gradient steps captured as CUDA
    graphs (``cuda_graphs``) against the same run eager (its critics stacked either way: the
    default on a GPU), in ``pairs`` alternating rounds; medians and their ratio."""
    rows: dict[str, Any] = {}
    for name in cases:
        env_id, ours = batched_setting(name)
        steps = max(int(GRAPHS_STEPS * scale), int(ours.get("learning_starts", 0)) + 1)
        common = {"kind": "seeds", "algo": name, "env_id": env_id, "steps": steps, "threads": threads, "hyperparameters": ours, "device": device, "seeds": [0]}
        measured: dict[str, list[dict[str, Any]]] = {"eager": [], "captured": []}
        for round_index in range(pairs):
            order = ("eager", "captured") if round_index % 2 == 0 else ("captured", "eager")
            for mode in order:
                result = run_job({**common, "cuda_graphs": mode == "captured"})
                entry = {"steps_per_second": result["steps_per_second"], "peak_rss_mb": result["peak_rss_mb"]}
                measured[mode].append(entry)
                if on_measurement is not None:
                    on_measurement(name, mode, entry)
        row: dict[str, Any] = {
            "env_id": env_id,
            "steps": steps,
            "hyperparameters": ours,
            **{mode: median_entry(entries) for mode, entries in measured.items()},
        }
        row["ratio"] = row["captured"]["steps_per_second"] / row["eager"]["steps_per_second"]
        if name == GRAPHS_TARGET[0]:
            row["target_ratio"], row["target_met"] = GRAPHS_TARGET[1], row["ratio"] >= GRAPHS_TARGET[1]
        rows[name] = row
    return {"created": now(), "machine": machine(), "settings": {"pairs": pairs, "scale": scale, "threads": threads, "device": device}, "cases": rows}
