"""Traces into the store and back out by what the user typed.

``ingest`` chains ingest (activity tables) and graphstore (graphs) over a batch of files;
``build_graphs`` builds what a stored trace lacks; ``resolve_trace`` turns a file, an id or an
id prefix into a stored trace id (ingesting a new file when asked).
"""

from __future__ import annotations

import contextlib
import importlib
import shutil
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from daydream.base.errors import DaydreamError
from daydream.base.store import DEFAULT_STORE
from daydream.ingest.store import Store

if TYPE_CHECKING:
    from daydream.base.runner import Runner
    from daydream.ingest.batch_ingest import FileResult, IngestReport

# ingest.batch_ingest (the converters, numpy) is imported by the functions that ingest, so that
# `daydream info` of a stored trace starts without it.


def open_store(store: str | Path | None = None) -> Store:
    return Store(Path(store) if store is not None else DEFAULT_STORE)


def ingest(paths: Iterable[str | Path], store: str | Path | None = None, *,
           jobs: int | None = None, force: bool = False, strict: bool = False,
           job: str | None = None,
           on_progress: Callable[[FileResult], None] | None = None,
           ray: str | None = None, runner: Runner | None = None) -> IngestReport:
    """Convert trace files into the store's activity tables (``ingest.batch_ingest.ingest``) and
    build their dependency graphs (``graphstore.load``): each worker (``jobs`` local processes, or
    Ray tasks with ``ray``) converts a file and builds its graph; this process commits the traces
    and writes the graphs to DuckDB in batches. Then builds any stored trace's missing graph.
    ``runner``: the workers, started already (``base.runner.started_early`` with
    :func:`warm_worker`), closed here."""
    from daydream.ingest.batch_ingest import ingest as ingest_files
    from daydream.ingest.files import expand
    from daydream.ingest.ids import content_ids_in_background

    files = expand(paths)
    ids = content_ids_in_background(files)
    st = open_store(store)
    st.root.mkdir(parents=True, exist_ok=True)
    loader = None  # made at the first graph (graphstore.load imported by then)
    # where workers write large graphs as Parquet: named by this process, so no writer sweeps
    # it while the loader has yet to move them into place
    staged = st.new_staging_dir()
    # The graph stage's modules (polars, duckdb, graphstore: some 0.4 s) are imported on a
    # thread while the first file is converted, whose scanner runs without the GIL, and the
    # thread has the store's graph database made there if it has none; the converters'
    # kernels are imported here first (numba too, where they are not compiled ahead of time:
    # daydream.base.compiled), so the two threads import nothing in common, and where the files are
    # converted in this process, the scanner's kernels are loaded first too (while the files
    # are still hashed): numba's loading holds the GIL, and with the thread's imports beside it
    # took twice as long, just before the scan.
    from daydream.ingest import kineto_scan  # noqa: F401
    if files and not ray:  # this process converts files too (base.runner.SharedRunner)
        _warm_up(files[0])
    ahead = threading.Thread(target=_graph_stage_ahead, args=(st, staged), daemon=True)
    ahead.start()

    def tick(r: FileResult) -> None:
        nonlocal loader
        extra = r.extra or {}
        if extra.get("graph_error"):
            r.status, r.error = "failed", f"{r.path}: graph: {extra['graph_error']}"
            if strict:
                raise DaydreamError(r.error)
        elif extra.get("graph") or extra.get("graph_dir"):
            if loader is None:
                from daydream.graphstore import load as gload
                loader = gload.Loader(st, expected=len(files))
            loader.add(r.trace_id, extra.pop("graph") if extra.get("graph")
                       else Path(extra.pop("graph_dir")))
        if on_progress:
            on_progress(r)

    from daydream.base.store import shared_between_threads
    try:
        # the loader writes a batch of graphs on a thread while this one commits traces
        with shared_between_threads(st.root):
            try:
                rep = ingest_files(files, st, jobs=jobs, force=force, strict=strict, job=job,
                                   on_progress=tick, ray=ray, hook=stage_graph,
                                   hook_args=(str(staged),), ids=ids, warm=warm_worker,
                                   runner=runner)
            except KeyboardInterrupt:
                if loader is not None:
                    loader.flush()  # keep the graphs of the traces already committed
                raise
            except BaseException:
                if loader is not None:  # its batch (staged folders among it) written first
                    with contextlib.suppress(Exception):
                        loader.wait()
                raise
            if loader is not None:
                loader.flush()
    finally:
        ahead.join()
        from daydream.graphstore import db
        db.forget_prepared(st.root)  # unused when no graph was written
        shutil.rmtree(staged, ignore_errors=True)
    built = build_graphs(st, rep, strict=strict,
                         skip=loader.loaded if loader is not None else set())
    given = {r.trace_id for r in rep.results}
    rep.rebuilt = sum(t not in given for t in built)
    return rep


def _warm_up(path: Path) -> None:
    """Load the compiled kernels of the converter of ``path`` (``ingest.kineto.warm_up``)."""
    from daydream.ingest import source
    try:
        fmt = source.sniff(path)
    except DaydreamError:
        return  # reported when it is converted
    if fmt == "kineto_json":
        from daydream.ingest.kineto import warm_up
        warm_up()


def warm_worker() -> None:
    """What a spawned ingest worker runs first, while this process converts: the converter's
    kernels loaded and the graph stage imported (``_warm_up``, ``stage_graph``)."""
    from daydream.ingest.kineto import warm_up
    warm_up()
    importlib.import_module("daydream.graphstore.load")


def _graph_stage_ahead(st: Store, staged: Path) -> None:
    """What ``ingest`` runs on a thread while it converts: the graph stage imported, the
    store's graph database made in ``staged`` where it has none (``graphstore.db.prepare``),
    and the DuckDB instance the graphs are written through made."""
    importlib.import_module("daydream.graphstore.load")
    from daydream.graphstore import db
    db.prepare(st.root, staged)
    from daydream.base.store import duckdb_instance
    duckdb_instance()


def stage_graph(trace_id: str, tables: dict, staging: str) -> dict:
    """The workers' hook: ``graphstore.load.stage_graph``, imported where it runs (in this
    process, by then, by the thread ``ingest`` starts)."""
    from daydream.graphstore import load as gload
    return gload.stage_graph(trace_id, tables, staging)


def build_graphs(st: Store, rep: IngestReport | None = None, *, strict: bool = False,
                 skip: set[str] | frozenset = frozenset(),
                 only: set[str] | None = None) -> list[str]:
    """Build graphs for stored traces that have none or one built by other graph rules
    (``graphstore.load.missing``), or were just re-ingested, except those in ``skip`` (built
    already); with ``only``, of those traces alone. A trace whose graph fails its checks is
    reported as failed in ``rep``; its activity tables stay. With ``rep``, a trace stored
    before whose graph these rules cannot build is kept in ``rep.unrebuilt``: the files of
    this run do not fail for it (without ``rep`` it raises, as every other failure does)."""
    from daydream.graphstore import load as gload

    todo = set(gload.missing(st.root))
    if only is not None:
        todo &= only
    by_id = {}
    if rep is not None:
        for r in rep.results:
            if r.trace_id:
                by_id.setdefault(r.trace_id, r)
                if r.status == "ingested":
                    todo.add(r.trace_id)
                elif r.status == "failed" and r.extra:  # its graph failed in the worker
                    todo.discard(r.trace_id)
    todo -= set(skip)
    built, failed = gload.load_many(st.root, sorted(todo))
    first = None
    for tid, err in failed.items():
        r = by_id.get(tid)
        msg = f"{r.path if r else tid}: graph: {err}"
        if r is not None:
            r.status, r.error = "failed", msg
        elif rep is not None:
            rep.unrebuilt[tid] = msg
            continue
        if (strict or r is None) and first is None:
            first = msg
    if first is not None:
        raise DaydreamError(first)
    return built


def ensure_graphs(st: Store, trace_ids: Iterable[str]) -> None:
    """Build the graphs of ``trace_ids`` that the store lacks (an ingest that was interrupted
    between committing a trace and writing its graph) or holds as built by other graph rules
    (an older daydream's)."""
    from daydream.graphstore import db
    want = set(trace_ids)
    if not db.db_path(st.root).exists() or not want <= db.current_ids(st.root, want):
        build_graphs(st, strict=True, only=want)


def resolve_trace(trace: str, store: Store, *, ingest_missing: bool = False) -> str:
    """A trace id from an id, a unique id prefix, or a file (hashed; ingested if asked)."""
    p = Path(trace)
    if p.is_file():
        from daydream.ingest.ids import content_id
        tid = content_id(p)
        if not store.has_trace(tid):
            if not ingest_missing:
                raise DaydreamError(f"not in store {store.root}; run `daydream ingest` first",
                                    file=trace)
            from concurrent.futures import Future

            from daydream.ingest.batch_ingest import ingest as ingest_files
            hashed: Future = Future()  # the id found above, not hashed again (0.4 s a 200 MB)
            hashed.set_result({p: tid})
            rep = ingest_files([p], store, jobs=1, strict=True, ids=hashed)
            if rep.failed:
                raise DaydreamError(rep.failed[0].error or "ingest failed")
        return tid
    ids = store.trace_ids()
    hits = [t for t in ids if t.startswith(trace)]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise DaydreamError(f"no trace file or stored trace id matches {trace!r} "
                            f"(store {store.root} holds {len(ids)} traces)")
    raise DaydreamError(f"trace id prefix {trace!r} is ambiguous: {', '.join(hits[:5])}")


def ingest_folder(path: Path, st: Store) -> list[str]:
    """Ingest a folder of rank traces (execution traces beside them skipped); their ids."""
    from daydream.ingest.batch_ingest import ingest as ingest_files
    from daydream.ingest.files import expand
    files = [f for f in expand([path]) if ".et." not in Path(f).name]
    rep = ingest_files(files, st, jobs=None, strict=True)
    build_graphs(st, rep, strict=True)
    return sorted({r.trace_id for r in rep.results if r.trace_id})


def skipped(paths: Iterable[str | Path]) -> list[tuple[str, str]]:
    """The files in the folders of PATHS that ingest leaves out, each with why: PyTorch
    execution traces (``.et.json``), and files whose names no trace format uses."""
    from daydream.ingest.files import EXCLUDED_SUFFIXES, TRACE_PATTERNS
    out = []
    for raw in paths:
        p = Path(raw)
        if not p.is_dir():
            continue
        for f in sorted(q for q in p.rglob("*") if q.is_file()):
            if f.name.endswith(EXCLUDED_SUFFIXES):
                out.append((str(f), "a PyTorch execution trace (.et.json), not a profile of "
                                    "activity"))
            elif not any(f.match(pat) for pat in TRACE_PATTERNS):
                out.append((str(f), "not a trace file name (" + ", ".join(TRACE_PATTERNS) +
                            ")"))
    return out
