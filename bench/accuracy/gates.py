"""Measure 5, plausibility gates: every registered optimization on every shared training trace
(a matrix of speedups, gate failures marked), and the counts of the gates that every
prediction checked, read from the ``gates`` field of the predict results."""

from __future__ import annotations

import re

from bench.accuracy import NA, Context, Result, reason, section, shown
from bench.accuracy import traces as tr

SLOWER = 0.99  # a speedup under this is a slowdown the notes must explain (gates.SLOWDOWN_TOL)


def specs() -> list[tuple[str, str]]:
    """(optimization, the spec asked of every trace): its name, or the example it was
    registered with where a parameter has no default."""
    from daydream.transforms.registry import examples
    return list(examples().items())


def count(gates) -> tuple[int, int, list[str]]:
    """(checked, failed, names of the failed) from a ``gates`` field: a list of records with
    a name and ``ok``/``passed`` (or a ``status`` of "ok"/"pass"), or a dict name -> bool or
    name -> record."""
    items = []
    if isinstance(gates, dict):
        items = [({"name": k, **v} if isinstance(v, dict) else {"name": k, "ok": bool(v)})
                 for k, v in gates.items()]
    elif isinstance(gates, list):
        items = [g if isinstance(g, dict) else {"name": str(g), "ok": False} for g in gates]
    failed = []
    for g in items:
        ok = g.get("ok", g.get("passed"))
        if ok is None and "status" in g:
            ok = str(g["status"]).lower() in ("ok", "pass", "passed")
        if not ok:
            failed.append(str(g.get("name", "?")))
    return len(items), len(failed), failed


def _named(d: dict) -> str | None:
    """The note of a slower prediction that names the tasks whose time grew, else None."""
    for g in d.get("gates") or []:
        if isinstance(g, dict) and "tasks whose time grew" in str(g.get("note", "")):
            return str(g["note"])
    return None


def _why(e: Exception) -> str:
    """A refusal's reason without the optimization's name in front (the row names it)."""
    return re.sub(r"^\w+: ", "", reason(e).split(": ", 1)[-1])


P3_TRACE = "hta/transformer_ddp_v100_rank1.json.gz"
P3_SLOW = "bandwidth(bw=0.25x)"


def p3_exposed(ctx: Context, data: dict) -> list[str]:
    """P3 where communication is exposed: the transformer DDP trace at a quarter of its
    bandwidth, with and without P3 (the P3 paper's claim: a gain over the same network)."""
    path = tr.resolve(P3_TRACE, None)
    out = ["", f"P3 where communication is exposed (`{P3_TRACE}` at `{P3_SLOW}`, a quarter "
           "of its bandwidth; tests/daydream/test_p3_traces.py): "]
    if path is None:
        return out[:1] + [out[1] + f"{NA} (the trace is in ../shared/traces only).", ""]
    r = ctx.predict_each(path, [P3_SLOW, P3_SLOW + "+p3"])
    a, b = r[P3_SLOW], r[P3_SLOW + "+p3"]
    if isinstance(a, Exception) or isinstance(b, Exception):
        bad = a if isinstance(a, Exception) else b
        return out[:1] + [out[1] + f"failed: {reason(bad)}", ""]
    base, slow, fast = a["baseline_ms"], a["predicted_ms"], b["predicted_ms"]
    p3 = [c for c in data["matrix"] if c["opt"] == "p3" and c.get("speedup") is not None]
    ran, slower = len(p3), [c["trace"] for c in p3 if c["speedup"] < SLOWER]
    data["p3_exposed"] = {"trace": shown(path), "baseline_ms": base, "without_p3_ms": slow,
                          "with_p3_ms": fast, "gain": slow / fast if fast else None}
    return out[:1] + [out[1] + f"step {base:.1f} ms as traced, {slow:.1f} ms at a quarter of "
                      f"the bandwidth, {fast:.1f} ms with P3 on it: P3 gains "
                      f"**{slow / fast:.2f}x** over the same bandwidth without it. At its "
                      "default slice size (the `p3` row above) it predicts a slowdown on "
                      f"{len(slower)} of the {ran} traces it runs on"
                      + (f" ({', '.join(slower)})" if slower else "") + ".", ""]


@section("gates", "Plausibility gates (measure 5)", order=50)
def run(ctx: Context) -> Result:
    lines = ["## Plausibility gates (measure 5)", ""]
    data: dict = {"rows": [], "matrix": []}
    todo = tr.training()
    opts = specs()
    if todo:  # one probe: if the api has no gates yet, asking every trace is time lost
        try:
            probe = ctx.predict(todo[0][1], [opts[0][1]])
        except Exception as e:
            probe = {"error": reason(e)}
        if "gates" not in probe and not any("gates" in d for _, _, d in ctx.log):
            data["available"] = False
            return Result(lines + [f"{NA}: the api's predict result has no `gates` field.",
                                   ""], data)
    # --- the matrix --------------------------------------------------------------------------
    lines += ["### Every optimization on every trace", "",
              "Each registered optimization (transforms/registry.py, `daydream opts`) with its "
              "defaults, or the example spec it is registered with where a parameter has "
              "none, predicted on each shared training trace: the speedup of the step, "
              "`✗name` after it for each gate that failed, `n/a` where the optimization "
              "refuses the trace (its reasons below: a clear error, never a crash or a "
              "deadlock). Columns:", ""]
    cols = []
    for k, (label, path) in enumerate(todo, 1):
        cols.append((k, label, path))
        lines.append(f"{k}. {label} (`{shown(path)}`)")
    lines += ["", "| optimization | " + " | ".join(str(k) for k, _, _ in cols) + " |",
              "|---|" + "---|" * len(cols)]
    results = {str(p): ctx.predict_each(p, [s for _, s in opts]) for _, _, p in cols}
    refusals: dict[tuple[str, str], list[int]] = {}
    slow: list[dict] = []
    crashes = 0
    for name, spec in opts:
        cells = []
        for k, label, path in cols:
            d = results[str(path)][spec]
            cell = {"trace": shown(path), "opt": name, "spec": spec}
            if isinstance(d, Exception):
                from daydream.base.errors import DaydreamError
                clear = isinstance(d, DaydreamError)
                crashes += not clear
                why = _why(d) if clear else f"CRASH {reason(d)}"
                refusals.setdefault((name, why), []).append(k)
                cell.update(speedup=None, refused=why)
                cells.append("n/a" if clear else "**crash**")
            else:
                sp = d.get("speedup")
                _, _, bad = count(d.get("gates"))
                cell.update(speedup=sp, failed=bad)
                text = "?" if sp is None else f"{sp:.2f}x"
                cells.append(" ".join([text] + [f"✗{b}" for b in bad]))
                if sp is not None and sp < SLOWER:
                    note = _named(d)
                    slow.append({"k": k, "label": label, "spec": spec, "speedup": sp,
                                 "note": note})
                    cell["slowdown_named"] = note is not None
            data["matrix"].append(cell)
        lines.append(f"| `{spec}` | " + " | ".join(cells) + " |")
    lines += ["", "Refusals (optimization: columns: reason):", ""]
    for (name, why), ks in refusals.items():
        lines.append(f"- `{name}`: {', '.join(map(str, ks))}: {why}")
    unnamed = [s for s in slow if s["note"] is None]
    lines += ["", f"Slowdowns (speedup under {SLOWER}): {len(slow)}, each with the note that "
              f"names the tasks whose time grew; without one: **{len(unnamed)}**.", ""]
    for s in slow:
        what = s["note"].split("; ", 1)[-1] if s["note"] else "**no note names the tasks**"
        lines.append(f"- {s['k']}. `{s['spec']}` {s['speedup']:.2f}x: {what}")
    data.update(slowdowns=len(slow), slowdowns_unnamed=len(unnamed), crashes=crashes,
                refused=sum(len(v) for v in refusals.values()))
    lines += p3_exposed(ctx, data)
    # --- the counts -------------------------------------------------------------------------
    lines += ["", "### Gates per trace and optimization", "",
              "Every prediction of this run (the matrix's and the other sections'): the gates "
              "it checked and those that failed (ACCURACY.md, 5); rows where none failed are "
              "counted, not listed.", "",
              "| trace | optimization | gates checked | failed gates |", "|---|---|---|---|"]
    label_of = {str(p): label for label, p in todo}
    total = failed_total = 0
    for trace, opt, d in ctx.log:
        if opt is None:
            continue
        if "gates" not in d:
            n, k, names = None, None, []
        else:
            n, k, names = count(d["gates"])
            total += n
            failed_total += k
        data["rows"].append({"trace": shown(trace), "opt": opt, "checked": n, "failed": k,
                             "failed_names": names})
        if k or n is None:
            lines.append(f"| {label_of.get(trace, shown(trace))} | `{opt}` | "
                         f"{NA if n is None else n} | {', '.join(names) or NA} |")
    data.update(available=True, checked=total, failed=failed_total)
    lines += ["", f"Predictions: {len(data['rows'])}; gates checked: {total}, failed: "
              f"**{failed_total}**.", ""]
    return Result(lines, data)
