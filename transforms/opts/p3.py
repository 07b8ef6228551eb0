"""Priority-based parameter propagation (Jayarajan et al., "Priority-based Parameter Propagation
for Distributed DNN Training", MLSys 2019): gradients sent in slices, the slices of the layers
the next forward pass needs first sent first, and each layer's next forward waiting only for its
own slices.

Outline (``p3``):

1. the gradient all-reduces and their message bytes (NCCL args: element counts and dtype, the
   comm tasks' ``bytes``; ``ddp`` gives its buckets theirs); a collective without a size is an
   error: slices are cut from bytes, never from durations, which hold waiting;
2. slices: ceil(bytes / SLICE_KB), at most ``MAX_SLICES`` per collective and no more than keep the
   latency the extra slices add under ``MAX_SLICE_OVERHEAD`` of the collective's transfer
   (constants.DISTRIBUTED); each slice costs one collective's latency steps plus its share of the
   transfer, from the communication model (transforms.comm: the collective's own latency and
   transfer split at the trace's link); the peer wait the trace shows stays on the first slice;
3. scheduling: the slices of a rank run on one PRIORITY channel of that rank, the collective whose
   gradients became ready last in backward (layers nearest the input) first;
4. the waits: the optimizer no longer waits for every gradient; the next iteration's forward
   kernel at the mirrored position of each collective (gradients ready at fraction p of backward
   belong to the layers at fraction 1 - p of forward) waits for its slices.

In a job graph (all ranks, collectives joined across ranks) a collective's slices would each be
a collective of their own, joined anew; there the collectives are rescheduled and gate the next
forward pass, but not sliced (a note says so).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from daydream.base.errors import DaydreamError
from daydream.transforms import comm
from daydream.transforms.constants import DISTRIBUTED as C
from daydream.transforms.opts.distributed import current_link, gradient_allreduces
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register


def slice_counts(nbytes: np.ndarray, lat_ns: np.ndarray, xfer_ns: np.ndarray,
                 slice_kb: float, max_slices: int, max_overhead: float) -> np.ndarray:
    """Slices per collective: ceil(bytes / slice), at least 1, at most MAX_SLICES, and at most
    1 + MAX_OVERHEAD * transfer / latency (each extra slice adds one collective latency)."""
    k = np.ceil(np.asarray(nbytes, np.float64) / (slice_kb * 1000.0))
    lat = np.asarray(lat_ns, np.float64)
    cap = np.where(lat > 0, 1 + np.floor(max_overhead * np.asarray(xfer_ns, np.float64)
                                         / np.where(lat > 0, lat, 1)), max_slices)
    return np.clip(np.minimum(k, cap), 1, max_slices).astype(np.int64)


def forward_targets(task: pl.DataFrame, ready: np.ndarray, it: np.ndarray,
                    rank: np.ndarray | None) -> np.ndarray:
    """For the collective fed by backward GPU task ``ready`` of iteration ``it`` (of rank
    ``rank`` in a job): the next iteration's forward kernel of the same rank at the mirrored
    position; -1 where there is no next forward."""
    k = task.with_row_index("i").filter(pl.col("kind") == "kernel",
                                        pl.col("iteration").is_not_null())
    key = ["iteration"] + (["rank"] if rank is not None else [])
    groups = {ph: {tuple(int(x) for x in grp_key): grp["i"].to_numpy()
                   for grp_key, grp in k.filter(pl.col("phase") == ph).group_by(key)}
              for ph in ("forward", "backward")}
    bwd, fwd = groups["backward"], groups["forward"]
    out = np.full(len(ready), -1, np.int64)
    for j in range(len(ready)):
        ks = (int(it[j]),) + ((int(rank[j]),) if rank is not None else ())
        kf = (int(it[j]) + 1,) + ((int(rank[j]),) if rank is not None else ())
        b, f = bwd.get(ks), fwd.get(kf)
        if b is None or f is None or not len(b) or not len(f):
            continue
        b, f = np.sort(b), np.sort(f)
        p = np.searchsorted(b, ready[j]) / max(len(b) - 1, 1)
        out[j] = int(f[min(int(round((1 - min(p, 1.0)) * (len(f) - 1))), len(f) - 1)])
    return out


@register("p3", shrinks=True)
def p3(g: Graph, ctx: Context, *, slice_kb: float = 0.0, max_slices: int = 0,
       max_overhead: float = 0.0) -> Graph:
    """P3: gradient all-reduces cut into slices of SLICE_KB (0: the paper's 50,000 FP32
    parameters, constants.DISTRIBUTED p3_slice_kb) sent on a PRIORITY channel per rank, the
    layers nearest the input first; each layer's next forward kernel waits for its slices
    instead of the optimizer waiting for every gradient. Slices come from the collectives'
    message bytes (NCCL args); a trace whose collectives carry none keeps each collective whole
    (rescheduled and gating the next forward, a note says so), and asking it for a SLICE_KB is
    an error. At most MAX_SLICES per collective (0: p3_max_slices) and no more than keep the
    added per-slice latency under MAX_OVERHEAD of the transfer (0: p3_max_overhead); each
    slice is the
    communication model's latency plus its share of the transfer. Chain after ddp(...) for a
    single-GPU trace."""
    if slice_kb < 0:
        raise DaydreamError(f"p3: slice_kb must be > 0, got {slice_kb}")
    if max_slices < 0 or max_overhead < 0:
        raise DaydreamError(f"p3: max_slices and max_overhead must be >= 0, got {max_slices} "
                            f"and {max_overhead}")
    cap = max_slices or int(C["p3_max_slices"]["value"])
    overhead = max_overhead or float(C["p3_max_overhead"]["value"])
    n, c = gradient_allreduces(g, ctx, "p3")
    sized = not c["bytes"].null_count()
    if not sized and slice_kb > 0:
        miss = c.filter(pl.col("bytes").is_null())
        raise DaydreamError(
            f"p3: slice_kb={slice_kb:g} asked, but {miss.height} of {c.height} all-reduces carry "
            f"no message size (task {int(miss['task_id'][0])}): slices are cut from bytes, and "
            "the trace's NCCL kernels have no element count and dtype args (profile with a "
            "PyTorch that records them, or chain after ddp(...), which sizes its buckets); "
            "without slice_kb, p3 keeps each collective whole")
    slice_kb = slice_kb or float(C["p3_slice_kb"]["value"])
    cur = current_link(g, ctx, n)
    parts = comm.split(c, n, cur)
    is_job = "rank" in g.task.columns
    nbytes = parts["bytes"].fill_null(0).to_numpy().astype(np.float64)
    lat = parts["lat_ns"].to_numpy()
    xfer = parts["xfer_ns"].to_numpy()
    rest = parts["rest_ns"].to_numpy()
    k = (np.ones(c.height, np.int64) if is_job or not sized else
         slice_counts(nbytes, lat, xfer, slice_kb, cap, overhead))
    # each slice: one latency, 1/k of the transfer and of what the model does not explain
    one = np.rint(lat + (xfer + rest) / k).astype(np.int64)
    ids = c["task_id"].to_numpy()
    task = g.task
    it = task["iteration"].fill_null(-1).to_numpy()[ids]
    rank = task["rank"].fill_null(-1).to_numpy()[ids] if is_job else None
    # the GPU task whose end made each collective's gradients ready (its end_start
    # predecessor other than stream order)
    e = g.edge
    feed = (e.filter(pl.col("dst").is_in(ids.tolist()), pl.col("anchor") == "end_start",
                     ~pl.col("kind").is_in(["stream", "rank"]))
            .sort("lag_ns").unique("dst", keep="first"))
    ready_of = dict(zip(feed["dst"].to_list(), feed["src"].to_list(), strict=True))
    ready = np.array([ready_of.get(int(x), int(x)) for x in ids], np.int64)
    # priority within an iteration (and rank): the collective ready last first
    df = pl.DataFrame({"it": it, "r": ready, "rank": rank if rank is not None else
                       np.zeros(len(ids), np.int64)}).with_row_index("j")
    prio = (df.sort(["rank", "it", "r"], descending=[False, False, True])
            .with_columns(pl.int_range(pl.len()).over(["rank", "it"]).alias("p"))
            .sort("j")["p"].to_numpy().astype(np.int64))
    targets = forward_targets(task, ready, it, rank)
    # one PRIORITY channel per rank (a joined collective needs every rank's part running)
    chan_of: dict[int, int] = {}
    for r in sorted(set(rank.tolist()) if rank is not None else {0}):
        g, u = g.add_unit(f"p3 slices{'' if rank is None else f' rank {r}'} (inserted)",
                          "channel", "priority")
        chan_of[r] = u
    chans = np.array([chan_of[int(r)] for r in (rank if rank is not None else
                                                np.zeros(len(ids), np.int64))], np.int64)
    for u in np.unique(chans):
        g = g.move(ids[chans == u], int(u))
    full = g.task["dur_ns"].to_numpy().copy()
    full[ids] = one
    g = g.set_duration(ids, full)
    if sized:
        b = np.zeros(g.n_tasks, np.int64)
        b[ids] = np.rint(nbytes / k).astype(np.int64)
        g = g.set_bytes(ids, b)
    pr = np.zeros(g.n_tasks, np.int64)
    pr[ids] = prio
    g = g.set_priority(ids, pr)
    # the optimizer's wait for every gradient gives way to per-layer waits in the next forward
    gated = ids[targets >= 0]
    g = g.drop_edges(pl.col("src").is_in(gated.tolist()) & (pl.col("kind") == "wait"))
    new_e = [(int(cid), int(tg), "wait", "end_start", 0)
             for cid, tg in zip(ids, targets, strict=True) if tg >= 0]
    ed = pl.DataFrame(new_e, schema=["src", "dst", "kind", "anchor", "lag_ns"], orient="row")
    if int((k - 1).sum()):
        # the slices' insert renumbers the tasks: the collectives' own gating edges go with it
        g = _insert_slices(g, ids, k, one, nbytes, prio, chans, targets, ed)
    else:
        g = g.connect(ed)
    ctx.notes.append(
        f"p3: {c.height} all-reduces" + (f" ({nbytes.sum() / 1e6:.1f} MB)" if sized else "")
        + f" cut into {int(k.sum())} "
        f"slices" + (" (a job graph: collectives rescheduled, not sliced)" if is_job else
                     " (no message sizes in the trace: collectives kept whole, rescheduled)"
                     if not sized else
                     f" of at most {slice_kb:g} KB (<= {cap} per collective, added latency "
                     f"<= {100 * overhead:g}% of its transfer)")
        + f" on {len(chan_of)} priority channel(s); {len(gated)} gate the next forward pass "
        "instead of the optimizer" + ("" if len(gated) else
                                      " (no next iteration in the trace to gate: the step is "
                                      "unchanged)"))
    return g


def _insert_slices(g: Graph, ids: np.ndarray, k: np.ndarray, one: np.ndarray,
                   nbytes: np.ndarray, prio: np.ndarray, chans: np.ndarray,
                   targets: np.ndarray, own: pl.DataFrame) -> Graph:
    """The k - 1 further slices of each collective: on its channel after it, with its
    in-edges (its gradients' readiness) and its out-edges (the forward kernel it gates, and
    whatever else waited for it); OWN: edges between existing tasks to add with them."""
    e = g.edge
    idl = ids.tolist()
    in_e = e.filter(pl.col("dst").is_in(idl), pl.col("kind") != "stream")
    out_e = e.filter(pl.col("src").is_in(idl), pl.col("kind") != "stream")
    rows = {"at": [], "place": [], "splice": [], "kind": [], "unit_id": [], "name": [],
            "dur_ns": [], "priority": [], "bytes": [], "slack_ns": []}
    new_of: dict[int, list[int]] = {}
    for j, cid in enumerate(idl):
        for q in range(1, int(k[j])):
            new_of.setdefault(cid, []).append(-1 - len(rows["at"]))
            rows["at"].append(cid)
            rows["place"].append("after")
            rows["splice"].append(False)
            rows["kind"].append("comm")
            rows["unit_id"].append(int(chans[j]))
            rows["name"].append(f"p3: all_reduce slice {q} of {int(k[j])} (inserted)")
            rows["dur_ns"].append(int(one[j]))
            rows["priority"].append(int(prio[j]))
            rows["bytes"].append(int(nbytes[j] / k[j]))
            rows["slack_ns"].append(0)
    m = pl.DataFrame({"cid": [c for c, v in new_of.items() for _ in v],
                      "new": [x for v in new_of.values() for x in v]})
    cols = ["src", "dst", "kind", "anchor", "lag_ns"]
    ein = (in_e.join(m, left_on="dst", right_on="cid")
           .select("src", pl.col("new").alias("dst"), "kind", "anchor", "lag_ns"))
    eout = (out_e.join(m, left_on="src", right_on="cid")
            .select(pl.col("new").alias("src"), "dst", "kind", "anchor", "lag_ns"))
    tg = dict(zip(idl, targets.tolist(), strict=True))
    gate = m.with_columns(pl.col("cid").replace_strict(tg, return_dtype=pl.Int64)
                          .alias("dst")).filter(pl.col("dst") >= 0).select(
        pl.col("new").alias("src"), "dst", pl.lit("wait").alias("kind"),
        pl.lit("end_start").alias("anchor"), pl.lit(0, pl.Int64).alias("lag_ns"))
    ed = pl.concat([x.select(cols).cast({"src": pl.Int64, "dst": pl.Int64, "lag_ns": pl.Int64})
                    for x in (ein, eout, gate, own)])
    g, _ = g.insert(pl.DataFrame(rows), ed)
    return g


def slices(nbytes: float, slice_kb: float) -> int:
    """Slices of a message at SLICE_KB, unbounded (for tests and docs)."""
    return max(math.ceil(nbytes / (slice_kb * 1000)), 1)
