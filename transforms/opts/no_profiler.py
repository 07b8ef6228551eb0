"""The job as it runs without the profiler."""

from __future__ import annotations

from daydream.base.errors import DaydreamError
from daydream.transforms import profiler
from daydream.transforms.constants import PROFILER
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register


@register("no_profiler", shrinks=True)
def no_profiler(g: Graph, ctx: Context) -> Graph:
    """The same job without the profiler: each thread's host time per iteration loses the
    profiler's estimated cost (transforms.constants.PROFILER: per recorded op and per traced
    runtime call; transforms/profiler.py). Needs the trace's op ranges (the range table) to
    count the recorded ops."""
    ranges = None
    if ctx.activity is not None:
        try:
            ranges = ctx.activity("range")
        except DaydreamError:
            ranges = None
    if ranges is None:
        ctx.notes.append("no_profiler: the trace's op ranges are not available; unchanged")
        return g
    g2, removed = profiler.without_profiler(g, ranges)
    if removed <= 0:
        ctx.notes.append("no_profiler: no recorded op or traced runtime call in the "
                         "iterations (an Nsight export's NVTX ranges, or a job): no profiler "
                         "cost to take out; unchanged")
        return g
    ctx.notes.append(f"no_profiler: {removed / 1e6:.2f} ms of host time per iteration taken out "
                     f"({PROFILER['per_op_ns']['value'] / 1e3:g} us per recorded op, "
                     f"{PROFILER['per_call_ns']['value'] / 1e3:g} us per runtime call)")
    return g2
