"""The compiled passes behind ``replay`` (simulate/_passes.py) against plain numpy/pyarrow
references, on a real trace's graph: as read (one chunk per column) and cut into many small
chunks (as DuckDB returns large graphs), so that every batch boundary is crossed."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from daydream.base.errors import DaydreamError
from daydream.graphstore.read import read_graph
from daydream.graphstore.schema import CPU_KINDS
from daydream.simulate.graph import SimGraph
from daydream.simulate.replay import (
    ANCHOR_KIND,
    _codes,
    _time_by,
    replay,
    to_simgraph,
)
from tests.conftest import DATA, stored_graphs

TRACE = DATA / "kineto" / "resnet50_ddp_a100_rank0.json.gz"


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    st = tmp_path_factory.mktemp("passes") / "store"
    return read_graph(st, stored_graphs([TRACE], st)[TRACE])


def rechunk(g: dict[str, pa.Table], rows: int) -> dict[str, pa.Table]:
    return {k: pa.Table.from_batches(t.to_batches(max_chunksize=rows), t.schema)
            for k, t in g.items()}


def test_graph_is_cut_into_chunks(graph):
    g = rechunk(graph, 7001)
    assert g["task"]["dur_ns"].num_chunks > 3 and g["edge"]["dst"].num_chunks > 3


@pytest.mark.parametrize("rows", [None, 7001])
def test_simgraph_matches_from_edges(graph, rows):
    g = graph if rows is None else rechunk(graph, rows)
    task, edge = graph["task"], graph["edge"]
    # the simulator runs each task for its own cost plus its slack, each edge at its latency
    # plus its slack (the replay that reproduces the trace)
    ref = SimGraph.from_edges(
        dur_ns=task["dur_ns"].to_numpy() + task["slack_ns"].to_numpy(),
        unit=task["unit_id"].to_numpy(),
        unit_policy=_codes(graph["unit"]["policy"], {"fixed": 0, "fcfs": 1, "priority": 2}, "p"),
        src=edge["src"].to_numpy(), dst=edge["dst"].to_numpy(),
        lag_ns=edge["lag_ns"].to_numpy() + edge["slack_ns"].to_numpy(),
        edge_kind=_codes(edge["anchor"], ANCHOR_KIND, "a"), order_key=task["start_ns"].to_numpy(),
        priority=task["priority"].fill_null(0).to_numpy())
    sg = to_simgraph(g)
    for f in ("dur_ns", "unit", "unit_policy", "order_key", "priority", "indptr", "dst",
              "lag_ns", "edge_kind"):
        a, b = getattr(sg, f), getattr(ref, f)
        assert a.dtype == b.dtype and np.array_equal(a, b), f


def test_edges_out_of_order_are_sorted(graph):
    """Edges not in source order take the general path: the CSR is the same."""
    rng = np.random.default_rng(0)
    g = dict(graph)
    g["edge"] = graph["edge"].take(pa.array(rng.permutation(graph["edge"].num_rows)))
    a, b = to_simgraph(g), to_simgraph(graph)
    assert np.array_equal(a.indptr, b.indptr)
    # within a source the order of edges may differ: compare them as sets per source
    for t in rng.choice(a.n_tasks, 200, replace=False):
        s = slice(a.indptr[t], a.indptr[t + 1])
        assert sorted(zip(a.dst[s], a.lag_ns[s], a.edge_kind[s], strict=True)) == \
            sorted(zip(b.dst[s], b.lag_ns[s], b.edge_kind[s], strict=True))


def test_bad_edge_is_named(graph):
    g = rechunk(graph, 7001)
    lag = graph["edge"]["lag_ns"].to_numpy().copy()
    lag[9000] = -(1 << 42)  # in the second chunk: beyond MIN_LAG_NS
    g["edge"] = g["edge"].set_column(g["edge"].schema.get_field_index("lag_ns"), "lag_ns",
                                     pa.array(lag))
    with pytest.raises(DaydreamError, match=f"edge 9000 has lag_ns {-(1 << 42)}; lags must"):
        to_simgraph(g, slack=False)


def test_replay_does_not_depend_on_chunks(graph):
    a, b = replay(graph), replay(rechunk(graph, 7001))
    assert a.iterations == b.iterations
    assert a.unit_busy == b.unit_busy
    assert a.critical_path == b.critical_path
    assert np.array_equal(a.schedule.end_ns, b.schedule.end_ns)


def test_unit_busy_matches_bincount(graph):
    """A unit's load is its tasks' work in the simulation (own cost plus task slack), not the
    time they held it while they waited."""
    r = replay(rechunk(graph, 7001))
    s = r.schedule
    work = graph["task"]["dur_ns"].to_numpy() + graph["task"]["slack_ns"].to_numpy()
    ref = np.bincount(s.unit, weights=work).round().astype(np.int64)
    assert (ref <= np.bincount(s.unit, weights=s.end_ns - s.start_ns).round()).all()
    names = graph["unit"]["name"].to_pylist()
    got = {u["unit"]: u["busy_ns"] for u in r.unit_busy}
    assert got == {names[u]: int(ref[u]) for u in range(len(names)) if names[u] != "origin"}


def test_iteration_times_from_first_cpu_task(graph):
    """Each iteration but the last lasts from its first CPU task (at or after its marker) to
    the next one's: a numpy reference for the anchors the scan finds."""
    r = replay(rechunk(graph, 7001))
    task = graph["task"]
    start = task["start_ns"].to_numpy()
    cpu = np.isin(np.array(task["kind"].to_pylist()), CPU_KINDS)
    cpu[0] = False
    its = graph["iteration"]
    anchors = [int(np.flatnonzero(cpu & (start >= t))[np.argmin(start[cpu & (start >= t)])])
               for t in its["start_ns"].to_numpy()]
    s = r.schedule.start_ns
    for k, it in enumerate(r.iterations[:-1]):
        a, b = anchors[k], anchors[k + 1]
        assert it.measured_ns == start[b] - start[a]
        assert it.simulated_ns == s[b] - s[a]


@pytest.mark.parametrize("col", ["phase", "kind", "layer", "name"])
def test_time_by_matches_pyarrow(graph, col):
    """Grouping along a path straight from the string buffers, against pyarrow's values."""
    g = rechunk(graph, 7001)
    rng = np.random.default_rng(1)
    path = np.sort(rng.choice(graph["task"].num_rows, 5000, replace=False))
    ns = rng.integers(0, 10_000, len(path))
    got = _time_by(g["task"][col], path, ns, 10**6, col)
    vals = graph["task"][col].take(pa.array(path)).to_pylist()
    sums: dict = {}
    for v, x in zip(vals, ns, strict=True):
        sums[v] = sums.get(v, 0) + int(x)
    assert {r[col]: r["ns"] for r in got} == sums
    assert [r["ns"] for r in got] == sorted(sums.values(), reverse=True)


def test_critical_path_parts_add_up_to_its_span(graph):
    """The critical path of the median iteration runs from its first CPU task's simulated
    start to the next iteration's (a numpy reference for both anchors), its parts (work and
    edge delays) add up to that span, and it is the same on any chunking."""
    r = replay(graph)
    cp = r.critical_path
    assert cp == replay(rechunk(graph, 7001)).critical_path
    task = graph["task"]
    start = task["start_ns"].to_numpy()
    cpu = np.isin(np.array(task["kind"].to_pylist()), CPU_KINDS)
    cpu[0] = False
    marks = graph["iteration"]["start_ns"].to_numpy()
    k = int(np.flatnonzero(graph["iteration"]["iteration"].to_numpy() == cp["iteration"])[0])
    a, b = (int(np.flatnonzero(cpu & (start >= t))[np.argmin(start[cpu & (start >= t)])])
            for t in marks[k:k + 2])
    s = r.schedule.start_ns
    assert (cp["start_ns"], cp["end_ns"]) == (s[a], s[b])
    assert cp["covered_ns"] == cp["span_ns"] == s[b] - s[a] and cp["uncovered_ns"] == 0
    assert cp["work_ns"] + cp["delay_ns"] == cp["span_ns"]
    assert sum(p["ns"] for p in cp["by_phase"]) <= cp["span_ns"]
