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
First it checks that the two traces are one job (``same_job``: what host work they ran, by
name and by count per iteration); two that are not are not compared unless forced (the
command line's ``--force``), and a forced comparison says so with the figures.
``pair_rows`` flattens the result for the accuracy harness (bench/accuracy/).
"""

from __future__ import annotations

import polars as pl

from daydream import breakdown, pipeline
from daydream.base.errors import DaydreamError
from daydream.report import emit, ms, pct, print_tables, say, times
from daydream.text_table import Column, Table, to_csv
from daydream.traces import open_store

TOP_LAYERS = 15
# Whether two traces are one job, from the host work they ran (host tasks, each named after
# the operator or range it ran in), with the names made comparable across runs: a Python
# frame's line number and an object's address change with the torch version and the
# process, and a trailing #N numbers steps and instances (ProfilerStep#12).
VOLATILE = r" at 0x[0-9a-fA-F]+|\(\d+\)|#\d+$"  # a regular expression
# Two measures, each with a floor, checked on every pair of 42 real traces (tests/data and
# ../shared/traces):
# - the share of the names they have in common (Jaccard);
# - the share of their host tasks per iteration that match by name (weighted Jaccard of
#   the counts per iteration), which tells a 26-layer MLP from a 4-layer one that runs the
#   same operators (0.13-0.20).
# The 22 pairs of one job before and after a change (DataLoader workers, batch size, fused
# optimizers, the same model on an H100 and an MI300X, two ranks, two runs) share 0.87-1.0
# of their names and 0.56-1.0 of their tasks (the least: a for-loop optimizer against a
# fused one, whose hundreds of per-parameter ops are gone): all pass. Of the 801 pairs of
# different models 3 pass: two MLPs trained with SGD (0.71 and 0.45-0.52: operators and
# counts alike) and HTA's AlexNet and "simple add" traces (1.0 and 0.89), the same program.
# Of the 38 pairs of one model in different jobs (the same MLP with another optimizer,
# ResNet-50 recorded by other people) 29 pass. The device and the number of iterations are
# no evidence: a job recorded on another GPU, or for more steps, is still one job.
SAME_JOB_NAMES = 0.7
SAME_JOB_COUNTS = 0.4
# A part whose predicted busy time is within this share of the trace's own was not touched
UNTOUCHED_TOL = 1e-6


def _host_work(tables: dict) -> tuple[set[str], dict[str, float]]:
    """The names of a graph's host tasks (``VOLATILE`` parts removed), and how many tasks of
    each name an iteration runs (those inside iterations, over the iteration rows: per rank,
    for a job)."""
    t = pl.from_arrow(tables["task"].select(["kind", "name", "iteration"])).with_columns(
        pl.col("kind").cast(pl.String), pl.col("name").cast(pl.String)
        .str.replace_all(VOLATILE, ""))
    host = t.filter((pl.col("kind") == "host") & pl.col("name").is_not_null())
    n = max(tables["iteration"].num_rows, 1) if "iteration" in tables else 1
    counts = (host.filter(pl.col("iteration").is_not_null()).group_by("name").len())
    return set(host["name"].unique().to_list()), {a: b / n for a, b in counts.iter_rows()}


def _kernel_names(tables: dict) -> set[str]:
    t = pl.from_arrow(tables["task"].select(["kind", "name"])).with_columns(
        pl.col("kind").cast(pl.String), pl.col("name").cast(pl.String))
    return set(t.filter(pl.col("kind") == "kernel")["name"].drop_nulls().unique().to_list())


def same_job(before: dict, after: dict) -> dict:
    """Whether the graphs BEFORE and AFTER (their tables) look like one job, from what their
    host work ran: the share of its names they have in common, and the share of its tasks per
    iteration that match by name (see ``SAME_JOB_NAMES``, ``SAME_JOB_COUNTS``); the names
    whose count per iteration differs most; and their kernel names' share (a change such as
    AMP renames kernels, so that is only reported). ``ok``: both shares at their floor;
    ``why``: where not, what fell short."""
    (na, ca), (nb, cb) = _host_work(before), _host_work(after)
    out: dict = {"host_names": {"before": len(na), "after": len(nb), "common": len(na & nb),
                                "share": len(na & nb) / len(na | nb) if na | nb else None}}
    keys = set(ca) | set(cb)
    most = sum(max(ca.get(k, 0.0), cb.get(k, 0.0)) for k in keys)
    out["host_counts"] = {
        "before_per_iteration": sum(ca.values()), "after_per_iteration": sum(cb.values()),
        "share": sum(min(ca.get(k, 0.0), cb.get(k, 0.0)) for k in keys) / most
        if most else None}
    out["differ_most"] = [
        {"name": k, "before_per_iteration": ca.get(k, 0.0),
         "after_per_iteration": cb.get(k, 0.0)}
        for k in sorted(keys, key=lambda k: (-abs(ca.get(k, 0.0) - cb.get(k, 0.0)), k))[:3]]
    ka, kb = _kernel_names(before), _kernel_names(after)
    out["kernel_names"] = {"before": len(ka), "after": len(kb), "common": len(ka & kb),
                           "share": len(ka & kb) / len(ka | kb) if ka | kb else None}
    h, c = out["host_names"], out["host_counts"]
    short = []
    if h["share"] is not None and h["share"] < SAME_JOB_NAMES:
        short.append(f"they share {h['common']} of the {h['before']} and {h['after']} names "
                     f"of their host work ({100 * h['share']:.0f}%; one job before and after "
                     f"a change shares {100 * SAME_JOB_NAMES:.0f}% or more)")
    if c["share"] is not None and c["share"] < SAME_JOB_COUNTS:
        short.append(f"{100 * c['share']:.0f}% of their host work per iteration matches by "
                     f"name ({c['before_per_iteration']:.0f} and "
                     f"{c['after_per_iteration']:.0f} tasks per iteration; one job before "
                     f"and after a change matches {100 * SAME_JOB_COUNTS:.0f}% or more)")
    out["ok"] = not short
    diff = ", ".join(f"{d['name']} ({d['before_per_iteration']:.1f} against "
                     f"{d['after_per_iteration']:.1f} per iteration)"
                     for d in out["differ_most"])
    out["why"] = ("" if out["ok"] else "the two traces look like different jobs: " +
                  " and ".join(short) + f"; most different: {diff}")
    return out


def same_job_line(s: dict) -> str:
    """The figures ``same_job`` decided by, as the comparison's headline gives them."""
    h, c = s["host_names"]["share"], s["host_counts"]["share"]
    figures = ", ".join(x for x in (
        None if h is None else f"{100 * h:.0f}% of host-work names shared",
        None if c is None else f"{100 * c:.0f}% of host tasks per iteration alike") if x)
    return (f"yes: {figures}" if s["ok"] else
            f"NO, compared anyway (--force): {figures}; the figures here are probably "
            "meaningless")


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
            param_bytes: int | None = None, force: bool = False) -> dict:
    """The prediction of BEFORE with SPEC beside the measured AFTER (see the module). Two
    traces that do not look like one job (``same_job``) raise, unless FORCE."""
    st = open_store(store)
    sb = pipeline.resolve(before, st)
    sa = pipeline.resolve(after, st)
    same = same_job(sb.tables, sa.tables)
    if not same["ok"] and not force:
        raise DaydreamError(f"{same['why']}; not compared (--force compares them anyway)")
    p = pipeline.predict(sb, spec, param_bytes=param_bytes)
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
    out["same_job"] = same
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
    if c.get("same_job"):
        head.add("same job", same_job_line(c["same_job"]))
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
