"""Automatic mixed precision (torch.autocast + GradScaler)."""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from graphstore.schema import GPU_KINDS
from transforms import memory
from transforms.constants import AMP, AMP_SPEEDUP
from transforms.devices import family
from transforms.primitives import Graph
from transforms.registry import Context, register
from transforms.work import ranges_of

# Kernel classes by name, first match wins (lower-cased names).
CLASSES = (
    ("layout", r"nchwtonhwc|nhwctonchw|transpose|copy_kernel|direct_copy|scalepackedtensor"),
    ("norm_reduce", r"bn_fw|bn_bw|batch_norm|batchnorm|layer_norm|layernorm|group_norm|"
                    r"softmax|reduce_kernel|reduce_wgrad|welford|norm_kernel|cross_entropy|"
                    r"nll_loss"),
    ("gemm", r"gemm|conv|xmma|cutlass|scudnn|wgrad|dgrad|fprop|winograd|cublas|gemv|"
             r"splitk|sm\d\d_|ampere_|volta_|turing_|hopper_|cudnn_infer|cudnn_train|"
             r"mfma|igemm|dot_kernel"),
    ("memory_bound", r"elementwise|functor|threshold|pool|relu|fill|cat_|index|dropout|"
                     r"where|scatter|gather|upsample|embedding|add|mul|unrolled"),
)
_CLASS_RE = [(c, re.compile(p)) for c, p in CLASSES]
TF32 = re.compile(r"tf32|s1688|s16816|tensorop_s|xf32")


def classify(kind: list, name: list, phase: list) -> list[str]:
    """AMP class of every task: gemm_fp32, gemm_tf32, memory_bound, norm_reduce or keep."""
    out = []
    for k, n, ph in zip(kind, name, phase, strict=False):
        if k != "kernel" or ph == "weight_update" or n is None:
            out.append("keep")
            continue
        low = n.lower()
        if "nccl" in low or "multi_tensor_apply" in low:
            out.append("keep")
            continue
        c = next((c for c, r in _CLASS_RE if r.search(low)), "keep")
        if c == "layout":
            c = "memory_bound"
        elif c == "gemm":
            c = "gemm_tf32" if TF32.search(low) else "gemm_fp32"
        out.append(c)
    return out


def new_durations(dur: np.ndarray, cls: list[str], fam: str) -> np.ndarray:
    """dur / speedup of the class, not below min_kernel_ns (kernels already shorter keep their
    duration)."""
    sp = AMP_SPEEDUP[fam]
    floor = AMP["min_kernel_ns"]["value"]
    s = np.array([sp[c]["value"] if c in sp else 1.0 for c in cls], np.float64)
    new = np.rint(dur / s).astype(np.int64)
    return np.where(s == 1.0, dur, np.maximum(new, np.minimum(dur, floor)))


@register("amp")
def amp(g: Graph, ctx: Context, *, casts: bool = True, loss_scaling: bool = True) -> Graph:
    """Automatic mixed precision: GPU kernels shrink by their class's FP16 speedup.

    Kernels are classed by name (GEMM/convolution on FP32 or TF32, element-wise/layout,
    normalization/reduction); each class has a speedup per GPU family (v100, a100, h100,
    turing, mi300x; 'default' when the device is unknown), see transforms.constants.AMP_SPEEDUP
    with sources. Copies, collectives and optimizer kernels keep their time (FP32 gradients and
    master weights). No kernel is made shorter than AMP min_kernel_ns. With CASTS, a weight
    cast (one kernel and its launch call) is inserted before each run of forward GEMM/conv
    kernels; with LOSS_SCALING, each iteration's weight update gets GradScaler's unscale
    kernel, a found_inf.item() sync that blocks the host until it ends, and the scale update
    kernel."""
    fam = family(ctx.device)
    ctx.notes.append(f"amp: GPU family {fam}")
    t = g.task
    cls = classify(t["kind"].to_list(), t["name"].to_list(), t["phase"].to_list())
    dur = t["dur_ns"].to_numpy()
    g = g.set_duration(np.ones(g.n_tasks, bool), new_durations(dur, cls, fam))
    if casts:
        g = _insert_casts(g, cls)
    if loss_scaling:
        g = _insert_loss_scaling(g)
    ctx.notes.extend(memory.notes(g, ctx, "amp", ranges=ranges_of(ctx), amp=True))
    return g


def cast_sites(g: Graph, cls: list[str]) -> list[tuple[int, int, int]]:
    """(gpu kernel, its launch api, launch lag) of each forward GEMM/conv kernel that starts a
    run of GEMM/conv kernels on its stream."""
    t = g.task
    is_gemm = np.array([c.startswith("gemm") for c in cls])
    fwd = (t["phase"] == "forward").to_numpy()
    unit = t["unit_id"].to_numpy()
    prev_gemm = np.zeros(g.n_tasks, bool)
    for u in np.unique(unit[is_gemm]):
        ids = np.flatnonzero((unit == u) & (t["kind"].is_in(GPU_KINDS).to_numpy()))
        prev_gemm[ids[1:]] = is_gemm[ids[:-1]]
    first = np.flatnonzero(is_gemm & fwd & ~prev_gemm)
    la = g.edge.filter(pl.col("kind") == "launch", pl.col("dst").is_in(first.tolist()))
    return [(int(d), int(s), int(lag)) for s, d, lag in
            zip(la["src"].to_list(), la["dst"].to_list(), la["lag_ns"].to_list(), strict=False)]


def _insert_casts(g: Graph, cls: list[str]) -> Graph:
    sites = cast_sites(g, cls)
    if not sites:
        return g
    unit = g.task["unit_id"].to_numpy()
    k = len(sites)
    rows = []
    for _kern, api, _ in sites:
        rows.append({"at": api, "kind": "api", "unit_id": int(unit[api]),
                     "name": "cudaLaunchKernel", "dur_ns": AMP["cast_cpu_ns"]["value"]})
    for kern, _api, _ in sites:
        rows.append({"at": kern, "kind": "kernel", "unit_id": int(unit[kern]),
                     "name": "amp: cast weight fp32->fp16 (inserted)",
                     "dur_ns": AMP["cast_kernel_ns"]["value"]})
    edges = pl.DataFrame({"src": [-1 - i for i in range(k)],
                          "dst": [-1 - k - i for i in range(k)],
                          "kind": ["launch"] * k, "anchor": ["start_start"] * k,
                          "lag_ns": [lag for _, _, lag in sites], "binding": [False] * k})
    g2, _ = g.insert(pl.DataFrame(rows), edges)
    return g2


def loss_scaling_sites(g: Graph) -> list[tuple[int, int, int, int]]:
    """Per iteration: (first optimizer kernel, its launch api, launch lag, sum of the
    iteration's optimizer kernel durations)."""
    t = g.task
    wu = t.with_row_index("i").filter(pl.col("phase") == "weight_update",
                                      pl.col("kind") == "kernel",
                                      pl.col("iteration").is_not_null())
    if not wu.height:
        return []
    first = wu.group_by("iteration").agg(pl.col("i").min().alias("k"),
                                         pl.col("dur_ns").sum().alias("sum")).sort("iteration")
    la = g.edge.filter(pl.col("kind") == "launch").select(
        pl.col("src").alias("api"), pl.col("dst").alias("k"), "lag_ns")
    j = first.join(la, on="k", how="inner").sort("iteration")
    return [(int(r["k"]), int(r["api"]), int(r["lag_ns"]), int(r["sum"])) for r in j.iter_rows(
        named=True)]


def _insert_loss_scaling(g: Graph) -> Graph:
    sites = loss_scaling_sites(g)
    if not sites:
        return g
    unit = g.task["unit_id"].to_numpy()
    rows, edges = [], []
    c = AMP
    for kern, api, lag, opt_sum in sites:
        b = len(rows)
        th, st = int(unit[api]), int(unit[kern])
        unscale = max(int(round(opt_sum * c["unscale_frac"]["value"])), 1)
        rows += [
            {"at": api, "kind": "api", "unit_id": th, "name": "cudaLaunchKernel",
             "dur_ns": c["cast_cpu_ns"]["value"], "blocking": False},
            {"at": api, "kind": "api", "unit_id": th,
             "name": "cudaMemcpyAsync (GradScaler found_inf.item, inserted)",
             "dur_ns": c["sync_ns"]["value"], "blocking": True},
            {"at": api, "kind": "api", "unit_id": th, "name": "cudaLaunchKernel",
             "dur_ns": c["cast_cpu_ns"]["value"], "blocking": False},
            {"at": kern, "kind": "kernel", "unit_id": st,
             "name": "amp: _amp_foreach_non_finite_check_and_unscale_ (inserted)",
             "dur_ns": unscale, "blocking": False},
            {"at": kern, "kind": "kernel", "unit_id": st,
             "name": "amp: _amp_update_scale_ (inserted)",
             "dur_ns": c["scale_kernel_ns"]["value"], "blocking": False},
        ]
        r = [-1 - (b + i) for i in range(5)]
        edges += [
            (r[0], r[3], "launch", "start_start", lag),
            (r[2], r[4], "launch", "start_start", lag),
            (r[3], r[1], "sync", "end_end", 0),
        ]
    ed = pl.DataFrame(edges, schema=["src", "dst", "kind", "anchor", "lag_ns"], orient="row")
    g2, _ = g.insert(pl.DataFrame(rows), ed)
    return g2
