"""Measure 3, real pairs: the prediction from a base trace against a recording of the same job
with the change really made, beside the "no change" error and the noise floor."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from bench import whatif
from bench.accuracy import NA, Context, Result, reason, section
from bench.accuracy import traces as tr


def _shared_pairs() -> list[dict]:
    """Pairs recorded on GPUs by others, in ../shared/traces (README there)."""
    base = tr.resolve("kineto-tb-plugin/resnet50_jan21_nw0.json.gz", None)
    real = tr.resolve("kineto-tb-plugin/resnet50_jan21_nw4.json.gz", None)
    if base is None or real is None:
        return []
    return [{"name": "jan21_nw4", "label": "DataLoader num_workers 0 -> 4, ResNet-50, GPU "
             "(kineto samples, Jan 2021)", "base_trace": base, "real_trace": real,
             "spec": "dataloader(workers=4)", "phase": "data_loading", "note": None}]


def pairs() -> list[dict]:
    """Every pair: the CPU pairs of bench/whatif.py and the shared GPU ones. A module that
    adds pairs of its own (GPU pairs, batch size) registers its own section instead."""
    return list(whatif.PAIRS) + _shared_pairs()


def repeats() -> list[tuple[str, Path, Path]]:
    """Two recordings of one setting: their difference is the noise floor of that setting.
    The shared traces' only repeat (kineto-tb-plugin/resnet50_v100_nw0_run1 and run2) lost its
    first run to calibration (bench/manifest.py: the AMP convolution intensities), so none is
    left among the judged traces."""
    out = []
    for label, a, b in REPEATS:
        pa, pb = tr.resolve(a, None), tr.resolve(b, None)
        if pa and pb:
            out.append((label, pa, pb))
    return out


# (label, first, second): pairs of judged recordings of one setting
REPEATS: list[tuple[str, str, str]] = []


def steady(d: dict, key: str = "measured_ms") -> tuple[float | None, float | None]:
    """(median, mean) of ``key`` over the iterations the api uses."""
    v = [i[key] for i in d.get("iterations") or [] if i.get("used") and i.get(key) is not None]
    if not v:
        return None, None
    return statistics.median(v), statistics.fmean(v)


def take_noise(trace: Path) -> float | None:
    """Noise floor of a CPU variant: mean |take - median take| / median take of its profiled
    takes (tests/data/whatif/measured.json), %."""
    try:
        m = json.loads(whatif.MEASURED.read_text())[trace.name.removesuffix(".json.gz")]
        v = [float(x) for x in m["profiled_take_means_ms"]]
    except (OSError, KeyError, TypeError, ValueError):
        return None
    med = statistics.median(v)
    return 100.0 * statistics.fmean(abs(x - med) for x in v) / med


def _phase_ms(d: dict, which: str, phase: str | None) -> float | None:
    """CPU + GPU ms per iteration of one phase in a prediction's JSON phase breakdown."""
    p = ((d.get("phases") or {}).get(which) or {}).get(phase)
    return None if p is None else float(p["cpu_ms"]) + float(p["gpu_ms"])


def _err(p: float | None, m: float | None) -> float | None:
    return None if p is None or not m else 100.0 * (p - m) / m


def evaluate(ctx: Context, pair: dict) -> dict:
    """One pair's figures (memoized in the context: the components section reads them)."""
    memo = ctx.shared.setdefault("pairs", {})
    if pair["name"] in memo:
        return memo[pair["name"]]
    out: dict = {"name": pair["name"], "spec": pair["spec"], "notes": []}
    for key in ("base", "real"):
        trace = pair[f"{key}_trace"]
        try:
            d = ctx.predict(trace)
            out[f"{key}_median_ms"], out[f"{key}_mean_ms"] = steady(d)
            out[f"{key}_phase_ms"] = whatif._trace_phase_ms(ctx.store, d["trace_id"],
                                                            pair.get("phase"))
        except Exception as e:
            out[f"{key}_median_ms"] = out[f"{key}_mean_ms"] = out[f"{key}_phase_ms"] = None
            out["notes"].append(f"{Path(trace).name}: replay failed: {reason(e)}")
    out["pred_median_ms"] = out["pred_mean_ms"] = out["pred_phase_ms"] = None
    out["pred_slack_zero_ms"] = None
    if pair["spec"] and out["base_median_ms"] is not None:
        try:
            d = ctx.predict(pair["base_trace"], [pair["spec"]])
            out["pred_median_ms"], out["pred_mean_ms"] = steady(d, "predicted_ms")
            if out["pred_median_ms"] is None and d.get("predicted_ms") is not None:
                out["pred_median_ms"] = out["pred_mean_ms"] = float(d["predicted_ms"])
            out["pred_phase_ms"] = _phase_ms(d, "predicted", pair.get("phase"))
            z = d.get("predicted_explained_ms")
            out["pred_slack_zero_ms"] = None if z is None else float(z)
        except Exception as e:
            out["notes"].append(f"prediction failed: {reason(e)}")
    elif not pair["spec"]:
        out["notes"].append("no Daydream optimization models this")
    r = out["real_median_ms"]
    out["error_median_pct"] = _err(out["pred_median_ms"], r)
    out["error_mean_pct"] = _err(out["pred_mean_ms"], out["real_mean_ms"])
    out["no_change_pct"] = _err(out["base_median_ms"], r)
    out["noise_pct"] = take_noise(Path(pair["real_trace"]))
    memo[pair["name"]] = out
    return out


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _p(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1f}%"


@section("pairs", "Real pairs (measure 3)", order=30)
def run(ctx: Context) -> Result:
    lines = [
        "## Real pairs (measure 3)", "",
        "Two recordings of one job, without and with the change; the prediction from the "
        "first against the second, compared on the median of the steady steps (the "
        "iterations the api uses; the mean beside it). Error = (predicted - measured "
        "optimized) / measured optimized. Beside it, what a user has without Daydream: the "
        "\"no change\" error (the base's own median against the optimized run's), and the "
        "noise floor (the spread of repeated recordings of the optimized setting: mean |take "
        "- median| / median of the profiled takes in tests/data/whatif/measured.json). The "
        "interval column holds the prediction with slack at zero and with slack kept, "
        f"where the api gives the first (`predicted_explained_ms`; else \"{NA}\"). CPU pairs: "
        "tests/data/whatif/README.md says how they were recorded.", "",
        "| pair | spec | measured base ms median (mean) | measured optimized ms median (mean) "
        "| predicted ms median (mean) | error median (mean) | interval: slack 0, kept | "
        "no-change error | noise floor |",
        "|---|---|---|---|---|---|---|---|---|"]
    data: dict = {"pairs": {}, "repeats": {}}
    notes = []
    for pair in pairs():
        e = evaluate(ctx, pair)
        data["pairs"][pair["name"]] = e
        spec = f"`{e['spec']}`" if e["spec"] else "(none)"
        iv = (NA if e["pred_slack_zero_ms"] is None else
              f"[{e['pred_slack_zero_ms']:.2f}, {_f(e['pred_median_ms'], '.2f')}]")
        lines.append(
            f"| {pair['label']} | {spec} | {_f(e['base_median_ms'])} ({_f(e['base_mean_ms'])})"
            f" | {_f(e['real_median_ms'])} ({_f(e['real_mean_ms'])}) | "
            f"{_f(e['pred_median_ms'])} ({_f(e['pred_mean_ms'])}) | "
            f"{_p(e['error_median_pct'])} ({_p(e['error_mean_pct'])}) | {iv} | "
            f"{_p(e['no_change_pct'])} | "
            f"{'n/a' if e['noise_pct'] is None else format(e['noise_pct'], '.1f') + '%'} |")
        notes += [f"- {pair['name']}: {n}" for n in e["notes"] + [pair.get("note")] if n]
    rows = []
    for label, a, b in repeats():
        try:
            ma, _ = steady(ctx.predict(a))
            mb, _ = steady(ctx.predict(b))
            diff = _err(ma, mb)
            data["repeats"][label] = {"a_median_ms": ma, "b_median_ms": mb, "diff_pct": diff}
            rows.append(f"| {label} | {_f(ma)} | {_f(mb)} | {_p(diff)} |")
        except Exception as e:
            rows.append(f"| {label} | failed: {reason(e)} | | |")
    if notes:
        lines += [""] + notes
    if rows:
        lines += ["", "Noise floor of the shared GPU traces: two recordings of one setting "
                  "(median steady step).", "",
                  "| setting | first ms | second ms | difference |", "|---|---|---|---|"] + rows
    else:
        lines += ["", "Noise floor of the shared GPU traces: none among the judged traces (the "
                  "one repeat, kineto-tb-plugin/resnet50_v100_nw0_run1 and run2, lost its first "
                  "run to calibration: bench/manifest.py)."]
    return Result(lines + [""], data)
