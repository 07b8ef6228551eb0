"""Measure 4, component checks: where a pair cannot be compared end to end, the part the
optimization changes, predicted against measured. Checks register with ``@check``; a module of
another issue (AMP phases, collective time, kernel classes per batch size) adds its own."""

from __future__ import annotations

from collections.abc import Callable

from bench.accuracy import Context, Result, section

# name -> fn(ctx) -> list of row dicts: item, predicted_ms, measured_ms, no_change_ms, note
CHECKS: dict[str, Callable[[Context], list[dict]]] = {}


def check(name: str):
    def deco(fn):
        CHECKS[name] = fn
        return fn
    return deco


@check("weight-update time per iteration, fused optimizers (CPU pairs)")
def fused_weight_update(ctx: Context) -> list[dict]:
    """The step phase of the fused-optimizer CPU pairs: the model changes only it."""
    from bench.accuracy import pairs as pr
    rows = []
    for pair in pr.pairs():
        if pair.get("phase") != "weight_update":
            continue
        e = pr.evaluate(ctx, pair)
        rows.append({"item": pair["label"], "predicted_ms": e["pred_phase_ms"],
                     "measured_ms": e["real_phase_ms"], "no_change_ms": e["base_phase_ms"]})
    return rows


def _err(p, m):
    return None if p is None or not m else 100.0 * (p - m) / m


def _f(x):
    return "n/a" if x is None else f"{x:.2f}"


def _p(x):
    return "n/a" if x is None else f"{x:+.1f}%"


@section("components", "Component checks (measure 4)", order=40)
def run(ctx: Context) -> Result:
    lines = ["## Component checks (measure 4)", "",
             "The part an optimization changes, predicted against measured, where the whole "
             "step cannot be compared (ACCURACY.md, 4). \"No change\" = the base trace's own "
             "figure for that part, what a user has without Daydream.", ""]
    data: dict = {}
    for name, fn in CHECKS.items():
        rows = fn(ctx)
        for r in rows:
            r["error_pct"] = _err(r["predicted_ms"], r["measured_ms"])
            r["no_change_pct"] = _err(r["no_change_ms"], r["measured_ms"])
        data[name] = rows
        lines += [f"### {name}", "",
                  "| item | predicted ms | measured ms | error | no change ms | "
                  "no-change error |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['item']} | {_f(r['predicted_ms'])} | {_f(r['measured_ms'])} | "
                  f"{_p(r['error_pct'])} | {_f(r['no_change_ms'])} | {_p(r['no_change_pct'])} |"
                  for r in rows]
        lines.append("")
    return Result(lines, data)
