"""Data-parallel training (PyTorch DistributedDataParallel) predicted from a single-GPU trace."""

from __future__ import annotations

import numpy as np
import polars as pl

from daydream.base.errors import DaydreamError
from daydream.graphstore.schema import LOCAL_GPU_KINDS
from daydream.transforms import comm
from daydream.transforms.constants import DISTRIBUTED as C
from daydream.transforms.opts.distributed import assumed_link, launch_calls, rows_frame
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register

MB = 1 << 20  # DDP's bucket_cap_mb counts MiB


def backward_kernels(g: Graph) -> pl.DataFrame:
    """The backward GPU kernels of every iteration, in start order: i, iteration, layer,
    dur_ns."""
    t = g.task.with_row_index("i").filter(pl.col("kind") == "kernel",
                                          pl.col("phase") == "backward",
                                          pl.col("iteration").is_not_null())
    return t.select(pl.col("i").cast(pl.Int64), "iteration", "layer", "dur_ns").sort("i")


def gradient_bytes(g: Graph, bk: pl.DataFrame, param_bytes: int) -> tuple[np.ndarray, str]:
    """Gradient bytes that become ready at each backward kernel, and where the sizes came from.

    ``param_bytes`` > 0 (``ddp(param_bytes=...)``, the --param-bytes override) wins; else the
    layer table's parameter sizes (from recorded weight shapes) at each layer's last backward
    kernel of the iteration; else an error. A total without per-layer sizes is spread over the
    backward kernels in proportion to their time (weight-gradient work grows with the weights)."""
    dur = bk["dur_ns"].to_numpy().astype(np.float64)
    it = bk["iteration"].to_numpy()
    out = np.zeros(bk.height)
    if param_bytes > 0:
        for k in np.unique(it):
            m = it == k
            tot = dur[m].sum()
            out[m] = param_bytes * (dur[m] / tot if tot > 0 else 1.0 / m.sum())
        return out, f"param_bytes={param_bytes} given, spread over backward kernels by time"
    lay = g.layer.filter(pl.col("param_bytes").is_not_null() & (pl.col("param_bytes") > 0))
    if lay.height:
        size = dict(zip(lay["layer"].to_list(), lay["param_bytes"].to_list(), strict=False))
        last = (bk.with_row_index("r").filter(pl.col("layer").is_in(list(size)))
                .group_by("iteration", "layer").agg(pl.col("r").max()))
        for lname, r in last.select("layer", "r").iter_rows():
            out[r] = size[lname]
        if out.sum() > 0:
            return out, (f"trace: parameter sizes of {lay.height} layers (their recorded "
                         "weight shapes)")
    raise DaydreamError("ddp: the trace tells no parameter sizes (no weight shapes recorded: "
                        "profile with record_shapes=True); give the model's size: "
                        "--param-bytes N or ddp(world=8, param_bytes=N)")


def buckets(bk: pl.DataFrame, grad: np.ndarray, bucket_mb: float) -> list[tuple[int, int, float]]:
    """(iteration, kernel after which the bucket is ready, bytes) in backward order: gradients
    fill a bucket until it holds bucket_mb (the first one: DDP's 1 MiB first bucket); the rest
    of an iteration is its last bucket."""
    out = []
    it = bk["iteration"].to_numpy()
    ids = bk["i"].to_numpy()
    first_cap = min(C["first_bucket_mb"]["value"], bucket_mb) * MB
    for k in np.unique(it):
        idx = np.flatnonzero(it == k)
        acc, cap = 0.0, first_cap
        for j in idx:
            acc += grad[j]
            if acc >= cap:
                out.append((int(k), int(ids[j]), acc))
                acc, cap = 0.0, bucket_mb * MB
        if acc > 0:
            out.append((int(k), int(ids[idx[-1]]), acc))
    return out


@register("ddp")
def ddp(g: Graph, ctx: Context, *, world: int = 8, bandwidth: str = "", bucket_mb: float = 25.0,
        param_bytes: int = 0, algo: str = "ring") -> Graph:
    """Data-parallel training on WORLD GPUs from a single-GPU trace (PyTorch DDP).

    Gradients become ready in backward order: each backward kernel frees its share of the
    parameter bytes (layer sizes from the trace's recorded weight shapes, or PARAM_BYTES given,
    spread over backward kernels by time; a note says which). They fill buckets of BUCKET_MB
    (the first 1 MiB, as DDP); each bucket is all-reduced on a new communication channel as
    soon as its last gradient is ready, overlapping the rest of backward, and the iteration's
    first weight-update GPU task waits for all of its buckets. All-reduce time is the
    alpha-beta ring (or tree: ALGO) model over BANDWIDTH ('100Gbps', '25GB/s', a link name;
    default the usual NVLink of the trace's GPU). Compute per GPU is unchanged (the same batch
    per GPU)."""
    if world < 1:
        raise DaydreamError(f"ddp: world must be >= 1, got {world}")
    if bucket_mb <= 0:
        raise DaydreamError(f"ddp: bucket_mb must be > 0, got {bucket_mb}")
    if comm.comm_table(g.task).height:
        raise DaydreamError("ddp: the trace already communicates (NCCL kernels); use "
                            "world(N) or bandwidth(X) on it")
    bk = backward_kernels(g)
    if not bk.height:
        raise DaydreamError("ddp: no backward kernels found (the trace has no backward phase)")
    given = param_bytes or ctx.param_bytes or 0
    grad, source = gradient_bytes(g, bk, given)
    if given and not param_bytes:
        source = source.replace("param_bytes=", "--param-bytes ")
    base = assumed_link(ctx)
    lk = comm.parse_bandwidth(bandwidth, base) if bandwidth else base
    bs = buckets(bk, grad, bucket_mb)
    ctx.notes.append(f"ddp: parameter sizes from {source}; {len(bs)} buckets over "
                     f"{len(set(b[0] for b in bs))} iterations, {world} GPUs, {lk.source} "
                     f"({lk.gbps:.2f} GB/s, {lk.latency_ns / 1e3:.1f} us per step)")
    ctx.world_size = world  # the graph is now one rank of a WORLD-GPU job (for the chain)
    ctx.link = lk  # and its collectives run on this link
    if world == 1:
        return g
    g, chan = g.add_unit("ddp all_reduce (inserted)", "channel", "fcfs")
    rows = [{"at": at, "place": "after", "splice": False, "kind": "comm", "unit_id": chan,
             "name": f"ddp: all_reduce bucket {j} (inserted)",
             "dur_ns": int(round(lk.collective_ns("all_reduce", b, world, algo))),
             "bytes": int(round(b))} for j, (_, at, b) in enumerate(bs)]
    edges = pl.DataFrame({"src": [at for _, at, _ in bs], "dst": [-1 - j for j in range(len(bs))],
                          "kind": ["inserted"] * len(bs)})
    # DDP's reducer launches each bucket's all-reduce from the thread that ran the bucket's
    # last gradient hook: a launch call after the call that launched the ready kernel
    rows_l, edges_l = launch_calls(g, [at for _, at, _ in bs], len(rows))
    g, ins = g.insert(rows_frame(rows + rows_l),
                      pl.concat([edges, edges_l], how="diagonal_relaxed"))
    # the optimizer waits for its buckets: the iteration's first weight-update GPU task after
    # the bucket was ready (zero_grad at the iteration's start may be weight-update too)
    t = g.task
    wu = np.flatnonzero((t["kind"].is_in(LOCAL_GPU_KINDS) &
                         (t["phase"] == "weight_update") & t["iteration"].is_not_null())
                        .to_numpy())
    wu_it = t["iteration"].to_numpy()[wu] if len(wu) else np.zeros(0)
    src, dst = [], []
    for j, (k, _, _) in enumerate(bs):
        cand = wu[(wu_it == k) & (wu > ins[j])]
        if len(cand):
            src.append(int(ins[j]))
            dst.append(int(cand[0]))
    if len(src) < len(bs):
        ctx.notes.append(f"ddp: {len(bs) - len(src)} buckets have no weight-update GPU task "
                         "after them in their iteration; nothing waits for them")
    return g.connect(pl.DataFrame({"src": src, "dst": dst, "kind": ["wait"] * len(src)},
                                  schema={"src": pl.Int64, "dst": pl.Int64, "kind": pl.Utf8}))
