"""BlueConnect (Cho et al., SysML 2019): all-reduce decomposed over the network hierarchy."""

from __future__ import annotations

import numpy as np

from daydream.base.errors import DaydreamError
from daydream.transforms import comm
from daydream.transforms.opts.distributed import (
    assumed_link,
    current_link,
    gradient_allreduces,
    message_bytes,
    set_comm,
)
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register


def hierarchical_ns(nbytes: np.ndarray, n: int, g: int, intra: comm.Link, inter: comm.Link,
                    algo: str = "ring") -> np.ndarray:
    """Reduce-scatter among the g GPUs of a node (intra link), all-reduce of the 1/g shard
    across the n/g nodes (inter link), all-gather inside the node: the three phases of
    BlueConnect's decomposition, one after the other (ns per message)."""
    nodes = max(n // g, 1)
    rs = np.array([intra.collective_ns("reduce_scatter", b, g, algo) for b in nbytes])
    ar = np.array([inter.collective_ns("all_reduce", b / g, nodes, algo) for b in nbytes])
    ag = np.array([intra.collective_ns("all_gather", b, g, algo) for b in nbytes])
    return rs + ar + ag


@register("blueconnect", shrinks=True)
def blueconnect(g: Graph, ctx: Context, *, gpus_per_node: int = 8, intra: str = "",
                inter: str = "", algo: str = "ring") -> Graph:
    """BlueConnect: each gradient all-reduce becomes reduce-scatter inside a node (INTRA link,
    default the NVLink of the trace's GPU), all-reduce of 1/GPUS_PER_NODE of the data across
    nodes (INTER link, default the trace's own, fitted or from ddp(...)), and all-gather inside
    the node. Time waiting for other ranks is kept. Chain after ddp(...) for a single-GPU
    trace, or use on a DDP trace."""
    n, c = gradient_allreduces(g, ctx, "blueconnect")
    if gpus_per_node < 1 or n % min(gpus_per_node, n):
        raise DaydreamError(f"blueconnect: {n} ranks do not split into nodes of "
                            f"{gpus_per_node} GPUs")
    gpn = min(gpus_per_node, n)
    if n <= gpn:
        ctx.notes.append(f"blueconnect: does not apply: the {n} ranks fit one node of "
                         f"{gpus_per_node} GPUs, so there is no inter-node all-reduce to shrink "
                         "(BlueConnect splits it across nodes); unchanged")
        return g
    cur = current_link(g, ctx, n, algo)
    lin = comm.parse_bandwidth(intra, assumed_link(ctx)) if intra else assumed_link(ctx)
    lout = comm.parse_bandwidth(inter, cur) if inter else cur
    parts = comm.split(c, n, cur, algo)
    s, w = comm.cost_terms("all_reduce", n, algo)
    nbytes = message_bytes(parts, cur, w)
    new = parts["rest_ns"].to_numpy() + hierarchical_ns(nbytes, n, gpn, lin, lout, algo)
    ctx.notes.append(f"blueconnect: {c.height} all-reduces over {n // gpn} nodes of {gpn} "
                     f"GPUs; intra {lin.gbps:.2f} GB/s, inter {lout.gbps:.2f} GB/s; time "
                     f"{c['dur_ns'].sum() / 1e6:.3f} -> {new.sum() / 1e6:.3f} ms")
    return set_comm(g, c["task_id"].to_numpy(), np.rint(new).astype(np.int64))
