"""``daydream compare TRACE --opt SPEC AFTER``: a prediction checked against the real run.

The user made the change and recorded the job again. TRACE is predicted with SPEC through the
one prediction path (``daydream.pipeline``); AFTER is replayed (its replay is its trace: the
graph replays it exactly) and measured the same way. Both are set side by side at every level
a prediction is built from, so that a miss can be traced to where it came from: the
steady-state step (the headline of each), each iteration (the i-th used one of each), each
phase, each layer and each kernel class (GPU work per iteration, which survives a change that
renames kernels). ``pair_rows`` flattens the result for the accuracy harness
(bench/accuracy/).
"""

from __future__ import annotations

from daydream import breakdown, pipeline
from daydream.report import emit, ms, pct, print_tables, say, times
from daydream.text_table import Column, Table, to_csv
from daydream.traces import open_store

TOP_LAYERS = 15


def _err(p: float | None, m: float | None) -> float | None:
    return None if p is None or m is None or not m else 100.0 * (p - m) / m


def _ranks(s: pipeline.Subject) -> int:
    return len(s.job.members) if s.job is not None else 1


def compare(before: str, spec: str, after: str, store=None, *,
            param_bytes: int | None = None) -> dict:
    """The prediction of BEFORE with SPEC beside the measured AFTER (see the module)."""
    st = open_store(store)
    sb = pipeline.resolve(before, st)
    p = pipeline.predict(sb, spec, param_bytes=param_bytes)
    sa = pipeline.resolve(after, st)
    a = pipeline.predict(sa, None)
    r, m = p.result, a.result
    ps, sub = p.pred, p.subject
    out: dict = {
        "spec": spec,
        "before": {"trace_id": r.trace_id, "file": r.file, "measured_ms": r.measured_ms},
        "after": {"trace_id": m.trace_id, "file": m.file, "measured_ms": m.measured_ms},
    }
    lo_hi = list(r.predicted_interval_ms) if r.predicted_interval_ms is not None else None
    out["headline"] = {
        "predicted_ms": r.predicted_ms, "measured_ms": m.measured_ms,
        "error_pct": _err(r.predicted_ms, m.measured_ms),
        "predicted_interval_ms": lo_hi,
        "within_interval": (lo_hi is not None and lo_hi[0] <= m.measured_ms <= lo_hi[1]),
        "no_change_error_pct": _err(r.measured_ms, m.measured_ms),
        "predicted_speedup": r.speedup,
        "measured_speedup": (r.measured_ms / m.measured_ms) if m.measured_ms else None,
    }
    pu = [i for i in r.iterations if i.used]
    mu = [i for i in m.iterations if i.used]
    out["iterations"] = [
        {"k": k, "before_index": x.index, "before_label": x.label,
         "after_index": y.index, "after_label": y.label,
         "predicted_ms": x.predicted_ms, "measured_ms": y.measured_ms,
         "error_pct": _err(x.predicted_ms, y.measured_ms)}
        for k, (x, y) in enumerate(zip(pu, mu, strict=False))]
    out["iterations_unpaired"] = abs(len(pu) - len(mu))
    pp = r.phases.as_dict()["predicted"]
    mp = pipeline.phase_ms(sa.tables, a.base, _ranks(sa))
    out["phases"] = [
        {"phase": ph, **{f"{w}_{side}_ms": src.get(ph, {}).get(f"{side}_ms", 0.0)
                         for side in ("gpu", "cpu") for w, src in (("predicted", pp),
                                                                    ("measured", mp))}}
        for ph in sorted(set(pp) | set(mp))]
    pl_ = breakdown.by_layer(p.rewritten, ps, _ranks(sub))
    ml = breakdown.by_layer(sa.tables, a.base, _ranks(sa))
    names = sorted(set(pl_) | set(ml), key=lambda k: -(ml.get(k, {}).get("gpu_ms", 0.0) +
                                                        ml.get(k, {}).get("cpu_ms", 0.0)))
    out["layers"] = [
        {"layer": k, "predicted_gpu_ms": pl_.get(k, {}).get("gpu_ms", 0.0),
         "measured_gpu_ms": ml.get(k, {}).get("gpu_ms", 0.0),
         "predicted_cpu_ms": pl_.get(k, {}).get("cpu_ms", 0.0),
         "measured_cpu_ms": ml.get(k, {}).get("cpu_ms", 0.0)} for k in names]
    pc = breakdown.by_class(p.rewritten, ps, _ranks(sub))
    mc = breakdown.by_class(sa.tables, a.base, _ranks(sa))
    out["kernel_classes"] = [
        {"class": c, "predicted_ms": pc.get(c, 0.0), "measured_ms": mc.get(c, 0.0),
         "error_pct": _err(pc.get(c, 0.0), mc.get(c, 0.0))}
        for c in sorted(set(pc) | set(mc), key=lambda c: -mc.get(c, 0.0))]
    out["notes"] = list(r.notes)
    out["misses"] = misses(out)
    return out


def pair_rows(c: dict) -> list[dict]:
    """Every comparison of C as one flat row: level (headline, iteration, phase, layer,
    kernel_class), name, predicted_ms, measured_ms, error_ms, error_pct. What the accuracy
    harness (bench/accuracy/) reads of a real pair, and what ``misses`` ranks."""
    rows = []

    def add(level, name, p, m):
        rows.append({"level": level, "name": name, "predicted_ms": p, "measured_ms": m,
                     "error_ms": None if p is None or m is None else p - m,
                     "error_pct": _err(p, m)})

    h = c["headline"]
    add("headline", "steady-state step", h["predicted_ms"], h["measured_ms"])
    for it in c["iterations"]:
        add("iteration", f"{it['k']} ({it['before_label'] or it['before_index']} -> "
            f"{it['after_label'] or it['after_index']})", it["predicted_ms"], it["measured_ms"])
    for ph in c["phases"]:
        for side in ("gpu", "cpu"):
            add("phase", f"{ph['phase']} {side.upper()}", ph[f"predicted_{side}_ms"],
                ph[f"measured_{side}_ms"])
    for ly in c["layers"]:
        for side in ("gpu", "cpu"):
            add("layer", f"{ly['layer']} {side.upper()}", ly[f"predicted_{side}_ms"],
                ly[f"measured_{side}_ms"])
    for k in c["kernel_classes"]:
        add("kernel_class", k["class"], k["predicted_ms"], k["measured_ms"])
    return rows


def misses(c: dict, top: int = 5) -> list[dict]:
    """The phases, layers and kernel classes where the prediction missed most, in ms per
    iteration (layers and classes overlap phases: each level is ranked on its own)."""
    rows = [r for r in pair_rows(c) if r["level"] in ("phase", "layer", "kernel_class")
            and r["error_ms"] is not None and abs(r["error_ms"]) >= 0.001]
    return sorted(rows, key=lambda r: -abs(r["error_ms"]))[:top]


def tables(c: dict) -> list[Table]:
    h = c["headline"]
    head = Table("Steady-state step: predicted against measured",
                 [Column("figure"), Column("value")])
    iv = h["predicted_interval_ms"]
    head.add("predicted", f"{ms(h['predicted_ms'])} ms with {c['spec']}" +
             (f" (interval {ms(iv[0])}-{ms(iv[1])} ms)" if iv else ""))
    head.add("measured after", f"{ms(h['measured_ms'])} ms")
    head.add("error", f"{pct(h['error_pct'])}; the measured step is "
             f"{'inside' if h['within_interval'] else 'outside'} the interval")
    head.add("no-change error", f"{pct(h['no_change_error_pct'])} (the trace before, taken "
             "as the prediction)")
    head.add("speedup", f"predicted {times(h['predicted_speedup'])}, measured "
             f"{times(h['measured_speedup'])}")
    its = Table("Iterations (the i-th used one of each trace)",
                [Column("k", "right"), Column("before"), Column("after"),
                 Column("predicted ms", "right"), Column("measured ms", "right"),
                 Column("error", "right")])
    for it in c["iterations"]:
        its.add(it["k"], it["before_label"] or it["before_index"],
                it["after_label"] or it["after_index"], ms(it["predicted_ms"]),
                ms(it["measured_ms"]), pct(it["error_pct"]))
    ph = Table("Phases (busy ms per iteration)",
               [Column("phase"), Column("GPU predicted", "right"),
                Column("GPU measured", "right"), Column("CPU predicted", "right"),
                Column("CPU measured", "right")])
    for r in c["phases"]:
        ph.add(r["phase"], ms(r["predicted_gpu_ms"]), ms(r["measured_gpu_ms"]),
               ms(r["predicted_cpu_ms"]), ms(r["measured_cpu_ms"]))
    ly = Table(f"Layers, the {TOP_LAYERS} with most measured work (ms per iteration)",
               [Column("layer"), Column("GPU predicted", "right"),
                Column("GPU measured", "right"), Column("CPU predicted", "right"),
                Column("CPU measured", "right")])
    for r in c["layers"][:TOP_LAYERS]:
        ly.add(r["layer"], ms(r["predicted_gpu_ms"]), ms(r["measured_gpu_ms"]),
               ms(r["predicted_cpu_ms"]), ms(r["measured_cpu_ms"]))
    kc = Table("Kernel classes (GPU ms per iteration)",
               [Column("class"), Column("predicted", "right"), Column("measured", "right"),
                Column("error", "right")])
    for r in c["kernel_classes"]:
        kc.add(r["class"], ms(r["predicted_ms"]), ms(r["measured_ms"]), pct(r["error_pct"]))
    mi = Table("Where the prediction missed most (ms per iteration)",
               [Column("level"), Column("part"), Column("predicted", "right"),
                Column("measured", "right"), Column("miss", "right")])
    for r in c["misses"]:
        mi.add(r["level"].replace("_", " "), r["name"], ms(r["predicted_ms"]),
               ms(r["measured_ms"]), f"{r['error_ms']:+.3f}")
    return [head, its, ph, ly, kc, mi]


def print_comparison(c: dict) -> None:
    say(f"before: trace {c['before']['trace_id']}: {c['before']['file']}")
    say(f"after:  trace {c['after']['trace_id']}: {c['after']['file']}")
    emit()
    print_tables(tables(c))
    if c["iterations_unpaired"]:
        say(f"note: the traces have different numbers of used iterations; "
            f"{c['iterations_unpaired']} left unpaired")
    for n in c["notes"]:
        say(f"note ({c['spec']}): {n}")


def to_csv_text(c: dict) -> str:
    t = Table("", [Column(k) for k in ("level", "name", "predicted_ms", "measured_ms",
                                       "error_ms", "error_pct")])
    t.records = pair_rows(c)
    return to_csv([t])
