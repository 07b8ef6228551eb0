"""What the CLI prints and the HTML report shows, built from prediction results
(``daydream.graphstore.prediction.PredictionResult``) as ``daydream.text_table.Table`` objects, so
that the terminal, CSV and HTML show the same rows. Presentation only: every figure comes from
the result."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from daydream.text_table import Column, Table, paragraph, render, to_csv, width

if TYPE_CHECKING:
    from daydream.graphstore.prediction import PredictionResult


def ms(x: float | None, nd: int = 3) -> str:
    return "" if x is None or x != x else f"{x:.{nd}f}"


def pct(x: float | None) -> str:
    return "" if x is None or x != x else f"{x:+.2f}%"


def times(x: float | None) -> str:
    return "" if x is None or x != x else f"{x:.3f}x"


def rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    out, i = [], 0
    rs = sorted(ranks)
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(out)


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 trace', '2 traces'."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def interval(iv: list | None, fmt: Callable[[float | None], str] = ms) -> str:
    if not iv:
        return ""
    lo, hi = iv
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}-{fmt(hi)}"


ITERATIONS_FROM = {
    "ProfilerStep": "from the ProfilerStep markers",
    "Optimizer.step": "from the Optimizer.step ranges (the trace has no ProfilerStep "
                      "markers): each ends where an optimizer step ends",
    "whole_trace": "the whole trace is one iteration: it has no iteration markers "
                   "(ProfilerStep, Optimizer.step)",
}


def iterations_note(d: PredictionResult) -> str:
    """How the iterations were found, and which of them are used."""
    its = d.iterations
    used = d.used_iterations
    how = ITERATIONS_FROM.get(d.iterations_from or "", "")
    head = f"{plural(len(its), 'iteration')} found {how}" if how.startswith("from") else (
        f"{plural(len(its), 'iteration')}: {how}" if how else plural(len(its), "iteration"))
    return f"{head}; {used} used for the steady state"


# ---- tables ---------------------------------------------------------------------------------

def own_reference(r: PredictionResult) -> bool:
    """Whether R's speedup is against a replay other than the trace's (the job without the
    profiler, for an optimization that removes host work)."""
    return r.reference_ms is not None and r.reference_ms != r.baseline_ms


def iterations_table(results: list[PredictionResult]) -> Table:
    """Per iteration: measured, replayed and explained, and each prediction's time (several
    predictions: a numbered column each, the numbers those of the predictions table). Where a
    prediction's speedup is against the replay without the profiler, that replay is a column
    too, and the speedup divides it."""
    d = results[0]
    preds = [r for r in results if r.predicted]
    cols = [Column("iteration", "right"), Column("label"), Column("measured ms", "right"),
            Column("replayed ms", "right"), Column("replay error", "right"),
            Column("explained ms", "right")]
    unprof = next((r for r in preds if own_reference(r)), None)
    if unprof is not None:
        cols.append(Column("replayed without profiler ms", "right", key="reference_ms"))
    one = len(preds) == 1
    for k, r in enumerate(preds, 1):
        cols.append(Column("predicted ms" if one else f"predicted ms ({k})", "right",
                           key="predicted_ms" if one else f"predicted_ms:{r.spec}"))
    if one:
        cols.append(Column("speedup", "right"))
    notes = any(it.note and not it.used for it in d.iterations)
    if notes:
        cols.append(Column("note"))
    title = "Iterations: measured, replayed" + (
        f" and predicted with {preds[0].spec}" if one else
        " and predicted with " + "; ".join(f"({k}) {r.spec}" for k, r in
                                           enumerate(preds, 1)) if preds else "")
    t = Table(title, cols, bold_last=True)
    by_spec = [{i.index: i.predicted_ms for i in r.iterations} for r in preds]
    refs = ({i.index: i.reference_ms for i in unprof.iterations} if unprof is not None
            else {})
    one_ref = ({i.index: i.reference_ms for i in preds[0].iterations} if one else {})
    for it in d.iterations:
        row = [it.index, it.label or "(whole trace)", ms(it.measured_ms),
               ms(it.baseline_ms), pct(it.error_pct), ms(it.explained_ms)]
        if unprof is not None:
            row.append(ms(refs.get(it.index)))
        for b in by_spec:
            row.append(ms(b.get(it.index)))
        if one:
            p, ref = by_spec[0].get(it.index), one_ref.get(it.index)
            row.append(times(ref / p) if p and ref else "")
        if notes:
            # the kind of note in the cell ("warm-up", "drain"), the note itself under the
            # table: a sentence in a column is a column of single words on a terminal
            kind, _, rest = (it.note or "").partition(":") if not it.used else ("", "", "")
            row.append(kind if rest else (it.note or "") if not it.used else "")
            if rest:
                t.notes.append(f"iteration {it.index} ({kind}):{rest}")
        t.add(*row)
    row = ["", "steady state", ms(d.measured_ms), ms(d.baseline_ms),
           pct(d.baseline_error_pct), ms(d.explained_ms)]
    if unprof is not None:
        row.append(ms(unprof.reference_ms))
    row += [ms(r.predicted_ms) for r in preds]
    if one:
        row.append(times(preds[0].speedup))
    t.add(*row, *([""] if notes else []))
    return t


# Slack worth its own line in what a replay rests on (a tenth of the step), and the line:
# the trace cannot say what the time was, so each says which end of the interval takes which
SLACK_NOTE_SHARE = 0.1
SLACK_NOTES = (
    ("gpu_idle", "GPU idle", "the GPU waited with nothing in the trace ending the wait (an "
     "untraced dependency, a peer, another process): predictions keep it, after the task "
     "before it on its stream, and their interval's lower end drops it"),
    ("untraced", "untraced", "a thread had nothing traced while GPU work it launched ran: CPU "
     "work or a wait, which the trace cannot tell: predictions keep it as work, their "
     "interval's lower end drops it as a wait"),
)


def basis_table(d: PredictionResult) -> Table:
    """What the headline rests on: the trace's own spread, how much of it the graph explains,
    the slack it does not, and how the iterations were found (docs/graph.md)."""
    t = Table("What the replay rests on", [Column("figure"), Column("value")])
    spread = d.measured_spread_ms
    t.add("steady-state step", f"{ms(d.measured_ms)} ms measured, {ms(d.baseline_ms)} "
          f"ms replayed ({pct(d.baseline_error_pct)})")
    if spread:
        t.add("used steps", f"median {ms(d.measured_median_ms)} ms, mean "
              f"{ms(d.measured_mean_ms)} ms, fastest {ms(spread[0])} ms, slowest "
              f"{ms(spread[1])} ms")
    if d.explained_ms is not None:
        parts = [f"{ms(d.explained_ms)} ms ({pct(d.explained_error_pct)}) with "
                 "every slack at zero"]
        if d.explained_no_inferred_ms is not None:
            parts.append(f"{ms(d.explained_no_inferred_ms)} ms without the inferred edges")
        if d.job is not None and d.job.name and d.explained_peer_wait_ms is not None:
            parts.append(f"{ms(d.explained_peer_wait_ms)} ms with the peer waits kept")
        t.add("explained replay", "; ".join(parts))
    slack = (d.trace.slack_ms if d.trace is not None else None) or {}
    if slack:
        t.add("slack per iteration", ", ".join(
            f"{k} {ms(v, 2)} ms" for k, v in sorted(slack.items(), key=lambda kv: -kv[1])) +
            " (what the graph does not explain, summed over edges)")
    for kind, figure, what in SLACK_NOTES:
        v = slack.get(kind, 0.0)
        if d.baseline_ms and v >= SLACK_NOTE_SHARE * d.baseline_ms:
            t.add(figure, f"{ms(v, 2)} ms per iteration {what}")
    inf = (d.trace.inferred_edges if d.trace is not None else None) or {}
    if inf:
        t.add("inferred edges", ", ".join(f"{k} {v}" for k, v in inf.items()) +
              " (from coincidences of times)")
    t.add("iterations", iterations_note(d))
    return t


def reference_name(r: PredictionResult) -> str:
    """What R's speedup divides: the replay, or the replay without the profiler."""
    return "replay without profiler" if own_reference(r) else "replay"


def predictions_table(results: list[PredictionResult]) -> Table:
    """One row per prediction: the step its speedup is against (the reference), its time and
    speedup (reference over predicted) with the interval (slack at zero to slack kept);
    numbered as the iterations table's columns when there are several."""
    preds = [r for r in results if r.predicted]
    cols = [Column("optimization", key="spec"), Column("reference"),
            Column("reference ms", "right"), Column("predicted ms", "right"),
            Column("interval ms", "right"), Column("speedup", "right"),
            Column("speedup interval", "right")]
    many = len(preds) > 1
    if many:
        cols.insert(0, Column("", "right", key="number"))
    t = Table("Predictions (steady-state step; speedup: reference ms / predicted ms; "
              "interval: slack at zero to slack kept)", cols)
    for k, r in enumerate(preds, 1):
        t.add(*([f"({k})"] if many else []), r.spec, reference_name(r), ms(r.reference_ms),
              ms(r.predicted_ms), interval(r.predicted_interval_ms), times(r.speedup),
              interval(r.speedup_interval, times))
    t.records = [prediction_record(r) for r in preds]
    return t


def prediction_record(r: PredictionResult) -> dict:
    """The machine-readable row of one prediction (``--format csv``): ``speedup`` is
    ``reference_ms / predicted_ms``."""
    iv = r.predicted_interval_ms or (None, None)
    sp = r.speedup_interval or (None, None)
    return {"trace_id": r.trace_id, "file": r.file, "spec": r.spec or "",
            "measured_ms": r.measured_ms, "baseline_ms": r.baseline_ms,
            "explained_ms": r.explained_ms,
            "reference": reference_name(r) if r.predicted else "",
            "reference_ms": r.reference_ms, "predicted_ms": r.predicted_ms,
            "predicted_low_ms": iv[0], "predicted_high_ms": iv[1],
            "speedup": r.speedup, "speedup_low": sp[0], "speedup_high": sp[1],
            "iterations_used": r.used_iterations}


def phases_table(r: PredictionResult) -> Table:
    per = " and rank" if r.job is not None and r.job.name else ""
    title = f"Phases with {r.spec} (busy ms per iteration{per})"
    t = Table(title, [Column("phase"), Column("GPU before", "right"),
                      Column("GPU after", "right"), Column("CPU before", "right"),
                      Column("CPU after", "right")])
    b, p = r.phases.baseline, r.phases.predicted
    for name in sorted(set(b) | set(p)):
        bb, pp = b.get(name), p.get(name)
        t.add(name, ms(bb and bb.gpu_ms), ms(pp and pp.gpu_ms), ms(bb and bb.cpu_ms),
              ms(pp and pp.cpu_ms))
    return t


def critical_path_table(cp: dict, title: str = "") -> Table:
    """The critical path's parts by phase, kind and layer; parts of no length left out."""
    span = cp["span_ns"]
    t = Table(title or f"Critical path of iteration {cp['iteration']} (replay): "
              f"{plural(cp['tasks'], 'task')} over {ms(span / 1e6)} ms",
              [Column("by"), Column("part"), Column("ms", "right"), Column("share", "right")])
    for key in ("phase", "kind", "layer"):
        for r in cp.get(f"by_{key}") or []:
            if r["ns"] <= 0:
                continue
            name = r[key] if r[key] is not None else f"(no {key})"
            t.add(key, name, ms(r["ns"] / 1e6), f"{100 * r['ns'] / span:.1f}%" if span else "")
    return t


def units_table(units: list[dict], top: int = 12, iterations: int | None = None) -> Table:
    """The busiest units of the replay: busy time over the whole replay, and with ITERATIONS
    (how many it holds) per iteration as the other tables are, and share of the span."""
    per = bool(iterations)
    t = Table("Unit load in the replay (busy: share of the simulated span" +
              (f"; ms per iteration: the whole replay's over its {iterations} iterations)"
               if per else ")"),
              [Column("unit"), Column("busy ms (whole replay)" if per else "busy ms",
                                      "right")] +
              ([Column("ms per iteration", "right")] if per else []) +
              [Column("busy", "right")])
    for r in sorted(units, key=lambda r: -r["busy_share"])[:top]:
        t.add(r["unit"], ms(r["busy_ns"] / 1e6, 2),
              *([ms(r["busy_ns"] / 1e6 / iterations, 2)] if per else []),
              f"{100 * r['busy_share']:.1f}%")
    return t


def ranks_table(results: list[PredictionResult], gpu: dict[int, dict] | None = None
                ) -> Table:
    """Per rank of a job: measured, replayed and each prediction's step, and which rank is the
    straggler (``simulate.job.straggler``'s). GPU: per rank, how its GPU spent a measured
    iteration (``breakdown.gpu_time_by_rank``), shown beside the step where given."""
    j = results[0].job
    preds = [r for r in results if r.predicted]
    title = f"Job {j.name}: {plural(j.world_size, 'rank')}"
    if j.missing_ranks:
        title += f" of {j.traced_world_size} ({len(j.missing_ranks)} missing)"
    cols = [Column("rank", "right"), Column("measured ms", "right")]
    if gpu is not None:
        cols += [Column("compute ms", "right"), Column("communication ms", "right"),
                 Column("GPU idle ms", "right")]
    cols += [Column("replayed ms", "right"), Column("replay error", "right")]
    cols += [Column("predicted ms" if len(preds) == 1 else f"predicted ms ({k})", "right")
             for k, r in enumerate(preds, 1)]
    s = j.straggler or {}
    if s:
        cols.append(Column("straggler"))
    t = Table(title, cols)
    by = [{x.rank: x.predicted_ms for x in r.job.ranks} for r in preds]
    for r in j.ranks:
        g = (gpu or {}).get(r.rank)
        t.add(r.rank, ms(r.measured_ms),
              *([] if gpu is None else [ms(g[k]) if g else "" for k in (
                  "compute_ms", "communication_ms", "idle_ms")]),
              ms(r.baseline_ms), pct(r.error_pct), *[ms(b.get(r.rank)) for b in by],
              *([] if not s else [f"yes: the others waited {ms(s['wait_caused_ms'])} ms "
                                  "for it" if r.rank == s["rank"] else ""]))
    if gpu is not None:
        t.notes.append("compute, communication and GPU idle: the rank's GPU over a measured "
                       "iteration, ms per used iteration: busy with no collective running, a "
                       "collective kernel running (other work beside it or not), nothing "
                       "running; the three add up to the iteration's span in the trace")
    return t


def job_lines(d: PredictionResult) -> list[str]:
    out: list[str] = []
    j = d.job
    if j is None:
        return out
    c = j.collectives or {}
    if c.get("matched"):
        out.append(f"collectives: {c['matched']} matched across ranks "
                   f"({plural(c['kernels_joined'], 'kernel')}, {c['kernels_unmatched']} "
                   f"unmatched), {ms(c['waiting_ms'])} ms spent waiting for the last rank")
    s = j.straggler or {}
    if s:
        cause = ", ".join(f"{x['name']} {ms(x['ms'], 2)} ms" for x in s["cause"][:3])
        miss = (f" (only {j.world_size} of the job's {j.traced_world_size} ranks are "
                "traced)" if j.missing_ranks else "")
        out.append(f"straggler: rank {s['rank']} arrived last at {s['last_at']} of "
                   f"{plural(s['collectives'], 'collective')}; the others waited "
                   f"{ms(s['wait_caused_ms'])} ms for it{miss}; at {s['worst_collective']} "
                   f"it was {ms(s['late_by_ms'])} ms late (its trace started "
                   f"{ms(s['started_late_ms'])} ms after the first rank's); its work before: "
                   f"{cause}")
    return out


def gates_table(r: PredictionResult) -> Table | None:
    """The gates of a prediction, where the pipeline reports them."""
    if not r.gates:
        return None
    t = Table(f"Gates of {r.spec}", [Column("gate"), Column("passed"), Column("note")])
    for g in r.gates:
        t.add(g.name, "yes" if g.ok else "no", g.note or "")
    return t


# ---- printing -------------------------------------------------------------------------------

def emit(text: str = "") -> None:
    sys.stdout.write(text + ("" if text.endswith("\n") else "\n"))


def say(text: str, indent: str = "  ") -> None:
    emit(paragraph(text, width(), indent))


def print_tables(tables: list[Table | None]) -> None:
    w = width()
    for t in tables:
        if t is not None:
            emit(render(t, w))
            emit()


def print_prediction(results: PredictionResult | list[PredictionResult]) -> None:
    """The report of one replay, or of one or more predictions of one trace or job."""
    results = results if isinstance(results, list) else [results]
    d = results[0]
    preds = [r for r in results if r.predicted]
    job = d.job.name if d.job is not None else None
    head = f"job {job}" if job and job != d.trace_id else f"trace {d.trace_id}"
    say(f"{head}: {d.file}" if d.file else head)
    emit()
    print_tables([iterations_table(results), basis_table(d)])
    if preds:
        print_tables([predictions_table(results)])
    for r in preds:
        print_tables([phases_table(r), gates_table(r)])
        if r.notes:
            say(f"Notes on {r.spec}:")
            for note in r.notes:
                say(f"- {note}", "    ")
            emit()
    if d.job is not None and d.job.ranks:
        print_tables([ranks_table(results)])
        for line in job_lines(d):
            say(line)
        if not preds:
            for note in d.notes:
                say(f"note: {note}")
        emit()
    t = d.trace
    if t is not None and t.critical_path:
        print_tables([critical_path_table(t.critical_path)])
    if t is not None and t.unit_load:
        print_tables([units_table(t.unit_load)])
    if d.timeline_path:
        say(f"timeline written to {d.timeline_path} (open it in https://ui.perfetto.dev): "
            "measured, replayed" + (" and predicted" if preds else "") + " schedules, one "
            "process each")
    if d.plot_path:
        say(f"plot of iteration {d.plot_iteration} written to {d.plot_path}")


def prediction_csv(results: list[PredictionResult]) -> str:
    """``predict --format csv``: one row per prediction (the replay alone: one row)."""
    t = predictions_table(results)
    if not t.records:
        t.records = [prediction_record(results[0])]
    return to_csv([t])


def busy(what: str, enabled: bool | None = None):
    """A spinner on stderr saying WHAT runs (gone when done), on a terminal only (ENABLED:
    None asks whether stderr is one): for a command that may run more than a few seconds."""
    if not (sys.stderr.isatty() if enabled is None else enabled):
        return contextlib.nullcontext()
    from rich.console import Console
    return Console(stderr=True).status(what)


@contextlib.contextmanager
def fleet_progress(enabled: bool, description: str = "predicting"
                   ) -> Iterator[tuple[Callable[[int], None], Callable[..., None]]]:
    """A progress bar on stderr over steps ((trace, spec) pairs, or one trace's predictions):
    yields ``plan(total)`` and ``tick(next=None)``, ``next`` naming the step that starts."""
    if not enabled:
        yield (lambda n, first=None: None), (lambda next=None: None)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    progress = Progress("[progress.description]{task.description}", BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                        transient=True, console=Console(stderr=True))
    task = progress.add_task(description, total=None)

    def tick(next: str | None = None) -> None:
        progress.update(task, advance=1, **({"description": next} if next else {}))

    def plan(n: int, first: str | None = None) -> None:
        progress.update(task, total=n, **({"description": first} if first else {}))

    with progress:
        yield plan, tick


def fleet_table(t, top: int) -> tuple[Table, int]:
    """Prediction rows (``daydream.fleet.results``), best gain first: the table of the first
    TOP (0: all) and how many rows there are."""
    rows = t.to_pylist()
    shown = rows if top <= 0 else rows[:top]
    tab = Table("Predictions, best gain first (speedup: reference ms / predicted ms; "
                "interval: slack at zero to slack kept)",
                [Column("trace", key="trace_id"), Column("file"), Column("job"),
                 Column("optimization", key="spec"), Column("measured ms", "right"),
                 Column("replayed ms", "right"), Column("reference ms", "right"),
                 Column("predicted ms", "right"), Column("speedup", "right"),
                 Column("speedup interval", "right"), Column("gates failed")])
    for r in shown:
        sp = (r.get("speedup_low"), r.get("speedup_high"))
        failed = r.get("gates_failed")  # None: a row stored before gates were
        tab.add(r["trace_id"], short(r.get("file")), r.get("job") or "", r["spec"],
                ms(r["measured_ms"]), ms(r["baseline_ms"]), ms(r.get("reference_ms")),
                ms(r["predicted_ms"]),
                times(r["speedup"]), interval(sp if None not in sp else None, times),
                "?" if failed is None else ", ".join(failed) or "none")
    tab.records = [{k: v for k, v in r.items() if k != "created"} for r in shown]
    return tab, len(rows)


def print_fleet(t, top: int) -> None:
    tab, n = fleet_table(t, top)
    print_tables([tab])
    if len(tab.rows) < n:
        say(f"({n} rows, the first {len(tab.rows)} shown; all of them: daydream sql "
            "'SELECT * FROM prediction ORDER BY speedup DESC')")


def short(path: str | None) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1] if path else ""
