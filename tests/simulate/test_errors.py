"""Bad input is refused at entry with the first offending index; graphs that can never finish
raise SimulationDeadlock naming a cycle of task indices."""

from __future__ import annotations

import numpy as np
import pytest

from daydream.base.errors import DaydreamError
from daydream.simulate import FCFS, FIXED, SimGraph, SimulationDeadlock, simulate
from daydream.simulate.engine import find_cycle
from tests.simulate.timeline import build


def graph(**over):
    args = dict(dur_ns=[1, 2, 3], unit=[0, 0, 1], unit_policy=[FIXED, FIXED],
                src=[0, 1], dst=[1, 2], lag_ns=[0, 0], edge_kind=[0, 0])
    args.update(over)
    return SimGraph.from_edges(**args)


def is_rotation(cycle, expected):
    """``cycle`` (closed: first == last) is ``expected`` (open) up to where it starts."""
    body = list(cycle[:-1])
    assert cycle[0] == cycle[-1]
    k = body.index(expected[0])
    return body[k:] + body[:k] == expected


@pytest.mark.parametrize("over, message", [
    (dict(dur_ns=[1, -5, 3]), "task 1 has negative dur_ns -5"),
    (dict(dst=[1, 7]), "edge 1 has destination task 7 out of range 0..2"),
    (dict(dst=[-1, 2]), "edge 0 has destination task -1 out of range"),
    (dict(src=[0, 3]), "edge 1 has source task 3 out of range 0..2"),
    (dict(lag_ns=[0, -(1 << 41)]), f"edge 1 has lag_ns {-(1 << 41)}; lags must be >= "),
    (dict(edge_kind=[0, 3]), "edge 1 has unknown edge_kind 3"),
    (dict(unit=[0, 2, 1]), "task 1 runs on unknown unit 2"),
    (dict(unit_policy=[FIXED, 7]), "unit 1 has unknown policy 7"),
    (dict(unit=[0, 0]), "unit has 2 entries, expected 3 (one per task)"),
    (dict(lag_ns=[0, 0, 0]), "lag_ns has 3 entries, expected 2 (one per edge)"),
    (dict(priority=[1, 2]), "priority has 2 entries, expected 3"),
])
def test_bad_input_names_the_first_offender(over, message):
    with pytest.raises(DaydreamError, match=message.replace("(", r"\(").replace(")", r"\)")):
        graph(**over)


def test_checks_run_at_simulate_entry_too():
    g = graph()
    bad = SimGraph(dur_ns=g.dur_ns, unit=g.unit, unit_policy=g.unit_policy,
                   order_key=g.order_key, priority=g.priority, indptr=g.indptr,
                   dst=np.array([1, 9]), lag_ns=g.lag_ns, edge_kind=g.edge_kind)
    with pytest.raises(DaydreamError, match="destination task 9"):
        simulate(bad)
    bad = SimGraph(dur_ns=g.dur_ns, unit=g.unit, unit_policy=g.unit_policy,
                   order_key=g.order_key, priority=g.priority, indptr=np.array([0, 2, 1, 2]),
                   dst=g.dst, lag_ns=g.lag_ns, edge_kind=g.edge_kind)
    with pytest.raises(DaydreamError, match="indptr decreases at task 1"):
        simulate(bad)
    bad = SimGraph(dur_ns=g.dur_ns, unit=g.unit, unit_policy=g.unit_policy,
                   order_key=g.order_key, priority=g.priority, indptr=np.array([0, 1, 1, 1]),
                   dst=g.dst, lag_ns=g.lag_ns, edge_kind=g.edge_kind)
    with pytest.raises(DaydreamError, match="indptr must run from 0 to the edge count 2"):
        simulate(bad)


def test_cycle_of_edges_is_reported_as_a_path():
    # 0 -> 1 -> 2 -> 0, on three units; task 3 depends on the cycle and is stuck too.
    g = SimGraph.from_edges([1, 1, 1, 1], [0, 1, 2, 0], [FIXED] * 3, [0, 1, 2, 2],
                            [1, 2, 0, 3], 0, 0)
    with pytest.raises(SimulationDeadlock) as info:
        simulate(g)
    err = info.value
    assert isinstance(err, DaydreamError)
    assert is_rotation(err.cycle.tolist(), [0, 1, 2])
    assert err.links == ["start"] * 3
    assert err.stuck == 4
    assert "4 of 4 tasks can never run" in str(err)
    assert "-start->" in str(err)


def test_self_loop():
    g = SimGraph.from_edges([1, 1], [0, 0], [FIXED], [1], [1], 0, 0)
    with pytest.raises(SimulationDeadlock, match=r"1 -start-> 1") as info:
        simulate(g)
    assert info.value.cycle.tolist() == [1, 1]


def test_cycle_through_fixed_unit_order():
    # On one FIXED unit A runs before B, but an edge makes A wait for B.
    g, _ = build(tasks=[("A", 0, 1), ("B", 0, 1)], edges=[("B", "A", 0, "start")],
                 policies=[FIXED])
    with pytest.raises(SimulationDeadlock) as info:
        simulate(g)
    assert is_rotation(info.value.cycle.tolist(), [0, 1])
    assert sorted(info.value.links) == ["start", "unit"]


def test_cycle_through_an_end_edge():
    # s launches K (START) but also waits for K to end (END): fine. Here K must also start
    # after s ends: s waits on K's end, K on s's end.
    g, _ = build(tasks=[("s", 0, 1), ("K", 1, 1)],
                 edges=[("K", "s", 0, "end"), ("s", "K", 0, "start")], policies=[FIXED, FIXED])
    with pytest.raises(SimulationDeadlock, match=r"-end->") as info:
        simulate(g)
    assert is_rotation(info.value.cycle.tolist(), [0, 1])


def test_cycle_through_a_start_start_edge():
    # K may start once s has started (launch), but s starts only after K ends.
    g, _ = build(tasks=[("s", 0, 1), ("K", 1, 1)],
                 edges=[("s", "K", 0, "start_start"), ("K", "s", 0, "start")],
                 policies=[FIXED, FIXED])
    with pytest.raises(SimulationDeadlock, match=r"-start_start->") as info:
        simulate(g)
    assert sorted(info.value.links) == ["start", "start_start"]


def test_deadlock_on_a_shared_fcfs_unit_names_the_holder():
    # t (ready at 0) takes the FCFS channel and waits (END edge) for p, which is queued on that
    # same channel behind t: no static cycle, but the unit makes one.
    g, _ = build(tasks=[("x", 0, 5), ("t", 1, 1), ("p", 1, 1)],
                 edges=[("x", "p", 0, "start"), ("p", "t", 0, "end")], policies=[FIXED, FCFS])
    with pytest.raises(SimulationDeadlock) as info:
        simulate(g)
    err = info.value
    assert err.cycle.tolist() in ([1, 2, 1], [2, 1, 2])
    assert sorted(err.links) == ["end", "unit"]
    assert err.stuck == 2


def test_find_cycle_without_a_simulation_state():
    g = SimGraph.from_edges([1, 1, 1], [0, 0, 0], [FIXED], [0, 1], [1, 2], 0, 0)
    assert find_cycle(g) is None
    g = SimGraph.from_edges([1, 1, 1], [0, 1, 2], [FIXED] * 3, [0, 1, 2], [1, 2, 1], 0, 0)
    cycle, links = find_cycle(g)
    assert is_rotation(cycle.tolist(), [1, 2])
    assert links == ["start", "start"]


def test_too_many_dimensions():
    with pytest.raises(DaydreamError, match="dur_ns must be 1-dimensional"):
        SimGraph.from_edges([[1, 2]], [0, 0], [FIXED], [], [], 0, 0)
    with pytest.raises(DaydreamError, match="unit_policy must be 1-dimensional"):
        SimGraph.from_edges([1], [0], [[FCFS]], [], [], 0, 0)


def test_non_integer_and_wrapping_input_is_refused():
    with pytest.raises(DaydreamError, match="dur_ns must hold integers, got dtype float64"):
        graph(dur_ns=[1.5, 2, 3])
    with pytest.raises(DaydreamError, match=r"edge_kind\[1\] = 257 does not fit int8"):
        graph(edge_kind=np.array([0, 257]))
    with pytest.raises(DaydreamError, match=r"unit\[2\] = 4294967296 does not fit int32"):
        graph(unit=np.array([0, 0, 2**32]))
