"""The activity store on disk: ``DIR/activity/trace_id=<id>/<table>.parquet``.

Writes never leave a half-written trace behind: a trace is converted into a private staging
folder, which is renamed into place whole; a trace exists once its folder does. Stores written
before keep the older layout, ``DIR/activity/<table>/trace_id=<id>/part-0.parquet`` (a folder
per table, renamed into place table by table, ``trace`` last: a trace of that layout exists
once its ``trace`` partition does), and every reader here reads both; table partitions
without a trace partition (left by a killed run) are swept at the next write. Commits and
sweeps hold an exclusive lock on ``DIR/.lock``, so two processes writing the same store take
turns instead of corrupting it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import io
import os
import shutil
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from daydream.base.errors import DaydreamError
from daydream.base.store import (
    ACTIVITY_DIR,
    COMMIT_ORDER,
    PART,
    SCHEMA_VERSION,
    TRACE_DIR_PREFIX,
    VERSION_KEY,
    duckdb_instance,
    fsync_dir,
    lock,
    write_parquet,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from daydream.ingest.converted import Converted

PARALLEL_ROWS = 200_000  # tables of a trace with fewer rows in all are written in turn
THREADED_READ_ROWS = 65_536  # a table file with fewer rows is read on this thread alone

# pyarrow (with numpy, a third of a second of start-up) is imported inside the functions that
# read or write Arrow tables: the commands that only look at the store (`daydream info`, `sql`)
# read it through DuckDB alone (``duckdb_instance``, ``Store.trace_row``, ``Store.table_rows``).

# each file's activity schema version as DuckDB reads it from the footers of the files ``?``
# names: the rows (file_name, version) that the look-only readers join to what they read
_VERSIONS_SQL = ("(SELECT file_name, decode(value) AS version FROM parquet_kv_metadata(?) "
                 f"WHERE key = '{VERSION_KEY}'::BLOB)")
# The activity schema versions this daydream reads: its own, and 1, which differs only in
# lacking the memory table (the allocator's records, version 2): a trace of version 1 reads as
# one that recorded none, so a store ingested before keeps working without a rebuild.
READABLE_VERSIONS = (str(SCHEMA_VERSION), "1")
ADDED_IN = {"memory": 2}  # tables a trace of an older version has none of


def table_file(folder: str | Path, table: str) -> str:
    """The file of TABLE in a trace's folder (a stored one, or one staged)."""
    return os.path.join(folder, f"{table}.parquet")


@dataclass(frozen=True)
class Store:
    root: Path

    @property
    def activity(self) -> Path:
        return self.root / ACTIVITY_DIR

    @property
    def staging(self) -> Path:
        return self.root / ".staging"

    def trace_dir(self, trace_id: str) -> str:
        """The folder of a trace's tables (a plain string: the driver of a fleet ingest asks
        for it at every commit, where pathlib's objects were much of its time per trace)."""
        return os.path.join(self.root, ACTIVITY_DIR, f"{TRACE_DIR_PREFIX}{trace_id}")

    def partition(self, table: str, trace_id: str) -> Path:
        """The folder of one table of a trace in the older layout (module doc)."""
        return Path(self._partition(table, trace_id))

    def _partition(self, table: str, trace_id: str) -> str:
        return os.path.join(self.root, ACTIVITY_DIR, table, f"{TRACE_DIR_PREFIX}{trace_id}")

    def has_trace(self, trace_id: str) -> bool:
        """Whether the trace is stored: its trace row's file, in either layout (``_find``)."""
        return self._find("trace", trace_id) is not None

    def trace_ids(self) -> list[str]:
        return sorted(set(self._trace_ids()) | set(self._older_layout_ids()))

    def _trace_ids(self) -> list[str]:
        """The stored traces' ids in the current layout."""
        if not self.activity.exists():
            return []
        return [e.name[len(TRACE_DIR_PREFIX):] for e in os.scandir(self.activity)
                if e.name.startswith(TRACE_DIR_PREFIX)
                and os.path.exists(table_file(e.path, "trace"))]

    def _older_layout_ids(self) -> list[str]:
        """The stored traces' ids in the older layout (those whose trace partition exists)."""
        d = self.activity / "trace"
        if not d.exists():
            return []
        return [p.name[len(TRACE_DIR_PREFIX):] for p in d.iterdir()
                if p.name.startswith(TRACE_DIR_PREFIX) and (p / PART).exists()]

    def _find(self, table: str, trace_id: str) -> str | None:
        """The file of one table of a stored trace, in whichever layout it is stored; None
        where there is none."""
        f = table_file(self.trace_dir(trace_id), table)
        if os.path.exists(f):
            return f
        f = os.path.join(self._partition(table, trace_id), PART)
        return f if os.path.exists(f) else None

    def read(self, table: str, trace_id: str) -> pa.Table:
        """One table of one trace, with its declared schema."""
        import pyarrow.parquet as pq

        from daydream.ingest import schema
        want = schema.TABLES[table].schema
        if self._older(table, trace_id):
            return want.empty_table()
        f = self._open(table, trace_id)
        rows = f.metadata.num_rows
        if rows:
            # a small file's read on Arrow's thread pool costs more than the read
            threads = rows >= THREADED_READ_ROWS
            found = f.schema_arrow
            if found.equals(want, check_metadata=True):
                return f.read(use_threads=threads)
            if _list_names_only(found, want):
                # Parquet names a list's items `element` (the trace table's stats); renaming
                # them back is a cast of the read table, where a read with a schema costs
                # several milliseconds per small file
                return f.read(use_threads=threads).cast(want)
        return pq.read_table(self.file(table, trace_id), schema=want)

    def table_rows(self, trace_id: str) -> dict[str, int]:
        """How many rows each table of one trace has (``COMMIT_ORDER``), from the footers,
        each checked to be of this activity schema version."""
        tables = [t for t in COMMIT_ORDER if not self._older(t, trace_id)]
        files = [self.file(t, trace_id) for t in tables]
        con = duckdb_instance().cursor()
        try:
            got = {f: (n, v) for f, n, v in con.execute(
                "SELECT m.file_name, m.num_rows, v.version FROM parquet_file_metadata(?) m "
                f"LEFT JOIN {_VERSIONS_SQL} v USING (file_name)", [files, files]
            ).fetchall()}
        finally:
            con.close()
        out = dict.fromkeys(COMMIT_ORDER, 0)
        for table, f in zip(tables, files, strict=True):
            n, version = got[f]
            self._check_version(f, version)
            out[table] = n
        return out

    def _older(self, table: str, trace_id: str) -> bool:
        """Whether TABLE is one the trace's activity schema version lacks (``ADDED_IN``): its
        trace is stored, the table's file is not (a commit of the older layout wrote the
        trace row last; one of the current layout writes every table at once)."""
        return (table in ADDED_IN and self._find(table, trace_id) is None
                and self.has_trace(trace_id))

    def file(self, table: str, trace_id: str) -> str:
        """The file of one table of a stored trace, in whichever layout it is stored."""
        path = self._find(table, trace_id)
        if path is None:
            raise DaydreamError(f"trace {trace_id} has no {table} table in {self.root}")
        return path

    def _check_version(self, path: str | Path, found: str | None) -> None:
        """A store written by a daydream of another activity schema is refused, not misread."""
        if found not in READABLE_VERSIONS:
            raise DaydreamError(
                f"{path} has activity schema version {found or '(none)'}, this daydream "
                f"reads version {SCHEMA_VERSION}; rebuild the store: run `daydream "
                f"ingest --force` over its traces (or delete {self.root} and ingest them "
                "again)")

    def _open(self, table: str, trace_id: str) -> pq.ParquetFile:
        """One table's file of one trace, opened once (its footer, then its data), checked to
        be of this activity schema version."""
        import pyarrow.parquet as pq
        path = self.file(table, trace_id)
        f = pq.ParquetFile(path)
        found = (f.metadata.metadata or {}).get(VERSION_KEY.encode())
        self._check_version(path, None if found is None else found.decode(errors="replace"))
        return f

    def trace_row(self, trace_id: str, columns: list[str] | None = None) -> dict:
        """The trace's row of the ``trace`` table as Python values (only ``columns`` when
        given: what every fleet worker reads of each trace). Read by the engine the process
        has already paid for: pyarrow where it is imported (a read ~0.8 ms, against DuckDB's
        ~2.5 ms of fixed cost per query, in every fleet worker), otherwise DuckDB, so that
        `daydream info` never imports pyarrow (~0.3 s of its start-up). Both give the same
        values (tests/ingest/test_store.py)."""
        if "pyarrow" in sys.modules:
            return self._trace_row_arrow(trace_id, columns)
        return self._trace_row_duckdb(trace_id, columns)

    def _trace_row_arrow(self, trace_id: str, columns: list[str] | None) -> dict:
        # as the file holds it: conforming it to the declared schema (``read``) would only
        # rename its list fields (Parquet's "element" for Arrow's "item")
        return self._open("trace", trace_id).read(columns=columns).to_pylist()[0]

    def _trace_row_duckdb(self, trace_id: str, columns: list[str] | None) -> dict:
        path = self.file("trace", trace_id)
        picked = ", ".join(f'"{c}"' for c in columns) if columns else "*"
        con = duckdb_instance().cursor()
        try:
            # the file's schema version with the row; ingested_at (TIMESTAMPTZ, which DuckDB
            # converts to Python through pytz) read as UTC
            cur = con.execute(
                f"SELECT {picked}, (SELECT version FROM {_VERSIONS_SQL}) AS _version FROM "
                "(SELECT * REPLACE (ingested_at::TIMESTAMP AS ingested_at) FROM "
                "read_parquet(?, hive_partitioning = false))", [path, path])
            names = [c[0] for c in cur.description]
            row = dict(zip(names, cur.fetchall()[0], strict=True))
        finally:
            con.close()
        self._check_version(path, row.pop("_version"))
        if "ingested_at" in row:
            row["ingested_at"] = row["ingested_at"].replace(tzinfo=dt.UTC)
        return row

    def lock(self, wait: bool = True) -> contextlib.AbstractContextManager[None]:
        """Exclusive writer lock (base.store.lock)."""
        return lock(self.root, wait)

    def new_staging_dir(self) -> Path:
        d = self.staging / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        d.mkdir(parents=True)
        return d

    def sweep(self) -> int:
        """Remove what killed runs left behind. Call with the lock held. Returns items removed."""
        removed = 0
        if self.staging.exists():
            for d in self.staging.iterdir():
                pid = d.name.split("-", 1)[0]
                if not (pid.isdigit() and _alive(int(pid))):
                    shutil.rmtree(d, ignore_errors=True)
                    removed += 1
        if self.activity.exists():
            for e in os.scandir(self.activity):
                # a trace folder a removal moved aside (``remove``), or one without its trace
                # row, which no commit makes (a commit renames a folder of every table)
                if e.name.startswith(".old-") or (e.name.startswith(TRACE_DIR_PREFIX) and not
                                                  os.path.exists(table_file(e.path, "trace"))):
                    shutil.rmtree(e.path, ignore_errors=True)
                    removed += 1
        # the older layout: table partitions of a trace whose trace partition is not there
        live = set(self._older_layout_ids())
        for table in COMMIT_ORDER:
            d = self.activity / table
            if not d.exists():
                continue
            for p in d.iterdir():
                if p.name.startswith("trace_id="):
                    tid = p.name.split("=", 1)[1]
                    if tid not in live:
                        shutil.rmtree(p, ignore_errors=True)
                        removed += 1
                elif p.name.startswith(".old-"):
                    shutil.rmtree(p, ignore_errors=True)
                    removed += 1
        return removed

    def commit(self, trace_id: str, staged: Path, force: bool) -> bool:
        """Move a staged trace (a folder of ``table_file``s, one per table) into place, one
        rename. Returns False when it already existed (no-op). Paths are plain strings: the
        driver of a fleet ingest commits every trace, and pathlib's objects were much of its
        time per small trace."""
        with self.lock():
            if self.has_trace(trace_id):
                if not force:
                    shutil.rmtree(staged, ignore_errors=True)
                    return False
                self.remove(trace_id)
            else:
                self._sweep_tables(trace_id)
            dst = self.trace_dir(trace_id)
            try:
                os.replace(staged, dst)
            except FileNotFoundError:  # the store's first trace: no activity folder yet
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                os.replace(staged, dst)
            fsync_dir(os.path.dirname(dst))
            return True

    def _sweep_tables(self, trace_id: str) -> None:
        """Drop the older layout's table partitions of ``trace_id``, which is not stored (what
        a killed commit of that layout left), so that its rows never show beside the trace's
        own (the SQL views read both layouts)."""
        for table in COMMIT_ORDER:
            p = self._partition(table, trace_id)
            if os.path.exists(p):
                shutil.rmtree(p)

    def remove(self, trace_id: str) -> None:
        """Delete a trace, never visible half-deleted: its folder moved aside in one rename
        (then deleted), or, in the older layout, its trace row first."""
        d = self.trace_dir(trace_id)
        if os.path.exists(d):
            tomb = os.path.join(self.activity, f".old-{trace_id}-{uuid.uuid4().hex[:6]}")
            os.replace(d, tomb)
            shutil.rmtree(tomb, ignore_errors=True)
        for table in reversed(COMMIT_ORDER):
            p = self.partition(table, trace_id)
            if p.exists():
                tomb = p.parent / f".old-{trace_id}-{uuid.uuid4().hex[:6]}"
                os.replace(p, tomb)
                shutil.rmtree(tomb, ignore_errors=True)


def _list_names_only(found: pa.Schema, want: pa.Schema) -> bool:
    """FOUND is WANT but for the names of list items (and nothing a cast would convert)."""
    import pyarrow as pa
    if found.names != want.names or found.metadata != want.metadata:
        return False
    for a, b in zip(found, want, strict=True):
        if a.equals(b):
            continue
        if not (pa.types.is_list(a.type) and pa.types.is_list(b.type)
                and a.nullable == b.nullable and a.type.value_field.nullable
                == b.type.value_field.nullable and a.type.value_type.equals(b.type.value_type)):
            return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def devices_of(text: str | None) -> list[dict] | None:
    """The device properties a trace row holds (its ``devices`` column, JSON text that
    ``trace_table`` wrote); None where the trace lists none."""
    return orjson.loads(text) if text else None


def trace_table(conv: Converted, file: str, file_bytes: int, job: str | None) -> pa.Table:
    import pyarrow as pa

    from daydream.ingest import schema
    meta = orjson.dumps(conv.metadata, option=orjson.OPT_NON_STR_KEYS, default=str).decode()
    row = {
        "file": [file],
        "source_format": [conv.source_format],
        "source_version": [conv.source_version],
        "file_bytes": [file_bytes],
        "events": [conv.events],
        "start_ns": [conv.start_ns],
        "end_ns": [conv.end_ns],
        "devices": [None if conv.devices is None else orjson.dumps(conv.devices).decode()],
        "rank": [conv.rank],
        "world_size": [conv.world_size],
        "job": [job],
        "metadata": [meta],
        "stats": [conv.stats.rows()],
        "ingested_at": [dt.datetime.now(dt.UTC)],
    }
    return pa.Table.from_pydict(row, schema=schema.TRACE.schema)


def write_staged(conv: Converted, staged: Path, file: str, file_bytes: int,
                 job: str | None, written: list | None = None,
                 empties: Path | None = None) -> dict[str, pa.Table]:
    """Write every table of a converted trace into the folder ``staged`` (made by the caller;
    ``table_file``). Returns the tables as written (with their declared schemas). Large
    tables are written on threads (Parquet encoding and compression run without the GIL),
    the largest first. Given a list ``written``, it returns as soon as the threads have
    started and appends a function that waits for them (and raises what they raised): the
    caller builds the graph meanwhile.
    ``empties``: a folder on the staging's file system, private to this process, where the
    file of each empty table is written once and hard-linked from (``_link_empty``)."""
    from daydream.ingest import schema
    out = {}
    tables = dict(conv.tables)
    tables["trace"] = trace_table(conv, file, file_bytes, job)
    for name in schema.COMMIT_ORDER:
        t = tables.get(name)
        if t is None:
            t = schema.empty(name)
        t = t.cast(schema.TABLES[name].schema) if t.schema != schema.TABLES[name].schema else t
        out[name] = t

    def write(name: str) -> None:
        f = table_file(staged, name)
        if not out[name].num_rows:  # most small traces have a few empty tables
            if empties is None or not _link_empty(empties, name, f):
                Path(f).write_bytes(_empty_parquet(name))
            return
        write_parquet(out[name], f)

    if sum(t.num_rows for t in out.values()) < PARALLEL_ROWS:
        for name in out:
            write(name)
        if written is not None:
            written.append(lambda: None)
    else:
        # (nbytes walks every dictionary: only worth it where the order matters)
        order = sorted(out, key=lambda name: -out[name].nbytes)
        pool = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1))
        futs = [pool.submit(write, name) for name in order]
        pool.shutdown(wait=False)

        def wait() -> None:
            for f in futs:
                f.result()

        if written is None:
            wait()
        else:
            written.append(wait)
    return out


def _link_empty(empties: Path, name: str, dst: str) -> bool:
    """Make DST a hard link to the file of the empty table NAME kept in EMPTIES (written there
    first where missing): the same bytes as ``_empty_parquet``'s, without a new inode, which
    a file system may take long to find (``base.store.TRACE_DIR_PREFIX``). A store's files
    are never written in place (a commit renames folders, a removal unlinks), so the traces
    that share the file never see each other's. False where
    the file system has no hard links (the caller writes the file)."""
    src = empties / f"{name}.parquet"
    try:
        os.link(src, dst)
        return True
    except FileNotFoundError:
        pass
    except OSError:
        return False
    try:
        empties.mkdir(parents=True, exist_ok=True)
        tmp = empties / f".{name}.{uuid.uuid4().hex[:8]}"
        tmp.write_bytes(_empty_parquet(name))
        os.replace(tmp, src)
        os.link(src, dst)
        return True
    except OSError:
        return False


@functools.cache
def _empty_parquet(name: str) -> bytes:
    """The Parquet file of an empty table NAME (its declared schema), encoded once."""
    from daydream.ingest import schema
    buf = io.BytesIO()
    write_parquet(schema.empty(name), buf)
    return buf.getvalue()
