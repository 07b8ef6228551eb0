"""``python -m daydream`` and the ``daydream`` command: :func:`main`.

``daydream sql``, ``opts`` and ``info`` with plain arguments (each option at most once, as
``FAST`` lists them) are answered here, without the CLI framework: importing typer, and the
pydantic it checks option values with, cost more than these commands' work. ``daydream
--help`` and ``daydream`` alone are printed by :mod:`daydream.help`, without typer's help
module. Everything else (the commands' help, every other command, any argument this parser
does not take, and so every usage error) goes to :mod:`daydream.cli`, which defines the
commands this mirrors; both run the same bodies (:mod:`daydream.quick`), and
tests/daydream/test_output.py checks that ``FAST`` says what the typer commands take and that
both print the same.
"""

from __future__ import annotations

import sys

# command -> (its arguments, {option taking a value: parameter}, {flag: parameter})
FAST: dict[str, tuple[int, dict[str, str], dict[str, str]]] = {
    "sql": (1, {"--store": "store", "--format": "fmt", "-f": "fmt", "--out": "out",
                "-o": "out"}, {}),
    "opts": (0, {}, {"--json": "json"}),
    "info": (1, {"--store": "store"}, {"--json": "json"}),
}


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
            got[valued[name]] = val
        else:
            pos.append(a)
    return (argv[0], pos, got) if len(pos) == n else None


def _fast(command: str, pos: list[str], opts: dict) -> None:
    from pathlib import Path

    from daydream import quick
    from ingest import DEFAULT_STORE
    from ingest.errors import DaydreamError
    store = Path(opts.get("store", DEFAULT_STORE))
    try:
        if command == "sql":
            quick.sql(pos[0], store, opts.get("fmt", "table"),
                      Path(opts["out"]) if "out" in opts else None)
        elif command == "opts":
            quick.opts(json=bool(opts.get("json")))
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
    args = fast_args(sys.argv[1:])
    if args is not None:
        _fast(*args)
        return
    if _help(sys.argv[1:]):
        return
    from daydream.cli import main as cli_main
    cli_main()


if __name__ == "__main__":
    main()
