"""Fused optimizers: one multi-tensor kernel per optimizer step instead of per-parameter ops."""

from __future__ import annotations

import numpy as np
import polars as pl

from transforms.constants import FUSED_OPTIMIZER as C
from transforms.primitives import Graph
from transforms.registry import Context, register

# zero_grad's kernels (fills) are not part of the step
ZERO_GRAD = r"(?i)fillfunctor|zero_grad|aten::zero_|aten::fill_"


def step_regions(g: Graph) -> pl.DataFrame:
    """Per iteration, the optimizer step: its kernels, their launch calls, the host tasks of
    the step on the launching thread between the first and last launch.

    Columns: iteration, kernels (ids), apis (ids), hosts (ids), kernel_ns (sum)."""
    t = g.task.with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
    kern = t.filter(pl.col("kind") == "kernel", pl.col("phase") == "weight_update",
                    pl.col("iteration").is_not_null(),
                    ~pl.col("name").fill_null("").str.contains(ZERO_GRAD))
    la = g.edge.filter(pl.col("kind") == "launch").select(pl.col("src").alias("api"),
                                                          pl.col("dst").alias("id"))
    k = kern.join(la, on="id", how="left")
    rows = []
    start = t["start_ns"].to_numpy()
    unit = t["unit_id"].to_numpy()
    kind = t["kind"].to_numpy()
    phase = t["phase"].to_numpy()
    name = t["name"].fill_null("").to_numpy()
    for (it,), grp in k.group_by(["iteration"], maintain_order=True):
        kids = np.sort(grp["id"].to_numpy())
        apis = np.sort(grp["api"].drop_nulls().unique().to_numpy())
        hosts = np.empty(0, np.int64)
        if len(apis):
            th = unit[apis[0]]
            lo, hi = start[apis[0]], start[apis[-1]]
            cand = np.flatnonzero((unit == th) & (kind == "host") & (phase == "weight_update")
                                  & (start >= lo) & (start <= hi))
            hosts = np.array([i for i in cand if "zero_grad" not in name[i]
                              and name[i] not in ("aten::zero_", "aten::fill_")], np.int64)
        rows.append({"iteration": it, "kernels": kids.tolist(), "apis": apis.tolist(),
                     "hosts": hosts.tolist(),
                     "kernel_ns": int(t["dur_ns"].to_numpy()[kids].sum())})
    return pl.DataFrame(rows, schema={"iteration": pl.Int32, "kernels": pl.List(pl.Int64),
                                      "apis": pl.List(pl.Int64), "hosts": pl.List(pl.Int64),
                                      "kernel_ns": pl.Int64})


def fused_kernel_ns(kernel_ns: int, kind: str) -> int:
    return max(int(round(kernel_ns * C[kind]["value"])), C["min_kernel_ns"]["value"])


def fuse(g: Graph, ctx: Context, kind: str) -> Graph:
    regions = step_regions(g)
    if not regions.height:
        gpu = g.task["kind"].is_in(["kernel", "memcpy", "memset", "comm"]).any()
        if gpu:
            ctx.notes.append(f"fused_{kind}: no optimizer kernels in the weight update; "
                             "unchanged")
            return g
        return _fuse_cpu(g, ctx, kind)
    n = g.n_tasks
    rm = np.zeros(n, bool)
    zero = np.zeros(n, bool)
    rows, edges = [], []
    unit = g.task["unit_id"].to_numpy()
    lag_of = dict(zip(g.edge.filter(pl.col("kind") == "launch")["dst"].to_list(),
                      g.edge.filter(pl.col("kind") == "launch")["lag_ns"].to_list(), strict=False))
    for r in regions.iter_rows(named=True):
        kids, apis = r["kernels"], r["apis"]
        rm[kids] = True
        rm[apis] = True
        zero[r["hosts"]] = True
        if not apis:
            continue
        j = len(rows)
        rows.append({"at": apis[0], "kind": "api", "unit_id": int(unit[apis[0]]),
                     "name": "cudaLaunchKernel", "dur_ns": C["fused_cpu_ns"]["value"]})
        rows.append({"at": kids[0], "kind": "kernel", "unit_id": int(unit[kids[0]]),
                     "name": f"fused_{kind}: multi_tensor_apply step (inserted)",
                     "dur_ns": fused_kernel_ns(r["kernel_ns"], kind)})
        edges.append((-1 - j, -2 - j, "launch", "start_start", int(lag_of.get(kids[0], 0))))
    g = g.scale(zero, 0.0)
    g = g._with(task=g.task.with_columns(pl.Series("_rm", rm)))
    ed = pl.DataFrame(edges, schema=["src", "dst", "kind", "anchor", "lag_ns"], orient="row")
    g, _ = g.insert(pl.DataFrame(rows), ed)
    g = g.remove(pl.col("_rm").fill_null(False))
    return g._with(task=g.task.drop("_rm"))


def _fuse_cpu(g: Graph, ctx: Context, kind: str) -> Graph:
    """A CPU-only trace (the optimizer runs on the CPU): the per-parameter ops of each step
    become one fused op. Its time is the step's host time times the same traffic factor: the
    unfused step's time is dominated by per-op passes over parameter-sized tensors and per-op
    dispatch, both of which the fused op does once per group of tensors."""
    t = g.task
    mask = ((t["kind"] == "host") & (t["phase"] == "weight_update")
            & ~t["name"].fill_null("").str.contains(ZERO_GRAD)).to_numpy()
    if not mask.any():
        ctx.notes.append(f"fused_{kind}: no weight-update work found; unchanged")
        return g
    f = C[kind]["value"]
    ctx.notes.append(f"fused_{kind}: CPU-only trace: {int(mask.sum())} weight-update host "
                     f"tasks scaled by {f:.3f}")
    return g.scale(mask, f)


def _make(kind: str):
    def opt(g: Graph, ctx: Context) -> Graph:
        return fuse(g, ctx, kind)
    opt.__doc__ = (
        f"Fused {kind} optimizer: each step's per-parameter kernels become one kernel.\n\n"
        "The weight-update kernels of each iteration (zero_grad's fills excepted) and their "
        "launch calls are removed (predecessors rewired to successors); the host time of the "
        "step between the first and last launch is scaled to 0 (kept as tasks, since a CPU "
        "task may time an iteration). One launch call (FUSED_OPTIMIZER fused_cpu_ns) and one "
        f"kernel are inserted in their place; the kernel lasts the removed kernels' sum times "
        f"the memory-traffic factor of {kind} (transforms.constants.FUSED_OPTIMIZER: passes "
        "over parameter-sized tensors fused / unfused).")
    return opt


for _k in ("adam", "adamw", "sgd", "adagrad"):
    register(f"fused_{_k}")(_make(_k))


@register("fused_optimizer")
def fused_optimizer(g: Graph, ctx: Context, *, kind: str = "adam") -> Graph:
    """Fused optimizer of KIND (adam, adamw, sgd, adagrad); see fused_adam."""
    from ingest.errors import DaydreamError
    if kind not in ("adam", "adamw", "sgd", "adagrad"):
        raise DaydreamError(f"fused_optimizer: unknown kind {kind!r}; known: adam, adamw, "
                            "sgd, adagrad")
    return fuse(g, ctx, kind)
