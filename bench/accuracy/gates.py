"""Measure 5, plausibility gates: the counts of gates that every prediction checks, read from
the ``gates`` field of the predict results (added with the optimization models)."""

from __future__ import annotations

from bench.accuracy import NA, Context, Result, reason, section, shown
from bench.accuracy import traces as tr

# optimizations asked of every training trace when the api reports gates
OPTS = ["amp", "fused_adam"]


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


@section("gates", "Plausibility gates (measure 5)", order=50)
def run(ctx: Context) -> Result:
    lines = ["## Plausibility gates (measure 5)", "",
             "Per trace and optimization, the gates the prediction checked and those that "
             "failed (ACCURACY.md, 5), read from the `gates` field of the predict result; "
             f"optimizations asked of every training trace: {', '.join(OPTS)}, besides every "
             "prediction the other sections made in this run.", ""]
    data: dict = {"rows": []}
    todo = tr.training()
    if todo:  # one probe: if the api has no gates yet, asking every trace is time lost
        try:
            probe = ctx.predict(todo[0][1], [OPTS[0]])
        except Exception as e:
            probe = {"error": reason(e)}
        if "gates" not in probe and not any("gates" in d for _, _, d in ctx.log):
            data["available"] = False
            return Result(lines + [f"{NA}: the api's predict result has no `gates` field.",
                                   ""], data)
    for _label, path in todo:
        for opt in OPTS:
            try:
                ctx.predict(path, [opt])
            except Exception:
                pass  # a spec that does not apply is the gates' business, logged elsewhere
    label_of = {str(p): label for label, p in todo}
    lines += ["| trace | optimization | gates checked | failed | failed gates |",
              "|---|---|---|---|---|"]
    total = failed_total = 0
    for trace, opt, d in ctx.log:
        if opt is None:
            continue
        if "gates" not in d:
            n, k, names, cell = None, None, [], NA
        else:
            n, k, names = count(d["gates"])
            total += n
            failed_total += k
            cell = ", ".join(names)
        data["rows"].append({"trace": shown(trace), "opt": opt, "checked": n, "failed": k,
                             "failed_names": names})
        lines.append(f"| {label_of.get(trace, shown(trace))} | `{opt}` | "
                     f"{NA if n is None else n} | {NA if k is None else k} | {cell} |")
    data.update(available=True, checked=total, failed=failed_total)
    lines += ["", f"Gates checked: {total}, failed: **{failed_total}**.", ""]
    return Result(lines, data)
