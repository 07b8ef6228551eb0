"""Distributed what-ifs on traces that already communicate: another bandwidth, another world
size, no straggler. They work on a single rank's trace (its world size from the trace's
distributedInfo) and on a job graph (graphstore.job: all ranks, collectives joined)."""

from __future__ import annotations

import numpy as np
import polars as pl

from daydream.base.errors import DaydreamError
from daydream.graphstore.latency import LATENCY
from daydream.graphstore.schema import LOCAL_GPU_KINDS
from daydream.transforms import comm
from daydream.transforms.constants import COMM_LINK
from daydream.transforms.constants import DISTRIBUTED as C
from daydream.transforms.devices import family, gpu
from daydream.transforms.hardware import Device, device_from_properties
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register


def rows_frame(rows: list[dict]) -> pl.DataFrame:
    """Tasks to insert as one frame, every key in every row (a row without ``place`` is placed
    before, without ``splice`` spliced, without ``bytes`` has none)."""
    default = {"place": "before", "splice": True, "bytes": None}
    keys = list(dict.fromkeys(k for r in rows for k in r))
    frame = pl.DataFrame([{k: r.get(k, default.get(k)) for k in keys} for r in rows])
    return frame.with_columns(pl.col("bytes").cast(pl.Int64)) if "bytes" in keys else frame


def launch_calls(g: Graph, beside: list[int], first: int) -> tuple[list[dict], pl.DataFrame]:
    """Launch calls for GPU tasks a what-if inserts beside the GPU tasks BESIDE (the k-th new
    task being number FIRST + k of the insert): each a cudaLaunchKernel after the call that
    launched its BESIDE task, on that thread, at the trace's median launch cost, with a launch
    edge to it. A GPU task without a launch would count as launched before the window."""
    call, gpu_task, _ = g.launch_pairs()
    api_of = dict(zip(gpu_task.tolist(), call.tolist(), strict=True))
    cost = g.median_call_ns("LaunchKernel")
    cost = int(C["launch_ns"]["value"]) if cost is None else cost
    unit = g.array("unit_id")
    rows, src, dst = [], [], []
    for k, b in enumerate(beside):
        a = api_of.get(int(b))
        if a is None:
            continue
        rows.append({"at": int(a), "place": "after", "splice": True, "kind": "api",
                     "unit_id": int(unit[a]), "name": "cudaLaunchKernel (inserted)",
                     "dur_ns": cost})
        src.append(-1 - (first + len(rows) - 1))
        dst.append(-1 - k)
    edges = pl.DataFrame({"src": src, "dst": dst, "kind": ["launch"] * len(src),
                          "anchor": ["start_start"] * len(src),
                          "lag_ns": [LATENCY["launch"].ns] * len(src)},
                         schema={"src": pl.Int64, "dst": pl.Int64, "kind": pl.Utf8,
                                 "anchor": pl.Utf8, "lag_ns": pl.Int64})
    return rows, edges


def world_of(g: Graph, ctx: Context) -> int | None:
    """Ranks of the traced job: a job graph's own ranks, else the trace's world size."""
    if "rank" in g.task.columns:
        r = g.task["rank"].drop_nulls()
        return int(r.filter(r >= 0).n_unique()) or None
    return ctx.world_size


def gradient_allreduces(g: Graph, ctx: Context, who: str) -> tuple[int, pl.DataFrame]:
    """(ranks, the all-reduce collectives) that the gradient what-ifs (p3, blueconnect, dgc)
    rewrite; a clear error where there are none to rewrite."""
    n = world_of(g, ctx)
    c = comm.comm_table(g.task).filter(pl.col("type") == "all_reduce")
    if not c.height or not n or n < 2:
        raise DaydreamError(f"{who}: no gradient all-reduce; chain it after ddp(world=N, ...) "
                            "for a single-GPU trace")
    return n, c


def message_bytes(parts: pl.DataFrame, link: comm.Link, wire: float) -> np.ndarray:
    """Bytes of each collective's message: from the trace where it names them, else back
    from its transfer time on LINK (WIRE: the algorithm's bytes on the wire per message byte)."""
    if parts["bytes"].null_count() == 0:
        return parts["bytes"].to_numpy().astype(np.float64)
    return parts["xfer_ns"].to_numpy() * link.gbps / max(wire, 1e-9)


def assumed_link(ctx: Context) -> comm.Link:
    """The link usual for the trace's GPU, assumed where its collectives carry no message
    size: the NVLink generation of the GPU's own NVLink bandwidth (transforms.hardware:
    interconnect, interconnect_bidir_gbps; for a GPU the table lacks, its family's reference
    part), PCIe 4 where it has no NVLink of a known generation or is unknown."""
    d = device_from_properties(ctx.device) if ctx.device else None
    if d is None and family(ctx.device) != "default":
        d = gpu(ctx.device)
    return comm.link(nvlink(d) or "pcie4")


def nvlink(d: Device | None) -> str | None:
    """The COMM_LINK NVLink generation of a GPU's NVLink (its bandwidth in both directions is
    twice the generation's one-direction peak), None where it has none."""
    if d is None or not (d.interconnect or "").startswith("nvlink"):
        return None
    return next((k for k, v in COMM_LINK.items() if k.startswith("nvlink")
                 and v["value"]["gbps"] * 2 == d.interconnect_bidir_gbps), None)


def current_link(g: Graph, ctx: Context, n: int, algo: str = "ring") -> comm.Link:
    """The trace's link: the one an optimization earlier in the chain set (``ddp``), else the
    bandwidth fitted from the trace's recorded collectives where they carry sizes (never from
    collectives the chain inserted), else the link usual for its GPU; step latency from that
    link (a note says which)."""
    if ctx.link is not None:
        ctx.notes.append(f"comm: the link set earlier in the chain, {ctx.link.source} "
                         f"({ctx.link.gbps:.2f} GB/s, {ctx.link.latency_ns / 1e3:.1f} us per "
                         "step)")
        return ctx.link
    base = assumed_link(ctx)
    f = comm.fit(g.task, n, base.latency_ns, algo)
    if f.link is not None:
        ctx.notes.append(f"comm: fitted bandwidth {f.link.gbps:.2f} GB/s from {f.points} "
                         f"message sizes ({f.note}); step latency "
                         f"{base.latency_ns / 1e3:.1f} us of {base.source}")
        return f.link
    ctx.notes.append(f"comm: {f.note}; assumed {base.source}, latency "
                     f"{base.latency_ns / 1e3:.1f} us")
    return base


def optimizer_waits(g: Graph) -> Graph:
    """DDP's optimizer step waits for the all-reduce of every gradient bucket
    (``finalize_backward`` makes the compute stream wait for the communication stream). A
    trace shows that wait only when a collective actually ended late; add it everywhere: each
    backward collective -> the first weight-update GPU task of its iteration."""
    t = g.task.with_row_index("i")
    gpu = pl.col("kind").is_in(LOCAL_GPU_KINDS)
    wu = (t.filter(gpu, pl.col("phase") == "weight_update", pl.col("iteration").is_not_null())
          .group_by("iteration").agg(pl.col("i").min().alias("dst"))
          if "rank" not in t.columns else
          t.filter(gpu, pl.col("phase") == "weight_update", pl.col("iteration").is_not_null())
          .group_by("iteration", "rank").agg(pl.col("i").min().alias("dst")))
    keys = ["iteration"] + (["rank"] if "rank" in t.columns else [])
    c = t.filter(pl.col("kind") == "comm", pl.col("phase") == "backward",
                 ~pl.col("name").str.starts_with("join "))
    start = t["start_ns"].to_numpy()
    e = c.join(wu, on=keys)
    # only where the trace agrees (the collective ended before the optimizer started): edges
    # forward in observed time close no cycle
    e = e.filter(pl.col("start_ns") + pl.col("obs_dur_ns") <=
                 pl.col("dst").map_batches(lambda d: pl.Series(start[d.to_numpy()])))
    e = e.select(pl.col("i").cast(pl.Int64).alias("src"), pl.col("dst").cast(pl.Int64))
    e = e.join(g.edge.select("src", "dst"), on=["src", "dst"], how="anti")
    return g.connect(e.with_columns(pl.lit("wait").alias("kind")))


def feeders(g: Graph, c: pl.DataFrame) -> pl.DataFrame:
    """(src, dst): for each collective of C, the local GPU task whose end made its gradients
    ready: among its end_start predecessors (stream order on the comm stream, the compute
    stream's wait, ddp's inserted edge), the local GPU tasks, the one closest before it."""
    kinds = g.task["kind"].to_numpy()
    feed = g.edge.filter(pl.col("dst").is_in(c["task_id"].to_list()), pl.col("anchor") ==
                         "end_start")
    feed = feed.filter(pl.col("src").map_batches(
        lambda s: pl.Series(np.isin(kinds[s.to_numpy()], LOCAL_GPU_KINDS))))
    return feed.sort("src", descending=True).unique("dst", keep="first").select(
        "src", "dst").sort("dst")


def set_comm(g: Graph, ids: np.ndarray, dur: np.ndarray) -> Graph:
    """New durations (own transfer time) of comm kernels. In a job graph a join holds each
    kernel's work back until the last rank has arrived (an END edge), and the kernel's
    duration is what it runs after that: setting it is enough. On one rank's trace the
    waiting for peers stays in the kernel's task slack."""
    full = g.task["dur_ns"].to_numpy().copy()
    full[ids] = dur
    return g.set_duration(ids, full)


def _rewrite_comm(g: Graph, ctx: Context, n_new: int | None, bandwidth: str | None,
                  algo: str, what: str) -> Graph:
    n = world_of(g, ctx)
    if not n or n < 2:
        raise DaydreamError(f"{what}: the trace is not distributed (no world size > 1); use "
                            "ddp(world=N, ...) for a single-GPU trace")
    c = comm.comm_table(g.task)
    if not c.height:
        raise DaydreamError(f"{what}: the trace has no collective (NCCL/RCCL kernel)")
    cur = current_link(g, ctx, n, algo)
    new = comm.parse_bandwidth(bandwidth, cur) if bandwidth else cur
    parts = comm.split(c, n, cur, algo)
    dur = comm.rescale(parts, n, n_new or n, cur, new, algo)
    g = optimizer_waits(g)
    ctx.link = new  # what the rest of the chain communicates over
    ctx.notes.append(f"{what}: {c.height} collectives, {n} -> {n_new or n} ranks, "
                     f"{cur.gbps:.2f} -> {new.gbps:.2f} GB/s; time in collectives "
                     f"{c['dur_ns'].sum() / 1e6:.3f} -> {dur.sum() / 1e6:.3f} ms")
    return set_comm(g, c["task_id"].to_numpy(), dur)


@register("bandwidth")
def bandwidth(g: Graph, ctx: Context, *, bw: str = "2x", algo: str = "ring") -> Graph:
    """Another network bandwidth for a distributed trace: BW is '2x' (of the trace's own
    bandwidth), '100Gbps', '25GB/s' or a link name (nvlink3, ib_hdr, eth100...).

    Every collective is split by the alpha-beta model (transforms.comm) into latency steps,
    transfer and the rest (waiting for other ranks, on a single-rank trace); the transfer
    scales with the bandwidth ratio, the rest is kept. The trace's bandwidth is fitted from its
    collectives' message sizes (NCCL args) where it has them, else the usual link of its GPU is
    assumed (a note says which)."""
    return _rewrite_comm(g, ctx, None, bw, algo, "bandwidth")


@register("world")
def world(g: Graph, ctx: Context, *, n: int = 8, bandwidth: str = "", algo: str = "ring"
          ) -> Graph:
    """The same job on N ranks (data parallel, the same batch per GPU): each collective's
    latency steps and bytes on the wire follow the model for N ranks (ring all-reduce:
    2(N-1) steps, 2(N-1)/N of the message), optionally on another BANDWIDTH; compute is
    unchanged and the time a rank waited for others is kept."""
    if n < 1:
        raise DaydreamError(f"world: n must be >= 1, got {n}")
    return _rewrite_comm(g, ctx, n, bandwidth or None, algo, "world")


@register("no_straggler", shrinks=True)
def no_straggler(g: Graph, ctx: Context) -> Graph:
    """Every rank of a job as fast as the median rank: a rank whose own work (CPU and GPU
    tasks other than collectives) took longer than the median rank's is scaled down to the
    median, and a rank whose trace started later than the median start (it came late to the
    first collective) starts at the median."""
    if "rank" not in g.task.columns:
        raise DaydreamError("no_straggler: needs a job (the traces of all ranks), e.g. "
                            "`daydream predict JOB_NAME --opt no_straggler`")
    t = g.task
    r = t["rank"].fill_null(-1).to_numpy()
    own = ((r >= 0) & (t["kind"] != "comm").to_numpy() &
           ~t["name"].is_in(["<trace start>", "<job start>"]).to_numpy())
    busy = pl.DataFrame({"rank": r[own], "d": t["dur_ns"].to_numpy()[own]}).group_by(
        "rank").agg(pl.col("d").sum()).sort("rank")
    med = float(np.median(busy["d"].to_numpy()))
    fac = {int(a): min(1.0, med / b) if b > 0 else 1.0 for a, b in busy.iter_rows()}
    f = np.ones(g.n_tasks)
    f[own] = np.array([fac[int(x)] for x in r[own]])
    g = g.scale(own, f)
    e = g.edge
    orig = ((e["src"] == 0) & (e["kind"] == "origin")).to_numpy()
    if orig.sum() > 1:
        lag = e["lag_ns"].to_numpy()
        g = g.set_lags(orig, np.minimum(lag, int(float(np.median(lag[orig])))))
    slow = [k for k, v in fac.items() if v < 1]
    ctx.notes.append(f"no_straggler: ranks {slow} scaled to the median busy time "
                     f"{med / 1e6:.3f} ms; late starts moved to the median")
    return g
