"""Replay of a job graph (``graphstore.job``): per-rank and job iteration times, and the
straggler.

Each rank's iterations are timed by ``replay.iteration_times`` on its own tasks, so a rank of a
job is measured exactly like a single trace. A job iteration lasts until its slowest rank is
done: its time is the largest of the ranks' times (measured and simulated alike).

The straggler: at every joined collective the rank that arrived last made the others wait; the
rank that made them wait longest in total is named, with the work on its critical path between
its previous collective and its late arrival at the collective where it cost the most.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl
import pyarrow as pa

from daydream.simulate.engine import Schedule, simulate
from daydream.simulate.replay import Iteration, iteration_times, to_simgraph


@dataclass
class JobReplay:
    schedule: Schedule
    ranks: dict[int, list[Iteration]]
    iterations: list[Iteration]
    straggler: dict = field(default_factory=dict)
    work_ns: np.ndarray | None = None  # each task's simulated duration, ns

    def rank_mean(self, rank: int, attr: str) -> float:
        used = [getattr(i, attr) for i in self.ranks[rank] if i.used]
        return float(np.mean(used)) if used else float("nan")

    def mean(self, attr: str) -> float:
        used = [getattr(i, attr) for i in self.iterations if i.used]
        return float(np.mean(used)) if used else float("nan")

    def median(self, attr: str) -> float:
        used = [getattr(i, attr) for i in self.iterations if i.used]
        return float(np.median(used)) if used else float("nan")

    def headline(self, attr: str) -> float:
        """A job's steady-state step: the median of its used iterations (each as long as its
        slowest rank)."""
        return self.median(attr)


def rank_tables(tables: dict[str, pa.Table], rank: int) -> tuple[dict[str, pa.Table],
                                                                 np.ndarray]:
    """One rank's part of a job graph (its tasks in id order, its iterations) and the job task
    ids of its tasks; position 0 is the rank's own origin marker."""
    r = tables["task"]["rank"].to_numpy(zero_copy_only=False)
    ids = np.flatnonzero(r == rank)
    its = pl.from_arrow(tables["iteration"]).filter(pl.col("rank") == rank).drop("rank")
    return {"task": tables["task"].take(pa.array(ids)), "iteration": its.to_arrow(),
            "unit": tables["unit"], "edge": tables["edge"]}, ids


def _job_iterations(ranks: dict[int, list[Iteration]]) -> list[Iteration]:
    by_idx: dict[int, list[Iteration]] = {}
    for its in ranks.values():
        for i in its:
            by_idx.setdefault(i.index, []).append(i)
    out = []
    for k in sorted(by_idx):
        v = by_idx[k]
        if len(v) != len(ranks):
            continue
        out.append(Iteration(k, v[0].label, max(i.measured_ns for i in v),
                             max(i.simulated_ns for i in v), all(i.used for i in v),
                             next((i.note for i in v if i.note), "")))
    return out


def joins(tables: dict[str, pa.Table]) -> pl.DataFrame:
    """(join, task) pairs: every collective join and the participating kernels."""
    e = pl.from_arrow(tables["edge"].select(["src", "dst", "kind", "anchor"]))
    return e.filter((pl.col("kind") == "rank") & (pl.col("anchor") == "start_start")).select(
        pl.col("dst").alias("join"), pl.col("src").alias("task"))


def straggler(tables: dict[str, pa.Table], sched: Schedule, top: int = 5) -> dict:
    """The rank whose late arrivals at collectives made the others wait longest, and why."""
    jt = joins(tables)
    if not jt.height:
        return {}
    task = tables["task"]
    rank = task["rank"].to_numpy(zero_copy_only=False)
    t = jt.with_columns(pl.Series("arr", sched.start_ns[jt["task"].to_numpy()]),
                        pl.Series("rank", rank[jt["task"].to_numpy()]))
    t = t.with_columns(pl.col("arr").max().over("join").alias("last"))
    t = t.with_columns((pl.col("last") - pl.col("arr")).alias("wait"))
    lasts = t.sort("arr", "rank", descending=[True, False]).unique("join", keep="first")
    caused = t.group_by("join").agg(pl.col("wait").sum().alias("caused"))
    lasts = lasts.join(caused, on="join")
    per = lasts.group_by("rank").agg(pl.col("caused").sum(), pl.len().alias("last_count"))
    per = per.sort("caused", descending=True)
    wait_total = t.group_by("rank").agg(pl.col("wait").sum())
    if not per.height or per["caused"][0] <= 0:
        return {}
    r = int(per["rank"][0])
    worst = lasts.filter(pl.col("rank") == r).sort("caused", descending=True).row(0, named=True)
    # the straggler's own critical path back from its arrival, within its rank, down to where
    # its previous collective ended
    mine = t.filter(pl.col("rank") == r).sort("arr")
    prev = mine.filter(pl.col("arr") < worst["arr"])
    floor = int(sched.end_ns[int(prev["task"][-1])]) if prev.height else -1
    path = []
    cur = int(worst["task"])
    for _ in range(1_000_000):
        b = int(sched.bound_by[cur])
        if b < 0 or rank[b] != r or sched.end_ns[b] <= floor:
            break
        path.append(b)
        cur = b
    # when each rank's own trace starts (its origin marker, the first of its tasks)
    first = pl.DataFrame({"rank": rank, "i": np.arange(len(rank))}).filter(
        pl.col("rank") >= 0).group_by("rank").agg(pl.col("i").min())
    starts = {int(a): int(sched.start_ns[b]) for a, b in first.iter_rows()}
    names = task["name"].to_numpy(zero_copy_only=False)
    kinds = task["kind"].to_numpy(zero_copy_only=False)
    phase = task["phase"].to_numpy(zero_copy_only=False)
    cause = []
    if path:
        p = np.array(path[::-1])
        s, e = sched.start_ns[p], sched.end_ns[p]
        cursor = np.maximum.accumulate(np.r_[s[:1], e[:-1]])
        held = np.maximum(e - np.maximum(s, cursor), 0)
        df = pl.DataFrame({"name": [str(x) for x in names[p]], "kind": [str(x) for x in kinds[p]],
                           "phase": [str(x) for x in phase[p]], "ns": held})
        cause = (df.group_by("name", "kind", "phase").agg(pl.col("ns").sum())
                 .sort("ns", descending=True).head(top).to_dicts())
    others = t.filter(pl.col("join") == worst["join"], pl.col("rank") != r)
    return {
        "rank": r,
        "last_at": int(per["last_count"][0]),
        "collectives": int(jt["join"].n_unique()),
        "wait_caused_ms": float(per["caused"][0]) / 1e6,
        "worst_collective": str(task["name"][int(worst["join"])]),
        "late_by_ms": float(worst["arr"] - np.median(others["arr"].to_numpy())) / 1e6
        if others.height else 0.0,
        "cause": [{"name": c["name"], "kind": c["kind"], "phase": c["phase"],
                   "ms": c["ns"] / 1e6} for c in cause],
        "started_late_ms": float(starts[r] - min(starts.values())) / 1e6,
        "by_rank": [{"rank": int(a), "wait_caused_ms": float(b) / 1e6, "last_count": int(c)}
                    for a, b, c in per.iter_rows()],
        "waited": [{"rank": int(a), "waited_ms": float(b) / 1e6}
                   for a, b in wait_total.sort("rank").iter_rows()],
    }


def replay_job(tables: dict[str, pa.Table], slack=True, inferred: bool = True) -> JobReplay:
    """Simulate a job graph and time every rank like its own trace was timed. ``slack`` and
    ``inferred`` as in ``replay.replay`` (False: the explained replay)."""
    sg = to_simgraph(tables, slack, inferred)
    sched = simulate(sg)
    ranks = sorted(int(x) for x in pl.from_arrow(tables["iteration"])["rank"].unique()
                   if x is not None and x >= 0)
    per = {}
    for r in ranks:
        sub, ids = rank_tables(tables, r)
        per[r] = iteration_times(sub, sched.start_ns[ids], sched.end_ns[ids])
    return JobReplay(sched, per, _job_iterations(per), straggler(tables, sched), sg.dur_ns)
