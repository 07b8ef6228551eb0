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
from daydream.graphstore.prediction import PredictionResult  # noqa: E402

WHATIF = ROOT / "tests" / "data" / "whatif"
MEASURED = WHATIF / "measured.json"


def _meta(key: str, default=None):
    """A machine property measured while recording (measured.json _meta), e.g. the effective
    cores of the recording machine."""
    try:
        return json.loads(MEASURED.read_text())["_meta"][key]
    except (OSError, KeyError, TypeError, ValueError):
        return default


def _load_factor() -> float | None:
    """Per-batch loading time of the cheaper dataset over the default one, timed without the
    profiler (measured.json): the factor a user would measure and give to scale(...)."""
    try:
        return float(json.loads(MEASURED.read_text())["dataloader_light"]["load_factor"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def _pairs() -> list[dict]:
    cores = _meta("effective_cores")
    k = _load_factor()
    cores_arg = f",cores={cores}" if cores else ""
    out = []
    for kind, cls in (("adam", "Adam"), ("adamw", "AdamW"), ("sgd", "SGD(momentum=0.9)"),
                      ("adagrad", "Adagrad")):
        out.append({"name": kind,
                    "label": f"{cls}(foreach=False) -> fused=True, MLP, CPU",
                    "base_trace": WHATIF / f"{kind}_foreach_false.json.gz",
                    "real_trace": WHATIF / f"{kind}_fused.json.gz",
                    "spec": f"fused_{kind}", "phase": "weight_update",
                    "note": "forward and backward run faster next to the fused optimizer "
                            "(the optimized trace's other phases are shorter than the "
                            "base's; seen without the profiler too), which the model, "
                            "changing only the step, does not predict; see the changed-phase "
                            "column and tests/data/whatif/README.md" if kind == "adam" else
                            None})
    for w in (1, 2):
        out.append({"name": f"dataloader_w{w}",
                    "label": f"DataLoader num_workers 0 -> {w}, costly __getitem__, CPU",
                    "base_trace": WHATIF / "dataloader_w0.json.gz",
                    "real_trace": WHATIF / f"dataloader_w{w}.json.gz",
                    "spec": f"dataloader(workers={w}{cores_arg})", "phase": "data_loading",
                    "note": (f"cores = {cores}: the recording machine's effective cores, "
                             "measured while recording (2 vCPUs shared with other jobs); the "
                             "fair share the model gives every thread slows the training "
                             "thread more and the workers less than the trace shows "
                             "(tests/data/whatif/README.md)") if cores and w == 1 else
                            (f"cores = {cores}, as above; the model expects two workers to keep "
                             "up with the training thread, the trace still waits for data")
                            if cores else None})
    out.append({"name": "scale_loading",
                "label": "__getitem__ on half the pixels (113x113 vs 160x160), CPU",
                "base_trace": WHATIF / "dataloader_w0.json.gz",
                "real_trace": WHATIF / "dataloader_light.json.gz",
                "spec": (f"scale(select=\"phase = 'data_loading'\",factor={k})"
                         if k else None), "phase": "data_loading",
                "note": f"factor {k} = per-batch loading time of the cheaper dataset over the "
                        "default one, timed without the profiler (measured.json); in the "
                        "traces loading shrank less (see the last column): the profiler's "
                        "per-op cost does not shrink with the pixels"})
    return out


PAIRS: list[dict] = _pairs()


def _wall(name: str) -> float | None:
    """Unprofiled wall-clock ms per step of one recorded variant (measured.json): the median
    round, or the fastest where the recording kept the fastest take."""
    try:
        m = json.loads(MEASURED.read_text())[name]
        key = "unprofiled_min_ms" if m.get("kept_take") == "min" else "unprofiled_mean_ms"
        return float(m[key])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _x(speedup: float | None) -> str:
    return "n/a" if speedup is None else f"{speedup:.2f}x"


def _reason(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0][:200].replace("|", "\\|")


def _phase_ms(d: PredictionResult, which: str, phase: str | None) -> float | None:
    """CPU + GPU ms per iteration of one phase in api.predict's phase breakdown."""
    p = getattr(d.phases, which).get(phase) if d.phases is not None else None
    return None if p is None else float(p.cpu_ms) + float(p.gpu_ms)


def _trace_phase_ms(store: Path, trace_id: str, phase: str | None) -> float | None:
    """ms per iteration of the tasks of one phase in a trace's graph (as recorded)."""
    if phase is None:
        return None
    import polars as pl

    from daydream.graphstore.read import read_graph
    t = pl.from_arrow(read_graph(store, trace_id)["task"]).filter(
        pl.col("iteration").is_not_null())
    n = t["iteration"].n_unique()
    return float(t.filter(pl.col("phase") == phase)["dur_ns"].sum()) / 1e6 / max(n, 1)


def evaluate(pair: dict, store: Path) -> dict:
    """Measured base and optimized ms (each trace's replay measured_ms), the prediction from
    the base trace with the pair's spec, and why any of them is missing."""
    out: dict = {"name": pair["name"], "spec": pair["spec"], "notes": []}
    for key, trace in (("base", pair["base_trace"]), ("real", pair["real_trace"])):
        try:
            d = api.predict(str(trace), store)
            out[f"{key}_ms"] = d.measured_ms
            out[f"{key}_baseline_ms"] = d.baseline_ms
            out[f"{key}_phase_ms"] = _trace_phase_ms(store, d.trace_id, pair.get("phase"))
        except Exception as e:  # a broken trace must not take the whole report down
            out[f"{key}_ms"] = out[f"{key}_phase_ms"] = None
            out["notes"].append(f"{trace.name}: replay failed: {_reason(e)}")
        out[f"{key}_wall_ms"] = _wall(Path(trace).name.removesuffix(".json.gz"))
    out["predicted_ms"] = out["predicted_phase_ms"] = None
    if pair["spec"] is None:
        out["notes"].append("prediction not available: no Daydream optimization models this")
    elif out["base_ms"] is None:
        out["notes"].append("prediction not available: the base trace does not replay")
    else:
        try:
            d = api.predict(str(pair["base_trace"]), store, opts=[pair["spec"]])
            if d.predicted_ms is None:
                out["notes"].append("prediction not available: api.predict returned no "
                                    "predicted_ms (the transform is not built yet)")
            else:
                out["predicted_ms"] = float(d.predicted_ms)
                out["predicted_phase_ms"] = _phase_ms(d, "predicted", pair.get("phase"))
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
             "Real pairs recorded on the CPU (torch.profiler, 3 active steps per trace, 10 for "
             "the data-loader jobs; of 21 interleaved takes per variant the median kept; "
             "tests/data/whatif/README.md says how and under what load): the same job "
             "without and with the optimization. "
             "Measured ms = mean iteration time in the trace (replay's measured_ms); predicted "
             "ms = Daydream's prediction from the base trace with the spec; error = (predicted "
             "- measured optimized) / measured optimized. Wall clock = mean ms per step of the "
             "same job run without the profiler (median of alternating rounds, measured.json), "
             "for scale: the profiler's per-op overhead is part of what the traces measure.",
             "",
             "The last column isolates the phase the optimization changes (ms per iteration "
             "of host time in it): base -> predicted, and the optimized trace's.", "",
             "| pair | spec | measured base ms | measured optimized ms | real speedup | "
             "predicted ms | predicted speedup | error | wall clock base -> optimized ms | "
             "changed phase: base -> predicted (measured) ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for pair in PAIRS:
        e = evaluate(pair, store)
        spec = f"`{e['spec']}`" if e["spec"] else "(none)"
        lines.append(
            f"| {pair['label']} | {spec} | {_f(e['base_ms'])} | {_f(e['real_ms'])} | "
            f"{_x(e['real_speedup'])} | {_f(e['predicted_ms'])} | "
            f"{_x(e['predicted_speedup'])} | "
            f"{'n/a' if e['error_pct'] is None else format(e['error_pct'], '+.1f') + '%'} | "
            f"{_f(e['base_wall_ms'], '.2f')} -> {_f(e['real_wall_ms'], '.2f')} | "
            f"{pair.get('phase', '')}: {_f(e.get('base_phase_ms'), '.2f')} -> "
            f"{_f(e.get('predicted_phase_ms'), '.2f')} ({_f(e.get('real_phase_ms'), '.2f')}) |")
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
