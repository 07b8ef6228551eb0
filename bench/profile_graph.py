"""Where graph building spends its time (issue 3): `graphstore.load.graph_tables` on one trace.

    python bench/profile_graph.py [--trace FILE] [--repeats N] [--top N]
                                  [--lines graphstore.build:build,graphstore.load:graph_tables]

Ingests the trace into a temporary store, times graph_tables (best of N), prints cProfile's
slowest functions by cumulative time and, with --lines, the slowest lines of the named
functions. The line timer runs on sys.settrace: its overhead inflates lines that do little, so
read it to rank lines, not for seconds. On a shared machine time old against new in one
process, alternating, best of several.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import importlib
import linecache
import pstats
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TRANSFORMER = ROOT.parent / "shared" / "traces" / "hta" / "transformer_ddp_v100_rank1.json.gz"


def line_times(targets: list[str], fn, runs: int) -> list[tuple[float, str]]:
    """Milliseconds per call spent on each line of the ``module:function`` targets (calls made
    from a line count to it), slowest first."""
    codes = set()
    for spec in targets:
        mod, name = spec.split(":")
        obj = importlib.import_module(mod)
        for part in name.split("."):
            obj = getattr(obj, part)
        codes.add(obj.__code__)
    spent: dict[tuple[str, int], float] = collections.defaultdict(float)
    last: dict[int, tuple[int, float]] = {}

    def local(frame, event, arg):
        now = time.perf_counter()
        prev = last.get(id(frame))
        if prev is not None:
            spent[frame.f_code.co_filename, prev[0]] += now - prev[1]
        if event == "return":
            last.pop(id(frame), None)
        else:
            last[id(frame)] = (frame.f_lineno, time.perf_counter())
        return local

    sys.settrace(lambda frame, event, arg: local if frame.f_code in codes else None)
    try:
        for _ in range(runs):
            fn()
    finally:
        sys.settrace(None)
    return sorted(((t / runs * 1e3, f"{Path(f).name}:{n} {linecache.getline(f, n).strip()}")
                   for (f, n), t in spent.items()), reverse=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", type=Path, default=TRANSFORMER)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--lines", default="", help="module:function,... to time line by line")
    a = ap.parse_args()
    from daydream import api
    from daydream.graphstore.load import activity_tables, graph_tables

    with tempfile.TemporaryDirectory() as tmp:
        st = api.open_store(Path(tmp) / "s")
        api.ingest([a.trace], st.root, jobs=1)
        tables = activity_tables(st, st.trace_ids()[0])
    g, _ = graph_tables(tables)  # warm-up (compiled kernels load)
    times = []
    for _ in range(a.repeats):
        t = time.perf_counter()
        graph_tables(tables)
        times.append(time.perf_counter() - t)
    print(f"{a.trace.name}: {g.n_tasks:,} tasks, {len(g.src):,} edges; graph_tables best "
          f"{min(times):.3f} s, median {sorted(times)[len(times) // 2]:.3f} s "
          f"(of {a.repeats})")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3):
        graph_tables(tables)
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(a.top)
    if a.lines:
        for ms, where in line_times(a.lines.split(","), lambda: graph_tables(tables),
                                    3)[:a.top]:
            print(f"{ms:8.2f} ms  {where[:110]}")


if __name__ == "__main__":
    main()
