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

from daydream.base.columns import numpy_filled
from daydream.base.errors import DaydreamError
from daydream.base.memo import per_table, per_tables
from daydream.graphstore.schema import (
    CPU_KINDS,
    EDGE_ANCHORS,
    EDGE_KINDS,
    GPU_KINDS,
    POLICIES,
    TASK_KINDS,
)
from daydream.simulate import _passes
from daydream.simulate.codes import END, FCFS, FIXED, PRIORITY, START, START_START
from daydream.simulate.engine import Schedule, simulate
from daydream.simulate.graph import SimGraph

# The graph schema's vocabularies -> the simulator's codes.
ANCHOR_KIND = dict(zip(EDGE_ANCHORS, (START, START_START, END), strict=True))
POLICY = dict(zip(POLICIES, (FIXED, FCFS, PRIORITY), strict=True))
KIND_CODE = {k: i for i, k in enumerate(TASK_KINDS)}  # codes below len(CPU_KINDS): CPU tasks
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


def _lut(dictionary: pa.Array, mapping: dict[str, int], what: str, dtype) -> np.ndarray:
    values = dictionary.to_pylist()
    unknown = [v for v in values if v not in mapping]
    if unknown:
        raise DaydreamError(f"unknown {what} {unknown[0]!r}; known: {', '.join(mapping)}")
    return np.array([mapping[v] for v in values] or [0], dtype)


def _codes8(col: pa.ChunkedArray, mapping: dict[str, int], what: str) -> np.ndarray:
    """``_codes`` as int8, a dictionary column decoded chunk by chunk (no chunks combined)."""
    if col.null_count or not pa.types.is_dictionary(col.type):
        return _codes(col, mapping, what).astype(np.int8)
    out = np.empty(len(col), np.int8)
    for lo, ch in _offsets(col):
        idx = ch.indices.to_numpy()
        np.take(_lut(ch.dictionary, mapping, what, np.int8), idx, out=out[lo:lo + len(idx)])
    return out


def _ints(col: pa.ChunkedArray) -> bool:
    return pa.types.is_integer(col.type) and not col.null_count


def _fast_simgraph(g: dict[str, pa.Table], policy: np.ndarray, kind: np.ndarray,
                   priority: np.ndarray, lag_col: pa.ChunkedArray,
                   dur_col: pa.ChunkedArray, held: np.ndarray | None) -> SimGraph | None:
    """The SimGraph of edges already in source order, checked; None when they are not (or
    a value is bad): ``to_simgraph`` then takes the general path."""
    task, edge = g["task"], g["edge"]
    n, m = task.num_rows, edge.num_rows
    if not all(_ints(c) for c in (dur_col, task["unit_id"], task["start_ns"],
                                  edge["src"], edge["dst"], lag_col)) \
            or not pa.types.is_signed_integer(task["unit_id"].type) \
            or task["unit_id"].type.bit_width > 32:
        return None
    indptr = np.empty(n + 1, np.int64)
    nxt = 0
    for lo, ch in _offsets(edge["src"]):
        ok, nxt = _passes.csr_offsets(n, ch.to_numpy(), lo, indptr, nxt)
        if not ok:
            return None
    _passes.csr_close(indptr, nxt, m)
    # one pass per batch checks what the simulator relies on, and copies the batch out when
    # there are several (a single batch is used where it lies)
    batches = pa.table({"dur": dur_col, "unit": task["unit_id"]}).to_batches()
    dur = np.empty(n if len(batches) > 1 else 0, np.int64)
    unit = np.empty(n if len(batches) > 1 else 0, np.int32)
    lo = 0
    for b in batches:
        if not _passes.tasks_into(b.column(0).to_numpy(), b.column(1).to_numpy(), len(policy),
                                  dur, unit, lo, len(batches) > 1):
            return None
        lo += b.num_rows
    if len(batches) == 1:
        dur, unit = batches[0].column(0).to_numpy(), batches[0].column(1).to_numpy()
    batches = pa.table({"dst": edge["dst"], "lag": lag_col}).to_batches()
    dst = np.empty(m if len(batches) > 1 else 0, np.int64)
    lag = np.empty(m if len(batches) > 1 else 0, np.int64)
    lo = 0
    for b in batches:
        if not _passes.edges_into(n, b.column(0).to_numpy(), b.column(1).to_numpy(), dst, lag,
                                  lo, len(batches) > 1):
            return None
        lo += b.num_rows
    if len(batches) == 1:
        dst, lag = batches[0].column(0).to_numpy(), batches[0].column(1).to_numpy()
    start = task["start_ns"]
    start = start.chunk(0).to_numpy() if start.num_chunks == 1 else start.to_numpy()
    return SimGraph(dur_ns=dur, unit=unit, unit_policy=policy, order_key=start,
                    priority=priority, indptr=indptr, dst=dst, lag_ns=lag, edge_kind=kind,
                    held_if_running=held)


Slack = "bool | frozenset[str]"


def _kept(slack, kind: str) -> bool:
    return slack is True or (not isinstance(slack, bool) and kind in slack)


def edge_lags(edge: pa.Table, slack=True) -> pa.ChunkedArray:
    """Each edge's delay in the simulation: its physical latency, plus what the trace showed
    beyond it (``slack`` True; a set of edge kinds keeps theirs only). With all slack the
    unmodified graph replays its trace exactly; without, the replay shows how much of the
    timeline the graph's structure explains."""
    if slack is False or "slack_ns" not in edge.column_names:
        return edge["lag_ns"]
    if slack is True:
        return pc.add(edge["lag_ns"], edge["slack_ns"])
    keep = pc.is_in(edge["kind"].cast(pa.string()), pa.array(sorted(slack), pa.string()))
    return pc.add(edge["lag_ns"], pc.if_else(keep, edge["slack_ns"], 0))


def task_durations(task: pa.Table, slack=True) -> pa.ChunkedArray:
    """Each task's duration in the simulation: its own cost, plus (``slack`` True, or a set
    holding its kind) what no edge models inside it: a collective's waiting for its peers
    (``peer_wait``), a thread's stretch the trace cannot attribute (``untraced``)."""
    if "slack_ns" not in task.column_names or not (
            _kept(slack, "peer_wait") or _kept(slack, "untraced")):
        return task["dur_ns"]
    if slack is True or (_kept(slack, "peer_wait") and _kept(slack, "untraced")):
        return pc.add(task["dur_ns"], task["slack_ns"])
    on_cpu = pc.is_in(task["kind"].cast(pa.string()), pa.array(list(CPU_KINDS)))
    keep = on_cpu if _kept(slack, "untraced") else pc.invert(on_cpu)
    return pc.add(task["dur_ns"], pc.if_else(keep, task["slack_ns"], 0))


def to_simgraph(g: dict[str, pa.Table], slack=True, inferred: bool = True) -> SimGraph:
    """The simulator's columnar input from the graph tables of one trace, checked as
    ``SimGraph.from_edges`` checks it (so ``simulate(..., check=False)`` may run it).
    ``slack``: which slack the simulation keeps (``edge_lags``, ``task_durations``);
    ``inferred`` False leaves out the edges inferred from coincidences of times.

    Edges come from ``read_graph`` in source order: the CSR is then the edge columns as they
    are, with ``indptr`` written from the sources, and each column checked in the pass that
    copies it out of its chunks. Anything else (sources out of order, a bad value, nulls)
    goes through ``SimGraph.from_edges``, which sorts, or names the problem."""
    task, edge, unit = g["task"], g["edge"], g["unit"]
    restore = None
    if not inferred and "inferred" in edge.column_names:
        # as if the edges had never been inferred: a task they made wait keeps the waiting
        # in its duration, as the trace shows it
        restore = edge.filter(pc.and_(edge["inferred"], edge["binding"]))["dst"]
        g = _without_inferred(g)
        edge = g["edge"]
    # what does not depend on the slack kept, decoded once per table (a graph is replayed
    # with and without slack: every prediction replays its baseline four times)
    policy = per_table("policy", unit, _policy_codes)
    kind = per_table("anchor", edge, _anchor_codes)
    priority = per_table("priority", task, _priorities)
    lag_col = edge_lags(edge, slack)
    dur_col = task_durations(task, slack)
    if restore is not None and len(restore):
        back = np.zeros(task.num_rows, bool)
        back[restore.to_numpy()] = True
        dur_col = pa.chunked_array([pc.if_else(pa.array(back), task["obs_dur_ns"].combine_chunks(),
                                               dur_col.combine_chunks())])
    held = per_table("held", edge, _held_if_running)
    sg = _fast_simgraph(g, policy, kind, priority, lag_col, dur_col, held)
    if sg is not None:
        return sg
    return SimGraph.from_edges(
        dur_ns=dur_col.to_numpy(),
        unit=task["unit_id"].to_numpy(),
        unit_policy=policy,
        src=edge["src"].to_numpy(), dst=edge["dst"].to_numpy(),
        lag_ns=lag_col.to_numpy(), edge_kind=kind,
        order_key=task["start_ns"].to_numpy(),
        priority=priority, held_if_running=held,
    )


# (shared by every replay of a table, and never written: left writable all the same, as the
# compiled core's cached signatures take them)
def _policy_codes(unit: pa.Table) -> np.ndarray:
    return _codes(unit["policy"], POLICY, "unit policy").astype(np.int8)


_HELD_KIND = {k: int(k == "contention") for k in EDGE_KINDS}


def _held_if_running(edge: pa.Table) -> np.ndarray | None:
    """The contention edges (``SimGraph.held_if_running``): a kernel of another stream holds
    the SMs a task needs only while it runs; None without any."""
    if "kind" not in edge.column_names:
        return None
    held = _codes8(edge["kind"], _HELD_KIND, "edge kind").view(bool)
    return held if held.any() else None


def _anchor_codes(edge: pa.Table) -> np.ndarray:
    return _codes8(edge["anchor"], ANCHOR_KIND, "edge anchor")


def _priorities(task: pa.Table) -> np.ndarray:
    n, prio = task.num_rows, task["priority"]
    return (np.zeros(n, np.int64) if prio.null_count == n  # untouched pages: no cost
            else numpy_filled(prio, 0))


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
    # the steady-state step over the used iterations (``steady_step``): measured, simulated
    steady: dict = field(default_factory=dict)
    # each task's work in the simulation (its simulated duration: own cost, plus task slack
    # where kept), ns
    work_ns: np.ndarray | None = None
    sim: SimGraph | None = None          # the graph as simulated
    anchors: np.ndarray | None = None    # each iteration row's first CPU task
    # the graph tables and the iteration ``critical_path`` summarizes (the median used one)
    path_of: tuple[dict, int] | None = None
    # the task whose end times the window's last iteration (``last_end_task``), -1: none
    last_end: int = -1
    _path: dict | None = field(default=None, repr=False, compare=False)

    @property
    def critical_path(self) -> dict:
        """``critical_path_summary`` of the median used iteration ({} without one), computed
        when first asked for: a result reads only the times of its explained replays."""
        if self._path is None:
            self._path = {} if self.path_of is None else self.critical_path_of(*self.path_of)
        return self._path

    def critical_path_of(self, g: dict[str, pa.Table], iteration: int) -> dict:
        """``critical_path_summary`` of any iteration of this replay of ``g``."""
        return critical_path_summary(g, self.schedule, self.sim, iteration, self.anchors,
                                     last_end=self.last_end)

    def headline(self, attr: str) -> float:
        """The steady-state step (``steady``), else the median of the used iterations."""
        v = self.steady.get(attr)
        return float(v) if v is not None and v == v else self.median(attr)

    def mean(self, attr: str) -> float:
        used = [getattr(i, attr) for i in self.iterations if i.used]
        return float(np.mean(used)) if used else float("nan")

    def median(self, attr: str) -> float:
        """The steady-state headline: the median over the iterations used (warm-up and drain
        left out)."""
        used = [getattr(i, attr) for i in self.iterations if i.used]
        return float(np.median(used)) if used else float("nan")


@dataclass(frozen=True)
class _Scan:
    """What the reports read of every task, from one compiled pass (``_passes.task_scan``)."""

    obs_start: np.ndarray  # observed start of each task
    anchors: np.ndarray    # per iteration row: its first CPU task (at or after its marker)
    acc: np.ndarray        # the last iteration's extent (``_passes`` FB_START..DONE_N)
    busy: np.ndarray       # int64 simulated time held per unit, ns (empty unless asked)


def _batch_codes(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(index per task, is-CPU per index) of one batch of the task kind column."""
    if pa.types.is_dictionary(arr.type) and not arr.null_count:
        lut = _lut(arr.dictionary, KIND_CODE, "task kind", np.int8) < len(CPU_KINDS)
        return arr.indices.to_numpy().astype(np.int32, copy=False), lut
    return (_codes(arr, KIND_CODE, "task kind").astype(np.int32, copy=False),
            np.arange(len(KIND_CODE)) < len(CPU_KINDS))


def _batch_ints(arr: pa.Array, fill: int) -> tuple[np.ndarray, np.ndarray, int, bool]:
    """(values as int32, validity bitmap, its bit offset, has nulls) of a batch of the
    iteration column (the compiled passes take int32: the graph's INTEGER column as it is)."""
    if not pa.types.is_integer(arr.type) or not len(arr):
        return (arr.fill_null(fill).cast(pa.int32()).to_numpy(zero_copy_only=False),
                np.empty(0, np.uint8), 0, False)
    vals = np.frombuffer(arr.buffers()[1], arr.type.to_pandas_dtype())
    vals = vals[arr.offset:arr.offset + len(arr)].astype(np.int32, copy=False)
    if not arr.null_count:
        return vals, np.empty(0, np.uint8), 0, False
    return vals, np.frombuffer(arr.buffers()[0], np.uint8), arr.offset, True


def _scan(g: dict[str, pa.Table], obs_start: np.ndarray, sim_start: np.ndarray,
          sim_end: np.ndarray, unit: np.ndarray | None = None, n_units: int = 0,
          work: np.ndarray | None = None) -> _Scan:
    """One pass over the tasks, batch by batch, for iteration times and (with ``unit`` and
    ``work``, the simulated durations) each unit's work."""
    its = g["iteration"]
    t = its["start_ns"].to_numpy()
    order = np.argsort(t, kind="stable")
    t_sorted = np.ascontiguousarray(t[order], np.int64)
    k = len(t)
    b_start = np.zeros(k, np.int64)
    b_task = np.full(k, -1, np.int64)
    acc = np.zeros(_passes.N_ACC, np.int64)
    acc[_passes.FB_TASK] = acc[_passes.MINE_TASK] = -1
    last_it = int(its["iteration"][k - 1].as_py()) if k else -(2**62)
    last_end = int(its["end_ns"][k - 1].as_py()) if k else 0
    busy = np.zeros(n_units if unit is not None else 0, np.int64)
    if unit is None:
        unit = np.empty(0, np.int32)
    if work is None:
        work = np.empty(0, np.int64)
    lo = 0
    for b in g["task"].select(["obs_dur_ns", "kind", "iteration"]).to_batches():
        obs_dur = b.column(0).to_numpy()
        kind_idx, cpu_lut = _batch_codes(b.column(1))
        it_val, it_valid, it_voff, it_nulls = _batch_ints(b.column(2), -1)
        _passes.task_scan(lo, obs_start, obs_dur, kind_idx, cpu_lut, it_val, it_valid, it_voff,
                          it_nulls, sim_start, sim_end, unit, work, busy, t_sorted, b_start,
                          b_task, acc, last_it, last_end)
        lo += b.num_rows
    if k and acc[_passes.FB_TASK] < 0:
        raise DaydreamError("no CPU task in the trace: iterations cannot be timed")
    anchors = np.empty(k, np.int64)
    anchors[order] = _passes.finish_anchors(b_start, b_task, acc[_passes.FB_TASK])
    return _Scan(obs_start, anchors, acc, busy)


def iteration_times(g: dict[str, pa.Table], sim_start: np.ndarray, sim_end: np.ndarray,
                    scan: _Scan | None = None) -> list[Iteration]:
    """Measured and simulated time of every iteration (see the module doc for the rule)."""
    its = g["iteration"]
    if not its.num_rows:
        return []
    if scan is None:
        scan = _scan(g, g["task"]["start_ns"].to_numpy(), sim_start, sim_end)
    obs_start, anchors, acc = scan.obs_start, scan.anchors, scan.acc
    idx = its["iteration"].to_numpy()
    labels = its["label"].to_pylist()
    ends = its["end_ns"].to_numpy()
    out = []
    for k in range(len(idx)):
        a = anchors[k]
        if k + 1 < len(idx):
            b = anchors[k + 1]
            meas = obs_start[b] - obs_start[a]
            simt = sim_start[b] - sim_start[a]
        else:
            # the last iteration ends at its marker's end (CPU step or the GPU work it
            # launched): map that time through the task of the iteration that ended there
            # (the last to end at or before it)
            end = _last_end(int(ends[k]), acc, sim_end)
            if end is not None:
                meas = int(ends[k]) - obs_start[a]
                simt = end[0] - sim_start[a]
            else:
                meas = simt = 0
        out.append(Iteration(int(idx[k]), labels[k], int(meas), int(simt)))
    _mark_warmup(out)
    return out


def _last_end(end_ns: int, acc: np.ndarray, sim_end: np.ndarray) -> tuple[int, bool] | None:
    """The simulated end of the window's last iteration, whose marker ends at END_NS (``acc``:
    ``_scan``'s), and whether the last of its tasks to end by then times it: that task's end
    mapped through, but no earlier than the work of every iteration so far is done, less what
    the trace itself left running past the end (a CPU that runs ahead, up to the launch queue,
    leaves GPU work behind it, which the window's last iteration must still wait for). None
    where none of its tasks ended by its marker's end."""
    last = int(acc[_passes.MINE_TASK])
    if last < 0:
        return None
    own = int(sim_end[last]) + end_ns - int(acc[_passes.MINE_END])
    behind = max(int(acc[_passes.DONE_OBS_END]) - end_ns, 0)
    done = int(acc[_passes.DONE_SIM_END]) - behind
    return max(own, done), own >= done


def _mark_warmup(its: list[Iteration]) -> None:
    """Flag the iterations a steady-state figure leaves out: the window's last one when it
    drains (it also waits for GPU work queued before it and for the profiler's closing sync:
    longer than the iterations between by more than WARMUP_TOLERANCE), then a first one that
    is a warm-up outlier against the steady iterations (not against the drain)."""
    if len(its) < 3:
        return
    mid = float(np.median([i.measured_ns for i in its[1:-1]]))
    last = its[-1].measured_ns
    if mid > 0 and (last - mid) / mid > WARMUP_TOLERANCE:
        its[-1].used = False
        its[-1].note = (f"drain: {last / 1e6:.1f} ms against a median of {mid / 1e6:.1f} ms for "
                        "the iterations before it (the window's end waits for queued GPU work);"
                        " left out of the headline")
    rest = float(np.median([i.measured_ns for i in its[1:] if i.used]))
    first = its[0].measured_ns
    if rest > 0 and abs(first - rest) / rest > WARMUP_TOLERANCE:
        its[0].used = False
        its[0].note = (f"warm-up: {first / 1e6:.1f} ms against a median of {rest / 1e6:.1f} ms "
                       "for the steady iterations; left out of the headline")


def critical_path_summary(g: dict[str, pa.Table], sched: Schedule, sg: SimGraph,
                          iteration: int, anchors: np.ndarray, top: int = 8,
                          last_end: int = -1) -> dict:
    """The chain of tasks and delays that decided how long an iteration took, from its start
    (its first CPU task's simulated start) to its end (the next iteration's first CPU task, or
    for the window's last iteration the task that times its end, ``last_end_task``; without
    one its last-ending task), across threads and streams: each part is a task's own
    work or the delay of the edge that made a task wait (by the edge's kind: launch, stream,
    sync, wake, ...), and the parts add up to the span. ``sg``: the graph as simulated (its
    durations, and its CSR, in the order of ``g``'s edges); ``anchors``: each iteration row's
    first CPU task (``Replay.anchors``). Summarized by kind of work or delay, phase and layer
    (ns on the path)."""
    task = g["task"]
    idx = g["iteration"]["iteration"].to_numpy()
    rows = np.flatnonzero(idx == iteration)
    if not len(rows):
        return {}
    k = int(rows[0])
    t0 = int(sched.start_ns[anchors[k]])
    if k + 1 < len(idx):
        x, at_end = int(anchors[k + 1]), False
        t1 = int(sched.start_ns[x])
    elif last_end >= 0:
        x, at_end, t1 = last_end, True, int(sched.end_ns[last_end])
    else:
        x = -1
        for lo, *it in [(lo, *_batch_ints(ch, -1)) for lo, ch in _offsets(task["iteration"])]:
            x = _passes.last_in(lo, *it, iteration, sched.end_ns, x)
        if x < 0:
            return {}
        at_end, t1 = True, int(sched.end_ns[x])
    size = 4096
    while True:
        seg_task = np.empty(size, np.int64)
        seg_src = np.empty(size, np.int64)
        seg_ns = np.empty(size, np.int64)
        n, reached = _passes.path_parts(sched.bound_by, sched.bound_via_start,
                                        sched.end_bound_by, sched.start_ns, sched.end_ns,
                                        sg.dur_ns, x, at_end, t0, seg_task, seg_src, seg_ns)
        if n < size:
            break
        size *= 4
    seg_task, seg_src, seg_ns = seg_task[:n], seg_src[:n], seg_ns[:n]
    code, names = _part_codes(g, sg, seg_task, seg_src)
    sums, seen = _passes.group_sums(code, seg_ns, len(names))
    by_kind = [{"kind": names[i], "ns": int(sums[i])}
               for i in np.argsort(-sums, kind="stable") if seen[i]][:top]
    work = seg_src < 0
    gpu_code = np.array([nm in GPU_KINDS for nm in names] or [False], bool)
    gpu = gpu_code[code] & work
    on_path = np.zeros(task.num_rows, bool)
    on_path[seg_task] = True
    out = {"iteration": int(iteration), "tasks": int(on_path.sum()),
           "start_ns": t0, "end_ns": t1, "span_ns": t1 - t0,
           "covered_ns": int(seg_ns.sum()), "uncovered_ns": int(max(reached - t0, 0)),
           "work_ns": int(seg_ns[work].sum()), "gpu_ns": int(seg_ns[gpu].sum()),
           "delay_ns": int(seg_ns[~work].sum()), "by_kind": by_kind}
    # phase and layer of each task on the path: its parts summed per task first
    ids = np.flatnonzero(on_path)
    per_task = np.zeros(task.num_rows, np.int64)
    np.add.at(per_task, seg_task, seg_ns)
    for col in ("phase", "layer"):
        out[f"by_{col}"] = _time_by(task[col], ids, per_task[ids], top, col)
    return out


def _part_codes(g: dict[str, pa.Table], sg: SimGraph, seg_task: np.ndarray,
                seg_src: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """A code per critical-path part and the names they stand for: a task's kind for its own
    work, ``delay: <edge kind>`` for a delay (``delay: unit`` where the task waited for its
    unit's previous task with no edge between them, on a unit a transform added)."""
    kinds = _task_kinds(g)
    names = list(KIND_CODE)
    code = np.empty(len(seg_task), np.int64)
    work = seg_src < 0
    code[work] = kinds[seg_task[work]]
    d = np.flatnonzero(~work)
    if len(d):
        pos = np.empty(len(d), np.int64)
        _passes.edge_of(sg.indptr, sg.dst, seg_src[d], seg_task[d], pos)
        edge = g["edge"]
        rows = per_table("csr_rows", edge, _csr_rows)
        if rows is not None:  # CSR positions -> table rows
            pos = np.where(pos >= 0, rows[np.maximum(pos, 0)], -1)
        hit = pos >= 0
        # only the edges on the path: their kinds, encoded
        ek = edge["kind"].take(pa.array(pos[hit])).combine_chunks()
        if not pa.types.is_dictionary(ek.type):
            ek = ek.cast(pa.string()).dictionary_encode()
        base = len(names)
        names += [f"delay: {v}" for v in ek.dictionary.to_pylist()] + ["delay: unit"]
        dc = np.full(len(d), len(names) - 1, np.int64)
        dc[hit] = base + ek.indices.to_numpy(zero_copy_only=False)
        code[d] = dc
    return code, names


def _csr_rows(edge: pa.Table) -> np.ndarray | None:
    """The edge table's row of each CSR position (the CSR orders edges by source, stably);
    None where the table is in source order already."""
    src = edge["src"].to_numpy()
    if len(src) < 2 or bool((np.diff(src) >= 0).all()):
        return None
    return np.argsort(src, kind="stable")


def _offsets(col: pa.ChunkedArray) -> list[tuple[int, pa.Array]]:
    """(first row, chunk) of every chunk of a column."""
    out, lo = [], 0
    for ch in col.chunks:
        out.append((lo, ch))
        lo += len(ch)
    return out


def _iterations_of(its: list, tasks: np.ndarray) -> np.ndarray:
    """The iteration of each of ``tasks`` (-1 for none), from the column's decoded batches."""
    out = np.empty(len(tasks), np.int64)
    for lo, *it in its:
        _passes.iteration_of(lo, *it, tasks, out)
    return out


def _read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of A, for a kernel that only reads it: numba compiles a signature per
    writability, and Arrow's buffers are read-only or not by where they came from (a DLRM
    trace's prediction compiled two kernels anew after `make`'s warm-up, seconds each)."""
    v = a.view()
    v.flags.writeable = False
    return v


def _path_codes(col: pa.ChunkedArray, path: np.ndarray) -> tuple[np.ndarray, list] | None:
    """(index per path task, names; the last name is None, for null) as a dictionary encoding
    of the column's values along the path would give them; None for a column type not handled
    here. Dictionary columns keep their dictionary; strings are grouped by value in order of
    first appearance, straight from each chunk's buffers (``_passes.group_strings``)."""
    idx = np.empty(len(path), np.int64)
    lo = 0
    if pa.types.is_dictionary(col.type):
        if col.null_count or not col.num_chunks or \
                any(not ch.dictionary.equals(col.chunk(0).dictionary) for ch in col.chunks):
            return None
        for ch in col.chunks:
            _passes.gather_codes(path, lo, lo + len(ch),
                                 ch.indices.to_numpy().astype(np.int32, copy=False), idx)
            lo += len(ch)
        return idx, col.chunk(0).dictionary.to_pylist() + [None]
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return None
    off_type = np.int32 if pa.types.is_string(col.type) else np.int64
    first: dict[str, int] = {}  # value -> first position on the path
    local: list[str] = []       # value of each chunk-local group, all chunks in a row
    for ch in col.chunks:
        if not len(ch):
            continue
        valid, offsets, data = ch.buffers()
        rep, pos = _passes.group_strings(
            path, lo, lo + len(ch), _read_only(np.frombuffer(offsets, off_type)), ch.offset,
            _read_only(np.frombuffer(data, np.uint8) if data is not None else
                       np.empty(0, np.uint8)),
            _read_only(np.frombuffer(valid, np.uint8) if valid is not None else
                       np.empty(0, np.uint8)),
            ch.null_count > 0, idx, len(local))
        for r, p in zip(rep.tolist(), pos.tolist(), strict=True):
            v = ch[r].as_py()
            first[v] = min(first.get(v, p), p)
            local.append(v)
        lo += len(ch)
    names = sorted(first, key=first.__getitem__)
    code = {v: i for i, v in enumerate(names)}
    # local group -> code; the extra last entry is null's (group -1)
    lut = np.array([code[v] for v in local] + [len(names)], np.int64)
    return lut[idx], names + [None]


def _time_by(col: pa.ChunkedArray, path: np.ndarray, ns: np.ndarray, top: int,
             name: str) -> list[dict]:
    """``ns`` of each path task summed per distinct value of ``col`` (null is a value),
    largest first (ties in order of first appearance), ``top`` of them."""
    coded = _path_codes(col, path)
    if coded is None:
        d = col.take(pa.array(path)).combine_chunks()
        if not pa.types.is_dictionary(d.type):
            d = d.dictionary_encode()
        names = d.dictionary.to_pylist() + [None]
        idx = numpy_filled(d.indices, len(names) - 1)
    else:
        idx, names = coded
    sums, seen = _passes.group_sums(idx.astype(np.int64, copy=False), ns, len(names))
    keys = [k for k in np.argsort(-sums, kind="stable") if seen[k]][:top]
    return [{name: names[k], "ns": int(round(sums[k]))} for k in keys]


def unit_busy(g: dict[str, pa.Table], sched: Schedule,
              busy_ns: np.ndarray | None = None) -> list[dict]:
    """Share of the simulated span each unit works (``busy_ns``: each unit's work, the
    simulated durations of its tasks, when already summed; else the time its tasks held it)."""
    unit = g["unit"]
    n_units = unit.num_rows
    busy = sched.unit_busy_ns(n_units) if busy_ns is None else busy_ns
    span = max(sched.makespan_ns, 1)
    names = unit["name"].to_pylist()
    kinds = unit["kind"].to_pylist()
    return [{"unit": names[u], "kind": kinds[u], "busy_ns": int(busy[u]),
             "busy_share": float(busy[u] / span)} for u in range(n_units)
            if names[u] != "origin"]


def steady_step(g: dict[str, pa.Table], its: list[Iteration], anchors: np.ndarray,
                start: np.ndarray, end: np.ndarray, is_gpu: np.ndarray,
                orphan: np.ndarray, attr: str) -> float:
    """The steady-state step of a window, ns: from when the work before its first used
    iteration F was done to when the work of its last used one L was done, per iteration.
    "Done" with iteration X: its CPU has reached iteration X+1's first task, and every GPU
    task of iterations up to X (and every one launched before the window: ``orphan``, the
    backlog ``_gpu_and_backlog`` finds) has ended.

    The steps timed by CPU anchors (``iteration_times``) are what a training loop's own step
    timer shows, and they equal this in steady state; but a window is short, and when a
    what-if makes the GPU faster or slower the CPU runs ahead of it (as far as the launch queue
    lets it) or falls behind for a few iterations before a new steady state: such steps show
    the CPU's pace and push the GPU's work into the window's drain. Completion to completion,
    each iteration's work is counted once, wherever the window cut it. A trace without
    iteration markers (one iteration, the whole window) keeps its step (``attr`` of it)."""
    used = [i.index for i in its if i.used]
    if not used:
        return float("nan")
    whole, idx, row = per_table("iteration_rows", g["iteration"], _iteration_rows)
    if whole:  # no iteration markers: the window is the step
        return float(np.mean([getattr(i, attr) for i in its if i.used]))
    lab = _labels(g)
    f, last = used[0], used[-1]
    n_lab = int(max(idx.max(initial=-1), last)) + 1
    task_end, gpu_end, backlog = _passes.ends_by_label(
        *map(_read_only, (lab, end, is_gpu, orphan)), n_lab)
    gpu_upto = np.maximum(np.maximum.accumulate(gpu_end), max(int(backlog), 0))

    def done(x: int) -> int:
        k = row.get(x + 1)
        if k is not None:
            t = int(start[anchors[k]])
        else:  # the window's last iteration: its own tasks' ends
            t = max(int(task_end[x]), 0)
        return max(t, int(gpu_upto[x]))

    k0 = row.get(f)
    before = int(start[anchors[k0]]) if f - 1 not in row else done(f - 1)
    if f - 1 not in row:  # nothing before F in the window but what was launched before it
        before = max(before, backlog, 0)
    # no shorter than the steps the CPU timed: a steady step is the slower of the CPU's pace
    # and the GPU's, and those steps show at least the CPU's. Completion to completion alone
    # falls short when a backlog from before the window keeps the GPU busy into the first
    # used iteration and the GPU, made faster, then catches up with a CPU that set the pace
    # (the MI300X trace with its GPU work at a quarter)
    cpu = float(np.mean([getattr(i, attr) for i in its if i.used]))
    return max((done(last) - before) / len(used), cpu)


def _iteration_rows(t: pa.Table) -> tuple[bool, np.ndarray, dict[int, int]]:
    """Of an iteration table: whether it is the whole trace (no markers), the iteration
    indices, and each index's row (read once per table: every replay of a graph asks)."""
    src = t["source"].to_pylist() if "source" in t.column_names else []
    idx = t["iteration"].to_numpy()
    idx.setflags(write=False)
    return bool(src) and src[0] == "whole_trace", idx, {int(v): k for k, v in enumerate(idx)}


def replay(g: dict[str, pa.Table], slack=True, inferred: bool = True) -> Replay:
    """Simulate a graph and measure it like the trace was measured. ``slack`` False: the
    explained replay, every edge at its physical latency and every task at its own cost
    (``edge_lags``, ``task_durations``); a set of slack kinds keeps those. ``inferred`` False:
    without the edges inferred from coincidences."""
    sg = to_simgraph(g, slack, inferred)
    sched = simulate(sg, check=False)  # to_simgraph checked it
    gs = g if inferred else _without_inferred(g)
    # sg.order_key is the observed start of each task
    scan = _scan(g, sg.order_key, sched.start_ns, sched.end_ns, sg.unit, sg.n_units,
                 sg.dur_ns)
    its = iteration_times(g, sched.start_ns, sched.end_ns, scan)
    used = [i for i in its if i.used]
    path_of, steady = None, {}
    if used:
        med = sorted(used, key=lambda i: i.measured_ns)[len(used) // 2]
        path_of = (gs, med.index)
        is_gpu, orphan = _gpu_and_backlog(g)
        obs_end = sg.order_key + g["task"]["obs_dur_ns"].to_numpy()
        steady = {"measured_ns": steady_step(g, its, scan.anchors, sg.order_key, obs_end,
                                             is_gpu, orphan, "measured_ns"),
                  "simulated_ns": steady_step(g, its, scan.anchors, sched.start_ns,
                                              sched.end_ns, is_gpu, orphan, "simulated_ns")}
    return Replay(sched, its, unit_busy(g, sched, scan.busy), steady, sg.dur_ns, sg,
                  scan.anchors, path_of, last_end_task(g, sched, scan))


def last_end_task(g: dict[str, pa.Table], sched: Schedule, scan: _Scan) -> int:
    """The task whose simulated end times the window's last iteration (``iteration_times``):
    the last of its tasks to end by its marker's end, or, where the work of every iteration
    so far ends later, the task that ends last. -1 without iterations. A thread asleep
    between its calls (a poller's host time) can outlast the marker; it does not end it."""
    its, acc = g["iteration"], scan.acc
    end = (_last_end(int(its["end_ns"][its.num_rows - 1].as_py()), acc, sched.end_ns)
           if its.num_rows else None)
    if end is None:
        return -1
    mine = int(acc[_passes.MINE_TASK])
    if end[1]:
        return mine
    last_it = int(its["iteration"][its.num_rows - 1].as_py())
    labels = _labels(g)
    done = np.flatnonzero((labels >= 0) & (labels <= last_it)
                          & (sched.end_ns == acc[_passes.DONE_SIM_END]))
    return int(done[0]) if len(done) else mine




def _task_kinds(g: dict[str, pa.Table]) -> np.ndarray:
    """Each task's kind code (KIND_CODE), decoded once per graph tables."""
    return per_table("kinds", g["task"], lambda t: _codes(t["kind"], KIND_CODE, "task kind"))


def _labels(g: dict[str, pa.Table]) -> np.ndarray:
    """Each task's iteration, -1 for none."""
    def decode(task: pa.Table) -> np.ndarray:
        it = task["iteration"]
        out = numpy_filled(it, -1).astype(np.int64)
        out.setflags(write=False)  # shared by every replay of these tables
        return out
    return per_table("labels", g["task"], decode)


def _without_inferred(g: dict[str, pa.Table]) -> dict[str, pa.Table]:
    edge = g["edge"]
    if "inferred" not in edge.column_names:
        return g
    # one table per edge table (to_simgraph and replay both ask), so what is memoized per
    # table is found again
    return {**g, "edge": per_table("without_inferred", edge,
                                   lambda e: e.filter(pc.invert(e["inferred"])))}


def _gpu_and_backlog(g: dict[str, pa.Table]) -> tuple[np.ndarray, np.ndarray]:
    """Per task: a GPU task; one of the backlog of work launched before the window: a GPU task
    without a launch that belongs to no iteration and began before the window's last
    iteration ended (an orphan that follows a launched task on its stream carries that task's
    iteration, graphstore.load, and is that iteration's work). Computed once per graph
    tables (``base.memo.per_tables``)."""
    def compute(task: pa.Table, edge: pa.Table, its: pa.Table):
        is_gpu, orphan = _gpu_and_orphans(g)
        if its.num_rows:
            last = int(pc.max(its["end_ns"]).as_py())
            orphan = orphan & (_labels(g) < 0) & (task["start_ns"].to_numpy() < last)
        for a in (is_gpu, orphan):  # shared by every replay of these tables
            a.setflags(write=False)
        return is_gpu, orphan
    return per_tables("gpu_and_backlog", (g["task"], g["edge"], g["iteration"]), compute)


def _gpu_and_orphans(g: dict[str, pa.Table]) -> tuple[np.ndarray, np.ndarray]:
    """Per task: a GPU task; a GPU task without a launch in the trace (launched before the
    window, or by an untraced thread)."""
    is_gpu = _task_kinds(g) >= len(CPU_KINDS)

    def launched_of(edge: pa.Table) -> np.ndarray:
        return pc.filter(edge["dst"], pc.equal(edge["kind"].cast(pa.string()), "launch")
                         ).to_numpy()
    launched = np.zeros(len(is_gpu), bool)
    launched[per_table("launched", g["edge"], launched_of)] = True
    return is_gpu, is_gpu & ~launched
