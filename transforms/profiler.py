"""The profiler's own CPU cost in a trace, and the job without it.

A profiled step is longer on the host than the job's own: for every op it records the profiler
runs its enter and exit callbacks and writes an event, and for every CUDA runtime call CUPTI
writes an activity record. That time lies between the recorded calls, in the graph's host tasks.
The estimate (``estimate``): per iteration and thread, ``per_op_ns`` for each recorded op
(``cpu_op`` range) and ``per_call_ns`` for each traced runtime call (``api`` task), both from
transforms.constants.PROFILER with their source. ``without_profiler`` takes it out of each
thread's host tasks of each iteration, in proportion to their own time (never below
``min_host_share`` of it): the what-if "the same job without the profiler", which the
predictions that remove CPU work (``cuda_graphs``, ``fusion``) are compared on, since the CPU
time they remove included the profiler's, which the job without the profiler never had.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from transforms.constants import PROFILER
from transforms.primitives import Graph


def _op_counts(g: Graph, ranges: pa.Table | None) -> pl.DataFrame:
    """Recorded ops per (thread unit, iteration): cpu_op ranges starting inside an iteration,
    on the thread of the unit with the same pid and tid."""
    empty = pl.DataFrame(schema={"unit_id": pl.Int32, "iteration": pl.Int32, "ops": pl.UInt32})
    if ranges is None or not ranges.num_rows or g.iteration.height == 0:
        return empty
    r = pl.from_arrow(ranges.select(["pid", "tid", "kind", "start_ns"]))
    if r.schema["kind"] != pl.String:
        r = r.with_columns(pl.col("kind").cast(pl.String))
    r = r.filter(pl.col("kind") == "cpu_op")
    if not r.height:
        return empty
    units = g.unit.filter(pl.col("kind") == "thread", pl.col("tid").is_not_null()).select(
        "unit_id", "pid", "tid")
    if "rank" in g.unit.columns:  # a job: ranks' ranges would need their own pid spaces
        return empty
    its = g.iteration.select("iteration", "start_ns", "end_ns").sort("start_ns")
    starts = its["start_ns"].to_numpy()
    k = np.searchsorted(starts, r["start_ns"].to_numpy(), "right") - 1
    ok = k >= 0
    ends = its["end_ns"].to_numpy()
    ok &= r["start_ns"].to_numpy() < ends[np.clip(k, 0, len(ends) - 1)]
    r = r.with_columns(pl.Series("iteration", np.where(ok, its["iteration"].to_numpy()[
        np.clip(k, 0, len(ends) - 1)], -1)).cast(pl.Int32)).filter(pl.col("iteration") >= 0)
    return (r.join(units, on=["pid", "tid"]).group_by("unit_id", "iteration")
            .agg(pl.len().alias("ops")))


def per_thread(g: Graph, ranges: pa.Table | None) -> pl.DataFrame:
    """Per (thread unit, iteration): ops, calls, the profiler's estimated cost (ns) and the
    host time it lies in (ns). Computed once per graph and ranges table."""
    hit = g._memo.get("per_thread")
    if hit is not None and hit[0] is ranges:
        return hit[1]
    out = _per_thread(g, ranges)
    g._memo["per_thread"] = (ranges, out)
    return out


def _per_thread(g: Graph, ranges: pa.Table | None) -> pl.DataFrame:
    t = g.task.filter(pl.col("iteration").is_not_null(), pl.col("kind").is_in(["api", "host"]))
    agg = t.group_by("unit_id", "iteration").agg(
        (pl.col("kind") == "api").sum().alias("calls"),
        pl.col("dur_ns").filter(pl.col("kind") == "host").sum().alias("host_ns"))
    ops = _op_counts(g, ranges)
    out = agg.join(ops, on=["unit_id", "iteration"], how="left").with_columns(
        pl.col("ops").fill_null(0))
    return out.with_columns(
        (pl.col("ops").cast(pl.Int64) * PROFILER["per_op_ns"]["value"]
         + pl.col("calls").cast(pl.Int64) * PROFILER["per_call_ns"]["value"]).alias("overhead_ns"))


def estimate(g: Graph, ranges: pa.Table | None, used: list[int] | None = None,
             step_ms: float | None = None) -> dict:
    """The profiler's cost per used iteration (``used``: iteration indices, all where None):
    ops and calls recorded, the estimated overhead (ms, summed over threads, and on the
    busiest thread) and its share of STEP_MS."""
    p = per_thread(g, ranges)
    if used is not None:
        p = p.filter(pl.col("iteration").is_in(used))
    n = max(p["iteration"].n_unique(), 1) if p.height else 1
    by_unit = p.group_by("unit_id").agg(pl.col("overhead_ns").sum())
    busiest = float(by_unit["overhead_ns"].max()) / n / 1e6 if by_unit.height else 0.0
    out = {"per_op_us": PROFILER["per_op_ns"]["value"] / 1e3,
           "per_call_us": PROFILER["per_call_ns"]["value"] / 1e3,
           "ops_per_iteration": float(p["ops"].sum()) / n if p.height else 0.0,
           "calls_per_iteration": float(p["calls"].sum()) / n if p.height else 0.0,
           "overhead_ms": float(p["overhead_ns"].sum()) / n / 1e6 if p.height else 0.0,
           "busiest_thread_overhead_ms": busiest,
           "ops_counted": ranges is not None and bool(p["ops"].sum() if p.height else 0)}
    out["share"] = busiest / step_ms if step_ms else None
    return out


def without_profiler(g: Graph, ranges: pa.Table | None) -> tuple[Graph, float]:
    """The graph with the profiler's estimated cost taken out of each thread's host tasks per
    iteration (in proportion to their own time, none below PROFILER min_host_share of it);
    returns it and the time removed per iteration (ns, summed over threads)."""
    p = per_thread(g, ranges).with_columns(
        (1.0 - pl.col("overhead_ns") / pl.col("host_ns").cast(pl.Float64))
        .clip(lower_bound=PROFILER["min_host_share"]["value"], upper_bound=1.0)
        .fill_nan(1.0).fill_null(1.0).alias("factor"))
    t = g.task.with_row_index("i").select("i", "unit_id", "iteration", "kind", "dur_ns")
    f = t.join(p.select("unit_id", "iteration", "factor"), on=["unit_id", "iteration"],
               how="left").sort("i")
    fac = np.where((f["kind"] == "host").to_numpy(), f["factor"].fill_null(1.0).to_numpy(), 1.0)
    removed = float((f["dur_ns"].to_numpy() * (1.0 - fac)).sum())
    n = max(p["iteration"].n_unique(), 1) if p.height else 1
    return g.scale(fac < 1.0, fac), removed / n
