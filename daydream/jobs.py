"""Jobs in the public API: the traces of all ranks of one run predicted together.

``find`` lists a store's jobs; ``resolve`` turns what the user typed (a job name, a folder of
rank traces, or one multi-device trace) into a job; ``predict_job`` is ``api.predict`` for it.
"""

from __future__ import annotations

from pathlib import Path

from ingest.errors import DaydreamError
from ingest.store import Store


def trace_rows(st: Store, ids: list[str] | None = None) -> list[dict]:
    return [{**st.trace_row(t), "trace_id": t} for t in (ids if ids is not None
                                                          else st.trace_ids())]


def find(st: Store) -> dict:
    """name -> members (``graphstore.job.Member``) of every job in the store."""
    from graphstore.job import find_jobs
    return find_jobs(trace_rows(st))


def resolve(target: str, st: Store, ingest_folder) -> tuple[str, list] | None:
    """(job name, members) when TARGET names a job in the store or is a folder whose traces
    form one job (ingested first through ``ingest_folder(path)``); else None."""
    from graphstore.job import find_jobs
    p = Path(target)
    if p.is_dir():
        ids = ingest_folder(p)
        jobs = find_jobs(trace_rows(st, ids))
        if len(jobs) == 1:
            return next(iter(jobs.items()))
        if not jobs:
            raise DaydreamError(f"the traces in {target} do not form a job: they need a rank "
                                "and world size (distributedInfo) or `daydream ingest --job "
                                "NAME`", file=target)
        raise DaydreamError(f"the traces in {target} form several jobs: {', '.join(jobs)}; "
                            "predict one by name", file=target)
    if p.exists() or any(t.startswith(target) for t in st.trace_ids()):
        return None  # a trace file or a stored trace id
    jobs = find(st)
    if target in jobs:
        return target, jobs[target]
    return None


def build(st: Store, name: str, members: list):
    """The job graph of stored traces (``graphstore.job.build_job``)."""
    from graphstore.job import build_job
    from graphstore.read import read_graph
    graphs = [read_graph(st.root, m.trace_id) for m in members]
    kernels = [st.read("kernel", m.trace_id) for m in members]
    return build_job(name, members, graphs, kernels)


def store_collectives(st: Store, jg) -> int:
    """Keep the job's matched collectives in the ``collective`` table of graph.duckdb (one row
    per rank and collective, replacing the job's earlier rows), so SQL can ask which rank
    waited where. Returns rows written."""
    import datetime as dt

    import pyarrow as pa

    from graphstore import db
    from graphstore.schema import COLLECTIVE
    c = jg.collective
    if not c.height:
        return 0
    tid = {m.rank: m.trace_id for m in jg.members}
    now = dt.datetime.now(dt.UTC)
    rows = c.select("comm", "seq", "type", "rank", "trace_task_id", "bytes", "start_ns",
                    "wait_ns", "transfer_ns").to_dict(as_series=False)
    n = c.height
    t = pa.table({"job": [jg.name] * n, "comm": rows["comm"], "seq": rows["seq"],
                  "type": rows["type"], "rank": rows["rank"],
                  "trace_id": [tid[r] for r in rows["rank"]], "task_id": rows["trace_task_id"],
                  "bytes": rows["bytes"], "arrival_ns": rows["start_ns"],
                  "wait_ns": rows["wait_ns"], "transfer_ns": rows["transfer_ns"],
                  "created": [now] * n}, schema=COLLECTIVE.arrow_schema())
    return db.write_results(st.root, "collective", t, ("job",))


def _err(pred: float, meas: float) -> float | None:
    return None if not meas else 100.0 * (pred - meas) / meas


def _its(rep) -> list[dict]:
    return [{"index": i.index, "label": i.label, "measured_ms": i.measured_ns / 1e6,
             "baseline_ms": i.simulated_ns / 1e6, "error_pct": _err(i.simulated_ns,
                                                                      i.measured_ns),
             "used": i.used, **({"note": i.note} if i.note else {})} for i in rep.iterations]


def predict_job(st: Store, jg, opts: list[str] | None, device: dict | None,
                param_bytes: int | None = None) -> dict:
    """Replay of a job (and, with ``opts``, a prediction): job and per-rank iteration times,
    collectives, straggler."""
    from simulate.job import replay_job
    base = replay_job(jg.tables)
    store_collectives(st, jg)
    c = jg.collective
    files = sorted({m.file for m in jg.members if m.file})
    out = {
        "trace_id": jg.name,
        "job": jg.name,
        "file": str(Path(files[0]).parent) if len(files) > 1 else (files[0] if files else ""),
        "world_size": len(jg.members),
        "measured_ms": base.mean("measured_ns") / 1e6,
        "baseline_ms": base.mean("simulated_ns") / 1e6,
        "iterations": _its(base),
        "ranks": [{"rank": m.rank, "trace_id": m.trace_id,
                   "measured_ms": base.rank_mean(m.rank, "measured_ns") / 1e6,
                   "baseline_ms": base.rank_mean(m.rank, "simulated_ns") / 1e6,
                   "error_pct": _err(base.rank_mean(m.rank, "simulated_ns"),
                                     base.rank_mean(m.rank, "measured_ns"))}
                  for m in jg.members],
        "collectives": {"matched": int(c["coll"].n_unique()) if c.height else 0,
                        "kernels_joined": c.height, "kernels_unmatched": jg.unmatched,
                        "by_type": dict(sorted(c.group_by("type").agg(
                            pl_n_unique("coll")).iter_rows())) if c.height else {},
                        "waiting_ms": float(c["wait_ns"].sum()) / 1e6 if c.height else 0.0},
        "clock_offsets_ns": {str(k): v for k, v in sorted(jg.clock_offset_ns.items())},
        "notes": list(jg.notes),
        "straggler": base.straggler,
    }
    out["baseline_error_pct"] = _err(out["baseline_ms"], out["measured_ms"])
    if opts:
        from transforms import Context, rewrite
        spec = "+".join(opts)
        notes: list[str] = []
        t2 = rewrite(jg.tables, spec, Context(device=device, notes=notes,
                                              param_bytes=param_bytes))
        pred = replay_job(t2)
        out["opts"] = spec
        out["notes"] += notes
        from daydream.api import _phase_ms, fill_predicted  # api imports this module

        fill_predicted(out, base, pred)
        for r in out["ranks"]:
            r["predicted_ms"] = (pred.rank_mean(r["rank"], "simulated_ns") / 1e6
                                 if r["rank"] in pred.ranks else None)
        out["predicted_straggler"] = pred.straggler
        n = len(jg.members)
        out["phases"] = {"baseline": _phase_ms(jg.tables, base, n),
                         "predicted": _phase_ms(t2, pred, n)}
    return out


def pl_n_unique(col: str):
    import polars as pl
    return pl.col(col).n_unique()


def add_device_ranks(out: dict, st: Store, tid: str, g, opts: list[str] | None,
                     device: dict | None, param_bytes: int | None = None) -> None:
    """A trace whose GPU work ran on several devices (an Nsight export of several processes)
    is a job by itself: add its ``ranks`` (and job fields) to the trace's prediction."""
    from graphstore.job import Member, build_job, device_ranks
    if not device_ranks(g):
        return
    row = st.trace_row(tid)
    jg = build_job(tid, [Member(0, tid, row["file"])], [g], [st.read("kernel", tid)])
    d = predict_job(st, jg, opts, device, param_bytes)
    for k in ("job", "world_size", "ranks", "collectives", "straggler", "predicted_straggler"):
        if k in d:
            out[k] = d[k]
