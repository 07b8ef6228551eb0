"""``daydream advise TRACE``: what to try first.

Two answers from one replay. Where the iteration's time goes: the critical path's parts (a
task's own work or an edge's delay, which add up to the span) grouped into what a user can act
on, with the data-loading phase taken out of the CPU work it ran as, and the slack the graph
could not explain; the verdict (GPU-, CPU-, data- or communication-bound) from those parts,
beside the GPU's utilization in the replay (a GPU busy nearly all the time is GPU-bound
whatever the path says). Then every registered optimization, predicted with its default
parameters through the one prediction path (``daydream.pipeline``): those a user can apply
and that change the step ranked by speedup, each with the step its speedup divides (its
reference) and its interval; the what-ifs of another scale or machine (``world``, ``ddp``,
...) beside them, unranked; ``no_profiler`` shown as what it is, the profiler's own cost in
this trace; and those that do not apply (an error, parameters needed, or a prediction that
changes nothing) listed with why.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

from daydream import gates, pipeline
from daydream.base.errors import DaydreamError
from daydream.report import (
    emit,
    interval,
    ms,
    plural,
    print_tables,
    say,
    times,
)
from daydream.text_table import Column, Table, to_csv
from daydream.traces import open_store

if TYPE_CHECKING:
    from daydream.graphstore.prediction import PredictionResult

# What each critical-path part counts as (graphstore.schema: task kinds, and "delay: EDGE
# KIND" for the wait an edge imposed).
CATEGORY = {
    "kernel": "GPU work", "memcpy": "GPU work", "memset": "GPU work",
    "comm": "waiting on communication", "delay: rank": "waiting on communication",
    "api": "launch overhead", "delay: launch": "launch overhead",
    "delay: queue": "launch overhead",
    "host": "CPU work",
}
OTHER_DELAY = "other waits (sync, stream, wake)"
ORDER = ("GPU work", "CPU work", "data loading", "launch overhead",
         "waiting on communication", OTHER_DELAY, "not on the path")
# The verdict each part points to: GPU-, CPU-, data- or communication-bound (launch overhead
# is CPU time; the other waits and what is off the path point nowhere)
BOUND = {"GPU work": "GPU-bound", "CPU work": "CPU-bound", "launch overhead": "CPU-bound",
         "data loading": "data-bound", "waiting on communication": "communication-bound"}
# A GPU busy this share of the replay is GPU-bound, whatever the critical path's parts say
GPU_BOUND_UTILIZATION = 0.9
# What-ifs of another scale or machine: not an optimization of this job, shown unranked
SCALE = ("world", "ddp", "bandwidth", "gpu", "batch")
# The profiler's own cost: shown as that, not as an optimization to try
PROFILER = "no_profiler"


def gpu_utilization(d: PredictionResult, phases: dict | None = None) -> dict | None:
    """How busy the GPU was in the replay: a trace's busiest GPU stream's share of the
    simulated span (its unit table), a job's GPU busy time per rank and iteration over the
    step (PHASES or D's baseline phases)."""
    units = (d.trace.unit_load if d.trace is not None else None) or []
    gpus = [u for u in units if str(u["unit"]).startswith("gpu")]
    if gpus:
        u = max(gpus, key=lambda u: u["busy_share"])
        return {"share": u["busy_share"], "unit": u["unit"],
                "basis": f"{u['unit']}, the busiest GPU stream, over the replay"}
    base = (d.phases.as_dict()["baseline"] if d.phases is not None else None) or phases
    if base and d.baseline_ms:
        gpu = sum(v["gpu_ms"] for v in base.values())
        return {"share": gpu / d.baseline_ms, "unit": None,
                "basis": "GPU busy time per rank and iteration over the step"}
    return None


def verdict(where: list[dict], util: dict | None) -> tuple[str, str]:
    """(GPU-, CPU-, data- or communication-bound, why) from the parts WHERE the time goes
    and the GPU's utilization UTIL."""
    by: dict[str, float] = {}
    for r in where:
        b = BOUND.get(r["category"])
        if b:
            by[b] = by.get(b, 0.0) + (r["share"] or 0.0)
    busy = f"; the GPU is busy {100 * util['share']:.1f}% ({util['basis']})" if util else ""
    if util and util["share"] >= GPU_BOUND_UTILIZATION:
        return "GPU-bound", f"the GPU is busy {100 * util['share']:.1f}% ({util['basis']})"
    if not by:
        return "undecided", "no part of the iteration points to a bound" + busy
    top = max(by, key=lambda k: by[k])
    parts = " and ".join(c for c in ORDER if BOUND.get(c) == top and
                         any(r["category"] == c for r in where))
    return top, f"{parts} {100 * by[top]:.1f}% of the time{busy}"


def where_time_goes(d: PredictionResult, phases: dict | None = None
                    ) -> tuple[list[dict], str]:
    """The iteration's time by category (ms and share of the span), and what it rests on.

    From the replay's critical path where it has one: its parts by kind, and the
    data-loading phase's part taken out of the CPU work (then the GPU work) it ran as. A job
    has none: its ranks' busy time per phase (D's baseline phases, else PHASES:
    ``pipeline.phase_ms``), and the time ranks waited in collectives."""
    cp = (d.trace.critical_path if d.trace is not None else None) or {}
    out: dict[str, float] = {}
    if cp and cp.get("span_ns"):
        span = cp["span_ns"] / 1e6
        for r in cp.get("by_kind") or []:
            cat = CATEGORY.get(r["kind"], OTHER_DELAY if r["kind"].startswith("delay")
                               else "GPU work")
            out[cat] = out.get(cat, 0.0) + r["ns"] / 1e6
        dl = sum(r["ns"] for r in cp.get("by_phase") or []
                 if r["phase"] == "data_loading") / 1e6
        for cat in ("CPU work", "GPU work"):
            take = min(dl, out.get(cat, 0.0))
            if take > 0:
                out[cat] -= take
                out["data loading"] = out.get("data loading", 0.0) + take
                dl -= take
        rest = span - sum(out.values())
        if rest > 1e-6:
            out["not on the path"] = rest
        basis = (f"the critical path of iteration {cp['iteration']} of the replay "
                 f"({ms(span)} ms)")
    else:
        span = d.baseline_ms
        base = (d.phases.as_dict()["baseline"] if d.phases is not None else None) \
            or phases or {}
        for ph, v in base.items():
            if ph == "data_loading":
                out["data loading"] = out.get("data loading", 0.0) + v["gpu_ms"] + v["cpu_ms"]
            else:
                out["GPU work"] = out.get("GPU work", 0.0) + v["gpu_ms"]
                out["CPU work"] = out.get("CPU work", 0.0) + v["cpu_ms"]
        c = (d.job.collectives if d.job is not None else None) or {}
        used = max(d.used_iterations, 1)
        if c.get("waiting_ms"):
            out["waiting on communication"] = c["waiting_ms"] / used / max(
                (d.job.world_size if d.job is not None else None) or 1, 1)
        basis = ("the ranks' busy time per phase and the time they waited in collectives, "
                 "per rank and iteration (a job's replay has no single critical path)")
    rows = [{"category": k, "ms": out[k], "share": out[k] / span if span else None}
            for k in ORDER if out.get(k, 0.0) > 5e-4]
    return rows, basis


def candidates() -> tuple[list[str], list[dict]]:
    """The specs advise tries (every registered optimization with its defaults), and those
    it cannot try without parameters."""
    from daydream.transforms import list_opts
    specs, skipped = [], []
    for o in list_opts():
        need = [p["name"] for p in o["params"] if p["default"] is None
                and _required(o["name"], p["name"])]
        if need:
            skipped.append({"spec": o["signature"], "reason": "needs parameters: " +
                            ", ".join(need)})
        else:
            specs.append(o["name"])
    return specs, skipped


def _required(name: str, param: str) -> bool:
    from daydream.transforms.registry import opts
    o = opts()[name]
    p = next(p for p in o.params if p.name == param)
    return p.default is inspect.Parameter.empty


def advise(target: str, store=None, *, param_bytes: int | None = None,
           specs: list[str] | None = None,
           on_plan: Callable[..., None] | None = None,
           on_step: Callable[..., None] | None = None) -> dict:
    """Where TARGET's iteration time goes, and every optimization (SPECS: default, all
    registered) predicted: ranked by speedup where a user can apply it and it changes the
    step, the what-ifs of another scale or machine unranked, the profiler's own cost, and
    what does not apply with why. ``on_plan(steps, first)`` is told how many steps there are
    (the replay, then each spec), ``on_step(next)`` when one is done (a progress bar:
    ``report.fleet_progress``)."""
    tried, skipped = candidates() if specs is None else (specs, [])
    if on_plan is not None:
        on_plan(1 + len(tried), "replaying the trace")
    st = open_store(store)
    s = pipeline.resolve(target, st)
    base = pipeline.predict(s, None)
    d = base.result
    # a job: the phase breakdown of its ranks
    phases = (pipeline.phase_ms(s.tables, base.base, len(s.job.members))
              if s.job is not None else None)
    del base  # its graphs and schedules: each prediction below holds its own
    where, basis = where_time_goes(d, phases)
    util = gpu_utilization(d, phases)
    bound, why = verdict(where, util)
    ranked, what_ifs, not_applicable = [], [], list(skipped)
    profiler = None
    for spec in tried:
        if on_step is not None:
            on_step(f"predicting {spec}")
        try:
            r = pipeline.predict(s, spec, param_bytes=param_bytes).result
        except DaydreamError as e:
            not_applicable.append({"spec": spec, "reason": str(e)})
            continue
        row = {"spec": spec, "reference": "replay without profiler"
               if r.reference_ms != r.baseline_ms else "replay",
               "reference_ms": r.reference_ms, "predicted_ms": r.predicted_ms,
               "predicted_interval_ms": _pair(r.predicted_interval_ms),
               "speedup": r.speedup, "speedup_interval": _pair(r.speedup_interval),
               "gates": [g.as_dict() for g in r.gates], "notes": list(r.notes)}
        if spec == PROFILER:
            profiler = {"cost_ms": r.baseline_ms - r.predicted_ms,
                        "share": 1 - r.predicted_ms / r.baseline_ms if r.baseline_ms else None,
                        "without_ms": r.predicted_ms, "baseline_ms": r.baseline_ms,
                        "notes": list(r.notes)}
            continue
        unchanged = _unchanged(spec, r)
        if unchanged:
            not_applicable.append({"spec": spec, "reason": unchanged})
        elif spec.split("(")[0] in SCALE:
            what_ifs.append(row)
        else:
            ranked.append(row)
    if on_step is not None:
        on_step()
    ranked.sort(key=lambda r: -(r["speedup"] or 0.0))
    return {"trace_id": d.trace_id, "file": d.file,
            "job": d.job.name if d.job is not None else None,
            "measured_ms": d.measured_ms, "baseline_ms": d.baseline_ms,
            "bound": bound, "bound_why": why,
            "gpu_utilization": util["share"] if util else None,
            "where": where, "where_basis": basis,
            "slack": (d.trace.slack_ms if d.trace is not None else None) or {},
            "explained_ms": d.explained_ms, "profiler": profiler, "predictions": ranked,
            "what_ifs": what_ifs, "not_applicable": not_applicable}


def _unchanged(spec: str, r: PredictionResult) -> str | None:
    """Why SPEC does not apply where its prediction R changes nothing (the step within
    ``gates.SAME_TOL`` of its reference): its note that says so; None where it changes the
    step."""
    if not (r.reference_ms and r.predicted_ms) or abs(
            r.predicted_ms - r.reference_ms) > gates.SAME_TOL * r.reference_ms:
        return None
    names = gates.spec_names(spec)
    said = [n for n in r.notes if ("unchanged" in n or "does not apply" in n)
            and any(n.startswith(f"{x}:") for x in names)]
    return ("; ".join(said) if said else
            f"{spec}: changes nothing in this trace (predicted {ms(r.predicted_ms)} ms, "
            f"its reference {ms(r.reference_ms)} ms)")


def _pair(iv: tuple[float, float] | None) -> list[float] | None:
    return None if iv is None else list(iv)


def _gates(g: list[dict] | None) -> str:
    if not g:
        return ""
    bad = gates.failed(g)
    return f"{len(g) - len(bad)} of {len(g)} ok" + (f" (failed: {', '.join(bad)})" if bad else "")


def _ranked_table(title: str, rows: list[dict], numbered: bool) -> Table:
    cols = ([Column("rank", "right")] if numbered else []) + [
        Column("optimization", key="spec"), Column("reference"),
        Column("reference ms", "right"), Column("predicted ms", "right"),
        Column("interval ms", "right"), Column("speedup", "right"),
        Column("speedup interval", "right")]
    gated = any(r["gates"] for r in rows)
    if gated:
        cols.append(Column("gates"))
    t = Table(title, cols)
    for k, r in enumerate(rows, 1):
        t.add(*([k] if numbered else []), r["spec"], r["reference"], ms(r["reference_ms"]),
              ms(r["predicted_ms"]), interval(r["predicted_interval_ms"]),
              times(r["speedup"]), interval(r["speedup_interval"], times),
              *([_gates(r["gates"])] if gated else []))
    t.records = [{**({"rank": k} if numbered else {}), "spec": r["spec"],
                  "reference": r["reference"], "reference_ms": r["reference_ms"],
                  "predicted_ms": r["predicted_ms"], "speedup": r["speedup"],
                  "gates": _gates(r["gates"])} for k, r in enumerate(rows, 1)]
    return t


def tables(a: dict) -> list[Table]:
    """Where the time goes, the ranked optimizations, the what-ifs of another scale or
    machine, and what does not apply."""
    w = Table(f"Where the time goes: {a['bound']} ({a.get('bound_why') or ''}; from "
              f"{a['where_basis']})",
              [Column("category"), Column("ms", "right"), Column("share", "right")])
    for r in a["where"]:
        w.add(r["category"], ms(r["ms"]), "" if r["share"] is None else
              f"{100 * r['share']:.1f}%")
    w.records = a["where"]
    p = _ranked_table("What to try first: every optimization that applies and changes the "
                      "step, by predicted speedup (speedup: reference ms / predicted ms; "
                      "interval: slack at zero to slack kept)", a["predictions"], True)
    s = _ranked_table("Another scale or machine (what-ifs, not ranked)",
                      a.get("what_ifs") or [], False)
    n = Table("What does not apply, and why", [Column("optimization", key="spec"),
                                               Column("reason")])
    for r in a["not_applicable"]:
        n.add(r["spec"], r["reason"])
    return [w, p, s, n]


def profiler_line(a: dict) -> str | None:
    """The profiler's own cost in this trace (``no_profiler``), in a sentence."""
    p = a.get("profiler")
    if not p:
        return None
    return (f"the profiler itself: {ms(p['cost_ms'])} ms per iteration "
            f"({100 * (p['share'] or 0):.1f}% of the replayed step) is the profiler's own cost "
            f"in this trace, not something to optimize: the job without it replays at "
            f"{ms(p['without_ms'])} ms; speedups against the 'replay without profiler' "
            "divide that")


def print_advice(a: dict) -> None:
    head = f"job {a['job']}" if a.get("job") else f"trace {a['trace_id']}"
    say(f"{head}: {a['file']}" if a.get("file") else head)
    say(f"steady-state step {ms(a['measured_ms'])} ms measured, {ms(a['baseline_ms'])} ms "
        "replayed")
    emit()
    w, p, s, n = tables(a)
    print_tables([w])
    slack = sum((a.get("slack") or {}).values())
    if slack and a["baseline_ms"] and slack > 0.1 * a["baseline_ms"]:
        say(f"note: the graph leaves {ms(slack, 2)} ms per iteration unexplained (slack, "
            "summed over edges: " + ", ".join(f"{k} {ms(v, 2)} ms" for k, v in sorted(
                a["slack"].items(), key=lambda kv: -kv[1])[:3]) + "); each prediction's "
            "interval shows how much that matters")
        emit()
    line = profiler_line(a)
    if line:
        say(line)
        emit()
    print_tables([p, s if s.rows else None, n])
    say(f"{plural(len(a['predictions']), 'optimization')} ranked, "
        f"{len(a.get('what_ifs') or [])} what-ifs of another scale or machine, "
        f"{len(a['not_applicable'])} not applicable; chain the best with + (daydream predict "
        "TRACE --opt 'a+b') to see them together")


def to_csv_text(a: dict) -> str:
    def pred(status: str, k, r: dict) -> dict:
        iv = r["predicted_interval_ms"] or [None, None]
        return {"status": status, "rank": k, "spec": r["spec"], "reference": r["reference"],
                "reference_ms": r["reference_ms"], "predicted_ms": r["predicted_ms"],
                "speedup": r["speedup"], "predicted_low_ms": iv[0],
                "predicted_high_ms": iv[1], "gates": _gates(r["gates"]), "reason": ""}
    empty = dict.fromkeys(("rank", "reference", "reference_ms", "predicted_ms", "speedup",
                           "predicted_low_ms", "predicted_high_ms", "gates"), "")
    rows = [pred("predicted", k, r) for k, r in enumerate(a["predictions"], 1)]
    rows += [pred("what-if", "", r) for r in a.get("what_ifs") or []]
    p = a.get("profiler")
    if p:
        rows.append({"status": "profiler cost", **empty, "spec": PROFILER,
                     "reference": "replay", "reference_ms": p["baseline_ms"],
                     "predicted_ms": p["without_ms"],
                     "reason": f"the profiler's own cost: {ms(p['cost_ms'])} ms per iteration"})
    rows += [{"status": "not applicable", **empty, "spec": r["spec"], "reason": r["reason"]}
             for r in a["not_applicable"]]
    t = Table("", [Column(k) for k in rows[0]] if rows else [Column("spec")])
    t.records = rows
    return to_csv([t])
