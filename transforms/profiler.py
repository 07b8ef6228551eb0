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

from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from daydream.transforms.constants import PROFILER
from daydream.transforms.primitives import Graph


@dataclass(frozen=True)
class PerThread:
    """Per (thread unit, iteration), one entry each: recorded ops, traced calls, the
    profiler's estimated cost (ns) and the host time it lies in (ns)."""

    unit_id: np.ndarray
    iteration: np.ndarray
    ops: np.ndarray
    calls: np.ndarray
    host_ns: np.ndarray
    overhead_ns: np.ndarray

    def select(self, keep: np.ndarray) -> PerThread:
        return PerThread(*(getattr(self, f.name)[keep] for f in fields(self)))


def _int(s: pa.ChunkedArray) -> np.ndarray:
    return s.to_numpy().astype(np.int64, copy=False)


def _op_counts(g: Graph, ranges: pa.Table | None, unit: np.ndarray, it: np.ndarray
               ) -> np.ndarray:
    """Recorded ops of each (thread UNIT, iteration IT) pair: cpu_op ranges starting inside
    the iteration, on the thread of the unit with the same pid and tid (a range of a thread
    that several units share counts for each). Numpy over the columns: a small trace's
    joins and group-bys cost more in Polars calls than the work."""
    ops = np.zeros(len(unit), np.int64)
    its = g.arrow("iteration")  # small tables: read as Arrow, as the graph holds them
    units = g.arrow("unit")
    if ranges is None or not ranges.num_rows or its.num_rows == 0 or not len(unit):
        return ops
    if "rank" in units.column_names:  # a job: ranks' ranges would need their own pid spaces
        return ops
    kind = ranges.column("kind")
    if pa.types.is_dictionary(kind.type):
        kind = kind.cast(pa.string())
    cpu = pc.fill_null(pc.equal(kind, "cpu_op"), False).to_numpy(zero_copy_only=False)
    if not cpu.any():
        return ops
    r = ranges.filter(pa.array(cpu))
    rstart = r.column("start_ns").to_numpy()
    by_start = np.argsort(_int(its["start_ns"]), kind="stable")
    starts, ends = (_int(its[c])[by_start] for c in ("start_ns", "end_ns"))
    k = np.searchsorted(starts, rstart, "right") - 1
    kc = np.clip(k, 0, len(ends) - 1)
    ok = (k >= 0) & (rstart < ends[kc])
    r_it = its["iteration"].to_numpy()[by_start][kc]
    rpid = r.column("pid").to_numpy(zero_copy_only=False)
    rtid = r.column("tid").to_numpy(zero_copy_only=False)
    index = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(unit.tolist(), it.tolist(),
                                                                 strict=True))}
    for uk, uid, pid, tid in zip(*(units[c].to_pylist() for c in ("kind", "unit_id", "pid",
                                                                   "tid")), strict=True):
        if uk != "thread" or tid is None or pid is None:
            continue
        on = ok & (rpid == pid) & (rtid == tid)
        if not on.any():
            continue
        vals, counts = np.unique(r_it[on], return_counts=True)
        for v, c in zip(vals.tolist(), counts.tolist(), strict=True):
            i = index.get((int(uid), int(v)))
            if i is not None:
                ops[i] += c
    return ops


def per_thread(g: Graph, ranges: pa.Table | None) -> PerThread:
    """Per (thread unit, iteration): ops, calls, the profiler's estimated cost (ns) and the
    host time it lies in (ns). Computed once per graph and ranges table."""
    hit = g._memo.get("per_thread")
    if hit is not None and hit[0] is ranges:
        return hit[1]
    out = _per_thread(g, ranges)
    g._memo["per_thread"] = (ranges, out)
    return out


def _per_thread(g: Graph, ranges: pa.Table | None) -> PerThread:
    kind, iteration = g.array("kind"), g.array("iteration", -1)
    api, host = kind == "api", kind == "host"
    sel = (api | host) & (iteration >= 0)
    unit = g.array("unit_id").astype(np.int64)[sel]
    it = iteration.astype(np.int64)[sel]
    dur = g.array("dur_ns").astype(np.int64)[sel]
    api, host = api[sel], host[sel]
    if len(unit):  # one integer key per (unit, iteration): a 1-d unique, not a 2-d one
        m = int(it.max()) + 1
        k, inv = np.unique(unit * m + it, return_inverse=True)
        keys, inv = np.stack([k // m, k % m]), inv.reshape(-1)
    else:
        keys, inv = np.zeros((2, 0), np.int64), np.zeros(0, np.intp)
    calls = np.bincount(inv[api], minlength=keys.shape[1]).astype(np.int64)
    host_ns = np.zeros(keys.shape[1], np.int64)
    np.add.at(host_ns, inv[host], dur[host])
    ops = _op_counts(g, ranges, keys[0], keys[1])
    overhead = ops * PROFILER["per_op_ns"]["value"] + calls * PROFILER["per_call_ns"]["value"]
    return PerThread(keys[0], keys[1], ops, calls, host_ns, overhead)


def estimate(g: Graph, ranges: pa.Table | None, used: list[int] | None = None,
             step_ms: float | None = None) -> dict:
    """The profiler's cost per used iteration (``used``: iteration indices, all where None):
    ops and calls recorded, the estimated overhead (ms, summed over threads, and on the
    busiest thread) and its share of STEP_MS."""
    p = per_thread(g, ranges)
    if used is not None:
        p = p.select(np.isin(p.iteration, np.asarray(used, np.int64)))
    rows = len(p.iteration)
    n = max(len(np.unique(p.iteration)), 1) if rows else 1
    by_unit = (np.unique(p.unit_id, return_inverse=True)[1].reshape(-1) if rows
               else np.zeros(0, np.intp))
    busiest = float(_sums(by_unit, p.overhead_ns).max()) / n / 1e6 if rows else 0.0
    out = {"per_op_us": PROFILER["per_op_ns"]["value"] / 1e3,
           "per_call_us": PROFILER["per_call_ns"]["value"] / 1e3,
           "ops_per_iteration": float(p.ops.sum()) / n if rows else 0.0,
           "calls_per_iteration": float(p.calls.sum()) / n if rows else 0.0,
           "overhead_ms": float(p.overhead_ns.sum()) / n / 1e6 if rows else 0.0,
           "busiest_thread_overhead_ms": busiest,
           "ops_counted": ranges is not None and bool(p.ops.sum() if rows else 0)}
    out["share"] = busiest / step_ms if step_ms else None
    return out


def _sums(groups: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Integer sums of VALUES per group index (exact, unlike a float bincount)."""
    out = np.zeros(int(groups.max()) + 1 if len(groups) else 0, np.int64)
    np.add.at(out, groups, values)
    return out


def without_profiler(g: Graph, ranges: pa.Table | None) -> tuple[Graph, float]:
    """The graph with the profiler's estimated cost taken out of each thread's host tasks per
    iteration (in proportion to their own time, none below PROFILER min_host_share of it);
    returns it and the time removed per iteration (ns, summed over threads)."""
    p = per_thread(g, ranges)
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.clip(1.0 - p.overhead_ns.astype(np.float64) / p.host_ns.astype(np.float64),
                         PROFILER["min_host_share"]["value"], 1.0)
    factor[np.isnan(factor)] = 1.0
    fac = np.ones(g.n_tasks)
    host = (g.array("kind") == "host") & (g.array("iteration", -1) >= 0)
    if len(p.unit_id) and host.any():
        unit = g.array("unit_id").astype(np.int64)[host]
        it = g.array("iteration", -1).astype(np.int64)[host]
        # (unit, iteration) pairs as one integer key; PerThread's pairs are sorted by it
        m = int(max(p.iteration.max(), it.max())) + 1
        keys = p.unit_id.astype(np.int64) * m + p.iteration.astype(np.int64)
        at = np.minimum(np.searchsorted(keys, unit * m + it), len(keys) - 1)
        fac[host] = np.where(keys[at] == unit * m + it, factor[at], 1.0)
    removed = float((g.array("dur_ns") * (1.0 - fac)).sum())
    n = max(len(np.unique(p.iteration)), 1) if len(p.iteration) else 1
    return g.scale(fac < 1.0, fac), removed / n
