"""Ingest many files into a store: expand paths, convert in parallel, commit one at a time.

Conversion (the expensive part) runs in worker processes, each writing into its own staging
folder; the parent commits finished traces under the store lock. A file that fails is reported
with its error and the others go on, unless ``strict`` is set.
"""

from __future__ import annotations

import ctypes
import os
import shutil
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from daydream.base.errors import DaydreamError
from daydream.base.runner import Runner, make_runner
from daydream.ingest.convert import read_trace
from daydream.ingest.files import expand, is_big
from daydream.ingest.ids import content_id
from daydream.ingest.store import Store, write_staged


@dataclass
class FileResult:
    path: str
    status: str  # ingested, exists, failed
    trace_id: str | None = None
    error: str | None = None
    events: int = 0
    extra: dict | None = None  # what the worker hook returned (see ``ingest``)


@dataclass
class IngestReport:
    results: list[FileResult] = field(default_factory=list)
    # graphs of traces stored before, rebuilt because other graph rules had built them
    # (``daydream.traces.build_graphs``)
    rebuilt: int = 0
    # such stored traces whose graphs these rules could not build: trace id -> the error (the
    # trace stays stored; predicting it gives that error); never a failure of this run's files
    unrebuilt: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> list[FileResult]:
        return [r for r in self.results if r.status == "failed"]

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)


def _give_back_memory() -> None:
    """Return what converting a large file left in the allocators to the system, so that the
    graph built next in this process does not stack on it: Arrow's pool, and the C heap, which
    glibc keeps (a big trace's batches are many arrays of a few MB, below glibc's mmap
    threshold)."""
    import gc

    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _convert_one(path: str, staging_root: str, trace_id: str, job: str | None,
                 hook: Callable | None = None, hook_args: tuple = ()) -> dict:
    """Worker: convert a file into a fresh staging folder. Never raises for bad input.

    ``hook(trace_id, tables, *hook_args)``, when given, runs next (in the worker) on the staged
    tables (as written); what it returns comes back as ``extra`` (the later stages use it to
    build the graph where the conversion ran)."""
    staged = Path(staging_root) / f"{os.getpid()}-{trace_id}"
    try:
        if staged.exists():
            shutil.rmtree(staged)
        conv = read_trace(Path(path))
        staged.mkdir(parents=True)
        written: list = []  # the Parquet files are written while the hook builds the graph
        tables = write_staged(conv, staged, path, os.path.getsize(path), job, written,
                              Path(staging_root) / f".empty-{os.getpid()}")
        events = conv.events
        del conv
        extra = hook(trace_id, tables, *hook_args) if hook is not None else None
        del tables
        written[0]()
        if hook is None:
            _give_back_memory()
        return {"ok": True, "staged": str(staged), "events": events, "extra": extra}
    except DaydreamError as e:
        shutil.rmtree(staged, ignore_errors=True)
        return {"ok": False, "error": str(e)}
    except Exception as e:  # a bug, not bad input: still report it against the file
        shutil.rmtree(staged, ignore_errors=True)
        return {"ok": False, "error": f"{path}: internal error: {type(e).__name__}: {e}"}


def ingest(paths: Iterable[str | Path], store: Store, *, jobs: int | None = None,
           force: bool = False, strict: bool = False, job: str | None = None,
           on_progress: Callable[[FileResult], None] | None = None,
           ray: str | None = None, hook: Callable | None = None,
           hook_args: tuple = (), ids: Future | None = None,
           warm: Callable | None = None, runner: Runner | None = None) -> IngestReport:
    """Convert and store every file in ``paths``. Re-ingesting a stored file is a no-op.

    ``jobs`` local worker processes convert (default: every core), or Ray tasks with ``ray``
    (see :mod:`daydream.base.runner`); this process commits each finished trace under the
    store lock.
    ``hook`` is passed to the workers (:func:`_convert_one`) and must be picklable. ``ids``:
    the files' content ids hashed already (``ingest.ids.content_ids_in_background``).
    ``warm``: with it, this process converts files too, beside ``jobs - 1`` workers that
    run it first (``base.runner.SharedRunner``), unless a file is large (its conversion's
    memory is given back by a worker's exit). ``runner``: such a runner made already
    (``base.runner.started_early``: its workers started while this process imported the
    converters), closed here; unused where one file is converted, or a large one."""
    files = expand(paths)
    hashed = ids.result() if ids is not None else {}
    report = IngestReport()
    store.root.mkdir(parents=True, exist_ok=True)
    with store.lock():
        store.sweep()
    staging_root = store.staging / f"{os.getpid()}-batch"
    staging_root.mkdir(parents=True, exist_ok=True)

    def done(r: FileResult) -> None:
        report.results.append(r)
        if on_progress:
            on_progress(r)

    try:
        todo: list[tuple[Path, str]] = []
        for f in files:
            try:
                tid = hashed.get(f) or content_id(f)
                if isinstance(tid, OSError):
                    raise tid
            except OSError as e:
                r = FileResult(str(f), "failed", error=f"{f}: cannot read: {e.strerror}")
                done(r)
                if strict:
                    raise DaydreamError(r.error) from None
                continue
            if store.has_trace(tid) and not force:
                done(FileResult(str(f), "exists", tid))
            else:
                todo.append((f, tid))
        # the same content under two names is converted once
        uniq: dict[str, Path] = {}
        for f, tid in todo:
            if tid in uniq:
                done(FileResult(str(f), "exists", tid))
            else:
                uniq[tid] = f
        items = [(f, tid) for tid, f in uniq.items()]

        def finish(f: Path, tid: str, res: dict) -> None:
            if not res["ok"]:
                r = FileResult(str(f), "failed", tid, error=f"{f}: {res['error']}"
                               if res["error"].startswith("worker failed") else res["error"])
                done(r)
                if strict:
                    raise DaydreamError(r.error)
                return
            fresh = store.commit(tid, Path(res["staged"]), force)
            done(FileResult(str(f), "ingested" if fresh else "exists", tid,
                            events=res["events"], extra=res.get("extra")))

        # A large file's graph is built after its conversion (no hook), from the stored
        # tables, with the conversion's memory given back first (_give_back_memory), so the
        # two peaks never add up; a worker process to convert it in would cost its start
        # (imports, compiled kernels: a second or more) for the same effect.
        big = {tid for f, tid in items if is_big(f)}
        n = len(items)
        if runner is not None and (n < 2 or big):
            runner.close()
            runner = None
        if runner is None:
            runner = make_runner(jobs, ray, tasks=n, share=None if big else warm)
        limit = runner.in_flight
        with runner:
            queue = iter(items)
            while True:
                while runner.pending() < limit:
                    nxt = next(queue, None)
                    if nxt is None:
                        break
                    f, tid = nxt
                    h = None if tid in big else hook
                    runner.submit((f, tid), _convert_one, str(f), str(staging_root), tid, job,
                                  h, hook_args)
                if not runner.pending():
                    break
                for (f, tid), res in runner.next_done():
                    finish(f, tid, res)
    finally:
        shutil.rmtree(staging_root, ignore_errors=True)
    return report
