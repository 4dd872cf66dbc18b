"""The learning-curve grid of a budget as an interactive Plotly figure (the report's HTML), the
same numbers as ``curve_grid``'s PNG: one panel per task, one colour per algorithm, the smoothed
mean over seeds with its 95% bootstrap band, the published score each verdict compared with as a
star. Interactive: hover shows each value; clicking an algorithm in the legend hides or shows it
in every panel; a button shows every seed's own (unsmoothed) curve; a slider sets the smoothing
window (1 = none), every window's mean and band computed here, so the page needs no code of ours.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.colors import to_hex, to_rgba

from benchmark.analysis import curve_grid
from benchmark.analysis.plots import COLORS  # the PNG's colours, so both figures match

WINDOWS = (1, 3, 5, 9)
"""Smoothing windows the slider offers (evaluations in the centered moving average); the PNG's window among them."""


def _rgba(color: Any, alpha: float) -> str:
    red, green, blue, _ = (round(255 * part) for part in to_rgba(color))
    return f"rgba({red},{green},{blue},{alpha})"


def figure(cells: Sequence[curve_grid.Cell], steps: int) -> dict[str, Any]:
    """The Plotly figure (``{"data": [...], "layout": {...}}``) of the budget ``steps``."""
    from plotly.subplots import make_subplots

    from benchmark.analysis.record_text import steps_text

    mine = [cell for cell in cells if cell.steps == steps]
    tasks = list(dict.fromkeys(cell.task for cell in mine))
    algos = list(dict.fromkeys(cell.label for cell in mine))
    color = {algo: to_hex(COLORS[index % len(COLORS)]) for index, algo in enumerate(algos)}
    columns = min(len(tasks), 3)
    rows = -(-len(tasks) // columns)
    layout = make_subplots(rows=rows, cols=columns, subplot_titles=tasks, horizontal_spacing=0.06, vertical_spacing=0.12).to_plotly_json()["layout"]
    data: list[dict[str, Any]] = []
    by_window: dict[int, dict[int, list[float]]] = {window: {} for window in WINDOWS}
    seed_traces: list[int] = []
    shown: set[str] = set()
    for index, task in enumerate(tasks):
        axis = "" if index == 0 else str(index + 1)
        where = {"xaxis": f"x{axis}", "yaxis": f"y{axis}"}
        for cell in (c for c in mine if c.task == task):
            lines = {window: curve_grid.line(cell.curves, window=window) for window in WINDOWS}
            default = lines[curve_grid.WINDOW]
            if default is None:
                continue
            x = default.steps.tolist()
            hue = color[cell.label]
            for part in ("high", "low", "mean"):
                trace: dict[str, Any] = {"type": "scatter", "mode": "lines", "x": x, "y": getattr(default, part).tolist(), **where}
                trace |= {"legendgroup": cell.label, "name": cell.label, "hoverinfo": "skip" if part != "mean" else None}
                if part == "mean":
                    trace |= {"line": {"color": hue, "width": 2}, "showlegend": cell.label not in shown, "customdata": [default.seeds] * len(x)}
                    trace["hovertemplate"] = f"{cell.label}: %{{y:,.1f}} at %{{x:,}} steps (mean of %{{customdata}} seeds)<extra></extra>"
                    shown.add(cell.label)
                else:
                    trace |= {"line": {"width": 0, "color": hue}, "showlegend": False}
                    if part == "low":
                        trace |= {"fill": "tonexty", "fillcolor": _rgba(hue, 0.18)}
                trace = {key: value for key, value in trace.items() if value is not None}
                for window, drawn in lines.items():
                    if drawn is not None:
                        by_window[window][len(data)] = getattr(drawn, part).tolist()
                data.append(trace)
            for number, curve in enumerate(c for c in cell.curves if c):
                seed_x, seed_y = zip(*curve)
                data.append(
                    {"type": "scatter", "mode": "lines", "x": list(seed_x), "y": list(seed_y), **where, "visible": False, "showlegend": False}
                    | {"legendgroup": cell.label, "line": {"color": hue, "width": 0.8}, "opacity": 0.5, "name": f"{cell.label} seed run {number + 1}"}
                )
                seed_traces.append(len(data) - 1)
            if cell.published_curve is not None:
                curve_steps, curve_mean = cell.published_curve
                dashed = {"type": "scatter", "mode": "lines", "x": curve_steps.tolist(), "y": curve_mean.tolist(), **where, "showlegend": False}
                dashed |= {"legendgroup": cell.label, "line": {"color": hue, "width": 1.2, "dash": "dash"}, "name": f"{cell.label}, published curve"}
                dashed["hovertemplate"] = f"{cell.label}, published curve: %{{y:,.1f}} at %{{x:,}} steps<extra></extra>"
                data.append(dashed)
            if cell.published is not None:
                at, mean, spread, source = cell.published
                star = {"type": "scatter", "mode": "markers", "x": [at], "y": [mean], **where, "showlegend": False, "legendgroup": cell.label}
                star |= {"marker": {"symbol": "star", "size": 14, "color": hue, "line": {"color": "black", "width": 1}}}
                star["hovertemplate"] = f"{cell.label}, published ({source}): %{{y:,.1f}}<extra></extra>"
                if spread is not None:
                    star["error_y"] = {"type": "data", "array": [spread], "color": hue}
                data.append(star)
    for key, value in layout.items():
        if key.startswith("xaxis"):
            value |= {"tickformat": "~s", "title": {"text": "environment steps"} if key == "xaxis" else None}
            layout[key] = {k: v for k, v in value.items() if v is not None}
    layout |= {
        "title": {
            "text": f"{steps_text(steps)} steps: evaluation return, mean over seeds with its 95% bootstrap band",
            "font": {"size": 14},
            **{"x": 0, "xanchor": "left", "y": 0.99, "yanchor": "top", "yref": "container"},
        },
        "hovermode": "closest",
        "legend": {"orientation": "h", "y": -0.12},
        "margin": {"t": 150, "l": 50, "r": 20, "b": 60},
        "updatemenus": [_seed_buttons(len(data), seed_traces)],
        "sliders": [_smoothing_slider(by_window)],
    }
    return {"data": data, "layout": layout}


def _seed_buttons(traces: int, seed_traces: list[int]) -> dict[str, Any]:
    buttons = [
        {"label": "mean and band", "method": "restyle", "args": [{"visible": False}, seed_traces]},
        {"label": "every seed too", "method": "restyle", "args": [{"visible": True}, seed_traces]},
    ]
    return {"type": "buttons", "direction": "right", "x": 0, "y": 1.08, "xanchor": "left", "yanchor": "bottom", "buttons": buttons, "showactive": True}


def _smoothing_slider(by_window: dict[int, dict[int, list[float]]]) -> dict[str, Any]:
    steps = []
    for window, traces in by_window.items():
        indices = sorted(traces)
        label = "none" if window == 1 else f"{window} evaluations"
        steps.append({"label": label, "method": "restyle", "args": [{"y": [traces[i] for i in indices]}, indices]})
    active = WINDOWS.index(curve_grid.WINDOW)
    place = {"x": 0.4, "len": 0.6, "y": 1.08, "yanchor": "bottom", "pad": {"t": 0, "b": 10}}
    return {"active": active, "currentvalue": {"prefix": "smoothing: "}, "steps": steps, **place}


def figures(cells: Sequence[curve_grid.Cell]) -> dict[int, dict[str, Any]]:
    """Budget (largest first) -> its figure."""
    return {steps: figure(cells, steps) for steps in sorted({cell.steps for cell in cells}, reverse=True)}


def aggregate_height(intervals: dict[str, dict[str, Any]]) -> int:
    """Pixels the aggregate panels need (two rows of them): the title and axes, and a line per algorithm in each."""
    return max(380, 200 + 2 * 34 * len(intervals))


def aggregate_intervals(intervals: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The report's aggregate panel as a Plotly figure, the numbers of ``plots.aggregate_intervals``'
    PNG: one panel per metric (IQM, mean, median, optimality gap), one row per algorithm, the
    estimate as a diamond with its 95% interval as an error bar; hover gives all three."""
    from plotly.subplots import make_subplots

    labels = list(intervals)
    metrics = list(next(iter(intervals.values())))
    columns = min(2, len(metrics))  # two by two: each panel readable on a phone too
    rows = -(-len(metrics) // columns)
    grid = make_subplots(
        rows=rows,
        cols=columns,
        subplot_titles=metrics,
        shared_yaxes=True,
        horizontal_spacing=0.04,
        vertical_spacing=0.3 / rows,
    )
    layout = grid.to_plotly_json()["layout"]
    data: list[dict[str, Any]] = []
    for column, metric in enumerate(metrics):
        axis = "" if column == 0 else str(column + 1)
        for row, label in enumerate(labels):
            interval = intervals[label][metric]
            hue = to_hex(COLORS[row % len(COLORS)])
            point: dict[str, Any] = {"type": "scatter", "mode": "markers", "x": [interval.estimate], "y": [label], "xaxis": f"x{axis}", "yaxis": f"y{axis}"}
            point |= {"name": label, "legendgroup": label, "showlegend": column == 0, "customdata": [[interval.low, interval.high]]}
            point |= {"marker": {"symbol": "diamond", "size": 11, "color": hue, "line": {"color": "black", "width": 0.5}}}
            bar = {"type": "data", "symmetric": False, "array": [interval.high - interval.estimate], "arrayminus": [interval.estimate - interval.low]}
            point["error_x"] = bar | {"color": hue, "thickness": 6, "width": 0}
            point["hovertemplate"] = f"{label}, {metric}: %{{x:.3f}} [%{{customdata[0]:.3f}}, %{{customdata[1]:.3f}}]<extra></extra>"
            data.append(point)
        layout["xaxis" if column == 0 else f"xaxis{column + 1}"] |= {"zeroline": False}
    layout |= {
        "title": {"text": "normalized scores, 95% stratified bootstrap CIs", "font": {"size": 14}, "x": 0, "xanchor": "left"},
        "hovermode": "closest",
        "showlegend": False,
        "margin": {"t": 70, "l": 110, "r": 20, "b": 50},
    }
    return {"data": data, "layout": layout}


def performance_profiles(profiles: dict[str, tuple[Any, Any, Any]], thresholds: Any) -> dict[str, Any]:
    """The report's performance profiles as a Plotly figure (``plots.performance_profiles``' numbers):
    the fraction of runs scoring above tau, a step line per algorithm with its 95% bootstrap band;
    hover gives the fraction and its band at each tau; the legend toggles an algorithm."""
    data: list[dict[str, Any]] = []
    taus = [float(tau) for tau in thresholds]
    for index, (label, (estimate, low, high)) in enumerate(profiles.items()):
        hue = to_hex(COLORS[index % len(COLORS)])
        common = {"type": "scatter", "mode": "lines", "x": taus, "legendgroup": label, "name": label}
        data.append(common | {"y": [float(v) for v in high], "line": {"width": 0, "color": hue, "shape": "hv"}, "showlegend": False, "hoverinfo": "skip"})
        band = {"fill": "tonexty", "fillcolor": _rgba(hue, 0.22), "hoverinfo": "skip", "showlegend": False}
        data.append(common | {"y": [float(v) for v in low], "line": {"width": 0, "color": hue, "shape": "hv"}} | band)
        mean = common | {"y": [float(v) for v in estimate], "line": {"width": 2, "color": hue, "shape": "hv"}}
        mean["customdata"] = [[float(a), float(b)] for a, b in zip(low, high)]
        mean["hovertemplate"] = f"{label}: %{{y:.2f}} [%{{customdata[0]:.2f}}, %{{customdata[1]:.2f}}] of runs score above τ = %{{x:.2f}}<extra></extra>"
        data.append(mean)
    layout = {
        "title": {"text": "performance profiles (95% bootstrap bands)", "font": {"size": 14}, "x": 0, "xanchor": "left"},
        "xaxis": {"title": {"text": "normalized score τ"}},
        "yaxis": {"title": {"text": "fraction of runs with score > τ"}, "range": [-0.03, 1.03]},
        "hovermode": "closest",
        "legend": {"orientation": "h", "y": -0.2},
        "margin": {"t": 50, "l": 60, "r": 20, "b": 60},
    }
    return {"data": data, "layout": layout}
