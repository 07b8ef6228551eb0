"""Deep gradient compression (Lin et al., ICLR 2018): sparse gradients, less traffic."""

from __future__ import annotations

import numpy as np
import polars as pl

from daydream.base.errors import DaydreamError
from daydream.transforms import comm
from daydream.transforms.constants import DISTRIBUTED as C
from daydream.transforms.devices import achieved_memory_bandwidth
from daydream.transforms.opts.distributed import (
    current_link,
    feeders,
    gradient_allreduces,
    launch_calls,
    rows_frame,
    set_comm,
)
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register


@register("dgc", shrinks=True)
def dgc(g: Graph, ctx: Context, *, ratio: float = 0.001) -> Graph:
    """Deep gradient compression: each gradient all-reduce sends only RATIO of the gradients.

    The top RATIO of each message (values and their indices: 2 x RATIO x bytes per rank) is
    exchanged with an all-gather instead of the dense all-reduce, so the transfer becomes
    (n-1) x 2 x RATIO x bytes / B where it was 2(n-1)/n x bytes / B; latency steps follow the
    all-gather (n-1). Before each collective a selection kernel is inserted on the stream of
    the kernel that made the gradients ready: it streams over the message dgc_select_frac
    passes at the GPU's achieved memory bandwidth (its memory_gbps in transforms.hardware;
    constants DISTRIBUTED, GPU_MEMORY).
    Chain after ddp(...) for a single-GPU trace, or use on a DDP trace."""
    if not 0 < ratio <= 1:
        raise DaydreamError(f"dgc: ratio must be in (0, 1], got {ratio}")
    n, c = gradient_allreduces(g, ctx, "dgc")
    cur = current_link(g, ctx, n)
    parts = comm.split(c, n, cur)
    new = comm.as_all_gather(parts, n, 2 * ratio)  # values and their indices
    g = set_comm(g, c["task_id"].to_numpy(), np.rint(new).astype(np.int64))
    # selection kernels: on the stream of the GPU task that fed each collective
    bw = achieved_memory_bandwidth(ctx.device)
    nbytes = comm.message_bytes(parts, n, cur)
    sel_ns = np.maximum(np.rint(nbytes * C["dgc_select_frac"]["value"] / bw),
                        C["dgc_min_kernel_ns"]["value"]).astype(np.int64)
    unit = g.task["unit_id"].to_numpy()
    feed = feeders(g, c)
    sel = dict(zip(c["task_id"].to_list(), sel_ns.tolist(), strict=True))
    rows, edges = [], []
    for j, (src, dst) in enumerate(feed.iter_rows()):
        rows.append({"at": src, "place": "after", "kind": "kernel", "unit_id": int(unit[src]),
                     "name": "dgc: top-k gradient selection (inserted)", "dur_ns": sel[dst]})
        edges.append((-1 - j, dst))
    ins_ns = np.array([r["dur_ns"] for r in rows], np.float64)
    ctx.notes.append(f"dgc: {c.height} all-reduces sparsified to ratio {ratio:g} "
                     f"({n} ranks); " + (
                         f"{len(rows)} selection kernels inserted "
                         f"({ins_ns.mean() / 1e3:.1f} us each on average)" if rows else
                         "no GPU task feeds them in the graph: no selection kernel inserted")
                     + (f"; {c.height - len(rows)} collectives have none" if rows and
                        len(rows) < c.height else ""))
    if not rows:
        return g
    ed = pl.DataFrame(edges, schema=["src", "dst"], orient="row").with_columns(
        pl.lit("inserted").alias("kind"))
    rows_l, ed_l = launch_calls(g, [r["at"] for r in rows], len(rows))
    g2, _ = g.insert(rows_frame(rows + rows_l),
                     pl.concat([ed, ed_l], how="diagonal_relaxed"))
    return g2
