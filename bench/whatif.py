"""What-if accuracy on real pairs: Daydream's prediction from the base trace, checked against a
trace of the same job with the optimization really applied (tests/data/whatif, recorded on the
CPU by bench/whatif_record.py; see the README there).

``PAIRS``        each pair: its traces and the Daydream optimization spec that models it.
``rows(store)``  markdown lines for docs/accuracy.md (``make accuracy`` calls it).

    python bench/whatif.py [--store DIR]     # print the rows
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from daydream import api  # noqa: E402

WHATIF = ROOT / "tests" / "data" / "whatif"
MEASURED = WHATIF / "measured.json"

PAIRS: list[dict] = [
    {"name": "adam",
     "label": "Adam(foreach=False) -> Adam(fused=True), MLP, CPU",
     "base_trace": WHATIF / "adam_foreach_false.json.gz",
     "real_trace": WHATIF / "adam_fused.json.gz",
     "spec": "fused_adam"},
    {"name": "dataloader",
     "label": "DataLoader num_workers 0 -> 2, costly __getitem__, CPU",
     "base_trace": WHATIF / "dataloader_w0.json.gz",
     "real_trace": WHATIF / "dataloader_w2.json.gz",
     "spec": "dataloader(workers=2)",
     "note": "recorded on a 2-vCPU VM shared with other jobs, where the two workers often had "
             "no free core: the real trace is slower than the base (the unprofiled rounds with "
             "an idle CPU ran 1.3x faster); see tests/data/whatif/README.md"},
]


def _wall(name: str) -> float | None:
    """Unprofiled wall-clock ms per step of one recorded variant (measured.json)."""
    try:
        m = json.loads(MEASURED.read_text())
        return float(m[name]["unprofiled_mean_ms"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _x(speedup: float | None) -> str:
    return "n/a" if speedup is None else f"{speedup:.2f}x"


def _reason(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0][:200].replace("|", "\\|")


def evaluate(pair: dict, store: Path) -> dict:
    """Measured base and optimized ms (each trace's replay measured_ms), the prediction from
    the base trace with the pair's spec, and why any of them is missing."""
    out: dict = {"name": pair["name"], "spec": pair["spec"], "notes": []}
    for key, trace in (("base", pair["base_trace"]), ("real", pair["real_trace"])):
        try:
            d = api.predict(str(trace), store)
            out[f"{key}_ms"] = d["measured_ms"]
            out[f"{key}_baseline_ms"] = d["baseline_ms"]
        except Exception as e:  # a broken trace must not take the whole report down
            out[f"{key}_ms"] = None
            out["notes"].append(f"{trace.name}: replay failed: {_reason(e)}")
        out[f"{key}_wall_ms"] = _wall(Path(trace).name.removesuffix(".json.gz"))
    out["predicted_ms"] = None
    if pair["spec"] is None:
        out["notes"].append("prediction not available: no Daydream optimization models this")
    elif out["base_ms"] is None:
        out["notes"].append("prediction not available: the base trace does not replay")
    else:
        try:
            d = api.predict(str(pair["base_trace"]), store, opts=[pair["spec"]])
            if d.get("predicted_ms") is None:
                out["notes"].append("prediction not available: api.predict returned no "
                                    "predicted_ms (the transform is not built yet)")
            else:
                out["predicted_ms"] = float(d["predicted_ms"])
        except Exception as e:
            out["notes"].append(f"prediction not available: {_reason(e)}")
    b, r, p = out["base_ms"], out["real_ms"], out["predicted_ms"]
    out["real_speedup"] = b / r if b and r else None
    out["predicted_speedup"] = b / p if b and p else None
    out["error_pct"] = 100.0 * (p - r) / r if p is not None and r else None
    return out


def rows(store: Path) -> list[str]:
    """Markdown lines for docs/accuracy.md: one table row per pair, notes below."""
    store = Path(store)
    lines = ["## What-if pairs", "",
             "Real pairs recorded on the CPU (torch.profiler, 3 active steps each; "
             "tests/data/whatif/README.md): the same job without and with the optimization. "
             "Measured ms = mean iteration time in the trace (replay's measured_ms); predicted "
             "ms = Daydream's prediction from the base trace with the spec; error = (predicted "
             "- measured optimized) / measured optimized. Wall clock = mean ms per step of the "
             "same job run without the profiler (measured.json), for scale: the profiler's "
             "per-op overhead is part of what the traces measure.", "",
             "| pair | spec | measured base ms | measured optimized ms | real speedup | "
             "predicted ms | predicted speedup | error | wall clock base -> optimized ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for pair in PAIRS:
        e = evaluate(pair, store)
        spec = f"`{e['spec']}`" if e["spec"] else "(none)"
        lines.append(
            f"| {pair['label']} | {spec} | {_f(e['base_ms'])} | {_f(e['real_ms'])} | "
            f"{_x(e['real_speedup'])} | {_f(e['predicted_ms'])} | "
            f"{_x(e['predicted_speedup'])} | "
            f"{'n/a' if e['error_pct'] is None else format(e['error_pct'], '+.1f') + '%'} | "
            f"{_f(e['base_wall_ms'], '.2f')} -> {_f(e['real_wall_ms'], '.2f')} |")
        notes += [f"- {pair['name']}: {n}" for n in e["notes"] + [pair.get("note")] if n]
        print(f"whatif: {pair['name']}: base {_f(e['base_ms'])} real {_f(e['real_ms'])} "
              f"predicted {_f(e['predicted_ms'])}", file=sys.stderr)
    if notes:
        lines += [""] + notes
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description="What-if accuracy rows on the real pairs.")
    ap.add_argument("--store", type=Path, default=ROOT / ".daydream-accuracy")
    print("\n".join(rows(ap.parse_args().store)))


if __name__ == "__main__":
    main()
