"""The traces of all ranks of one run -> one job graph, the collectives joined across ranks.

Outline:
  1. members: which stored traces form a job (``find_jobs``): the ``job`` name given at ingest,
     else traces that carry a rank and world size (Kineto ``distributedInfo``) in one folder; a
     single trace whose GPU work ran on several devices (an Nsight export of several processes)
     is a job by itself, one rank per device;
  2. collectives: each rank's NCCL/RCCL kernels in start order, per communicator (the process
     group where the trace names it, else one default communicator); the i-th of a communicator
     on every rank is one collective (``match_collectives``); types must agree;
  3. clocks: the ranks of one collective leave it together, so a rank whose collective ends are
     consistently off the others' has a clock offset; it is removed (median over collectives);
  4. joins: each collective gets a zero-length ``join`` task on its communicator's channel. Every
     participant's kernel start bounds it (``start_start``: the join is when the last rank has
     arrived), and it holds back every participant's own work (``end_end``, lag 0: the kernel's
     duration, the rank's own transfer time, what remains of its kernel after the last
     arrival, runs from the join on). So a rank alone (or last) still takes its transfer, and a
     rank that arrives early holds its stream until the last one arrives plus the transfer, as
     in the trace. A faster straggler therefore shortens everyone's wait, and a faster network
     shortens only the transfer.

The job graph is the rank graphs side by side (task, unit, iteration and layer tables gain a
``rank`` column; joins and channels have rank null), behind one ``<job start>`` origin task whose
edges place each rank's own origin at its trace start.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from daydream.base.errors import DaydreamError

# Kernel name -> collective type: ncclKernel_AllReduce_RING_LL_Sum_float,
# ncclDevKernel_SendRecv(...), rccl ... ; the 'Collective name' arg wins where present.
_TYPE_RE = re.compile(r"(?:nccl|rccl)\w*?Kernel_([A-Za-z]+)", re.IGNORECASE)
_TYPES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
          "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "send_recv",
          "send": "send_recv", "recv": "send_recv", "alltoall": "all_to_all"}
DEFAULT_COMM = "default"
# Range ids in a job graph of several traces: rank r's are its trace's plus r * RANGE_ID_STRIDE,
# so that a task's range_id names one range of the job (``job_activity`` shifts the ranks'
# range tables alike). A trace's range ids are its row numbers, far below the stride.
RANGE_ID_STRIDE = 1 << 40


def collective_type(name: str | None, coll: str | None = None) -> str:
    """all_reduce, all_gather, reduce_scatter, broadcast, reduce, send_recv, all_to_all or
    'other' from the 'Collective name' arg, else the kernel name."""
    for s in (coll, name):
        if not s:
            continue
        key = s.lower().replace("_", "").replace("nccl:", "")
        if key in _TYPES:
            return _TYPES[key]
        m = _TYPE_RE.search(s)
        if m and m.group(1).lower() in _TYPES:
            return _TYPES[m.group(1).lower()]
    return "other"


@dataclass
class Member:
    rank: int
    trace_id: str
    file: str | None = None
    device: int | None = None  # a rank inside a multi-device trace


@dataclass
class JobGraph:
    """A job's graph tables (``rank`` columns added) and how its collectives were matched.

    ``collective``: one row per (collective, participant): comm, seq, type, rank, task_id (the
    kernel), join_id, arrival_ns and end_ns (observed, clock-aligned), transfer_ns, wait_ns,
    bytes (message size where the trace has it, else null)."""

    name: str
    members: list[Member]
    tables: dict[str, pa.Table]
    collective: pl.DataFrame
    clock_offset_ns: dict[int, int] = field(default_factory=dict)
    unmatched: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        return [m.rank for m in self.members]


# ---- 1. members ---------------------------------------------------------------------------------

def find_jobs(trace_rows: list[dict]) -> dict[str, list[Member]]:
    """Jobs among the store's traces (rows of the ``trace`` table): by the ``job`` name given at
    ingest, else by folder and world size among traces that carry a rank and a world size > 1.
    A folder group is a job only when its ranks are distinct and its traces overlap in time
    (one run); two runs in one folder are left out."""
    groups: dict[str, list[dict]] = defaultdict(list)
    named = set()
    for r in trace_rows:
        if r.get("job"):
            groups[r["job"]].append(r)
            named.add(r["job"])
        elif r.get("rank") is not None and (r.get("world_size") or 0) > 1:
            folder = Path(r.get("file") or "").parent.name or "job"
            groups[(folder, r["world_size"])].append(r)
    by_folder = defaultdict(int)
    for k in groups:
        if k not in named:
            by_folder[k[0]] += 1
    out = {}
    for key, rows in groups.items():
        name = key if key in named else (key[0] if by_folder[key[0]] == 1 else
                                         f"{key[0]}_of{key[1]}")
        ranks = [r.get("rank") for r in rows]
        if any(x is None for x in ranks):
            # --job without ranks in the traces: number them by file name
            rows = sorted(rows, key=lambda r: str(r.get("file")))
            ranks = list(range(len(rows)))
        if len(set(ranks)) != len(ranks):
            continue
        if key not in named and len(rows) > 1 and not _overlap(rows):
            continue
        out[name] = sorted((Member(int(k), r["trace_id"], r.get("file"))
                            for k, r in zip(ranks, rows, strict=True)), key=lambda m: m.rank)
    return out


def _overlap(rows: list[dict]) -> bool:
    """The traces' time windows share an instant (where they have windows)."""
    w = [(r.get("start_ns"), r.get("end_ns")) for r in rows]
    w = [(a, b) for a, b in w if a is not None and b is not None]
    return not w or max(a for a, _ in w) < min(b for _, b in w)


def device_ranks(g: dict[str, pa.Table]) -> dict[int, int]:
    """unit_id -> rank (0-based, by device index) for a trace whose GPU work ran on several
    devices; {} when it ran on one. A CPU thread belongs to the device its launches went to."""
    u = g["unit"]
    kind = u["kind"]
    if pa.types.is_dictionary(kind.type):
        kind = kind.cast(pa.string())
    streams = pc.fill_null(pc.equal(kind, "stream"), False)
    devs = sorted(pc.unique(u["device"].filter(streams).drop_null()).to_pylist())
    if len(devs) < 2:  # the usual case, answered without a frame (a fleet asks every trace)
        return {}
    unit = pl.from_arrow(u)
    rank_of_dev = {d: i for i, d in enumerate(devs)}
    out = {int(u): rank_of_dev[int(d)] for u, d in unit.filter(pl.col("kind") == "stream")
           .select("unit_id", "device").iter_rows()}
    task = pl.from_arrow(g["task"]).select("task_id", "unit_id")
    e = pl.from_arrow(g["edge"]).filter(pl.col("kind") == "launch")
    lk = (e.join(task.rename({"task_id": "src", "unit_id": "su"}), on="src")
          .join(task.rename({"task_id": "dst", "unit_id": "du"}), on="dst"))
    dev_of = pl.DataFrame({"du": list(out), "r": list(out.values())},
                          schema={"du": pl.Int32, "r": pl.Int64})
    votes = (lk.with_columns(pl.col("du").cast(pl.Int32)).join(dev_of, on="du")
             .group_by("su", "r").len().sort("len", descending=True).unique("su", keep="first"))
    for su, r in votes.select("su", "r").iter_rows():
        out[int(su)] = int(r)
    # threads of a process without launches: the rank of the process's other threads
    pid_rank = {}
    for u, pid in unit.filter(pl.col("kind") == "thread").select("unit_id", "pid").iter_rows():
        if u in out and pid is not None:
            pid_rank.setdefault(pid, out[u])
    for u, pid in unit.filter(pl.col("kind") == "thread").select("unit_id", "pid").iter_rows():
        if u not in out and pid in pid_rank:
            out[int(u)] = pid_rank[pid]
    return out


# ---- 2. collectives -----------------------------------------------------------------------------

def comm_tasks(task: pl.DataFrame, kernel: pa.Table | None, rank: np.ndarray) -> pl.DataFrame:
    """The comm tasks of a graph with rank, communicator (process group from the kernel
    activity rows, joined on correlation and start, where the trace names it), type and message
    bytes (the graph's, from the NCCL args)."""
    c = task.with_columns(pl.Series("rank", rank)).filter(pl.col("kind") == "comm")
    c = c.select("task_id", "rank", "name", "start_ns", "obs_dur_ns", "correlation",
                 pl.when(pl.col("bytes") >= 0).then(pl.col("bytes")).alias("bytes"))
    meta = None
    if kernel is not None and kernel.num_rows:
        k = pl.from_arrow(kernel.select(["correlation", "start_ns", "collective",
                                         "process_group"]))
        k = k.filter(pl.col("collective").is_not_null() | pl.col("process_group").is_not_null())
        if k.height:
            meta = k.with_columns(pl.col(x).cast(pl.Utf8) for x in ("collective",
                                                                     "process_group"))
    if meta is not None:
        c = c.join(meta, on=["correlation", "start_ns"], how="left")
    else:
        c = c.with_columns(pl.lit(None, pl.Utf8).alias("collective"),
                           pl.lit(None, pl.Utf8).alias("process_group"))
    types = [collective_type(n, k) for n, k in zip(c["name"].to_list(), c["collective"].to_list(),
                                                   strict=True)]
    return c.with_columns(pl.Series("type", types, pl.Utf8),
                          pl.col("process_group").fill_null(DEFAULT_COMM).alias("comm"))


def match_collectives(comm: pl.DataFrame) -> tuple[pl.DataFrame, int, list[str]]:
    """The i-th kernel of a communicator on every rank that has the communicator is one
    collective. Returns (participants with ``coll`` id and ``seq``, unmatched count, notes).
    A communicator whose ranks hold different counts is matched up to the smallest count; a
    collective whose participants disagree on the type is left unmatched."""
    notes: list[str] = []
    c = comm.sort("rank", "start_ns", "task_id").with_columns(
        pl.int_range(pl.len()).over("comm", "rank").alias("seq"))
    counts = c.group_by("comm", "rank").len()
    lim = counts.group_by("comm").agg(pl.col("len").min().alias("n"),
                                      pl.col("len").max().alias("mx"),
                                      pl.col("rank").n_unique().alias("nr"))
    unmatched = 0
    for comm_name, n, mx, nr in lim.iter_rows():
        if mx != n:
            notes.append(f"communicator {comm_name}: ranks hold {n} to {mx} collectives; the "
                         f"first {n} are matched")
        if nr < 2:
            notes.append(f"communicator {comm_name}: only one rank in the job; not joined")
    c = c.join(lim.select("comm", "n", "nr"), on="comm")
    over = c.filter((pl.col("seq") >= pl.col("n")) | (pl.col("nr") < 2))
    unmatched += over.height
    c = c.filter((pl.col("seq") < pl.col("n")) & (pl.col("nr") >= 2)).drop("n", "nr")
    bad = c.group_by("comm", "seq").agg(pl.col("type").n_unique().alias("nt")).filter(
        pl.col("nt") > 1)
    if bad.height:
        notes.append(f"{bad.height} collectives whose ranks ran different kernel types; "
                     "not joined")
        c = c.join(bad.select("comm", "seq"), on=["comm", "seq"], how="anti")
        unmatched += int(comm.height - c.height - over.height)
    ids = c.select("comm", "seq").unique().sort("comm", "seq").with_row_index("coll")
    c = c.join(ids.with_columns(pl.col("coll").cast(pl.Int64)), on=["comm", "seq"])
    return c.sort("coll", "rank"), unmatched, notes


def clock_offsets(coll: pl.DataFrame) -> dict[int, int]:
    """Per rank: the median over its collectives of (its end - the median end of the
    collective's participants), ns. The ranks of one collective leave it together."""
    e = coll.with_columns((pl.col("start_ns") + pl.col("obs_dur_ns")).alias("end"))
    e = e.with_columns((pl.col("end") - pl.col("end").median().over("coll")).alias("d"))
    med = e.group_by("rank").agg(pl.col("d").median())
    return {int(r): int(round(d)) for r, d in med.iter_rows() if d is not None}


# ---- 3-4. the job graph -------------------------------------------------------------------------

def _with_rank(t: pa.Table, rank) -> pa.Table:
    arr = pa.array(rank, pa.int32()) if not np.isscalar(rank) else pa.array(
        np.full(t.num_rows, rank, np.int32), pa.int32())
    return t.append_column("rank", arr)


def build_job(name: str, members: list[Member], graphs: list[dict[str, pa.Table]],
              kernels: list[pa.Table | None], replicas: int = 1) -> JobGraph:
    """The job graph from each member's graph tables (``graphstore.read.read_graph``) and its
    kernel activity table (for process groups; None where unknown).

    One member with ``device_ranks`` -> a multi-device trace split into ranks by device.
    ``replicas`` > 1 repeats the ranks (rank r of copy k is rank r + k * len(members)), every
    collective joining all of them: a larger job built from real ranks, for scale tests."""
    if not members:
        raise DaydreamError(f"job {name}: no traces")
    if replicas > 1:
        n = len(members)
        members = [Member(m.rank + k * n, m.trace_id, m.file, m.device)
                   for k in range(replicas) for m in members]
        graphs = graphs * replicas
        kernels = kernels * replicas
    if len(graphs) == 1:
        g = graphs[0]
        ur = device_ranks(g)
        if not ur:
            raise DaydreamError(f"job {name}: one trace on one device is not a job")
        task_rank = np.array([ur.get(int(u), -1) for u in g["task"]["unit_id"].to_numpy()],
                             np.int32)
        task_rank[0] = -1
        ranks = sorted(set(ur.values()))
        members = [Member(r, members[0].trace_id, members[0].file, r) for r in ranks]
        task = _with_rank(g["task"], task_rank)
        unit = _with_rank(g["unit"], [ur.get(int(u), -1) for u in g["unit"]["unit_id"]
                                      .to_numpy()])
        tables = {"task": task, "edge": g["edge"], "unit": unit,
                  "iteration": _with_rank_rows(g["iteration"], ranks),
                  "layer": _with_rank(g["layer"], -1)}
        comm = comm_tasks(pl.from_arrow(task).drop("rank"), kernels[0], task_rank)
        comm = comm.with_columns(pl.col("task_id").alias("trace_task_id"))
    else:
        tables, comm = _concat(members, graphs, kernels)
    coll, unmatched, notes = match_collectives(comm)
    offsets = clock_offsets(coll) if len(graphs) > 1 else {}
    if any(offsets.values()):
        tables = _shift(tables, offsets)
        coll = coll.with_columns(pl.col("start_ns") - pl.col("rank").replace_strict(
            offsets, default=0, return_dtype=pl.Int64))
        notes.append("clock offsets removed: " + ", ".join(
            f"rank {r}: {o / 1e3:+.3f} us" for r, o in sorted(offsets.items()) if o))
    tables, coll = _join(tables, coll, notes)
    tables, newid = _sort(tables)
    if coll.height:
        coll = coll.with_columns(pl.Series("task_id", newid[coll["task_id"].to_numpy()]),
                                 pl.Series("join_id", newid[coll["join_id"].to_numpy()]))
    return JobGraph(name, members, tables, coll, offsets, unmatched, notes)


def job_activity(members: list[Member], read: Callable[[str, str], pa.Table]
                 ) -> Callable[[str], pa.Table]:
    """A reader of a job's activity tables, for optimizations that read them (offload reads
    the recorded input shapes of ``range``): one table is every member trace's, one after the
    other with a ``rank`` column, range ids shifted as in the job graph. ``read(table,
    trace_id)`` reads one trace's (``ingest.store.Store.read``). A job of one multi-device trace
    reads that trace's own tables (its graph keeps their range ids)."""
    traces = sorted({m.trace_id for m in members})
    if len(traces) == 1:
        return lambda name: read(name, traces[0])

    def table(name: str) -> pa.Table:
        parts = []
        for m in members:
            t = read(name, m.trace_id)
            for col in ("range_id", "parent"):
                if col in t.column_names:
                    i = t.schema.get_field_index(col)
                    t = t.set_column(i, t.schema.field(col),
                                     pc.add(t[col], m.rank * RANGE_ID_STRIDE))
            parts.append(t.append_column("rank", pa.array(np.full(t.num_rows, m.rank,
                                                                 np.int32))))
        return pa.concat_tables(parts)
    return table


def _with_rank_rows(its: pa.Table, ranks: list[int]) -> pa.Table:
    """One copy of a trace's iteration rows per rank (a multi-device trace shares its steps)."""
    parts = [_with_rank(its, r) for r in ranks]
    return pa.concat_tables(parts) if parts else _with_rank(its, -1)


def _concat(members, graphs, kernels):
    """The rank graphs side by side after a ``<job start>`` origin (task 0, unit 0)."""
    t0s = [int(g["task"]["start_ns"][0].as_py()) for g in graphs]
    job_t0 = min(t0s)
    tasks, edges, units, its, layers, comms = [], [], [], [], [], []
    base_t, base_u = 1, 1
    first = pl.from_arrow(graphs[0]["task"]).head(1)
    origin = first.with_columns(pl.lit(0, pl.Int64).alias("task_id"),
                                pl.lit(0, pl.Int32).alias("unit_id"),
                                pl.lit("<job start>").alias("name"),
                                pl.lit(job_t0, pl.Int64).alias("start_ns"),
                                pl.lit(-1, pl.Int32).alias("rank"))
    tasks.append(origin)
    us = pl.from_arrow(graphs[0]["unit"]).schema
    units.append(pl.DataFrame({"unit_id": [0], "kind": ["thread"], "pid": [None], "tid": [None],
                               "device": [None], "stream": [None], "name": ["job origin"],
                               "policy": ["fixed"]}, schema=us).with_columns(
        pl.lit(-1, pl.Int32).alias("rank")))
    for m, g, k, t0 in zip(members, graphs, kernels, t0s, strict=True):
        t = pl.from_arrow(g["task"])
        n = t.height
        t = t.with_columns(pl.col("task_id") + base_t, pl.col("unit_id") + base_u,
                           pl.col("range_id") + m.rank * RANGE_ID_STRIDE,
                           pl.lit(m.rank, pl.Int32).alias("rank"))
        tasks.append(t)
        e = pl.from_arrow(g["edge"]).with_columns(pl.col("src") + base_t, pl.col("dst") + base_t)
        edges.append(e)
        edges.append(pl.DataFrame({"src": [0], "dst": [base_t], "kind": ["origin"],
                                   "anchor": ["end_start"], "lag_ns": [t0 - job_t0],
                                   "slack_ns": [0], "binding": [True], "inferred": [False]},
                                  schema=e.schema))
        units.append(pl.from_arrow(g["unit"]).with_columns(
            pl.col("unit_id") + base_u, pl.lit(m.rank, pl.Int32).alias("rank"),
            (pl.lit(f"rank {m.rank} ") + pl.col("name")).alias("name")))
        its.append(pl.from_arrow(g["iteration"]).with_columns(pl.lit(m.rank, pl.Int32)
                                                              .alias("rank")))
        layers.append(pl.from_arrow(g["layer"]).with_columns(pl.lit(m.rank, pl.Int32)
                                                             .alias("rank")))
        rank = np.full(n, m.rank, np.int32)
        c = comm_tasks(pl.from_arrow(g["task"]), k, rank)
        comms.append(c.with_columns(pl.col("task_id").alias("trace_task_id"),
                                    pl.col("task_id") + base_t))
        base_t += n
        base_u += g["unit"].num_rows
    tables = {"task": pl.concat(tasks), "edge": pl.concat(edges), "unit": pl.concat(units),
              "iteration": pl.concat(its), "layer": pl.concat(layers)}
    return {k: v.to_arrow() for k, v in tables.items()}, pl.concat(comms)


def _shift(tables, offsets):
    """Remove each rank's clock offset from its observed times."""
    out = dict(tables)
    for name, cols in (("task", ("start_ns",)), ("iteration", ("start_ns", "end_ns")),
                       ("layer", ("first_start_ns",))):
        t = pl.from_arrow(tables[name])
        off = pl.col("rank").replace_strict(offsets, default=0, return_dtype=pl.Int64)
        keep_origin = pl.col("name") == "<job start>" if name == "task" else pl.lit(False)
        t = t.with_columns(pl.when(keep_origin).then(pl.col(c)).otherwise(pl.col(c) - off)
                           .alias(c) for c in cols)
        out[name] = t.to_arrow().cast(tables[name].schema)
    # the rank origins moved: so do their origin edges' lags
    task = pl.from_arrow(out["task"])
    e = pl.from_arrow(tables["edge"])
    if task.height and task["name"][0] == "<job start>":
        t0 = int(task["start_ns"][0])
        starts = task.select("task_id", "start_ns")
        e = (e.join(starts.rename({"task_id": "dst", "start_ns": "ds"}), on="dst", how="left")
             .with_columns(pl.when((pl.col("src") == 0) & (pl.col("kind") == "origin"))
                           .then(pl.col("ds") - t0).otherwise(pl.col("lag_ns"))
                           .alias("lag_ns")).drop("ds"))
        lo = int(e.filter((pl.col("src") == 0) & (pl.col("kind") == "origin"))["lag_ns"].min())
        if lo < 0:  # a rank now starts before the job origin: move the origin back
            task = task.with_columns(pl.when(pl.col("task_id") == 0).then(
                pl.col("start_ns") + lo).otherwise(pl.col("start_ns")).alias("start_ns"))
            e = e.with_columns(pl.when((pl.col("src") == 0) & (pl.col("kind") == "origin"))
                               .then(pl.col("lag_ns") - lo).otherwise(pl.col("lag_ns"))
                               .alias("lag_ns"))
            out["task"] = task.to_arrow().cast(tables["task"].schema)
    out["edge"] = e.to_arrow().cast(tables["edge"].schema)
    return out


def _join(tables, coll: pl.DataFrame, notes: list[str]):
    """Add one join task per collective (see the module doc) and set transfer durations."""
    task = pl.from_arrow(tables["task"])
    unit = pl.from_arrow(tables["unit"])
    edge = pl.from_arrow(tables["edge"])
    coll = coll.with_columns((pl.col("start_ns") + pl.col("obs_dur_ns")).alias("end_ns"))
    coll = coll.with_columns(pl.col("start_ns").alias("arrival_ns"),
                             pl.col("start_ns").max().over("coll").alias("last_ns"))
    coll = coll.with_columns((pl.col("end_ns") - pl.col("last_ns")).clip(lower_bound=0)
                             .alias("transfer_ns"),
                             (pl.col("last_ns") - pl.col("arrival_ns")).alias("wait_ns"))
    if not coll.height:
        return tables, coll.with_columns(pl.lit(None, pl.Int64).alias("join_id"))
    # One channel per communicator. NCCL has every rank issue a communicator's collectives in
    # the same order, so the channel keeps that order (FIXED, by the join's start, the last
    # arrival) wherever the trace's arrivals agree with it; a communicator whose last arrivals
    # are out of issue order gets a FCFS channel. FIXED also keeps the simulator on its fast
    # path (no dispatch queue): the 64-rank job replays twice as fast.
    comms = sorted(coll["comm"].unique().to_list())
    u_base = int(unit["unit_id"].max()) + 1
    chan = {c: u_base + i for i, c in enumerate(comms)}
    last = coll.group_by("comm", "seq").agg(pl.col("last_ns").first()).sort("comm", "seq")
    unordered = set(last.filter(pl.col("last_ns").diff().over("comm") < 0)["comm"].to_list())
    notes.extend(f"communicator {c}: last arrivals out of issue order; its collectives run "
                 "first come first served" for c in sorted(unordered))
    unit = pl.concat([unit, pl.DataFrame({
        "unit_id": [chan[c] for c in comms], "kind": ["channel"] * len(comms),
        "name": [f"collectives {c}" for c in comms],
        "policy": ["fcfs" if c in unordered else "fixed" for c in comms]},
        schema={"unit_id": pl.Int32, "kind": pl.Utf8, "name": pl.Utf8, "policy": pl.Utf8})],
        how="diagonal_relaxed").select(unit.columns).cast(unit.schema)
    n = task.height
    colls = coll.group_by("coll").agg(pl.col("comm").first(), pl.col("type").first(),
                                      pl.col("seq").first(), pl.col("last_ns").first(),
                                      pl.col("task_id").first().alias("any_task")).sort("coll")
    colls = colls.with_columns((pl.int_range(pl.len(), dtype=pl.Int64) + n).alias("join_id"))
    anytask = task.select("task_id", "phase", "iteration", "layer").rename({"task_id":
                                                                            "any_task"})
    jt = colls.join(anytask, on="any_task", how="left").sort("coll")
    joins = pl.DataFrame({
        "task_id": jt["join_id"], "kind": ["comm"] * jt.height,
        "unit_id": pl.Series([chan[c] for c in jt["comm"].to_list()], dtype=pl.Int32),
        "name": [f"join {t} #{s} ({c})" for t, s, c in zip(
            jt["type"].to_list(), jt["seq"].to_list(), jt["comm"].to_list(), strict=True)],
        "start_ns": jt["last_ns"], "dur_ns": [0] * jt.height, "slack_ns": [0] * jt.height,
        "obs_dur_ns": [0] * jt.height,
        "blocking": [False] * jt.height, "phase": jt["phase"], "iteration": jt["iteration"],
        "layer": jt["layer"], "rank": pl.Series([-1] * jt.height, dtype=pl.Int32)})
    task = pl.concat([task, joins], how="diagonal_relaxed").select(task.columns).cast(
        task.schema)
    coll = coll.join(colls.select("coll", "join_id"), on="coll")
    # each joined kernel runs its transfer after the last arrival (the join's END edge lets
    # its work begin): its waiting is the join's now, not task slack
    dur = task["dur_ns"].to_numpy().copy()
    slack = task["slack_ns"].to_numpy().copy()
    ids = coll["task_id"].to_numpy()
    dur[ids] = coll["transfer_ns"].to_numpy()
    slack[ids] = 0
    task = task.with_columns(pl.Series("dur_ns", dur, pl.Int64),
                             pl.Series("slack_ns", slack, pl.Int64))
    m = coll.height
    new_e = pl.DataFrame({
        "src": np.concatenate([ids, coll["join_id"].to_numpy()]),
        "dst": np.concatenate([coll["join_id"].to_numpy(), ids]),
        "kind": ["rank"] * (2 * m),
        "anchor": ["start_start"] * m + ["end_end"] * m,
        "lag_ns": np.zeros(2 * m, np.int64),
        "slack_ns": np.zeros(2 * m, np.int64),
        "binding": np.concatenate([(coll["wait_ns"] == 0).to_numpy(), np.ones(m, bool)]),
        "inferred": np.zeros(2 * m, bool),
    }).cast(edge.schema)
    edge = pl.concat([edge, new_e])
    out = dict(tables)
    out["task"] = task.to_arrow().cast(tables["task"].schema)
    out["edge"] = edge.to_arrow().cast(tables["edge"].schema)
    out["unit"] = unit.to_arrow().cast(tables["unit"].schema)
    return out, coll


def _sort(tables):
    """Task ids dense in observed start order again (the joins were appended)."""
    task = pl.from_arrow(tables["task"])
    order = np.lexsort((task["task_id"].to_numpy(), task["start_ns"].to_numpy()))
    newid = np.empty(len(order), np.int64)
    newid[order] = np.arange(len(order))
    lut = pl.Series(newid)
    task = task[order].with_columns(pl.Series("task_id", np.arange(len(order), dtype=np.int64)))
    e = pl.from_arrow(tables["edge"]).with_columns(
        pl.col("src").map_batches(lambda s: lut.gather(s)),
        pl.col("dst").map_batches(lambda s: lut.gather(s))).sort("src", "dst")
    out = dict(tables)
    out["task"] = task.to_arrow().cast(tables["task"].schema)
    out["edge"] = e.to_arrow().cast(tables["edge"].schema)
    return out, newid
