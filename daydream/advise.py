"""``daydream advise TRACE``: what to try first.

Two answers from one replay. Where the iteration's time goes: the critical path's parts (a
task's own work or an edge's delay, which add up to the span) grouped into what a user can act
on, with the data-loading phase taken out of the CPU work it ran as; and the slack the graph
could not explain. Then every registered optimization, predicted with its default
parameters through the one prediction path (``daydream.pipeline``) and ranked by speedup, with
its interval and, where the pipeline reports them, its gates; those that do not apply to the
trace are listed with the error each raised.
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
VERDICT = {"GPU work": "GPU-bound", "CPU work": "CPU-bound", "data loading":
           "bound by data loading", "launch overhead": "bound by launch overhead",
           "waiting on communication": "waiting on communication",
           OTHER_DELAY: "bound by waits", "not on the path": "undecided"}


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
    registered) predicted and ranked by speedup, or listed with why it does not apply.
    ``on_plan(steps, first)`` is told how many steps there are (the replay, then each spec),
    ``on_step(next)`` when one is done (a progress bar: ``report.fleet_progress``)."""
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
    ranked, not_applicable = [], list(skipped)
    for spec in tried:
        if on_step is not None:
            on_step(f"predicting {spec}")
        try:
            r = pipeline.predict(s, spec, param_bytes=param_bytes).result
        except DaydreamError as e:
            not_applicable.append({"spec": spec, "reason": str(e)})
            continue
        ranked.append({"spec": spec, "predicted_ms": r.predicted_ms,
                       "predicted_interval_ms": _pair(r.predicted_interval_ms),
                       "speedup": r.speedup, "speedup_interval": _pair(r.speedup_interval),
                       "gates": [g.as_dict() for g in r.gates], "notes": list(r.notes)})
    if on_step is not None:
        on_step()
    ranked.sort(key=lambda r: -(r["speedup"] or 0.0))
    top = max(where, key=lambda r: r["ms"])["category"] if where else None
    return {"trace_id": d.trace_id, "file": d.file,
            "job": d.job.name if d.job is not None else None,
            "measured_ms": d.measured_ms, "baseline_ms": d.baseline_ms,
            "bound": VERDICT.get(top, "undecided") if top else "undecided",
            "where": where, "where_basis": basis,
            "slack": (d.trace.slack_ms if d.trace is not None else None) or {},
            "explained_ms": d.explained_ms, "predictions": ranked,
            "not_applicable": not_applicable}


def _pair(iv: tuple[float, float] | None) -> list[float] | None:
    return None if iv is None else list(iv)


def _gates(g: list[dict] | None) -> str:
    if not g:
        return ""
    bad = gates.failed(g)
    return f"{len(g) - len(bad)} of {len(g)} ok" + (f" (failed: {', '.join(bad)})" if bad else "")


def tables(a: dict) -> list[Table]:
    w = Table(f"Where the time goes: {a['bound']} (from {a['where_basis']})",
              [Column("category"), Column("ms", "right"), Column("share", "right")])
    for r in a["where"]:
        w.add(r["category"], ms(r["ms"]), "" if r["share"] is None else
              f"{100 * r['share']:.1f}%")
    w.records = a["where"]
    p = Table("What to try first: every optimization that applies, by predicted speedup "
              "(interval: slack at zero to slack kept)",
              [Column("rank", "right"), Column("optimization", key="spec"),
               Column("predicted ms", "right"), Column("interval ms", "right"),
               Column("speedup", "right"), Column("speedup interval", "right")] +
              ([Column("gates")] if any(r["gates"] for r in a["predictions"]) else []))
    for k, r in enumerate(a["predictions"], 1):
        p.add(k, r["spec"], ms(r["predicted_ms"]), interval(r["predicted_interval_ms"]),
              times(r["speedup"]), interval(r["speedup_interval"], times),
              *([_gates(r["gates"])] if len(p.columns) > 6 else []))
    p.records = [{"rank": k, "spec": r["spec"], "predicted_ms": r["predicted_ms"],
                  "speedup": r["speedup"], "gates": _gates(r["gates"])}
                 for k, r in enumerate(a["predictions"], 1)]
    n = Table("What does not apply, and why", [Column("optimization", key="spec"),
                                               Column("reason")])
    for r in a["not_applicable"]:
        n.add(r["spec"], r["reason"])
    return [w, p, n]


def print_advice(a: dict) -> None:
    head = f"job {a['job']}" if a.get("job") else f"trace {a['trace_id']}"
    say(f"{head}: {a['file']}" if a.get("file") else head)
    say(f"steady-state step {ms(a['measured_ms'])} ms measured, {ms(a['baseline_ms'])} ms "
        "replayed")
    emit()
    w, p, n = tables(a)
    print_tables([w])
    slack = sum((a.get("slack") or {}).values())
    if slack and a["baseline_ms"] and slack > 0.1 * a["baseline_ms"]:
        say(f"note: the graph leaves {ms(slack, 2)} ms per iteration unexplained (slack, "
            "summed over edges: " + ", ".join(f"{k} {ms(v, 2)} ms" for k, v in sorted(
                a["slack"].items(), key=lambda kv: -kv[1])[:3]) + "); each prediction's "
            "interval shows how much that matters")
        emit()
    print_tables([p, n])
    say(f"{plural(len(a['predictions']), 'optimization')} predicted, "
        f"{len(a['not_applicable'])} not applicable; chain the best with + (daydream predict "
        "TRACE --opt 'a+b') to see them together")


def to_csv_text(a: dict) -> str:
    rows = [{"status": "predicted", "rank": k, **{x: r[x] for x in ("spec", "predicted_ms",
                                                                    "speedup")},
             "predicted_low_ms": (r["predicted_interval_ms"] or [None, None])[0],
             "predicted_high_ms": (r["predicted_interval_ms"] or [None, None])[1],
             "gates": _gates(r["gates"]), "reason": ""}
            for k, r in enumerate(a["predictions"], 1)]
    rows += [{"status": "not applicable", "rank": "", "spec": r["spec"], "predicted_ms": "",
              "speedup": "", "predicted_low_ms": "", "predicted_high_ms": "", "gates": "",
              "reason": r["reason"]} for r in a["not_applicable"]]
    t = Table("", [Column(k) for k in rows[0]] if rows else [Column("spec")])
    t.records = rows
    return to_csv([t])
