"""Graph tables -> simulator input, and a simulated schedule -> iteration times and reports.

Iteration times are measured and simulated by one rule, so a baseline replay compares like with
like: iteration i starts when its first CPU task starts (the one at or after the iteration's
marker) and ends when iteration i+1 starts; the last one ends when its last task (GPU work it
launched included) ends, and no earlier than every task of the iterations so far has ended
(work a CPU running ahead left queued on the GPU), less what the trace itself left running past
that end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest.errors import DaydreamError
from simulate import _core
from simulate.engine import Schedule, simulate
from simulate.graph import END, FCFS, FIXED, PRIORITY, START, START_START, SimGraph

ANCHOR_KIND = {"end_start": START, "end_end": END, "start_start": START_START}
POLICY = {"fixed": FIXED, "fcfs": FCFS, "priority": PRIORITY}
CPU_KINDS = ("api", "host")
GPU_KINDS = ("kernel", "memcpy", "memset", "comm")
KIND_CODE = {k: i for i, k in enumerate(CPU_KINDS + GPU_KINDS)}
WARMUP_TOLERANCE = 0.10  # a first iteration this far from the others' median is a warm-up


def _codes(col: pa.ChunkedArray | pa.Array, mapping: dict[str, int], what: str) -> np.ndarray:
    """int64 codes of a string column whose values must all be keys of ``mapping``.

    A dictionary column (an ENUM read from DuckDB) maps only its dictionary; a plain string
    column is looked up with one hash pass (``index_in``)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(arr.type):
        values, idx = arr.dictionary.to_pylist(), arr.indices
    else:
        values = list(mapping)
        idx = pc.index_in(arr, value_set=pa.array(values, arr.type))
        if idx.null_count:
            bad = arr.filter(pc.is_null(idx)).unique().to_pylist()
            values = values + [v for v in bad if v not in mapping]
    unknown = [v for v in values if v not in mapping]
    if unknown:
        raise DaydreamError(f"unknown {what} {unknown[0]!r}; known: {', '.join(mapping)}")
    lut = np.array([mapping[v] for v in values] or [0], np.int64)
    return lut[idx.to_numpy(zero_copy_only=False)]


@dataclass(frozen=True)
class _TaskCols:
    """The task columns the reports read, decoded once per replay."""

    obs_start: np.ndarray
    obs_end: np.ndarray
    cpu: np.ndarray       # bool: an api or host task (the origin marker excluded)
    iteration: np.ndarray  # -1 outside every iteration

    @classmethod
    def of(cls, task: pa.Table) -> _TaskCols:
        start = task["start_ns"].to_numpy()
        cpu = _codes(task["kind"], KIND_CODE, "task kind") < len(CPU_KINDS)
        if len(cpu):
            cpu[0] = False  # the origin marker
        return cls(start, start + task["obs_dur_ns"].to_numpy(), cpu,
                   task["iteration"].fill_null(-1).to_numpy())


def to_simgraph(g: dict[str, pa.Table]) -> SimGraph:
    """The simulator's columnar input from the graph tables of one trace."""
    task, edge, unit = g["task"], g["edge"], g["unit"]
    policy = _codes(unit["policy"], POLICY, "unit policy")
    kind = _codes(edge["anchor"], ANCHOR_KIND, "edge anchor")
    return SimGraph.from_edges(
        dur_ns=task["dur_ns"].to_numpy(),
        unit=task["unit_id"].to_numpy(),
        unit_policy=policy,
        src=edge["src"].to_numpy(), dst=edge["dst"].to_numpy(),
        lag_ns=edge["lag_ns"].to_numpy(), edge_kind=kind,
        order_key=task["start_ns"].to_numpy(),
        priority=task["priority"].fill_null(0).to_numpy(),
    )


@dataclass
class Iteration:
    index: int
    label: str | None
    measured_ns: int
    simulated_ns: int
    used: bool = True
    note: str = ""


@dataclass
class Replay:
    """A simulated schedule and what it says about iterations, units and the critical path."""

    schedule: Schedule
    iterations: list[Iteration]
    unit_busy: list[dict] = field(default_factory=list)
    critical_path: dict = field(default_factory=dict)

    def mean(self, attr: str) -> float:
        used = [getattr(i, attr) for i in self.iterations if i.used]
        return float(np.mean(used)) if used else float("nan")


def _first_at_or_after(start: np.ndarray, cpu: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For each time in t, the CPU task with the smallest observed start >= t."""
    ids = np.flatnonzero(cpu)
    s = start[ids]
    if len(s) > 1 and bool(np.any(s[1:] < s[:-1])):  # task ids are in start order: rarely
        o = np.argsort(s, kind="stable")
        ids, s = ids[o], s[o]
    pos = np.minimum(np.searchsorted(s, t, side="left"), len(ids) - 1)
    return ids[pos]


def iteration_times(g: dict[str, pa.Table], sim_start: np.ndarray, sim_end: np.ndarray,
                    cols: _TaskCols | None = None) -> list[Iteration]:
    """Measured and simulated time of every iteration (see the module doc for the rule)."""
    its = g["iteration"]
    if not its.num_rows:
        return []
    c = cols or _TaskCols.of(g["task"])
    idx = its["iteration"].to_numpy()
    labels = its["label"].to_pylist()
    ends = its["end_ns"].to_numpy()
    anchors = _first_at_or_after(c.obs_start, c.cpu, its["start_ns"].to_numpy())
    out = []
    for k in range(len(idx)):
        a = anchors[k]
        if k + 1 < len(idx):
            b = anchors[k + 1]
            meas = c.obs_start[b] - c.obs_start[a]
            simt = sim_start[b] - sim_start[a]
        else:
            # the last iteration ends at its marker's end (CPU step or the GPU work it
            # launched): map that time through the task of the iteration that ended there
            end_ns = int(ends[k])
            mine = np.flatnonzero((c.iteration == idx[k]) & (c.obs_end <= end_ns))
            if len(mine):
                last = mine[np.argmax(c.obs_end[mine])]
                # ... and no earlier than the work of every iteration so far is done, less
                # what the trace itself left running past the end: a CPU that runs ahead (up
                # to the launch queue) leaves GPU work behind it, which the window's last
                # iteration must still wait for
                done = np.flatnonzero((c.iteration >= 0) & (c.iteration <= idx[k]))
                slack = int(c.obs_end[done].max()) - end_ns
                meas = end_ns - c.obs_start[a]
                simt = max(int(sim_end[last]) + (end_ns - int(c.obs_end[last])),
                           int(sim_end[done].max()) - max(slack, 0)) - sim_start[a]
            else:
                meas = simt = 0
        out.append(Iteration(int(idx[k]), labels[k], int(meas), int(simt)))
    _mark_warmup(out)
    return out


def _mark_warmup(its: list[Iteration]) -> None:
    if len(its) < 3:
        return
    rest = np.median([i.measured_ns for i in its[1:]])
    first = its[0].measured_ns
    if rest > 0 and abs(first - rest) / rest > WARMUP_TOLERANCE:
        its[0].used = False
        its[0].note = (f"warm-up: {first / 1e6:.1f} ms against a median of {rest / 1e6:.1f} ms "
                       "for the others; left out of the means")


def _iteration_path(sched: Schedule, last: int, it_of: np.ndarray, it: int) -> np.ndarray:
    """The critical path back from task ``last``, cut where it leaves iteration ``it``."""
    n = _core._walk(sched.bound_by, sched.bound_via_start, sched.end_bound_by, last,
                    np.empty(0, np.int64))
    path = np.empty(n, np.int64)
    _core._walk(sched.bound_by, sched.bound_via_start, sched.end_bound_by, last, path)
    outside = np.flatnonzero(it_of[path] != it)
    return path[outside[-1] + 1:] if len(outside) else path


def critical_path_summary(g: dict[str, pa.Table], sched: Schedule, iteration: int,
                          top: int = 8, last: int | None = None,
                          cols: _TaskCols | None = None) -> dict:
    """The chain of tasks that decided when the iteration ended, summarized by phase, layer
    and kind of work (time on the path, ns). ``last`` is the task that ended the iteration
    (what the next iteration's first task waited for); by default the last-ending task."""
    task = g["task"]
    it_of = (cols.iteration if cols is not None
             else task["iteration"].fill_null(-1).to_numpy())
    mine = np.flatnonzero(it_of == iteration)
    if not len(mine):
        return {}
    if last is None or it_of[last] != iteration:
        last = mine[np.argmax(sched.end_ns[mine])]
    path = _iteration_path(sched, int(last), it_of, iteration)
    path = path[np.r_[True, path[1:] != path[:-1]]]  # a task entered and left: count once
    # attribute time, not durations: a task overlapped by the one before it on the path (a
    # kernel that starts while its launch call runs) counts only from where that one ended
    s, e = sched.start_ns[path], sched.end_ns[path]
    cursor = np.maximum.accumulate(np.r_[s[:1], e[:-1]])
    held = np.maximum(e - np.maximum(s, cursor), 0)
    out = {"iteration": int(iteration), "tasks": int(len(path)),
           "span_ns": int(sched.end_ns[last] - sched.start_ns[path[0]]) if len(path) else 0}
    on_path = pa.array(path)
    for col in ("phase", "kind", "layer"):
        out[f"by_{col}"] = _time_by(task[col].take(on_path), held, top, col)
    return out


def _time_by(values: pa.ChunkedArray, ns: np.ndarray, top: int, col: str) -> list[dict]:
    """``ns`` summed per distinct value (null is a value), largest first, ``top`` of them."""
    d = values.combine_chunks()
    if not pa.types.is_dictionary(d.type):
        d = d.dictionary_encode()
    names = d.dictionary.to_pylist() + [None]
    idx = d.indices.fill_null(len(names) - 1).to_numpy()
    sums = np.bincount(idx, weights=ns, minlength=len(names))
    seen = np.bincount(idx, minlength=len(names)) > 0
    keys = [k for k in np.argsort(-sums, kind="stable") if seen[k]][:top]
    return [{col: names[k], "ns": int(round(sums[k]))} for k in keys]


def unit_busy(g: dict[str, pa.Table], sched: Schedule) -> list[dict]:
    """Share of the simulated span each unit is busy."""
    unit = g["unit"]
    n_units = unit.num_rows
    busy = sched.unit_busy_ns(n_units)
    span = max(sched.makespan_ns, 1)
    names = unit["name"].to_pylist()
    kinds = unit["kind"].to_pylist()
    return [{"unit": names[u], "kind": kinds[u], "busy_ns": int(busy[u]),
             "busy_share": float(busy[u] / span)} for u in range(n_units)
            if names[u] != "origin"]


def _ender(g: dict[str, pa.Table], sched: Schedule, iteration: int,
           cols: _TaskCols | None = None) -> int | None:
    """The task whose end let the next iteration's first task start (None for the last)."""
    its = g["iteration"]
    idx = its["iteration"].to_numpy()
    k = np.flatnonzero(idx == iteration)
    if not len(k) or k[0] + 1 >= len(idx):
        return None
    c = cols or _TaskCols.of(g["task"])
    nxt = _first_at_or_after(c.obs_start, c.cpu, its["start_ns"].to_numpy()[k[0] + 1:k[0] + 2])[0]
    b = int(sched.bound_by[nxt])
    return b if b >= 0 and not sched.bound_via_start[nxt] else None


def replay(g: dict[str, pa.Table]) -> Replay:
    """Simulate a graph and measure it like the trace was measured."""
    sched = simulate(to_simgraph(g))
    cols = _TaskCols.of(g["task"])
    its = iteration_times(g, sched.start_ns, sched.end_ns, cols)
    used = [i for i in its if i.used]
    cp = {}
    if used:
        med = sorted(used, key=lambda i: i.measured_ns)[len(used) // 2]
        cp = critical_path_summary(g, sched, med.index,
                                   last=_ender(g, sched, med.index, cols), cols=cols)
    return Replay(sched, its, unit_busy(g, sched), cp)
