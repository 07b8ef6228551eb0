import numpy as np
import polars as pl
import pytest

from ingest.errors import DaydreamError
from simulate.replay import replay
from transforms.primitives import Graph


@pytest.fixture(scope="module")
def g(graphs):
    return Graph.from_tables(graphs["alexnet"])


def _valid(gr: Graph):
    t, e = gr.task, gr.edge
    assert t["task_id"].to_list() == list(range(t.height))
    assert bool((t["start_ns"].diff().drop_nulls() >= 0).all())
    assert e["src"].min() >= 0 and e["dst"].max() < t.height
    assert t["name"][0] == "<trace start>"


def test_roundtrip_replays_exactly(g, graphs):
    a = replay(graphs["alexnet"])
    b = replay(g.scale("kind = 'kernel'", 1.0).tables())
    assert [i.simulated_ns for i in a.iterations] == [i.simulated_ns for i in b.iterations]
    assert g.tables()["task"].schema == graphs["alexnet"]["task"].schema


def test_select_sql_and_polars_agree(g):
    a = g.select("kind = 'kernel' AND name LIKE '%gemm%'")
    b = g.select((pl.col("kind") == "kernel") & pl.col("name").str.contains("gemm"))
    assert a.sum() > 0 and np.array_equal(a, b)
    assert not g.select("1 = 1")[0]  # the origin marker is never selected


def test_scale(g):
    sel = g.select("kind = 'kernel'")
    g2 = g.scale(sel, 0.3)
    d0, d1 = g.task["dur_ns"].to_numpy(), g2.task["dur_ns"].to_numpy()
    assert np.array_equal(d1[sel], np.rint(d0[sel] * 0.3).astype(np.int64))
    assert np.array_equal(d1[~sel], d0[~sel])
    for c in ("obs_dur_ns", "start_ns"):
        assert g2.task[c].equals(g.task[c])
    assert g2.edge.equals(g.edge)
    with pytest.raises(DaydreamError):
        g.scale(sel, -1)


def test_remove_rewires_thread_chain(g):
    e = g.edge.filter(pl.col("kind") == "thread")
    # a task with one thread predecessor and one thread successor
    ins = e.group_by("dst").len().filter(pl.col("len") == 1)["dst"]
    outs = e.group_by("src").len().filter(pl.col("len") == 1)["src"]
    r = int(sorted(set(ins.to_list()) & set(outs.to_list()) - {0})[5])
    p_edge = e.filter(pl.col("dst") == r).row(0, named=True)
    s_edge = e.filter(pl.col("src") == r).row(0, named=True)
    other_in = g.edge.filter(pl.col("dst") == r).height
    other_out = g.edge.filter(pl.col("src") == r).height
    g2 = g.remove([r])
    _valid(g2)
    assert g2.n_tasks == g.n_tasks - 1
    nid = lambda i: i - (i > r)  # noqa: E731
    new = g2.edge.filter(pl.col("src") == nid(p_edge["src"]), pl.col("dst") == nid(s_edge["dst"]))
    assert new.height == 1
    row = new.row(0, named=True)
    assert row["lag_ns"] == p_edge["lag_ns"] + s_edge["lag_ns"]
    assert row["anchor"] == "end_start" and row["kind"] == "thread"
    # every other edge kept, remapped; the removed task's in*out paths became new edges
    assert g2.edge.height <= g.edge.height - other_in - other_out + other_in * other_out
    assert g2.task.drop("task_id").equals(g.task.filter(pl.col("task_id") != r).drop("task_id"))


def test_remove_launch_call_keeps_kernel_ordered(g):
    la = g.edge.filter(pl.col("kind") == "launch").row(3, named=True)
    api, k = la["src"], la["dst"]
    thread_pred = g.edge.filter(pl.col("dst") == api, pl.col("kind") == "thread").row(0, named=True)
    g2 = g.remove([api])
    _valid(g2)
    p, kk = thread_pred["src"] - (thread_pred["src"] > api), k - 1
    row = g2.edge.filter(pl.col("src") == p, pl.col("dst") == kk).row(0, named=True)
    # pred end -> call start (end_start) then call start -> kernel start (start_start)
    assert row["anchor"] == "end_start"
    assert row["lag_ns"] == thread_pred["lag_ns"] + la["lag_ns"]
    assert row["kind"] == "inserted"


def test_insert_splices_into_unit_order(g):
    k = int(g.select("kind = 'kernel'").nonzero()[0][10])
    u = int(g.task["unit_id"][k])
    stream_in = g.edge.filter(pl.col("dst") == k, pl.col("kind") == "stream").row(0, named=True)
    la = g.edge.filter(pl.col("dst") == k, pl.col("kind") == "launch").row(0, named=True)
    rows = pl.DataFrame({"at": [la["src"], k], "kind": ["api", "kernel"], "unit_id":
                         [int(g.task["unit_id"][la["src"]]), u], "name": ["call", "new"],
                         "dur_ns": [100, 1000]})
    ed = pl.DataFrame({"src": [-1], "dst": [-2], "kind": ["launch"], "anchor": ["start_start"],
                       "lag_ns": [7]})
    g2, ids = g.insert(rows, ed)
    _valid(g2)
    assert g2.n_tasks == g.n_tasks + 2
    c, x = int(ids[0]), int(ids[1])
    assert g2.task["name"][x] == "new" and g2.task["dur_ns"][x] == 1000
    assert g2.task["start_ns"][x] == g.task["start_ns"][k]
    assert g2.task["phase"][x] == g.task["phase"][k]
    k2 = k + 2  # both new tasks sort before k
    assert x == k2 - 1
    # the stream predecessor now feeds the new kernel, which feeds k with lag 0
    into_x = g2.edge.filter(pl.col("dst") == x)
    assert set(into_x["kind"]) == {"stream", "launch"}
    srow = into_x.filter(pl.col("kind") == "stream").row(0, named=True)
    assert srow["lag_ns"] == stream_in["lag_ns"]
    assert g2.edge.filter(pl.col("src") == x, pl.col("dst") == k2, pl.col("lag_ns") == 0
                          ).height == 1
    assert g2.edge.filter(pl.col("src") == c, pl.col("dst") == x, pl.col("lag_ns") == 7
                          ).height == 1
    r = replay(g2.tables())
    assert r.iterations[0].simulated_ns >= replay(g.tables()).iterations[0].simulated_ns


def test_reschedule(g):
    g2, uid = g.add_unit("net", "channel", "fcfs")
    assert g2.unit["unit_id"].to_list()[-1] == uid and g2.unit["policy"][-1] == "fcfs"
    g3 = g2.set_policy([uid], "priority").set_priority("kind = 'kernel'", 3)
    assert g3.unit["policy"][-1] == "priority"
    assert set(g3.task.filter(pl.col("kind") == "kernel")["priority"]) == {3}
    with pytest.raises(DaydreamError, match="unknown policy"):
        g.set_policy([0], "lifo")
