"""The public Python API: thin functions chaining the stages. The CLI calls only these."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import orjson

from collect.api import collect, collect_steps
from collect.cli import collect_command
from daydream import jobs as _jobs
from ingest import schema, source
from ingest.batch import FileResult, IngestReport, expand
from ingest.batch import ingest as _ingest
from ingest.errors import DaydreamError
from ingest.store import DEFAULT_STORE, Store

__all__ = ["DaydreamError", "collect", "collect_command", "collect_steps", "expand", "ingest",
           "info", "jobs", "predict", "resolve_trace", "open_store", "sql", "DEFAULT_STORE"]


def open_store(store: str | Path | None = None) -> Store:
    return Store(Path(store) if store is not None else DEFAULT_STORE)


def ingest(paths: Iterable[str | Path], store: str | Path | None = None, *,
           jobs: int | None = None, force: bool = False, strict: bool = False,
           job: str | None = None,
           on_progress: Callable[[FileResult], None] | None = None,
           ray: str | None = None) -> IngestReport:
    """Convert trace files into the store's activity tables (``ingest.batch.ingest``) and build
    their dependency graphs (``graphstore.load``): each worker (``jobs`` local processes, or Ray
    tasks with ``ray``) converts a file and builds its graph; this process commits the traces
    and writes the graphs to DuckDB in batches. Then builds any stored trace's missing graph."""
    from graphstore import load as gload

    st = open_store(store)
    st.root.mkdir(parents=True, exist_ok=True)
    loader = gload.Loader(st)

    def tick(r: FileResult) -> None:
        extra = r.extra or {}
        if extra.get("graph_error"):
            r.status, r.error = "failed", f"{r.path}: graph: {extra['graph_error']}"
            if strict:
                raise DaydreamError(r.error)
        elif extra.get("graph"):
            loader.add(r.trace_id, extra.pop("graph"))
        if on_progress:
            on_progress(r)

    try:
        rep = _ingest(paths, st, jobs=jobs, force=force, strict=strict, job=job,
                      on_progress=tick, ray=ray, hook=gload.stage_graph)
    except KeyboardInterrupt:
        loader.flush()  # keep the graphs of the traces already committed
        raise
    loader.flush()
    build_graphs(st, rep, strict=strict, skip=loader.loaded)
    return rep


def build_graphs(st: Store, rep: IngestReport | None = None, *, strict: bool = False,
                 skip: set[str] | frozenset = frozenset()) -> list[str]:
    """Build graphs for stored traces that have none (or were just re-ingested), except those in
    ``skip`` (built already). A trace whose graph fails its checks is reported as failed in
    ``rep``; its activity tables stay."""
    from graphstore import load as gload

    todo = set(gload.missing(st.root))
    by_id = {}
    if rep is not None:
        for r in rep.results:
            if r.trace_id:
                by_id.setdefault(r.trace_id, r)
                if r.status == "ingested":
                    todo.add(r.trace_id)
                elif r.status == "failed" and r.extra:  # its graph failed in the worker
                    todo.discard(r.trace_id)
    todo -= set(skip)
    built = []
    for tid in sorted(todo):
        try:
            gload.load(st.root, tid)
            built.append(tid)
        except DaydreamError as e:
            r = by_id.get(tid)
            msg = f"{r.path if r else tid}: graph: {e}"
            if r is not None:
                r.status, r.error = "failed", msg
            if strict or r is None:
                raise DaydreamError(msg) from None
    return built


def resolve_trace(trace: str, store: Store, *, ingest_missing: bool = False) -> str:
    """A trace id from an id, a unique id prefix, or a file (hashed; ingested if asked)."""
    p = Path(trace)
    if p.is_file():
        tid = source.content_id(p)
        if not store.has_trace(tid):
            if not ingest_missing:
                raise DaydreamError(f"not in store {store.root}; run `daydream ingest` first",
                                    file=trace)
            rep = _ingest([p], store, jobs=1, strict=True)
            if rep.failed:
                raise DaydreamError(rep.failed[0].error or "ingest failed")
        return tid
    ids = store.trace_ids()
    hits = [t for t in ids if t.startswith(trace)]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise DaydreamError(f"no trace file or stored trace id matches {trace!r} "
                            f"(store {store.root} holds {len(ids)} traces)")
    raise DaydreamError(f"trace id prefix {trace!r} is ambiguous: {', '.join(hits[:5])}")


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
    }


def sql(query: str, store: str | Path | None = None, *, fmt: str = "table",
        out: str | Path | None = None) -> str:
    """Run read-only SQL over the graph tables, views and activity tables of a store."""
    from graphstore import db
    return db.query(open_store(store).root, query, fmt, None if out is None else Path(out))


def predict(trace: str, store: str | Path | None = None, *, opts: list[str] | None = None,
            timeline: str | Path | None = None, plot: str | Path | None = None,
            param_bytes: int | None = None) -> dict:
    """Baseline replay (and, with ``opts``, a what-if prediction) of one trace.

    TRACE is a trace file (ingested on the fly if the store lacks it) or a stored trace id.
    ``plot``: a PNG file for the phase breakdown and one iteration's timeline, before and
    after (``daydream.plot``)."""
    from graphstore.read import read_graph
    from simulate.replay import replay
    from simulate.timeline import write_timeline

    st = open_store(store)
    job = _jobs.resolve(trace, st, lambda p: _ingest_folder(p, st))
    if job is not None:  # the traces of all ranks of one run
        if not (st.root / "graph.duckdb").exists() or not {m.trace_id for m in job[1]} <= \
                _graph_ids(st):
            build_graphs(st, strict=True)
        jg = _jobs.build(st, *job)
        return _jobs.predict_job(st, jg, opts, _trace_device(st, job[1][0].trace_id, None),
                                 param_bytes)
    tid = resolve_trace(trace, st, ingest_missing=True)
    if not (st.root / "graph.duckdb").exists() or tid not in _graph_ids(st):
        build_graphs(st, strict=True)
    g = read_graph(st.root, tid)
    base = replay(g)
    t0 = int(g["task"]["start_ns"][0].as_py())
    out = {
        "trace_id": tid,
        "file": st.trace_row(tid)["file"],
        "measured_ms": base.mean("measured_ns") / 1e6,
        "baseline_ms": base.mean("simulated_ns") / 1e6,
        "iterations": [{"index": i.index, "label": i.label,
                        "measured_ms": i.measured_ns / 1e6,
                        "baseline_ms": i.simulated_ns / 1e6,
                        "error_pct": _err(i.simulated_ns, i.measured_ns),
                        "used": i.used, **({"note": i.note} if i.note else {})}
                       for i in base.iterations],
        "critical_path": base.critical_path,
        "units": base.unit_busy,
    }
    out["baseline_error_pct"] = _err(out["baseline_ms"], out["measured_ms"])
    pred = g2 = None
    if opts:
        from transforms import Context, rewrite
        spec = "+".join(opts)
        notes: list[str] = []
        g2 = rewrite(g, spec, Context(device=_trace_device(st, tid, g), notes=notes,
                                      activity=lambda name: st.read(name, tid),
                                      world_size=st.trace_row(tid)["world_size"],
                                      param_bytes=param_bytes))
        pred = replay(g2)
        out["opts"] = spec
        out["notes"] = notes
        fill_predicted(out, base, pred)
        out["phases"] = {"baseline": _phase_ms(g, base), "predicted": _phase_ms(g2, pred)}
        out["predicted_critical_path"] = pred.critical_path
    _jobs.add_device_ranks(out, st, tid, g, opts, _trace_device(st, tid, g), param_bytes)
    if timeline is not None:
        obs_s = g["task"]["start_ns"].to_numpy() - t0
        obs_e = obs_s + g["task"]["obs_dur_ns"].to_numpy()
        scheds = [("measured", obs_s, obs_e),
                  ("simulated (baseline)", base.schedule.start_ns, base.schedule.end_ns)]
        write_timeline(timeline, g, scheds)
        if pred is not None:
            # the rewritten graph has its own task ids: a timeline file of its own beside it
            p2 = Path(timeline).with_name(Path(timeline).stem + ".predicted.json")
            write_timeline(p2, g2, [(f"predicted ({out['opts']})", pred.schedule.start_ns,
                                     pred.schedule.end_ns)])
            out["predicted_timeline"] = str(p2)
        out["timeline"] = str(timeline)
    if plot is not None:
        _plot(plot, out, g, base, g2, pred)
    return out


def fill_predicted(out: dict, base, pred) -> None:
    """Put a prediction into a predict result: ``predicted_ms`` (the mean over the iterations
    the baseline uses), ``speedup``, and each iteration's ``predicted_ms``."""
    by_idx = {i.index: i for i in pred.iterations}
    used = [i.index for i in base.iterations if i.used]
    p_used = [by_idx[k].simulated_ns for k in used if k in by_idx]
    out["predicted_ms"] = float(sum(p_used) / len(p_used) / 1e6) if p_used else None
    out["speedup"] = (out["baseline_ms"] / out["predicted_ms"]
                      if out["predicted_ms"] else None)
    for it in out["iterations"]:
        p = by_idx.get(it["index"])
        it["predicted_ms"] = p.simulated_ns / 1e6 if p else None


def _plot(path: str | Path, out: dict, g, base, g2, pred) -> None:
    from daydream import plot as _pl
    phases = out.get("phases") or {"baseline": _phase_ms(g, base)}
    used_b = [i.index for i in base.iterations if i.used]
    used_p = [i.index for i in pred.iterations if i.used] if pred is not None else used_b
    it = _pl.plot_iteration(used_b, used_p)
    after = None
    title = f"{Path(out['file']).name}: baseline {out['baseline_ms']:.2f} ms"
    if pred is not None:
        after = (g2, pred.schedule.start_ns, pred.schedule.end_ns, f"predicted ({out['opts']})")
        title += f", predicted {out['predicted_ms']:.2f} ms with {out['opts']}"
    _pl.write_plot(path, phases, (g, base.schedule.start_ns, base.schedule.end_ns,
                                  "baseline (replay)"), after, it, title=title)
    out["plot"] = str(path)
    out["plot_iteration"] = it


def jobs(store: str | Path | None = None) -> dict[str, list[dict]]:
    """The store's jobs (the traces of all ranks of one run): name -> rank, trace_id, file."""
    return {k: [{"rank": m.rank, "trace_id": m.trace_id, "file": m.file} for m in v]
            for k, v in _jobs.find(open_store(store)).items()}


def _ingest_folder(path: Path, st: Store) -> list[str]:
    """Ingest a folder of rank traces (execution traces beside them skipped); their ids."""
    files = [f for f in expand([path]) if ".et." not in Path(f).name]
    rep = _ingest(files, st, jobs=None, strict=True)
    build_graphs(st, rep, strict=True)
    return sorted({r.trace_id for r in rep.results if r.trace_id})


def _trace_device(st: Store, tid: str, g) -> dict | None:
    """The device properties of the GPU the trace's streams ran on, when the trace has them."""
    row = st.trace_row(tid)
    devs = orjson.loads(row["devices"]) if row["devices"] else []
    used = set(g["unit"]["device"].drop_null().to_pylist()) if g is not None else set()
    return next((d for d in devs if d.get("id") in used), devs[0] if devs else None)


def _phase_ms(g, rep, ranks: int = 1) -> dict:
    """Time per phase over the used iterations (GPU and CPU busy time), ms per iteration (and
    per rank, for a job graph of RANKS ranks)."""
    import numpy as np

    from graphstore.schema import GPU_KINDS
    task = g["task"]
    used = {i.index for i in rep.iterations if i.used}
    it = task["iteration"].fill_null(-1).to_numpy()
    mask = np.isin(it, list(used))
    held = (rep.schedule.end_ns - rep.schedule.start_ns)[mask]
    phase = np.asarray(task["phase"].fill_null("other").to_pylist(), object)[mask]
    kind = np.asarray(task["kind"].to_pylist(), object)[mask]
    gpu = np.isin(kind, GPU_KINDS)
    out = {}
    for ph in sorted(set(phase)):
        sel = phase == ph
        per = 1e6 * max(len(used), 1) * max(ranks, 1)
        out[ph] = {"gpu_ms": float(held[sel & gpu].sum() / per),
                   "cpu_ms": float(held[sel & ~gpu].sum() / per)}
    return out


def _err(pred: float, meas: float) -> float | None:
    return None if not meas else 100.0 * (pred - meas) / meas


def _graph_ids(st: Store) -> set[str]:
    from graphstore import db
    return set(db.trace_ids(st.root))
