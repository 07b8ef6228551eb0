"""graph.duckdb: writing traces, the views, read-only queries and their output formats.

The graph tables below are hand-made (not produced by the graph builder): two tiny traces whose
every view row can be worked out on paper. Times are ns.

Trace A (``aaaa1111``), one GPU, two streams, two iterations:

    time      0    20   40   60   80   100  120  140  160  180  200
              |    |    |    |    |    |    |    |    |    |    |
    iteration [------------ 0 ------------)[------------ 1 ------------)
    thread    a0h1a3a4        a7                  a9 a11 [h13 160-190)
    stream 7    [k2 12-40)[k5 50-70)[k8 95----130)         [k12 155-180)
    stream 13               [k6 60-90)                   [m10 150-160)

    a = api call, h = host stretch, k = kernel, m = memcpy; launch edges a0->k2, a3->k5,
    a4->k6, a7->k8, a9->m10, a11->k12. a9 is a blocking cudaMemcpy: observed 10 ns, dur_ns 4.

    GPU busy in iteration 0 = |[12,40) u [50,70) u [60,90) u [95,100)| = 28 + 40 + 5 = 73
      (a plain sum of the clipped durations would say 83: k5 and k6 overlap on [60,70)),
    GPU busy in iteration 1 = |[100,130) u [150,160) u [155,180)| = 30 + 30 = 60.
    k8 is labelled iteration 0 (launched there) but runs into iteration 1.

Trace B (``bbbb2222``), two GPUs, one iteration [0, 50):

    time      0    10   20   30   40   50
    thread    [a0)
    gpu0 s7        [k1 10----30)
    gpu1 s3             [c2 20-------45)     c2 = comm task with no launch edge

    busy: gpu0 20, gpu1 25 -> 45 of 2 x 50; idle 55.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from daydream.base.errors import DaydreamError
from daydream.base.store import PART, duckdb_instance
from daydream.graphstore import db, sql_query
from daydream.graphstore.schema import GRAPH_SCHEMA_VERSION, GRAPH_TABLES
from daydream.ingest import schema as act
from daydream.ingest.store import Store

# the graph schema version in meta (which also stamps each graph with its rules)
VERSION_SQL = f"SELECT value FROM meta WHERE key = '{db.META_KEY}'"

A = "aaaa1111"
B = "bbbb2222"

_SQL_TO_ARROW = {"VARCHAR": pa.string(), "BIGINT": pa.int64(), "INTEGER": pa.int32(),
                 "BOOLEAN": pa.bool_()}


def arrow(name: str, rows: list[dict], with_trace_id: str | None = None) -> pa.Table:
    """An Arrow table of graph table ``name`` from partial rows (missing columns are null)."""
    fields = [pa.field(c.name, pa.string() if c.sql.startswith("ENUM")
                       else _SQL_TO_ARROW[c.sql.split()[0]])
              for c in GRAPH_TABLES[name].columns if c.name != "trace_id"]
    full = [{f.name: r.get(f.name) for f in fields} for r in rows]
    t = pa.Table.from_pylist(full, schema=pa.schema(fields))
    if with_trace_id is not None:
        t = t.append_column("trace_id", pa.array([with_trace_id] * t.num_rows, pa.string()))
    return t


def task(task_id, kind, unit_id, name, start, dur, iteration, layer, phase, *, obs=None,
         blocking=False, nbytes=None):
    return dict(task_id=task_id, kind=kind, unit_id=unit_id, name=name, start_ns=start,
                dur_ns=dur, slack_ns=0, obs_dur_ns=dur if obs is None else obs,
                iteration=iteration, layer=layer, phase=phase, blocking=blocking, bytes=nbytes)


def edge(src, dst, kind, anchor="end_start", lag=0, binding=False):
    return dict(src=src, dst=dst, kind=kind, anchor=anchor, lag_ns=lag, slack_ns=0,
                binding=binding, inferred=False)


def trace_a(with_trace_id: bool = False) -> dict[str, pa.Table]:
    tid = A if with_trace_id else None
    F, Bw, W, D, Ot = "forward", "backward", "weight_update", "data_loading", "other"
    tasks = [
        task(0, "api", 0, "cudaLaunchKernel", 0, 10, 0, "fc1", F),
        task(1, "host", 0, "aten::linear", 10, 10, 0, "fc1", F),
        task(2, "kernel", 1, "gemm", 12, 28, 0, "fc1", F),
        task(3, "api", 0, "cudaLaunchKernel", 20, 10, 0, "fc2", F),
        task(4, "api", 0, "cudaLaunchKernel", 30, 10, 0, "fc2", Bw),
        task(5, "kernel", 1, "relu", 50, 20, 0, "fc2", F),
        task(6, "kernel", 2, "gemm_bwd", 60, 30, 0, "fc2", Bw),
        task(7, "api", 0, "cudaLaunchKernel", 80, 10, 0, "optim", W),
        task(8, "kernel", 1, "adam", 95, 35, 0, "optim", W),
        task(9, "api", 0, "cudaMemcpy", 140, 4, 1, "data", D, obs=10, blocking=True),
        task(10, "memcpy", 2, "Memcpy HtoD", 150, 10, 1, "data", D, nbytes=4096),
        task(11, "api", 0, "cudaLaunchKernel", 151, 2, 1, "fc1", F),
        task(12, "kernel", 1, "gemm", 155, 25, 1, "fc1", F),
        task(13, "host", 0, "python", 160, 30, 1, None, Ot),
    ]
    edges = [edge(s, d, "thread") for s, d in
             [(0, 1), (1, 3), (3, 4), (4, 7), (7, 9), (9, 11), (11, 13)]]
    edges += [edge(s, d, "stream") for s, d in [(2, 5), (5, 8), (8, 12), (6, 10)]]
    edges += [edge(s, d, "launch", "start_start", 5) for s, d in
              [(0, 2), (3, 5), (4, 6), (7, 8), (9, 10), (11, 12)]]
    units = [
        dict(unit_id=0, kind="thread", pid=1, tid=10, name="thread 10", policy="fixed"),
        dict(unit_id=1, kind="stream", device=0, stream=7, name="gpu 0 stream 7",
             policy="fixed"),
        dict(unit_id=2, kind="stream", device=0, stream=13, name="gpu 0 stream 13",
             policy="fixed"),
    ]
    iterations = [
        dict(iteration=0, label="ProfilerStep#0", source="ProfilerStep", start_ns=0, end_ns=100),
        dict(iteration=1, label="ProfilerStep#1", source="ProfilerStep", start_ns=100,
             end_ns=200),
    ]
    layers = [dict(layer=n, source="python_function", first_start_ns=s)
              for n, s in [("fc1", 0), ("fc2", 20), ("optim", 80), ("data", 140)]]
    return {"task": arrow("task", tasks, tid), "edge": arrow("edge", edges, tid),
            "unit": arrow("unit", units, tid), "iteration": arrow("iteration", iterations, tid),
            "layer": arrow("layer", layers, tid)}


def trace_b() -> dict[str, pa.Table]:
    # Comes with a trace_id column, as a builder may produce it.
    tasks = [
        task(0, "api", 0, "cudaLaunchKernel", 0, 5, 0, "conv", "forward"),
        task(1, "kernel", 1, "conv_fwd", 10, 20, 0, "conv", "forward"),
        task(2, "comm", 2, "ncclKernel_AllReduce", 20, 25, 0, None, "backward", nbytes=1024),
    ]
    units = [
        dict(unit_id=0, kind="thread", pid=2, tid=20, name="thread 20", policy="fixed"),
        dict(unit_id=1, kind="stream", device=0, stream=7, name="gpu 0 stream 7",
             policy="fixed"),
        dict(unit_id=2, kind="stream", device=1, stream=3, name="gpu 1 stream 3",
             policy="fixed"),
    ]
    return {
        "task": arrow("task", tasks, B),
        "edge": arrow("edge", [edge(0, 1, "launch", "start_start", 5)], B),
        "unit": arrow("unit", units, B),
        "iteration": arrow("iteration", [dict(iteration=0, source="whole_trace", start_ns=0,
                                              end_ns=50)], B),
        "layer": arrow("layer", [dict(layer="conv", source="annotation")], B),
    }


@pytest.fixture(autouse=True, params=["duckdb", "parquet"])
def storage(request, monkeypatch) -> str:
    """Every test twice: graphs inserted into DuckDB, and every graph stored as Parquet (as
    large ones are), which must behave the same to every writer, reader and view."""
    if request.param == "parquet":
        monkeypatch.setattr(db, "PARQUET_ROWS", 0)
        monkeypatch.setenv("DAYDREAM_GRAPH_PARQUET_ROWS", "0")
    return request.param


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    db.write_trace(root, A, trace_a())
    db.write_trace(root, B, trace_b())
    return root


def rows(root: Path, sql: str) -> list[tuple]:
    with db.connect(root) as con:
        return con.execute(sql).fetchall()


def snapshot(root: Path) -> dict[str, list[tuple]]:
    with db.connect(root) as con:
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()
                for t in (*GRAPH_TABLES, "meta")}


# ---------------------------------------------------------------------------------- writing


def test_write_counts_and_trace_id_column_optional(tmp_path: Path) -> None:
    root = tmp_path / "s"
    assert db.write_trace(root, A, trace_a()) == {
        "task": 14, "edge": 17, "unit": 3, "iteration": 2, "layer": 4, "slack": 0}
    # The same tables with a trace_id column give the same rows.
    other = tmp_path / "t"
    db.write_trace(other, A, trace_a(with_trace_id=True))
    assert snapshot(root) == snapshot(other)
    assert db.trace_ids(root) == [A]
    assert rows(root, VERSION_SQL) == [(str(GRAPH_SCHEMA_VERSION),)]


def test_rewrite_replaces_one_trace_and_leaves_the_other(store: Path) -> None:
    before_b = {t: rows(store, f"SELECT * FROM {t} WHERE trace_id = '{B}' ORDER BY ALL")
                for t in GRAPH_TABLES}
    smaller = trace_a()
    smaller["task"] = smaller["task"].slice(0, 3)
    smaller["edge"] = smaller["edge"].slice(0, 1)
    smaller["iteration"] = smaller["iteration"].slice(0, 1)
    del smaller["layer"]  # a table left out is written empty
    assert db.write_trace(store, A, smaller) == {
        "task": 3, "edge": 1, "unit": 3, "iteration": 1, "layer": 0, "slack": 0}
    assert rows(store, f"SELECT count(*) FROM task WHERE trace_id = '{A}'") == [(3,)]
    assert rows(store, f"SELECT count(*) FROM layer WHERE trace_id = '{A}'") == [(0,)]
    assert {t: rows(store, f"SELECT * FROM {t} WHERE trace_id = '{B}' ORDER BY ALL")
            for t in GRAPH_TABLES} == before_b
    assert db.delete_trace(store, A) == 3
    assert db.trace_ids(store) == [B]


def test_failure_mid_write_leaves_the_db_exactly_as_before(store: Path) -> None:
    before = snapshot(store)
    bad = trace_a()
    bad["task"] = bad["task"].slice(0, 2)  # would change trace A, if it were committed
    # layer is written last: task, edge, unit and iteration are already replaced when it fails.
    bad["layer"] = bad["layer"].set_column(
        bad["layer"].schema.get_field_index("first_start_ns"), "first_start_ns",
        pa.array(["abc"] * bad["layer"].num_rows))
    with pytest.raises(DaydreamError, match=r"writing graph table layer of trace aaaa1111 "
                       r"failed, nothing written: Conversion Error"):
        db.write_trace(store, A, bad)
    assert snapshot(store) == before
    # A null in a NOT NULL column fails the same way.
    bad = trace_a()
    bad["iteration"] = bad["iteration"].set_column(
        bad["iteration"].schema.get_field_index("start_ns"), "start_ns",
        pa.array([None, 100], pa.int64()))
    with pytest.raises(DaydreamError, match="iteration.*NOT NULL"):
        db.write_trace(store, A, bad)
    assert snapshot(store) == before


def test_bad_input_is_refused_before_the_db_is_touched(store: Path) -> None:
    t = trace_a()
    t["unit"] = t["unit"].drop_columns(["policy"])
    with pytest.raises(DaydreamError, match="graph table unit for trace aaaa1111: missing "
                       "column.s. policy"):
        db.write_trace(store, A, t)
    with pytest.raises(DaydreamError, match="holds rows of trace bbbb2222"):
        db.write_trace(store, A, trace_b())
    with pytest.raises(DaydreamError, match="unknown graph table.s. tasks"):
        db.write_trace(store, A, {"tasks": trace_a()["task"]})


def test_writer_takes_the_store_lock(store: Path) -> None:
    done = threading.Event()

    def write() -> None:
        db.write_trace(store, B, trace_b())
        done.set()

    with Store(store).lock():
        th = threading.Thread(target=write)
        th.start()
        assert not done.wait(0.3)
    th.join(10)
    assert done.is_set()


# ------------------------------------------------------------------------------------ views


def test_kernel_timeline(store: Path) -> None:
    got = rows(store, """
        SELECT trace_id, task_id, iteration, layer, phase, kind, unit, device, stream, name,
               start_ns, end_ns, dur_ns, launch_task_id, launch_lag_ns, idle_before_ns
        FROM kernel_timeline ORDER BY trace_id, task_id""")
    s7, s13 = "gpu 0 stream 7", "gpu 0 stream 13"
    assert got == [
        # launch_lag = start - end of the launching call; idle_before = start - end of the
        # previous GPU task on the same stream.
        (A, 2, 0, "fc1", "forward", "kernel", s7, 0, 7, "gemm", 12, 40, 28, 0, 2, None),
        (A, 5, 0, "fc2", "forward", "kernel", s7, 0, 7, "relu", 50, 70, 20, 3, 20, 10),
        (A, 6, 0, "fc2", "backward", "kernel", s13, 0, 13, "gemm_bwd", 60, 90, 30, 4, 20,
         None),
        (A, 8, 0, "optim", "weight_update", "kernel", s7, 0, 7, "adam", 95, 130, 35, 7, 5, 25),
        # a9 observed 140-150 (dur_ns 4 is the simulator's): lag 0
        (A, 10, 1, "data", "data_loading", "memcpy", s13, 0, 13, "Memcpy HtoD", 150, 160, 10,
         9, 0, 60),
        (A, 12, 1, "fc1", "forward", "kernel", s7, 0, 7, "gemm", 155, 180, 25, 11, 2, 25),
        (B, 1, 0, "conv", "forward", "kernel", s7, 0, 7, "conv_fwd", 10, 30, 20, 0, 5, None),
        (B, 2, 0, None, "backward", "comm", "gpu 1 stream 3", 1, 3, "ncclKernel_AllReduce",
         20, 45, 25, None, None, None),
    ]


def test_layer_time(store: Path) -> None:
    got = rows(store, "SELECT * FROM layer_time ORDER BY trace_id, iteration, layer, phase")
    assert [d[0] for d in _describe(store, "layer_time")] == [
        "trace_id", "iteration", "layer", "phase", "gpu_ns", "cpu_ns", "tasks", "gpu_tasks",
        "cpu_tasks", "kernels"]
    assert got == [
        (A, 0, "fc1", "forward", 28, 20, 3, 1, 2, 1),
        (A, 0, "fc2", "backward", 30, 10, 2, 1, 1, 1),
        (A, 0, "fc2", "forward", 20, 10, 2, 1, 1, 1),
        (A, 0, "optim", "weight_update", 35, 10, 2, 1, 1, 1),
        (A, 1, "data", "data_loading", 10, 10, 2, 1, 1, 0),  # cpu: a9's observed 10, not 4
        (A, 1, "fc1", "forward", 25, 2, 2, 1, 1, 1),
        (A, 1, None, "other", 0, 30, 1, 0, 1, 0),
        (B, 0, "conv", "forward", 20, 5, 2, 1, 1, 1),
        (B, 0, None, "backward", 25, 0, 1, 1, 0, 0),
    ]


def test_iteration_time_unions_overlapping_streams(store: Path) -> None:
    got = rows(store, """
        SELECT trace_id, iteration, label, start_ns, end_ns, dur_ns, dur_ms, devices,
               gpu_busy_ns, gpu_idle_ns, gpu_util, kernels, gpu_tasks
        FROM iteration_time ORDER BY trace_id, iteration""")
    assert got == [
        (A, 0, "ProfilerStep#0", 0, 100, 100, 0.0001, 1, 73, 27, 0.73, 4, 4),
        (A, 1, "ProfilerStep#1", 100, 200, 100, 0.0001, 1, 60, 40, 0.6, 1, 2),
        (B, 0, None, 0, 50, 50, 0.00005, 2, 45, 55, 0.45, 1, 2),
    ]
    assert rows(store, "SELECT * FROM iteration_device_time ORDER BY ALL") == [
        (A, 0, 0, 100, 73, 27), (A, 1, 0, 100, 60, 40),
        (B, 0, 0, 50, 20, 30), (B, 0, 1, 50, 25, 25)]


def test_views_and_tables_carry_their_docs(store: Path) -> None:
    assert rows(store, "SELECT comment FROM duckdb_views() WHERE view_name = 'layer_time'") \
        == [(db.VIEWS["layer_time"][0],)]
    # the store's table (not the temporary view that adds Parquet graphs to it)
    assert rows(store, "SELECT comment FROM duckdb_columns() WHERE table_name = 'task' "
                       "AND column_name = 'obs_dur_ns' AND database_name <> 'temp'") == [
        ("Observed duration, ns.",)]


def test_a_writer_replaces_views_that_are_not_this_daydreams(store: Path) -> None:
    # As a database of an older daydream would hold them: another layer_time, and a meta
    # table without the fingerprint of this daydream's views. The next write puts them back.
    con = duckdb.connect(str(db.db_path(store)))
    con.execute("CREATE OR REPLACE VIEW layer_time AS SELECT 1 AS x")
    con.execute("COMMENT ON TABLE meta IS NULL")
    con.close()
    db.write_trace(store, B, trace_b())
    assert [r[0] for r in rows(store, "DESCRIBE layer_time")][:4] == [
        "trace_id", "iteration", "layer", "phase"]
    # a database whose views are current is not rewritten: an edit made behind the
    # fingerprint's back stays (the writer trusts the fingerprint)
    con = duckdb.connect(str(db.db_path(store)))
    con.execute("CREATE OR REPLACE VIEW layer_time AS SELECT 1 AS x")
    con.close()
    db.write_trace(store, B, trace_b())
    assert rows(store, "DESCRIBE layer_time")[0][0] == "x"


def _describe(root: Path, view: str) -> list[tuple]:
    return rows(root, f"DESCRIBE {view}")


# ---------------------------------------------------------------------------------- queries

Q = (f"SELECT task_id, name, launch_lag_ns, idle_before_ns FROM kernel_timeline "
     f"WHERE trace_id = '{A}' AND task_id <= 5 ORDER BY task_id")


def test_query_table(store: Path) -> None:
    assert sql_query.query(store, Q) == (
        "task_id  name  launch_lag_ns  idle_before_ns\n"
        "-------  ----  -------------  --------------\n"
        "      2  gemm              2            NULL\n"
        "      5  relu             20              10\n"
        "(2 rows)\n")
    assert sql_query.query(store, Q, max_rows=1).endswith(
        "      2  gemm              2            NULL\n"
        "(2 rows, first 1 shown; use --format csv or --out for all)\n")
    assert sql_query.query(store, "SELECT 0.73::DOUBLE AS x, true AS b, 'z' AS s") == (
        "   x  b     s\n"
        "----  ----  -\n"
        "0.73  true  z\n"
        "(1 row)\n")


def test_query_csv_json(store: Path) -> None:
    assert sql_query.query(store, Q, "csv") == (
        "task_id,name,launch_lag_ns,idle_before_ns\n2,gemm,2,\n5,relu,20,10\n")
    assert json.loads(sql_query.query(store, Q, "json")) == [
        {"task_id": 2, "name": "gemm", "launch_lag_ns": 2, "idle_before_ns": None},
        {"task_id": 5, "name": "relu", "launch_lag_ns": 20, "idle_before_ns": 10}]
    # sum() of BIGINT is a HUGEINT (decimal in Arrow): still a JSON number.
    assert json.loads(sql_query.query(store, "SELECT sum(dur_ns) AS s FROM task", "json")) == [
        {"s": 284}]
    assert sql_query.query(store, "SELECT 'a,b' AS s, [1, 2] AS l", "csv") == 's,l\n"a,b","[1,2]"\n'


def test_query_rows_without_arrow_are_the_rows_arrow_gives() -> None:
    """`daydream sql` fetches rows through DuckDB alone where it converts the result's types
    as Arrow does (no pyarrow import); the values, and so what is printed, must be Arrow's."""
    import duckdb
    con = duckdb.connect()
    for q in ("SELECT 1::TINYINT a, 2::UBIGINT b, 3.5::FLOAT c, 2.25::DOUBLE d, "
              "1.50::DECIMAL(5, 2) e, sum(x) f, NULL g, true h, 'x\ny' i, 'y'::BLOB j, "
              "DATE '2024-02-29' k, TIME '01:02:03.5' l, TIMESTAMP '2024-01-02 03:04:05' m, "
              "TIMESTAMPTZ '2024-06-01 12:00:00.25+02' n, TIMESTAMPTZ '2024-01-01' o, "
              "[1, NULL] p, {'q': [{'r': 1.5}]} q, 'a'::ENUM ('a', 'b') r "
              "FROM (SELECT 170141183460469231731687303715884105727::HUGEINT x)",
              "SELECT INTERVAL 1 DAY a, MAP {'k': 1} b, uuid() IS NULL c",  # through Arrow
              "SELECT 1 a, 2 a", "SELECT 1 WHERE false"):
        for zone in ("UTC", "America/New_York"):
            con.execute(f"SET TimeZone = '{zone}'")
            got = sql_query._result(con, con.sql(q))
            want = con.sql(q).to_arrow_table()
            assert got.rows == list(sql_query._tuples(want)), (q, zone)
            assert [str(v) for r in got.rows for v in r] == [
                str(v) for r in sql_query._tuples(want) for v in r]
            assert got.columns == want.column_names
    assert sql_query._result(con, None).rows == []


def test_query_parquet_and_out(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.parquet"
    assert sql_query.query(store, Q, "parquet", out) == f"2 rows -> {out}"
    assert pq.read_table(out).to_pylist() == [
        {"task_id": 2, "name": "gemm", "launch_lag_ns": 2, "idle_before_ns": None},
        {"task_id": 5, "name": "relu", "launch_lag_ns": 20, "idle_before_ns": 10}]
    with pytest.raises(DaydreamError, match="--format parquet needs --out FILE"):
        sql_query.query(store, Q, "parquet")
    out_csv = tmp_path / "r.csv"
    assert sql_query.query(store, Q, "csv", out_csv) == f"2 rows -> {out_csv}"
    assert out_csv.read_text().startswith("task_id,name")
    with pytest.raises(DaydreamError, match="unknown format 'xml'; use one of table, csv, "
                       "json, parquet"):
        sql_query.query(store, Q, "xml")


def test_query_errors(store: Path, tmp_path: Path) -> None:
    with pytest.raises(DaydreamError) as e:
        sql_query.query(store, "SELEC 1")
    assert str(e.value) == 'sql: Parser Error: syntax error at or near "SELEC"'
    with pytest.raises(DaydreamError, match="^sql: Catalog Error: Table with name nope does "
                       "not exist!$"):
        sql_query.query(store, "SELECT * FROM nope")
    # The connection is read-only (and where Parquet graphs are, task is a view of them).
    with pytest.raises(DaydreamError, match="^sql: .*(read-only|Can only delete from base)"):
        sql_query.query(store, "DELETE FROM task")
    assert rows(store, "SELECT count(*) FROM task") == [(17,)]
    for empty in (tmp_path / "missing", tmp_path):
        with pytest.raises(DaydreamError, match="no traces in .*: ingest some first"):
            sql_query.query(empty, "SELECT 1")


def test_version_mismatch(store: Path) -> None:
    con = duckdb.connect(str(db.db_path(store)))
    con.execute(f"UPDATE meta SET value = '0' WHERE key = '{db.META_KEY}'")
    con.close()
    msg = (rf"has graph schema version 0, this daydream reads version {GRAPH_SCHEMA_VERSION}; "
           r"rebuild .*ingest --force")
    with pytest.raises(DaydreamError, match=msg) as e:
        sql_query.query(store, "SELECT 1")
    assert str(e.value).startswith(f"{db.db_path(store)} has graph schema version 0")
    with pytest.raises(DaydreamError, match=msg):
        db.write_trace(store, A, trace_a())
    assert db.remove_db(store)
    assert not db.db_path(store).exists()
    # A DuckDB file that is not a daydream graph.
    con = duckdb.connect(str(db.db_path(store)))
    con.execute("CREATE TABLE task (x INTEGER)")
    con.close()
    for f in (lambda: sql_query.query(store, "SELECT 1"),
              lambda: db.write_trace(store, B, trace_b())):
        with pytest.raises(DaydreamError, match="is not a daydream graph .no meta table"):
            f()


def test_a_version_5_store_is_read_and_migrated_by_its_next_writer(store: Path) -> None:
    # version 5 had the same tables and no Parquet graphs: readable as it is
    con = duckdb.connect(str(db.db_path(store)))
    con.execute(f"UPDATE meta SET value = '5' WHERE key = '{db.META_KEY}'")
    con.close()
    assert rows(store, "SELECT count(*) FROM task") == [(17,)]
    assert rows(store, VERSION_SQL) == [("5",)]
    db.write_trace(store, B, trace_b())
    assert rows(store, VERSION_SQL) == [(str(GRAPH_SCHEMA_VERSION),)]
    assert rows(store, "SELECT count(*) FROM task") == [(17,)]


def test_a_version_6_store_is_read_and_migrated_by_its_next_writer(store: Path,
                                                                    storage: str) -> None:
    # version 6 wrote the Parquet task tables' name, layer and phase as plain strings: such a
    # store reads as it is; its next writer rewrites those files with them as dictionaries
    # (as version 7 writes them), so that Polars scans old and new files as one dataset
    import polars as pl

    files = sorted(db.parquet_root(store).glob("trace_id=*/task.parquet"))
    assert len(files) == (2 if storage == "parquet" else 0)
    for f in files:  # make it as version 6 wrote it
        t = pq.read_table(f)
        for c in db.DICTIONARY_TASK_COLUMNS:
            t = t.set_column(t.schema.get_field_index(c), c, t[c].cast(pa.string()))
        pq.write_table(t, f)
    con = duckdb.connect(str(db.db_path(store)))
    con.execute(f"UPDATE meta SET value = '6' WHERE key = '{db.META_KEY}'")
    con.close()
    before = rows(store, "SELECT * FROM task ORDER BY trace_id, task_id")
    assert len(before) == 17
    db.write_trace(store, B, trace_b())  # rewrites B's graph, migrates A's
    assert rows(store, VERSION_SQL) == [(str(GRAPH_SCHEMA_VERSION),)]
    assert rows(store, "SELECT * FROM task ORDER BY trace_id, task_id") == before
    for f in files:
        schema = pq.read_schema(f)
        assert all(pa.types.is_dictionary(schema.field(c).type)
                   for c in db.DICTIONARY_TASK_COLUMNS), f
    assert not list(db.parquet_root(store).glob("trace_id=*/*.migrating"))
    if files:
        names = (pl.scan_parquet(str(db.parquet_root(store) / "trace_id=*" / "task.parquet"),
                                 hive_partitioning=True)
                 .select(pl.col("name").cast(pl.String)).collect()["name"].to_list())
        assert sorted(names) == sorted(r[4] for r in before)
    assert db.migrate_parquet_graphs(store) == 0  # nothing left to rewrite


def test_a_version_7_prediction_table_is_read_and_rebuilt_by_its_next_writer(
        store: Path) -> None:
    # version 7's prediction rows had no reference step, interval or failed gates: such a
    # store reads as it is; its next writer rebuilds the table with them, its rows kept
    from daydream import fleet
    from daydream.graphstore.schema import PREDICTION

    old = ("trace_id", "spec", "measured_ms", "baseline_ms", "predicted_ms", "speedup",
           "iterations", "notes", "created")
    con = duckdb.connect(str(db.db_path(store)))
    con.execute("DROP TABLE prediction")
    con.execute("CREATE TABLE prediction (trace_id VARCHAR NOT NULL, spec VARCHAR NOT NULL, "
                "measured_ms DOUBLE, baseline_ms DOUBLE, predicted_ms DOUBLE, speedup DOUBLE, "
                "iterations INTEGER, notes VARCHAR, created TIMESTAMPTZ NOT NULL)")
    con.execute(f"INSERT INTO prediction VALUES ('{A}', 'amp', 10, 10.5, 7, 1.5, 3, 'n', "
                "TIMESTAMPTZ '2026-11-30 12:00:00+00')")
    con.execute(f"UPDATE meta SET value = '7' WHERE key = '{db.META_KEY}'")
    con.close()
    # (created left out: fetching a TIMESTAMPTZ into Python needs pytz)
    before = rows(store, "SELECT * EXCLUDE (created) FROM prediction")
    assert len(before) == 1 and len(before[0]) == len(old) - 1
    shown = fleet.results(store).to_pylist()  # what predict --all prints, read-only
    assert [(r["trace_id"], r["speedup"]) for r in shown] == [(A, 1.5)]
    assert "speedup_low" not in shown[0]
    assert rows(store, VERSION_SQL) == [("7",)]  # a reader changes nothing

    db.write_trace(store, B, trace_b())
    assert rows(store, VERSION_SQL) == [(str(GRAPH_SCHEMA_VERSION),)]
    with db.connect(store) as con:
        cols = con.execute("SELECT column_name, comment FROM duckdb_columns() WHERE "
                           "table_name = 'prediction' ORDER BY column_index").fetchall()
        got = con.execute("SELECT * EXCLUDE (created), epoch(created) FROM prediction").fetchall()
    assert [c for c, _ in cols] == PREDICTION.names and all(doc for _, doc in cols)
    names = [c for c in PREDICTION.names if c != "created"]
    r = dict(zip([*names, "epoch"], got[0], strict=True))
    kept = dict(zip(old[:-1], before[0], strict=True))
    assert len(got) == 1 and {k: r[k] for k in kept} == kept
    assert r["epoch"] == 1796040000  # 2026-11-30 12:00 UTC
    assert all(r[k] is None for k in names if k not in old)  # not known: NULL
    assert fleet.results(store).to_pylist()[0]["gates_failed"] is None
    with db.connect(store, read_only=False) as con:  # a second writer: nothing to rebuild
        assert db.migrate_result_tables(con) == []


def test_query_waits_for_a_writer_in_another_process(store: Path) -> None:
    # Another process holds the file read-write (as write_trace does for one transaction).
    code = ("import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('open', "
            "flush=True); time.sleep(float(sys.argv[2])); c.close()")
    p = subprocess.Popen([sys.executable, "-c", code, str(db.db_path(store)), "3"],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "open"
        with pytest.raises(DaydreamError, match="being written by another process"):
            sql_query.query(store, "SELECT 1", timeout_s=0.2)
        t0 = time.monotonic()
        assert sql_query.query(store, "SELECT count(*) AS n FROM task", "csv") == "n\n17\n"
        assert time.monotonic() - t0 > 0.5
    finally:
        p.wait(30)


# --------------------------------------------------------------------------- activity views


def _write_activity(root: Path, trace_id: str, committed: bool) -> None:
    st = Store(root)
    k = pa.Table.from_pylist([dict(device=0, stream=7, correlation=1, name="gemm",
                                   start_ns=12, dur_ns=28)], schema=act.KERNEL.schema)
    p = st.partition("kernel", trace_id)
    p.mkdir(parents=True)
    pq.write_table(k, p / PART)
    if committed:
        tr = pa.Table.from_pylist([dict(file=f"{trace_id}.json", source_format="kineto_json",
                                        file_bytes=1, events=1, stats=[],
                                        ingested_at=0)], schema=act.TRACE.schema)
        p = st.partition("trace", trace_id)
        p.mkdir(parents=True)
        pq.write_table(tr, p / PART)


def test_activity_views(store: Path) -> None:
    _write_activity(store, "1234", committed=True)  # a numeric-looking id stays a string
    _write_activity(store, "ffff", committed=False)  # a killed ingest: no trace row
    assert sql_query.query(store, "SELECT trace_id, name, start_ns FROM kernel", "csv") == (
        "trace_id,name,start_ns\n1234,gemm,12\n")
    assert sql_query.query(store, "SELECT trace_id, file FROM trace", "csv") == (
        "trace_id,file\n1234,1234.json\n")
    # Tables with no partition at all are empty views with the declared columns.
    assert sql_query.query(store, 'SELECT count(*) AS n, count(pid) AS p FROM "range"', "csv") == (
        "n,p\n0,0\n")
    # Activity and graph tables in one query.
    assert sql_query.query(store, "SELECT count(*) AS n FROM kernel k JOIN kernel_timeline g "
                           "ON g.name = k.name", "csv") == "n\n2\n"


def test_activity_without_graph(tmp_path: Path) -> None:
    _write_activity(tmp_path, "1234", committed=True)
    assert sql_query.query(tmp_path, "SELECT count(*) AS n FROM kernel", "csv") == "n\n1\n"
    with pytest.raises(DaydreamError, match="graph of .* is not built yet"):
        sql_query.query(tmp_path, "SELECT * FROM kernel_timeline")


def test_gpu_busy_is_the_union_of_intervals(tmp_path: Path) -> None:
    # Random intervals on 3 streams of 2 GPUs, many nested, identical or touching, checked
    # against a plain merge of the clipped intervals.
    rnd = random.Random(7)
    units = [dict(unit_id=0, kind="thread", policy="fixed")]
    units += [dict(unit_id=u, kind="stream", device=d, stream=u, policy="fixed")
              for u, d in [(1, 0), (2, 0), (3, 1)]]
    spans = [(rnd.randrange(0, 300, 5), rnd.randrange(0, 60, 5), rnd.randrange(1, 4))
             for _ in range(300)]
    spans.sort()
    tasks = [task(i, rnd.choice(["kernel", "memcpy", "comm"]), u, "k", s, d, 0, None, None)
             for i, (s, d, u) in enumerate(spans)]
    its = [(0, 0, 97), (1, 97, 230), (2, 230, 400)]
    db.write_trace(tmp_path, A, {
        "task": arrow("task", tasks), "unit": arrow("unit", units),
        "iteration": arrow("iteration", [dict(iteration=i, source="ProfilerStep", start_ns=s,
                                              end_ns=e) for i, s, e in its])})
    want = []
    for i, lo, hi in its:
        for dev, us in [(0, {1, 2}), (1, {3})]:
            iv = sorted((max(s, lo), min(s + d, hi)) for s, d, u in spans
                        if u in us and s < hi and s + d > lo)
            busy, end = 0, None
            for s, e in iv:
                if end is None or s > end:
                    busy += e - s
                    end = e
                elif e > end:
                    busy += e - end
                    end = e
            want.append((i, dev, busy, hi - lo - busy))
    assert rows(tmp_path, "SELECT iteration, device, busy_ns, idle_ns "
                          "FROM iteration_device_time ORDER BY ALL") == want


def test_every_query_in_docs_sql_md_runs_and_shows_its_output(store: Path) -> None:
    _write_activity(store, "1234", committed=True)
    text = (Path(__file__).resolve().parents[2] / "docs" / "sql.md").read_text()
    blocks = re.findall(r"```sql\n(.*?)```\n(?:\n```text\n(.*?)```\n)?", text, re.S)
    assert len(blocks) >= 9
    for sql, shown in blocks:
        got = sql_query.query(store, sql)
        if shown:
            assert got == shown, sql


def test_parquet_graphs_read_without_daydream_as_docs_sql_md_shows(store: Path,
                                                                    storage: str) -> None:
    if storage != "parquet":
        pytest.skip("the store holds no Parquet graphs")
    text = (Path(__file__).resolve().parents[2] / "docs" / "sql.md").read_text()
    (files_sql,) = re.findall(r"```sql-files\n(.*?)```", text, re.S)
    (polars_code,) = re.findall(r"```python\n(# Polars.*?)```", text, re.S)
    want = sorted(rows(store, "SELECT trace_id, sum(obs_dur_ns) FROM task WHERE kind IN "
                              "('kernel', 'memcpy', 'memset', 'comm') GROUP BY trace_id"))
    assert want == [(A, 148), (B, 45)]  # the GPU tasks drawn at the top of this file
    got = duckdb.sql(files_sql.replace("DIR", str(store))).fetchall()
    assert sorted(got) == want
    env: dict = {}
    exec(polars_code.replace("DIR", str(store)), env)
    assert sorted(env["gpu"].rows()) == want


def test_a_creation_interrupted_before_its_schema_leaves_no_database(tmp_path: Path,
                                                                     monkeypatch) -> None:
    """A writer killed while creating graph.duckdb must not leave a file without tables, which
    readers would take for a broken graph; a later writer sweeps the half-made file."""
    root = tmp_path / "store"

    def killed(con, path=None):
        con.execute("CREATE TABLE meta (key VARCHAR)")  # part of the schema, then the kill
        raise KeyboardInterrupt

    monkeypatch.setattr(db, "create_schema", killed)
    with pytest.raises(KeyboardInterrupt):
        db.write_trace(root, A, trace_a())
    assert not db.db_path(root).exists()
    assert db.trace_ids(root) == []  # no graph yet, rather than a broken one
    monkeypatch.undo()
    db.write_trace(root, A, trace_a())
    assert db.trace_ids(root) == [A]
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("graph.duckdb")) == [
        "graph.duckdb"]


def test_a_prepared_database_is_the_one_the_first_writer_moves_into_place(tmp_path: Path
                                                                          ) -> None:
    """``prepare`` makes an empty database in the caller's staging folder on a thread; the
    first write moves that file into place (no second one made), and the store reads as one
    whose writer created its database."""
    root = tmp_path / "store"
    staged = Store(root).new_staging_dir()
    db.prepare(root, staged)
    made = staged / db.DB_FILE
    db._PREPARED[db.db_path(root).resolve()][0].join()
    assert made.exists() and not db.db_path(root).exists()
    ino = made.stat().st_ino
    db.write_trace(root, A, trace_a())
    assert db.db_path(root).stat().st_ino == ino and not made.exists()
    assert not db._PREPARED
    other = tmp_path / "other"
    db.write_trace(other, A, trace_a())
    assert snapshot(root) == snapshot(other)
    assert db.trace_ids(root) == [A]
    db.prepare(root, staged)  # a store with a database: nothing to make
    assert not db._PREPARED and not list(staged.iterdir())


def test_a_prepared_database_that_failed_or_was_not_used_leaves_nothing(tmp_path: Path,
                                                                        monkeypatch) -> None:
    """A preparation that fails leaves no file and the writer creates its own database; one
    never used is waited for by ``forget_prepared``, so its folder can go."""
    root = tmp_path / "store"
    staged = Store(root).new_staging_dir()

    def broken(con, path=None):
        raise duckdb.IOException("disk full")

    monkeypatch.setattr(db, "create_schema", broken)
    db.prepare(root, staged)
    db._PREPARED[db.db_path(root).resolve()][0].join()
    monkeypatch.undo()
    assert not (staged / db.DB_FILE).exists()
    db.write_trace(root, A, trace_a())
    assert db.trace_ids(root) == [A]
    unused = tmp_path / "unused"
    staged = Store(unused).new_staging_dir()
    db.prepare(unused, staged)
    db.forget_prepared(unused)
    assert not db._PREPARED and (staged / db.DB_FILE).exists()
    assert not db.db_path(unused).exists()


def test_a_real_graph_reads_back_the_same_from_parquet_as_from_duckdb(tmp_path: Path,
                                                                      monkeypatch,
                                                                      storage: str) -> None:
    """Parallel edges (same src and dst) come back in an order the simulator's critical path
    sees, and DuckDB's sort by src, dst alone leaves them as its threads cut the scan (this
    trace's came back in one order with 1 or 2 threads, another with 4 or 8): read by
    graphstore.read.ORDER, the Parquet files and the DuckDB table give the same order, with
    any number of threads, not merely the same rows."""
    if storage != "duckdb":
        pytest.skip("compares the two storages itself")
    import numpy as np

    from daydream.graphstore import load as gload
    from daydream.graphstore.read import read_graph
    from daydream.ingest.convert import read_trace
    from tests.conftest import SHARED

    # the transformer trace: 272,786 edges (three of DuckDB's row groups), 2,078 parallel pairs
    path = SHARED / "hta" / "transformer_ddp_v100_rank1.json.gz"
    if not path.exists():
        pytest.skip(f"needs {path}")
    conv = read_trace(path)
    _, gt = gload.graph_tables({t: gload._for_graph(t, conv.tables[t]) for t in gload.ACTIVITY})
    key = gt["edge"]["src"].to_numpy() * (1 << 32) + gt["edge"]["dst"].to_numpy()
    assert len(key) > 2 * 122_880  # several of DuckDB's row groups, scanned by several threads
    assert len(key) - len(np.unique(key)) > 1000  # parallel edges, whose order is at stake
    out = {}
    for mode, rows_from in (("duckdb", 1 << 62), ("parquet", 0)):
        monkeypatch.setattr(db, "PARQUET_ROWS", rows_from)
        root = tmp_path / mode
        db.write_trace(root, A, gt)
        assert db.parquet_ids(root) == ([A] if mode == "parquet" else [])
        con = duckdb_instance()
        threads = con.execute("SELECT current_setting('threads')").fetchall()[0][0]
        try:
            for n in (1, 8):
                con.execute(f"SET threads = {n}")
                out[mode, n] = read_graph(root, A)
        finally:
            con.execute(f"SET threads = {threads}")
    first = out["duckdb", 1]
    for k, got in out.items():
        for name in GRAPH_TABLES:
            assert got[name].equals(first[name]), (k, name)


def test_show_tables_lists_every_table_once_with_its_kind(store: Path) -> None:
    """SHOW TABLES listed graph tables twice (a table and the view over its Parquet
    partitions) and left out kernel, api and trace (issue 37)."""
    _write_activity(store, "1234", committed=True)
    for q in ("SHOW TABLES", "show all tables;"):
        got = json.loads(sql_query.query(store, q, "json"))
        names = [r["name"] for r in got]
        assert len(names) == len(set(names)), names
        kind = {r["name"]: r["kind"] for r in got}
        for t in ("task", "edge", "unit", "iteration", "layer", "slack"):
            assert kind[t] == "graph table"
        for t in ("kernel", "api", "trace", "range"):
            assert kind[t] == "activity table"
        assert kind["kernel_timeline"] == "view"
