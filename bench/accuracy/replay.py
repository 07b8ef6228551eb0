"""Measure 1, explained replay: how much of the timeline the graph's structure explains (the
replay with slack at zero against the measured iterations), beside the exact replay's error as
a regression figure and the spread of the trace's own steps as the figure without Daydream."""

from __future__ import annotations

import statistics

from bench.accuracy import NA, ROOT, Context, Result, reason, section
from bench.accuracy import traces as tr


def _err(p: float | None, m: float | None) -> float | None:
    return None if p is None or not m else 100.0 * (p - m) / m


def _pct(x: float | None, sign: bool = False) -> str:
    if x is None:
        return NA
    return f"{x:+.2f}%" if sign else f"{x:.2f}%"


def errors(d: dict, key: str) -> list[float]:
    """|key - measured| / measured per used iteration (and per rank of a job) in %."""
    its = [i for i in d.get("iterations") or [] if i.get("used")]
    out = [abs(e) for i in its if (e := _err(i.get(key), i.get("measured_ms"))) is not None]
    if d.get("job") and len({r.get("trace_id") for r in d.get("ranks", [])}) > 1:
        out += [abs(e) for r in d["ranks"]
                if (e := _err(r.get(key), r.get("measured_ms"))) is not None]
    return out


def spread(d: dict) -> float | None:
    """Mean |step - median step| / median step over the used iterations, %: the error of
    predicting every step as the typical one, i.e. what a user has without a model."""
    ms = [i["measured_ms"] for i in d.get("iterations") or [] if i.get("used")]
    if len(ms) < 2:
        return None
    med = statistics.median(ms)
    return 100.0 * statistics.fmean(abs(m - med) for m in ms) / med


def explained(d: dict, key: str = "explained_ms") -> tuple[float | None, float | None, str]:
    """(mean, worst) |explained - measured| %, and how they were read. ``key``
    ``explained_no_inferred_ms``: the same replay without the edges inferred from
    coincidence (ACCURACY.md asks for both)."""
    per = errors(d, key)
    if per:
        return statistics.fmean(per), max(per), "per iteration"
    if d.get(key) is not None:
        e = abs(_err(d[key], d.get("measured_ms")) or 0.0)
        return e, e, "headline only"
    return None, None, "absent"


# The slack a trace cannot explain on the GPU side: GPU tasks starting later than their stream
# and launch allow (unexplained GPU idle, a stream's later start) and GPU work hanging off the
# trace start (launched before the window). The explained replay with it kept says whether
# the rest of the timeline is explained (TorchRec, whose CUDA graphs' nodes sit 6-64 ms apart
# on an idle GPU with nothing in the trace ending the wait).
GPU_SIDE_SLACK = frozenset({"stream", "launch", "origin"})


def structure(ctx: Context, path) -> tuple[float | None, float | None, bool | None]:
    """From the graph itself: the mean |replay - measured| % over the used iterations with
    GPU_SIDE_SLACK kept and every other slack at zero; and the critical path of every used
    iteration of the exact replay: its worst |span - the iteration's replayed time| %, and
    whether its parts (work and delays) add up to its span every time (issue 14). None where
    the trace is a job or cannot be read."""
    try:
        from daydream import pipeline
        from daydream.api import open_store
        s = pipeline.resolve(str(path), open_store(ctx.store))
        if s.job is not None:
            return None, None, None
        r = s.baseline(GPU_SIDE_SLACK, True)
        per = [abs(e) for i in r.iterations if i.used
               if (e := _err(i.simulated_ns / 1e6, i.measured_ns / 1e6)) is not None]
        exact = s.baseline()
        worst, adds = 0.0, True
        for i in exact.iterations:
            if not i.used or not i.simulated_ns:
                continue
            cp = exact.critical_path_of(s.tables, i.index)
            worst = max(worst, abs(100.0 * (cp["span_ns"] - i.simulated_ns) / i.simulated_ns))
            adds &= cp["covered_ns"] == cp["span_ns"] == cp["work_ns"] + cp["delay_ns"]
        return (statistics.fmean(per) if per else None), worst, adds
    except Exception:
        return None, None, None


def shares(ctx: Context, d: dict) -> tuple[float | None, float | None]:
    """Share of GPU time on a layer and on a phase (graphstore's mapped_share)."""
    try:
        from daydream.graphstore.labels import mapped_share
        from daydream.graphstore.read import read_graph
        tid = d["ranks"][0]["trace_id"] if d.get("ranks") else d["trace_id"]
        s = mapped_share(read_graph(ctx.store, tid)["task"])
        return s["layer_share"], s["phase_share"]
    except Exception:
        return None, None


@section("replay", "Explained replay (measure 1)", order=10)
def run(ctx: Context) -> Result:
    lines = [
        "## Explained replay (measure 1)", "",
        "The graph replayed with slack at zero (every lag its physical constant, every call "
        "that waited at its own cost, idle threads woken by their edges: ACCURACY.md, 1) "
        "against the measured iterations; read from `explained_ms` per iteration of "
        "`daydream.api.predict` (\"" + NA + "\" where the api does not give it), and "
        "without the edges inferred from coincidence (`explained_no_inferred_ms`). Error = "
        "|explained - measured| / measured over the iterations the api uses (and the ranks "
        "of a job); and with only the slack the trace cannot explain on the GPU side kept "
        "(the stream, launch and origin edges' slack: GPU work starting later than its stream "
        "and its launch allow, work launched before the window). Beside it: the exact "
        "replay's error (slack kept), a regression figure that must stay 0.00%; the "
        "critical path of every used iteration of that replay (its worst distance from the "
        "iteration's time, and whether its parts add up to its span every time); and the spread "
        "of the trace's own steps (mean |step - median| "
        "/ median), the error of calling every step the typical one without a model.", "",
        "| trace | iterations (used) | measured ms median (mean) | spread of its steps | "
        "explained: mean error | worst | without inferred edges: mean | worst | "
        "GPU-side slack kept: mean | "
        "exact replay: mean error | worst | critical path: worst off its iteration | "
        "parts add up | GPU time on a layer | on a phase |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    data: dict = {"traces": {}}
    slack_rows: list[str] = []
    inferred_rows: list[str] = []
    for label, path in tr.training():
        try:
            d = ctx.predict(path)
        except Exception as e:
            lines.append(f"| {label} | failed: {reason(e)} |" + " |" * 13)
            data["traces"][label] = {"error": reason(e)}
            continue
        its = d.get("iterations") or []
        used = [i for i in its if i.get("used")]
        med = statistics.median(i["measured_ms"] for i in used) if used else None
        exact = errors(d, "baseline_ms")
        em, ew, how = explained(d)
        nm, nw, _ = explained(d, "explained_no_inferred_ms")
        sp = spread(d)
        gk, cp_worst, cp_adds = structure(ctx, path)
        ls, ps = shares(ctx, d)
        data["traces"][label] = {
            "iterations": len(its), "used": len(used), "measured_ms": d.get("measured_ms"),
            "measured_median_ms": med, "spread_pct": sp,
            "explained_mean_pct": em, "explained_worst_pct": ew, "explained_from": how,
            "no_inferred_mean_pct": nm, "no_inferred_worst_pct": nw,
            "gpu_side_kept_mean_pct": gk, "critical_path_worst_pct": cp_worst,
            "critical_path_adds_up": cp_adds,
            "exact_mean_pct": statistics.fmean(exact) if exact else None,
            "exact_worst_pct": max(exact, default=None),
            "layer_share": ls, "phase_share": ps,
            "slack": d.get("slack"), "inferred_edges": d.get("inferred_edges")}
        t = data["traces"][label]
        lines.append(
            f"| {label} | {len(its)} ({len(used)}) | "
            f"{'n/a' if med is None else format(med, '.3f')} ({d.get('measured_ms', 0):.3f}) | "
            f"{_pct(sp)} | {_pct(em)} | {_pct(ew)} | {_pct(nm)} | {_pct(nw)} | {_pct(gk)} | "
            f"{_pct(t['exact_mean_pct'])} | "
            f"{_pct(t['exact_worst_pct'])} | {_pct(cp_worst)} | "
            f"{NA if cp_adds is None else ('yes' if cp_adds else '**no**')} | "
            f"{'n/a' if ls is None else format(100 * ls, '.1f') + '%'} | "
            f"{'n/a' if ps is None else format(100 * ps, '.1f') + '%'} |")
        if isinstance(d.get("slack"), dict):
            slack_rows.append(f"| {label} | " + ", ".join(
                f"{k} {float(v):.2f}" for k, v in sorted(d["slack"].items())) + " |")
        if isinstance(d.get("inferred_edges"), dict):
            inferred_rows.append(f"| {label} | " + ", ".join(
                f"{k} {v}" for k, v in sorted(d["inferred_edges"].items())) + " |")
    lines.append("")
    lines += ["### Slack per iteration (ms, by kind)", ""]
    lines += (["| trace | slack |", "|---|---|"] + slack_rows if slack_rows else
              [f"{NA}: the api's predict result has no `slack` field."])
    lines += ["", "### Edges inferred from coincidence (counts by kind)", ""]
    lines += (["| trace | inferred edges |", "|---|---|"] + inferred_rows if inferred_rows
              else [f"{NA}: the api's predict result has no `inferred_edges` field."])
    lines += ["", "### The evidence of each inferred kind, on the calibration traces", "",
              "What each kind is inferred from, and the share of its instances that the raw "
              "trace confirms by a record of its own, on the calibration traces of "
              "bench/manifest.py (bench/edge_evidence.py; never a judged trace): \"no "
              "record\" where the trace holds nothing that could decide it. The explained "
              "replay above is reported with these edges and without them (`without inferred "
              "edges`).", ""]
    try:
        from bench import edge_evidence
        ev = edge_evidence.evidence(EVIDENCE_STORE)
        lines += edge_evidence.lines(ev)
        data["inferred_evidence"] = ev
    except Exception as e:
        lines.append(f"The check failed: {reason(e)}")
    return Result(lines + [""], data)


# the store of the calibration traces (bench/calibrate_latency.py's), apart from the harness's
EVIDENCE_STORE = ROOT / ".daydream-calibration"
