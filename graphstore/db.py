"""The DuckDB side of the graph store: ``DIR/graph.duckdb``.

It holds the five graph tables declared in :mod:`graphstore.schema` (DDL generated from those
declarations, with their docs as ``COMMENT``\\s), a ``meta`` table with the graph schema version,
and views that make the common questions one SELECT away (see ``VIEWS`` and docs/sql.md).

Concurrency. DuckDB allows one process to open a database file read-write, or any number of
processes to open it read-only, never both at once (the file carries an OS lock). So:

- writers (:func:`write_trace`, :func:`delete_trace`) first take the store's writer lock
  (``base.store.lock``, so two writers take turns), then open the file read-write only for
  the one transaction that replaces a trace's rows, and close it at once;
- readers (:func:`connect`, and graphstore.sql_query's queries) open it read-only for one query
  and close it.

A connection that finds the file locked by the other side waits and retries (up to
``timeout_s``), so a query issued while an ingest is writing simply waits for the current
trace's transaction to finish, and a writer waits for running queries. Each ``write_trace`` is
one transaction: a reader sees a trace entirely before or entirely after it.

Large graphs (``PARQUET_ROWS`` tasks and edges or more) are not inserted into DuckDB: inserting
a million rows costs seconds of CPU, encoding them as Parquet a fraction of it. Their six
tables are written as Parquet files into a staging folder, and the folder is renamed into place
as ``DIR/graph/trace_id=<id>/`` (one rename: all six tables or none) while the writer holds
the database read-write, so no reader is between its open and close meanwhile. Every
connection that reads finds them through temporary views that union the DuckDB tables with
the Parquet files (:func:`_graph_views`), so SQL, the views and ``graphstore.read`` see one
set of tables. A trace's graph is in one place or the other, never both: a writer moves the
old one out before the new one becomes visible, so a kill between leaves the trace without a
graph (the next ingest builds it, ``graphstore.load.missing``), never with two.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from daydream.base.errors import DaydreamError
from daydream.base.store import (
    DUCKDB_MEMORY_LIMIT,
    duckdb_instance,
    fsync_dir,
    write_parquet,
)
from daydream.graphstore.schema import (
    CPU_KINDS,
    GPU_KINDS,
    GRAPH_SCHEMA_VERSION,
    GRAPH_TABLES,
    RESULT_TABLES,
    GTable,
)
from daydream.ingest.store import Store

# duckdb (~0.1 s of start-up) is imported by the functions that open a database: a fleet
# ingest's workers import this module for the graph tables' layout and never open one.
if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

DB_FILE = "graph.duckdb"
META_KEY = "graph_schema_version"
# Stores of these versions hold the same tables as this one: readers read them as they are; a
# writer migrates them (migrate_parquet_graphs and migrate_result_tables, then the version
# stamped). Version 5 has no Parquet graphs; version 6's task.parquet files hold name, layer and
# phase as plain strings; before version 8 the prediction table lacks the interval and gates.
MIGRATES_FROM = ("5", "6", "7")
# task columns stored as Arrow dictionaries since version 7: a store whose files disagree on
# them would not scan as one dataset in Polars (Categorical against String)
DICTIONARY_TASK_COLUMNS = ("name", "layer", "phase")
GRAPH_DIR = "graph"  # DIR/graph/trace_id=<id>/<table>.parquet: large graphs (PARQUET_ROWS)
# Graphs with at least this many task and edge rows are stored as Parquet, not inserted (the
# environment variable lets the fault tests run every graph through that path).
PARQUET_ROWS = int(os.environ.get("DAYDREAM_GRAPH_PARQUET_ROWS", "100000"))
VERSION_KEY = b"daydream.graph_schema_version"
# The order write_trace fills the tables in (the order is only for error messages: it is one
# transaction).
WRITE_ORDER = ("task", "edge", "unit", "iteration", "layer", "slack")
DEFAULT_TIMEOUT_S = 60.0
# Rows per DuckDB row group in what a writer adds (ATTACH's ROW_GROUP_SIZE; DuckDB's default is
# 122,880). A commit rewrites the table's last, partly filled row group whole, so with the
# default a batch of a fleet's small graphs paid for recompressing up to 122,880 old rows per
# table: 100 BERT-small graphs (4,000 tasks and edges each) written in batches of 49, 25, 12
# and 6 took 0.42, 0.21, 0.12 and 0.37 s (that last one filled a row group), and 0.27, 0.16,
# 0.08 and 0.05 s with this size. The tables hold small graphs only (large ones are Parquet,
# PARQUET_ROWS), which a fleet's reads (64 DLRM graphs) took the same CPU to read; the file
# is larger (100 DLRM graphs ingested: 18.6 MB against 15.0 MB).
ROW_GROUP_ROWS = 16_384
# Each trace's graph is stamped in ``meta`` (key RULES_KEY + trace id) with the graph rules
# that built it (``graph_rules``): a graph built by other rules (an older daydream's, or one
# written before the stamp) is stale, and the commands that use it rebuild it from its
# activity tables first (``graphstore.load.missing``), so an upgrade's model changes reach the
# traces stored before it.
RULES_KEY = "graph_rules:"
# the traces that have a graph (``trace_ids``): rows in task or iteration, Parquet ones included
# through the views of a read-only connection
_GRAPH_IDS = "SELECT trace_id FROM task UNION SELECT trace_id FROM iteration"
# The modules whose code decides a stored graph (graphstore.load builds it with them; the
# latencies and rules are constants in them), files beside this one, and ingest's thread key
RULE_MODULES = ("build.py", "calls.py", "check.py", "labels.py", "latency.py", "load.py",
                "params.py", "schema.py", "../ingest/nesting.py", "../base/occupancy.py")

_GPU = ", ".join(f"'{k}'" for k in GPU_KINDS)
_CPU = ", ".join(f"'{k}'" for k in CPU_KINDS)


def db_path(store_root: str | Path) -> Path:
    return Path(store_root) / DB_FILE


_RULES: list[str] = []


def graph_rules() -> str:
    """The graph rules of this daydream: a hash of the code that builds graphs (RULE_MODULES),
    so that no change to it can be left out of the stamp by a forgotten version number (a
    change to a comment there costs a rebuild, milliseconds to a second a trace, never a
    stale graph); where the sources are not installed, the package's version."""
    if not _RULES:
        try:
            _RULES.append(rules_fingerprint(Path(__file__).resolve().parent))
        except OSError:
            from importlib.metadata import PackageNotFoundError, version
            try:
                _RULES.append(f"daydream {version('daydream')}")
            except PackageNotFoundError:
                _RULES.append("unknown")
    return _RULES[0]


def current_ids(store_root: str | Path, trace_ids: Iterable[str]) -> set[str]:
    """Those of ``trace_ids`` whose graph is stored and was built by this daydream's graph
    rules (one read-only connection; a query per trace, not over every trace's rows)."""
    want = list(trace_ids)
    with connect(store_root) as con:
        stamps = dict(con.execute("SELECT key, value FROM meta WHERE key IN "
                                  "(SELECT ? || unnest(?))", [RULES_KEY, want]).fetchall())
        rules = graph_rules()
        return {t for t in want if stamps.get(RULES_KEY + t) == rules and has_graph(con, t)}


def rules_fingerprint(graphstore_dir: Path) -> str:
    """The hash of the RULE_MODULES found beside ``graphstore_dir`` (``graph_rules``)."""
    h = hashlib.blake2b(digest_size=8)
    for m in RULE_MODULES:
        h.update((graphstore_dir / m).read_bytes())
    return h.hexdigest()


def graph_stamps(store_root: str | Path) -> dict[str, str | None]:
    """Every stored graph (``trace_ids``) and the graph rules that built it (None: no stamp, a
    store written before it), read on one connection."""
    if not db_path(store_root).exists():
        return {}
    with connect(store_root) as con:
        have = [r[0] for r in con.execute(_GRAPH_IDS).fetchall()]
        stamps = dict(con.execute("SELECT key, value FROM meta WHERE starts_with(key, ?)",
                                  [RULES_KEY]).fetchall())
    return {t: stamps.get(RULES_KEY + t) for t in have}


def stale_ids(store_root: str | Path, trace_ids: list[str] | None = None) -> set[str]:
    """Traces (of ``trace_ids``, else all) whose graph is stored but was built by other graph
    rules than this daydream's (``graph_rules``), or carries no stamp (a store written before
    the stamp)."""
    want = None if trace_ids is None else set(trace_ids)
    rules = graph_rules()
    return {t for t, r in graph_stamps(store_root).items()
            if r != rules and (want is None or t in want)}


# --------------------------------------------------------------------------------------------
# Views. Times are the observed ones (start_ns, start_ns + obs_dur_ns): the views describe the
# trace as it ran; task.dur_ns is the simulator's input and differs only for blocking calls.

VIEWS: dict[str, tuple[str, str]] = {
    "kernel_timeline": ("GPU tasks (kernel, memcpy, memset, comm) with their unit, launch lag "
                        "and the idle gap before them on their unit.", f"""
WITH gpu AS (
  SELECT t.trace_id, t.task_id, t.iteration, t.layer, t.phase, t.kind, t.unit_id,
         u.name AS unit, u.device, u.stream, t.name,
         t.start_ns, t.start_ns + t.obs_dur_ns AS end_ns, t.obs_dur_ns AS dur_ns,
         t.bytes, t.correlation
  FROM task t JOIN unit u ON u.trace_id = t.trace_id AND u.unit_id = t.unit_id
  WHERE t.kind IN ({_GPU})
),
launch AS (
  SELECT e.trace_id, e.dst AS task_id,
         arg_max(e.src, a.start_ns + a.obs_dur_ns) AS launch_task_id,
         max(a.start_ns + a.obs_dur_ns) AS launch_end_ns
  FROM edge e JOIN task a ON a.trace_id = e.trace_id AND a.task_id = e.src
  WHERE e.kind = 'launch'
  GROUP BY e.trace_id, e.dst
)
SELECT g.trace_id, g.task_id, g.iteration, g.layer, g.phase, g.kind, g.unit_id, g.unit,
       g.device, g.stream, g.name, g.start_ns, g.end_ns, g.dur_ns, g.bytes, g.correlation,
       l.launch_task_id,
       g.start_ns - l.launch_end_ns AS launch_lag_ns,
       g.start_ns - lag(g.end_ns) OVER (PARTITION BY g.trace_id, g.unit_id
                                        ORDER BY g.start_ns, g.task_id) AS idle_before_ns
FROM gpu g LEFT JOIN launch l ON l.trace_id = g.trace_id AND l.task_id = g.task_id
"""),
    "layer_time": ("Per trace, iteration, layer and phase: GPU time, CPU time (api and host "
                   "tasks) and task counts.", f"""
SELECT trace_id, iteration, layer, phase,
       coalesce(sum(obs_dur_ns) FILTER (WHERE kind IN ({_GPU})), 0)::BIGINT AS gpu_ns,
       coalesce(sum(obs_dur_ns) FILTER (WHERE kind IN ({_CPU})), 0)::BIGINT AS cpu_ns,
       count(*) AS tasks,
       count(*) FILTER (WHERE kind IN ({_GPU})) AS gpu_tasks,
       count(*) FILTER (WHERE kind IN ({_CPU})) AS cpu_tasks,
       count(*) FILTER (WHERE kind = 'kernel') AS kernels
FROM task
GROUP BY trace_id, iteration, layer, phase
"""),
    # GPU busy time is the length of the union of the GPU task intervals on one device, clipped
    # to the iteration (summing durations double-counts overlapping streams): sort the intervals,
    # start a new island where an interval starts after everything before it has ended, and
    # add up the islands' spans.
    "iteration_device_time": ("Per trace, iteration and GPU: busy ns (union of the GPU task "
                              "intervals on its streams, clipped to the iteration) and idle ns.",
                              f"""
WITH dev AS (
  SELECT DISTINCT trace_id, device FROM unit WHERE kind = 'stream' AND device IS NOT NULL
),
clip AS (
  SELECT i.trace_id, i.iteration, u.device, t.task_id,
         greatest(t.start_ns, i.start_ns) AS s,
         least(t.start_ns + t.obs_dur_ns, i.end_ns) AS e
  FROM iteration i
  JOIN task t ON t.trace_id = i.trace_id
             AND t.start_ns < i.end_ns AND t.start_ns + t.obs_dur_ns > i.start_ns
  JOIN unit u ON u.trace_id = t.trace_id AND u.unit_id = t.unit_id
  WHERE t.kind IN ({_GPU}) AND u.kind = 'stream' AND u.device IS NOT NULL
),
reach AS (
  SELECT *, max(e) OVER (PARTITION BY trace_id, iteration, device ORDER BY s, e, task_id
                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach_ns
  FROM clip
),
island AS (
  SELECT *, sum(CASE WHEN reach_ns IS NULL OR s > reach_ns THEN 1 ELSE 0 END)
              OVER (PARTITION BY trace_id, iteration, device ORDER BY s, e, task_id
                    ROWS UNBOUNDED PRECEDING) AS island
  FROM reach
),
busy AS (
  SELECT trace_id, iteration, device, sum(span)::BIGINT AS busy_ns
  FROM (SELECT trace_id, iteration, device, max(e) - min(s) AS span
        FROM island GROUP BY trace_id, iteration, device, island) m
  GROUP BY trace_id, iteration, device
)
SELECT i.trace_id, i.iteration, d.device,
       i.end_ns - i.start_ns AS dur_ns,
       coalesce(b.busy_ns, 0)::BIGINT AS busy_ns,
       (i.end_ns - i.start_ns - coalesce(b.busy_ns, 0))::BIGINT AS idle_ns
FROM iteration i
JOIN dev d ON d.trace_id = i.trace_id
LEFT JOIN busy b ON b.trace_id = i.trace_id AND b.iteration = i.iteration
                AND b.device = d.device
"""),
    "iteration_time": ("Per trace and iteration: span, GPU busy and idle time summed over the "
                       "trace's GPUs, and the kernels and GPU tasks labelled with it.", f"""
WITH gpu AS (
  SELECT trace_id, iteration, count(*) AS devices,
         sum(busy_ns)::BIGINT AS gpu_busy_ns, sum(idle_ns)::BIGINT AS gpu_idle_ns
  FROM iteration_device_time GROUP BY trace_id, iteration
),
n AS (
  SELECT trace_id, iteration,
         count(*) FILTER (WHERE kind = 'kernel') AS kernels,
         count(*) AS gpu_tasks
  FROM task WHERE kind IN ({_GPU}) AND iteration IS NOT NULL
  GROUP BY trace_id, iteration
)
SELECT i.trace_id, i.iteration, i.label, i.start_ns, i.end_ns,
       i.end_ns - i.start_ns AS dur_ns,
       (i.end_ns - i.start_ns) / 1e6 AS dur_ms,
       coalesce(g.devices, 0) AS devices,
       coalesce(g.gpu_busy_ns, 0)::BIGINT AS gpu_busy_ns,
       coalesce(g.gpu_idle_ns, 0)::BIGINT AS gpu_idle_ns,
       g.gpu_busy_ns / nullif(g.devices * (i.end_ns - i.start_ns), 0) AS gpu_util,
       coalesce(n.kernels, 0) AS kernels,
       coalesce(n.gpu_tasks, 0) AS gpu_tasks
FROM iteration i
LEFT JOIN gpu g ON g.trace_id = i.trace_id AND g.iteration = i.iteration
LEFT JOIN n ON n.trace_id = i.trace_id AND n.iteration = i.iteration
"""),
}


# --------------------------------------------------------------------------------------------
# Schema


def sql_literal(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _meta_comment() -> str:
    """The comment of table ``meta``: it names the views the database holds by a fingerprint
    of their definitions, so a writer can tell that they are this daydream's."""
    views = hashlib.sha256(orjson.dumps(VIEWS)).hexdigest()
    return f"Daydream graph metadata (key, value); views {views}."


def create_schema(con: duckdb.DuckDBPyConnection, path: Path | None = None) -> None:
    """Create the graph tables, ``meta`` and the views on a read-write connection.

    An existing database must carry this version (:func:`check_version`); tables are created
    only where missing, views are replaced unless they are already this daydream's (so a newer
    daydream's views take over). A database that has it all is left as it is: every writer
    opens it, and rewriting its catalog each time (then checkpointing that on close) cost
    about a fifth of writing a 224k-task graph.
    """
    found = dict(con.execute(
        "SELECT table_name, comment FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main'").fetchall())
    tables = set(found)
    if tables:
        if check_version(con, path) in MIGRATES_FROM:
            if path is not None:
                migrate_parquet_graphs(path.parent)
            migrate_result_tables(con)
            con.execute("UPDATE meta SET value = ? WHERE key = ?",
                        [str(GRAPH_SCHEMA_VERSION), META_KEY])
        if (tables >= {"meta", *GRAPH_TABLES, *RESULT_TABLES}
                and found["meta"] == _meta_comment()):
            return
    con.execute("BEGIN")
    try:
        con.execute("CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
        con.execute("INSERT OR IGNORE INTO meta VALUES (?, ?)",
                    [META_KEY, str(GRAPH_SCHEMA_VERSION)])
        for t in (*GRAPH_TABLES.values(), *RESULT_TABLES.values()):
            con.execute(t.ddl())
            if t.name not in tables:
                _comment(con, t)
        for name, (doc, sql) in VIEWS.items():
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
            con.execute(f"COMMENT ON VIEW {name} IS {sql_literal(doc)}")
        con.execute(f"COMMENT ON TABLE meta IS {sql_literal(_meta_comment())}")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def table_columns(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    """The columns of the attached graph database's table ``table``, in order (none where
    it has no such table)."""
    return [c for (c,) in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND table_name = ? ORDER BY column_index", [table]).fetchall()]


def migrate_result_tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Rebuild each result table whose columns are not the declared ones (an older store's
    ``prediction`` before the interval and gates): its rows kept, the columns it lacks NULL,
    every column in the declared order and documented. One transaction per table; a table
    already rebuilt is left alone, so a writer killed midway leaves the old version stamped and
    the next one finishes the job. Returns the tables rebuilt."""
    done = []
    for t in RESULT_TABLES.values():
        have = table_columns(con, t.name)
        if not have or have == t.names:
            continue
        keep = ", ".join(c for c in t.names if c in have)
        con.execute("BEGIN")
        try:
            con.execute(f"ALTER TABLE {t.name} RENAME TO _old_{t.name}")
            con.execute(t.ddl())
            con.execute(f"INSERT INTO {t.name} ({keep}) SELECT {keep} FROM _old_{t.name}")
            con.execute(f"DROP TABLE _old_{t.name}")
            _comment(con, t)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        done.append(t.name)
    return done


def _comment(con: duckdb.DuckDBPyConnection, t: GTable) -> None:
    con.execute(f"COMMENT ON TABLE {t.name} IS {sql_literal(t.doc)}")
    for c in t.columns:
        con.execute(f"COMMENT ON COLUMN {t.name}.{c.name} IS {sql_literal(c.doc)}")


def _rebuild_hint(path: Path | str) -> str:
    return (f"rebuild the graph: delete {path} and run `daydream ingest --force` over the "
            "traces")


def check_version(con: duckdb.DuckDBPyConnection, path: Path | None = None) -> str:
    """Raise unless the database is a daydream graph of this version (or one it migrates);
    returns the version found."""
    import duckdb
    where = str(path) if path is not None else "the graph database"
    try:
        found = con.execute("SELECT value FROM meta WHERE key = ?", [META_KEY]).fetchall()
        row = found[0] if found else None
    except duckdb.CatalogException:
        row = None
    if row is None:
        raise DaydreamError(f"{where} is not a daydream graph (no meta table with "
                            f"{META_KEY}); {_rebuild_hint(where)}")
    if row[0] != str(GRAPH_SCHEMA_VERSION) and row[0] not in MIGRATES_FROM:
        raise DaydreamError(f"{where} has graph schema version {row[0]}, this daydream reads "
                            f"version {GRAPH_SCHEMA_VERSION}; {_rebuild_hint(where)}")
    return row[0]


# --------------------------------------------------------------------------------------------
# Connections


# One in-memory DuckDB instance per process (``ingest.store.duckdb_instance``), to which each
# connection attaches the store's file and detaches it when done. A new DuckDB instance costs
# about 30 ms of CPU (its catalog of built-in functions), an ATTACH about 2: the price of every
# short-lived connection, paid per chunk of graphs a fleet reads and per batch of results it
# writes. The file's lock is held from the ATTACH to the DETACH, exactly as a connection of its
# own held it.
_ATTACHED: dict[str, int] = {}  # path -> connections of this process that have it attached
_ATTACHED_PID = 0  # the process _ATTACHED counts for (a forked child attaches its own)
_SEQ = itertools.count()
_GUARD = threading.Lock()


def instance() -> duckdb.DuckDBPyConnection:
    global _ATTACHED_PID
    if _ATTACHED_PID != os.getpid():
        _ATTACHED.clear()
        _ATTACHED_PID = os.getpid()
    return duckdb_instance()


def _attach(path: Path, read_only: bool) -> tuple[duckdb.DuckDBPyConnection, str | None]:
    """A connection with ``path`` attached and in use, and its alias (None: a connection of
    its own, for a file this process has attached already)."""
    import duckdb
    key = str(path.resolve())
    with _GUARD:
        if _ATTACHED.get(key):
            return duckdb.connect(str(path), read_only=read_only,
                                  config={"memory_limit": DUCKDB_MEMORY_LIMIT}), None
        base = instance()
        alias = f"daydream_store_{next(_SEQ)}"
        con = base.cursor()
        try:
            # spill files beside the database, where a connection of its own puts them (a
            # directory already in use by this instance stays: DuckDB cannot switch it)
            with contextlib.suppress(duckdb.Error):
                con.execute(f"SET temp_directory = {sql_literal(str(path) + '.tmp')}")
            mode = " (READ_ONLY)" if read_only else f" (ROW_GROUP_SIZE {ROW_GROUP_ROWS})"
            con.execute(f"ATTACH {sql_literal(str(path))} AS {alias}{mode}")
        except BaseException:
            con.close()
            raise
        _ATTACHED[key] = 1
    con.execute(f"USE {alias}")
    return con, alias


def _detach(con: duckdb.DuckDBPyConnection, path: Path, alias: str | None) -> None:
    con.close()  # rolls back what it left open
    if alias is None:
        return
    with _GUARD:
        _ATTACHED.pop(str(path.resolve()), None)
        if _ATTACHED_PID == os.getpid():
            c = duckdb_instance().cursor()
            try:
                c.execute(f"DETACH {alias}")  # checkpoints a written file, then unlocks it
            finally:
                c.close()


def _open(path: Path, read_only: bool, timeout_s: float
          ) -> tuple[duckdb.DuckDBPyConnection, str | None]:
    """Open ``path``, waiting while another process holds a conflicting lock on it."""
    import duckdb
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        try:
            return _attach(path, read_only)
        except duckdb.IOException as e:
            msg = str(e)
            if "lock" not in msg.lower():
                raise DaydreamError(f"cannot open {path}: {first_line(msg)}") from None
            if time.monotonic() >= deadline:
                side = "written" if read_only else "read or written"
                raise DaydreamError(f"{path} is being {side} by another process (waited "
                                    f"{timeout_s:g} s); try again when it has finished") from None
        except duckdb.Error as e:
            raise DaydreamError(f"cannot open {path}: {first_line(str(e))}") from None
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


@contextlib.contextmanager
def connect(store_root: str | Path, read_only: bool = True,
            timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived connection to ``DIR/graph.duckdb``, closed on exit.

    Read-only (the default): the database must exist and carry this schema version. Read-write
    (writers only, with the store lock held): created with its tables and views where missing.
    Keep it open only as long as needed: while it is, other processes cannot write (or, for a
    read-write one, open) the file.
    """
    path = db_path(store_root)
    if read_only and not path.exists():
        raise DaydreamError(f"no graph in {store_root}: ingest traces first "
                            f"(`daydream ingest TRACE... --store {store_root}`)")
    if not read_only and not path.exists():
        _create(path)
    con, alias = _open(path, read_only, timeout_s)
    try:
        if read_only:
            check_version(con, path)
            _graph_views(con, Path(store_root))
        else:
            create_schema(con, path)
        yield con
    finally:
        _detach(con, path, alias)


def _create(path: Path) -> None:
    """Create the database with its tables and views under a temporary name, then rename it
    into place: a process killed meanwhile leaves no half-made graph.duckdb that readers
    would take for a broken graph (the caller holds the store's writer lock). One made ahead
    by :func:`prepare` is moved into place instead."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(path.name + ".new*"):
        stale.unlink(missing_ok=True)  # left by a writer killed while creating
    made = _take_prepared(path)
    if made is not None:
        os.replace(made, path)
        return
    tmp = path.with_name(path.name + ".new")
    _make_empty(tmp)
    os.replace(tmp, path)


def _make_empty(tmp: Path) -> None:
    """An empty graph database (tables, ``meta``, views) at ``tmp``, checkpointed."""
    import duckdb
    con = duckdb.connect(str(tmp))
    try:
        create_schema(con, tmp)
        con.execute("CHECKPOINT")
    finally:
        con.close()
    tmp.with_name(tmp.name + ".wal").unlink(missing_ok=True)  # checkpointed on close


# databases made ahead of their store's first write (prepare): graph.duckdb's path -> the
# thread making it and the file it makes
_PREPARED: dict[Path, tuple[threading.Thread, Path]] = {}


def prepare(store_root: str | Path, folder: Path) -> None:
    """Make the empty database of a store that has none yet on a thread, in ``folder`` (a
    staging folder of this process, inside the store: swept if the process dies), for
    :func:`_create` to move into place under the writer lock. An ingest calls it before it
    converts: making the database costs little CPU but waits for its checkpoint's fsync (half
    a second on a cold disk), which the conversion then hides."""
    path = db_path(store_root)
    if path.exists():
        return
    made = folder / DB_FILE

    def make() -> None:
        import duckdb
        part = folder / (DB_FILE + ".part")
        try:
            _make_empty(part)
            os.replace(part, made)  # whole, or not there at all
        except (duckdb.Error, OSError):
            pass  # _create makes its own

    t = threading.Thread(target=make, name="graph-db", daemon=True)
    t.start()
    _PREPARED[path.resolve()] = (t, made)


def _take_prepared(path: Path) -> Path | None:
    """The database :func:`prepare` made for ``path`` (waited for), or None."""
    job = _PREPARED.pop(path.resolve(), None)
    if job is None:
        return None
    job[0].join()
    return job[1] if job[1].exists() else None


def forget_prepared(store_root: str | Path) -> None:
    """Wait for a database :func:`prepare` is making for the store and drop it (the caller
    then removes its folder): an ingest that wrote no graph leaves no thread writing there."""
    _take_prepared(db_path(store_root))


def first_line(msg: str) -> str:
    return msg.strip().splitlines()[0] if msg.strip() else msg


# --------------------------------------------------------------------------------------------
# Large graphs as Parquet (see the module's docstring)


def parquet_root(store_root: str | Path) -> Path:
    return Path(store_root) / GRAPH_DIR


def parquet_partition(store_root: str | Path, trace_id: str) -> Path:
    return parquet_root(store_root) / f"trace_id={trace_id}"


def parquet_ids(store_root: str | Path) -> list[str]:
    """Traces whose graph is stored as Parquet, sorted. Read it with a connection open (a
    writer moves partitions only while it holds the database read-write)."""
    d = parquet_root(store_root)
    if not d.exists():
        return []
    return sorted(q.name.split("=", 1)[1] for q in d.iterdir() if q.name.startswith("trace_id="))


def migrate_parquet_graphs(store_root: str | Path) -> int:
    """Rewrite each Parquet task table that stores DICTIONARY_TASK_COLUMNS as plain strings
    (version 6) with them as dictionaries, as this version writes them; returns how many.
    The values are unchanged. Each file is replaced whole (written beside it, then renamed
    over it), and a file already rewritten is left alone: a writer killed midway leaves the
    old version stamped, and the next writer finishes the job. With the writer lock held."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    done = 0
    for trace_id in parquet_ids(store_root):
        f = parquet_partition(store_root, trace_id) / "task.parquet"
        if not f.exists():
            continue
        schema = pq.read_schema(f)
        if all(pa.types.is_dictionary(schema.field(c).type) for c in DICTIONARY_TASK_COLUMNS):
            continue
        t = _task_dictionaries(pq.read_table(f)).replace_schema_metadata(
            {VERSION_KEY: str(GRAPH_SCHEMA_VERSION)})
        tmp = f.with_name(f.name + ".migrating")
        write_parquet(t, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, f)
        fsync_dir(f.parent)
        done += 1
    return done


def _task_dictionaries(t: pa.Table) -> pa.Table:
    """A task table with DICTIONARY_TASK_COLUMNS as Arrow dictionaries (those that are not)."""
    import pyarrow as pa

    for c in DICTIONARY_TASK_COLUMNS:
        if not pa.types.is_dictionary(t.schema.field(c).type):
            t = t.set_column(t.schema.get_field_index(c), c,
                             t[c].combine_chunks().dictionary_encode())
    return t


def stored_as_parquet(tables: Mapping[str, pa.Table]) -> bool:
    """Whether a graph is large enough to be written as Parquet rather than inserted."""
    return sum(tables[t].num_rows for t in ("task", "edge") if t in tables) >= PARQUET_ROWS


# the Arrow type of a column by its declared DuckDB type (names of pyarrow's type functions)
_ARROW = {"VARCHAR": "string", "BIGINT": "int64", "INTEGER": "int32", "BOOLEAN": "bool_",
          "DOUBLE": "float64"}


def _arrow_type(sql: str, default: str | None = None):
    import pyarrow as pa
    key = sql.split()[0]
    return getattr(pa, _ARROW[key] if default is None else _ARROW.get(key, default))()


def _declared(name: str, t: pa.Table, trace_id: str) -> pa.Table:
    """An incoming graph table as the DuckDB table would hold it, refused as an INSERT would
    refuse it (a value of another type, a null in a NOT NULL column, a word outside an ENUM):
    a Parquet graph is checked before it is written, never when it is read."""
    import pyarrow as pa
    import pyarrow.compute as pc

    cols = []
    for c in GRAPH_TABLES[name].columns:
        if c.name == "trace_id":
            continue
        a = t[c.name] if c.name in t.column_names else pa.nulls(t.num_rows)
        if pa.types.is_null(a.type):
            a = a.cast(_arrow_type(c.sql, "string"))
        words = re.findall(r"'([^']*)'", c.sql) if c.sql.startswith("ENUM(") else None
        try:
            if words is not None:  # strings, or a dictionary of them (as the builder gives)
                vals = (pa.concat_arrays([ch.dictionary for ch in a.chunks])
                        if pa.types.is_dictionary(a.type) else a)
                bad = pc.filter(vals, pc.invert(pc.is_in(vals, pa.array(words))))
                if len(bad.drop_null()):
                    raise DaydreamError(f"Conversion Error: {bad.drop_null()[0]} is not a "
                                        f"value of {c.name}'s ENUM")
            elif not (c.sql.startswith("VARCHAR") and pa.types.is_dictionary(a.type)
                      and pa.types.is_string(a.type.value_type)):
                a = a.cast(_arrow_type(c.sql))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise DaydreamError(f"writing graph table {name} of trace {trace_id} failed, "
                                f"nothing written: Conversion Error: {first_line(str(e))}"
                                ) from None
        except DaydreamError as e:
            raise DaydreamError(f"writing graph table {name} of trace {trace_id} failed, "
                                f"nothing written: {e}") from None
        if "NOT NULL" in c.sql and a.null_count:
            raise DaydreamError(f"writing graph table {name} of trace {trace_id} failed, "
                                "nothing written: Constraint Error: NOT NULL constraint "
                                f"failed: {name}.{c.name}")
        cols.append(a)
    return pa.table(cols, names=[c for c in GRAPH_TABLES[name].names if c != "trace_id"])


def stage_parquet(folder: Path, trace_id: str, tables: Mapping[str, pa.Table]) -> Path:
    """Write the six graph tables of one trace as ``folder/<table>.parquet`` (checked like an
    insert, in the declared column order, the schema version in each file's metadata), the
    tables on threads: Parquet encoding runs without the GIL. ``folder`` is then handed to
    :func:`write_traces` in place of the tables."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa

    prepared = {}
    for name in WRITE_ORDER:
        t = (_prepare(name, tables[name], trace_id) if name in tables
             else pa.table({c: pa.nulls(0) for c in GRAPH_TABLES[name].names[1:]}))
        t = _declared(name, t, trace_id)  # a table left out is written empty
        if name == "task":  # every file alike, whatever the caller gave (the builder: these)
            t = _task_dictionaries(t)
        prepared[name] = t.replace_schema_metadata({VERSION_KEY: str(GRAPH_SCHEMA_VERSION)})
    folder.mkdir(parents=True, exist_ok=True)

    def write(name: str) -> None:
        # row groups of the writer's default size: the rows are read back in an order of
        # their own (graphstore.read.ORDER), whatever groups the file has
        write_parquet(prepared[name], folder / f"{name}.parquet")

    # the two large tables each on a thread of their own, the four small ones in this one
    with ThreadPoolExecutor(max_workers=2) as pool:
        futs = [pool.submit(write, name) for name in ("task", "edge")]
        for name in WRITE_ORDER:
            if name not in ("task", "edge"):
                write(name)
        for f in futs:
            f.result()
    return folder


def _enum_casts(t: GTable) -> list[str]:
    """The select list of a Parquet graph table as the DuckDB table declares it: ENUM columns
    (strings in Parquet) cast back, so both read alike (Arrow dictionaries)."""
    out = []
    for c in t.columns:
        if c.name == "trace_id":
            continue
        out.append(f"CAST({c.name} AS {c.sql.removesuffix(' NOT NULL')}) AS {c.name}"
                   if c.sql.startswith("ENUM(") else c.name)
    return out


def parquet_select(store_root: str | Path, trace_id: str, name: str) -> str:
    """A FROM-able query of one Parquet graph table of one trace (no trace_id column)."""
    f = parquet_partition(store_root, trace_id) / f"{name}.parquet"
    return (f"(SELECT {', '.join(_enum_casts(GRAPH_TABLES[name]))} "
            f"FROM read_parquet({sql_literal(str(f.resolve()))}))")


def base_table(con: duckdb.DuckDBPyConnection, name: str) -> str:
    """The DuckDB table NAME of the store ``con`` has open, past any view of the same name."""
    return f'"{con.execute("SELECT current_database()").fetchall()[0][0]}".main.{name}'


def _graph_views(con: duckdb.DuckDBPyConnection, store_root: Path) -> None:
    """Where the store holds Parquet graphs: each graph table becomes a temporary view of the
    DuckDB table and those files (the views and queries of ``con`` read both). Nothing where
    there are none, so stores of small traces pay nothing."""
    if not parquet_ids(store_root):
        return
    glob = sql_literal(str(parquet_root(store_root).resolve() / "trace_id=*" / "{}.parquet"))
    for name, t in GRAPH_TABLES.items():
        cols = [c for c in t.names if c != "trace_id"]
        src = (f"read_parquet({glob.format(name)}, hive_partitioning = true, "
               "hive_types = {'trace_id': 'VARCHAR'})")
        con.execute(f'CREATE OR REPLACE TEMP VIEW {name} AS '
                    f'SELECT trace_id, {", ".join(cols)} FROM {base_table(con, name)} UNION ALL '
                    f'SELECT trace_id, {", ".join(_enum_casts(t))} FROM {src}')


def _tombstone(store_root: Path, trace_id: str) -> Path | None:
    """Move a trace's Parquet graph out of sight (renamed, removed later); None if none."""
    p = parquet_partition(store_root, trace_id)
    if not p.exists():
        return None
    tomb = p.parent / f".old-{trace_id}-{uuid.uuid4().hex[:6]}"
    os.replace(p, tomb)
    return tomb


def _sweep_parquet(store_root: Path) -> None:
    """Remove what killed writers left in DIR/graph (tombstones). With the store lock held."""
    d = parquet_root(store_root)
    if d.exists():
        for q in d.iterdir():
            if q.name.startswith(".old-"):
                shutil.rmtree(q, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Writing


def _prepare(name: str, t: pa.Table, trace_id: str) -> pa.Table:
    """Check the columns of one incoming table; drop a trace_id column that agrees."""
    decl = GRAPH_TABLES[name]
    if "trace_id" in t.column_names:
        ids = set(t.column("trace_id").unique().to_pylist())
        if ids - {trace_id}:
            raise DaydreamError(f"graph table {name} for trace {trace_id} holds rows of trace "
                                f"{sorted(map(str, ids - {trace_id}))[0]}")
        t = t.drop_columns(["trace_id"])
    want = [c for c in decl.names if c != "trace_id"]
    missing = [c for c in want if c not in t.column_names]
    extra = [c for c in t.column_names if c not in want]
    if missing or extra:
        parts = []
        if missing:
            parts.append("missing column(s) " + ", ".join(missing))
        if extra:
            parts.append("unknown column(s) " + ", ".join(extra))
        raise DaydreamError(f"graph table {name} for trace {trace_id}: " + "; ".join(parts))
    return t


def write_trace(store_root: str | Path, trace_id: str, tables: Mapping[str, pa.Table],
                timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, int]:
    """Replace the rows of one trace in all five graph tables, in one transaction.

    ``tables`` maps each of task, edge, unit, iteration, layer to an Arrow table with the
    declared columns (a ``trace_id`` column is optional; when present it must equal
    ``trace_id``). A table left out is written as empty. Rows are inserted straight from Arrow
    (DuckDB scans the buffers, no copy through Python). Any failure rolls the whole trace back:
    the database is left exactly as it was. Takes the store's writer lock. Returns rows written
    per table. The trace's predictions are dropped (they were made on the old graph).
    """
    return write_traces(store_root, {trace_id: tables}, timeout_s=timeout_s)[trace_id]


def write_traces(store_root: str | Path,
                 graphs: Mapping[str, Mapping[str, pa.Table] | Path],
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, dict[str, int]]:
    """:func:`write_trace` for many traces in one transaction (one open of the database, one
    commit): how a batch loader keeps the write lock for a short time per many traces. A
    graph given as a folder (:func:`stage_parquet`) is moved into ``DIR/graph`` instead."""
    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq
    root = Path(store_root)
    large = [tid for tid, t in graphs.items() if not isinstance(t, Path)
             and not set(t) - set(GRAPH_TABLES) and stored_as_parquet(t)]
    if large:  # staged as Parquet here, then written as staged folders
        staging = Store(root).new_staging_dir()
        try:
            return write_traces(root, {tid: stage_parquet(staging / tid, tid, t)
                                       if tid in large else t for tid, t in graphs.items()},
                                timeout_s)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    prepared: dict[str, dict[str, pa.Table]] = {}
    staged: dict[str, Path] = {}
    for trace_id, tables in graphs.items():
        if isinstance(tables, Path):
            staged[trace_id] = tables
            continue
        unknown = sorted(set(tables) - set(GRAPH_TABLES))
        if unknown:
            raise DaydreamError(f"unknown graph table(s) {', '.join(unknown)}; the graph tables "
                                f"are {', '.join(WRITE_ORDER)}")
        prepared[trace_id] = {name: _prepare(name, tables[name], trace_id)
                              for name in WRITE_ORDER if name in tables}
    counts: dict[str, dict[str, int]] = {
        tid: {name: pq.read_metadata(folder / f"{name}.parquet").num_rows
              for name in WRITE_ORDER} for tid, folder in staged.items()}
    if not prepared and not staged:
        return counts
    import numpy as np

    # One INSERT per table for the whole batch: the traces' tables concatenated (those of one
    # schema, normally all), with their trace_id as a column. A statement and a registered
    # Arrow table each cost about a millisecond, so one per trace and table was most of
    # the time of writing a fleet's small graphs.
    groups: list[tuple[str, list[str], pa.Table]] = []
    for name in WRITE_ORDER:
        cols = [c for c in GRAPH_TABLES[name].names if c != "trace_id"]
        by_schema: dict[pa.Schema, list[tuple[str, pa.Table]]] = {}
        for trace_id, tabs in prepared.items():
            t = tabs.get(name)
            counts.setdefault(trace_id, {})[name] = 0 if t is None else t.num_rows
            if t is not None and t.num_rows:
                t = t.select(cols)
                by_schema.setdefault(t.schema.remove_metadata(), []).append((trace_id, t))
        for parts in by_schema.values():
            ids = [tid for tid, _ in parts]
            if len(parts) == 1:  # the trace id is a constant of the INSERT
                groups.append((name, ids, parts[0][1]))
                continue
            tid = pa.DictionaryArray.from_arrays(
                pa.array(np.repeat(np.arange(len(ids), dtype=np.int32),
                                   [t.num_rows for _, t in parts])), pa.array(ids, pa.string()))
            t = pa.concat_tables([t.replace_schema_metadata(None) for _, t in parts])
            groups.append((name, ids, t.add_column(0, "trace_id", tid)
                           .unify_dictionaries().combine_chunks()))
    with Store(root).lock(), connect(store_root, read_only=False,
                                     timeout_s=timeout_s) as con:
        _sweep_parquet(root)
        # A trace now inserted loses its Parquet graph before the commit (put back should
        # the transaction fail), one now staged its DuckDB rows in it and its old files after:
        # killed anywhere, a trace has one graph or none, never two.
        tombs = {tid: t for tid in prepared if (t := _tombstone(root, tid)) is not None}
        # Registered outside the transaction: unregistering inside an aborted one would fail
        # and hide the error that aborted it.
        views = {}
        for i, (name, _, t) in enumerate(groups):
            views[i] = f"_in_{i}_{name}"
            con.register(views[i], t)
        name, ids = None, [*prepared, *staged]
        try:
            con.execute("BEGIN")
            try:
                for name in (*WRITE_ORDER, *RESULT_TABLES):
                    con.execute(f"DELETE FROM {name} WHERE trace_id IN (SELECT unnest(?))",
                                [ids])
                for i, (name, group_ids, t) in enumerate(groups):
                    ids = group_ids  # named in the error, should this insert fail
                    cols = ", ".join(c for c in t.column_names if c != "trace_id")
                    if "trace_id" in t.column_names:
                        con.execute(f"INSERT INTO {name} (trace_id, {cols}) "
                                    f"SELECT trace_id, {cols} FROM {views[i]}")
                    else:
                        con.execute(f"INSERT INTO {name} (trace_id, {cols}) "
                                    f"SELECT ?, {cols} FROM {views[i]}", [ids[0]])
                ids = [*prepared, *staged]
                con.execute("DELETE FROM meta WHERE key IN (SELECT ? || unnest(?))",
                            [RULES_KEY, ids])
                con.execute("INSERT INTO meta SELECT ? || t, ? FROM unnest(?) AS u(t)",
                            [RULES_KEY, graph_rules(), ids])
                con.execute("COMMIT")
            except duckdb.Error as e:
                con.execute("ROLLBACK")
                _untomb(root, tombs)
                which = (f"trace {ids[0]}" if len(ids) == 1 else
                         f"traces {', '.join(ids[:3])}{', ...' if len(ids) > 3 else ''} "
                         f"({len(ids)})")
                raise DaydreamError(f"writing graph table {name} of {which} failed, "
                                    f"nothing written: {first_line(str(e))}") from None
            except BaseException:
                con.execute("ROLLBACK")
                _untomb(root, tombs)
                raise
            for tid, folder in staged.items():
                tomb = _tombstone(root, tid)
                if tomb is not None:
                    tombs[tid] = tomb
                dst = parquet_partition(root, tid)
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(folder, dst)
            if staged:
                fsync_dir(parquet_root(root))
            for t in tombs.values():
                shutil.rmtree(t, ignore_errors=True)
        finally:
            for v in views.values():
                con.unregister(v)
    return counts


def _untomb(root: Path, tombs: Mapping[str, Path]) -> None:
    """Put back the Parquet graphs a failed write had moved out."""
    for tid, t in tombs.items():
        os.replace(t, parquet_partition(root, tid))


def write_results(store_root: str | Path, table: str, rows: pa.Table, key: tuple[str, ...],
                  timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Insert result rows (e.g. ``prediction``) in one transaction, replacing rows with the same
    ``key`` values. Rows of traces that have no graph (deleted meanwhile) are dropped. Takes the
    store's writer lock. Returns rows written."""
    import duckdb
    decl = RESULT_TABLES[table]
    missing = [c for c in decl.names if c not in rows.column_names]
    if missing:
        raise DaydreamError(f"result table {table}: missing column(s) {', '.join(missing)}")
    if not rows.num_rows:
        return 0
    rows = rows.select(decl.names)
    cols = ", ".join(decl.names)
    on = " AND ".join(f"t.{k} = i.{k}" for k in key)
    with Store(Path(store_root)).lock(), connect(store_root, read_only=False,
                                                 timeout_s=timeout_s) as con:
        con.register("_in", rows)
        try:
            con.execute("BEGIN")
            try:
                con.execute(f"DELETE FROM {table} t WHERE EXISTS "
                            f"(SELECT 1 FROM _in i WHERE {on})")
                n = con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _in "
                                "WHERE trace_id IN (SELECT trace_id FROM iteration UNION "
                                "SELECT trace_id FROM task UNION SELECT unnest(?::VARCHAR[]))",
                                [parquet_ids(store_root)]).fetchall()[0][0]
                con.execute("COMMIT")
            except duckdb.Error as e:
                con.execute("ROLLBACK")
                raise DaydreamError(f"writing {table} failed, nothing written: "
                                    f"{first_line(str(e))}") from None
            except BaseException:
                con.execute("ROLLBACK")
                raise
        finally:
            con.unregister("_in")
    return int(n)


def delete_trace(store_root: str | Path, trace_id: str,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Delete one trace's rows from every graph table (one transaction). Returns task rows."""
    import pyarrow.parquet as pq
    if not db_path(store_root).exists():
        return 0
    with Store(Path(store_root)).lock(), connect(store_root, read_only=False,
                                                 timeout_s=timeout_s) as con:
        con.execute("BEGIN")
        try:
            n = con.execute("SELECT count(*) FROM task WHERE trace_id = ?",
                            [trace_id]).fetchall()[0][0]
            for name in (*WRITE_ORDER, *RESULT_TABLES):
                con.execute(f"DELETE FROM {name} WHERE trace_id = ?", [trace_id])
            con.execute("DELETE FROM meta WHERE key = ?", [RULES_KEY + trace_id])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        tomb = _tombstone(Path(store_root), trace_id)
        if tomb is not None:
            n += pq.read_metadata(tomb / "task.parquet").num_rows
            shutil.rmtree(tomb, ignore_errors=True)
    return int(n)


def remove_db(store_root: str | Path) -> bool:
    """Delete ``graph.duckdb`` (and its WAL) and the Parquet graphs, e.g. before a rebuild
    after a schema change."""
    path = db_path(store_root)
    with Store(Path(store_root)).lock():
        found = path.exists()
        for p in (path, path.with_name(path.name + ".wal")):
            p.unlink(missing_ok=True)
        shutil.rmtree(parquet_root(store_root), ignore_errors=True)
    return found


def trace_ids(store_root: str | Path) -> list[str]:
    """Traces that have a graph (rows in ``iteration`` or ``task``, or Parquet files), sorted."""
    if not db_path(store_root).exists():
        return []
    with connect(store_root) as con:
        rows = con.execute(f"{_GRAPH_IDS} ORDER BY 1").fetchall()
    return [r[0] for r in rows]


def has_graph(con: duckdb.DuckDBPyConnection, trace_id: str) -> bool:
    """Whether ``trace_id`` is one of ``trace_ids``, on a read-only connection: asking for
    its rows alone (``trace_ids`` reads every trace's)."""
    return con.execute("SELECT EXISTS (SELECT 1 FROM task WHERE trace_id = $t) OR EXISTS "
                       "(SELECT 1 FROM iteration WHERE trace_id = $t)",
                       {"t": trace_id}).fetchall()[0][0]
