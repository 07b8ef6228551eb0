"""Work per layer, kernel, kernel class and operator over a replay's used iterations: what the
HTML report's top kernels, operators and layers show, and what ``daydream compare`` sets
predicted against measured. Work is a task's simulated duration (``Replay.work_ns``), not the
time it held its unit while it waited, in ms per used iteration (and per rank, for a job)."""

from __future__ import annotations

import re

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from daydream.base.columns import numpy_filled
from daydream.graphstore.schema import GPU_KINDS

# The classes a GPU task is compared by rest on the one kernel classification
# (transforms.kernel_class.classify: matrix kernels, bandwidth-bound ones, collectives); by name
# beside it only what it does not tell apart: the optimizer's kernels, and normalizations and
# reductions among the bandwidth-bound kernels.
OPTIMIZER = re.compile(r"multi_tensor_apply|fused_adam|fused_sgd|_fused_")
NORM_REDUCE = re.compile(r"bn_fw|bn_bw|batch_norm|batchnorm|layer_norm|layernorm|group_norm|"
                         r"softmax|reduce_kernel|reduce_wgrad|welford|norm_kernel|"
                         r"cross_entropy|nll_loss")


def kernel_class(kind: str, name: str | None) -> str:
    """The class a GPU task is compared by: memcpy, memset, communication, optimizer, gemm
    (matrix kernels: products, convolutions, attention), norm_reduce (normalization, softmax,
    reduction, loss), memory_bound (the other bandwidth-bound kernels: element-wise, layout);
    a class survives a rewrite that renames its kernels (AMP's half-precision ones)."""
    if kind in ("memcpy", "memset"):
        return kind
    if kind == "comm":
        return "communication"
    from daydream.transforms.kernel_class import classify
    k = classify(name)
    if k.op == "comm":
        return "communication"
    low = (name or "").lower()
    if OPTIMIZER.search(low):
        return "optimizer"
    if k.matrix:
        return "gemm"
    return "norm_reduce" if NORM_REDUCE.search(low) else "memory_bound"


def work_frame(tables: dict[str, pa.Table], rep, ranks: int = 1, **extra
               ) -> tuple[pl.DataFrame, float]:
    """The tasks of REP's used iterations with their work (ms) and whether they ran on a GPU,
    and the divisor that makes sums per iteration (and rank). EXTRA: more columns, one value
    per task of the table."""
    task = tables["task"]
    used = [i.index for i in rep.iterations if i.used]
    work = (rep.work_ns if rep.work_ns is not None
            else rep.schedule.end_ns - rep.schedule.start_ns)
    kind = task["kind"].cast(pa.string()) if pa.types.is_dictionary(task["kind"].type) \
        else task["kind"]
    df = pl.DataFrame({
        "kind": kind.to_numpy(zero_copy_only=False).astype(str),
        "name": task["name"].to_pylist(),
        "layer": task["layer"].to_pylist(),
        "iteration": numpy_filled(task["iteration"], -1),
        "work_ms": np.asarray(work, np.float64) / 1e6, **extra})
    df = df.filter(pl.col("iteration").is_in(used))
    df = df.with_columns(pl.col("kind").is_in(list(GPU_KINDS)).alias("gpu"))
    return df, float(max(len(used), 1) * max(ranks, 1))


def by_layer(tables: dict[str, pa.Table], rep, ranks: int = 1) -> dict[str, dict]:
    """layer -> {gpu_ms, cpu_ms} per iteration (``(no layer)`` for work outside every
    layer)."""
    df, per = work_frame(tables, rep, ranks)
    g = (df.with_columns(pl.col("layer").fill_null("(no layer)"))
         .group_by("layer").agg((pl.col("work_ms") * pl.col("gpu")).sum().alias("gpu"),
                                (pl.col("work_ms") * ~pl.col("gpu")).sum().alias("cpu")))
    return {r["layer"]: {"gpu_ms": r["gpu"] / per, "cpu_ms": r["cpu"] / per}
            for r in g.iter_rows(named=True)}


def by_kernel(tables: dict[str, pa.Table], rep, ranks: int = 1) -> dict[str, dict]:
    """GPU task name -> {kind, class, ms, count} per iteration."""
    df, per = work_frame(tables, rep, ranks)
    g = (df.filter(pl.col("gpu")).group_by("name", "kind")
         .agg(pl.col("work_ms").sum().alias("ms"), pl.len().alias("n")))
    return {r["name"]: {"kind": r["kind"], "class": kernel_class(r["kind"], r["name"]),
                        "ms": r["ms"] / per, "count": r["n"] / per}
            for r in g.iter_rows(named=True)}


def by_class(tables: dict[str, pa.Table], rep, ranks: int = 1) -> dict[str, float]:
    """kernel class -> GPU ms per iteration."""
    out: dict[str, float] = {}
    for k in by_kernel(tables, rep, ranks).values():
        out[k["class"]] = out.get(k["class"], 0.0) + k["ms"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def by_operator(tables: dict[str, pa.Table], rep, ranks: int = 1) -> dict[str, dict]:
    """Host work by the operator it ran in -> {ms, count} per iteration: a host task
    is named after its innermost enclosing range (the operator's self CPU time, less its
    runtime calls), and runtime calls count apart (``api``)."""
    df, per = work_frame(tables, rep, ranks)
    g = (df.filter(pl.col("kind") == "host").group_by("name")
         .agg(pl.col("work_ms").sum().alias("ms"), pl.len().alias("n")))
    return {r["name"]: {"ms": r["ms"] / per, "count": r["n"] / per}
            for r in g.iter_rows(named=True)}


NO_OPERATOR = "(no operator)"


def by_gpu_operator(tables: dict[str, pa.Table], rep, ranges: pa.Table | None,
                    ranks: int = 1) -> dict[str, dict]:
    """GPU work by the operator that launched it -> {ms, count} per iteration. A kernel, copy or
    set belongs to the operator of the call that launched it: the graph's launch edge (the call
    with its correlation id), that call's innermost range, and of it the operator as
    ``transforms.work.task_ops`` finds it for every GPU-side model (the innermost enclosing range
    with recorded inputs, else the innermost range). RANGES: the trace's (or job's) range
    table; GPU work without a launch in the trace, launched outside every range, or inserted
    by a rewrite is ``(no operator)``."""
    from daydream.transforms.work import task_ops
    task, edge = tables["task"], tables["edge"]
    kind = edge["kind"].cast(pa.string()) if pa.types.is_dictionary(edge["kind"].type) \
        else edge["kind"]
    launch = edge.filter(pc.equal(kind, "launch"))
    ops = task_ops(task["kind"],
                   numpy_filled(task["range_id"], -1),
                   launch["src"].to_numpy(), launch["dst"].to_numpy(), ranges)
    df, per = work_frame(tables, rep, ranks, operator=ops.name)
    g = (df.filter(pl.col("gpu")).with_columns(pl.col("operator").fill_null(NO_OPERATOR))
         .group_by("operator").agg(pl.col("work_ms").sum().alias("ms"), pl.len().alias("n")))
    return {r["operator"]: {"ms": r["ms"] / per, "count": r["n"] / per}
            for r in g.iter_rows(named=True)}


def union_ns(start: np.ndarray, end: np.ndarray) -> int:
    """The length of the union of the intervals [START, END) (ns): each interval counts only
    past the furthest end of those that start before it."""
    if not len(start):
        return 0
    o = np.argsort(start, kind="stable")
    s, e = start[o], end[o]
    before = np.concatenate((s[:1], np.maximum.accumulate(e)[:-1]))
    return int(np.maximum(e - np.maximum(s, before), 0).sum())


def gpu_time_by_rank(tables: dict[str, pa.Table], rep) -> dict[int, dict]:
    """Per rank of a job graph, how its GPU spent an iteration as the trace recorded it, in ms
    per used iteration (REP: the job's replay, which tells the used ones): ``compute`` (busy
    with no collective running), ``communication`` (a collective kernel running, with or
    without other work beside it) and ``idle`` (nothing running), which add up to
    ``iteration``. Busy is the union of the rank's GPU task intervals, observed start and
    duration, clipped to the iteration's span: the rule of the store's
    ``iteration_device_time`` view, split by whether a collective ran."""
    task = pl.from_arrow(tables["task"].select(["kind", "rank", "start_ns", "obs_dur_ns"]))
    task = task.with_columns(pl.col("kind").cast(pl.String)).filter(
        pl.col("kind").is_in(list(GPU_KINDS)))
    its = pl.from_arrow(tables["iteration"].select(["rank", "iteration", "start_ns",
                                                      "end_ns"]))
    out = {}
    for r, iters in sorted(rep.ranks.items()):
        used = {i.index for i in iters if i.used}
        mine = task.filter(pl.col("rank") == r)
        s = mine["start_ns"].to_numpy()
        e = s + mine["obs_dur_ns"].to_numpy()
        comm = (mine["kind"] == "comm").to_numpy()
        sums = np.zeros(4)
        rows = its.filter((pl.col("rank") == r) & pl.col("iteration").is_in(list(used)))
        for lo, hi in rows.select("start_ns", "end_ns").iter_rows():
            cs, ce = np.maximum(s, lo), np.minimum(e, hi)
            inside = ce > cs
            busy = union_ns(cs[inside], ce[inside])
            coll = union_ns(cs[inside & comm], ce[inside & comm])
            sums += (busy - coll, coll, hi - lo - busy, hi - lo)
        n = max(rows.height, 1)
        out[r] = dict(zip(("compute_ms", "communication_ms", "idle_ms", "iteration_ms"),
                          (float(x) / n / 1e6 for x in sums), strict=True))
    return out
