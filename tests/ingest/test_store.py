"""The activity store: layout, schema metadata, the writer lock, a store of another schema, and
its trace rows, through ingest's own entry point (the whole tool's re-ingest and killed runs:
tests/daydream/test_store.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from daydream.base.errors import DaydreamError
from daydream.base.store import PART
from daydream.ingest import schema
from daydream.ingest.batch_ingest import ingest
from daydream.ingest.store import Store
from tests.conftest import DATA

SMALL = [DATA / "kineto" / n for n in ("simple_add_a100.json.gz", "alexnet_fwd_a100.json.gz",
                                        "event_sync_multi_stream.json.gz")]


def to_older_layout(root, tid: str) -> None:
    """Move a stored trace into the layout stores written before keep: a folder per table,
    ``activity/<table>/trace_id=<id>/part-0.parquet``."""
    folder = root / "activity" / f"trace_id={tid}"
    for f in folder.iterdir():
        part = root / "activity" / f.name.removesuffix(".parquet") / f"trace_id={tid}"
        part.mkdir(parents=True)
        f.rename(part / PART)
    folder.rmdir()


def test_layout_and_schema_version(tmp_path):
    st = tmp_path / "s"
    rep = ingest(SMALL[:1], Store(st), jobs=1)
    tid = rep.results[0].trace_id
    # one folder per trace, a file per table, nothing else
    assert [p.name for p in (st / "activity").iterdir()] == [f"trace_id={tid}"]
    assert sorted(p.name for p in (st / "activity" / f"trace_id={tid}").iterdir()) == \
        sorted(f"{t}.parquet" for t in schema.COMMIT_ORDER)
    for table in schema.COMMIT_ORDER:
        f = st / "activity" / f"trace_id={tid}" / f"{table}.parquet"
        assert f.exists(), f
        md = pq.read_schema(f).metadata
        assert md[b"daydream.schema_version"] == str(schema.SCHEMA_VERSION).encode()
        assert md[b"daydream.text_table"] == table.encode()
        assert pq.read_schema(f).remove_metadata() == \
            schema.TABLES[table].schema.remove_metadata()
    # trace id is a content hash: the same bytes under another name are the same trace
    copy = tmp_path / "renamed.json.gz"
    copy.write_bytes(SMALL[0].read_bytes())
    rep2 = ingest([copy], Store(st), jobs=1)
    assert rep2.results[0].trace_id == tid and rep2.results[0].status == "exists"


def test_busy_store_without_wait_is_a_clear_error(tmp_path):
    st = Store(tmp_path / "s")
    with st.lock():
        p = subprocess.run([sys.executable, "-c",
                            "from daydream.ingest.store import Store; from pathlib import Path;"
                            f"s = Store(Path({str(st.root)!r}));"
                            "import contextlib\n"
                            "try:\n"
                            "    s.lock(wait=False).__enter__()\n"
                            "except Exception as e:\n"
                            "    print(type(e).__name__, e)\n"],
                           capture_output=True, text=True)
    assert "DaydreamError" in p.stdout and "another daydream process" in p.stdout


def test_a_store_of_another_activity_schema_is_refused_with_how_to_rebuild(tmp_path):
    """An activity table written by a daydream of another schema version (an older store)
    is not read as if it were this one's: every read names the file, both versions and the
    rebuild; `ingest --force` rebuilds it."""
    st = tmp_path / "s"
    rep = ingest(SMALL[:1], Store(st), jobs=1)
    tid = rep.results[0].trace_id
    f = st / "activity" / f"trace_id={tid}" / "kernel.parquet"
    old = pq.read_table(f)
    pq.write_table(old.replace_schema_metadata({b"daydream.schema_version": b"0",
                                                b"daydream.text_table": b"kernel"}), f)
    store = Store(st)
    with pytest.raises(DaydreamError, match=rf"trace_id={tid}/kernel.parquet has "
                       rf"activity schema version 0, this daydream reads version "
                       rf"{schema.SCHEMA_VERSION}; rebuild the store: run `daydream ingest "
                       r"--force` over its traces"):
        store.read("kernel", tid)
    # the look-only readers (DuckDB, for `daydream info`) refuse it alike
    with pytest.raises(DaydreamError, match=rf"trace_id={tid}/kernel.parquet has "
                       r"activity schema version 0, this daydream"):
        store.table_rows(tid)
    pq.write_table(old.replace_schema_metadata(None), f)  # no version at all
    with pytest.raises(DaydreamError, match=r"activity schema version \(none\)"):
        store.read("kernel", tid)
    with pytest.raises(DaydreamError, match=r"activity schema version \(none\)"):
        store.table_rows(tid)
    t = st / "activity" / f"trace_id={tid}" / "trace.parquet"
    row = pq.read_table(t)
    pq.write_table(row.replace_schema_metadata({b"daydream.schema_version": b"0"}), t)
    for read in (store._trace_row_arrow, store._trace_row_duckdb):
        with pytest.raises(DaydreamError, match=rf"trace_id={tid}/trace.parquet has "
                           r"activity schema version 0"):
            read(tid, None)
    pq.write_table(row, t)
    rep = ingest(SMALL[:1], Store(st), jobs=1, force=True)
    assert rep.results[0].status == "ingested"
    assert store.read("kernel", tid).equals(old.cast(schema.TABLES["kernel"].schema))


def test_trace_row_is_the_same_read_by_arrow_or_duckdb(tmp_path):
    """`trace_row` reads with pyarrow where a process has it (fleet workers) and with DuckDB
    where it has not (`daydream info`): both must give the same Python values, the stats'
    list of structs and the zoned ingest time included, whole or a few columns."""
    st = tmp_path / "s"
    rep = ingest(SMALL, Store(st), jobs=1)
    store = Store(st)
    for r in rep.results:
        for columns in (None, ["file", "devices", "world_size"], ["stats", "ingested_at"]):
            by_arrow = store._trace_row_arrow(r.trace_id, columns)
            by_duckdb = store._trace_row_duckdb(r.trace_id, columns)
            assert by_arrow == by_duckdb, (r.path, columns)
            assert list(by_arrow) == (columns or list(schema.TABLES["trace"].schema.names))
        assert by_duckdb["ingested_at"].utcoffset().total_seconds() == 0


def test_a_store_of_schema_version_1_reads_as_one_without_allocator_records(tmp_path):
    """Version 1 lacked the memory table and nothing else: a trace stored by it is read as
    one that recorded no allocator events, with no rebuild (its other tables as they were)."""
    import shutil

    st = tmp_path / "s"
    rep = ingest(SMALL[:1], Store(st), jobs=1)
    tid = rep.results[0].trace_id
    store = Store(st)
    kernels = store.read("kernel", tid)
    # what a version-1 store holds: the older layout, no memory table, every other file
    # marked version 1
    to_older_layout(st, tid)
    shutil.rmtree(st / "activity" / "memory" / f"trace_id={tid}")
    for table in schema.COMMIT_ORDER:
        f = st / "activity" / table / f"trace_id={tid}" / PART
        if f.exists():
            t = pq.read_table(f)
            md = dict(t.schema.metadata)
            md[b"daydream.schema_version"] = b"1"
            pq.write_table(t.replace_schema_metadata(md), f)
    old = Store(st)
    assert old.read("memory", tid).num_rows == 0
    assert old.read("memory", tid).schema.equals(schema.TABLES["memory"].schema)
    assert old.read("kernel", tid).equals(kernels)
    rows = old.table_rows(tid)
    assert rows["memory"] == 0 and rows["kernel"] == kernels.num_rows


def test_empty_tables_are_one_file_linked_and_read_back_as_written(tmp_path):
    """A batch writes each empty table's file once and hard-links it into every trace that has
    that table empty (ingest.store._link_empty): the same bytes as a file of its own; removing
    one trace leaves the others' files whole."""
    import os

    from daydream.ingest.store import _empty_parquet
    st = Store(tmp_path / "s")
    rep = ingest(SMALL, st, jobs=1)
    tids = [r.trace_id for r in rep.results]
    assert all(r.status == "ingested" for r in rep.results)
    empty = {}  # table -> the files of the traces that have it empty
    for tid in tids:
        for table in schema.COMMIT_ORDER:
            f = Path(st.file(table, tid))
            if pq.read_metadata(f).num_rows == 0:
                assert f.read_bytes() == _empty_parquet(table)
                assert st.read(table, tid).schema.equals(schema.TABLES[table].schema)
                empty.setdefault(table, []).append(f)
    shared = [fs for fs in empty.values() if len(fs) > 1]
    assert shared, "no table is empty in two of the traces"
    for fs in shared:
        assert len({os.stat(f).st_ino for f in fs}) == 1  # one file, linked
    assert not list(st.staging.iterdir())  # the batch's own copies are gone with it
    st.remove(tids[0])
    for fs in shared:
        for f in fs[1:]:
            assert f.read_bytes() == _empty_parquet(f.name.removesuffix(".parquet"))


def test_a_store_of_the_older_layout_reads_as_it_did_and_is_replaced_whole(tmp_path):
    """Stores written before keep a folder per table and trace (``to_older_layout``): every
    reader reads such a trace as it reads one of the current layout, beside traces of the
    current layout in the same store (SQL views included); sweeps drop the older layout's
    orphan partitions; re-ingesting such a trace with --force leaves it in the current
    layout, nothing of the older one behind."""
    from daydream.graphstore import sql_query

    root = tmp_path / "s"
    rep = ingest(SMALL, Store(root), jobs=1)
    tids = [r.trace_id for r in rep.results]
    st = Store(root)
    tables = {tid: {t: st.read(t, tid) for t in schema.COMMIT_ORDER} for tid in tids}
    rows = {tid: st.table_rows(tid) for tid in tids}
    trace_rows = {tid: st._trace_row_duckdb(tid, ["file", "events"]) for tid in tids}
    kernels_sql = sql_query.run_sql(root, "SELECT trace_id, count(*) AS n FROM kernel GROUP BY "
                                    "ALL ORDER BY ALL").to_pylist()
    old, *new = tids
    to_older_layout(root, old)
    assert (root / "activity" / "kernel" / f"trace_id={old}" / PART).exists()
    assert st.trace_ids() == sorted(tids) and all(st.has_trace(t) for t in tids)
    for tid in tids:
        for t in schema.COMMIT_ORDER:
            assert st.read(t, tid).equals(tables[tid][t]), (tid, t)
        assert st.table_rows(tid) == rows[tid]
        assert st._trace_row_duckdb(tid, ["file", "events"]) == trace_rows[tid]
        assert st._trace_row_arrow(tid, ["file", "events"]) == trace_rows[tid]
    assert sql_query.run_sql(root, "SELECT trace_id, count(*) AS n FROM kernel GROUP BY ALL "
                             "ORDER BY ALL").to_pylist() == kernels_sql
    # an orphan partition of the older layout (a killed commit of it), and a trace folder
    # without its trace row, are swept; the stored traces of either layout are not
    orphan = root / "activity" / "kernel" / "trace_id=0123456789abcdef0123"
    orphan.mkdir()
    (orphan / PART).write_bytes(b"")
    rowless = root / "activity" / "trace_id=fedcba9876543210fedc"
    rowless.mkdir()
    (rowless / "kernel.parquet").write_bytes(b"")
    with st.lock():
        assert st.sweep() == 2
    assert not orphan.exists() and not rowless.exists()
    assert st.trace_ids() == sorted(tids)
    assert st.read("kernel", old).equals(tables[old]["kernel"])
    rep = ingest(SMALL[:1], st, jobs=1, force=True)
    assert rep.results[0].status == "ingested" and rep.results[0].trace_id == old
    assert not any((root / "activity" / t / f"trace_id={old}").exists()
                   for t in schema.COMMIT_ORDER)
    assert (root / "activity" / f"trace_id={old}" / "kernel.parquet").exists()
    assert st.read("kernel", old).equals(tables[old]["kernel"])
    assert st.trace_ids() == sorted(tids)
