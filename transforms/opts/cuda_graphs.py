"""CUDA graphs: forward and backward captured once and replayed with one launch per segment."""

from __future__ import annotations

import numpy as np
import polars as pl

from daydream.transforms.constants import CUDA_GRAPHS as C
from daydream.transforms.constants import GPU_MEMORY
from daydream.transforms.devices import gpu
from daydream.transforms.opts.distributed import launch_calls, rows_frame
from daydream.transforms.primitives import Graph, isin
from daydream.transforms.registry import Context, register

REGION = ("forward", "backward")


def region_tasks(g: Graph) -> np.ndarray:
    """CPU tasks (calls and host time) of the captured region: phases forward and backward of
    an iteration, blocking calls excepted."""
    return (isin(g.array("kind"), ("api", "host")) & isin(g.array("phase"), REGION)
            & (g.array("iteration", -1) >= 0) & ~g.array("blocking"))


def segments(g: Graph, sel: np.ndarray) -> dict[tuple[int, int, int], int]:
    """The first region task of each graph segment: per (iteration, thread), a blocking call
    (a sync, an ``.item()``) cannot be captured and ends one graph, the next region task
    starts the next; keyed (iteration, thread, segment), in id order."""
    it, unit = g.array("iteration", -1), g.array("unit_id")
    blocking = g.array("blocking") & isin(g.array("phase"), REGION) & (it >= 0)
    first: dict[tuple[int, int, int], int] = {}
    seg: dict[tuple[int, int], int] = {}
    for i in np.flatnonzero(sel | blocking).tolist():
        key = (int(it[i]), int(unit[i]))
        if blocking[i]:
            if key in seg:
                seg[key] += 1
            continue
        first.setdefault(key + (seg.setdefault(key, 0),), i)
    return first


def input_copies(g: Graph) -> dict[int, tuple[int, int]]:
    """Per iteration, the bytes the step copied from the host (its inputs and targets) and
    the first GPU task of its forward pass (where a replay's static inputs must be ready)."""
    t = g.task
    kind, it = g.array("kind"), g.array("iteration", -1)
    names = t["name"].fill_null("").to_list()
    nbytes = g.array("bytes", 0)
    phase = g.array("phase")
    h2d = (kind == "memcpy") & np.asarray(
        ["htod" in x.lower().replace(" ", "") for x in names], bool) & (it >= 0)
    gpu_fwd = isin(kind, ("kernel", "memcpy", "memset")) & (phase == "forward") & (it >= 0) \
        & ~h2d
    out: dict[int, tuple[int, int]] = {}
    for k in np.unique(it[h2d]).tolist():
        first = np.flatnonzero(gpu_fwd & (it == k))
        b = int(nbytes[h2d & (it == k)].sum())
        if len(first) and b > 0:
            out[int(k)] = (b, int(first[0]))
    return out


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
    bw = gpu(ctx.device, "memory_gbps").memory_gbps * GPU_MEMORY["achieved"]["value"]
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
