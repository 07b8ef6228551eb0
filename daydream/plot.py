"""``daydream predict --plot FILE.png``: the phase breakdown and one iteration's schedule, before
and after an optimization, drawn with matplotlib (Agg, no display needed).

Data preparation (``phase_stack``, ``timeline_bars``) is separate from drawing so that what is
drawn can be checked against the prediction without reading pixels.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import IO

import numpy as np
import polars as pl
import pyarrow as pa

PHASE_ORDER = ("data_loading", "forward", "backward", "weight_update", "other")
PHASE_COLOR = {"data_loading": "#8c6d31", "forward": "#3182bd", "backward": "#e6550d",
               "weight_update": "#31a354", "other": "#969696"}


def phase_stack(phases: dict) -> tuple[list[str], dict[str, list[float]]]:
    """The stacked bars of the phase breakdown (``api.predict``'s ``phases``): the phases in
    drawing order, and for each bar ("GPU baseline", "GPU predicted", "CPU baseline",
    "CPU predicted") the busy ms per iteration of each phase in that order. ``predicted`` may
    also be a list of (label, phases), one per prediction: their bars are "GPU LABEL"."""
    b, p = phases["baseline"], phases.get("predicted") or {}
    preds = [("predicted", p)] if isinstance(p, dict) else list(p)
    preds = [(k, v) for k, v in preds if v]
    every = [b] + [v for _, v in preds]
    names = [ph for ph in PHASE_ORDER if any(ph in x for x in every)]
    names += sorted(set().union(*every) - set(names))
    bars = {}
    for side in ("gpu", "cpu"):
        for label, src in [("baseline", b)] + preds:
            bars[f"{side.upper()} {label}"] = [float(src.get(ph, {}).get(f"{side}_ms", 0.0))
                                               for ph in names]
    return names, bars


def timeline_bars(g: dict[str, pa.Table], start_ns: np.ndarray, end_ns: np.ndarray,
                  iteration: int) -> pl.DataFrame:
    """One bar per task of ITERATION with a positive simulated length: unit (its name), kind,
    phase, start_ms (from the iteration's first simulated start) and dur_ms, in start order."""
    task = g["task"]
    it = task["iteration"].fill_null(-1).to_numpy()
    sel = np.flatnonzero((it == iteration) & (end_ns > start_ns))
    sel = sel[sel > 0]  # the origin marker
    units = pl.from_arrow(g["unit"].select(["unit_id", "name"]))
    df = pl.DataFrame({
        "task_id": sel.astype(np.int64),
        "unit_id": task["unit_id"].to_numpy()[sel].astype(np.int32),
        "kind": np.asarray(task["kind"].to_pylist(), object)[sel].astype(str),
        "phase": [p or "other" for p in np.asarray(task["phase"].to_pylist(), object)[sel]],
        "start_ns": start_ns[sel], "end_ns": end_ns[sel]})
    if not df.height:
        return df.with_columns(pl.lit(None, pl.String).alias("unit"),
                               pl.lit(0.0).alias("start_ms"), pl.lit(0.0).alias("dur_ms"))
    t0 = int(df["start_ns"].min())
    return (df.join(units.with_columns(pl.col("unit_id").cast(pl.Int32))
                    .rename({"name": "unit"}), on="unit_id", how="left")
            .with_columns(((pl.col("start_ns") - t0) / 1e6).alias("start_ms"),
                          ((pl.col("end_ns") - pl.col("start_ns")) / 1e6).alias("dur_ms"))
            .sort("start_ns", "task_id"))


def plot_iteration(used_base: list[int], used_pred: list[int]) -> int | None:
    """The iteration drawn: the first one used (not a warm-up) in both replays."""
    both = [i for i in used_base if i in set(used_pred)]
    return both[0] if both else (used_base[0] if used_base else None)


def write_plot(path: str | Path | IO[bytes], phases: dict, before: tuple,
               after: tuple | list[tuple] | None, iteration: int | None,
               title: str = "", steps: list[float | None] | None = None
               ) -> str | Path | IO[bytes]:
    """Draw the breakdown (stacked bars) and ITERATION's timeline (units as rows) before and,
    when given, after each prediction. ``before``/``after``: (graph tables, start_ns, end_ns,
    label), ``after`` one or a list; PATH a file name or a binary file (the HTML report).
    STEPS: the iteration's step in ms in each timeline (before, then each after), marked
    with a line where it ends (its tasks may run on past it: GPU work queued)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    afters = [] if after is None else [after] if isinstance(after, tuple) else list(after)
    rows = [before] + afters
    bars_tl = [timeline_bars(g, s, e, iteration) if iteration is not None else None
               for g, s, e, _ in rows]
    n_units = max((b["unit"].n_unique() if b is not None and b.height else 1)
                  for b in bars_tl)
    # a timeline row (a thread or stream) is about a fifth of an inch high: a job's dozens of
    # units stay readable without a picture metres tall
    panel = 0.8 + 0.22 * max(n_units, 2)
    fig = plt.figure(figsize=(13, 3.5 + panel * len(rows)), layout="constrained")
    grid = fig.add_gridspec(1 + len(rows), 1, height_ratios=[3.5] + [panel] * len(rows))
    ax = fig.add_subplot(grid[0])
    names, data = phase_stack(phases)
    labels = list(data)
    x = np.arange(len(labels))
    bottom = np.zeros(len(labels))
    for i, ph in enumerate(names):
        h = np.array([data[k][i] for k in labels])
        ax.bar(x, h, bottom=bottom, color=PHASE_COLOR.get(ph, "#bdbdbd"), label=ph, width=0.6)
        bottom += h
    for xi, tot in zip(x, bottom, strict=False):
        ax.text(xi, tot, f"{tot:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [textwrap.fill(k, 24) for k in labels], fontsize=8)
    ax.set_ylabel("busy ms per iteration")
    ax.set_title(textwrap.fill(title or "time per phase (busy ms per iteration)", 140),
                 fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    xmax = max((float((b["start_ms"] + b["dur_ms"]).max()) for b in bars_tl
                if b is not None and b.height), default=1.0)
    for k, ((_g, _s, _e, label), b) in enumerate(zip(rows, bars_tl, strict=False)):
        axt = fig.add_subplot(grid[1 + k])
        axt.set_title(f"iteration {iteration}: {label}", fontsize=10)
        if b is None or not b.height:
            axt.text(0.5, 0.5, "no tasks", ha="center", transform=axt.transAxes)
            continue
        units = b.group_by("unit").agg(pl.col("unit_id").first()).sort("unit_id")["unit"]
        for r, u in enumerate(units.to_list()):
            ub = b.filter(pl.col("unit") == u)
            colors = [PHASE_COLOR.get(p, "#bdbdbd") for p in ub["phase"].to_list()]
            axt.broken_barh(list(zip(ub["start_ms"].to_list(), ub["dur_ms"].to_list(),
                                     strict=False)), (r - 0.4, 0.8), facecolors=colors,
                            linewidth=0)
        axt.set_yticks(range(len(units)), units.to_list(), fontsize=7 if len(units) > 12 else 8)
        axt.set_ylim(-0.6, len(units) - 0.4)
        axt.invert_yaxis()
        step = (steps or [])[k] if k < len(steps or []) else None
        if step:
            axt.axvline(step, color="#b00020", linestyle="--", linewidth=1)
            axt.text(step, -0.5, f" step {step:.1f} ms", color="#b00020", fontsize=8,
                     va="bottom")
        axt.set_xlim(0, max(xmax, step or 0.0) * 1.01)
        axt.set_xlabel("ms from the iteration's first task")
    if isinstance(path, str | Path):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
    return path
