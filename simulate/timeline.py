"""Write schedules as a Chrome trace (opens in Perfetto and chrome://tracing).

Each schedule is one process (e.g. "measured", "simulated", "predicted"), each unit a thread in
it, so the timelines lie one above the other. Each process has an "iterations" track marking
where each iteration of that schedule runs (a 72 ms step is drawn as 72 ms, not as the span
of the whole trace), and flow arrows from each launch call to the GPU work it launched (the
graph's launch edges). A window of time or a set of iterations can be asked for: only the
tasks that overlap it are written (users cannot open traces of hundreds of MB in any viewer).
A name ending in ``.gz`` is written gzip-compressed. Written in chunks with orjson: no list of
all events in memory; a task's args hold only what it has (no nulls).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa

from daydream.base.columns import numpy_filled

CHUNK = 50_000
# Zero-length tasks that only anchor a graph's start (graphstore.build, graphstore.job): not
# work, so no event and no track of their own.
MARKERS = ["<trace start>", "<job start>"]
# The edge kind whose source is a launch call and whose destination the GPU work it launched
LAUNCH = "launch"


def _col(t: pa.Table, name: str) -> list:
    c = t[name]
    if pa.types.is_dictionary(c.type):
        c = c.cast(c.type.value_type)
    return c.to_pylist()


def iteration_spans(iters: np.ndarray, start: np.ndarray, end: np.ndarray,
                    keep: np.ndarray) -> dict[int, tuple[int, int]]:
    """Each iteration's extent in a schedule: (first start, last end) of its tasks in KEEP
    (ITERS: each task's iteration, -1 for none)."""
    out: dict[int, tuple[int, int]] = {}
    sel = keep & (iters >= 0)
    if not sel.any():
        return out
    it, s, e = iters[sel], start[sel], end[sel]
    for i in np.unique(it).tolist():
        m = it == i
        out[int(i)] = (int(s[m].min()), int(e[m].max()))
    return out


def write_timeline(path: Path | str, g: dict[str, pa.Table],
                   schedules: list[tuple], *, window_ns: tuple[int, int] | None = None,
                   iterations: list[int] | None = None, flows: bool = True,
                   ops: dict | None = None) -> int:
    """schedules: (process name, start_ns, end_ns) with times relative to the trace start, of
    the tasks of G; or (process name, start_ns, end_ns, graph) for a schedule of another graph
    (a rewritten one, whose tasks are not G's). Units that run no task in a schedule (the
    origin marker's) get no track. WINDOW_NS: only the tasks overlapping [lo, hi) (ns from the
    trace start) of each schedule; ITERATIONS: only those iterations' extent in each schedule.
    FLOWS: arrows from launch calls to their GPU work. OPS: the measured operators (the
    trace's CPU ranges, nested as recorded) for the first schedule: arrays ``unit`` (the
    thread's unit), ``start_ns`` (from the trace start), ``dur_ns``, ``name``, drawn on an
    "ops" track beside each thread's tasks. Returns the number of events written."""
    n = 0
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    opener = ((lambda p: gzip.open(p, "wb", compresslevel=6)) if path.name.endswith(".gz")
              else (lambda p: open(p, "wb")))
    with opener(tmp) as f:
        f.write(b'{"displayTimeUnit": "ns", "traceEvents": [\n')
        first = True

        def emit(ev: dict) -> None:
            nonlocal first, n
            if not first:
                f.write(b",\n")
            first = False
            f.write(orjson.dumps(ev))
            n += 1

        for pid, sched in enumerate(schedules, start=1):
            pname, start, end = sched[:3]
            start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
            gs = sched[3] if len(sched) > 3 and sched[3] is not None else g
            task, unit = gs["task"], gs["unit"]
            names = _col(task, "name")
            kinds = _col(task, "kind")
            phases = _col(task, "phase")
            layers = _col(task, "layer")
            units = task["unit_id"].to_numpy()
            iters = numpy_filled(task["iteration"], -1)
            unit_names = _col(unit, "name")
            marker = np.isin(np.asarray(names, object), MARKERS)
            keep = ~marker
            keep[0] = False  # the origin marker
            spans = iteration_spans(iters, start, end, keep)
            lo_hi = window_ns
            if iterations is not None:
                got = [spans[i] for i in iterations if i in spans]
                lo_hi = ((min(a for a, _ in got), max(b for _, b in got)) if got
                         else (0, 0))
            if lo_hi is not None:
                keep &= (end > lo_hi[0]) & (start < lo_hi[1])
                spans = {i: s for i, s in spans.items()
                         if s[1] > lo_hi[0] and s[0] < lo_hi[1]}
            emit({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                  "args": {"name": pname}})
            emit({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                  "args": {"sort_index": pid}})
            busy = set(np.unique(units[keep]).tolist())
            for u, un in enumerate(unit_names):
                if u in busy:
                    emit({"ph": "M", "name": "thread_name", "pid": pid, "tid": u,
                          "args": {"name": un}})
            # the iterations track, above the units
            it_tid = len(unit_names)
            if spans:
                emit({"ph": "M", "name": "thread_name", "pid": pid, "tid": it_tid,
                      "args": {"name": "iterations"}})
                emit({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": it_tid,
                      "args": {"sort_index": -1}})
            for i, (a, b) in sorted(spans.items()):
                emit({"ph": "X", "name": f"iteration {i}", "cat": "iteration", "pid": pid,
                      "tid": it_tid, "ts": a / 1000.0, "dur": (b - a) / 1000.0,
                      "args": {"iteration": i, "ms": round((b - a) / 1e6, 3)}})
            order = np.argsort(start, kind="stable")
            order = order[keep[order]]
            for lo in range(0, len(order), CHUNK):
                for t in order[lo:lo + CHUNK]:
                    args = {}
                    if phases[t] is not None:
                        args["phase"] = phases[t]
                    if layers[t] is not None:
                        args["layer"] = layers[t]
                    ev = {"ph": "X", "name": names[t], "cat": kinds[t], "pid": pid,
                          "tid": int(units[t]), "ts": int(start[t]) / 1000.0,
                          "dur": int(end[t] - start[t]) / 1000.0}
                    if args:
                        ev["args"] = args
                    emit(ev)
            if ops is not None and pid == 1:
                _ops(emit, ops, pid, unit_names, lo_hi)
            if flows and "edge" in gs:
                _flows(emit, gs, pid, start, units, keep)
        f.write(b"\n]}\n")
    tmp.replace(path)
    return n


def _flows(emit, gs: dict[str, pa.Table], pid: int, start: np.ndarray, units: np.ndarray,
           keep: np.ndarray) -> int:
    """Flow arrows (Chrome trace "s"/"f" pairs) from each launch call to the GPU work it
    launched, for the pairs whose both ends are written."""
    e = gs["edge"]
    kind = e["kind"]
    if pa.types.is_dictionary(kind.type):
        kind = kind.cast(kind.type.value_type)
    import pyarrow.compute as pc
    sel = pc.equal(kind, LAUNCH)
    src = pc.filter(e["src"], sel).to_numpy(zero_copy_only=False)
    dst = pc.filter(e["dst"], sel).to_numpy(zero_copy_only=False)
    ids = gs["task"]["task_id"].to_numpy(zero_copy_only=False)
    if len(ids) and not np.array_equal(ids, np.arange(len(ids))):
        pos = np.full(int(ids.max()) + 1, -1, np.int64)
        pos[ids] = np.arange(len(ids))
        src, dst = pos[src], pos[dst]
    ok = (src >= 0) & (dst >= 0)
    src, dst = src[ok], dst[ok]
    both = keep[src] & keep[dst]
    k = 0
    for s, d in zip(src[both].tolist(), dst[both].tolist(), strict=True):
        fid = pid * 10**9 + k
        emit({"ph": "s", "name": "launch", "cat": "launch", "id": fid, "pid": pid,
              "tid": int(units[s]), "ts": int(start[s]) / 1000.0})
        emit({"ph": "f", "bp": "e", "name": "launch", "cat": "launch", "id": fid,
              "pid": pid, "tid": int(units[d]), "ts": int(start[d]) / 1000.0})
        k += 1
    return k


# The ops track of unit U is thread OPS_TID + U of its process
OPS_TID = 1_000_000


def _ops(emit, ops: dict, pid: int, unit_names: list[str],
         lo_hi: tuple[int, int] | None) -> None:
    """The operators of the measured schedule, each on its thread's ops track (ranges nest
    as recorded; a thread's tasks, which may cross an operator's edge, keep their own)."""
    u = np.asarray(ops["unit"], np.int64)
    s = np.asarray(ops["start_ns"], np.int64)
    d = np.asarray(ops["dur_ns"], np.int64)
    names = ops["name"]
    keep = u >= 0
    if lo_hi is not None:
        keep &= (s + d > lo_hi[0]) & (s < lo_hi[1])
    for x in np.unique(u[keep]).tolist():
        emit({"ph": "M", "name": "thread_name", "pid": pid, "tid": OPS_TID + x,
              "args": {"name": f"{unit_names[x]} ops"}})
        emit({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": OPS_TID + x,
              "args": {"sort_index": x}})
    idx = np.flatnonzero(keep)
    # parents first at equal starts, so that a viewer nests them as recorded
    idx = idx[np.lexsort((-d[idx], s[idx]))]
    for i in idx.tolist():
        emit({"ph": "X", "name": names[i], "cat": "op", "pid": pid,
              "tid": OPS_TID + int(u[i]), "ts": int(s[i]) / 1000.0, "dur": int(d[i]) / 1000.0})
