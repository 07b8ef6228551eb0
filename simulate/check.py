"""Checks of the simulator's input (a ``simulate.graph.SimGraph``, or the arrays it is built
from; this module sits below it, so it reads a graph's fields without importing its class).

The input checks: shapes in Python, values in one compiled pass over the tasks and one over the
edges (no temporaries); only when a pass finds a problem do the numpy checks below run to
locate and name the first offending index.
"""

from __future__ import annotations

import numpy as np

from daydream.base.errors import DaydreamError
from daydream.simulate import _core
from daydream.simulate._core import MIN_LAG_NS
from daydream.simulate.codes import FIXED, PRIORITY, START, START_START


def _first(mask: np.ndarray) -> int:
    return int(np.argmax(mask))


def _check_1d(name: str, a: np.ndarray, length: int | None, what: str) -> None:
    if a.ndim != 1:
        raise DaydreamError(f"{name} must be 1-dimensional, got shape {a.shape}")
    if length is not None and a.shape[0] != length:
        raise DaydreamError(f"{name} has {a.shape[0]} entries, expected {length} (one per {what})")


def check_tasks(dur_ns, unit, unit_policy, order_key, priority) -> None:
    """Per-task and per-unit arrays: shapes, durations >= 0, unit ids and policies known."""
    _check_1d("dur_ns", dur_ns, None, "task")
    n = dur_ns.shape[0]
    _check_1d("unit", unit, n, "task")
    _check_1d("order_key", order_key, n, "task")
    _check_1d("priority", priority, n, "task")
    _check_1d("unit_policy", unit_policy, None, "unit")
    if _core.tasks_ok(dur_ns, unit, unit_policy):  # one compiled pass; below names a problem
        return
    n_units = unit_policy.shape[0]
    if n and dur_ns.min() < 0:
        i = _first(dur_ns < 0)
        raise DaydreamError(f"task {i} has negative dur_ns {int(dur_ns[i])}; "
                            "durations must be >= 0")
    # Viewed unsigned, a negative id is huge: one max() checks both bounds.
    if n and unit.view(np.uint32).max() >= n_units:
        i = _first((unit < 0) | (unit >= n_units))
        raise DaydreamError(f"task {i} runs on unknown unit {int(unit[i])}; "
                            f"unit ids must be in 0..{n_units - 1} (len(unit_policy) = {n_units})")
    if n_units and unit_policy.view(np.uint8).max() > PRIORITY:
        u = _first((unit_policy < FIXED) | (unit_policy > PRIORITY))
        raise DaydreamError(f"unit {u} has unknown policy {int(unit_policy[u])}; "
                            "known: 0 = FIXED, 1 = FCFS, 2 = PRIORITY")
    raise DaydreamError("task values failed their checks")  # the two passes disagree: a bug


def _edge_shapes(dst, lag_ns, edge_kind, src=None) -> None:
    m = dst.shape[0]
    _check_1d("dst", dst, None, "edge")
    _check_1d("lag_ns", lag_ns, m, "edge")
    _check_1d("edge_kind", edge_kind, m, "edge")
    if src is not None:
        _check_1d("src", src, m, "edge")


def _edge_values(n: int, dst, lag_ns, edge_kind, src=None, where: str = "edge") -> None:
    """Name the first bad edge value (run where a compiled pass found one)."""
    if not dst.shape[0]:
        return
    if src is not None and src.view(np.uint64).max() >= n:
        e = _first((src < 0) | (src >= n))
        raise DaydreamError(f"{where} {e} has source task {int(src[e])} out of range 0..{n - 1}")
    if dst.view(np.uint64).max() >= n:
        e = _first((dst < 0) | (dst >= n))
        raise DaydreamError(f"{where} {e} has destination task {int(dst[e])} "
                            f"out of range 0..{n - 1}")
    if lag_ns.min() < MIN_LAG_NS:
        e = _first(lag_ns < MIN_LAG_NS)
        raise DaydreamError(f"{where} {e} has lag_ns {int(lag_ns[e])}; lags must be >= "
                            f"{MIN_LAG_NS} (a negative lag lets dst begin before src's anchor)")
    if edge_kind.view(np.uint8).max() > START_START:
        e = _first((edge_kind < START) | (edge_kind > START_START))
        raise DaydreamError(f"{where} {e} has unknown edge_kind {int(edge_kind[e])}; "
                            "known: 0 = START, 1 = END, 2 = START_START")


def check_edge_list(n: int, src, dst, lag_ns, edge_kind) -> bool:
    """An edge list as given to ``SimGraph.from_edges``; indices refer to that list. Returns
    whether the sources are already in order (so that no sort is needed)."""
    _edge_shapes(dst, lag_ns, edge_kind, src)
    ok, in_order = _core.edge_list_ok(n, src, dst, lag_ns, edge_kind)
    if not ok:
        _edge_values(n, dst, lag_ns, edge_kind, src=src, where="edge")
        raise DaydreamError("edge list failed its checks")  # the two passes disagree: a bug
    return bool(in_order)


def check_shapes(g) -> None:
    """``check_graph`` but for the edge values, which ``simulate`` checks in the pass that
    counts them (``_core.count_in``), naming a problem through ``check_graph``."""
    check_tasks(g.dur_ns, g.unit, g.unit_policy, g.order_key, g.priority)
    _check_1d("indptr", g.indptr, g.n_tasks + 1, "task, plus one")
    _edge_shapes(g.dst, g.lag_ns, g.edge_kind)


def check_graph(g) -> None:
    """Everything ``simulate`` relies on; raises ``DaydreamError`` naming the first problem."""
    check_shapes(g)
    n = g.n_tasks
    if _core.csr_ok(g.indptr, g.dst, g.lag_ns, g.edge_kind):  # one compiled pass
        return
    m = g.dst.shape[0]
    if g.indptr[0] != 0 or g.indptr[n] != m:
        raise DaydreamError(f"indptr must run from 0 to the edge count {m}, "
                            f"got {int(g.indptr[0])}..{int(g.indptr[n])}")
    if n and bool(np.any(g.indptr[1:] < g.indptr[:-1])):
        i = _first(g.indptr[1:] < g.indptr[:-1])
        raise DaydreamError(f"indptr decreases at task {i}: indptr[{i}] = {int(g.indptr[i])} > "
                            f"indptr[{i + 1}] = {int(g.indptr[i + 1])}")
    _edge_values(n, g.dst, g.lag_ns, g.edge_kind, where="edge (CSR position)")
    raise DaydreamError("graph failed its checks")  # the two passes disagree: a bug
