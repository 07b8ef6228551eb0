"""``daydream report TRACE [--opt SPEC]... --out report.html``: one self-contained HTML file.

Everything a reader needs is inside the file: styles inline, the ``--plot`` picture (the phase
breakdown and one iteration's timeline before and after each prediction) as a data URI, and
no script, link or font to fetch, so it opens offline and can be mailed or archived. Its
tables are the terminal's (``daydream.report``), rendered as HTML tables whose ``id`` names
them, plus the top kernels and layers of the replay.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import re
from dataclasses import replace
from pathlib import Path

from daydream import api, breakdown, pipeline, report
from daydream.text_table import Column, Table

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #1b1b1b; background: #fff; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.15em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
p.sub { color: #555; margin-top: 0; }
table { border-collapse: collapse; }
div.scroll { overflow-x: auto; max-width: 100%; margin: 0 0 1.2em; }
p.cap { font-weight: 600; margin: 0.6em 0 0.3em; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 0.25em 0.7em; vertical-align: top;
         overflow-wrap: normal; word-break: normal; }
td { min-width: 4em; } td.r { white-space: nowrap; }
p.note { color: #444; font-size: 0.92em; margin: 0.2em 0 0.8em; max-width: 60em; }
h3 { font-size: 1em; margin: 1em 0 0.3em; }
th { background: #f4f6f8; text-align: left; }
td.r, th.r { text-align: right; font-variant-numeric: tabular-nums; }
tr.total td { font-weight: 600; border-top: 2px solid #999; }
ul.notes li { margin: 0.2em 0; }
img.plot { max-width: 100%; border: 1px solid #ddd; }
.bad { color: #b00020; } .ok { color: #137333; }
"""


def table_html(t: Table, ident: str) -> str:
    """T as an HTML table with id IDENT (cells escaped; numbers right-aligned)."""
    # the title above a box that scrolls sideways: a wide table scrolls, its title wraps to
    # the page (a caption would be as wide as the table)
    out = [f'<p class="cap">{html.escape(t.title)}</p><div class="scroll">',
           f'<table id="{ident}">', "<thead><tr>"]
    for c in t.columns:
        cls = ' class="r"' if c.align == "right" else ""
        out.append(f"<th{cls}>{html.escape(c.header)}</th>")
    out.append("</tr></thead><tbody>")
    for k, r in enumerate(t.rows):
        total = t.bold_last and k == len(t.rows) - 1 and k > 0
        out.append('<tr class="total">' if total else "<tr>")
        for c, v in zip(t.columns, r, strict=True):
            cls = ' class="r"' if c.align == "right" else ""
            out.append(f"<td{cls}>{html.escape(v)}</td>")
        out.append("</tr>")
    out.append("</tbody></table></div>")
    out += [f'<p class="note">{html.escape(n)}</p>' for n in t.notes]
    return "".join(out)


def tensor_cores(kind: str, name: str) -> str:
    """Whether a kernel's name says it runs on tensor cores (its math class,
    ``transforms.kernel_class.classify``: 'yes (fp16)'), 'no' for a matrix kernel on CUDA
    cores, '' for the rest (memory-bound work has no use for them)."""
    if kind != "kernel":
        return ""
    from daydream.transforms.kernel_class import classify
    k = classify(name)
    if k.tensor_core:
        return f"yes ({k.math})"
    return "no" if k.matrix else ""


def count(x: float) -> str:
    """A count per iteration: whole where it is (a kernel run once an iteration), else to a
    tenth (a kernel of one iteration in two: 0.5, which '0' hid)."""
    return f"{x:.0f}" if abs(x - round(x)) < 0.05 else f"{x:.1f}"


def predicted(after: list | None) -> list:
    """The predictions of AFTER (``pipeline.Prediction``s) that have a predicted replay."""
    return [q for q in after or [] if q.pred is not None]


def after_columns(preds: list) -> list[Column]:
    """A top table's columns of the time after each prediction: numbered when there are
    several (the predictions table names them), else named after the one spec."""
    many = len(preds) > 1
    return [Column(f"after ({k})" if many else f"after {q.result.spec}", "right")
            for k, q in enumerate(preds, 1)]


def top_kernels(p, top: int = 15, after: list | None = None) -> Table:
    """The replay's top kernels by GPU time per iteration, each with its share of the GPU
    work, and its time in each prediction of AFTER (``pipeline.Prediction``s: a kernel a
    rewrite renamed or removed shows no time there)."""
    ranks = len(p.subject.job.members) if p.subject.job is not None else 1
    ks = breakdown.by_kernel(p.subject.tables, p.base, ranks)
    total = sum(k["ms"] for k in ks.values())
    preds = predicted(after)
    later = [breakdown.by_kernel(q.rewritten, q.pred, ranks) for q in preds]
    t = Table(f"Top {top} GPU kernels in the replay (ms per iteration; share of the GPU "
              "work; after: with each prediction)",
              [Column("kernel"), Column("class"), Column("tensor cores"),
               Column("ms", "right"), Column("share", "right"), Column("calls", "right")] +
              after_columns(preds))
    for name, k in sorted(ks.items(), key=lambda kv: -kv[1]["ms"])[:top]:
        t.add(name, k["class"], tensor_cores(k["kind"], name), report.ms(k["ms"]),
              f"{100 * k['ms'] / total:.1f}%" if total else "", count(k["count"]),
              *[report.ms(m[name]["ms"]) if name in m else "" for m in later])
    return t


ABSOLUTE_PATH = re.compile(r"(?<![\w.])/(?:[\w.+-]+/)+([\w.+-]+)")


def clean_note(note: str) -> str:
    """A note as the report shows it: an absolute path of the machine that wrote it (a
    constants file, a store) reduced to its file name."""
    return ABSOLUTE_PATH.sub(lambda m: m.group(1), note)


def top_operators(p, top: int = 15, after: list | None = None) -> Table:
    """The replay's operators with most self CPU time (host work per iteration, named after
    the innermost range it ran in), with their share of the host work and their time in each
    prediction of AFTER."""
    ranks = len(p.subject.job.members) if p.subject.job is not None else 1
    ops = breakdown.by_operator(p.subject.tables, p.base, ranks)
    total = sum(o["ms"] for o in ops.values())
    preds = predicted(after)
    later = [breakdown.by_operator(q.rewritten, q.pred, ranks) for q in preds]
    t = Table(f"Top {top} operators by self CPU time in the replay (host work per iteration "
              "inside the operator, its runtime calls apart; share of the host work; after: "
              "with each prediction)",
              [Column("operator"), Column("ms", "right"), Column("share", "right")] +
              after_columns(preds))
    for name, o in sorted(ops.items(), key=lambda kv: -kv[1]["ms"])[:top]:
        t.add(name, report.ms(o["ms"]), f"{100 * o['ms'] / total:.1f}%" if total else "",
              *[report.ms(m[name]["ms"]) if name in m else "" for m in later])
    return t


def top_gpu_operators(p, top: int = 15, after: list | None = None) -> Table:
    """The replay's operators with most GPU time: the kernels, copies and sets each launched
    (``breakdown.by_gpu_operator``), per iteration, with their share of the GPU work, their
    kernel count and their time in each prediction of AFTER."""
    from daydream.transforms.work import ranges_of
    ranks = len(p.subject.job.members) if p.subject.job is not None else 1
    ranges = ranges_of(p.subject)  # read once: a rewrite keeps the range ids of its calls
    ops = breakdown.by_gpu_operator(p.subject.tables, p.base, ranges, ranks)
    total = sum(o["ms"] for o in ops.values())
    preds = predicted(after)
    later = [breakdown.by_gpu_operator(q.rewritten, q.pred, ranges, ranks) for q in preds]
    t = Table(f"Top {top} operators by GPU time in the replay (the GPU work each launched, "
              "per iteration: a kernel, copy or set counts for the operator around the call "
              "that launched it; share of the GPU work; after: with each prediction)",
              [Column("operator"), Column("GPU ms", "right"), Column("share", "right"),
               Column("GPU tasks", "right")] + after_columns(preds))
    for name, o in sorted(ops.items(), key=lambda kv: -kv[1]["ms"])[:top]:
        t.add(name, report.ms(o["ms"]), f"{100 * o['ms'] / total:.1f}%" if total else "",
              count(o["count"]),
              *[report.ms(m[name]["ms"]) if name in m else "" for m in later])
    if ranges is None:
        t.notes.append("The trace's operators could not be read (no range table in the "
                       "store): all GPU work shows as (no operator).")
    return t


def top_layers(p, top: int = 15) -> Table:
    ranks = len(p.subject.job.members) if p.subject.job is not None else 1
    ls = breakdown.by_layer(p.subject.tables, p.base, ranks)
    t = Table(f"Top {top} layers in the replay (work in ms per iteration)",
              [Column("layer"), Column("GPU ms", "right"),
               Column("CPU ms", "right")])
    for name, v in sorted(ls.items(), key=lambda kv: -(kv[1]["gpu_ms"] + kv[1]["cpu_ms"]))[:top]:
        t.add(name, report.ms(v["gpu_ms"]), report.ms(v["cpu_ms"]))
    return t


def mib(n: int | None) -> str:
    """Bytes as MiB with one decimal ('' for None)."""
    return "" if n is None else f"{n / (1 << 20):,.1f}"


NO_RECORDS = ("The trace records no allocator events, so it has no measured memory peak: "
              "record them with the PyTorch profiler's profile_memory=True "
              "(torch.profiler.profile(..., profile_memory=True)), which writes a [memory] "
              "event per allocation and free.")


def memory_view(ps: list) -> str:
    """The memory section: the measured peak per device (over the trace and per iteration)
    from the allocator's records, and each prediction's peak by
    ``transforms.memory.predicted_peak`` (its rule, or why none applies); for a trace
    without records, one sentence on how to record them."""
    from daydream.base.errors import DaydreamError
    from daydream.transforms import memory
    p0 = ps[0]
    try:
        records = p0.subject.activity("memory") if p0.subject.activity else None
    except DaydreamError:
        records = None
    its = p0.subject.tables.get("iteration")
    devs = memory.measured(records, its)
    if not devs:
        return f'<p id="memory-none">{html.escape(NO_RECORDS)}</p>'
    out = []
    t = Table("Measured peak memory per device (the caching allocator's records; MiB)",
              [Column("device"), Column("records", "right"),
               Column("peak allocated", "right"), Column("peak reserved", "right"),
               Column("reached at (ms from the first step's start)", "right")])
    start = min(its["start_ns"].to_pylist(), default=None) if its is not None else None
    for dm in devs:
        at = "" if dm.peak_ns is None or start is None else report.ms((dm.peak_ns - start) / 1e6)
        t.add(dm.name, dm.records, mib(dm.peak_allocated_bytes) if dm.totals else "no totals",
              mib(dm.peak_reserved_bytes), at)
    if not all(dm.totals for dm in devs):
        t.notes.append("Records without totals (the 2021 trace schema writes only each "
                       "allocation's size): their device's peak is not known, only how "
                       "much a step grew.")
    out.append(table_html(t, "memory-peak"))
    s = Table("Per iteration (MiB; growth: the peak allocated above the allocated bytes at "
              "the step's start, what forward builds up)",
              [Column("device"), Column("iteration"), Column("at start", "right"),
               Column("peak allocated", "right"), Column("growth", "right"),
               Column("peak reserved", "right"), Column("peak at (ms into the step)", "right"),
               Column("step ms", "right")])
    for dm in devs:
        for st in dm.steps:
            s.add(dm.name, st.label or str(st.iteration), mib(st.start_allocated_bytes),
                  mib(st.peak_allocated_bytes), mib(st.growth_bytes),
                  mib(st.peak_reserved_bytes),
                  "" if st.peak_offset_ns is None else report.ms(st.peak_offset_ns / 1e6),
                  report.ms((st.end_ns - st.start_ns) / 1e6))
    if s.rows:
        out.append(table_html(s, "memory-iterations"))
    preds = [p for p in ps if p.result.spec]
    if not preds:
        out.append("<p>Give --opt to see a prediction's peak.</p>")
        return "".join(out)
    used = {i.index for i in p0.result.iterations if i.used}
    q = Table("Predicted peak allocated per optimization (MiB)",
              [Column("optimization"), Column("device"), Column("peak allocated", "right"),
               Column("growth", "right"), Column("rule")])
    for p in preds:
        for dm in devs:
            if dm.device < 0:
                continue  # host memory: no rule, and no row to say it on every spec
            pp = memory.predicted_peak(dm, p.result.spec, p.memory, used or None)
            peak = ("not modeled" if not pp.modeled else "unknown (no totals)"
                    if pp.peak_allocated_bytes is None else mib(pp.peak_allocated_bytes))
            q.add(p.result.spec, dm.name, peak, mib(pp.growth_bytes), pp.rule)
    if not q.rows:
        out.append("<p>The records are of host memory only: no device peak to predict.</p>")
        return "".join(out)
    q.notes.append("The rule: " + memory.BATCH_RULE + " Every other optimization: not "
                   "modeled, with why; the notes' 'memory after' lines are a different "
                   "estimate, from the recorded shapes.")
    out.append(table_html(q, "memory-predicted"))
    return "".join(out)


def overview(d, preds: list, phases: dict | None = None) -> str:
    """The verdict (GPU-, CPU-, data- or communication-bound, ``daydream advise``'s), the GPU's
    utilization, where an iteration's time goes, and the best of the predictions asked for
    with its interval."""
    from daydream.advise import gpu_utilization, verdict, where_time_goes
    where, basis = where_time_goes(d, phases)
    util = gpu_utilization(d, phases)
    bound, why = verdict(where, util)
    out = [f'<p id="verdict"><b>{html.escape(bound)}</b>: {html.escape(why)}.</p>']
    w = Table(f"Where an iteration's time goes (from {basis})",
              [Column("category"), Column("ms", "right"), Column("share", "right")])
    for r in where:
        w.add(r["category"], report.ms(r["ms"]),
              "" if r["share"] is None else f"{100 * r['share']:.1f}%")
    out.append(table_html(w, "where"))
    best = max(preds, key=lambda r: r.speedup or 0.0, default=None)
    if best is not None:
        out.append(f'<p id="best">Best of the predictions asked for: <b>'
                   f"{html.escape(best.spec)}</b>, {report.times(best.speedup)} "
                   f"(interval {report.interval(best.speedup_interval, report.times)}): "
                   f"{report.ms(best.predicted_ms)} ms against "
                   f"{html.escape(report.reference_name(best))} {report.ms(best.reference_ms)}"
                   " ms. <code>daydream advise</code> ranks every optimization.</p>")
    else:
        out.append("<p>Give --opt to predict an optimization; <code>daydream advise</code> "
                   "ranks every one.</p>")
    return "".join(out)


def build(ps: list, png: bytes) -> str:
    """The report's HTML for the predictions PS (``api.run``) and the plot PNG."""
    results = [p.result for p in ps]
    d = results[0]
    preds = [r for r in results if r.predicted]
    name = (d.job.name if d.job is not None else None) or report.short(d.file) or d.trace_id
    title = f"Daydream report: {name}"
    sub = (f"{html.escape(d.file or '')} &middot; trace {html.escape(d.trace_id)}"
           f" &middot; written {dt.datetime.now().strftime('%Y-%m-%d %H:%M')}")
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>", f'<p class="sub">{sub}</p>']

    def section(h: str, ident: str, body: str) -> None:
        parts.append(f'<section id="{ident}"><h2>{html.escape(h)}</h2>{body}</section>')

    p0 = ps[0]
    # a job's replay alone has no phases in its result: its ranks' busy time per phase
    phases = (pipeline.phase_ms(p0.subject.tables, p0.base, len(p0.subject.job.members))
              if p0.subject.job is not None and d.phases is None else None)
    section("Overview", "s-overview", overview(d, preds, phases))
    if preds:
        section("Predictions", "s-predictions",
                table_html(report.predictions_table(results), "predictions"))
    section("Iterations", "s-iterations",
            table_html(report.iterations_table(results), "iterations"))
    section("What the replay rests on", "s-basis", table_html(report.basis_table(d), "basis"))
    body = "".join(table_html(report.phases_table(r), f"phases-{k}")
                   for k, r in enumerate(preds, 1))
    if not body:
        base = d.phases.baseline if d.phases is not None else None
        body = "<p>Give --opt to see phases before and after a change.</p>" if not base else ""
    section("Phases", "s-phases", body)
    img = base64.b64encode(png).decode()
    it = d.plot_iteration
    section("Timeline", "s-timeline",
            f"<p>The phase breakdown (stacked bars, busy ms per iteration) and iteration "
            f"{it}'s schedule, threads and streams as rows, before and after each "
            "prediction.</p>"
            f'<img class="plot" alt="phase breakdown and timeline of iteration {it}" '
            f'src="data:image/png;base64,{img}">')
    cp = d.trace.critical_path if d.trace is not None else None
    if cp:
        section("Critical path", "s-critical-path",
                table_html(report.critical_path_table(cp), "critical-path"))
    if d.job is not None and d.job.ranks:
        lines = "".join(f"<li>{html.escape(x)}</li>" for x in report.job_lines(d))
        gpu = breakdown.gpu_time_by_rank(p0.subject.tables, p0.base)
        section("Ranks", "s-ranks", table_html(report.ranks_table(results, gpu), "ranks") +
                (f'<ul class="notes">{lines}</ul>' if lines else ""))
    section("Top kernels, operators and layers", "s-top",
            table_html(top_kernels(ps[0], after=ps), "top-kernels") +
            table_html(top_gpu_operators(ps[0], after=ps), "top-gpu-operators") +
            table_html(top_operators(ps[0], after=ps), "top-operators") +
            table_html(top_layers(ps[0]), "top-layers"))
    section("Memory", "s-memory", memory_view(ps))
    if d.trace is not None and d.trace.unit_load:
        section("Unit load", "s-units", table_html(report.units_table(
            d.trace.unit_load, iterations=len(d.iterations)), "units"))
    notes = []
    for r in preds or results:
        if r.notes:  # each note names the optimization it is of already ("amp: ...")
            notes.append(f"<h3>{html.escape(r.spec or 'replay')}</h3><ul class=\"notes\">" +
                         "".join(f"<li>{html.escape(clean_note(n))}</li>" for n in r.notes) +
                         "</ul>")
    section("Notes", "s-notes", "".join(notes) if notes else
            "<p>No notes: the predictions made no modelling choice worth a note.</p>")
    gates = [report.gates_table(r) for r in preds]
    gates_body = "".join(table_html(g, f"gates-{k}") for k, g in enumerate(gates, 1) if g)
    section("Gates", "s-gates", gates_body or "<p>The pipeline reported no gates for these "
            "predictions.</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(target: str, out: str | Path, specs: list[str], store=None, *,
                 param_bytes: int | None = None, on_plan=None, on_step=None) -> Path:
    """Predict TARGET with every spec of SPECS (separate predictions) and write the report.
    ``on_plan``, ``on_step``: progress, as ``advise.advise`` gives it."""
    ps = api.run(target, store, specs, param_bytes=param_bytes, on_plan=on_plan,
                 on_step=on_step, steps_after=1)
    if on_step is not None:
        on_step("writing the report")
    buf = io.BytesIO()
    it = api.draw_plot(buf, ps)
    for p in ps:
        p.result = replace(p.result, plot_iteration=it)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    tmp.write_text(build(ps, buf.getvalue()), encoding="utf-8")
    tmp.replace(out)
    if on_step is not None:
        on_step()
    return out
