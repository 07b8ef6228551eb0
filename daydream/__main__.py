"""``python -m daydream`` and the ``daydream`` command: :func:`main`.

``daydream sql``, ``opts``, ``info`` and ``ingest`` with plain arguments (each option at most
once, as ``FAST`` lists them) are answered here, without the CLI framework: importing typer,
and the pydantic it checks option values with, cost more than the first three commands' work,
and 0.2 s of an ingest. ``daydream --help`` and ``daydream`` alone are printed by
:mod:`daydream.help`, without typer's help module. Everything else (the commands' help,
every other command, any argument this parser does not take, and so every usage error) goes
to :mod:`daydream.cli`, which defines the commands this mirrors; both run the same bodies
(:mod:`daydream.quick`), and tests/daydream/test_output.py checks that ``FAST`` says what the
typer commands take and that both print the same.
"""

from __future__ import annotations

import sys
from typing import NoReturn

# command -> (its arguments (-1: one or more), {option taking a value: parameter},
# {flag: parameter}); a flag's --no- form is left to typer
FAST: dict[str, tuple[int, dict[str, str], dict[str, str]]] = {
    "sql": (1, {"--store": "store", "--format": "fmt", "-f": "fmt", "--out": "out",
                "-o": "out"}, {}),
    "opts": (0, {}, {"--json": "json"}),
    "info": (1, {"--store": "store"}, {"--json": "json"}),
    "ingest": (-1, {"--store": "store", "--workers": "jobs", "--jobs": "jobs", "-j": "jobs",
                    "--job": "job", "--ray": "ray"}, {"--force": "force", "--strict": "strict"}),
}
# the parameters of FAST's commands that take a whole number (else: text)
FAST_INT = frozenset({"jobs"})


def fast_args(argv: list[str]) -> tuple[str, list[str], dict[str, str | bool]] | None:
    """``(command, arguments, {parameter: value})`` when ARGV is a plain invocation of a
    command of ``FAST``; else None (typer's to answer)."""
    if not argv or argv[0] not in FAST:
        return None
    n, valued, flags = FAST[argv[0]]
    got: dict[str, str | bool] = {}
    pos: list[str] = []
    it = iter(argv[1:])
    for a in it:
        if a == "--":
            pos.extend(it)
            break
        if a.startswith("-") and a != "-":
            name, eq, val = a.partition("=")
            if name in flags and not eq and flags[name] not in got:
                got[flags[name]] = True
                continue
            if name not in valued or valued[name] in got or (eq and not name.startswith("--")):
                return None
            if not eq:
                val = next(it, None)
                if val is None:
                    return None
            if valued[name] in FAST_INT:
                try:
                    val = int(val)
                except ValueError:
                    return None
            got[valued[name]] = val
        else:
            pos.append(a)
    return (argv[0], pos, got) if len(pos) == n or (n < 0 and pos) else None


def _fast(command: str, pos: list[str], opts: dict) -> None:
    from pathlib import Path

    from daydream import quick
    from daydream.base.errors import DaydreamError
    from daydream.base.store import DEFAULT_STORE
    store = Path(opts.get("store", DEFAULT_STORE))
    try:
        if command == "sql":
            quick.sql(pos[0], store, opts.get("fmt", "table"),
                      Path(opts["out"]) if "out" in opts else None)
        elif command == "opts":
            quick.opts(json=bool(opts.get("json")))
        elif command == "ingest":
            if not quick.ingest(pos, store, opts.get("jobs"), bool(opts.get("force")),
                                bool(opts.get("strict")), opts.get("job"), opts.get("ray")):
                sys.exit(1)
        else:
            quick.info(pos[0], store, json=bool(opts.get("json")))
    except DaydreamError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("error: interrupted; the store is unchanged for traces not yet committed",
              file=sys.stderr)
        sys.exit(130)


def _help(argv: list[str]) -> bool:
    """``daydream --help`` and ``daydream`` alone through daydream.help, as typer ends them:
    a blank line after the help, on stdout with status 0 for --help, else on stderr with
    status 2 (a usage error). False where daydream.help leaves the help to typer."""
    if argv not in ([], ["--help"]):
        return False
    from daydream.cli import app
    from daydream.help import print_help
    if not print_help(app):
        return False
    print(file=sys.stdout if argv else sys.stderr, flush=True)
    if not argv:
        sys.exit(2)
    return True


def main() -> None:
    if sys.argv[1:2] == ["ingest"]:
        _ingest(sys.argv[1:])
    args = fast_args(sys.argv[1:])
    if args is not None:
        _fast(*args)
        return
    if _help(sys.argv[1:]):
        return
    from daydream.cli import main as cli_main
    cli_main()


def _ingest(argv: list[str]) -> NoReturn:
    """``daydream ingest``, tuned for a process that converts traces and then ends.

    Plain arguments are answered without typer (``FAST``), and the files they name are hashed
    from the start (``ingest.ids.hash_ahead``), on a thread, while the converters are
    imported: their ids must be known before anything is converted (a stored file is not
    converted again), and a large file's hash took as long as the imports after them.

    numpy is told not to ask for transparent huge pages (NUMPY_MADVISE_HUGEPAGE=0, read when
    numpy is imported): ingest fills many fresh arrays, and the scanner's string buffers are
    touched only as far as each batch needs, so with 2 MB pages the kernel zeroes far more
    memory than is used (a 1M-event trace: some 0.5 GB more page zeroing, 0.5-0.8 s of system
    CPU). And the process ends without the interpreter's teardown (``os._exit`` once stdout
    and stderr are flushed): its garbage collections over everything imported, and the
    freeing of every object one by one, cost 0.4 s of CPU after a large trace, and there is
    nothing left to write: every file is closed and committed, every thread joined, when the
    command returns (DuckDB's instance is closed first, so that what it spilled to disk
    goes). Under Ray, whose client shuts down at exit, it exits as usual."""
    import gc
    import os

    # collections of the youngest objects every 50,000 allocations, not 700: a large trace's
    # conversion and graph build allocate millions of objects, which the default thresholds
    # answered with some 300 collections, two of them full ones over every object imported
    # (0.1-0.15 s); the objects are freed by reference counting, not by these collections
    gc.set_threshold(50_000, 10, 10)
    args = fast_args(argv)
    if args is not None:
        from daydream.ingest.ids import hash_ahead
        hash_ahead(args[1])
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
    code: int | str | None = 0
    try:
        if args is not None:
            _fast(*args)
        else:
            from daydream.cli import main as cli_main
            cli_main()
    except SystemExit as e:
        code = e.code
    if "ray" in sys.modules:
        sys.exit(code)
    from daydream.base.store import close_duckdb_instance
    close_duckdb_instance()
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # as SystemExit prints a message
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    main()
