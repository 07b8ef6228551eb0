"""Priority-based parameter propagation (Jayarajan et al., MLSys 2019): sliced gradients sent
in layer priority, the next forward pass starting as soon as its first layers are synced."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from ingest.errors import DaydreamError
from transforms import comm
from transforms.constants import DISTRIBUTED as C
from transforms.opts.distributed import current_link, gradient_allreduces, message_bytes
from transforms.primitives import Graph
from transforms.registry import Context, register


def _forward_targets(g: Graph, ready: np.ndarray, it: np.ndarray) -> np.ndarray:
    """For a gradient ready at backward kernel ``ready`` of iteration ``it``: the GPU kernel of
    the next iteration's forward pass at the mirrored position (gradients ready at fraction p
    of backward belong to the layers at fraction 1 - p of forward); -1 without a next forward."""
    t = g.task.with_row_index("i")
    k = t.filter(pl.col("kind") == "kernel", pl.col("iteration").is_not_null())
    bwd = k.filter(pl.col("phase") == "backward")
    fwd = k.filter(pl.col("phase") == "forward")
    out = np.full(len(ready), -1, np.int64)
    for j, (r, i) in enumerate(zip(ready, it, strict=True)):
        b = bwd.filter(pl.col("iteration") == i)["i"].to_numpy()
        f = fwd.filter(pl.col("iteration") == i + 1)["i"].to_numpy()
        if not len(b) or not len(f):
            continue
        p = np.searchsorted(b, r) / max(len(b) - 1, 1)
        out[j] = int(f[min(int(round((1 - min(p, 1.0)) * (len(f) - 1))), len(f) - 1)])
    return out


@register("p3")
def p3(g: Graph, ctx: Context, *, slice_kb: float = 200.0) -> Graph:
    """P3: every gradient all-reduce is cut into slices of SLICE_KB (default 50,000 FP32
    parameters) sent on one PRIORITY channel, the slices of layers nearer the input first (they
    are needed first by the next forward pass); each slice is the alpha-beta model time of its
    bytes. The optimizer no longer waits for all gradients: the next iteration's forward kernel
    of the matching layer (mirrored position of the bucket in backward) waits for its slices
    instead (the last iteration keeps its wait). Chain after ddp(...) for a single-GPU trace."""
    if slice_kb <= 0:
        raise DaydreamError(f"p3: slice_kb must be > 0, got {slice_kb}")
    n, c = gradient_allreduces(g, ctx, "p3")
    cur = current_link(g, ctx, n)
    parts = comm.split(c, n, cur)
    s, w = comm.cost_terms("all_reduce", n)
    nbytes = message_bytes(parts, cur, w)
    slice_b = slice_kb * 1000
    k = np.maximum(np.ceil(nbytes / slice_b), 1).astype(np.int64)
    one = np.array([cur.collective_ns("all_reduce", b / m, n) for b, m in zip(nbytes, k,
                                                                               strict=True)])
    rest = parts["rest_ns"].to_numpy() / k
    dur = np.rint(one + rest).astype(np.int64)
    ids = c["task_id"].to_numpy()
    task = g.task
    it = task["iteration"].fill_null(-1).to_numpy()[ids]
    # the kernel that made each collective's gradients ready (its end_start predecessor)
    e = g.edge
    feed = (e.filter(pl.col("dst").is_in(ids.tolist()), pl.col("anchor") == "end_start",
                     pl.col("kind") != "stream").sort("lag_ns").unique("dst", keep="first"))
    ready = dict(zip(feed["dst"].to_list(), feed["src"].to_list(), strict=True))
    rdy = np.array([ready.get(int(x), int(x)) for x in ids], np.int64)
    # priority: within an iteration, the collective ready last (layers nearest the input) first
    order = pl.DataFrame({"it": it, "r": rdy}).with_row_index("j").sort("it", "r", descending=[
        False, True]).with_columns(pl.int_range(pl.len()).over("it").alias("p"))
    prio = order.sort("j")["p"].to_numpy().astype(np.int64)
    targets = _forward_targets(g, rdy, it)

    g, chan = g.add_unit("p3 slices (inserted)", "channel", "priority")
    g = g.move(ids, chan)
    full = g.task["dur_ns"].to_numpy().copy()
    full[ids] = dur
    g = g.set_duration(ids, full)
    b = np.zeros(g.n_tasks, np.int64)
    b[ids] = np.rint(nbytes / k).astype(np.int64)
    g = g.set_bytes(ids, b)
    pr = np.zeros(g.n_tasks, np.int64)
    pr[ids] = prio
    g = g.set_priority(ids, pr)
    # P3 replaces the optimizer's wait for every gradient by per-layer waits in the next forward
    has_next = set(ids[targets >= 0].tolist())
    g = g.drop_edges(pl.col("src").is_in(list(has_next)) & (pl.col("kind") == "wait"))
    out_w = g.edge.filter(pl.col("src").is_in(ids.tolist()), pl.col("kind") == "wait")
    in_e = g.edge.filter(pl.col("dst").is_in(ids.tolist()), pl.col("kind") != "stream")
    rows, new_e = [], []
    for j, cid in enumerate(ids.tolist()):
        for q in range(1, int(k[j])):
            x = -1 - len(rows)
            rows.append({"at": cid, "place": "after", "splice": False, "kind": "comm",
                         "unit_id": chan, "name": f"p3: all_reduce slice {q} (inserted)",
                         "dur_ns": int(dur[j]), "priority": int(prio[j]),
                         "bytes": int(nbytes[j] / k[j])})
            for r in in_e.filter(pl.col("dst") == cid).iter_rows(named=True):
                new_e.append((r["src"], x, r["kind"], r["anchor"], r["lag_ns"]))
            if targets[j] >= 0:
                new_e.append((x, int(targets[j]), "wait", "end_start", 0))
            for r in out_w.filter(pl.col("src") == cid).iter_rows(named=True):
                new_e.append((x, r["dst"], r["kind"], r["anchor"], r["lag_ns"]))
        if targets[j] >= 0:
            new_e.append((cid, int(targets[j]), "wait", "end_start", 0))
    ctx.notes.append(f"p3: {c.height} all-reduces cut into {int(k.sum())} slices of "
                     f"{slice_kb:g} KB ({C['p3_slice_kb']['source'][:40]}...); "
                     f"{len(has_next)} now gate the next forward pass instead of the optimizer")
    ed = pl.DataFrame(new_e, schema=["src", "dst", "kind", "anchor", "lag_ns"], orient="row")
    if rows:
        g, _ = g.insert(pl.DataFrame(rows), ed)
        return g
    # one slice each: only the new forward edges
    return g.connect(ed)


def slices(nbytes: float, slice_kb: float) -> int:
    """Number of slices of a message (for tests and docs)."""
    return max(math.ceil(nbytes / (slice_kb * 1000)), 1)
