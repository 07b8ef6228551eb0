"""How a process that has done its work ends: at once, without the interpreter's teardown.

Standard library only (the ``daydream`` command calls it after ``ingest`` and ``predict``,
whatever they imported; the pool workers of ``base.runner`` call it at their exit).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn


def end_without_teardown(code: int = 0) -> NoReturn:
    """End this process now, its output flushed, without the interpreter's teardown (the
    garbage collections over every object imported and the freeing of each, one by one):
    where nothing is left to write, that teardown is time someone waits for (0.4 s of CPU
    after a large trace's ingest; a pool worker that had predicted or converted a fleet's
    traces took 0.1 s to end, which the pool's ``close`` and the fleet's command waited
    for). Exit handlers not run by then are skipped: call it once every file is closed and
    every thread joined."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing to keep
            stream.flush()
    os._exit(code)
