"""Fused optimizers: one multi-tensor kernel per optimizer step instead of per-parameter ops."""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from daydream.base.errors import DaydreamError
from daydream.graphstore.schema import GPU_KINDS
from daydream.transforms.constants import FUSED_OPTIMIZER as C
from daydream.transforms.constants import FUSED_OPTIMIZER_CPU as C_CPU
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register

# zero_grad's kernels (fills) are not part of the step
ZERO_GRAD = r"(?i)fillfunctor|zero_grad|aten::zero_|aten::fill_"

KINDS = ("adam", "adamw", "sgd", "adagrad")
# The optimizer a trace runs, from torch's ``Optimizer.step#<Class>.step`` range (recorded by
# torch.optim.Optimizer's profile hook) and, where that names a fused class, from the kernels
# and ops of fused implementations: torch's fused=True (aten::_fused_adam_/_fused_adamw_/
# _fused_sgd_/_fused_adagrad_, kernels FusedAdamMathFunctor, fused_sgd), apex and TorchRec's
# FusedAdam/FusedLAMB/FusedSGD (multi_tensor_apply_kernel<..., AdamFunctor>), and FBGEMM's
# table-batched embeddings, whose optimizer runs fused into backward
# (split_embedding_backward_codegen_<optimizer>_...).
_STEP_RE = re.compile(r"Optimizer\.step#(\w+)\.step")
_CLASS_KIND = (("adamw", "adamw"), ("adam", "adam"), ("sgd", "sgd"), ("adagrad", "adagrad"))
_FUSED_CLASS = re.compile(r"(?i)^fused|apex|^multitensor")
_FUSED_WORK = re.compile(r"(?i)_fused_(adam|adamw|sgd|adagrad)_|fusedadammathfunctor|"
                         r"fused_sgd|adamfunctor|lambfunctor|fusedsgd")


def trace_optimizer(g: Graph) -> tuple[str | None, str | None]:
    """(kind, class): the optimizer the trace's ``Optimizer.step#X.step`` ranges name (the most
    frequent when several do), its kind one of KINDS (None for another optimizer: Shampoo, LAMB,
    EMA ...) and the class name as recorded; (None, None) without such a range."""
    names = g.task.filter(pl.col("name").fill_null("").str.contains("Optimizer.step#"))["name"]
    counts: dict[str, int] = {}
    for n in names.to_list():
        m = _STEP_RE.search(n)
        if m:
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    if not counts:
        return None, None
    cls = max(counts, key=counts.get)
    low = cls.lower()
    kind = next((k for key, k in _CLASS_KIND if key in low), None)
    return kind, cls


def already_fused(g: Graph, cls: str | None) -> str | None:
    """Why the trace's optimizer is fused already (a fused class, or fused kernels or ops in
    its weight update), else None."""
    if cls and _FUSED_CLASS.search(cls):
        return f"it runs {cls}.step, a fused optimizer"
    t = g.task.filter(pl.col("phase") == "weight_update")
    hit = t.filter(pl.col("name").fill_null("").str.contains(_FUSED_WORK.pattern))
    if hit.height:
        return f"its weight update runs {hit['name'][0][:60]!r}, a fused optimizer kernel"
    return None


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
        gpu = g.task["kind"].is_in(GPU_KINDS).any()
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
    ed = pl.DataFrame(edges, schema=["src", "dst", "kind", "anchor", "lag_ns"], orient="row")
    g, _ = g.replace(rm, pl.DataFrame(rows), ed)
    return g


STEP_RANGE = "Optimizer.step#"


def cpu_step_segments(g: Graph) -> pl.DataFrame:
    """A CPU-only trace's optimizer steps, cut into the top-level ops of each step.

    The step is the ``Optimizer.step#...`` range torch records; its host tasks labelled with that
    range are Python time between ops (gaps), the others belong to the ops it calls (an op's
    nested ops are tasks of their own). A run of op tasks between two gaps is one top-level op
    (a segment). One row per segment or gap, in order: step_id (the step range's id), unit_id,
    seq (position in the step), iteration, is_gap, name (the segment's first task's name),
    ids, dur_ns (sum over its tasks)."""
    t = g.task.with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
    wu = t.filter(pl.col("kind") == "host", pl.col("phase") == "weight_update",
                  pl.col("iteration").is_not_null())
    step = wu.filter(pl.col("name").fill_null("").str.starts_with(STEP_RANGE))
    if not step.height:
        return pl.DataFrame()
    # one step per Optimizer.step range (two optimizers make two steps in an iteration)
    bounds = step.group_by("range_id", "unit_id").agg(
        pl.col("name").first().alias("step_name"), pl.col("start_ns").min().alias("lo"),
        pl.col("start_ns").max().alias("hi")).rename({"range_id": "step_id"})
    keys = ["step_id", "unit_id"]
    r = (wu.join(bounds, on="unit_id")
         .filter(pl.col("start_ns").is_between(pl.col("lo"), pl.col("hi")))
         .sort("step_id", "start_ns", "id")
         .with_columns(((pl.col("name") == pl.col("step_name"))
                        & (pl.col("range_id") == pl.col("step_id"))).alias("is_gap")))
    # a new segment starts at every gap task and at the first op task after a gap
    r = r.with_columns((pl.col("is_gap") | pl.col("is_gap").shift(1, fill_value=True)
                        .over(keys)).alias("_new"))
    r = r.with_columns((pl.col("_new").cast(pl.Int32).cum_sum().over(keys) - 1).alias("seq"))
    return (r.group_by("step_id", "unit_id", "seq", maintain_order=True)
            .agg(pl.col("iteration").first(), pl.col("is_gap").first(), pl.col("name").first(),
                 pl.col("id").alias("ids"), pl.col("dur_ns").sum()))


def cpu_plan(seg: pl.DataFrame, kind: str) -> list[dict]:
    """Per optimizer step, what the fused optimizer keeps, drops and adds.

    - ``keep``: the gaps before the first op and after the last (the step's Python set-up and
      wrap-up, ``_init_group``, which the fused path runs too) and, for optimizers with a
      step counter, its increments (FUSED_OPTIMIZER_CPU kept_op);
    - ``drop``: the gaps between ops (the per-parameter Python loop) and every other op;
    - ``fused_ns``: the fused op: FUSED_OPTIMIZER fused_cpu_ns of host call plus the dropped
      ops' element-proportional time times the traffic factor of KIND. An op's
      element-proportional time is its duration above the median (lower) duration of that op
      name in the step, which stands for its dispatch cost: most parameter tensors of a
      network are small (biases and normalization weights are half of an MLP's tensors, two
      thirds of a ResNet's, ten of a transformer layer's sixteen), so the median op is
      dispatch-bound, and unlike the shortest op it does not count every op's jitter
      (profiler, preemption) as element work. An op name seen once counts whole.
    """
    spec = C_CPU[kind]["value"]
    plans = []
    for (_, unit), s in seg.group_by(["step_id", "unit_id"], maintain_order=True):
        s = s.sort("seq")
        it = s["iteration"][0]
        ops = s.filter(~pl.col("is_gap"))
        if not ops.height:
            continue
        first, last = ops["seq"].min(), ops["seq"].max()
        names = ops["name"].to_list()
        kept_seg = set()
        if spec["kept_op"]:
            for i, nm in enumerate(names):
                opens = i == 0 or names[i - 1] == spec["last_op"]
                if (nm == spec["kept_op"] and opens) or (i == 0 and nm == spec["kept_foreach"]):
                    kept_seg.add(int(ops["seq"][i]))
        math = ops.filter(~pl.col("seq").is_in(list(kept_seg)))
        floor = math.group_by("name").agg(
            pl.col("dur_ns").quantile(0.5, "lower").alias("floor"), pl.len())
        math = math.join(floor, on="name").with_columns(
            pl.when(pl.col("len") > 1).then((pl.col("dur_ns") - pl.col("floor"))
                                            .clip(lower_bound=0))
            .otherwise(pl.col("dur_ns")).alias("var_ns"))
        gaps_mid = s.filter(pl.col("is_gap"), pl.col("seq") > first, pl.col("seq") < last)
        drop = [i for ids in math["ids"] for i in ids] + [i for ids in gaps_mid["ids"]
                                                          for i in ids]
        var_ns = int(math["var_ns"].sum())
        plans.append({
            "iteration": it, "unit_id": unit, "at": int(min(drop)) if drop else None,
            "keep": [i for ids in ops.filter(pl.col("seq").is_in(list(kept_seg)))["ids"]
                     for i in ids],
            "drop": sorted(drop), "n_ops": ops.height, "var_ns": var_ns,
            "fused_ns": C["fused_cpu_ns"]["value"] + int(round(var_ns * C[kind]["value"]))})
    return plans


def _fuse_cpu(g: Graph, ctx: Context, kind: str) -> Graph:
    """A CPU-only trace (the optimizer runs on the CPU): each step's per-parameter for-loop of
    ops becomes one fused op (see ``cpu_plan``), as torch's ``fused=True`` does on the CPU."""
    seg = cpu_step_segments(g)
    plans = cpu_plan(seg, kind) if seg.height else []
    plans = [p for p in plans if p["drop"]]
    if not plans:
        t = g.task
        mask = ((t["kind"] == "host") & (t["phase"] == "weight_update")
                & ~t["name"].fill_null("").str.contains(ZERO_GRAD)).to_numpy()
        if not mask.any():
            ctx.notes.append(f"fused_{kind}: no weight-update work found; unchanged")
            return g
        f = C[kind]["value"]
        ctx.notes.append(f"fused_{kind}: CPU-only trace without an Optimizer.step range: "
                         f"{int(mask.sum())} weight-update host tasks scaled by {f:.3f}")
        return g.scale(mask, f)
    drop = np.zeros(g.n_tasks, bool)
    drop[[i for p in plans for i in p["drop"]]] = True
    g = g.scale(drop, 0.0)  # zeroed, not removed: a CPU task may time an iteration
    rows = [{"at": p["at"], "kind": "host", "unit_id": p["unit_id"],
             "name": f"fused_{kind}: _fused_{kind}_ (inserted)", "dur_ns": p["fused_ns"]}
            for p in plans]
    g, _ = g.insert(pl.DataFrame(rows))
    ctx.notes.append(f"fused_{kind}: CPU-only trace: {len(plans)} optimizer steps, "
                     f"{sum(p['n_ops'] for p in plans)} ops -> one fused op each "
                     f"(+{sum(len(p['keep']) for p in plans)} step-counter tasks kept)")
    return g


def applies(g: Graph, ctx: Context, kind: str) -> bool:
    """Whether fused_KIND applies to the trace: an error when the trace runs another optimizer
    (naming it), False (with a note) when its optimizer is fused already."""
    found, cls = trace_optimizer(g)
    if cls is not None and found != kind:
        raise DaydreamError(f"fused_{kind}: the trace runs {cls} (Optimizer.step#{cls}.step), "
                            f"not {kind}; ask for " + (f"fused_{found}" if found else
                                                       "an optimizer it runs") +
                            f" (known: {', '.join('fused_' + k for k in KINDS)})")
    why = already_fused(g, cls)
    if why is not None:
        ctx.notes.append(f"fused_{kind}: does not apply, {why}; unchanged")
        return False
    if cls is None:
        ctx.notes.append(f"fused_{kind}: the trace names no optimizer (no Optimizer.step#... "
                         f"range); {kind} assumed")
    return True


def _make(kind: str):
    def opt(g: Graph, ctx: Context) -> Graph:
        if not applies(g, ctx, kind):
            return g
        return fuse(g, ctx, kind)
    opt.__doc__ = (
        f"Fused {kind} optimizer: each step's per-parameter kernels become one kernel.\n\n"
        f"The trace's optimizer is read from its Optimizer.step#X.step ranges: another one than "
        f"{kind} is an error naming it; one that is fused already (a Fused* class, torch's "
        "fused=True ops and kernels) leaves the trace unchanged with a note. "
        "The weight-update kernels of each iteration (zero_grad's fills excepted) and their "
        "launch calls are removed (predecessors rewired to successors); the host time of the "
        "step between the first and last launch is scaled to 0 (kept as tasks, since a CPU "
        "task may time an iteration). One launch call (FUSED_OPTIMIZER fused_cpu_ns) and one "
        f"kernel are inserted in their place; the kernel lasts the removed kernels' sum times "
        f"the memory-traffic factor of {kind} (transforms.constants.FUSED_OPTIMIZER: passes "
        "over parameter-sized tensors fused / unfused).")
    return opt


for _k in ("adam", "adamw", "sgd", "adagrad"):
    register(f"fused_{_k}", shrinks=True)(_make(_k))


@register("fused_optimizer", shrinks=True)
def fused_optimizer(g: Graph, ctx: Context, *, kind: str = "adam") -> Graph:
    """Fused optimizer of KIND (adam, adamw, sgd, adagrad); see fused_adam."""
    if kind not in KINDS:
        raise DaydreamError(f"fused_optimizer: unknown kind {kind!r}; known: "
                            f"{', '.join(KINDS)}")
    if not applies(g, ctx, kind):
        return g
    return fuse(g, ctx, kind)
