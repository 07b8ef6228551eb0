"""CUDA graphs: forward and backward captured once and replayed with one launch per segment."""

from __future__ import annotations

import numpy as np
import polars as pl

from daydream.transforms.constants import CUDA_GRAPHS as C
from daydream.transforms.devices import achieved_memory_bandwidth
from daydream.transforms.opts.distributed import launch_calls, rows_frame
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register

REGION = ("forward", "backward")


def region_tasks(g: Graph) -> np.ndarray:
    """CPU tasks (calls and host time) of the captured region: phases forward and backward of
    an iteration, blocking calls excepted."""
    kind, phase = g.array("kind"), g.array("phase")
    return (((kind == "api") | (kind == "host")) & _in_region(phase)
            & (g.array("iteration", -1) >= 0) & ~g.array("blocking"))


def _in_region(phase: np.ndarray) -> np.ndarray:
    # elementwise == on an object array: a tenth of the cost of a set lookup per task
    return (phase == REGION[0]) | (phase == REGION[1])


def segments(g: Graph, sel: np.ndarray) -> dict[tuple[int, int, int], int]:
    """The first region task of each graph segment: per (iteration, thread), a blocking call
    (a sync, an ``.item()``) cannot be captured and ends one graph, the next region task
    starts the next; keyed (iteration, thread, segment), in id order."""
    it, unit = g.array("iteration", -1), g.array("unit_id")
    blocking = g.array("blocking") & _in_region(g.array("phase")) & (it >= 0)
    rows = np.flatnonzero(sel | blocking)
    if not len(rows):
        return {}
    it_r, unit_r = it[rows].astype(np.int64), unit[rows].astype(np.int64)
    blk = blocking[rows]
    # rows grouped by (iteration, thread), id order kept within a group; a group's segment
    # number is the count of its blocking calls before the row
    order = np.lexsort((rows, unit_r, it_r))
    it_o, unit_o, blk_o = it_r[order], unit_r[order], blk[order]
    new_group = np.ones(len(order), bool)
    new_group[1:] = (it_o[1:] != it_o[:-1]) | (unit_o[1:] != unit_o[:-1])
    cum = np.cumsum(blk_o)
    group_base = np.maximum.accumulate(np.where(new_group, cum - blk_o, 0))
    seg = cum - blk_o - group_base
    # a segment's first region task: the first non-blocking row of each (group, segment)
    cand = np.flatnonzero(~blk_o)
    if not len(cand):
        return {}
    gid = np.cumsum(new_group)[cand]
    first = np.ones(len(cand), bool)
    first[1:] = (gid[1:] != gid[:-1]) | (seg[cand][1:] != seg[cand][:-1])
    pick = cand[first]
    out = {(int(a), int(b), int(c)): int(t) for a, b, c, t in zip(
        it_o[pick].tolist(), unit_o[pick].tolist(), seg[pick].tolist(),
        rows[order][pick].tolist(), strict=True)}
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


def input_copies(g: Graph) -> dict[int, tuple[int, int]]:
    """Per iteration, the bytes the step copied from the host (its inputs and targets) and
    the first GPU task of its forward pass (where a replay's static inputs must be ready)."""
    kind, it = g.array("kind"), g.array("iteration", -1)
    names = g.array("name", "")
    nbytes = g.array("bytes", 0)
    phase = g.array("phase")
    copy = np.flatnonzero((kind == "memcpy") & (it >= 0))
    h2d = np.zeros(len(kind), bool)
    h2d[copy] = ["htod" in x.lower().replace(" ", "") for x in names[copy].tolist()]
    if not h2d.any():
        return {}
    gpu_fwd = np.flatnonzero(((kind == "kernel") | (kind == "memcpy") | (kind == "memset"))
                             & (phase == "forward") & (it >= 0) & ~h2d)
    its, inv = np.unique(it[h2d], return_inverse=True)
    b = np.bincount(inv.reshape(-1), weights=nbytes[h2d], minlength=len(its))
    # the first forward GPU task of each iteration: ids ascend, so the first of its rows
    f_it, f_at = np.unique(it[gpu_fwd], return_index=True)
    first_of = dict(zip(f_it.tolist(), gpu_fwd[f_at].tolist(), strict=True))
    return {int(k): (int(n), first_of[k]) for k, n in zip(its.tolist(), b.tolist(),
                                                           strict=True)
            if n > 0 and k in first_of}


@register("cuda_graphs", removes_cpu=True)
def cuda_graphs(g: Graph, ctx: Context, *, static_inputs: bool = True) -> Graph:
    """CUDA graphs over forward+backward: the region's host time and launch calls vanish, and
    the replay pays its own costs, so a GPU-bound job can come out slower.

    In each iteration the CPU tasks of phases forward and backward (not blocking calls) are
    scaled to 0 (kept as tasks, so the GPU work keeps its launch edges and order). A blocking
    call cannot be captured: it ends a graph, and the work after it is another graph, so one
    cudaGraphLaunch call (CUDA_GRAPHS graph_launch_ns) is inserted before the first region
    task of each segment on each thread, after the sync it waits for. With STATIC_INPUTS
    (default) a replay reads its inputs from the static buffers it was captured with: the
    step's host-to-device bytes are copied into them (``static_input.copy_(data)`` in
    PyTorch's CUDA graphs guide; the copies PyGraph, arXiv:2503.19779, finds making graphs
    slower) by a device-to-device copy before the first forward GPU task, reading and
    writing the bytes at the GPU's achieved memory bandwidth (memory_gbps x GPU_MEMORY
    achieved), launched from the thread; it holds the whole replay back. STATIC_INPUTS false:
    the loader writes straight into the static buffers. GPU work is otherwise unchanged;
    launch latencies stay on the launch edges."""
    sel = region_tasks(g)
    if not sel.any():
        ctx.notes.append("cuda_graphs: no forward/backward CPU tasks; unchanged")
        return g
    first = segments(g, sel)
    copies = input_copies(g) if static_inputs else {}
    rows = [{"at": i, "kind": "api", "unit_id": u, "name": "cudaGraphLaunch",
             "dur_ns": C["graph_launch_ns"]["value"]} for (_, u, _), i in first.items()]
    g = g.scale(sel, 0.0)
    unit = g.array("unit_id")
    bw = achieved_memory_bandwidth(ctx.device)
    for nbytes, at in copies.values():
        rows.append({"at": at, "kind": "memcpy", "unit_id": int(unit[at]), "bytes": nbytes,
                     "name": "Memcpy DtoD (Device -> Device) static inputs (inserted)",
                     "dur_ns": max(1, int(round(2 * nbytes / bw)))})
    k = len(first)
    beside = [r["at"] for r in rows[k:]]
    rows_l, ed_l = launch_calls(g, beside, len(rows)) if beside else ([], None)
    for r in rows_l:
        r["name"] = "cudaMemcpyAsync (inserted)"
    # the launch edges name the copies as the k-th new tasks of their own list: shift them
    if ed_l is not None and ed_l.height:
        ed_l = ed_l.with_columns(pl.col("dst") - k)
    g, _ = g.insert(rows_frame(rows + rows_l), ed_l)
    per_it = max(len({i for i, _, _ in first}), 1)
    ctx.notes.append(
        f"cuda_graphs: {len(first)} graph launches ({len(first) / per_it:g} per iteration: "
        "blocking calls end a graph)"
        + (f"; static inputs copied before each replay: "
           f"{np.mean([b for b, _ in copies.values()]) / 1e6:.2f} MB a step at "
           f"{bw:.0f} GB/s" if copies else
           "; no static-input copy" + ("" if not static_inputs else
                                      " (the trace copies no inputs from the host)")))
    return g
