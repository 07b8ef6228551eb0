"""Write schedules as a Chrome trace (opens in Perfetto and chrome://tracing).

Each schedule is one process (e.g. "measured", "simulated", "predicted"), each unit a thread in
it, so the timelines lie one above the other. Written in chunks with orjson: no list of all
events in memory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa

CHUNK = 50_000
# Zero-length tasks that only anchor a graph's start (graphstore.build, graphstore.job): not
# work, so no event and no track of their own.
MARKERS = ["<trace start>", "<job start>"]


def write_timeline(path: Path | str, g: dict[str, pa.Table],
                   schedules: list[tuple]) -> int:
    """schedules: (process name, start_ns, end_ns) with times relative to the trace start, of
    the tasks of G; or (process name, start_ns, end_ns, graph) for a schedule of another graph
    (a rewritten one, whose tasks are not G's). Units that run no task in a schedule (the
    origin marker's) get no track. Returns the number of events written."""
    n = 0
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(b'{"displayTimeUnit": "ns", "traceEvents": [\n')
        first = True

        def emit(ev: dict) -> None:
            nonlocal first, n
            if not first:
                f.write(b",\n")
            first = False
            f.write(orjson.dumps(ev))
            n += 1

        for pid, sched in enumerate(schedules, start=1):
            pname, start, end = sched[:3]
            gs = sched[3] if len(sched) > 3 and sched[3] is not None else g
            task, unit = gs["task"], gs["unit"]
            names = task["name"].to_pylist()
            kinds = task["kind"].to_pylist()
            phases = task["phase"].to_pylist()
            layers = task["layer"].to_pylist()
            units = task["unit_id"].to_numpy()
            unit_names = unit["name"].to_pylist()
            emit({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                  "args": {"name": pname}})
            emit({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                  "args": {"sort_index": pid}})
            marker = np.isin(np.asarray(names, object), MARKERS)
            busy = set(np.unique(units[~marker]).tolist())
            for u, un in enumerate(unit_names):
                if u in busy:
                    emit({"ph": "M", "name": "thread_name", "pid": pid, "tid": u,
                          "args": {"name": un}})
            order = np.argsort(start, kind="stable")
            for lo in range(0, len(order), CHUNK):
                for t in order[lo:lo + CHUNK]:
                    if t == 0 or marker[t]:
                        continue  # the origin markers (trace start, a job's and its ranks')
                    emit({"ph": "X", "name": names[t], "cat": kinds[t], "pid": pid,
                          "tid": int(units[t]), "ts": int(start[t]) / 1000.0,
                          "dur": int(end[t] - start[t]) / 1000.0,
                          "args": {"task": int(t), "phase": phases[t], "layer": layers[t]}})
        f.write(b"\n]}\n")
    tmp.replace(path)
    return n
