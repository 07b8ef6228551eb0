"""The bodies of the commands that must start fast (``sql``, ``opts``, ``info``), shared by
both ways in: daydream/__main__.py answers plain invocations of them without typer (whose
import, with the pydantic it checks option values with, cost more than these commands' work),
and the typer commands of cli.py call the same functions, so that both print the same. Each
imports only what its command needs; library errors are ``DaydreamError``, which the callers
print."""

from __future__ import annotations

import sys
from pathlib import Path


def print_json(d: object) -> None:
    """D as indented JSON on stdout (what ``--json`` and ``--format json`` print)."""
    import orjson
    print(orjson.dumps(d, option=orjson.OPT_INDENT_2, default=str).decode(), flush=True)


def sql(query: str, store: Path, fmt: str = "table", out: Path | None = None) -> None:
    """`daydream sql`: the result on stdout, or written to OUT with its summary on stderr."""
    if query == "-":
        query = sys.stdin.read()
    from graphstore import db
    text = db.query(store, query, fmt, out)
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        print(text, file=sys.stderr, flush=True)


def opts(json: bool = False) -> None:
    """`daydream opts`: each optimization's signature and summary, from the catalog
    (transforms.catalog), so that no optimization is imported."""
    from transforms.catalog import listing
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
