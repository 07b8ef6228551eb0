"""Peak memory of a benchmarked process, read the way that is not inherited.

``ru_maxrss`` of a process started by ``bench/run.py`` is at least what run.py held when it
started it (Linux keeps the high-water mark across fork and exec), and run.py holds about a
gigabyte by the fleet section: every driver then read 983 MiB. ``VmHWM`` is the high-water
mark of the process's own address space, made anew at exec.
"""

from __future__ import annotations

from pathlib import Path


def hwm_mib() -> float | None:
    """This process's peak resident set since its exec (VmHWM), MiB; None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None
