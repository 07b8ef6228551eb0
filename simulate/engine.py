"""``simulate(graph) -> Schedule``: the simulator's entry point, and the cycle finder that
explains a graph that cannot be scheduled (``SimulationDeadlock``)."""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np

from daydream.base.errors import DaydreamError
from daydream.simulate import _core
from daydream.simulate.check import check_graph, check_shapes
from daydream.simulate.codes import END, FIXED, HELD, START, START_START
from daydream.simulate.graph import SimGraph


class SimulationDeadlock(DaydreamError):
    """Some tasks can never run: a dependency cycle, possibly through unit order.

    ``cycle`` is an int64 array of task indices ``[t0, t1, ..., tk]`` with ``tk == t0`` where each
    task must finish (or, for a unit link, free its unit) before the next can proceed;
    ``links`` names each step: "start" (START edge), "end" (END edge), "start_start"
    (START_START edge: the later task waits for the earlier one to start) or "unit" (the
    earlier task holds or precedes the later one on its unit).
    """

    def __init__(self, message: str, *, cycle: np.ndarray, links: list[str], stuck: int):
        self.cycle = cycle
        self.links = links
        self.stuck = stuck
        super().__init__(message)


# Task indices are int32 inside the core (less memory traffic); the outputs are int64.
_MAX_TASKS = 2**31 - 1


@dataclass(frozen=True, eq=False)
class Schedule:
    """The predicted schedule: times in ns from the start of the simulation (time 0).

    - ``start_ns``/``end_ns`` int64[n]: when each task starts and ends. A task holds its unit
      from start to end (for a blocking call, that includes the wait for its END predecessors).
    - ``bound_by`` int64[n]: the predecessor that decided the task's start: a START edge's
      source or the previous task on the unit (through its end), or a START_START edge's source
      (through its start, ``bound_via_start``); -1 when the task has none of these (it starts
      at 0). Ties go to the smallest task index.
    - ``bound_via_start`` int8[n]: 1 where ``bound_by`` bound through its start (START_START).
    - ``end_bound_by`` int64[n]: the END predecessor that pushed the task's end past
      start + dur (a blocking call waiting for GPU work), else -1.
    - ``unit`` int32[n]: the graph's unit of each task (shared, not copied).
    """

    start_ns: np.ndarray
    end_ns: np.ndarray
    bound_by: np.ndarray
    bound_via_start: np.ndarray
    end_bound_by: np.ndarray
    unit: np.ndarray

    @property
    def n_tasks(self) -> int:
        return int(self.start_ns.shape[0])

    @property
    def makespan_ns(self) -> int:
        """Time from 0 (when the first tasks start) to the last end; 0 for an empty graph."""
        return int(self.end_ns.max()) if self.end_ns.size else 0

    def unit_busy_ns(self, n_units: int) -> np.ndarray:
        """int64[n_units]: total time each unit is held by its tasks (end - start, summed;
        summed in float64, so exact up to 2**53 ns, about 104 days, per unit)."""
        held = self.end_ns - self.start_ns
        busy = np.bincount(self.unit, weights=held, minlength=n_units)
        if busy.shape[0] > n_units:
            raise DaydreamError(f"unit_busy_ns({n_units}): tasks run on unit "
                                f"{busy.shape[0] - 1}; pass the graph's n_units")
        return busy.round().astype(np.int64)

    def critical_path(self) -> np.ndarray:
        """int64 task indices, in time order, from a task that nothing held back to the
        last-ending task (the lowest index among ties). Walking back from that task's end: an
        end is decided by ``end_bound_by`` when set, else by the task's start; a start by
        ``bound_by``, through its end, or through its start when ``bound_via_start``. A task
        can appear twice, when the path enters it at its start and leaves at its end (a
        blocking copy call that launched the copy it waits for)."""
        return _core.critical_path(self.end_ns, self.bound_by, self.bound_via_start,
                                   self.end_bound_by)


# Arrays at least this large are mapped with a request for transparent huge pages.
_HUGE_MIN_BYTES = 4 << 20


def _zeros(n: int, dtype) -> np.ndarray:
    """``np.zeros(n, dtype)``, on huge pages where the kernel grants them (THP in "madvise"
    mode). The simulator first touches each of its ~45 bytes of per-task state inside the
    core; with 4 KiB pages a 10M-task graph takes over 100,000 page faults there, about a
    quarter of the simulation's time (bench/bench_simulate.py); 2 MiB pages take 500 times
    fewer. Anonymous mappings are zero-filled, so no initialization pass either."""
    dt = np.dtype(dtype)
    nbytes = n * dt.itemsize
    if nbytes < _HUGE_MIN_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.zeros(n, dt)
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        m.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        pass  # THP unavailable: ordinary pages, still zeroed
    return np.frombuffer(m, dt, count=n)


def _fixed_next(g: SimGraph) -> np.ndarray:
    """int64[n]: the next task on the same FIXED unit, or -1 (off the hot path)."""
    nxt = np.zeros(g.n_tasks, np.int32)
    _core.relink(g.unit, g.unit_policy, np.argsort(g.order_key, kind="stable"), nxt,
                 np.zeros(g.n_tasks, np.int32))
    return nxt.astype(np.int64) - 1


def _run_core(g: SimGraph):
    """Run the compiled core on a checked graph: (state, output arrays, n_done)."""
    n = g.n_tasks
    if n >= _MAX_TASKS:
        raise DaydreamError(f"{n} tasks is more than the simulator supports ({_MAX_TASKS - 1})")
    # Everything starts zeroed (see _core.run): fresh pages, no initialization pass.
    start_cnt = _zeros(n, np.int32)
    end_cnt = _zeros(n, np.int32)
    nxt = _zeros(n, np.int32)
    start = _zeros(n, np.int64)
    end = _zeros(n, np.int64)
    bound = _zeros(n, np.int64)
    via = _zeros(n, np.int8)
    end_bound = _zeros(n, np.int64)
    if not _core.prepare(g.unit, g.unit_policy, g.order_key, nxt, start_cnt):
        # order_key is not sorted within some FIXED unit: link by (order_key, index).
        _core.relink(g.unit, g.unit_policy, np.argsort(g.order_key, kind="stable"), nxt,
                     start_cnt)
    kind, n_held = _held(g)
    ok, has_ss = _core.count_in(g.indptr, g.dst, g.lag_ns, kind, start_cnt, end_cnt)
    if not ok:
        check_graph(g)  # names the problem
        raise DaydreamError("graph failed its edge checks")  # the two passes disagree: a bug
    loff = _core.bitmap_offsets(n)
    bits = _zeros(int(loff[-1]), np.int64)
    done = _core.run(g.dur_ns, g.unit, g.unit_policy, g.priority, has_ss, g.indptr, g.dst,
                     g.lag_ns, kind, nxt, start_cnt, end_cnt, start, end, bound, via,
                     end_bound, bits, loff, n_held)
    return start_cnt, (start, end, bound, via, end_bound), done


def simulate(graph: SimGraph, *, check: bool = True) -> Schedule:
    """Simulate ``graph`` (Daydream's Algorithm 1) and return every task's start and end.

    A task starts at the latest of: its unit becoming free for it, every START predecessor's
    end + lag and every START_START predecessor's start + lag. It ends at the latest of
    start + dur and every END predecessor's end + lag. A START edge marked
    ``held_if_running`` counts only where its source had begun by the time the others let the
    task start (into a FIXED unit's task; elsewhere it is a START edge). A
    FIXED unit runs its tasks in (order_key, index) order, waiting for the next one even when
    others are ready; FCFS and PRIORITY units pick among ready tasks when they free.

    Raises ``DaydreamError`` on malformed input and ``SimulationDeadlock`` (a ``DaydreamError``)
    with a cycle of task indices when some tasks can never run. ``check=False`` skips the
    shape and task checks, for a graph that ``SimGraph.from_edges`` or ``replay.to_simgraph``
    just built (they checked everything the core relies on, and a second pass costs as much
    as the replay's reports); edge values are checked either way, in the pass that counts
    them.
    """
    if check:
        check_shapes(graph)  # the edge values are checked as _run_core counts them
    state, (start, end, bound, via, end_bound), done = _run_core(graph)
    if done != graph.n_tasks:
        raise deadlock_error(graph, state)
    return Schedule(start_ns=start, end_ns=end, bound_by=bound, bound_via_start=via,
                    end_bound_by=end_bound, unit=graph.unit)


def _held(g: SimGraph) -> tuple[np.ndarray, int]:
    """The edge kinds the core runs on (``HELD`` where ``held_if_running``) and how many are
    HELD."""
    h = g.held_if_running
    if h is None:
        return g.edge_kind, 0
    kind = g.edge_kind.copy()
    kind[h] = HELD
    return kind, int(np.count_nonzero(h))


# --- cycles --------------------------------------------------------------------------------


def find_cycle(g: SimGraph, state: np.ndarray | None = None
               ) -> tuple[np.ndarray, list[str]] | None:
    """One cycle of tasks that can never run, or None when the whole graph can be scheduled.

    ``state`` (int32[n]: >= 0 not started, -3 queued on its FCFS/PRIORITY unit, -1 started and
    waiting on END predecessors, -2 finished) is where a simulation got stuck; without it the
    simulator is run to find out (after ``check_graph``).
    Returns ``(cycle, links)`` as described on ``SimulationDeadlock``.

    Every stuck task waits on at least one other stuck task: a START predecessor or the task
    before it on a FIXED unit (not started), the task holding its FCFS/PRIORITY unit (queued), or
    an END predecessor (started). Following one such wait from any stuck task must revisit a
    task, and the revisited stretch is the cycle.
    """
    if state is None:
        check_graph(g)
        state = _run_core(g)[0]
    stuck = np.flatnonzero(state != -2)
    if stuck.size == 0:
        return None
    n = g.n_tasks
    # Reverse adjacency (in-edges), built only on this error path.
    src = g.edge_src()
    order = np.argsort(g.dst, kind="stable")
    in_src = src[order]
    in_kind = g.edge_kind[order]
    in_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(g.dst, minlength=n), out=in_ptr[1:])
    prev_fixed = np.full(n, -1, dtype=np.int64)
    nxt = _fixed_next(g)
    has_next = np.flatnonzero(nxt >= 0)
    prev_fixed[nxt[has_next]] = has_next
    # Which started-unfinished task holds each non-FIXED unit.
    holder = np.full(g.n_units, -1, dtype=np.int64)
    started = np.flatnonzero(state == -1)
    holder[g.unit[started]] = started

    def blocker(t: int) -> tuple[int, str]:
        lo, hi = in_ptr[t], in_ptr[t + 1]
        if state[t] == -1:
            for k in range(lo, hi):
                if in_kind[k] == END and state[in_src[k]] != -2:
                    return int(in_src[k]), "end"
        else:
            p = prev_fixed[t]
            if p >= 0 and state[p] != -2:
                return int(p), "unit"
            for k in range(lo, hi):
                if in_kind[k] == START and state[in_src[k]] != -2:
                    return int(in_src[k]), "start"
                # a START_START predecessor holds t until it starts (state -1 or -2)
                if in_kind[k] == START_START and state[in_src[k]] not in (-1, -2):
                    return int(in_src[k]), "start_start"
            h = holder[g.unit[t]]
            if g.unit_policy[g.unit[t]] != FIXED and h >= 0:
                return int(h), "unit"
        raise AssertionError(f"task {t} is stuck but waits on nothing")  # pragma: no cover

    seen = {}
    walk: list[int] = []
    kinds: list[str] = []
    t = int(stuck[0])
    while t not in seen:
        seen[t] = len(walk)
        walk.append(t)
        t, kind = blocker(t)
        kinds.append(kind)
    # walk[i] waits on walk[i+1] via kinds[i]; the cycle is walk[seen[t]:] back to t.
    loop = walk[seen[t]:] + [t]
    loop_kinds = kinds[seen[t]:]
    # Report in dependency direction: each task precedes the next.
    return np.array(loop[::-1], dtype=np.int64), loop_kinds[::-1]


def deadlock_error(g: SimGraph, state: np.ndarray) -> SimulationDeadlock:
    found = find_cycle(g, state)
    assert found is not None
    cycle, links = found
    n_stuck = int(np.count_nonzero(state != -2))
    path = str(int(cycle[0])) + "".join(
        f" -{kind}-> {int(t)}" for kind, t in zip(links, cycle[1:], strict=True))
    return SimulationDeadlock(
        f"deadlock: {n_stuck} of {g.n_tasks} tasks can never run; cycle of task indices: {path} "
        "(start/end/start_start: a START/END/START_START edge; unit: the earlier task holds or "
        "precedes the later on its unit)", cycle=cycle, links=links, stuck=n_stuck)
