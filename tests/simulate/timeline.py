"""Helpers for the toy-graph tests: build a graph from named tasks, draw a schedule as text.

A drawing has one row per unit and one column per nanosecond; each task fills its columns with
its one-letter name, idle time is '.', and trailing idle time is cut.
"""

from __future__ import annotations

import textwrap

import numpy as np

from daydream.simulate import SimGraph


def build(tasks, edges, policies, priority=None, order_key=None) -> tuple[SimGraph, str]:
    """``tasks``: [(letter, unit, dur_ns)], in index order; ``edges``: [(src letter, dst letter,
    lag_ns, kind)] with kind "start", "end", "start_start" or "held" (a START edge held only
    while its source runs: ``SimGraph.held_if_running``). Returns the graph and the letters by
    index."""
    index = {name: i for i, (name, _, _) in enumerate(tasks)}
    src = [index[s] for s, _, _, _ in edges]
    dst = [index[d] for _, d, _, _ in edges]
    lag = [lag for _, _, lag, _ in edges]
    kind = [{"start": 0, "end": 1, "start_start": 2, "held": 0}[k] for _, _, _, k in edges]
    held = [k == "held" for _, _, _, k in edges]
    g = SimGraph.from_edges(
        dur_ns=[d for _, _, d in tasks], unit=[u for _, u, _ in tasks], unit_policy=policies,
        src=np.array(src, np.int64), dst=np.array(dst, np.int64), lag_ns=np.array(lag, np.int64),
        edge_kind=np.array(kind, np.int8), order_key=order_key, priority=priority,
        held_if_running=np.array(held, bool) if any(held) else None)
    return g, "".join(name for name, _, _ in tasks)


def draw(sched, graph: SimGraph, names: str, unit_names: list[str]) -> str:
    width = max(unit_names, key=len)
    rows = []
    for u, uname in enumerate(unit_names):
        cells = ["."] * int(sched.makespan_ns)
        for t in np.flatnonzero(graph.unit == u):
            for x in range(int(sched.start_ns[t]), int(sched.end_ns[t])):
                assert cells[x] == ".", f"unit {uname} runs two tasks at {x}"
                cells[x] = names[t]
        rows.append(f"{uname:<{len(width)}} |{''.join(cells).rstrip('.')}")
    return "\n".join(rows)


def expect(drawing: str) -> str:
    """The expected drawing from an indented block; ruler lines (starting with '#') dropped."""
    lines = textwrap.dedent(drawing).strip("\n").splitlines()
    return "\n".join(line.rstrip() for line in lines if not line.lstrip().startswith("#"))
