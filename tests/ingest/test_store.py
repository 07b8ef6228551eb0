"""The activity store: layout, schema metadata, the writer lock, a store of another schema, and
its trace rows, through ingest's own entry point (the whole tool's re-ingest and killed runs:
tests/daydream/test_store.py)."""

from __future__ import annotations

import subprocess
import sys

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


def test_layout_and_schema_version(tmp_path):
    st = tmp_path / "s"
    rep = ingest(SMALL[:1], Store(st), jobs=1)
    tid = rep.results[0].trace_id
    for table in schema.COMMIT_ORDER:
        f = st / "activity" / table / f"trace_id={tid}" / PART
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
    f = st / "activity" / "kernel" / f"trace_id={tid}" / PART
    old = pq.read_table(f)
    pq.write_table(old.replace_schema_metadata({b"daydream.schema_version": b"0",
                                                b"daydream.text_table": b"kernel"}), f)
    store = Store(st)
    with pytest.raises(DaydreamError, match=rf"kernel/trace_id={tid}/part-0.parquet has "
                       rf"activity schema version 0, this daydream reads version "
                       rf"{schema.SCHEMA_VERSION}; rebuild the store: run `daydream ingest "
                       r"--force` over its traces"):
        store.read("kernel", tid)
    # the look-only readers (DuckDB, for `daydream info`) refuse it alike
    with pytest.raises(DaydreamError, match=rf"kernel/trace_id={tid}/part-0.parquet has "
                       r"activity schema version 0, this daydream"):
        store.table_rows(tid)
    pq.write_table(old.replace_schema_metadata(None), f)  # no version at all
    with pytest.raises(DaydreamError, match=r"activity schema version \(none\)"):
        store.read("kernel", tid)
    with pytest.raises(DaydreamError, match=r"activity schema version \(none\)"):
        store.table_rows(tid)
    t = st / "activity" / "trace" / f"trace_id={tid}" / PART
    row = pq.read_table(t)
    pq.write_table(row.replace_schema_metadata({b"daydream.schema_version": b"0"}), t)
    for read in (store._trace_row_arrow, store._trace_row_duckdb):
        with pytest.raises(DaydreamError, match=rf"trace/trace_id={tid}/part-0.parquet has "
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
    # what a version-1 store holds: no memory table, every other file marked version 1
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
            f = st.partition(table, tid) / PART
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
            assert f.read_bytes() == _empty_parquet(f.parent.parent.name)
