"""The bodies of the commands that must start fast (``sql``, ``opts``, ``info``, ``ingest``),
shared by both ways in: daydream/__main__.py answers plain invocations of them without typer
(whose import, with the pydantic it checks option values with, cost more than these commands'
work, and 0.2 s of an ingest),
and the typer commands of cli.py call the same functions, so that both print the same. Each
imports only what its command needs; library errors are ``DaydreamError``, which the callers
print."""

from __future__ import annotations

import sys
from pathlib import Path

from daydream.base.errors import DaydreamError


def print_json(d: object) -> None:
    """D as indented JSON on stdout (what ``--json`` and ``--format json`` print)."""
    import orjson
    print(orjson.dumps(d, option=orjson.OPT_INDENT_2, default=str).decode(), flush=True)


def sql(query: str, store: Path, fmt: str = "table", out: Path | None = None) -> None:
    """`daydream sql`: the result on stdout, or written to OUT with its summary on stderr."""
    if query == "-":
        query = sys.stdin.read()
    from daydream.graphstore import db
    text = db.query(store, query, fmt, out)
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        print(text, file=sys.stderr, flush=True)


def opts(json: bool = False) -> None:
    """`daydream opts`: each optimization's signature and summary, from the catalog
    (transforms.catalog), so that no optimization is imported."""
    from daydream.transforms.catalog import listing
    items = listing()
    if json:
        print_json(items)
        return
    from daydream.table import paragraph, width
    w = width()
    for o in items:
        print(o["signature"])
        print("    " + paragraph(o["summary"], w and w - 4, "    "))
    sys.stdout.flush()


def info(trace: str, store: Path, json: bool = False) -> None:
    """`daydream info`: ``api.info`` as JSON or as tables (``views.print_info``)."""
    from daydream import api
    d = api.info(trace, store)
    if json:
        print_json(d)
        return
    from daydream.views import print_info
    print_info(d)


def ingest(paths: list[str], store: Path, jobs: int | None = None, force: bool = False,
           strict: bool = False, job: str | None = None, ray: str | None = None) -> bool:
    """`daydream ingest`: each file's id, status and path on stdout, failures and the summary
    on stderr; False when a file failed."""
    import os

    from daydream import api
    from daydream.report import plural
    from daydream.traces import skipped
    files = api.expand(paths)
    left_out = skipped(paths)
    for path, why in left_out:
        print(f"skipped: {path}: {why}", file=sys.stderr)
    if not files:
        raise DaydreamError(f"no trace files in {', '.join(paths)} ({plural(len(left_out), 'file')}"
                            " skipped, listed above)" if left_out else
                            f"no trace files in {', '.join(paths)}")
    progress = None
    if sys.stderr.isatty() and len(files) > 1:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
        progress = Progress("[progress.description]{task.description}", BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), transient=True)
        progress.start()
        task = progress.add_task("ingesting", total=len(files))

    def tick(r) -> None:
        if progress is not None:
            progress.advance(task)
        if r.status == "failed":
            print(f"error: {r.error or r.path}", file=sys.stderr, flush=True)

    try:
        rep = api.ingest(files, store, jobs=jobs or os.cpu_count(), force=force,
                         strict=strict, job=job, on_progress=tick, ray=ray)
    finally:
        if progress is not None:
            progress.stop()
    for r in rep.results:
        if r.status != "failed":
            print(f"{r.trace_id}  {r.status:8s}  {r.path}")
    sys.stdout.flush()
    print(f"{plural(rep.count('ingested'), 'trace')} ingested, "
          f"{rep.count('exists')} already stored, {rep.count('failed')} failed -> {store}",
          file=sys.stderr, flush=True)
    return not rep.failed
