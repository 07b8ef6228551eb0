"""``python -m daydream`` and the ``daydream`` command: :func:`main`.

``daydream sql`` with plain arguments (a query, and ``--store``, ``--format``/``-f``,
``--out``/``-o`` each at most once) is answered here, without the CLI framework: importing
typer, and the pydantic it checks option values with, was about half of the command's start-up,
more than the query. Everything else (help, every other command, any argument this parser does
not take, and so every usage error) goes to :mod:`daydream.cli`, which defines the ``sql``
command this mirrors; tests/daydream/test_output.py checks that the two print the same.
"""

from __future__ import annotations

import sys

# the options of `daydream sql` (daydream.cli.sql) -> its parameters
SQL_OPTIONS = {"--store": "store", "--format": "fmt", "-f": "fmt", "--out": "out", "-o": "out"}


def sql_args(argv: list[str]) -> tuple[str, dict[str, str]] | None:
    """``(query, {parameter: value})`` when ARGV is a plain ``sql`` command; else None."""
    if not argv or argv[0] != "sql":
        return None
    got: dict[str, str] = {}
    pos: list[str] = []
    it = iter(argv[1:])
    for a in it:
        if a == "--":
            pos.extend(it)
            break
        if a.startswith("-") and a != "-":
            name, eq, val = a.partition("=")
            if name not in SQL_OPTIONS or SQL_OPTIONS[name] in got or (eq and
                                                                      not name.startswith("--")):
                return None
            if not eq:
                val = next(it, None)
                if val is None:
                    return None
            got[SQL_OPTIONS[name]] = val
        else:
            pos.append(a)
    return (pos[0], got) if len(pos) == 1 else None


def _sql(query: str, opts: dict[str, str]) -> None:
    from pathlib import Path

    from ingest import DEFAULT_STORE
    from ingest.errors import DaydreamError
    try:
        if query == "-":
            query = sys.stdin.read()
        from graphstore import db
        out = Path(opts["out"]) if "out" in opts else None
        text = db.query(Path(opts.get("store", DEFAULT_STORE)), query,
                        opts.get("fmt", "table"), out)
    except DaydreamError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("error: interrupted; the store is unchanged for traces not yet committed",
              file=sys.stderr)
        sys.exit(130)
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        print(text, file=sys.stderr)


def main() -> None:
    args = sql_args(sys.argv[1:])
    if args is not None:
        _sql(*args)
        return
    from daydream.cli import main as cli_main
    cli_main()


if __name__ == "__main__":
    main()
