"""Jobs in the store: the traces of all ranks of one run, predicted together.

``find`` lists a store's jobs; ``resolve`` turns what the user typed (a job name, or a folder of
rank traces) into a job; ``build`` reads its job graph; ``store_collectives`` keeps its matched
collectives for SQL. ``daydream.pipeline`` predicts a job like a trace.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from daydream.base.errors import DaydreamError
from daydream.ingest.store import Store
from daydream.traces import ingest_folder

if TYPE_CHECKING:
    from daydream.graphstore.job import JobGraph, Member

# graphstore.job (polars, numpy) is imported where a job is looked for or built, pyarrow where
# collectives are stored: `daydream info` of a stored trace needs neither.


def trace_rows(st: Store, ids: list[str] | None = None) -> list[dict]:
    return [{**st.trace_row(t), "trace_id": t} for t in (ids if ids is not None
                                                          else st.trace_ids())]


def find(st: Store) -> dict[str, list[Member]]:
    """name -> members (``graphstore.job.Member``) of every job in the store: groups of two
    traces or more (one rank's trace alone is predicted as the trace it is)."""
    from daydream.graphstore.job import find_jobs
    return several(named(find_jobs(trace_rows(st))))


def several(jobs: dict[str, list[Member]]) -> dict[str, list[Member]]:
    return {k: v for k, v in jobs.items() if len(v) > 1}


# a rank in a file name: rank3, _rank3_of8, -rank12
_RANK_RE = re.compile(r"[_.-]*rank\d*(?:[_-]?of\d+)?[_.-]*", re.IGNORECASE)


def readable_name(name: str, members: list[Member]) -> str:
    """A job's name from its traces' file names (what they share, the rank left out), else
    its folder: graphstore names a job found by folder and world size ``FOLDER_ofN``, which
    says nothing of the model ('hta_of8'). A name given at ingest (``--job``) is kept."""
    stems = [Path(m.file or "").name.split(".")[0] for m in members]
    if not stems or not all(stems):
        return name
    common = os.path.commonprefix(stems) if len(stems) > 1 else stems[0]
    readable = _RANK_RE.sub("_", common).strip("_.-")
    return readable if len(readable) >= 3 else name


def named(jobs: dict[str, list[Member]]) -> dict[str, list[Member]]:
    """JOBS under readable names (``readable_name``) where those are unique, the names
    graphstore gave them elsewhere; a job named at ingest keeps its name."""
    out: dict[str, list[Member]] = {}
    want = {}
    for name, ms in jobs.items():
        folder = Path(ms[0].file or "").parent.name if ms else ""
        # only names graphstore made from the folder are replaced
        auto = bool(folder) and (name == folder or re.fullmatch(
            re.escape(folder) + r"_of\d+", name) is not None)
        want[name] = readable_name(name, ms) if auto else name
    taken = list(want.values())
    for name, ms in jobs.items():
        new = want[name]
        out[new if taken.count(new) == 1 and (new == name or new not in jobs) else name] = ms
    return out


def resolve(target: str, st: Store) -> tuple[str, list[Member]] | None:
    """(job name, members) when TARGET names a job in the store or is a folder whose traces
    form one job (ingested first); else None."""
    p = Path(target)
    if p.is_dir():
        from daydream.graphstore.job import find_jobs
        jobs = several(named(find_jobs(trace_rows(st, ingest_folder(p, st)))))
        if len(jobs) == 1:
            return next(iter(jobs.items()))
        if not jobs:
            raise DaydreamError(f"the traces in {target} do not form a job: a job is two "
                                "traces or more of one run, each with its rank and world size "
                                "(distributedInfo), or named by `daydream ingest --job NAME`; "
                                "predict a single trace by its file", file=target)
        raise DaydreamError(f"the traces in {target} form several jobs: {', '.join(jobs)}; "
                            "predict one by name", file=target)
    if p.exists() or any(t.startswith(target) for t in st.trace_ids()):
        return None  # a trace file or a stored trace id
    jobs = find(st)
    if target in jobs:
        return target, jobs[target]
    return None


def build(st: Store, name: str, members: list[Member]) -> JobGraph:
    """The job graph of stored traces (``graphstore.job.build_job``)."""
    from daydream.graphstore.job import build_job
    from daydream.graphstore.read import read_graph
    graphs = [read_graph(st.root, m.trace_id) for m in members]
    kernels = [st.read("kernel", m.trace_id) for m in members]
    return build_job(name, members, graphs, kernels)


def store_collectives(st: Store, jg: JobGraph) -> int:
    """Keep the job's matched collectives in the ``collective`` table of graph.duckdb (one row
    per rank and collective, replacing the job's earlier rows), so SQL can ask which rank
    waited where. Returns rows written."""
    import pyarrow as pa

    from daydream.graphstore import db
    from daydream.graphstore.schema import COLLECTIVE
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
