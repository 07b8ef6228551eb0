"""The public Python API: thin functions chaining the stages. The CLI calls only these.

Predictions go through ``daydream.pipeline`` (as ``predict --all``'s workers do); this module
adds what only a caller on this machine wants: timelines, plots, the job's collectives kept.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING

from daydream.base.errors import DaydreamError
from daydream.base.store import DEFAULT_STORE
from daydream.traces import build_graphs, ingest, open_store, resolve_trace

# collect, collect_command, collect_steps and expand come from __getattr__ below
__all__ = ["DaydreamError", "collect", "collect_command", "collect_steps", "expand", "ingest",  # noqa: F822
           "build_graphs", "info", "jobs", "predict", "predictions", "run", "resolve_trace",
           "open_store", "sql", "DEFAULT_STORE"]

if TYPE_CHECKING:
    from daydream import pipeline
    from daydream.graphstore.prediction import PredictionResult

# The prediction pipeline (the simulator's compiled core, the transforms), the job code and
# the collector are imported by the functions that use them, so that ``daydream sql`` and
# ``daydream ingest`` start without them.


def __getattr__(name: str):
    """The collector's entry points (``collect``, ``collect_steps``, ``collect_command``) and
    ``expand`` (ingest.files), imported on first use (PEP 562)."""
    if name == "expand":
        from daydream.ingest.files import expand
        return expand
    if name in ("collect", "collect_steps"):
        from daydream.collect import api as _collect
        return getattr(_collect, name)
    if name == "collect_command":
        from daydream.collect.cli import collect_command
        return collect_command
    raise AttributeError(f"module 'daydream.api' has no attribute {name!r}")


def info(target: str, store: str | Path | None = None) -> dict:
    """What the store knows of one trace (source, span, iterations, the devices its streams
    ran on, table sizes, ingest counters, the graph's slack), or of one job (its ranks, the
    ranks it lacks, and each rank's trace as above)."""
    from daydream import jobs as _jobs
    st = open_store(store)
    job = _jobs.resolve(target, st)
    if job is not None:
        return _job_info(st, *job)
    return _trace_info(st, resolve_trace(target, st))


def _trace_info(st, tid: str) -> dict:
    from daydream.ingest.store import devices_of
    row = st.trace_row(tid)
    counts = {k: n for k, n in st.table_rows(tid).items() if k != "trace"}
    listed = devices_of(row["devices"]) or []
    g = _graph_facts(st, tid)
    used = g.get("devices_used")
    if used is None:  # no graph yet: what the trace lists
        devices = listed or None
    else:
        by_id = {d.get("id"): d for d in listed}
        devices = [by_id.get(i, {"id": i, "name": None}) for i in used]
    start, end = row["start_ns"], row["end_ns"]
    if start is None and g.get("start_ns") is not None:  # readers that record no window
        start, end = g["start_ns"], g["end_ns"]
    return {
        "trace_id": tid,
        "file": row["file"],
        "source_format": row["source_format"],
        "source_version": row["source_version"],
        "events": row["events"],
        "start_ns": start,
        "end_ns": end,
        "span_ms": (end - start) / 1e6 if start is not None and end is not None else None,
        "rank": row["rank"],
        "world_size": row["world_size"],
        "job": row["job"],
        "devices": devices,
        "devices_listed": len(listed),
        "tables": counts,
        "stats": row["stats"],
        "iterations": g.get("iterations"),
        "iterations_from": g.get("iterations_from"),
        "slack": g.get("slack", []),
    }


def _job_info(st, name: str, members: list) -> dict:
    ranks = [{"rank": m.rank, **_trace_info(st, m.trace_id)} for m in members]
    world = max((r["world_size"] or 0 for r in ranks), default=0) or len(ranks)
    have = {m.rank for m in members}
    return {"job": name, "world_size": world, "ranks_present": len(members),
            "missing_ranks": [r for r in range(world) if r not in have],
            "ranks": ranks}


def _graph_facts(st, tid: str) -> dict:
    """From the trace's graph: its slack table (what it does not explain, per iteration and
    kind), iteration count and how they were found, the devices its streams ran on, and its
    span; empty where the trace has no graph yet."""
    from daydream.graphstore import db
    if not db.db_path(st.root).exists():
        return {}
    # one connection for all (each opened connection attaches and checks the file), and rows
    # as tuples: no Arrow table for a handful of values
    with db.connect(st.root) as con:
        if not db.has_graph(con, tid):
            return {}

        def q(sql: str) -> list[dict]:
            cur = con.execute(sql, [tid])
            names = [c[0] for c in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        slack = q("SELECT iteration, kind, edges, slack_ns, early_ns FROM slack "
                  "WHERE trace_id = ? ORDER BY iteration, kind")
        its = q("SELECT count(*) AS n, min(source) AS source FROM iteration "
                "WHERE trace_id = ?")[0]
        devs = q("SELECT DISTINCT device FROM unit WHERE trace_id = ? AND kind = 'stream' "
                 "AND device IS NOT NULL ORDER BY device")
        span = q("SELECT min(start_ns) AS a, max(start_ns + obs_dur_ns) AS b FROM task "
                 "WHERE trace_id = ? AND task_id > 0")[0]
    return {"slack": slack, "iterations": int(its["n"]), "iterations_from": its["source"],
            "devices_used": [int(d["device"]) for d in devs],
            "start_ns": span["a"], "end_ns": span["b"]}


def sql(query: str, store: str | Path | None = None, *, fmt: str = "table",
        out: str | Path | None = None) -> str:
    """Run read-only SQL over the graph tables, views and activity tables of a store."""
    from daydream.graphstore import sql_query
    return sql_query.query(open_store(store).root, query, fmt, None if out is None else Path(out))


def predict(trace: str, store: str | Path | None = None, *,
            opts: str | list[str] | None = None, timeline: str | Path | None = None,
            plot: str | Path | None = None, param_bytes: int | None = None
            ) -> PredictionResult:
    """The replay of one trace or job, and with ``opts`` one what-if prediction of it
    (``daydream.graphstore.prediction.PredictionResult``; ``as_dict()`` is what
    ``daydream predict --json`` prints).

    TRACE is a trace file (ingested on the fly if the store lacks it), a stored trace id, a
    job name or a folder of rank traces (``daydream.pipeline.resolve``). ``opts``: one spec,
    optimizations chained with ``+`` (``"amp+fused_adam"``), or a list holding one; several
    separate predictions are ``predictions``, as several ``--opt`` flags are. ``timeline``:
    one Chrome trace (Perfetto) of the measured, replayed and predicted schedules;
    ``plot``: a PNG of the phase breakdown and one iteration's timeline, before and after
    (``daydream.plot``)."""
    specs = _specs(opts)
    if len(specs) > 1:
        raise DaydreamError(f"predict makes one prediction, got {len(specs)} specs: chain "
                            "optimizations with '+' (" + "+".join(specs) + "), or call "
                            "daydream.api.predictions for separate ones")
    return predictions(trace, store, specs, timeline=timeline, plot=plot,
                       param_bytes=param_bytes)[0]


def predictions(trace: str, store: str | Path | None = None,
                specs: str | list[str] | None = None, *, timeline: str | Path | None = None,
                plot: str | Path | None = None, param_bytes: int | None = None,
                timeline_iterations: str | None = None, timeline_window: str | None = None
                ) -> list[PredictionResult]:
    """One prediction per spec of SPECS (each a chain of ``+``), all of one trace or job, its
    baseline replayed once; the replay alone when SPECS is empty. ``timeline`` and ``plot``
    hold every one of them (see ``predict``); ``timeline_iterations`` ("N" or "A-B") and
    ``timeline_window`` ("START-END", ms from the trace start) cut the timeline."""
    return [p.result for p in run(trace, store, specs, timeline=timeline, plot=plot,
                                  param_bytes=param_bytes,
                                  timeline_iterations=timeline_iterations,
                                  timeline_window=timeline_window)]


def run(trace: str, store: str | Path | None = None, specs: str | list[str] | None = None, *,
        timeline: str | Path | None = None, plot: str | Path | None = None,
        param_bytes: int | None = None, timeline_iterations: str | None = None,
        timeline_window: str | None = None, on_plan=None, on_step=None,
        steps_after: int = 0) -> list[pipeline.Prediction]:
    """``predictions`` with the pipeline's ``Prediction`` objects (the graphs and schedules
    behind each result, which the HTML report draws). ``on_plan(steps, first)``, ``on_step(
    next)``: progress over the predictions, as ``advise.advise`` gives it (with STEPS_AFTER
    steps of the caller's after them)."""
    from daydream import jobs as _jobs
    from daydream import pipeline
    from daydream.transforms.registry import check
    specs = _specs(specs)
    for spec in specs:
        check(spec)  # every spec error before any work
    st = open_store(store)
    s = pipeline.resolve(trace, st)
    todo = specs or [None]
    if on_plan is not None:
        on_plan(len(todo) + steps_after, f"predicting {todo[0] or 'the replay'}")
    ps = []
    for k, spec in enumerate(todo):
        ps.append(pipeline.predict(s, spec, param_bytes=param_bytes))
        if on_step is not None and (k + 1 < len(todo) or not steps_after):
            on_step(f"predicting {todo[k + 1]}" if k + 1 < len(todo) else None)
    seen: set[int] = set()
    for p in ps:
        for jg in p.job_graphs:
            if id(jg) not in seen:
                seen.add(id(jg))
                _jobs.store_collectives(st, jg)
    if timeline is not None:
        _timeline(timeline, ps, iterations=_span(timeline_iterations, "--timeline-iterations",
                                                 int),
                  window=_span(timeline_window, "--timeline-window", float))
    if plot is not None:
        draw_plot(plot, ps)
    return ps


def _specs(opts: str | list[str] | None) -> list[str]:
    if opts is None:
        return []
    opts = [opts] if isinstance(opts, str) else list(opts)
    return [o.strip() for o in opts if o and o.strip()]


def _span(text: str | None, what: str, kind) -> tuple | None:
    """'N' or 'A-B' as (A, B) of KIND; None for None; an error naming WHAT otherwise."""
    if text is None:
        return None
    a, sep, b = text.strip().partition("-")
    try:
        lo = kind(a)
        hi = kind(b) if sep else lo
    except ValueError:
        raise DaydreamError(f"{what} {text!r}: give N or A-B") from None
    if hi < lo or lo < 0:
        raise DaydreamError(f"{what} {text!r}: A-B with 0 <= A <= B")
    return lo, hi


def _ops(s, g: dict, t0: int) -> dict | None:
    """The trace's CPU operators (``cpu_op`` and ``user_annotation`` ranges) for the measured
    schedule of the timeline: each on the unit of its thread, times from T0; None for a job
    or a trace without ranges."""
    if s.job is not None or s.activity is None:
        return None
    try:
        r = s.activity("range")
    except DaydreamError:
        return None
    if r is None or r.num_rows == 0:
        return None
    import numpy as np
    import pyarrow.compute as pc
    r = r.filter(pc.is_in(r["kind"].cast("string"),
                          value_set=pa_array(["cpu_op", "user_annotation"])))
    units = {n: i for i, n in enumerate(g["unit"]["name"].to_pylist())}
    pid, tid = r["pid"].to_pylist(), r["tid"].to_pylist()
    unit = np.array([units.get(f"thread {a}:{b}", -1) for a, b in zip(pid, tid, strict=True)],
                    np.int64)
    name = r["name"]
    if hasattr(name.type, "value_type"):
        name = name.cast(name.type.value_type)
    return {"unit": unit, "start_ns": r["start_ns"].to_numpy() - t0,
            "dur_ns": r["dur_ns"].to_numpy(), "name": name.to_pylist()}


def pa_array(values: list[str]):
    import pyarrow as pa
    return pa.array(values, pa.string())


def _timeline(path: str | Path, ps: list[pipeline.Prediction], *,
              iterations: tuple[int, int] | None = None,
              window: tuple[float, float] | None = None) -> None:
    """One Chrome trace: the measured schedule, its replay and every prediction, each a
    process of its own (a rewritten graph has its own tasks, so it carries its graph).
    ITERATIONS (first, last) or WINDOW (ms from the trace start): only those tasks."""
    from daydream.simulate.timeline import write_timeline

    p0 = ps[0]
    g = p0.subject.tables
    t0 = int(g["task"]["start_ns"][0].as_py())
    obs_s = g["task"]["start_ns"].to_numpy() - t0
    obs_e = obs_s + g["task"]["obs_dur_ns"].to_numpy()
    scheds = [("measured", obs_s, obs_e, g),
              ("replayed (baseline)", p0.base.schedule.start_ns, p0.base.schedule.end_ns, g)]
    scheds += [(f"predicted: {p.result.spec}", p.pred.schedule.start_ns,
                p.pred.schedule.end_ns, p.rewritten) for p in ps if p.pred is not None]
    its = None if iterations is None else list(range(iterations[0], iterations[1] + 1))
    if its is not None and not any(i.index in its for i in p0.result.iterations):
        raise DaydreamError(f"--timeline-iterations: the trace has iterations 0-"
                            f"{len(p0.result.iterations) - 1}")
    win = None if window is None else (int(window[0] * 1e6), int(window[1] * 1e6))
    write_timeline(path, g, scheds, iterations=its, window_ns=win,
                   ops=_ops(p0.subject, g, t0))
    for p in ps:
        p.result = replace(p.result, timeline_path=str(path))


def draw_plot(path: str | Path | IO[bytes], ps: list[pipeline.Prediction]) -> int | None:
    """The --plot picture of PS (a replay, or predictions of one subject) into PATH (a file
    name or a binary file); returns the iteration drawn."""
    from daydream import pipeline
    from daydream import plot as _pl
    p0 = ps[0]
    out, g, base = p0.result, p0.subject.tables, p0.base
    used_b = [i.index for i in base.iterations if i.used]
    used_p = used_b
    for p in ps:
        if p.pred is not None:
            used_p = [i for i in used_p if i in {x.index for x in p.pred.iterations if x.used}]
    it = _pl.plot_iteration(used_b, used_p)
    name = Path(out.file).name if out.file else out.trace_id
    title = f"{name}: baseline {out.baseline_ms:.2f} ms"
    after, bars = [], []
    for p in ps:
        if p.pred is None:
            continue
        after.append((p.rewritten, p.pred.schedule.start_ns, p.pred.schedule.end_ns,
                      f"predicted: {p.result.spec}"))
        bars.append((p.result.spec, p.result.phases.as_dict()["predicted"]))
        title += f"; {p.result.spec} {p.result.predicted_ms:.2f} ms"
    baseline_phases = (p0.result.phases.as_dict()["baseline"] if p0.result.phases else None) \
        or pipeline.phase_ms(g, base, len(p0.subject.job.members) if p0.subject.job else 1)
    def step(rep) -> float | None:  # the drawn iteration's step in that schedule, ms
        x = next((i for i in rep.iterations if i.index == it), None)
        return None if x is None else x.simulated_ns / 1e6
    steps = [step(base)] + [step(p.pred) for p in ps if p.pred is not None]
    _pl.write_plot(path, {"baseline": baseline_phases, "predicted": bars},
                   (g, base.schedule.start_ns, base.schedule.end_ns, "baseline (replay)"),
                   after, it, title=title, steps=steps)
    if not isinstance(path, str | Path):
        return it
    for p in ps:
        p.result = replace(p.result, plot_path=str(path), plot_iteration=it)
    return it


def jobs(store: str | Path | None = None) -> dict[str, list[dict]]:
    """The store's jobs (the traces of the ranks of one run): name -> its ranks (rank,
    trace_id, file, and the world size the trace records)."""
    from daydream import jobs as _jobs
    st = open_store(store)
    return {k: [{"rank": m.rank, "trace_id": m.trace_id, "file": m.file,
                 "world_size": st.trace_row(m.trace_id)["world_size"]} for m in v]
            for k, v in _jobs.find(st).items()}
