"""More DataLoader workers: batches are prepared off the training thread."""

from __future__ import annotations

import numpy as np
import polars as pl

from ingest.errors import DaydreamError
from transforms.constants import DATALOADER as C
from transforms.primitives import Graph
from transforms.registry import Context, register


def factors(g: Graph, workers: int) -> pl.DataFrame:
    """Per iteration: load_ns (host data loading), span_ns, wait_ns, factor."""
    t = g.task.filter(pl.col("kind") == "host", pl.col("phase") == "data_loading",
                      pl.col("iteration").is_not_null())
    load = t.group_by("iteration").agg(pl.col("dur_ns").sum().alias("load_ns"))
    its = g.iteration.select("iteration", (pl.col("end_ns") - pl.col("start_ns"))
                             .alias("span_ns"))
    d = its.join(load, on="iteration", how="inner").with_columns(
        (pl.col("span_ns") - pl.col("load_ns")).clip(lower_bound=0).alias("compute_ns"))
    d = d.with_columns(((pl.col("load_ns") / workers - pl.col("compute_ns")).clip(lower_bound=0)
                        + C["ipc_ns"]["value"]).alias("wait_ns"))
    return d.with_columns(pl.when(pl.col("load_ns") > 0)
                          .then((pl.col("wait_ns") / pl.col("load_ns")).clip(upper_bound=1.0))
                          .otherwise(1.0).alias("factor")).sort("iteration")


@register("dataloader")
def dataloader(g: Graph, ctx: Context, *, workers: int = 4) -> Graph:
    """DataLoader with WORKERS worker processes: the training thread's data loading shrinks.

    With N workers loading in parallel with training, the main thread waits for a batch only
    when loading is slower than N times the rest of the step: per iteration, load = the host
    time in phase data_loading, compute = the iteration's span minus load, and the main
    thread's remaining wait = max(0, load/N - compute) + DATALOADER ipc_ns (taking the batch
    from the worker queue). Each iteration's data-loading host tasks are scaled by wait/load
    (never above 1). Copies to the GPU are kept."""
    if workers < 1:
        raise DaydreamError(f"dataloader: workers must be >= 1, got {workers}")
    f = factors(g, workers)
    if not f.height:
        ctx.notes.append("dataloader: no data-loading host time in any iteration; unchanged")
        return g
    fac = dict(zip(f["iteration"].to_list(), f["factor"].to_list(), strict=False))
    t = g.task
    sel = ((t["kind"] == "host") & (t["phase"] == "data_loading")
           & t["iteration"].is_not_null()).to_numpy()
    it = t["iteration"].fill_null(-1).to_numpy()
    per = np.array([fac.get(int(i), 1.0) for i in it]) if sel.any() else np.ones(g.n_tasks)
    return g.scale(sel, per)
