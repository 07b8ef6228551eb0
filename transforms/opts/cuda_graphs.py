"""CUDA graphs: forward and backward captured once and replayed with one launch."""

from __future__ import annotations

import numpy as np
import polars as pl

from daydream.transforms.constants import CUDA_GRAPHS as C
from daydream.transforms.primitives import Graph, isin
from daydream.transforms.registry import Context, register

REGION = ("forward", "backward")


def region_tasks(g: Graph) -> np.ndarray:
    """CPU tasks (calls and host time) of the captured region: phases forward and backward of
    an iteration, blocking calls excepted."""
    return (isin(g.array("kind"), ("api", "host")) & isin(g.array("phase"), REGION)
            & (g.array("iteration", -1) >= 0) & ~g.array("blocking"))


@register("cuda_graphs", removes_cpu=True, shrinks=True)
def cuda_graphs(g: Graph, ctx: Context) -> Graph:
    """CUDA graphs over forward+backward: the region's host time and launch calls vanish.

    In each iteration the CPU tasks of phases forward and backward (not blocking calls) are
    scaled to 0 (kept as tasks, so the GPU work keeps its launch edges and order) and one
    cudaGraphLaunch call (CUDA_GRAPHS graph_launch_ns) is inserted before the first of them on
    each thread. GPU work is unchanged; launch latencies stay on the launch edges."""
    sel = region_tasks(g)
    if not sel.any():
        ctx.notes.append("cuda_graphs: no forward/backward CPU tasks; unchanged")
        return g
    # the first region task of each (iteration, thread), in id order
    it, unit = g.array("iteration", -1), g.array("unit_id")
    first: dict[tuple[int, int], int] = {}
    for i in np.flatnonzero(sel).tolist():
        first.setdefault((int(it[i]), int(unit[i])), i)
    rows = [{"at": i, "kind": "api", "unit_id": u, "name": "cudaGraphLaunch",
             "dur_ns": C["graph_launch_ns"]["value"]} for (_, u), i in first.items()]
    g = g.scale(sel, 0.0)
    g, _ = g.insert(pl.DataFrame(rows))
    return g
