"""Measure 2, response to the hardware: every GPU task (then every CPU task) scaled by f, the
prediction read against the bounds that bench/bounds.py computes from the raw trace."""

from __future__ import annotations

from pathlib import Path

from bench import bounds as bnd
from bench.accuracy import NA, PLOTS, ROOT, Context, Result, reason, section
from bench.accuracy import traces as tr

FACTORS = (0.25, 0.5, 0.8, 0.9, 1.1, 1.2)
SELECT = {"gpu": "kind IN ('kernel','memcpy','memset','comm')",
          "cpu": "kind IN ('api','host')"}
# how far (relative) a prediction may sit outside an edge and still pass: the api's iteration
# window and the bounds script's step window are cut by different code from the same events
TOL = 0.005
# "within 10% of the lower edge" on a trace bound by the side that was scaled
TIGHT = 0.10
# a trace is bound by a side when that side's figure is at least this share of its step
BOUND_SHARE = 0.9


def spec(which: str, f: float) -> str:
    return f'scale(select="{SELECT[which]}",factor={f})'


def headline(d: dict) -> float | None:
    """The steady-state predicted step: the api's steady headline when it has one."""
    v = d.get("predicted_steady_ms", d.get("predicted_ms"))
    return None if v is None else float(v)


def step_edges(row: dict, which: str, f: float) -> tuple[float, float]:
    """[lower, upper] of one step (a bounds row) with one side scaled by f."""
    return bnd.edges({"median": row}, which, f)  # one rank's step: its peers' waits as seen


def tight_applies(row: dict, which: str, f: float, b: dict) -> bool:
    """The 10% rule: on a trace bound by the scaled side, while that side is still the
    bottleneck: f G_floor (``bench.bounds.gpu_floor``) at least the CPU's serial work
    C_serial, or f C_max at least G_floor for the CPU. C_serial is the time some thread works
    or runs the Python between its operators: the main and autograd threads hand the step to
    each other, so the busiest thread alone (C_max) understates it, and the time between
    operators is CPU work too (the HTA V100 ResNet-50 has 27.9 ms of it per step against 23.6
    ms of GPU work at a quarter; 23.1 without the Python between operators)."""
    floor = bnd.gpu_floor(row, bool(b.get("peers_in_trace")))
    if which == "gpu":
        c = row.get("C_serial_ms", row.get("C_union_ms", row["C_max_ms"]))
        return bool(b["gpu_bound"]) and f * floor >= c
    return bool(b["cpu_bound"]) and f * row["C_max_ms"] >= floor


def match(b: dict, d: dict) -> list[tuple[dict, dict]]:
    """(bounds step, api iteration) pairs of the steady steps: ProfilerStep#N by label; the
    k-th stretch between Optimizer.step ends with the api's iteration k (its iteration 0 runs
    from the trace's start to the first step's end); a whole-trace window with a lone
    iteration. A pair whose measured lengths differ by more than 2% is not a match."""
    its = d.get("iterations") or []
    out = []
    for k, row in enumerate(b["steps"]):
        if not row["steady"]:
            continue
        it = None
        if b["rule"] == "ProfilerStep":
            it = next((i for i in its if i.get("label") == row["label"]), None)
        elif b["rule"] == "Optimizer.step":
            it = next((i for i in its if i.get("index") == k + 1), None)
        elif len(its) == 1:
            it = its[0]
        if it is None or not it.get("measured_ms"):
            continue
        if abs(it["measured_ms"] - row["T_ms"]) > 0.02 * row["T_ms"]:
            continue
        out.append((row, it))
    return out


def amdahl(row: dict, which: str, f: float) -> float:
    """The clipped-Amdahl formula on a step's figures: the scaled side's time scaled, the rest
    kept, clipped below by the other side and by the scaled side itself. GPU scaled:
    max(T - (1 - f) G, C_max, f G); CPU scaled: max(T - (1 - f) C_max, G, f C_max)."""
    t, g, c = row["T_ms"], row["G_ms"], row["C_max_ms"]
    if which == "gpu":
        return max(t - (1 - f) * g, c, f * g)
    return max(t - (1 - f) * c, g, f * c)


def naive(b: dict, which: str, f: float) -> dict:
    """The naive predictors' points, judged by the same edges and rules as Daydream's: the
    clipped-Amdahl formula and "no change" (T). A measure they pass shows nothing."""
    row = b["mean"]
    a, z = bnd.edges({"median": row, "peers_in_trace": b.get("peers_in_trace", False)},
                     which, f)
    out = {}
    for name, v in (("amdahl", amdahl(row, which, f)), ("no_change", row["T_ms"])):
        out[f"{name}_ms"] = v
        out[f"{name}_out"] = int(v < a * (1 - TOL) or v > z * (1 + TOL))
        out[f"{name}_loose"] = int(not out[f"{name}_out"] and tight_applies(row, which, f, b)
                                   and v > a * (1 + TIGHT))
    return out


def judge(b: dict, matched: list[tuple[dict, dict]], d: dict | None, which: str, f: float,
          key: str = "predicted_ms") -> dict:
    """One point of a curve: the prediction's headline (the steady-state step, completion to
    completion over the used iterations: docs/graph.md) against the edges of the trace's mean
    steady step. Each step timed alone is also read against its own edges, for information
    only: in a short window a what-if moves the CPU ahead of the GPU (or behind it) for an
    iteration or two, and such a step shows the CPU's pace while the GPU's work lands in the
    drain."""
    pt: dict = {"f": f, "which": which}
    v = None if d is None else d.get(key)
    v = None if v is None else float(v)
    row = b["mean"]
    a, z = bnd.edges({"median": row, "peers_in_trace": b.get("peers_in_trace", False)},
                     which, f)
    pt.update(predicted_ms=v, lo_ms=a, hi_ms=z, by="headline",
              steps_out=int(v is not None and (v < a * (1 - TOL) or v > z * (1 + TOL))),
              steps_loose=int(v is not None and tight_applies(row, which, f, b)
                              and v > a * (1 + TIGHT)), steps=1 if v is not None else 0)
    it_key = "baseline_ms" if key == "baseline_ms" else "predicted_ms"
    per = [(r, it[it_key]) for r, it in matched if it.get(it_key) is not None]
    out = 0
    for r, x in per:
        lo, hi = step_edges(r, which, f)
        out += x < lo * (1 - TOL) or x > hi * (1 + TOL)
    pt.update(single_steps=len(per), single_steps_out=out)
    pt["ok"] = v is not None and pt["steps_out"] == 0
    pt["tight"] = v is not None and pt["steps_loose"] == 0
    pt.update(naive(b, which, f))
    return pt


def job_bounds(folder: Path, ctx: Context) -> dict:
    """A job's bounds from its ranks': every figure the largest over the ranks (the job's
    step is no shorter than any rank's floor; its ceiling is taken as the largest rank's,
    since every rank's collectives hold the waits for the others)."""
    bs = [ctx.bounds(p) for p in tr.rank_files(folder)]
    keys = bs[0]["median"].keys()
    med = {k: max(b["median"][k] for b in bs) for k in keys}
    return {"file": str(folder), "rule": "job: largest over ranks", "steps": [],
            "steady": min(b["steady"] for b in bs), "median": med,
            "mean": {k: max(b["mean"][k] for b in bs) for k in keys},
            "gpu_bound": bnd.gpu_floor(med, True) >= BOUND_SHARE * med["T_ms"],
            "cpu_bound": med["C_max_ms"] >= BOUND_SHARE * med["T_ms"],
            "ranks": len(bs), "peers_in_trace": True}


def curve(ctx: Context, path: Path) -> dict:
    """Bounds and both curves of one trace."""
    b = job_bounds(path, ctx) if path.is_dir() else ctx.bounds(path)
    out: dict = {"bounds": {k: b.get(k, False) for k in ("rule", "steady", "median", "mean",
                                                      "gpu_bound", "cpu_bound",
                                                      "peers_in_trace")},
                 "points": [], "notes": []}
    try:
        base = ctx.predict(path)
    except Exception as e:
        out["notes"].append(f"baseline: {reason(e)}")
        base = None
    matched = match(b, base) if base is not None and b["steps"] else []
    out["matched_steps"] = len(matched)
    if base is not None:
        out["baseline"] = judge(b, matched, base, "gpu", 1.0, key="baseline_ms")
    for which in ("gpu", "cpu"):
        for f in FACTORS:
            try:
                d = ctx.predict(path, [spec(which, f)])
            except Exception as e:
                out["points"].append({"f": f, "which": which, "predicted_ms": None,
                                      "ok": False, "tight": False, "error": reason(e),
                                      **naive(b, which, f)})
                continue
            m = match(b, d) if b["steps"] else []
            out["points"].append(judge(b, m, d, which, f))
    return out


def _plot(label: str, c: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    for ax, which, name in ((axes[0], "gpu", "GPU work x f"), (axes[1], "cpu", "CPU work x f")):
        pts = sorted((p for p in c["points"] if p["which"] == which
                      and p.get("predicted_ms") is not None), key=lambda p: p["f"])
        if not pts:
            continue
        fs = [p["f"] for p in pts]
        ax.fill_between(fs, [p["lo_ms"] for p in pts], [p["hi_ms"] for p in pts],
                        color="tab:green", alpha=0.2, label="bounds")
        ax.plot(fs, [p["predicted_ms"] for p in pts], "o-", color="tab:blue",
                label="predicted")
        if all(p.get("amdahl_ms") is not None for p in pts):
            ax.plot(fs, [p["amdahl_ms"] for p in pts], "--", color="tab:orange",
                    label="clipped Amdahl")
        bad = [p for p in pts if not p["ok"]]
        ax.plot([p["f"] for p in bad], [p["predicted_ms"] for p in bad], "x", color="tab:red",
                ms=10, label="out of bounds")
        bl = c.get("baseline") or {}
        if bl.get("predicted_ms") is not None:
            ax.plot([1.0], [bl["predicted_ms"]], "s", color="gray", label="replay (f = 1)")
        ax.set_title(name)
        ax.set_xlabel("f")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("step ms")
    axes[0].legend(fontsize=7)
    fig.suptitle(label, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _cell(p: dict) -> str:
    if p.get("predicted_ms") is None:
        return f"{NA if 'error' not in p else 'failed: ' + p['error']} | | "
    mark = "ok" if p["ok"] else "**out**"
    if p["ok"] and not p["tight"]:
        mark = "**loose** (> +10% of the lower edge)"
    if p.get("single_steps"):
        mark += f"; single steps out {p['single_steps_out']}/{p['single_steps']}"
    return f"{p['predicted_ms']:.2f} | [{p['lo_ms']:.2f}, {p['hi_ms']:.2f}] | {mark}"


def _naive_cells(p: dict) -> str:
    """The formula's and "no change"'s points, marked as Daydream's are."""
    cells = []
    for k in ("amdahl", "no_change"):
        if p.get(f"{k}_ms") is None:
            cells.append(NA)
            continue
        mark = " **out**" if p[f"{k}_out"] else " **loose**" if p[f"{k}_loose"] else ""
        cells.append(f"{p[f'{k}_ms']:.2f}{mark}")
    return " | ".join(cells)


@section("response", "Response to the hardware (measure 2)", order=20)
def run(ctx: Context) -> Result:
    lines = [
        "## Response to the hardware (measure 2)", "",
        "Every GPU task (`" + spec("gpu", "f") + "`) and, apart, every CPU task (`"
        + spec("cpu", "f") + "`) scaled by f, each prediction read against bounds that "
        "`bench/bounds.py` computes from the raw trace file (not from Daydream's tables or "
        "graph; its docstring gives the rules): per steady step, T its length, G the time "
        "some GPU task runs (busiest device; G_all over all devices), C_max the busiest "
        "thread's own work (calls at their unblocked cost, no waits), C_sum every thread's "
        "own work plus its short gaps, W the time in which neither a GPU task runs nor any "
        "thread works, or a thread waits on what the trace does not show with the GPU busy "
        "under it, or the GPU idles with nothing traced ending it (work launched before the "
        "idle began, no GPU task ending inside it) even with a thread working under it "
        "(latencies, data-loader workers, peers; it scales with neither side, so it "
        "joins the upper edge: ACCURACY.md's f G + C is the case W = 0). "
        "GPU scaled by f: the step must lie in [max(f G_floor, C_max), f G_all_nc + "
        "(G_all - G_all_nc) + C_sum + W]; CPU scaled: in [max(G_floor, f C_max), G_all + f C_sum "
        "+ W], where collectives (NCCL/RCCL kernels: transfer and waiting for the slowest peer) "
        "stay whole on the upper edge (G_all_nc: without them), and the floor G_floor is the "
        "larger of the busiest stream and the busiest device's work without collectives (on a "
        "job, with every rank's trace, the waiting can end: only the latter). On a trace bound "
        "by the scaled "
        f"side (its figure, G_floor or C_max, >= {BOUND_SHARE:.0%} of T), while that side still "
        f"sets the lower edge (f G_floor at least C_serial, the time some thread works or runs "
        f"the Python "
        f"between its operators), the step must also be "
        f"within {TIGHT:.0%} of the lower edge (**loose** otherwise). The point judged is the "
        "prediction's headline, its steady-state step (completion to completion over the used "
        "iterations, docs/graph.md), against the edges of the mean steady step; each step timed "
        "alone by the CPU's markers is read against its own edges too, for information (in a "
        "short window a what-if lets the CPU run ahead of the GPU, or fall behind, for an "
        f"iteration or two before a new steady state); {TOL:.1%} tolerance for the two "
        "windows. Without Daydream a user would guess \"no change\" (T, the last column says "
        "whether T lies in the GPU-scaled bounds at f = 0.5) or a step proportional to f.", "",
        "| trace | steps (rule) | T ms | G ms (% of T) | G_stream ms | C_max ms | C_sum ms | "
        "W ms | bound by | GPU points out / loose | CPU points out / loose | "
        "no change in bounds at f=0.5 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    detail: list[str] = []
    data: dict = {"factors": list(FACTORS), "traces": {}, "failures": 0, "loose": 0,
                  "naive": {k: {"failures": 0, "loose": 0} for k in ("amdahl", "no_change")}}
    for label, path in tr.training():
        try:
            c = curve(ctx, path)
            row, more = _trace_rows(label, c, data)
        except Exception as e:  # one trace's failure is a row, not a lost section
            lines.append(f"| {label} | failed: {reason(e)} |" + " |" * 10)
            data["traces"][label] = {"error": reason(e)}
            continue
        lines.append(row)
        detail += more
    n = sum(2 * len(FACTORS) for t in data["traces"].values() if "points" in t)
    nv = data["naive"]
    lines += ["", f"Points out of bounds: **{data['failures']}**; in bounds but loose: "
              f"**{data['loose']}** (of {2 * len(FACTORS)} per trace, {n} in all).", "",
              "The same bounds and rules applied to two predictors without a model, on the "
              "same figures (the mean steady step's T, G and C_max): the clipped-Amdahl "
              "formula, GPU x f: max(T - (1 - f) G, C_max, f G), CPU x f: max(T - (1 - f) "
              "C_max, G, f C_max); and \"no change\" (T). These bounds are information, not a "
              "verdict: where the formula scores as well as Daydream they show nothing (the "
              "judge's bound cases are the sharp form).", "",
              "| predictor | points out | in bounds but loose | of |", "|---|---|---|---|",
              f"| Daydream | {data['failures']} | {data['loose']} | {n} |",
              f"| clipped Amdahl | {nv['amdahl']['failures']} | {nv['amdahl']['loose']} | "
              f"{n} |",
              f"| no change | {nv['no_change']['failures']} | {nv['no_change']['loose']} | "
              f"{n} |", ""]
    return Result(lines + detail, data)


def _trace_rows(label: str, c: dict, data: dict) -> tuple[str, list[str]]:
    """The summary row and the curve table of one trace; its counts added to ``data``."""
    detail: list[str] = []
    m = c["bounds"]["median"]
    bound = ("GPU" if c["bounds"]["gpu_bound"] else
             "CPU" if c["bounds"]["cpu_bound"] else "neither")
    cnt = {w: (sum(not p["ok"] for p in c["points"] if p["which"] == w),
               sum(p["ok"] and not p["tight"] for p in c["points"] if p["which"] == w))
           for w in ("gpu", "cpu")}
    data["failures"] += cnt["gpu"][0] + cnt["cpu"][0]
    data["loose"] += cnt["gpu"][1] + cnt["cpu"][1]
    for k in ("amdahl", "no_change"):
        data["naive"][k]["failures"] += sum(p.get(f"{k}_out", 0) for p in c["points"])
        data["naive"][k]["loose"] += sum(p.get(f"{k}_loose", 0) for p in c["points"])
    lo, hi = bnd.edges(c["bounds"], "gpu", 0.5)
    nochange = "yes" if lo <= m["T_ms"] <= hi else "no"
    row = (
        f"| {label} | {c['bounds']['steady']} ({c['bounds']['rule']}) | {m['T_ms']:.2f} | "
        f"{m['G_ms']:.2f} ({100 * m['G_ms'] / m['T_ms']:.1f}%) | {m['G_stream_ms']:.2f} | "
        f"{m['C_max_ms']:.2f} | {m['C_sum_ms']:.2f} | {m['W_ms']:.2f} | {bound} | "
        f"{cnt['gpu'][0]} / {cnt['gpu'][1]} of {len(FACTORS)} | "
        f"{cnt['cpu'][0]} / {cnt['cpu'][1]} of {len(FACTORS)} | {nochange} |")
    png = PLOTS / f"response_{tr.slug(label)}.png"
    try:
        _plot(label, c, png)
        pic = f" ([curve]({png.relative_to(ROOT / 'docs').as_posix()}))"
    except Exception as e:  # a plot is a convenience, never a reason to lose the table
        pic = f" (no plot: {reason(e)})"
    detail += [f"### {label}{pic}", ""]
    if c.get("baseline", {}).get("predicted_ms") is not None:
        bl = c["baseline"]
        detail.append(f"Baseline replay {bl['predicted_ms']:.2f} ms (f = 1, judged by "
                      f"{bl['by']} over {bl['steps']} steady steps matched of "
                      f"{c['bounds']['steady']}).")
        detail.append("")
    detail += ["| f | GPU x f: predicted ms | bounds ms | | clipped Amdahl | no change | "
               "CPU x f: predicted ms | bounds ms | | clipped Amdahl | no change |",
               "|---|---|---|---|---|---|---|---|---|---|---|"]
    by = {(p["which"], p["f"]): p for p in c["points"]}
    for f in FACTORS:
        detail.append(f"| {f} | {_cell(by[('gpu', f)])} | {_naive_cells(by[('gpu', f)])} | "
                      f"{_cell(by[('cpu', f)])} | {_naive_cells(by[('cpu', f)])} |")
    detail += [f"- {n}" for n in c["notes"]]
    detail.append("")
    data["traces"][label] = c
    return row, detail
