"""Run every path of the simulator's kernels once (``daydream/warmup.py`` calls ``warm``, and so
does a fleet's worker before its first trace).

Where the kernels are compiled ahead of time (daydream.base.compiled) this loads nothing: they
are in an extension module. Without a C compiler numba compiles them on first use (about 15 s
for the simulator) and caches the machine code beside the sources, so that later processes
only load it (some 0.2 s of one core, which this spends before the first prediction).
"""

from __future__ import annotations

import time

import numpy as np

from daydream.simulate.codes import END, FCFS, FIXED, PRIORITY, START, START_START
from daydream.simulate.engine import simulate
from daydream.simulate.graph import SimGraph


def warm() -> float:
    """Simulate a tiny graph that takes every path of the core: a FIXED unit whose order_key is
    not sorted by index (relink), FCFS and PRIORITY channels (dispatches, then the bitmap
    drain), all three edge kinds, and the critical path. Returns the seconds it took."""
    t = time.perf_counter()
    g = SimGraph.from_edges(
        dur_ns=[2, 1, 3, 1, 2, 1],
        unit=[0, 0, 1, 2, 2, 0],
        unit_policy=[FIXED, FCFS, PRIORITY],
        src=np.array([1, 0, 2, 3, 4, 0]),
        dst=np.array([0, 2, 3, 4, 5, 3]),
        lag_ns=np.array([0, 1, 0, 0, 2, 1]),
        edge_kind=np.array([START, START_START, START, START, END, START]),
        order_key=[1, 0, 2, 3, 4, 5],
        priority=[0, 0, 0, 1, 0, 0])
    simulate(g).critical_path()
    return time.perf_counter() - t
