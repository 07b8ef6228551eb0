"""``python -m daydream`` and the ``daydream`` command: :func:`main`.

The command line is declared once, in daydream/cli.py, and read by daydream/commandline.py:
plain command lines without typer, the rest (help, usage errors) through the typer app made
from the same declarations. ``daydream ingest`` is tuned here for a process that converts
traces and then ends (``_ingest``), and ``ingest`` and ``predict`` end their process without
the interpreter's teardown (``_run_and_end``).
"""

from __future__ import annotations

import sys
from typing import NoReturn


def main() -> None:
    if sys.argv[1:2] == ["ingest"]:
        _ingest(sys.argv[1:])
    if sys.argv[1:2] == ["predict"]:
        _run_and_end(sys.argv[1:])
    from daydream import commandline
    commandline.main()


def _ingest(argv: list[str]) -> NoReturn:
    """``daydream ingest``, tuned for a process that converts traces and then ends.

    Plain arguments are read without typer (``commandline.parse``), and the files they name
    are hashed from the start (``ingest.ids.hash_ahead``), on a thread, while the converters are
    imported: their ids must be known before anything is converted (a stored file is not
    converted again), and a large file's hash took as long as the imports after them.

    numpy is told not to ask for transparent huge pages (NUMPY_MADVISE_HUGEPAGE=0, read when
    numpy is imported): ingest fills many fresh arrays, and the scanner's string buffers are
    touched only as far as each batch needs, so with 2 MB pages the kernel zeroes far more
    memory than is used (a 1M-event trace: some 0.5 GB more page zeroing, 0.5-0.8 s of system
    CPU); nor is Arrow's allocator (MIMALLOC_ALLOW_THP=0: mimalloc asks for them on the 1 GB
    arena it reserves, and a fleet's small traces touched a fresh 2 MB page for a few KB: some
    3% of the CPU of 100 small traces in page zeroing). OpenBLAS, which ingest never calls,
    starts no threads (OPENBLAS_NUM_THREADS=1): each spun for a while at numpy's import, in
    every process (~3% of the same fleet's CPU). These reach the spawned workers too. Then
    the command runs and the process ends (``_run_and_end``)."""
    import gc
    import os

    # collections of the youngest objects every 50,000 allocations, not 700: a large trace's
    # conversion and graph build allocate millions of objects, which the default thresholds
    # answered with some 300 collections, two of them full ones over every object imported
    # (0.1-0.15 s); the objects are freed by reference counting, not by these collections
    gc.set_threshold(50_000, 10, 10)
    from daydream import commandline
    got = commandline.parse(argv)
    if got is not None:
        from daydream.ingest.ids import hash_ahead
        hash_ahead(got[1]["paths"])
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
    os.environ.setdefault("MIMALLOC_ALLOW_THP", "0")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    _run_and_end(argv)


def _run_and_end(argv: list[str]) -> NoReturn:
    """Run the command ARGV, then end the process without the interpreter's teardown
    (``base.ending.end_without_teardown`` once DuckDB's instance is closed, so that what it
    spilled to disk goes): its garbage collections over everything imported, and the freeing
    of every object one by one, cost 0.4 s of CPU after a large trace, and 0.14 s of the wall
    clock at the end of a fleet's ``predict --all``, and there is nothing left to write: every
    file is closed and committed, every thread and worker joined, when ``ingest`` or
    ``predict`` returns. Under Ray, whose client shuts down at exit, it exits as usual."""
    from daydream import commandline
    code: int | str | None = 0
    try:
        commandline.main(argv)
    except SystemExit as e:
        code = e.code
    if "ray" in sys.modules:
        sys.exit(code)
    from daydream.base.store import close_duckdb_instance
    close_duckdb_instance()
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # as SystemExit prints a message
        code = 1
    compiled = sys.modules.get("daydream.base.compiled")
    if compiled is not None:  # what numba compiled on first use, said before the exit
        compiled.say_compiled()
    from daydream.base.ending import end_without_teardown
    end_without_teardown(code or 0)


if __name__ == "__main__":
    main()
