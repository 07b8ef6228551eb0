"""Properties of the simulator over random small graphs (hypothesis), and agreement with the
slow literal simulator in ``reference.py``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daydream.simulate import FCFS, FIXED, PRIORITY, SimGraph, SimulationDeadlock, simulate
from tests.simulate.reference import Stuck, reference_simulate

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def graphs(draw, policies=(FIXED,), min_dur=0, max_lag=5, end_edges=True):
    """A random graph whose edges and FIXED unit orders all follow one topological order
    (``rank``), so it is acyclic; FCFS/PRIORITY units with END edges can still deadlock.
    Edge kinds: mostly START, some END and START_START."""
    n = draw(st.integers(1, 24))
    n_units = draw(st.integers(1, 4))
    unit_policy = draw(st.lists(st.sampled_from(policies), min_size=n_units, max_size=n_units))
    unit = draw(st.lists(st.integers(0, n_units - 1), min_size=n, max_size=n))
    dur = draw(st.lists(st.integers(min_dur, 10), min_size=n, max_size=n))
    rank = np.array(draw(st.permutations(range(n))), np.int64)
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)),
                          max_size=3 * n))
    pairs = [(a, b) if rank[a] < rank[b] else (b, a) for a, b in pairs if a != b]
    lag = draw(st.lists(st.integers(0, max_lag), min_size=len(pairs), max_size=len(pairs)))
    kinds = st.sampled_from([0, 0, 0, 1, 2]) if end_edges else st.just(0)
    kind = draw(st.lists(kinds, min_size=len(pairs), max_size=len(pairs)))
    priority = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    return SimGraph.from_edges(
        dur_ns=dur, unit=unit, unit_policy=unit_policy,
        src=np.array([a for a, _ in pairs], np.int64), dst=np.array([b for _, b in pairs],
                                                                     np.int64),
        lag_ns=np.array(lag, np.int64), edge_kind=np.array(kind, np.int8),
        order_key=rank, priority=priority)


def with_(g: SimGraph, **changes) -> SimGraph:
    fields = {f: getattr(g, f) for f in ("dur_ns", "unit", "unit_policy", "order_key",
                                         "priority", "indptr", "dst", "lag_ns", "edge_kind")}
    fields.update(changes)
    return SimGraph(**fields)


def edges(g: SimGraph):
    src = g.edge_src()
    return [(int(s), int(d), int(lag), int(k))
            for s, d, lag, k in zip(src, g.dst, g.lag_ns, g.edge_kind, strict=True)]


def unit_prev(g: SimGraph) -> dict[int, int]:
    """Previous task on the same FIXED unit, by (order_key, index)."""
    prev, last = {}, {}
    for t in sorted(range(g.n_tasks), key=lambda t: (int(g.order_key[t]), t)):
        u = int(g.unit[t])
        if g.unit_policy[u] == FIXED and u in last:
            prev[t] = last[u]
        last[u] = t
    return prev


def longest_path(g: SimGraph, with_units: bool) -> int:
    """Latest end over a DP in topological order (order_key is one): START edges (from the
    source's end), START_START edges (from its start) and, when ``with_units``, FIXED unit order
    delay the start; END edges delay the task's own work (it runs after them)."""
    prev = unit_prev(g) if with_units else {}
    into = {}
    for s, d, lag, k in edges(g):
        into.setdefault(d, []).append((s, lag, k))
    start, end = {}, {}
    for t in sorted(range(g.n_tasks), key=lambda t: (int(g.order_key[t]), t)):
        preds = into.get(t, [])
        start[t] = max([0] + [end[s] + lag for s, lag, k in preds if k == 0]
                       + [start[s] + lag for s, lag, k in preds if k == 2]
                       + ([end[prev[t]]] if t in prev else []))
        end[t] = max([start[t]] + [end[s] + lag for s, lag, k in preds if k == 1]) \
            + int(g.dur_ns[t])
    return max(end.values(), default=0)


def simulate_or_none(g):
    try:
        return simulate(g)
    except SimulationDeadlock:
        return None


def agrees_with_the_reference(g: SimGraph) -> bool:
    """The compiled schedule is the literal reference's, or both find the graph stuck.
    Returns whether it ran."""
    try:
        ref = reference_simulate(g)
    except Stuck:
        with pytest.raises(SimulationDeadlock):
            simulate(g)
        return False
    s = simulate(g)
    assert s.start_ns.tolist() == ref[0].tolist()
    assert s.end_ns.tolist() == ref[1].tolist()
    assert s.bound_by.tolist() == ref[2].tolist()
    assert s.bound_via_start.tolist() == ref[3].tolist()
    assert s.end_bound_by.tolist() == ref[4].tolist()
    return True


@SETTINGS
@given(graphs(policies=(FIXED, FCFS, PRIORITY), min_dur=1))
def test_agrees_with_the_literal_reference_simulator(g):
    agrees_with_the_reference(g)


@SETTINGS
@given(graphs(policies=(FIXED, FCFS, PRIORITY), min_dur=1), st.data())
def test_held_edges_agree_with_the_literal_reference_simulator(g, data):
    # some START edges held only while their source runs (contention)
    held = np.array(data.draw(st.lists(st.booleans(), min_size=g.n_edges,
                                       max_size=g.n_edges)), bool) & (g.edge_kind == 0)
    gh = with_(g, held_if_running=held)
    if agrees_with_the_reference(gh) and (g.unit_policy == FIXED).all():
        # never later than with every held edge a START edge
        assert (simulate(gh).start_ns <= simulate(g).start_ns).all()


@SETTINGS
@given(graphs(), st.integers(2, 7))
def test_scaling_durations_scales_the_schedule(g, k):
    g0 = with_(g, lag_ns=np.zeros_like(g.lag_ns))
    s = simulate(g0)
    sk = simulate(with_(g0, dur_ns=g0.dur_ns * k))
    assert sk.makespan_ns == k * s.makespan_ns
    assert (sk.start_ns == k * s.start_ns).all() and (sk.end_ns == k * s.end_ns).all()


@SETTINGS
@given(graphs(policies=(FIXED, FCFS, PRIORITY)), st.integers(2, 7))
def test_scaling_durations_and_lags_scales_every_policy(g, k):
    s = simulate_or_none(g)
    if s is None:
        return
    sk = simulate(with_(g, dur_ns=g.dur_ns * k, lag_ns=g.lag_ns * k))
    assert (sk.start_ns == k * s.start_ns).all() and (sk.end_ns == k * s.end_ns).all()
    assert (sk.bound_by == s.bound_by).all()


@SETTINGS
@given(graphs(policies=(FIXED, FCFS, PRIORITY)))
def test_makespan_is_at_least_the_longest_path(g):
    s = simulate_or_none(g)
    if s is None:
        return
    assert s.makespan_ns >= longest_path(g, with_units=False)
    busy = s.unit_busy_ns(g.n_units)
    assert s.makespan_ns >= busy.max()
    # A unit is held at least for its tasks' durations.
    assert (busy >= np.bincount(g.unit, weights=g.dur_ns, minlength=g.n_units)).all()


@SETTINGS
@given(graphs())
def test_fixed_units_make_the_schedule_the_longest_path(g):
    assert simulate(g).makespan_ns == longest_path(g, with_units=True)


@SETTINGS
@given(graphs(), st.data())
def test_adding_an_edge_never_shortens_a_fixed_schedule(g, data):
    n = g.n_tasks
    if n < 2:
        return
    a, b = data.draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True))
    if g.order_key[a] > g.order_key[b]:
        a, b = b, a
    lag = data.draw(st.integers(0, 5))
    kind = data.draw(st.sampled_from([0, 1]))
    e = edges(g) + [(a, b, lag, kind)]
    g2 = SimGraph.from_edges(g.dur_ns, g.unit, g.unit_policy, [x[0] for x in e],
                             [x[1] for x in e], [x[2] for x in e], [x[3] for x in e],
                             order_key=g.order_key, priority=g.priority)
    s, s2 = simulate(g), simulate(g2)
    assert s2.makespan_ns >= s.makespan_ns
    assert (s2.end_ns >= s.end_ns).all()


@SETTINGS
@given(graphs(max_lag=0))
def test_each_start_is_the_latest_predecessor_end(g):
    # All FIXED, lags zero: checked task by task from the output alone.
    s = simulate(g)
    prev = unit_prev(g)
    into = {}
    for src, d, _, k in edges(g):
        into.setdefault(d, []).append((src, k))
    for t in range(g.n_tasks):
        preds = [int(s.end_ns[p]) for p, k in into.get(t, []) if k == 0]
        preds += [int(s.start_ns[p]) for p, k in into.get(t, []) if k == 2]
        if t in prev:
            preds.append(int(s.end_ns[prev[t]]))
        assert s.start_ns[t] == max(preds, default=0)
        ends = [int(s.end_ns[p]) for p, k in into.get(t, []) if k == 1]
        assert s.end_ns[t] == max(ends + [int(s.start_ns[t])]) + g.dur_ns[t]


@SETTINGS
@given(graphs(), st.randoms(use_true_random=False))
def test_task_numbering_does_not_change_the_schedule(g, rnd):
    # Renumbering tasks (keeping order_key) only permutes a FIXED schedule; this sends edges
    # backwards in index order, through the core's bitmap path.
    n = g.n_tasks
    perm = list(range(n))
    rnd.shuffle(perm)
    new = np.array(perm, np.int64)          # old index -> new index
    old = np.argsort(new)                   # new index -> old index
    e = edges(g)
    g2 = SimGraph.from_edges(g.dur_ns[old], g.unit[old], g.unit_policy,
                             [new[x[0]] for x in e], [new[x[1]] for x in e],
                             [x[2] for x in e], [x[3] for x in e],
                             order_key=g.order_key[old] * n + np.arange(n)[old],
                             priority=g.priority[old])
    s, s2 = simulate(g), simulate(g2)
    assert (s2.start_ns == s.start_ns[old]).all()
    assert (s2.end_ns == s.end_ns[old]).all()


@SETTINGS
@given(graphs(policies=(FIXED, FCFS, PRIORITY)))
def test_critical_path_is_a_chain_of_binding_predecessors(g):
    s = simulate_or_none(g)
    if s is None:
        return
    again = simulate(g)
    assert (again.start_ns == s.start_ns).all() and (again.bound_by == s.bound_by).all()
    cp = s.critical_path()
    assert s.end_ns[cp[-1]] == s.makespan_ns
    assert s.bound_by[cp[0]] == -1
    for a, b in zip(cp[:-1], cp[1:], strict=True):
        # a is b's END binder (ends no later) or its start binder (starts no later)
        assert ((a == s.end_bound_by[b] and s.end_ns[a] <= s.end_ns[b])
                or (a == s.bound_by[b] and s.start_ns[a] <= s.start_ns[b]))
    # Every binder holds up what it is said to bind.
    for t in range(g.n_tasks):
        b = s.bound_by[t]
        if b < 0:
            assert s.start_ns[t] == 0
        else:
            assert s.start_ns[t] >= (s.start_ns[b] if s.bound_via_start[t] else s.end_ns[b])
        e = s.end_bound_by[t]
        if e >= 0:
            assert s.end_ns[t] == max(s.end_ns[t], s.end_ns[e]) > s.start_ns[t] + g.dur_ns[t]
    # A task first on its FIXED unit with no incoming edge starts at 0 and has no binder.
    # (On FCFS/PRIORITY units the task that ran before on the unit is a predecessor too.)
    free = g.unit_policy[g.unit] == FIXED
    free[g.dst] = False
    free[list(unit_prev(g))] = False
    assert (s.bound_by[free] == -1).all() and (s.start_ns[free] == 0).all()
