"""Faults and concurrency on a shared store: concurrent writers, readers during writes, kills
at random points, corrupt files in a batch. (tests/ingest/test_store.py has the kill test of the
activity store alone; these add the graph database and the prediction table.)"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daydream import api, fleet
from daydream.graphstore import db, sql_query
from daydream.ingest import schema
from daydream.ingest.store import Store, table_file
from tests.conftest import DATA
from tests.daydream.variants import make_variants

TINY = [DATA / "kineto" / "event_sync_multi_stream.json.gz",
        DATA / "kineto" / "triton_example.json.gz",
        DATA / "kineto" / "mi250_toy_train_rocm.json.gz"]


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> list[Path]:
    """18 distinct real-shaped traces (time-shifted, renamed copies of three tiny ones)."""
    return make_variants(TINY, 18, tmp_path_factory.mktemp("variants"))


@pytest.fixture(autouse=True, params=["duckdb", "parquet"])
def storage(request, monkeypatch) -> str:
    """Every test twice: graphs inserted into DuckDB, and every graph stored as Parquet (as
    large ones are: the commands started here inherit the setting)."""
    if request.param == "parquet":
        monkeypatch.setattr(db, "PARQUET_ROWS", 0)
        monkeypatch.setenv("DAYDREAM_GRAPH_PARQUET_ROWS", "0")
    return request.param


def _daydream(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "daydream", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _check_store(root: Path) -> list[str]:
    """Every visible trace is complete and readable; every graph belongs to a stored trace; the
    graph database and prediction table open and answer. Returns the stored trace ids."""
    st = Store(root)
    ids = st.trace_ids()
    for tid in ids:
        for t in schema.COMMIT_ORDER:
            assert os.path.exists(table_file(st.trace_dir(tid), t))
        assert st.read("kernel", tid).schema == schema.KERNEL.schema
    if db.db_path(root).exists():
        assert set(db.trace_ids(root)) <= set(ids)
        rows = sql_query.run_sql(root, "SELECT count(*) AS n FROM prediction p WHERE NOT EXISTS "
                          "(SELECT 1 FROM task t WHERE t.trace_id = p.trace_id)")
        assert rows.column(0)[0].as_py() == 0
        dup = sql_query.run_sql(root, "SELECT count(*) - count(DISTINCT (trace_id, spec)) "
                         "FROM prediction")
        assert dup.column(0)[0].as_py() == 0
    return ids


def test_two_writers_take_turns_and_both_finish(traces, tmp_path, storage):
    root = tmp_path / "s"
    a = _daydream("ingest", *map(str, traces[:12]), "--store", str(root), "-j", "1")
    b = _daydream("ingest", *map(str, traces[6:]), "--store", str(root), "-j", "1")
    for p in (a, b):
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    ids = _check_store(root)
    assert len(ids) == len(traces)
    assert sorted(db.trace_ids(root)) == ids
    assert db.parquet_ids(root) == (ids if storage == "parquet" else [])
    # two batch predictions at once over the same store: each pair stored once
    a = _daydream("predict", "--all", "--store", str(root), "--opt", "amp", "--workers", "1")
    b = _daydream("predict", "--all", "--store", str(root), "--opt", "amp", "--workers", "1")
    for p in (a, b):
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    _check_store(root)
    n = sql_query.run_sql(root, "SELECT count(*) FROM prediction").column(0)[0].as_py()
    assert n == len(traces)


def test_queries_run_while_ingest_and_predict_write(traces, tmp_path):
    root = tmp_path / "s"
    api.ingest(traces[:1], root, jobs=1)  # so there is a graph to query from the start
    for args in (("ingest", *map(str, traces), "--store", str(root), "-j", "2"),
                 ("predict", "--all", "--store", str(root), "--opt", "amp", "--opt",
                  "cuda_graphs", "--workers", "2")):
        p = _daydream(*args)
        seen, during = [], 0
        while True:
            alive = p.poll() is None
            q = ("SELECT (SELECT count(DISTINCT trace_id) FROM task) AS g, "
                 "(SELECT count(*) FROM prediction) AS p, (SELECT count(*) FROM trace) AS t")
            seen.append(sql_query.run_sql(root, q, timeout_s=120).to_pylist()[0])
            during += alive
            if not alive:
                break
            time.sleep(0.05)
        out, err = p.communicate()
        assert p.returncode == 0, err
        assert during >= 3  # the reads really overlapped the writes
        for key in ("g", "p", "t"):  # readers see whole batches, never a count going back
            assert [s[key] for s in seen] == sorted(s[key] for s in seen)
    assert seen[-1] == {"g": len(traces), "p": 2 * len(traces), "t": len(traces)}


def test_killed_at_random_points_the_store_stays_readable_and_a_rerun_completes(traces,
                                                                                tmp_path,
                                                                                storage):
    root = tmp_path / "s"
    rng = random.Random(8)
    steps = [("ingest", *map(str, traces), "--store", str(root), "-j", "2"),
             ("predict", "--all", "--store", str(root), "--opt", "amp", "--opt",
              "cuda_graphs", "--workers", "2")]
    for args in steps:
        for _ in range(3):
            p = _daydream(*args)
            time.sleep(rng.uniform(0.5, 8.0))
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            _check_store(root)
        p = _daydream(*args)
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        _check_store(root)
    ids = Store(root).trace_ids()
    assert len(ids) == len(traces) and sorted(db.trace_ids(root)) == ids
    assert db.parquet_ids(root) == (ids if storage == "parquet" else [])
    graphs = db.parquet_root(root)  # no tombstones left either
    assert not graphs.exists() or all(p.name.startswith("trace_id=") for p in graphs.iterdir())
    n = sql_query.run_sql(root, "SELECT count(*) FROM prediction").column(0)[0].as_py()
    assert n == 2 * len(traces)
    # nothing left behind by the killed runs once a writer has swept
    staging = root / ".staging"
    assert not staging.exists() or not any(staging.iterdir())


def test_corrupt_files_in_a_batch_are_reported_and_the_rest_stored(traces, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for t in traces:
        (folder / t.name).write_bytes(t.read_bytes())
    good = traces[0].read_bytes()
    broken = {
        "cut.json.gz": good[: len(good) // 2],                      # gzip cut short
        "garbage.json": b'{"traceEvents": [{"ph": "X", "ts": "x"',  # JSON cut short
        "noise.sqlite": os.urandom(4096),                           # not a database
    }
    for name, data in broken.items():
        (folder / name).write_bytes(data)
    p = _daydream("ingest", str(folder), "--store", str(tmp_path / "s"), "-j", "2")
    out, err = p.communicate(timeout=600)
    assert p.returncode == 1
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert sorted(Path(e.split(": ", 2)[1]).name for e in errors) == sorted(broken)
    assert "Traceback" not in err
    assert f"{len(traces)} traces ingested, 0 already stored, {len(broken)} failed" in err
    ids = _check_store(tmp_path / "s")
    assert len(ids) == len(traces) and sorted(db.trace_ids(tmp_path / "s")) == ids
    rep = fleet.predict_all(tmp_path / "s", ["amp"], workers=1)
    assert rep.count("predicted") == len(traces) and not rep.failed
