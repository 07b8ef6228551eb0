"""What-if predictions over a fleet of stored traces: every trace against every spec.

``predict_all`` is the batch form of ``daydream.api.predict``: for each stored trace (those a
``--where`` predicate over the ``trace`` table selects) its worker runs ``daydream.pipeline``,
the one prediction path, replaying the unmodified graph once and simulating it rewritten by
each spec. Results go to the ``prediction`` table of the store's
DuckDB file (declared in ``graphstore.schema``), so ``daydream sql`` answers questions such as
"which of last week's jobs would gain most from AMP?".

Work is split the way batch ingest splits it (``daydream.base.runner``): this process reads graphs
and writes results; workers (local processes or Ray tasks) get a trace's graph tables and specs
(and read the trace's own Parquet files, see ``predict_trace``) and return rows, never
touching the database. Results are written in batches, each one short
transaction, so read-only queries run between them. A (trace, spec) pair already in the table is
skipped: an interrupted run, run again, resumes where it stopped (``force`` recomputes).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from daydream import pipeline
from daydream.base.errors import DaydreamError
from daydream.base.runner import Later, Runner, later, make_runner
from daydream.graphstore import db, sql_query
from daydream.graphstore.prediction import PredictionResult
from daydream.graphstore.schema import PREDICTION
from daydream.ingest.store import Store

KEY = ("trace_id", "spec")
# the prediction columns ``results`` gives beside the trace's file and job (the run's report)
RESULT_COLUMNS = ("spec", "measured_ms", "baseline_ms", "reference_ms", "predicted_ms", "speedup",
                  "speedup_low", "speedup_high", "gates_failed", "created")
FLUSH_ROWS = 256
FLUSH_S = 2.0
# Graphs are read in chunks, one query per table on one read-only connection (an open and a
# query each cost milliseconds, a small trace's whole graph less): up to READ_CHUNK traces or
# READ_TASKS tasks in all (one trace at least) held in memory at a time.
READ_CHUNK = 64
READ_TASKS = 1_000_000
# The first chunk is smaller: nothing is predicted until it is read (64 DLRM graphs took 0.14
# s, a fifth of the start-up of a 100-trace run), and the workers' first tasks need only a few.
READ_FIRST = 8


@dataclass
class PairResult:
    trace_id: str
    spec: str
    status: str  # predicted, stored (from an earlier run), failed
    error: str | None = None
    row: dict | None = None


@dataclass
class FleetReport:
    traces: list[str] = field(default_factory=list)
    specs: list[str] = field(default_factory=list)
    results: list[PairResult] = field(default_factory=list)
    table: pa.Table | None = None  # the prediction rows of these traces and specs, best first
    without_graph: int = 0  # stored traces left out because they have no graph yet
    rebuilt: int = 0  # graphs built by other graph rules (an older daydream's), rebuilt first

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def failed(self) -> list[PairResult]:
        return [r for r in self.results if r.status == "failed"]


def select_traces(store_root: Path, where: str | None = None) -> list[str]:
    """Stored traces that have a graph, filtered by ``where``: a SQL predicate over the
    ``trace`` table (file, source_format, job, rank, world_size, ingested_at, ...)."""
    have = set(db.trace_ids(store_root))
    if where is None:
        return sorted(have)
    try:
        t = sql_query.run_sql(store_root, f"SELECT DISTINCT trace_id FROM trace WHERE {where}")
    except DaydreamError as e:
        raise DaydreamError(f"--where {where!r}: {e}") from None
    return sorted(set(t.column(0).to_pylist()) & have)


def stored_pairs(store_root: Path, trace_ids: list[str] | None = None) -> set[tuple[str, str]]:
    """(trace, spec) pairs the prediction table already holds."""
    if not db.db_path(store_root).exists():
        return set()
    with db.connect(store_root) as con:
        if not _has_prediction(con):
            return set()
        rows = con.execute("SELECT trace_id, spec FROM prediction").fetchall()
    want = None if trace_ids is None else set(trace_ids)
    return {(a, b) for a, b in rows if want is None or a in want}


def _has_prediction(con) -> bool:
    # a database written by an older daydream gets the table at its next write
    return bool(db.table_columns(con, "prediction"))


def predict_trace(store_root: str, trace_id: str,
                  graph: dict[str, bytes] | dict[str, pa.Table], specs: list[str],
                  param_bytes: int | None = None) -> dict:
    """Worker: one trace with every spec, through ``daydream.pipeline`` (what ``daydream predict
    TRACE --opt SPEC`` runs, the baseline replayed once). The loader sends the graph it read
    from DuckDB (``pack_graph``; its tables as they are to an inline run); the worker reads
    the trace row and any activity table an optimization asks for from the store's Parquet
    files itself: those can be larger than the graph (the range table with its recorded
    shapes), are read only where a spec needs them, in parallel beside the other workers, and
    never pass through the loader or Ray's object store (the store is at the same path on
    every node, as ingest already needs). A worker imports no DuckDB (``graphstore.db``
    imports it where a database is opened). Never raises for bad input: returns
    ``{"ok": True, "rows": [...], "errors": {spec: message}}`` or ``{"ok": False, "error":
    message}`` when even the baseline fails."""
    try:
        s = pipeline.trace_subject(Store(Path(store_root)), trace_id, unpack_graph(graph))
        s.baseline()
    except DaydreamError as e:
        return {"ok": False, "error": f"trace {trace_id}: baseline: {e}"}
    except Exception as e:  # a bug, not bad input: still reported against the trace
        return {"ok": False, "error": f"trace {trace_id}: baseline: internal error: "
                                      f"{type(e).__name__}: {e}"}
    rows, errors = [], {}
    for spec in specs:
        try:
            p = pipeline.predict(s, spec, param_bytes=param_bytes, detail=False)
        except DaydreamError as e:
            errors[spec] = str(e)
            continue
        except Exception as e:
            errors[spec] = f"internal error: {type(e).__name__}: {e}"
            continue
        rows.append(row(trace_id, spec, p.result))
    return {"ok": True, "rows": rows, "errors": errors}


def warm_worker() -> None:
    """What a spawned worker runs before its first trace, while the driver reads graphs: the
    pipeline's modules imported (~0.3 s of one core that its first prediction would otherwise
    pay) and the simulator's kernels run once (nothing to load where they are compiled ahead
    of time; numba's loads, ~0.4 s more, where they are not)."""
    from daydream.simulate.warmup import warm
    from daydream.transforms import registry
    registry.opts()  # every optimization's module
    warm()


def pack_graph(graph: dict[str, pa.Table]) -> dict[str, bytes]:
    """A graph's tables as the loader sends them to a worker: one Arrow IPC stream each. A
    small graph's tables cost ~0.2 ms to write and ~0.15 ms to read this way, a quarter of
    pickling them (~0.8 ms and ~0.55 ms), at either end of every task."""
    out = {}
    for name, t in graph.items():
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        out[name] = sink.getvalue().to_pybytes()
    return out


def unpack_graph(packed: dict[str, bytes] | dict[str, pa.Table]) -> dict[str, pa.Table]:
    """The tables ``pack_graph`` wrote (tables that were not packed as they are)."""
    return {name: pa.ipc.open_stream(b).read_all() if isinstance(b, bytes) else b
            for name, b in packed.items()}


def row(trace_id: str, spec: str, r: PredictionResult) -> dict:
    """The prediction table's row of one prediction (``PredictionResult.row``, declared beside
    ``schema.PREDICTION``): what ``daydream predict`` reports of it, the interval and the
    failed gates included."""
    return r.row(trace_id, spec)


def predict_all(store_root: str | Path, specs: list[str], *, where: str | None = None,
                workers: int | None = None, ray: str | None = None, force: bool = False,
                param_bytes: int | None = None,
                on_progress: Callable[[PairResult], None] | None = None,
                on_plan: Callable[[int], None] | None = None,
                runner: Runner | None = None) -> FleetReport:
    """Predict every selected stored trace with every spec; results into ``prediction``.

    ``param_bytes``: the model's parameter bytes for ``ddp`` (as ``predict --param-bytes``;
    the same for every trace). ``on_plan(n)`` is told how many (trace, spec) pairs there are
    before the work starts, and ``on_progress`` gets each pair as it is done (or found
    stored). ``runner``: where the predictions run (``base.runner.started_early``: its
    workers started before this module was imported), closed here; else one is made."""
    from daydream.transforms.registry import check

    root = Path(store_root)
    specs = list(dict.fromkeys(s.strip() for s in specs))
    if not specs:
        raise DaydreamError("predict --all needs at least one --opt")
    for s in specs:
        check(s)  # every spec error before any work
    st = Store(root)
    if not db.db_path(root).exists():
        raise DaydreamError(f"no graph in {root}: ingest traces first "
                            f"(`daydream ingest TRACE... --store {root}`)")
    traces = select_traces(root, where)
    rep = FleetReport(traces=traces, specs=specs)
    if where is None:
        rep.without_graph = len(set(st.trace_ids()) - set(traces))
    if on_plan:
        on_plan(len(traces) * len(specs))

    def done(r: PairResult) -> None:
        rep.results.append(r)
        if on_progress:
            on_progress(r)

    # graphs built by other graph rules are rebuilt from their activity tables first (which
    # drops their predictions: they rested on the old graph)
    unbuilt = _rebuild_stale(root, traces, rep)
    have = set() if force else stored_pairs(root, traces)
    todo: dict[str, list[str]] = {}
    for tid in traces:
        for s in specs:
            if tid in unbuilt:
                done(PairResult(tid, s, "failed", error=unbuilt[tid]))
            elif (tid, s) in have:
                done(PairResult(tid, s, "stored"))
            else:
                todo.setdefault(tid, []).append(s)

    buf: list[dict] = []
    last = time.monotonic()

    def flush() -> None:
        nonlocal last
        last = time.monotonic()
        if buf:
            now = dt.datetime.now(dt.UTC)
            for row in buf:
                row["created"] = now
            db.write_results(root, "prediction", _rows_table(buf), KEY)
            buf.clear()

    def finish(tid: str, res: dict) -> None:
        if not res["ok"]:
            for s in todo[tid]:
                done(PairResult(tid, s, "failed", error=res["error"]))
            return
        for row in res["rows"]:
            buf.append(row)
            done(PairResult(tid, row["spec"], "predicted", row=row))
        for s, err in res["errors"].items():
            # the optimization's own message names it already ("no_straggler: needs a job")
            named = err.startswith(f"{s.split('(')[0]}:") or err.startswith(f"{s}:")
            done(PairResult(tid, s, "failed",
                            error=f"trace {tid}: {err}" if named else f"trace {tid}: {s}: {err}"))

    items = list(todo)
    if runner is not None and len(items) < 2:
        # one trace runs here, as make_runner would have it: a worker would be sent the
        # whole graph and this process would wait for it (the 1M-event trace: 7.2 -> 11.3 s)
        runner.close()
        runner = None
    if runner is None:
        runner = make_runner(workers, ray, tasks=len(items), share=warm_worker)
    limit = runner.in_flight
    reader = _Reader(st, _chunks(root, items))
    try:
        with runner:
            ready: list[tuple[str, dict]] = []
            while True:
                while runner.pending() < limit:
                    if not ready:
                        try:
                            ready = reader.next()
                        except Exception:
                            # what the workers are predicting is collected (and written
                            # below) before the read's error stops the fleet: a rerun would
                            # otherwise compute it again
                            _drain(runner, finish)
                            raise
                        if not ready:
                            break
                    tid, g = ready.pop(0)
                    # packed for a worker elsewhere; here, the tables as they are (packing
                    # them would cost both ends of the trip for nothing)
                    runner.submit(tid, predict_trace, str(root), tid,
                                  g if runner.next_inline() else pack_graph(g), todo[tid],
                                  param_bytes)
                if not runner.pending():
                    break
                for tid, res in runner.next_done():
                    finish(tid, res)
                if len(buf) >= FLUSH_ROWS or time.monotonic() - last >= FLUSH_S:
                    reader.settle()  # one connection to the database at a time
                    flush()
    finally:
        reader.settle()
        flush()  # what finished before an interrupt is kept: the rerun resumes after it
    rep.table = results(root, traces, specs)
    return rep


def _drain(runner: Runner, finish: Callable[[str, dict], None]) -> None:
    """Wait for every task RUNNER holds and hand each result to FINISH."""
    while runner.pending():
        for tid, res in runner.next_done():
            finish(tid, res)


def _rebuild_stale(root: Path, traces: list[str], rep: FleetReport) -> dict[str, str]:
    """Rebuild the graphs of ``traces`` built by other graph rules (``db.stale_ids``); counted
    in ``rep.rebuilt``. Returns the error of each that could not be rebuilt."""
    stale = db.stale_ids(root, traces)
    if not stale:
        return {}
    from daydream.graphstore import load as gload
    built, failed = gload.load_many(root, sorted(stale))
    rep.rebuilt = len(built)
    return {tid: f"trace {tid}: graph (rebuilt: built by other graph rules): {e}"
            for tid, e in failed.items()}


def _chunks(root: Path, tids: list[str]) -> list[list[str]]:
    """``tids`` cut into the chunks the loader reads at once (READ_FIRST, READ_CHUNK,
    READ_TASKS)."""
    if not tids:
        return []
    with db.connect(root) as con:
        sizes = dict(con.execute("SELECT trace_id, count(*) FROM task GROUP BY trace_id")
                     .fetchall())
    out: list[list[str]] = [[]]
    tasks = 0
    for tid in tids:
        n = sizes.get(tid, 0)
        most = READ_FIRST if len(out) == 1 else READ_CHUNK
        if out[-1] and (len(out[-1]) >= most or tasks + n > READ_TASKS):
            out.append([])
            tasks = 0
        out[-1].append(tid)
        tasks += n
    return out


class _Reader:
    """The loader's chunks of graphs (``_chunks``), the first read here when asked for and each
    later one on a thread while the one before it is predicted (``base.runner.later``):
    DuckDB reads without the interpreter's lock, and a read in the loop (64 DLRM graphs,
    ~0.15 s) left both this process and a worker, whose queue of two ran dry meanwhile,
    without work, twice in a 100-trace run. ``settle`` waits for a read under way (before
    this process writes to the database)."""

    def __init__(self, st: Store, chunks: list[list[str]]) -> None:
        self._st = st
        self._chunks = iter(chunks)
        self._ahead: Future | Later | None = later(False, _read_chunk, st,
                                                    next(self._chunks, []))

    def next(self) -> list[tuple[str, dict]]:
        """The next chunk's (trace, graph tables), [] at the end; starts reading the one
        after it."""
        if self._ahead is None:
            return []
        got = self._ahead.result()
        after = next(self._chunks, None)
        self._ahead = None if after is None else later(True, _read_chunk, self._st, after)
        return got

    def settle(self) -> None:
        if isinstance(self._ahead, Future):
            self._ahead.exception()  # waits; an error is raised where the chunk is asked for


def _read_chunk(st: Store, tids: list[str]) -> list[tuple[str, dict]]:
    """Graph tables of a few traces, read on one read-only connection."""
    from daydream.graphstore.read import read_graphs
    return list(zip(tids, read_graphs(st.root, tids), strict=True)) if tids else []


def _rows_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=PREDICTION.arrow_schema())


def results(store_root: str | Path, traces: list[str] | None = None,
            specs: list[str] | None = None) -> pa.Table:
    """Prediction rows (of ``traces`` and ``specs`` when given), best gain first, with the
    trace's file and job."""
    root = Path(store_root)
    where = []
    if traces is not None:
        where.append("p.trace_id IN (SELECT unnest($traces))")
    if specs is not None:
        where.append("p.spec IN (SELECT unnest($specs))")
    params = {}
    if traces is not None:
        params["traces"] = traces
    if specs is not None:
        params["specs"] = specs
    with db.connect(root) as con:
        if not _has_prediction(con):
            return _rows_table([]).select(["trace_id", "spec"])
        # a store not yet migrated to this version (read-only here) lacks the newer columns
        have = set(db.table_columns(con, "prediction"))
        cols = ", ".join(f"p.{c}" for c in RESULT_COLUMNS if c in have)
        sql = (f"SELECT p.trace_id, t.file, t.job, {cols} FROM prediction p "
               "LEFT JOIN trace t ON t.trace_id = p.trace_id"
               + (" WHERE " + " AND ".join(where) if where else "")
               + " ORDER BY p.speedup DESC NULLS LAST, p.trace_id, p.spec")
        sql_query.register_activity(con, root, sql)
        return con.sql(sql, params=params).to_arrow_table()
