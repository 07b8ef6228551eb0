"""Graphs big enough to exercise every level of the core's bitmap and its sweep, checked
against the longest path; and the benchmark's trace-shaped generator."""

from __future__ import annotations

import importlib.util
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from daydream.simulate import FCFS, FIXED, PRIORITY, SimGraph, simulate

ROOT = Path(__file__).resolve().parents[2]


def longest_path_ends(dur, unit, src, dst, lag, kind, order_key):
    """Ends under FIXED units: a DP over a topological order (Kahn's algorithm) of the edges
    (START from the source's end, START_START from its start, END holding back the task's own
    work) plus each unit's (order_key, index) chain; a start never before 0."""
    n = dur.shape[0]
    order = np.lexsort((np.arange(n), order_key, unit))
    same = unit[order][1:] == unit[order][:-1]
    chain_src, chain_dst = order[:-1][same], order[1:][same]
    preds = [[] for _ in range(n)]     # (pred, lag, kind)
    for s_, d_, lag_, k_ in zip(src.tolist(), dst.tolist(), lag.tolist(), kind.tolist(),
                                strict=True):
        preds[d_].append((s_, lag_, k_))
    for s_, d_ in zip(chain_src.tolist(), chain_dst.tolist(), strict=True):
        preds[d_].append((s_, 0, 0))
    succs = [[] for _ in range(n)]
    missing = [len(p) for p in preds]
    for d_, p in enumerate(preds):
        for s_, _, _ in p:
            succs[s_].append(d_)
    ready = deque(t for t in range(n) if missing[t] == 0)
    start = np.zeros(n, np.int64)
    end = np.zeros(n, np.int64)
    seen = 0
    while ready:
        t = ready.popleft()
        seen += 1
        start[t] = max([0] + [int(end[p]) + lag_ for p, lag_, k in preds[t] if k == 0]
                       + [int(start[p]) + lag_ for p, lag_, k in preds[t] if k == 2])
        end[t] = max([int(start[t])]
                     + [int(end[p]) + lag_ for p, lag_, k in preds[t] if k == 1]) + int(dur[t])
        for d_ in succs[t]:
            missing[d_] -= 1
            if missing[d_] == 0:
                ready.append(d_)
    assert seen == n, "not a DAG"
    return end


@pytest.mark.parametrize("n", [100, 5_000, 300_000])
def test_renumbered_random_dag_matches_longest_path(n):
    # Tasks in a random numbering: about half the edges point backwards in index order.
    rng = np.random.default_rng(n)
    topo = rng.permutation(n)                     # topo[i] = position of task i
    m = 2 * n
    a = rng.integers(0, n, m)
    b = np.minimum(n - 1, a + rng.integers(1, 50, m))
    keep = a != b
    pa, pb = a[keep], b[keep]                     # positions, pa < pb
    inv = np.argsort(topo)                        # position -> task
    src, dst = inv[pa], inv[pb]
    lag = rng.integers(0, 100, src.shape[0])
    kind = rng.choice(np.array([0, 1, 2], np.int8), src.shape[0], p=[0.7, 0.1, 0.2])
    dur = rng.integers(0, 1000, n)
    unit = rng.integers(0, 16, n).astype(np.int32)
    g = SimGraph.from_edges(dur, unit, [FIXED] * 16, src, dst, lag, kind, order_key=topo)
    s = simulate(g)
    if n <= 5_000:
        assert (s.end_ns == longest_path_ends(dur, unit, src, dst, lag, kind, topo)).all()
    # Every constraint holds in the result.
    sk, dk = src[kind == 0], dst[kind == 0]
    assert (s.start_ns[dk] >= s.end_ns[sk] + lag[kind == 0]).all()
    sk, dk = src[kind == 2], dst[kind == 2]
    assert (s.start_ns[dk] >= s.start_ns[sk] + lag[kind == 2]).all()
    se, de = src[kind == 1], dst[kind == 1]
    assert (s.end_ns[de] >= s.end_ns[se] + lag[kind == 1]).all()
    assert (s.end_ns >= s.start_ns + dur).all()
    # Units run one task at a time, in order_key order.
    order = np.lexsort((topo, unit))
    same = unit[order][1:] == unit[order][:-1]
    assert (s.start_ns[order][1:][same] >= s.end_ns[order][:-1][same]).all()
    cp = s.critical_path()
    assert s.end_ns[cp[-1]] == s.makespan_ns and s.bound_by[cp[0]] == -1


def test_many_dispatches_on_shared_channels():
    # A long chain of FIXED work feeding FCFS and PRIORITY channels, as transforms add them:
    # each channel runs one task at a time, and the result matches a second run.
    rng = np.random.default_rng(7)
    n = 20_000
    unit = rng.integers(0, 6, n).astype(np.int32)
    policy = [FIXED, FIXED, FIXED, FIXED, FCFS, PRIORITY]
    src = np.arange(n - 1)
    dst = np.minimum(n - 1, src + rng.integers(1, 20, n - 1))
    g = SimGraph.from_edges(rng.integers(1, 100, n), unit, policy, src, dst,
                            rng.integers(0, 10, n - 1), 0, priority=rng.integers(0, 5, n))
    s = simulate(g)
    for u in (4, 5):
        on = np.flatnonzero(unit == u)
        order = on[np.argsort(s.start_ns[on], kind="stable")]
        assert (s.start_ns[order][1:] >= s.end_ns[order][:-1]).all()
    assert (s.start_ns[dst] >= s.end_ns[src] + g.lag_ns).all()
    s2 = simulate(g)
    assert (s2.start_ns == s.start_ns).all() and (s2.bound_by == s.bound_by).all()


def test_benchmark_generator_makes_a_valid_trace_shaped_graph():
    spec = importlib.util.spec_from_file_location("bench_simulate",
                                                  ROOT / "bench" / "bench_simulate.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    g = bench.generate(20_000, seed=3)
    assert 19_000 <= g.n_tasks <= 21_000
    assert 1.8 <= g.n_edges / g.n_tasks <= 2.2
    assert (g.edge_kind == 1).any()
    s = simulate(g)
    src = g.edge_src()
    expected = longest_path_ends(g.dur_ns, g.unit, src, g.dst, g.lag_ns, g.edge_kind,
                                 g.order_key)
    assert (s.end_ns == expected).all()


def test_warmup_compiles_and_runs():
    from daydream.simulate.warmup import warm

    assert warm() >= 0
