import numpy as np
import polars as pl
import pytest

from daydream.base.errors import DaydreamError
from daydream.simulate.replay import replay
from daydream.transforms.primitives import Graph


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


def test_add_unit_on_a_device(g):
    g2, uid = g.add_unit("gpu 0 copy stream", "stream", "fixed", device=0)
    row = g2.unit.filter(pl.col("unit_id") == uid).row(0, named=True)
    assert (row["kind"], row["policy"], row["device"]) == ("stream", "fixed", 0)


def test_set_bytes_keeps_the_other_tasks_bytes(g):
    k = g.select("kind = 'kernel'").nonzero()[0][:3]
    g2 = g.set_bytes(k, 4096)
    b0, b1 = g.task["bytes"].to_list(), g2.task["bytes"].to_list()
    assert [b1[i] for i in k] == [4096] * 3
    assert [x for i, x in enumerate(b1) if i not in set(k)] == \
        [x for i, x in enumerate(b0) if i not in set(k)]  # nulls stay null


def test_set_lags_and_drop_edges(g):
    la = (g.edge["kind"] == "launch").to_numpy()
    g2 = g.set_lags(la, 123)
    lag0, lag1 = g.edge["lag_ns"].to_numpy(), g2.edge["lag_ns"].to_numpy()
    assert (lag1[la] == 123).all() and np.array_equal(lag1[~la], lag0[~la])
    assert g2.edge["slack_ns"].equals(g.edge["slack_ns"])
    g3 = g.drop_edges(pl.col("kind") == "launch")
    assert g3.edge.height == g.edge.height - int(la.sum()) and g3.n_tasks == g.n_tasks
    assert not (g3.edge["kind"] == "launch").any()
    with pytest.raises(DaydreamError, match="edge mask"):
        g.drop_edges(np.ones(3, bool))


def test_with_launches_adds_a_call_only_when_all_it_launched_goes(g):
    la = g.launches()
    per_call = la.group_by("api").agg(pl.col("gpu"))
    call, kernels = per_call.row(0)
    some = np.zeros(g.n_tasks, bool)
    some[kernels] = True
    assert g.with_launches(some)[call]
    # a call that launched several tasks stays while one of them stays
    multi = per_call.filter(pl.col("gpu").list.len() > 1)
    if multi.height:
        call2, ks = multi.row(0)
        part = np.zeros(g.n_tasks, bool)
        part[ks[:-1]] = True
        assert not g.with_launches(part)[call2]
    assert np.array_equal(g.with_launches(None), np.zeros(g.n_tasks, bool))


def test_replace_inserts_beside_what_it_removes(g):
    k = int(g.select("kind = 'kernel'").nonzero()[0][10])
    u = int(g.task["unit_id"][k])
    rows = pl.DataFrame({"at": [k], "kind": ["kernel"], "unit_id": [u], "name": ["merged"],
                         "dur_ns": [55]})
    g2, ids = g.replace([k], rows)
    _valid(g2)
    assert g2.n_tasks == g.n_tasks
    x = int(ids[0])
    assert g2.task["name"][x] == "merged" and g2.task["start_ns"][x] == g.task["start_ns"][k]
    assert g.task["name"][k] not in g2.task["name"][x:x + 1].to_list()
    # the new kernel took the removed one's place in stream order
    assert g2.edge.filter(pl.col("dst") == x, pl.col("kind") == "stream").height == 1


@pytest.mark.parametrize("key", ["alexnet", "v100", "mi300x"])
def test_arrays_are_the_task_columns(graphs, key):
    """``Graph.array`` (what optimizations read of a graph as numpy) holds each task column's
    values as Polars has them, nulls as asked; ``launch_pairs`` are the launch edges; ``isin``
    is Polars' ``is_in``."""
    g = Graph.from_tables(graphs[key])
    t = g.task
    assert g.array("kind").tolist() == t["kind"].to_list()
    assert g.array("name", "").tolist() == t["name"].fill_null("").to_list()
    assert g.array("phase").tolist() == t["phase"].to_list()
    assert g.array("dur_ns").tolist() == t["dur_ns"].to_list()
    it = t["iteration"]
    assert it.null_count() and g.array("iteration", -1).tolist() == it.fill_null(-1).to_list()
    with pytest.raises(DaydreamError, match="has nulls"):
        g.array("iteration")
    assert g.array("kind") is g.array("kind") and not g.array("kind").flags.writeable
    src, dst, lag = g.launch_pairs()
    la = g.launches()
    assert len(src) and src.tolist() == la["api"].to_list() and dst.tolist() == la["gpu"].to_list()
    assert lag.tolist() == g.edge.filter(pl.col("kind") == "launch")["lag_ns"].to_list()
    from daydream.transforms.primitives import isin
    for vals in (("forward", "backward"), ("weight_update",), ()):
        assert isin(g.array("phase"), vals).tolist() == \
            t["phase"].is_in(list(vals)).fill_null(False).to_list()


def test_insert_is_the_plain_concat_and_sort(g):
    """An insert without splicing is the old and new rows put in order and the edges, old
    (remapped) and new (the defaults where they give none, their types the table's), sorted
    by (src, dst) keeping table order: as plain Polars would make them."""
    n = g.n_tasks
    at = [5, 5, 40, n - 1]
    rows = pl.DataFrame({"at": at, "place": ["before", "after", "before", "after"],
                         "kind": ["api"] * 4, "unit_id": [int(g.task["unit_id"][a]) for a in at],
                         "name": ["a", "b", "c", "d"], "dur_ns": [1, 2, 3, 4],
                         "splice": [False] * 4})
    ed = pl.DataFrame({"src": [-1, 7, -4], "dst": [-3, -2, 3], "kind": ["launch", None, "sync"],
                       "lag_ns": [1.0, 2.5, None], "binding": [None, True, None]})
    g2, ids = g.insert(rows, ed)
    _valid(g2)
    newid = np.arange(n) + np.searchsorted(np.sort(np.array([5, 6, 40, n]) - 0.5), np.arange(n))
    assert ids.tolist() == [5, 7, 42, n + 3]
    assert g2.task.drop("task_id")[newid.tolist()].equals(g.task.drop("task_id"))
    e = g.edge.with_columns(pl.col("src").map_elements(lambda v: int(newid[v]), pl.Int64),
                            pl.col("dst").map_elements(lambda v: int(newid[v]), pl.Int64))
    new = pl.DataFrame({"src": [5, int(newid[7]), n + 3], "dst": [42, 7, int(newid[3])],
                        "kind": ["launch", "inserted", "sync"], "anchor": ["end_start"] * 3,
                        "lag_ns": [1, 2, 0], "slack_ns": [0] * 3, "binding": [False, True, False],
                        "inferred": [False] * 3}).select(e.columns).cast(e.schema)
    assert g2.edge.equals(pl.concat([e, new]).sort(["src", "dst"], maintain_order=True))


def _fresh(gr: Graph) -> Graph:
    """GR's tables in a new Graph: nothing converted yet, every array read from its table."""
    return Graph(gr.task, gr.edge, gr.unit, gr.iteration, gr.layer)


@pytest.mark.parametrize("key", ["alexnet", "v100"])
def test_arrays_carried_to_a_copy_are_its_own(graphs, key):
    """The task columns as numpy and the launch pairs that a primitive's copy inherits
    (``Graph._with``: those of the columns it kept, an insert's with the new rows put in
    order) are what the copy's own tables give."""
    g = Graph.from_tables(graphs[key])
    cols = [(c, None if not g.task[c].null_count() else
             ("" if g.task[c].dtype == pl.String else -1)) for c in g.task.columns]

    def fill(gr: Graph) -> Graph:
        for c, null in cols:
            if c != "layer":
                gr.array(c, null)
        gr.array("layer")  # nulls kept as None
        gr.launch_pairs()
        return gr

    def same(gr: Graph) -> None:
        ref = _fresh(gr)
        for mkey in [k for k in gr._memo if isinstance(k, tuple) and k[0] == "array"]:
            assert gr._memo[mkey].tolist() == ref.array(mkey[1], mkey[2]).tolist(), mkey
            assert not gr._memo[mkey].flags.writeable
        assert all(a.tolist() == b.tolist()
                   for a, b in zip(gr.launch_pairs(), ref.launch_pairs(), strict=True))
    fill(g)
    kernels = g.array("kind") == "kernel"
    launch = (g.edge["kind"] == "launch").to_numpy()
    k = int(np.flatnonzero(kernels)[3])
    rows = pl.DataFrame({"at": [k, k, 1], "place": ["before", "after", "after"],
                         "kind": ["kernel", "api", "api"],
                         "unit_id": [int(g.array("unit_id")[k]), int(g.array("unit_id")[1]), 0],
                         "name": ["new", None, "call"], "dur_ns": [5, 6, 7],
                         "iteration": [None, 1, None]})
    steps = [g.scale(kernels, 0.5), g.set_duration(kernels, 7), g.set_bytes(kernels, 64),
             g.set_priority(kernels, 3), g.move(kernels, int(g.array("unit_id")[1])),
             g.set_lags(launch, 1), g.drop_edges(launch),
             g.connect(pl.DataFrame({"src": [1], "dst": [2]})), g.add_unit("net")[0],
             g.insert(rows)[0], g.insert(rows.drop("iteration"))[0]]
    for g2 in steps:
        assert len(g2._memo) > 1  # something was carried
        same(g2)
        fill(g2)  # and what the copy of a copy carries
        same(g2.insert(rows)[0])
        same(g2.scale(kernels[:g2.n_tasks] if len(kernels) == g2.n_tasks else None, 2.0))


def test_median_call_ns_by_hand(g):
    """The median own cost of the runtime calls a rewrite inserts: by name part and blocking,
    an even count's two middle values averaged and rounded down, None where none match.
    The alexnet graph's calls renamed and timed here by hand."""
    api = np.flatnonzero(g.task["kind"].to_numpy() == "api")
    assert len(api) >= 8
    names = ["cudaLaunchKernel"] * 4 + ["cudaMemcpyAsync"] * 4 + ["cudaOther"] * (len(api) - 8)
    durs = [2_000, 4_001, 6_000, 100_001, 1_000, 3_000, 5_000, 7_000] + [50] * (len(api) - 8)
    blocking = [False] * 7 + [True] + [False] * (len(api) - 8)
    name = g.task["name"].to_list()
    dur = g.task["dur_ns"].to_numpy().copy()
    blk = g.task["blocking"].to_numpy().copy()
    for i, n, d, b in zip(api.tolist(), names, durs, blocking, strict=True):
        name[i], dur[i], blk[i] = n, d, b
    t = g.task.with_columns(pl.Series("name", name), pl.Series("dur_ns", dur),
                            pl.Series("blocking", blk))
    h = Graph(t, g.edge, g.unit, g.iteration, g.layer)
    assert h.median_call_ns("LaunchKernel") == 5_000  # (4,001 + 6,000) / 2, rounded down
    assert h.median_call_ns("Memcpy", blocking=False) == 3_000
    assert h.median_call_ns(blocking=True) == 7_000
    assert h.median_call_ns("Memcpy") == 4_000  # 1, 3, 5, 7 thousand
    assert h.median_call_ns("LaunchCooperativeKernel") is None
    t2 = t.with_columns(pl.when(pl.col("name") == "cudaLaunchKernel").then(101)
                        .otherwise(pl.col("dur_ns")).alias("dur_ns"))
    h2 = Graph(t2, g.edge, g.unit, g.iteration, g.layer)
    assert h2.median_call_ns("LaunchKernel") == 101


@pytest.mark.parametrize("key", ["alexnet", "v100"])
def test_a_chain_of_scales_and_inserts_converts_no_table_and_gives_the_frames_tables(graphs,
                                                                                     key):
    """Scale, set_duration and insert work on the Arrow tables read (``Graph._Held``): a chain
    of them (what ``amp`` and ``cuda_graphs`` make) gives the tables replayed without making
    a Polars frame of the task or edge table, and those tables are the ones the same chain
    gives on a graph held as Polars frames (the form the other primitives write)."""
    arrow = Graph.from_tables(graphs[key])
    frames = Graph(*(arrow.frame(k) for k in ("task", "edge", "unit", "iteration", "layer")),
                   schemas={k: t.schema for k, t in graphs[key].items()})
    arrow = Graph.from_tables(graphs[key])  # nothing converted
    kernels = arrow.array("kind") == "kernel"
    k = int(np.flatnonzero(kernels)[3])
    unit = arrow.array("unit_id")
    rows = pl.DataFrame({"at": [k, k, 1], "place": ["before", "after", "after"],
                         "kind": ["kernel", "api", "api"],
                         "unit_id": [int(unit[k]), int(unit[1]), 0],
                         "name": ["new", None, "call"], "dur_ns": [5, 6, 7],
                         "iteration": [None, 1, None]})
    edges = pl.DataFrame({"src": [1, -3], "dst": [-1, -1], "lag_ns": [10, None]})

    def chain(gr: Graph) -> Graph:
        gr = gr.scale(kernels, 0.5).set_duration(np.flatnonzero(kernels)[:2], 9)
        gr, _ = gr.insert(rows, edges)
        return gr.scale(gr.array("kind") == "api", 0.0)

    out_a, out_f = chain(arrow), chain(frames)
    assert out_a._held["task"].frame is None and out_a._held["edge"].frame is None
    ta, tf = out_a.tables(), out_f.tables()
    for name in ("task", "edge"):
        assert ta[name].schema == graphs[key][name].schema
        assert ta[name].to_pylist() == tf[name].to_pylist(), name
    assert [i.simulated_ns for i in replay(ta).iterations] == \
        [i.simulated_ns for i in replay(tf).iterations]


def test_array_of_arrow_columns_of_several_chunks_or_none(graphs):
    """``Graph.array`` of Arrow columns as they come: an ENUM column in several chunks with
    their own dictionaries (a concat of tables), or in none (an empty table), gives what the
    same column as a Polars frame gives, nulls as asked."""
    import pyarrow as pa
    t = graphs["alexnet"]["task"]
    half = t.num_rows // 2
    kind = t["kind"].to_pylist()
    kinds = pa.chunked_array([pa.array(kind[:half]).dictionary_encode(),
                              pa.array(kind[half:] + [None]).dictionary_encode()])
    layer = pa.chunked_array([pa.array(t["layer"].to_pylist() + [None], pa.string())])
    two = Graph(pa.table({"kind": kinds, "layer": layer}), *([pl.DataFrame()] * 4))
    frame = pl.from_arrow(pa.table({"kind": kinds.cast(pa.string()), "layer": layer}))
    for col, null in (("kind", None), ("kind", "?"), ("layer", None), ("layer", "")):
        want = frame[col].to_list()
        want = [null if v is None else v for v in want] if null is not None else want
        assert two.array(col, null).tolist() == want, (col, null)
    empty = pa.Table.from_arrays([pa.chunked_array([], pa.dictionary(pa.uint8(), pa.string()))],
                                 names=["kind"])
    assert Graph(empty, *([pl.DataFrame()] * 4)).array("kind").tolist() == []
