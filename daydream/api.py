"""The public Python API: thin functions chaining the stages. The CLI calls only these.

Predictions go through ``daydream.pipeline`` (as ``predict --all``'s workers do); this module
adds what only a caller on this machine wants: timelines, plots, the job's collectives kept.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from collect.api import collect, collect_steps
from collect.cli import collect_command
from daydream import jobs as _jobs
from daydream import pipeline
from daydream.traces import build_graphs, ingest, open_store, resolve_trace
from ingest import schema
from ingest.batch import expand
from ingest.errors import DaydreamError
from ingest.store import DEFAULT_STORE

__all__ = ["DaydreamError", "collect", "collect_command", "collect_steps", "expand", "ingest",
           "build_graphs", "info", "jobs", "predict", "resolve_trace", "open_store", "sql",
           "DEFAULT_STORE"]


def info(trace: str, store: str | Path | None = None) -> dict:
    """What the store knows of one trace: source, devices, table sizes and ingest counters."""
    st = open_store(store)
    tid = resolve_trace(trace, st)
    row = st.trace_row(tid)
    counts = {}
    for name in schema.COMMIT_ORDER:
        if name == "trace":
            continue
        counts[name] = st.read(name, tid).num_rows
    devices = orjson.loads(row["devices"]) if row["devices"] else None
    slack, iterations = _graph_slack(st, tid)
    return {
        "trace_id": tid,
        "file": row["file"],
        "source_format": row["source_format"],
        "source_version": row["source_version"],
        "events": row["events"],
        "start_ns": row["start_ns"],
        "end_ns": row["end_ns"],
        "rank": row["rank"],
        "world_size": row["world_size"],
        "job": row["job"],
        "devices": devices,
        "tables": counts,
        "stats": row["stats"],
        "iterations": iterations,
        "slack": slack,
    }


def _graph_slack(st, tid: str) -> tuple[list[dict], int | None]:
    """The graph's slack table (what it does not explain, per iteration and kind) and its
    iteration count; empty where the trace has no graph yet."""
    from graphstore import db
    if tid not in set(db.trace_ids(st.root)):
        return [], None
    t = db.run_sql(st.root, "SELECT iteration, kind, edges, slack_ns, early_ns FROM slack "
                   f"WHERE trace_id = '{tid}' ORDER BY iteration, kind")
    n = db.run_sql(st.root, f"SELECT count(*) FROM iteration WHERE trace_id = '{tid}'")
    return t.to_pylist(), int(n.column(0)[0].as_py())


def sql(query: str, store: str | Path | None = None, *, fmt: str = "table",
        out: str | Path | None = None) -> str:
    """Run read-only SQL over the graph tables, views and activity tables of a store."""
    from graphstore import db
    return db.query(open_store(store).root, query, fmt, None if out is None else Path(out))


def predict(trace: str, store: str | Path | None = None, *, opts: list[str] | None = None,
            timeline: str | Path | None = None, plot: str | Path | None = None,
            param_bytes: int | None = None) -> dict:
    """Baseline replay (and, with ``opts``, a what-if prediction) of one trace or job.

    TRACE is a trace file (ingested on the fly if the store lacks it), a stored trace id, a
    job name or a folder of rank traces (``daydream.pipeline.resolve``). ``opts`` are chained
    with ``+``. ``timeline``: a Chrome trace (Perfetto) of the measured and simulated
    schedules; ``plot``: a PNG of the phase breakdown and one iteration's timeline, before and
    after (``daydream.plot``); both for a trace, not a job."""
    st = open_store(store)
    s = pipeline.resolve(trace, st)
    if s.job is not None and (timeline is not None or plot is not None):
        raise DaydreamError(f"{trace} is a job: --timeline and --plot draw one trace; give "
                            "one of its traces")
    p = pipeline.predict(s, "+".join(opts) if opts else None, param_bytes=param_bytes)
    for jg in p.job_graphs:
        _jobs.store_collectives(st, jg)
    out = p.result
    if timeline is not None:
        _timeline(timeline, p)
    if plot is not None:
        _plot(plot, p)
    return out


def _timeline(path: str | Path, p: pipeline.Prediction) -> None:
    from simulate.timeline import write_timeline

    g, out = p.subject.tables, p.result
    t0 = int(g["task"]["start_ns"][0].as_py())
    obs_s = g["task"]["start_ns"].to_numpy() - t0
    obs_e = obs_s + g["task"]["obs_dur_ns"].to_numpy()
    write_timeline(path, g, [("measured", obs_s, obs_e),
                             ("simulated (baseline)", p.base.schedule.start_ns,
                              p.base.schedule.end_ns)])
    if p.pred is not None:
        # the rewritten graph has its own task ids: a timeline file of its own beside it
        p2 = Path(path).with_name(Path(path).stem + ".predicted.json")
        write_timeline(p2, p.rewritten, [(f"predicted ({out['opts']})",
                                          p.pred.schedule.start_ns, p.pred.schedule.end_ns)])
        out["predicted_timeline"] = str(p2)
    out["timeline"] = str(path)


def _plot(path: str | Path, p: pipeline.Prediction) -> None:
    from daydream import plot as _pl
    out, g, base, pred = p.result, p.subject.tables, p.base, p.pred
    phases = out.get("phases") or {"baseline": pipeline.phase_ms(g, base)}
    used_b = [i.index for i in base.iterations if i.used]
    used_p = [i.index for i in pred.iterations if i.used] if pred is not None else used_b
    it = _pl.plot_iteration(used_b, used_p)
    after = None
    title = f"{Path(out['file']).name}: baseline {out['baseline_ms']:.2f} ms"
    if pred is not None:
        after = (p.rewritten, pred.schedule.start_ns, pred.schedule.end_ns,
                 f"predicted ({out['opts']})")
        title += f", predicted {out['predicted_ms']:.2f} ms with {out['opts']}"
    _pl.write_plot(path, phases, (g, base.schedule.start_ns, base.schedule.end_ns,
                                  "baseline (replay)"), after, it, title=title)
    out["plot"] = str(path)
    out["plot_iteration"] = it


def jobs(store: str | Path | None = None) -> dict[str, list[dict]]:
    """The store's jobs (the traces of all ranks of one run): name -> rank, trace_id, file."""
    return {k: [{"rank": m.rank, "trace_id": m.trace_id, "file": m.file} for m in v]
            for k, v in _jobs.find(open_store(store)).items()}
