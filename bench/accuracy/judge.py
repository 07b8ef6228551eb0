"""The judge's scorecard, first in docs/accuracy.md (../shared/ACCURACY.md: the judge comes
first). ../shared/judge/score.py is a fixed yardstick outside the project: it is run here as it
is, as a subprocess against the installed command line (.venv/bin/daydream), with ``--json``,
and its rows are written down unchanged. Nothing of its logic is copied into the project."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from bench.accuracy import NA, ROOT, Context, Result, reason, section

JUDGE = ROOT.parent / "shared" / "judge" / "score.py"
DAYDREAM = ROOT / ".venv" / "bin" / "daydream"
TIMEOUT_S = 4 * 3600


def scorecard(judge: Path | None = None, daydream: Path | None = None) -> dict:
    """The judge's JSON: {passed, cases, rows: [{case, ok, result}]}. It prints its summary
    line after the JSON; its exit status is 1 when a case fails, which is a result, not an
    error."""
    judge, daydream = judge or JUDGE, daydream or DAYDREAM
    r = subprocess.run([sys.executable, str(judge), "--json", "--daydream", str(daydream)],
                       cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    out = r.stdout
    if "{" not in out:
        raise RuntimeError(((r.stderr or out).strip().splitlines() or ["no output"])[-1][:200])
    d = orjson.loads(out[out.index("{"):out.rindex("}") + 1])
    if not isinstance(d.get("rows"), list) or "passed" not in d:
        raise RuntimeError("the judge's JSON has no rows")
    return d


def lines_of(d: dict) -> list[str]:
    out = [f"**judge: {d['passed']}/{d['cases']} cases pass**", "",
           "| case | | result |", "|---|---|---|"]
    for r in d["rows"]:
        res = str(r.get("result", "")).replace("|", "\\|")
        out.append(f"| {r['case']} | {'pass' if r.get('ok') else '**FAIL**'} | {res} |")
    return out


@section("judge", "The judge's scorecard", order=0)
def run(ctx: Context) -> Result:
    lines = ["## The judge's scorecard", "",
             "`python3 ../shared/judge/score.py --json` (../shared/judge/README.md: real "
             "recorded pairs, GPU-bound premises read from the raw traces, optimizations that "
             "must change nothing), run as it is against `.venv/bin/daydream`; its cases are "
             "judged traces of bench/manifest.py, none of them a calibration trace.", ""]
    if not JUDGE.exists():
        return Result(lines + [f"{NA}: ../shared/judge is not here.", ""], {"available": False})
    try:
        d = scorecard()
    except Exception as e:
        return Result(lines + [f"The judge could not run: {reason(e)}", ""],
                      {"error": reason(e)})
    f_lines, d["floors"] = floors()
    return Result(lines + lines_of(d) + [""] + f_lines, d)


def floors() -> tuple[list[str], list[dict]]:
    """Beside each bound case (GPU x f against T / max(f G, C), the judge's premise: the
    host's work and the GPU's overlapping wholly), the most its steady steps can gain once
    the host's blocking calls are respected (bench/bounds.py ``sync_floor``), with the host's
    work counted as C_max counts it (sound), with its short gaps as work, and by the judge's
    rule for C exactly (short gaps as work, each call at the lesser of its duration and its
    name's median). Read from the raw trace; no Daydream figure in it."""
    from bench import bounds
    from bench.accuracy import traces as tr
    cases_file = JUDGE.parent / "cases.json"
    if not cases_file.exists():
        return [], []
    cases = [c for c in orjson.loads(cases_file.read_bytes())["cases"]
             if c.get("kind") == "bound"]
    if not cases:
        return [], []
    lines = ["The bound cases against the host's blocking calls: no schedule of a steady step "
             "is shorter than its host threads' own work between two blocking calls, nor "
             "than the GPU work each call waits for from its launch on "
             "(`python bench/bounds.py --sync-floor F TRACE`, module doc; the judge's premise "
             "lets the host's work and the GPU's overlap wholly). The most the steady steps "
             "can gain together:", "",
             "| case | GPU x | steady steps | host work as C_max counts it (sound) | with its "
             "short gaps as work | by the judge's rule for C (short gaps as work, each call "
             "at the lesser of its duration and its name's median) |", "|---|---|---|---|---|---|"]
    rows = []
    for c in cases:
        path = tr.resolve(c["trace"], None)
        if path is None:
            lines.append(f"| {c['name']} | {c['f']} | {NA}: the trace is not here | | | |")
            continue
        try:
            raw = bounds.read(path)
            sound, gaps, judge_rule = (bounds.sync_floor(raw, c["f"], g, m)["steady"]
                                       for g, m in ((False, False), (True, False), (True, True)))
        except Exception as e:  # a trace the floor cannot read: said in its row
            lines.append(f"| {c['name']} | {c['f']} | {NA}: {reason(e)} | | | |")
            continue
        rows.append({"case": c["name"], "f": c["f"], "steps": sound["steps"],
                     "speedup_max": sound["speedup_max"],
                     "speedup_max_short_gaps": gaps["speedup_max"],
                     "speedup_max_judge_rule": judge_rule["speedup_max"]})
        lines.append(f"| {c['name']} | {c['f']} | {sound['steps']} | "
                     f"{sound['speedup_max']:.2f}x | {gaps['speedup_max']:.2f}x | "
                     f"{judge_rule['speedup_max']:.2f}x |")
    return lines + ["", "A ceiling, not a prediction: where it lies above the judge's "
                    "T / max(f G, C), the blocking calls leave the premise's overlap possible "
                    "and the GPU's own work is what binds; where below, no schedule reaches "
                    "the premise. The judge takes C from the busiest thread alone; the floor "
                    "takes threads that never work at once (a main thread waiting in "
                    "backward() for the autograd thread) one after another.", ""], rows
