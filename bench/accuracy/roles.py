"""The roles of the shared traces (bench/manifest.py) in docs/accuracy.md, after the judge: which
calibrate which constant or tolerance, which are judged (../shared/ACCURACY.md: calibration is
not judgement)."""

from __future__ import annotations

from bench import manifest
from bench.accuracy import Context, Result, section


@section("roles", "Calibration apart from judgement", order=5)
def run(ctx: Context) -> Result:
    lines = ["## Calibration apart from judgement", "",
             "Each shared trace calibrates or is judged, never both (bench/manifest.py): the "
             "fitting scripts read calibration traces only and every section below judges "
             "judged traces only (both refuse the other role; tests/bench/test_manifest.py).",
             "", "### What each fitted constant and tolerance came from", "",
             "| constant | script | calibration traces | set before from (judged) | note |",
             "|---|---|---|---|---|"]
    for name, f in manifest.FITS.items():
        cal = ", ".join(f.get("traces") or []) or "-"
        if "check_on" in f and not f.get("traces"):
            cal = "checked on: " + ", ".join(f["check_on"])
        note = "; checked ".join(x for x in (f.get("note", ""), f.get("checked", "")) if x)
        lines.append(f"| {name}: {f['what']} | {f.get('script') or '-'} | {cal} | "
                     f"{', '.join(f.get('set_from', [])) or '-'} | {note} |")
    lines += ["", "### The traces", ""] + manifest.table()
    data = {"traces": {rel: {"role": e.role, "uses": list(e.uses)}
                       for rel, e in manifest.TRACES.items()},
            "fits": {k: {x: v for x, v in f.items()} for k, f in manifest.FITS.items()}}
    return Result(lines + [""], data)
