"""``daydream compare TRACE --opt SPEC AFTER``: a prediction checked against the real run.

The user made the change and recorded the job again. TRACE is predicted with SPEC through the
one prediction path (``daydream.pipeline``); AFTER is replayed (its replay is its trace: the
graph replays it exactly) and measured the same way. Both are set side by side at every level
a prediction is built from, so that a miss can be traced to where it came from: the
steady-state step (the headline of each), each iteration (the i-th used one of each), each
phase, each layer and each kernel class (GPU work per iteration, which survives a change that
renames kernels). It names the parts the optimization left as they were (the phases whose
predicted busy time is the trace's own) and how much of the miss they hold: a run after the
change whose data loading grew missed for a reason no model of the optimization could see.
And it checks that the two traces are one job (the names of their host work, the operators,
largely shared; unrelated traces share few): where not, it warns with the figures.
``pair_rows`` flattens the result for the accuracy harness (bench/accuracy/).
"""

from __future__ import annotations

from daydream import breakdown, pipeline
from daydream.report import emit, ms, pct, print_tables, say, times
from daydream.text_table import Column, Table, to_csv
from daydream.traces import open_store

TOP_LAYERS = 15
# Two traces of one job share most of their host work's names (the operators and ranges
# that label it): a pair of runs of one model before and after a change shares 0.8-1.0 of
# them (tests/data: ResNet-50 with 0 and 4 loader workers, Adam unfused and fused); unrelated
# traces under 0.3. Under this share compare warns.
SAME_JOB_NAMES = 0.5
# A part whose predicted busy time is within this share of the trace's own was not touched
UNTOUCHED_TOL = 1e-6


def _names(tables: dict, kinds: tuple[str, ...]) -> set[str]:
    import pyarrow as pa
    import pyarrow.compute as pc
    t = tables["task"]
    kind, name = t["kind"], t["name"]
    if pa.types.is_dictionary(kind.type):
        kind = kind.cast(pa.string())
    if pa.types.is_dictionary(name.type):
        name = name.cast(pa.string())
    sel = pc.is_in(kind, value_set=pa.array(list(kinds), pa.string()))
    return {x for x in pc.unique(pc.filter(name, sel)).to_pylist() if x}


def same_job(before: dict, after: dict) -> dict:
    """Whether the task tables BEFORE and AFTER look like one job: the share of the names of
    their host work (the operators and ranges that label it) they have in common, and of
    their kernels' names (which a change such as AMP renames, so only reported)."""
    out: dict = {}
    for key, kinds in (("host_names", ("host",)), ("kernel_names", ("kernel",))):
        a, b = _names(before, kinds), _names(after, kinds)
        out[key] = {"before": len(a), "after": len(b), "common": len(a & b),
                    "share": len(a & b) / len(a | b) if a | b else None}
    h = out["host_names"]["share"]
    out["ok"] = h is None or h >= SAME_JOB_NAMES
    out["why"] = ("" if out["ok"] else
                  f"the two traces look like different jobs: they share "
                  f"{out['host_names']['common']} of the "
                  f"{out['host_names']['before']} and {out['host_names']['after']} names of "
                  f"their host work ({100 * h:.0f}%; one job before and after a change shares "
                  f"{100 * SAME_JOB_NAMES:.0f}% or more) and "
                  f"{out['kernel_names']['common']} kernel names; the comparison below is "
                  "probably meaningless")
    return out


def untouched(r, measured_phases: dict) -> list[dict]:
    """The phases' GPU and CPU work the prediction R left as the trace had it (its predicted
    busy time the baseline's), each with its time before, measured after and the miss
    (predicted minus measured, ms per iteration)."""
    if r.phases is None:
        return []
    out = []
    for ph in sorted(set(r.phases.baseline) | set(r.phases.predicted)):
        b, p = r.phases.baseline.get(ph), r.phases.predicted.get(ph)
        for side in ("gpu", "cpu"):
            bv = getattr(b, f"{side}_ms") if b is not None else 0.0
            pv = getattr(p, f"{side}_ms") if p is not None else 0.0
            mv = measured_phases.get(ph, {}).get(f"{side}_ms", 0.0)
            if abs(pv - bv) > UNTOUCHED_TOL * max(abs(bv), 1.0) or (bv == 0 and mv == 0):
                continue
            out.append({"part": f"{ph} {side.upper()}", "before_ms": bv,
                        "measured_ms": mv, "miss_ms": pv - mv})
    return out


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
        "reference_ms": r.reference_ms,
        "predicted_speedup": r.speedup,
        "measured_speedup": (r.measured_ms / m.measured_ms) if m.measured_ms else None,
    }
    out["same_job"] = same_job(sb.tables, sa.tables)
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
    out["untouched"] = untouched(r, mp)
    step_miss = (None if r.predicted_ms is None or m.measured_ms is None
                 else r.predicted_ms - m.measured_ms)
    out["headline"]["miss_ms"] = step_miss
    out["headline"]["untouched_miss_ms"] = sum(u["miss_ms"] for u in out["untouched"])
    out["totals"] = {side: {"predicted_ms": sum(v[f"{side}_ms"] for v in pp.values()),
                            "measured_ms": sum(v[f"{side}_ms"] for v in mp.values())}
                     for side in ("gpu", "cpu")}
    for v in out["totals"].values():
        v["error_pct"] = _err(v["predicted_ms"], v["measured_ms"])
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
    head.add("speedup", f"predicted {times(h['predicted_speedup'])} (against "
             f"{ms(h.get('reference_ms'))} ms, the step it divides), measured "
             f"{times(h['measured_speedup'])} (the trace before over the one after)")
    for side, v in (c.get("totals") or {}).items():
        head.add(f"{side.upper()} work", f"{ms(v['predicted_ms'])} ms predicted, "
                 f"{ms(v['measured_ms'])} ms measured ({pct(v['error_pct'])}), busy per "
                 "iteration")
    if h.get("miss_ms") is not None and c.get("untouched"):
        head.add("untouched", f"the parts {c['spec']} does not touch "
                 f"({', '.join(u['part'] for u in c['untouched'])}) account for "
                 f"{h['untouched_miss_ms']:+.3f} ms of busy time per iteration against the "
                 f"step's miss of {h['miss_ms']:+.3f} ms: the run after changed them, which no "
                 "model of the optimization sees")
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
    un = Table(f"Parts {c['spec']} does not touch (its prediction keeps the trace's time; "
               "ms per iteration)",
               [Column("part"), Column("before", "right"), Column("measured after", "right"),
                Column("miss", "right")])
    for r in c.get("untouched") or []:
        un.add(r["part"], ms(r["before_ms"]), ms(r["measured_ms"]), f"{r['miss_ms']:+.3f}")
    return [head, its, ph, ly, kc, mi, un]


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


def warn(text: str) -> None:
    """A warning on stderr (and so beside any format on stdout)."""
    import sys

    from daydream.text_table import paragraph, width
    sys.stderr.write(paragraph(f"warning: {text}", width(), "  ") + "\n")


def to_csv_text(c: dict) -> str:
    t = Table("", [Column(k) for k in ("level", "name", "predicted_ms", "measured_ms",
                                       "error_ms", "error_pct")])
    t.records = pair_rows(c)
    return to_csv([t])
