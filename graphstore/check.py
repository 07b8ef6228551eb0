"""Checks run on every graph when it is built: acyclic (reported as a path of task names),
and every GPU task whose launching call is in the trace has its launch edge."""

from __future__ import annotations

import numpy as np

from daydream.base.compiled import helper, kernel
from daydream.base.errors import DaydreamError


@helper(nogil=True, inline="always")
def _edge_nodes(s, d, a):
    """The event nodes an edge joins (2i = start of task i, 2i+1 = its end), by its anchor
    (schema.EDGE_ANCHORS: 0 end_start, 1 start_start, 2 end_end)."""
    return 2 * s + (0 if a == 1 else 1), 2 * d + (1 if a == 2 else 0)


@helper(nogil=True, inline="always")
def _node_time(start, dur, v):
    """The time of event node ``v``: its task's start, or its end."""
    return start[v // 2] + (dur[v // 2] if v % 2 else 0)


@kernel("UniTuple(int64[::1], 2)", "int64", "int64[::1]", "int64[::1]", "int64[::1]", nogil=True)
def _node_edges(n, src, dst, anchor):
    """Edges between event nodes: 2i = start of task i, 2i+1 = its end."""
    m = src.shape[0]
    es = np.empty(m + n, np.int64)
    ed = np.empty(m + n, np.int64)
    for i in range(n):
        es[i] = 2 * i
        ed[i] = 2 * i + 1
    for j in range(m):
        es[n + j], ed[n + j] = _edge_nodes(src[j], dst[j], anchor[j])
    return es, ed


@kernel("Tuple((int64[::1], int64[::1], int64[::1], int64))", "int64", "int64[::1]", "int64[::1]",
        nogil=True)
def _kahn(nn, es, ed):
    """Return (order of processed nodes, count). count < nn means a cycle."""
    m = es.shape[0]
    off = np.zeros(nn + 1, np.int64)
    for k in range(m):
        off[es[k] + 1] += 1
    for i in range(nn):
        off[i + 1] += off[i]
    adj = np.empty(m, np.int64)
    fill = off[:-1].copy()
    indeg = np.zeros(nn, np.int64)
    for k in range(m):
        adj[fill[es[k]]] = ed[k]
        fill[es[k]] += 1
        indeg[ed[k]] += 1
    q = np.empty(nn, np.int64)
    h = 0
    t = 0
    for i in range(nn):
        if indeg[i] == 0:
            q[t] = i
            t += 1
    while h < t:
        x = q[h]
        h += 1
        for k in range(off[x], off[x + 1]):
            y = adj[k]
            indeg[y] -= 1
            if indeg[y] == 0:
                q[t] = y
                t += 1
    return indeg, off, adj, t


@kernel("int64[::1]", "int64", "int64[::1]", "int64[::1]", "int64[::1]", nogil=True)
def _find_cycle(nn, indeg, es, ed):
    """Nodes left with in-degree > 0 each have a stuck predecessor: walk predecessors until a
    node repeats; the repeated stretch, reversed, is a cycle."""
    m = es.shape[0]
    roff = np.zeros(nn + 1, np.int64)
    for k in range(m):
        roff[ed[k] + 1] += 1
    for i in range(nn):
        roff[i + 1] += roff[i]
    radj = np.empty(m, np.int64)
    fill = roff[:-1].copy()
    for k in range(m):
        radj[fill[ed[k]]] = es[k]
        fill[ed[k]] += 1
    x = -1
    for i in range(nn):
        if indeg[i] > 0:
            x = i
            break
    seen = np.full(nn, -1, np.int64)
    path = np.empty(nn + 1, np.int64)
    k = 0
    while seen[x] < 0:
        seen[x] = k
        path[k] = x
        k += 1
        nxt = -1
        for kk in range(roff[x], roff[x + 1]):
            if indeg[radj[kk]] > 0:
                nxt = radj[kk]
                break
        x = nxt
    return path[seen[x]:k][::-1].copy()


@kernel("boolean", "int64[::1]", "int64[::1]", "int64[::1]", "int64[::1]", "int64[::1]",
        nogil=True)
def _acyclic_outside_backward_spans(start, dur, src, dst, anchor):
    """Whether the graph is acyclic, sorting only the event nodes (2i the start of task i,
    2i+1 its end) that lie in a backward edge's time span: those of an edge, or of a task's
    start -> end, that does not lead from an earlier node to a later one in (time, node)
    order. A cycle must come back down that order, and each value it comes down past lies in
    the span of one of its backward edges; so all its nodes lie in one stretch of the merged
    spans, and the edges within each stretch hold every cycle. Built graphs have a few
    hundred backward edges (kernels that start before their launching call returns), each
    spanning microseconds: a few thousand nodes to sort out of millions."""
    n = start.shape[0]
    m = src.shape[0]
    lo = np.empty(n + m, np.int64)  # (only the pages written are ever touched)
    hi = np.empty(n + m, np.int64)
    k = 0
    for i in range(n):
        if dur[i] < 0:  # its end comes before its start
            lo[k] = start[i] + dur[i]
            hi[k] = start[i]
            k += 1
    for j in range(m):
        ns, nd = _edge_nodes(src[j], dst[j], anchor[j])
        ts, td = _node_time(start, dur, ns), _node_time(start, dur, nd)
        if ts > td or (ts == td and ns >= nd):
            lo[k] = td
            hi[k] = ts
            k += 1
    if k == 0:  # (time, node) order is a topological order
        return True
    # the spans merged into disjoint closed stretches, in time order
    order = np.argsort(lo[:k])
    mlo = np.empty(k, np.int64)
    mhi = np.empty(k, np.int64)
    r = 0
    for q in range(k):
        x = order[q]
        if r > 0 and lo[x] <= mhi[r - 1]:
            mhi[r - 1] = max(mhi[r - 1], hi[x])
        else:
            mlo[r] = lo[x]
            mhi[r] = hi[x]
            r += 1
    mlo = mlo[:r]
    mhi = mhi[:r]
    # each node's stretch (-1: none) and its number among the nodes in stretches
    stretch = np.empty(2 * n, np.int32)
    sub = np.empty(2 * n, np.int32)
    nsub = 0
    for v in range(2 * n):
        t = _node_time(start, dur, v)
        p = np.searchsorted(mlo, t, side="right") - 1
        if p >= 0 and t <= mhi[p]:
            stretch[v] = p
            sub[v] = nsub
            nsub += 1
        else:
            stretch[v] = -1
    es = np.empty(n + m, np.int64)
    ed = np.empty(n + m, np.int64)
    e = 0
    for i in range(n):
        u, w = 2 * i, 2 * i + 1
        if stretch[u] >= 0 and stretch[u] == stretch[w]:
            es[e] = sub[u]
            ed[e] = sub[w]
            e += 1
    for j in range(m):
        u, w = _edge_nodes(src[j], dst[j], anchor[j])
        if stretch[u] >= 0 and stretch[u] == stretch[w]:
            es[e] = sub[u]
            ed[e] = sub[w]
            e += 1
    return _kahn(nsub, es[:e], ed[:e])[3] == nsub


def check_acyclic(n: int, src: np.ndarray, dst: np.ndarray, anchor: np.ndarray,
                  names: list | None = None, start_ns: np.ndarray | None = None,
                  dur_ns: np.ndarray | None = None) -> None:
    """Raise DaydreamError naming the tasks of a cycle, if the graph has one. ``start_ns``,
    ``dur_ns``: the tasks' observed times, when known: then only the few tasks within the
    time spans of edges that go back in time are sorted (the full topological sort runs only
    where they hold a cycle, to name it)."""
    if start_ns is not None and dur_ns is not None and _acyclic_outside_backward_spans(
            *(np.asarray(x, np.int64) for x in (start_ns, dur_ns, src, dst, anchor))):
        return
    es, ed = _node_edges(n, src.astype(np.int64), dst.astype(np.int64), anchor.astype(np.int64))
    indeg, off, adj, done = _kahn(2 * n, es, ed)
    if done == 2 * n:
        return
    cyc = _find_cycle(2 * n, indeg, es, ed)
    tasks = []
    for node in cyc:
        t = int(node) // 2
        if not tasks or tasks[-1] != t:
            tasks.append(t)
    label = [f"{t}:{names[t]}" if names is not None else str(t) for t in tasks]
    raise DaydreamError("dependency graph has a cycle: " + " -> ".join(label + label[:1]))


def check_launch_edges(gpu_tasks_with_call: np.ndarray, launch_dst: np.ndarray) -> None:
    """Every GPU task whose launching call is in the trace has a launch edge."""
    size = int(max(gpu_tasks_with_call.max(initial=-1), launch_dst.max(initial=-1))) + 1
    has_edge = np.zeros(size, bool)
    has_edge[launch_dst] = True
    missing = gpu_tasks_with_call[~has_edge[gpu_tasks_with_call]]
    if len(missing):
        raise DaydreamError(f"graph check: {len(missing)} GPU tasks with a launching call have no "
                            f"launch edge (first: task {int(missing[0])})")
