"""Per-layer views of a graph for the memory optimizations (checkpointing, offload): which
layers there are, in forward order, and for each (iteration, layer) the tasks of its forward
and the tasks that start its backward."""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from daydream.base.errors import DaydreamError
from daydream.graphstore.schema import CPU_KINDS, LOCAL_GPU_KINDS
from daydream.transforms.primitives import Graph

# GPU work a layer recomputes or whose input it copies: kernels, copies and sets (not
# collectives, which belong to the data-parallel machinery, not to the layer's math).


def forward_order(g: Graph) -> list[str]:
    """Layers that have forward GPU work and backward GPU work in some iteration, in the order
    of their first forward GPU task."""
    t = g.task.with_row_index("id")
    base = t.filter(pl.col("layer").is_not_null(), pl.col("iteration").is_not_null(),
                    pl.col("kind").is_in(LOCAL_GPU_KINDS))
    fwd = base.filter(pl.col("phase") == "forward").group_by("layer").agg(
        pl.col("id").min().alias("first"))
    bwd = base.filter(pl.col("phase") == "backward").select("layer").unique()
    return fwd.join(bwd, on="layer", how="semi").sort("first")["layer"].to_list()


def pick(g: Graph, layers: str, every: int, what: str) -> list[str]:
    """The layers an optimization applies to: those of ``forward_order`` whose name matches the
    regular expression LAYERS (case-insensitive search; empty: all), then every EVERY-th of
    them starting with the first."""
    if every < 1:
        raise DaydreamError(f"{what}: every must be >= 1, got {every}")
    try:
        rx = re.compile(layers, re.IGNORECASE)
    except re.error as e:
        raise DaydreamError(f"{what}: layers {layers!r} is not a regular expression: {e}"
                            ) from None
    return [x for x in forward_order(g) if rx.search(x)][::every]


def sites(g: Graph, chosen: list[str]) -> list[dict]:
    """For each (iteration, layer) of CHOSEN that has forward GPU work and backward GPU work:
    ``fwd_gpu`` (its forward GPU task ids), ``fwd_cpu`` (its forward CPU tasks, blocking calls
    excepted), ``bwd_gpu`` (first backward GPU task), ``bwd_api`` (the call that launched it),
    ``bwd_cpu`` (the first backward CPU task of the layer on that call's thread, else the call
    itself), ``bwd_thread``. In forward order within each iteration."""
    if not chosen:
        return []
    t = g.task.with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
    t = t.filter(pl.col("layer").is_in(chosen), pl.col("iteration").is_not_null())
    la = dict(zip(g.edge.filter(pl.col("kind") == "launch")["dst"].to_list(),
                  g.edge.filter(pl.col("kind") == "launch")["src"].to_list(), strict=False))
    unit = g.task["unit_id"].to_numpy()
    out = []
    gpu = pl.col("kind").is_in(LOCAL_GPU_KINDS)
    cpu = pl.col("kind").is_in(CPU_KINDS)
    for (it, layer), s in t.group_by("iteration", "layer"):
        fg = s.filter(gpu, pl.col("phase") == "forward")["id"].sort().to_list()
        bg = s.filter(gpu, pl.col("phase") == "backward")["id"].sort().to_list()
        if not fg or not bg or bg[0] not in la:
            continue
        api = int(la[bg[0]])
        th = int(unit[api])
        bc = s.filter(cpu, pl.col("phase") == "backward", pl.col("unit_id") == th)["id"]
        out.append({
            "iteration": int(it), "layer": layer, "fwd_gpu": fg,
            "fwd_cpu": s.filter(cpu, pl.col("phase") == "forward", ~pl.col("blocking"))["id"]
            .sort().to_list(),
            "bwd_gpu": int(bg[0]), "bwd_api": api,
            "bwd_cpu": int(min(bc.min(), api)) if bc.len() else api, "bwd_thread": th})
    out.sort(key=lambda r: (r["iteration"], r["fwd_gpu"][0]))
    return out


def launch_lag(g: Graph) -> dict[int, tuple[int, int]]:
    """GPU task id -> (launching call, lag of its launch edge)."""
    e = g.edge.filter(pl.col("kind") == "launch")
    return {int(d): (int(s), int(lg)) for s, d, lg in zip(e["src"].to_list(), e["dst"].to_list(),
                                                         e["lag_ns"].to_list(), strict=False)}


def next_on_unit(g: Graph, ids: list[int]) -> dict[int, int]:
    """For each task id, the next task on its unit in id (start) order, where there is one."""
    unit = g.task["unit_id"].to_numpy()
    out = {}
    for u in np.unique(unit[ids]):
        on = np.flatnonzero(unit == u)
        pos = np.searchsorted(on, [i for i in ids if unit[i] == u])
        for i, p in zip([i for i in ids if unit[i] == u], pos, strict=False):
            if p + 1 < len(on):
                out[int(i)] = int(on[p + 1])
    return out
