"""predict --all: every stored trace against every spec, into the prediction table."""

from __future__ import annotations

import shutil
import subprocess
import sys

import duckdb
import pytest

from daydream import api, fleet
from daydream.base.errors import DaydreamError
from daydream.graphstore import db, sql_query
from tests.conftest import DATA, ROOT

SMALL = [DATA / "kineto" / n for n in ("simple_add_a100.json.gz", "triton_example.json.gz",
                                        "event_sync_multi_stream.json.gz",
                                        "mi250_toy_train_rocm.json.gz", "backward_thread.json")]
SMALL.append(DATA / "nsys" / "mock_rtx3080.sqlite")
SPECS = ["amp", "cuda_graphs"]
BAD = 'scale(select="nosuch = 1", factor=0.5)'  # parses; fails on every graph (no such column)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet") / "s"
    rep = api.ingest(SMALL, root, jobs=1)
    assert not rep.failed
    return root


@pytest.fixture
def fresh(store, tmp_path):
    """A copy of the module's store (each test changes its prediction table)."""
    dst = tmp_path / "s"
    shutil.copytree(store, dst)
    return dst


def test_every_trace_against_every_spec_agrees_with_single_predict(fresh):
    rep = fleet.predict_all(fresh, SPECS, workers=1)
    ids = api.open_store(fresh).trace_ids()
    assert rep.count("predicted") == len(ids) * len(SPECS) and not rep.failed
    t = sql_query.run_sql(fresh, "SELECT * FROM prediction ORDER BY trace_id, spec").to_pylist()
    assert [(r["trace_id"], r["spec"]) for r in t] == [(i, s) for i in ids for s in sorted(SPECS)]
    # the batch path gives the numbers the one-trace path gives
    for r in t:
        d = api.predict(r["trace_id"], fresh, opts=[r["spec"]])
        assert r["measured_ms"] == pytest.approx(d.measured_ms, rel=1e-12)
        assert r["baseline_ms"] == pytest.approx(d.baseline_ms, rel=1e-12)
        assert r["predicted_ms"] == pytest.approx(d.predicted_ms, rel=1e-12)
        # the speedup is against the baseline, or for an optimization that removes CPU work
        # (cuda_graphs) against the job without the profiler's own CPU cost
        ref = d.baseline_ms if r["spec"] != "cuda_graphs" else d.reference_ms
        assert r["speedup"] == pytest.approx(ref / r["predicted_ms"], rel=1e-12)
        assert r["reference_ms"] == pytest.approx(ref, rel=1e-12)
        # and what it rests on: the interval (slack at zero to slack kept) and the gates
        assert [r["predicted_low_ms"], r["predicted_high_ms"]] == pytest.approx(
            list(d.predicted_interval_ms), rel=1e-12)
        assert [r["speedup_low"], r["speedup_high"]] == pytest.approx(list(d.speedup_interval),
                                                                      rel=1e-12)
        assert r["predicted_low_ms"] <= r["predicted_ms"] <= r["predicted_high_ms"]
        assert r["gates_failed"] == [g.name for g in d.gates if not g.ok]
        assert r["notes"] == ("\n".join(d.notes) or None)
        assert r["created"] is not None
    # the report's table is sorted by gain, best first
    sp = rep.table.column("speedup").to_pylist()
    assert sp == sorted(sp, reverse=True) and len(sp) == len(t)
    # cuda_graphs removes launch overhead on the toy training trace: a real gain, ranked first
    # (bounded: its GPU work starts ~6.5 ms after its launches, and the window's last iteration
    # waits for it)
    top = rep.table.slice(0, 1).to_pylist()[0]
    assert top["spec"] == "cuda_graphs" and top["speedup"] > 1.2
    # the printed table shows the step each speedup divides (issue 37)
    from daydream.report import fleet_table
    tab, _ = fleet_table(fleet.results(fresh), 0)
    head = [c.header for c in tab.columns]
    by = {(r[0], r[head.index("optimization")]): r for r in tab.rows}
    for r in t:
        row = by[(r["trace_id"], r["spec"])]
        assert row[head.index("reference ms")] == f"{r['reference_ms']:.3f}"


def test_a_failed_gate_is_a_column_sql_can_filter_on(fresh):
    """A scale that selects no task changes nothing and no note says why: the ``applies``
    gate fails on every trace (daydream/gates.py), and the row says so."""
    nothing = "scale(select=\"name = 'no such kernel'\", factor=0.5)"
    rep = fleet.predict_all(fresh, ["amp", nothing], workers=1)
    assert not rep.failed
    got = sql_query.run_sql(fresh, "SELECT trace_id, spec, notes FROM prediction WHERE "
                     "list_contains(gates_failed, 'applies')").to_pylist()
    assert sorted(r["trace_id"] for r in got if r["spec"] == nothing) == sorted(rep.traces)
    assert all("gate applies failed" in r["notes"] for r in got)
    # the run's report shows it beside the speedup
    shown = rep.table.to_pylist()
    assert {tuple(r["gates_failed"]) for r in shown if r["spec"] == nothing} == {("applies",)}


def test_rerun_skips_stored_pairs_and_force_recomputes(fresh):
    fleet.predict_all(fresh, ["amp"], workers=1)
    before = {(r["trace_id"], r["created"]) for r in
              sql_query.run_sql(fresh, "SELECT trace_id, created FROM prediction").to_pylist()}
    rep = fleet.predict_all(fresh, ["amp", "cuda_graphs"], workers=1)
    n = len(rep.traces)
    assert rep.count("stored") == n and rep.count("predicted") == n
    kept = {(r["trace_id"], r["created"]) for r in sql_query.run_sql(
        fresh, "SELECT trace_id, created FROM prediction WHERE spec = 'amp'").to_pylist()}
    assert kept == before  # not recomputed
    rep = fleet.predict_all(fresh, ["amp"], workers=1, force=True)
    assert rep.count("predicted") == n
    rows = sql_query.run_sql(fresh, "SELECT count(*) AS n, count(DISTINCT (trace_id, spec)) AS k "
                      "FROM prediction").to_pylist()[0]
    assert rows == {"n": 2 * n, "k": 2 * n}  # replaced, not duplicated


def test_interrupted_run_keeps_what_finished_and_resumes(fresh):
    seen = []

    def stop_after_three(r):
        seen.append(r)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fleet.predict_all(fresh, SPECS, workers=1, on_progress=stop_after_three)
    stored = sql_query.run_sql(fresh, "SELECT count(*) FROM prediction").column(0)[0].as_py()
    assert stored >= 3  # everything that finished before the interrupt was written
    rep = fleet.predict_all(fresh, SPECS, workers=1)
    assert rep.count("stored") == stored
    assert rep.count("predicted") == len(rep.traces) * len(SPECS) - stored


def test_where_selects_traces_by_the_trace_table(fresh):
    rep = fleet.predict_all(fresh, ["amp"], where="source_format = 'nsys_sqlite'", workers=1)
    assert len(rep.traces) == 1
    got = sql_query.run_sql(fresh, "SELECT t.file FROM prediction p JOIN trace t USING (trace_id)")
    assert got.column(0).to_pylist()[0].endswith("mock_rtx3080.sqlite")
    with pytest.raises(DaydreamError, match="--where 'nosuch = 1'"):
        fleet.predict_all(fresh, ["amp"], where="nosuch = 1")


def test_a_failing_spec_is_reported_and_the_rest_are_stored(fresh):
    rep = fleet.predict_all(fresh, ["amp", BAD], workers=1)
    n = len(rep.traces)
    assert rep.count("predicted") == n and len(rep.failed) == n
    assert all("nosuch" in f.error and f.trace_id in f.error for f in rep.failed)
    specs = sql_query.run_sql(fresh, "SELECT DISTINCT spec FROM prediction").column(0).to_pylist()
    assert specs == ["amp"]
    with pytest.raises(DaydreamError, match="unknown optimization"):
        fleet.predict_all(fresh, ["amp", "no_such_opt"])


def test_reingest_drops_the_traces_predictions(fresh):
    fleet.predict_all(fresh, ["amp"], workers=1)
    api.ingest([SMALL[0]], fresh, jobs=1, force=True)
    left = sql_query.run_sql(fresh, "SELECT count(*) FROM prediction").column(0)[0].as_py()
    assert left == len(SMALL) - 1  # its graph was rebuilt: its prediction is gone


def test_process_pool_gives_the_same_rows(fresh):
    fleet.predict_all(fresh, SPECS, workers=1)
    one = sql_query.run_sql(fresh, "SELECT trace_id, spec, predicted_ms FROM prediction "
                     "ORDER BY ALL").to_pylist()
    rep = fleet.predict_all(fresh, SPECS, workers=2, force=True)
    assert not rep.failed
    two = sql_query.run_sql(fresh, "SELECT trace_id, spec, predicted_ms FROM prediction "
                     "ORDER BY ALL").to_pylist()
    assert one == two
    # a runner started before the fleet's modules were imported (the CLI's) gives them too
    from daydream.base.runner import started_early
    runner = started_early(2, None, "daydream.fleet:warm_worker")
    rep = fleet.predict_all(fresh, SPECS, force=True, runner=runner)
    assert not rep.failed
    three = sql_query.run_sql(fresh, "SELECT trace_id, spec, predicted_ms FROM prediction "
                       "ORDER BY ALL").to_pylist()
    assert one == three
    # a fleet of one trace runs in this process (the worker started early is let go)
    tid = one[0]["trace_id"]
    rep = fleet.predict_all(fresh, SPECS, force=True, where=f"trace_id = '{tid}'",
                            runner=started_early(2, None, "daydream.fleet:warm_worker"))
    assert rep.count("predicted") == len(SPECS) and not rep.failed


def test_cli_prints_by_gain_and_sql_sees_the_table(fresh):
    p = subprocess.run([sys.executable, "-m", "daydream", "predict", "--all", "--store",
                        str(fresh), "--opt", "amp", "--opt", "cuda_graphs", "--workers", "1",
                        "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    import orjson
    rows = orjson.loads(p.stdout)
    assert [r["speedup"] for r in rows] == sorted((r["speedup"] for r in rows), reverse=True)
    assert "12 predicted" in p.stderr
    q = subprocess.run([sys.executable, "-m", "daydream", "sql", "--store", str(fresh),
                        "--format", "csv",
                        "SELECT spec, count(*) AS n FROM prediction GROUP BY 1 ORDER BY 1"],
                       capture_output=True, text=True)
    assert q.stdout == "spec,n\namp,6\ncuda_graphs,6\n", q.stderr
    bad = subprocess.run([sys.executable, "-m", "daydream", "predict", "--all", "--store",
                          str(fresh), "--opt", BAD, "--workers", "1"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "error: trace " in bad.stderr and "Traceback" not in bad.stderr
    neither = subprocess.run([sys.executable, "-m", "daydream", "predict", "--store",
                              str(fresh)], capture_output=True, text=True)
    assert neither.returncode == 1 and "--all" in neither.stderr


def test_prediction_table_is_declared_with_docs(fresh):
    fleet.predict_all(fresh, ["amp"], workers=1)
    con = duckdb.connect(str(db.db_path(fresh)), read_only=True)
    try:
        cols = con.execute("SELECT column_name, comment FROM duckdb_columns() "
                           "WHERE table_name = 'prediction'").fetchall()
    finally:
        con.close()
    names = [c for c, _ in cols]
    assert names[:6] == ["trace_id", "spec", "measured_ms", "baseline_ms", "predicted_ms",
                         "speedup"] and "created" in names
    assert all(doc for _, doc in cols)


def test_traces_without_a_graph_are_left_out_and_counted(fresh):
    ids = api.open_store(fresh).trace_ids()
    db.delete_trace(fresh, ids[0])  # as an ingest killed between commit and graph leaves it
    rep = fleet.predict_all(fresh, ["amp"], workers=1)
    assert rep.without_graph == 1 and ids[0] not in rep.traces
    assert len(rep.traces) == len(ids) - 1
    api.ingest([], fresh)  # any ingest builds the missing graph
    rep = fleet.predict_all(fresh, ["amp"], workers=1)
    assert rep.without_graph == 0 and rep.count("predicted") == 1


def test_a_worker_predicts_without_duckdb(store):
    """What a pool worker runs (``predict_trace`` on a packed graph) needs no DuckDB: the
    driver reads the graphs and writes the rows (~0.1 s of import per worker saved)."""
    from daydream.graphstore.read import read_graphs
    tid = api.open_store(store).trace_ids()[0]
    packed = fleet.pack_graph(read_graphs(store, [tid])[0])
    code = ("import pickle, sys; from daydream import fleet; "
            "a = pickle.loads(sys.stdin.buffer.read()); r = fleet.predict_trace(*a); "
            "assert r['ok'] and len(r['rows']) == 2, r; "
            "assert 'duckdb' not in sys.modules; print('ok')")
    import pickle
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True,
                         input=pickle.dumps((str(store), tid, packed, SPECS)), cwd=ROOT)
    assert out.stdout.decode().strip() == "ok"


def test_a_fleet_prediction_of_amp_and_cuda_graphs_makes_no_polars_frame(tmp_path,
                                                                         monkeypatch):
    """A worker's amp and cuda_graphs predictions of a real training trace (DLRM rank 0: op
    ranges with shapes, backward, an optimizer, so both rewrite fully) go from the graph
    tables read to the tables replayed without converting any table to Polars
    (``transforms.primitives.Graph``: on a 3.9k-task graph those conversions cost some 2 ms
    of a trace's 40)."""
    from daydream.graphstore.read import read_graphs
    from daydream.transforms.primitives import Graph
    f = DATA / "kineto" / "dlrm_8ranks" / "rank0.kineto.json.gz"
    root = tmp_path / "s"
    assert not api.ingest([f], root, jobs=1).failed
    tid = api.open_store(root).trace_ids()[0]
    made = []
    frame = Graph.frame

    def recorded(self, table):
        if self._held[table].frame is None:
            made.append(table)
        return frame(self, table)
    monkeypatch.setattr(Graph, "frame", recorded)
    r = fleet.predict_trace(str(root), tid, read_graphs(root, [tid])[0], SPECS)
    assert r["ok"] and not r["errors"] and [x["spec"] for x in r["rows"]] == SPECS, r
    notes = "\n".join(x["notes"] for x in r["rows"])
    assert "GradScaler in" in notes and "graph launches" in notes  # both rewrote the graph
    assert made == []


def _second_read_fails(monkeypatch, read) -> list[list[str]]:
    """The loader's chunk reads made through READ, the second raising: the chunks asked for,
    in order."""
    calls: list[list[str]] = []

    def failing(st, tids):
        calls.append(list(tids))
        if len(calls) == 2:
            raise DaydreamError("graph of trace x: unreadable")
        return read(st, tids)
    monkeypatch.setattr(fleet, "_read_chunk", failing)
    return calls


def test_later_chunks_are_read_ahead_on_a_thread_never_beside_a_write(fresh, monkeypatch):
    """The loader reads the first chunk of graphs in this process's thread and each later one
    on a thread while the one before it is predicted (``fleet._Reader``); results are
    written only when no read is under way, and a read that fails raises its error here,
    with nothing read after it and the rows stored before kept."""
    import threading
    import time as time_

    monkeypatch.setattr(fleet, "READ_FIRST", 1)
    monkeypatch.setattr(fleet, "READ_CHUNK", 2)
    monkeypatch.setattr(fleet, "FLUSH_ROWS", 1)  # a write after every trace
    read, wrote = fleet._read_chunk, db.write_results
    reads: list[tuple[str, list[str]]] = []
    reading = threading.Event()
    beside: list[str] = []

    def slow_read(st, tids):
        reading.set()
        try:
            time_.sleep(0.05)  # long enough for a write in the loop to fall inside it
            reads.append((threading.current_thread().name, list(tids)))
            return read(st, tids)
        finally:
            reading.clear()

    def write(*a, **k):
        if reading.is_set():
            beside.append("a write while a chunk was read")
        return wrote(*a, **k)
    monkeypatch.setattr(fleet, "_read_chunk", slow_read)
    monkeypatch.setattr(db, "write_results", write)
    ids = api.open_store(fresh).trace_ids()
    rep = fleet.predict_all(fresh, ["amp"], workers=1)
    assert rep.count("predicted") == len(ids) and not rep.failed
    assert [t for _, tids in reads for t in tids] == sorted(ids)
    assert [len(t) for _, t in reads] == [1, 2, 2, 1]
    main = threading.main_thread().name
    # each later chunk on the thread base.runner.later names after the function it runs
    assert reads[0][0] == main and all(n.startswith("slow_read") for n, _ in reads[1:])
    assert beside == []

    calls = _second_read_fails(monkeypatch, read)
    with pytest.raises(DaydreamError, match="unreadable"):
        fleet.predict_all(fresh, ["cuda_graphs"], workers=1)
    assert len(calls) == 2  # not read on after the error
    got = sql_query.run_sql(fresh, "SELECT spec, count(*) FROM prediction GROUP BY ALL")
    assert dict(zip(*got.to_pydict().values(), strict=True)).get("amp") == len(ids)


def test_a_failed_read_keeps_the_predictions_already_under_way(fresh, monkeypatch):
    """A chunk of graphs that cannot be read stops the fleet with its error, but what the
    workers were already predicting is collected and stored first: a rerun does not compute
    it again. With two workers the first chunk (three traces) goes two to the worker's queue
    and one into this process; the second chunk's read fails while the worker's two are
    still out (the spawned worker is still starting, some 0.5 s, when this process's one
    is done), so on the code before the drain only this process's one was stored."""
    monkeypatch.setattr(fleet, "READ_FIRST", 3)
    monkeypatch.setattr(fleet, "READ_CHUNK", 2)
    calls = _second_read_fails(monkeypatch, fleet._read_chunk)
    with pytest.raises(DaydreamError, match="unreadable"):
        fleet.predict_all(fresh, ["amp"], workers=2)
    stored = sql_query.run_sql(fresh, "SELECT trace_id FROM prediction ORDER BY ALL")
    assert len(calls) == 2
    assert stored.column(0).to_pylist() == sorted(calls[0])
