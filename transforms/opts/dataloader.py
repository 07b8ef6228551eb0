"""More DataLoader workers: batches are prepared off the training thread, on the cores left."""

from __future__ import annotations

import numpy as np
import polars as pl

from daydream.base.errors import DaydreamError
from daydream.transforms.constants import DATALOADER as C
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register


def shares(workers: int, cores: float) -> tuple[float, float]:
    """Share of a core each runnable thread gets when the training thread and ``workers``
    worker processes run on ``cores`` cores (fair sharing, as Linux's scheduler gives CPU-bound
    threads of equal priority): (with the training thread running, with it waiting)."""
    if cores <= 0:  # enough cores: every thread has its own
        return 1.0, 1.0
    return min(1.0, cores / (workers + 1)), min(1.0, cores / workers)


def step_model(load_ns, compute_ns, workers: int, cores: float, ipc_ns: float):
    """Per iteration, the training thread's compute and wait with WORKERS workers on CORES cores.

    load = the batch's loading time on one core (the base trace's data-loading host time),
    compute = the rest of the step. Each worker makes a batch every load/workers of the step
    (a = load/workers per worker per step) while the training thread computes; with r1 = the
    share of a core per thread while all run and r2 = while the training thread waits
    (``shares``):
    - loading-bound (a >= compute): the workers never idle; the training thread's compute takes
      compute/r1, the workers' remaining a - compute of work then runs at r2:
      wait = (a - compute)/r2;
    - compute-bound (a < compute): the workers finish their a of work in a/r1 of the step and
      idle (queue full); the training thread loses (1 - r1) of its core meanwhile:
      compute' = compute + a*(1/r1 - 1), no wait.
    With enough cores (r1 = r2 = 1) this is max(compute, a). Both get + ipc_ns (taking the
    batch off the worker queue). Returns (compute' ns, wait ns) as float arrays."""
    load = np.asarray(load_ns, np.float64)
    comp = np.asarray(compute_ns, np.float64)
    r1, r2 = shares(workers, cores)
    a = load / workers
    bound = a >= comp
    comp_new = np.where(bound, comp / r1, comp + a * (1 / r1 - 1))
    wait = np.where(bound, (a - comp) / r2, 0.0) + ipc_ns
    return comp_new, wait


def factors(g: Graph, workers: int, cores: float = 0.0) -> pl.DataFrame:
    """Per iteration: load_ns (host data loading), span_ns, compute_ns, wait_ns, factor (the
    data-loading tasks' scale: wait/load, never above 1) and compute_factor (the other CPU
    tasks' scale on the loading thread: > 1 when the workers take cores from it)."""
    t = g.task.filter(pl.col("kind") == "host", pl.col("phase") == "data_loading",
                      pl.col("iteration").is_not_null())
    load = t.group_by("iteration").agg(pl.col("dur_ns").sum().alias("load_ns"))
    its = g.iteration.select("iteration", (pl.col("end_ns") - pl.col("start_ns"))
                             .alias("span_ns"))
    d = its.join(load, on="iteration", how="inner").with_columns(
        (pl.col("span_ns") - pl.col("load_ns")).clip(lower_bound=0).alias("compute_ns")
    ).sort("iteration")
    comp_new, wait = step_model(d["load_ns"].to_numpy(), d["compute_ns"].to_numpy(), workers,
                                cores, C["ipc_ns"]["value"])
    comp = d["compute_ns"].to_numpy().astype(np.float64)
    load = d["load_ns"].to_numpy().astype(np.float64)
    return d.with_columns(
        pl.Series("wait_ns", wait),
        pl.Series("factor", np.where(load > 0, np.minimum(wait / np.maximum(load, 1), 1.0),
                                     1.0)),
        pl.Series("compute_factor", np.where(comp > 0, comp_new / np.maximum(comp, 1), 1.0)))


@register("dataloader", shrinks=True)
def dataloader(g: Graph, ctx: Context, *, workers: int = 4, cores: float = 0.0) -> Graph:
    """DataLoader with WORKERS worker processes on CORES cores: the training thread's data
    loading shrinks, and where the cores are too few, its other work slows.

    Per iteration, load = the host time in phase data_loading (the base trace loads on the
    training thread, num_workers=0), compute = the iteration's span minus load. The workers and
    the training thread share CORES cores fairly (``step_model``): with enough of them the
    training thread waits max(0, load/WORKERS - compute); with fewer than WORKERS + 1, each
    runnable thread gets CORES/(threads running) of a core, so the training thread's compute
    stretches and the loading spreads over the cores left. The wait gets DATALOADER ipc_ns
    (taking the batch from the worker queue). The data-loading host tasks are scaled by
    wait/load (never above 1) and, under contention, the training thread's other CPU tasks by
    compute'/compute. CORES = 0 (default): as many as needed (Kineto traces do not record the
    host's core count); give the machine's cores, fractional where the cores are shared, to
    model contention. Copies to the GPU are kept."""
    if workers < 1:
        raise DaydreamError(f"dataloader: workers must be >= 1, got {workers}")
    if cores < 0:
        raise DaydreamError(f"dataloader: cores must be >= 0 (0 = enough), got {cores}")
    f = factors(g, workers, cores)
    if not f.height:
        ctx.notes.append("dataloader: no data-loading host time in any iteration; unchanged")
        return g
    t = g.task
    it = t["iteration"].fill_null(-1).to_numpy()
    sel = ((t["kind"] == "host") & (t["phase"] == "data_loading")
           & t["iteration"].is_not_null()).to_numpy()
    fac = dict(zip(f["iteration"].to_list(), f["factor"].to_list(), strict=False))
    per = np.array([fac.get(int(i), 1.0) for i in it]) if sel.any() else np.ones(g.n_tasks)
    g2 = g.scale(sel, per)
    cfac = dict(zip(f["iteration"].to_list(), f["compute_factor"].to_list(), strict=False))
    if any(v != 1.0 for v in cfac.values()):
        # the training thread: the unit(s) whose tasks do the loading
        units = np.unique(t["unit_id"].to_numpy()[sel])
        other = (np.isin(t["unit_id"].to_numpy(), units) & ~sel & (it >= 0)
                 & t["kind"].is_in(["host", "api"]).to_numpy())
        g2 = g2.scale(other, np.array([cfac.get(int(i), 1.0) for i in it]))
        r1, _ = shares(workers, cores)
        ctx.notes.append(f"dataloader: {workers} workers + the training thread on {cores:g} "
                         f"cores: each gets {r1:.2f} of a core while all run")
    return g2
