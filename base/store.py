"""The store's root and layout, and the plumbing every stage writes and reads it with: the
process's DuckDB instance, Parquet writing, fsync of a folder, the writer lock.

A store is one folder (``DEFAULT_STORE`` unless told otherwise): ``activity/trace_id=<id>/
<table>.parquet`` (ingest's activity tables; stores written before hold them as ``activity/
<table>/trace_id=<id>/part-0.parquet``, which is still read), ``graph.duckdb`` and ``graph/``
(graphstore's), ``.staging/`` (what a run writes before it commits) and ``.lock`` (held by a
writer). Nothing here imports pyarrow or DuckDB at import time: the commands that only look at
the store start without them.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import io
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from daydream.base.errors import DaydreamError

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

# The store folder commands use unless told otherwise (here, where importing it costs nothing:
# the CLI names it in its options before anything heavy is imported).
DEFAULT_STORE = Path(".daydream")

# The activity store's layout, here where a reader of the store imports it without pyarrow
# (ingest.schema, which declares the tables' Arrow types, re-exports them): the schema version
# every table's file carries, and the activity tables in the order the older layout committed
# them, ``trace`` last, so that a trace was visible only once all of its tables were in place.
SCHEMA_VERSION = 2  # 2: the memory table (the allocator's records)
VERSION_KEY = "daydream.schema_version"  # the footer key each table's file carries it under
COMMIT_ORDER = ("kernel", "memcpy", "memset", "api", "sync", "range", "flow", "memory",
                "trace")
ACTIVITY_DIR = "activity"  # DIR/activity/: the activity tables
# A trace's tables are the files of one folder, DIR/activity/trace_id=<id>/<table>.parquet,
# renamed into place whole: a trace is stored once that folder is. Folders are what a store
# makes most of, and on ext4 a new inode costs a scan past every one freed in the last seconds
# (some 0.7 ms each after a store was deleted): one folder per trace where the older layout
# made one per table and trace halves the inodes a small trace makes (17 to 8).
TRACE_DIR_PREFIX = "trace_id="
# The older layout, which stores written before keep and every reader still reads: a folder
# per table and trace, DIR/activity/<table>/trace_id=<id>/part-0.parquet, committed table by
# table (``COMMIT_ORDER``).
PART = "part-0.parquet"
LOCK_FILE = ".lock"  # DIR/.lock: held by the one process writing the store

DUCKDB_MEMORY_LIMIT = "1GB"

_INSTANCE: tuple[int, duckdb.DuckDBPyConnection] | None = None
_INSTANCE_LOCK = threading.Lock()

def duckdb_instance() -> duckdb.DuckDBPyConnection:
    """This process's in-memory DuckDB instance (graphstore.db attaches the graph to it). A new
    instance costs about 30 ms of CPU (its catalog of built-in functions): made once (an
    ingest has it made on a thread while it converts)."""
    global _INSTANCE
    import duckdb
    with _INSTANCE_LOCK:
        if _INSTANCE is None or _INSTANCE[0] != os.getpid():  # a forked child makes its own
            # a bounded buffer pool: the graph of a 1 GB trace is written within the memory
            # budget of ingest (DuckDB spills to its temp directory past it)
            _INSTANCE = (os.getpid(), duckdb.connect(
                ":memory:", config={"memory_limit": DUCKDB_MEMORY_LIMIT}))
        return _INSTANCE[1]


def close_duckdb_instance() -> None:
    """Close this process's DuckDB instance, if it made one: what DuckDB spilled to its
    temporary directory goes with it (for a process that ends without the interpreter's
    teardown, which would close it)."""
    global _INSTANCE
    if _INSTANCE is not None and _INSTANCE[0] == os.getpid():
        _INSTANCE[1].close()
    _INSTANCE = None


# Stores whose writer lock the threads of this process share (``shared_between_threads``):
# root -> [the lock file's descriptor while held, holders]
_SHARED: dict[str, list] = {}
_SHARED_GUARD = threading.Lock()


@contextlib.contextmanager
def lock(root: Path, wait: bool = True) -> Iterator[None]:
    """The store's exclusive writer lock. With ``wait=False`` a busy store is an error. Two
    threads of one process exclude each other too, unless the store's lock is shared between
    them (``shared_between_threads``)."""
    with _SHARED_GUARD:
        shared = _SHARED.get(os.path.abspath(root)) if _SHARED else None
        held = shared is not None and shared[0] is not None  # by a thread of this process
        if held:
            shared[1] += 1
    if held:
        try:
            yield
        finally:
            _release_shared(shared)
        return
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK_FILE, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        flags = fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            raise DaydreamError(f"store {root} is being written by another daydream "
                                "process; try again when it has finished") from None
        if shared is not None:
            with _SHARED_GUARD:
                if shared[0] is None:
                    shared[0], shared[1], fd = fd, 1, None  # closed by the last holder
            if fd is None:
                try:
                    yield
                finally:
                    _release_shared(shared)
                return
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _release_shared(shared: list) -> None:
    with _SHARED_GUARD:
        shared[1] -= 1
        fd = shared[0] if shared[1] == 0 else None
        if fd is not None:
            shared[0] = None
    if fd is not None:
        os.close(fd)


@contextlib.contextmanager
def shared_between_threads(root: Path) -> Iterator[None]:
    """While inside, the threads of this process share ``root``'s writer lock: one that asks
    for it while another holds it goes on at once (other processes still wait for both). For a
    writer whose threads write disjoint parts of the store: a batch ingest's driver commits
    traces' activity tables while a thread of it writes earlier traces' graphs to DuckDB, each
    under the lock, and neither waits for the other."""
    key = os.path.abspath(root)
    with _SHARED_GUARD:
        if key in _SHARED:  # nested: the outer one shares it already
            outer = True
        else:
            outer = False
            _SHARED[key] = [None, 0]
    try:
        yield
    finally:
        if not outer:
            with _SHARED_GUARD:
                _SHARED.pop(key, None)


def fsync_dir(d: Path | str) -> None:
    """Make a rename inside D durable (its directory entry on disk); best effort."""
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


WRITE_BATCH_ROWS = 8192  # rows handed to the Parquet encoders at a time (write_parquet)


def write_parquet(table: pa.Table, where: Path | io.BytesIO, **options) -> None:
    """Write a table of the store (activity or graph) as Parquet: LZ4, statistics,
    dictionary pages for string columns only, and integer columns delta-encoded. LZ4 rather
    than zstd: a fleet's small traces write some six files each, which zstd took 0.9 ms apiece
    to encode and LZ4 0.55 ms, at the same size (3,000 of them, encoded in memory); on a
    million-task graph LZ4 writes 13% and reads 38% faster, in files 9% larger. Arrow's
    default tries a dictionary for every column, and on integer columns of mostly distinct
    values (ids, times) it builds one only to give it up: that cost 2-3x the encoding CPU of
    a large trace's tables (0.75 s of 1.1 s for a million edges). Ids and times grow row by
    row, so their deltas encode in a third less time again and read back faster (by Arrow
    and DuckDB), in files a quarter to a fifth the size. The values read back are the same.
    Values go to the encoders WRITE_BATCH_ROWS at a time (Arrow's default is 1,024): the same
    files, about a tenth less encoding CPU on a million-row table."""
    import pyarrow.parquet as pq

    strings, deltas = _encodings(table.schema)
    pq.write_table(table, where, compression="lz4", write_statistics=True,
                   use_dictionary=list(strings), column_encoding=dict(deltas),
                   write_batch_size=WRITE_BATCH_ROWS, **options)


@functools.lru_cache(maxsize=64)
def _encodings(schema: pa.Schema) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """``write_parquet``'s encodings of a schema's columns: the string columns that get
    dictionary pages, and the integer columns delta-encoded (worked out once per schema: a
    store writes the same few schemas for every trace)."""
    import pyarrow as pa

    strings = tuple(f.name for f in schema
                    if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
                    or pa.types.is_dictionary(f.type))
    deltas = tuple((f.name, "DELTA_BINARY_PACKED") for f in schema if pa.types.is_integer(f.type))
    return strings, deltas
