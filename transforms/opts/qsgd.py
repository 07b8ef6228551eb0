"""QSGD (Alistarh et al., NeurIPS 2017): gradients quantized to a few bits per element."""

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

GRAD_BITS = 32  # the gradients a trace all-reduces are FP32 (DDP's default buckets)


@register("qsgd", example="qsgd(bits=8)")
def qsgd(g: Graph, ctx: Context, *, bits: int = 8) -> Graph:
    """QSGD gradient quantization: each gradient travels as BITS bits per element (stochastic
    rounding to 2^(BITS-1) levels of the bucket's norm) instead of 32.

    Quantized gradients cannot be summed in flight at BITS bits, so each rank's quantized
    message is exchanged with an all-gather (as in the QSGD paper's implementation, and as
    dgc does): the transfer becomes (n-1) x BITS/32 x bytes / B where it was 2(n-1)/n x
    bytes / B (ring all-reduce), the latency steps the all-gather's (n-1). An encode kernel
    runs before each collective on the stream that made its gradients ready (two passes over
    the FP32 gradient, its norm then the rounding, and the quantized write: (2 + BITS/32) x
    bytes) and a decode kernel after it on the collective's stream (the n quantized messages
    read and the FP32 sum written: (n x BITS/32 + 1) x bytes), both at the GPU's achieved
    memory bandwidth (transforms.hardware memory_gbps x GPU_MEMORY achieved). On a fast link
    the kernels can cost more than the traffic saves: a slowdown is predicted and named.
    Chain after ddp(...) for a single-GPU trace, or use on a DDP trace."""
    if bits < 1:
        raise DaydreamError(f"qsgd: bits must be >= 1, got {bits}")
    if bits >= GRAD_BITS:
        ctx.notes.append(f"qsgd: {bits} bits per element is no fewer than the gradients' "
                         f"{GRAD_BITS}: does not apply, unchanged")
        return g
    n, c = gradient_allreduces(g, ctx, "qsgd")
    cur = current_link(g, ctx, n)
    parts = comm.split(c, n, cur)
    q = bits / GRAD_BITS
    new = comm.as_all_gather(parts, n, q)
    g = set_comm(g, c["task_id"].to_numpy(), np.rint(new).astype(np.int64))
    bw = achieved_memory_bandwidth(ctx.device)
    nbytes = comm.message_bytes(parts, n, cur)
    floor = C["qsgd_min_kernel_ns"]["value"]
    enc = np.maximum(np.rint(nbytes * (2 + q) / bw), floor).astype(np.int64)
    dec = np.maximum(np.rint(nbytes * (n * q + 1) / bw), floor).astype(np.int64)
    ids = c["task_id"].to_list()
    enc_of = dict(zip(ids, enc.tolist(), strict=True))
    dec_of = dict(zip(ids, dec.tolist(), strict=True))
    unit = g.task["unit_id"].to_numpy()
    rows, edges = [], []
    for src, dst in feeders(g, c).iter_rows():
        rows.append({"at": src, "place": "after", "kind": "kernel", "unit_id": int(unit[src]),
                     "name": "qsgd: quantize gradients (inserted)", "dur_ns": enc_of[dst]})
        edges.append((-len(rows), dst))
    # decode after each collective on its stream; what waited for the collective on another
    # unit (the optimizer, an event) waits for its decode too
    out = g.edge.filter(pl.col("src").is_in(ids))
    for cid in ids:
        rows.append({"at": cid, "place": "after", "kind": "kernel", "unit_id": int(unit[cid]),
                     "name": "qsgd: dequantize and sum (inserted)", "dur_ns": dec_of[cid]})
        k = -len(rows)
        edges.append((cid, k))
        for d in out.filter(pl.col("src") == cid)["dst"].to_list():
            if unit[d] != unit[cid]:
                edges.append((k, int(d)))
    ctx.notes.append(f"qsgd: {c.height} all-reduces quantized to {bits} bits per element "
                     f"({n} ranks, exchanged by all-gather); time in collectives "
                     f"{c['dur_ns'].sum() / 1e6:.3f} -> {new.sum() / 1e6:.3f} ms; encode "
                     f"{enc.sum() / 1e6:.3f} ms and decode {dec.sum() / 1e6:.3f} ms of kernels "
                     "inserted")
    ed = pl.DataFrame(edges, schema=["src", "dst"], orient="row").with_columns(
        pl.lit("inserted").alias("kind"))
    rows_l, ed_l = launch_calls(g, [r["at"] for r in rows], len(rows))
    g2, _ = g.insert(rows_frame(rows + rows_l), pl.concat([ed, ed_l], how="diagonal_relaxed"))
    return g2
