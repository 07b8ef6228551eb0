"""The one prediction path: a trace or a job -> its graph -> the rewrite Context -> the rewritten
graph -> its simulation -> the result dict.

Every entry point runs it: ``daydream predict TRACE|JOB`` and ``daydream.predict`` through
``daydream.api.predict``, and every worker of ``daydream predict --all`` (``daydream.fleet``), so
that they cannot disagree. Outline:

  1. ``resolve``: what the user typed (a trace file, id or id prefix, a job name, a folder of
     rank traces) -> a ``Subject``: its graph tables and what the store knows beside them
     (device, world size, a reader of its activity tables);
  2. ``context``: the ``transforms.Context`` every rewrite of that subject gets;
  3. ``predict``: the unmodified graph replayed (once per subject), the rewritten one
     simulated, and ``result`` builds the dict that the CLI prints, the API returns and the
     fleet keeps a row of. A trace whose GPU work ran on several devices is a job by itself:
     its prediction adds the job's ranks and collectives.

It writes nothing: storing a job's collectives is the caller's (``daydream.api``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from daydream import gates, jobs
from daydream.base.errors import DaydreamError
from daydream.graphstore.job import JobGraph, Member, build_job, device_ranks, job_activity
from daydream.graphstore.schema import GPU_KINDS
from daydream.ingest.store import Store
from daydream.report import rank_ranges
from daydream.simulate.job import JobReplay, replay_job
from daydream.simulate.replay import Replay, replay
from daydream.traces import ensure_graphs, resolve_trace
from daydream.transforms import Context
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import apply, check, removes_cpu

# What the prediction of a trace that is a job by itself (several devices) takes from the
# trace's own replay: what describes the unmodified trace, not the job's timing.
TRACE_KEYS = ("critical_path", "units", "slack", "inferred_edges", "profiler",
              "iterations_from")


# ---- 1. subjects ----------------------------------------------------------------------------

@dataclass(eq=False)
class Subject:
    """What a prediction is of: one trace's graph or one job's, and what the store knows
    beside the graph that an optimization may read (``context`` hands it on).

    ``name``: the trace id, or the job's name; ``tables``: the graph tables (a job graph's,
    with rank columns); ``device``: the GPU (an entry of the trace table's ``devices``);
    ``world_size``: ranks of the traced job; ``activity``: reads one of its activity tables
    by name (read once, then kept); ``job``: the job graph, for a job."""

    name: str
    file: str
    tables: dict[str, pa.Table]
    device: dict | None = None
    world_size: int | None = None
    activity: Callable[[str], pa.Table] | None = None
    job: JobGraph | None = None
    # a job: the world size its traces record, and the ranks of it that no trace holds
    traced_world_size: int | None = None
    missing_ranks: list[int] = field(default_factory=list)
    _cache: dict = field(default_factory=dict, repr=False)

    def baseline(self, slack=True, inferred: bool = True) -> Replay | JobReplay:
        """The replay of the unmodified graph (``slack``/``inferred`` as ``simulate.replay``:
        False, the explained replay); each simulated once however many specs follow."""
        key = ("baseline", slack, inferred)
        if key not in self._cache:
            self._cache[key] = simulate_graph(self.tables, self.job is not None, slack,
                                              inferred)
        return self._cache[key]

    def unprofiled(self, slack=True) -> Replay | JobReplay:
        """The replay of the job without the profiler (``no_profiler``), the reference of
        predictions that remove CPU work; simulated once."""
        key = ("unprofiled", slack)
        if key not in self._cache:
            if "unprofiled_tables" not in self._cache:
                self._cache["unprofiled_tables"] = self.unprofiled_graph()[0].tables()
            self._cache[key] = simulate_graph(self._cache["unprofiled_tables"],
                                              self.job is not None, slack)
        return self._cache[key]

    def graph(self) -> Graph:
        """The unmodified graph as a ``transforms.primitives.Graph``, converted once (every
        spec's rewrite starts from it; optimizations never change the graph they are given)."""
        if "graph" not in self._cache:
            self._cache["graph"] = Graph.from_tables(self.tables)
        return self._cache["graph"]

    def unprofiled_graph(self) -> tuple[Graph, list[str]]:
        """The graph rewritten by ``no_profiler`` and the notes that made, computed once: the
        start of every chain that removes CPU work (``no_profiler+SPEC``), and ``unprofiled``."""
        if "unprofiled_graph" not in self._cache:
            ctx = context(self)
            g = apply(self.graph(), "no_profiler", ctx)
            self._cache["unprofiled_graph"] = (g, list(ctx.notes))
        return self._cache["unprofiled_graph"]

    def profiler(self, used: list[int], step_ms: float | None) -> dict | None:
        """The profiler's estimated cost per used iteration (transforms.profiler.estimate);
        None without op ranges, or for a job."""
        if self.job is not None or self.activity is None:
            return None
        if "profiler" not in self._cache:
            from daydream.transforms.profiler import estimate
            try:
                ranges = self.activity("range")
            except DaydreamError:
                ranges = None
            self._cache["profiler"] = (None if ranges is None else
                                       estimate(self.graph(), ranges, used,
                                                step_ms))
        return self._cache["profiler"]

    def memo(self, key, fn: Callable):
        """``fn()``, computed once per KEY for this subject (what every spec's result reports
        of the unmodified graph)."""
        key = ("memo", key)
        if key not in self._cache:
            self._cache[key] = fn()
        return self._cache[key]

    def device_job(self) -> Subject | None:
        """For a trace whose GPU work ran on several devices (an Nsight export of several
        processes), the job its devices form; else None."""
        if self.job is not None:
            return None
        if "device_job" not in self._cache:
            self._cache["device_job"] = _device_job(self)
        return self._cache["device_job"]


def resolve(target: str, st: Store) -> Subject:
    """The subject TARGET names: a job name or a folder of rank traces (ingested first), else a
    trace file (ingested if new), a stored trace id or a unique id prefix. Graphs the store
    lacks are built first."""
    job = jobs.resolve(target, st)
    if job is not None:
        name, members = job
        ensure_graphs(st, [m.trace_id for m in members])
        return job_subject(st, name, members)
    tid = resolve_trace(target, st, ingest_missing=True)
    ensure_graphs(st, [tid])
    return trace_subject(st, tid)


def trace_subject(st: Store, trace_id: str, tables: dict[str, pa.Table] | None = None
                  ) -> Subject:
    """One stored trace: its graph (``tables`` when the caller read it already, as a fleet's
    loader does) and its trace row; activity tables are read from the store when an
    optimization asks (a fleet worker reads them itself, beside the other workers)."""
    if tables is None:
        from daydream.graphstore.read import read_graph
        tables = read_graph(st.root, trace_id)
    if not st.has_trace(trace_id):  # a graph whose activity tables were removed meanwhile
        return Subject(trace_id, "", tables)
    row = st.trace_row(trace_id, ["file", "devices", "world_size"])
    used = set(tables["unit"]["device"].drop_null().to_pylist())
    return Subject(trace_id, row["file"], tables, trace_device(row, used),
                   row["world_size"], _reader(lambda name: st.read(name, trace_id)))


def job_subject(st: Store, name: str, members: list[Member]) -> Subject:
    """A job of stored traces: its job graph (``graphstore.job``), its first rank's GPU."""
    jg = jobs.build(st, name, members)
    first = jg.members[0]
    unit = pl.from_arrow(jg.tables["unit"].select(["device", "rank"]))
    used = set(unit.filter(pl.col("rank") == first.rank)["device"].drop_nulls().to_list())
    files = sorted({m.file for m in jg.members if m.file})
    file = str(Path(files[0]).parent) if len(files) > 1 else (files[0] if files else "")
    world = max((st.trace_row(m.trace_id)["world_size"] or 0 for m in jg.members), default=0)
    have = {m.rank for m in jg.members}
    missing = [r for r in range(world) if r not in have] if world > len(have) else []
    return Subject(name, file, jg.tables, trace_device(st.trace_row(first.trace_id), used),
                   len(jg.members), _reader(job_activity(jg.members, st.read)), jg,
                   world or None, missing)


def _device_job(s: Subject) -> Subject | None:
    if not device_ranks(s.tables) or s.activity is None:
        return None
    jg = build_job(s.name, [Member(0, s.name, s.file)], [s.tables], [s.activity("kernel")])
    return Subject(s.name, s.file, jg.tables, s.device, len(jg.members), s.activity, jg)


def trace_device(row: dict, used: set[int]) -> dict | None:
    """The GPU the trace's streams ran on (device ids ``used``), from its trace row's
    ``devices``; the first one listed when none of them ran a stream; None when the trace
    lists none."""
    devs = orjson.loads(row["devices"]) if row.get("devices") else []
    return next((d for d in devs if d.get("id") in used), devs[0] if devs else None)


def _reader(read: Callable[[str], pa.Table]) -> Callable[[str], pa.Table]:
    """``read``, each table read once (several specs of one subject share it)."""
    return functools.lru_cache(maxsize=None)(read)


# ---- 2. the context -------------------------------------------------------------------------

def context(s: Subject, param_bytes: int | None = None) -> Context:
    """The rewrite Context of one prediction of S: everything an optimization may read beside
    the graph. A fresh one per spec chain (``ddp`` tells the rest of its chain the new world
    size through it)."""
    return Context(device=s.device, activity=s.activity, world_size=s.world_size,
                   param_bytes=param_bytes)


# ---- 3. predict -----------------------------------------------------------------------------

@dataclass
class Prediction:
    """``result``: the dict every entry point reports; the rest is what a caller may draw
    (``daydream.api`` writes timelines and plots from it) or keep (the job graphs, whose
    collectives the API stores for SQL)."""

    subject: Subject
    result: dict
    base: Replay | JobReplay
    pred: Replay | JobReplay | None = None
    rewritten: dict[str, pa.Table] | None = None
    job_graphs: list[JobGraph] = field(default_factory=list)


def simulate_graph(tables: dict[str, pa.Table], is_job: bool, slack=True,
                   inferred: bool = True) -> Replay | JobReplay:
    """The replay of a trace's graph or a job's."""
    return (replay_job(tables, slack, inferred) if is_job
            else replay(tables, slack, inferred))


# The explained replays a result reports beside the one that keeps every slack (ACCURACY.md,
# section 1): every slack at zero; that without the edges inferred from coincidences; and
# with only the collectives' peer-wait slack kept (what a single rank of a multi-rank job
# cannot explain without its peers).
EXPLAINED = {"explained": (False, True), "explained_no_inferred": (False, False),
             "explained_peer_wait": (frozenset({"peer_wait"}), True)}


def predict(s: Subject, spec: str | None = None, *, param_bytes: int | None = None
            ) -> Prediction:
    """Replay S, and with SPEC (an optimization chain, ``amp+fused_adam``) predict it
    rewritten, with the trace's slack kept and at zero (the prediction's interval).
    ``param_bytes``: the model's parameter bytes, where the user gives them."""
    dj = s.device_job()
    if dj is not None:
        return _predict_device_job(s, dj, spec, param_bytes)
    base = s.baseline()
    if not any(i.used for i in base.iterations):
        raise DaydreamError(f"{s.file or s.name}: no iteration with work to time (the graph "
                            f"has {s.tables['task'].num_rows} tasks)")
    explained = {k: s.baseline(*v) for k, v in EXPLAINED.items()}
    pred = rewritten = pred0 = reference = None
    notes: list[str] = []
    if spec:
        ctx = context(s, param_bytes)
        # an optimization that removes CPU work is judged on the job without the profiler:
        # the profiled host time it removes held the profiler's own cost, which the job
        # without the profiler never had (transforms/profiler.py)
        unprof = removes_cpu(spec) and "no_profiler" not in spec
        if unprof:  # no_profiler+SPEC, no_profiler computed once for every such spec
            check(spec)  # the spec's errors before any work
            g0, notes0 = s.unprofiled_graph()
            ctx.notes.extend(notes0)
            ctx.applied.append("no_profiler")
        else:
            g0 = s.graph()
        rewritten = apply(g0, spec, ctx).tables()
        pred = simulate_graph(rewritten, s.job is not None)
        pred0 = simulate_graph(rewritten, s.job is not None, slack=False)
        notes = ctx.notes
        if unprof:
            reference = (s.unprofiled(), s.unprofiled(slack=False))
            notes.append(
                f"profiler: {spec} removes host work whose profiled time includes the "
                "profiler's own cost; the prediction is the job without the profiler and its "
                f"speedup is against that job's replay "
                f"({reference[0].headline('simulated_ns') / 1e6:.2f} ms, the trace's "
                f"{base.headline('simulated_ns') / 1e6:.2f} ms)")
    out = result(s, base, pred, spec=spec, notes=notes, rewritten=rewritten,
                 explained=explained, pred_explained=pred0, reference=reference)
    graphs = [s.job] if s.job is not None else []
    return Prediction(s, out, base, pred, rewritten, graphs)


def _predict_device_job(s: Subject, dj: Subject, spec: str | None,
                        param_bytes: int | None) -> Prediction:
    """A trace whose GPU work ran on several devices, predicted as the job its devices form
    (so that every job optimization applies to it, and the baseline and the prediction are
    timed alike); what describes the unmodified trace alone (its critical path, unit load,
    slack and inferred edges) comes from the trace's own replay."""
    p = predict(dj, spec, param_bytes=param_bytes)
    own = result(s, s.baseline())
    out = dict(p.result)
    for k in TRACE_KEYS:
        if k in own:
            out[k] = own[k]
    return Prediction(dj, out, p.base, p.pred, p.rewritten, p.job_graphs)


# ---- the result -----------------------------------------------------------------------------

def result(s: Subject, base: Replay | JobReplay, pred: Replay | JobReplay | None = None, *,
           spec: str | None = None, notes: list[str] | None = None,
           rewritten: dict[str, pa.Table] | None = None,
           explained: dict[str, Replay | JobReplay] | None = None,
           pred_explained: Replay | JobReplay | None = None,
           reference: tuple[Replay | JobReplay, Replay | JobReplay] | None = None) -> dict:
    """The result dict of one prediction (the CLI's report and ``--json``, the API's return
    value; a fleet's rows are read from it, see ``daydream.fleet.row``).

    Keys, in this order (their meaning is fixed: callers and tests read them):
    ``trace_id`` (a job: its name), [job: ``job``], ``file``, [job: ``world_size``],
    ``measured_ms``, ``baseline_ms`` (the steady-state step of the used iterations, measured
    and replayed: ``simulate.replay.steady_step``), ``iterations`` (index, label, measured_ms,
    baseline_ms, error_pct, used, note, explained_ms, explained_no_inferred_ms, and with a
    prediction predicted_ms, predicted_explained_ms), [job: ``ranks``, ``collectives``,
    ``clock_offsets_ns``, ``notes``, ``straggler``, ``traced_world_size`` (the world size
    its traces record), ``missing_ranks`` (ranks of it no trace holds)], [trace:
    ``critical_path``, ``units``],
    ``baseline_error_pct``, ``measured_median_ms``, ``measured_mean_ms`` (of the used
    iterations' steps), ``measured_spread_ms`` ([fastest, slowest] used step),
    ``explained_ms``, ``explained_error_pct``, ``explained_no_inferred_ms``,
    ``explained_peer_wait_ms`` (the explained replays, ``EXPLAINED``), [trace: ``slack`` (ms
    per used iteration by kind), ``inferred_edges`` (count by kind)], ``iterations_from`` (how
    the iterations were found: ``ProfilerStep``, ``Optimizer.step`` or ``whole_trace``); with a
    prediction:
    ``opts`` (the spec), ``notes`` (modelling choices), ``predicted_ms`` (slack kept),
    ``speedup``, ``predicted_explained_ms`` (slack at zero), ``predicted_interval_ms``,
    ``speedup_interval``, [job: ``predicted_straggler``], ``phases`` (busy ms per phase,
    baseline and predicted), [trace: ``predicted_critical_path``], ``gates`` (the plausibility
    gates, ``daydream.gates``: name, ok, note; a failed gate also adds a note),
    ``reference_ms`` (the step the speedup is against: ``baseline_ms``, or the replay of the
    job without the profiler for a chain that removes CPU work). Beside the replay, [trace:
    ``profiler`` (the profiler's estimated cost per iteration, ``transforms.profiler``)]. A
    new key is
    added at the end of its section below, so every entry point reports it."""
    jg = s.job
    out: dict = {"trace_id": s.name}
    # -- what the trace (or job) is
    if jg is not None:
        out["job"] = jg.name
    out["file"] = s.file
    if jg is not None:
        out["world_size"] = len(jg.members)
    # -- the replay of the unmodified graph
    out["measured_ms"] = base.headline("measured_ns") / 1e6
    out["baseline_ms"] = base.headline("simulated_ns") / 1e6
    explained = explained or {}
    ex_its = {k: {i.index: i.simulated_ns for i in r.iterations} for k, r in explained.items()}
    out["iterations"] = [{"index": i.index, "label": i.label,
                          "measured_ms": i.measured_ns / 1e6,
                          "baseline_ms": i.simulated_ns / 1e6,
                          "error_pct": error_pct(i.simulated_ns, i.measured_ns),
                          "used": i.used, **({"note": i.note} if i.note else {}),
                          **{f"{k}_ms": _ms(v.get(i.index)) for k, v in ex_its.items()
                             if k != "explained_peer_wait"}}
                         for i in base.iterations]
    if jg is not None:
        out["ranks"] = [{"rank": m.rank, "trace_id": m.trace_id,
                         "measured_ms": base.rank_mean(m.rank, "measured_ns") / 1e6,
                         "baseline_ms": base.rank_mean(m.rank, "simulated_ns") / 1e6,
                         "error_pct": error_pct(base.rank_mean(m.rank, "simulated_ns"),
                                                base.rank_mean(m.rank, "measured_ns"))}
                        for m in jg.members]
        out["collectives"] = collectives(jg)
        out["clock_offsets_ns"] = {str(k): v for k, v in sorted(jg.clock_offset_ns.items())}
        out["notes"] = ([missing_note(s)] if s.missing_ranks else []) + list(jg.notes)
        out["straggler"] = base.straggler
        out["traced_world_size"] = s.traced_world_size
        out["missing_ranks"] = list(s.missing_ranks)
    else:
        out["critical_path"] = base.critical_path
        out["units"] = base.unit_busy
    out["baseline_error_pct"] = error_pct(out["baseline_ms"], out["measured_ms"])
    steps = [i.measured_ns / 1e6 for i in base.iterations if i.used]
    out["measured_median_ms"] = float(np.median(steps)) if steps else None
    out["measured_mean_ms"] = float(np.mean(steps)) if steps else None
    out["measured_spread_ms"] = [min(steps), max(steps)] if steps else None
    for k, r in explained.items():
        out[f"{k}_ms"] = _ms(r.headline("simulated_ns"))
    if "explained" in explained:
        out["explained_error_pct"] = error_pct(out["explained_ms"], out["measured_ms"])
    if jg is None:
        used = [i.index for i in base.iterations if i.used]
        out["slack"] = dict(s.memo(("slack", tuple(used)), lambda: slack_ms(s.tables, used)))
        out["inferred_edges"] = dict(s.memo("inferred_edges", lambda: inferred_edges(s.tables)))
        out["profiler"] = s.profiler([i.index for i in base.iterations if i.used],
                                     out["measured_ms"])
    out["iterations_from"] = iterations_from(s.tables)
    if pred is None:
        return out
    # -- the prediction
    out["opts"] = spec
    out["notes"] = out.get("notes", []) + list(notes or [])
    by_idx = {i.index: i for i in pred.iterations}
    by_idx0 = {i.index: i for i in pred_explained.iterations} if pred_explained else {}
    out["predicted_ms"] = _ms(pred.headline("simulated_ns"))
    # the step the speedup is against: the baseline, or for an optimization that removes CPU
    # work the job without the profiler (``reference``)
    ref_ms = out["baseline_ms"] if reference is None else _ms(
        reference[0].headline("simulated_ns"))
    ref0_ms = out.get("explained_ms") if reference is None else _ms(
        reference[1].headline("simulated_ns"))
    out["speedup"] = ratio(ref_ms, out["predicted_ms"])
    out["predicted_explained_ms"] = (_ms(pred_explained.headline("simulated_ns"))
                                     if pred_explained is not None else None)
    lo_hi = [v for v in (out["predicted_explained_ms"], out["predicted_ms"]) if v is not None]
    out["predicted_interval_ms"] = [min(lo_hi), max(lo_hi)] if lo_hi else None
    sp = [v for v in (out["speedup"], ratio(ref0_ms, out["predicted_explained_ms"]))
          if v is not None]
    out["speedup_interval"] = [min(sp), max(sp)] if sp else None
    for it in out["iterations"]:
        p = by_idx.get(it["index"])
        it["predicted_ms"] = p.simulated_ns / 1e6 if p else None
        p0 = by_idx0.get(it["index"])
        it["predicted_explained_ms"] = p0.simulated_ns / 1e6 if p0 else None
    ranks = len(jg.members) if jg is not None else 1
    if jg is not None:
        for r in out["ranks"]:
            r["predicted_ms"] = (pred.rank_mean(r["rank"], "simulated_ns") / 1e6
                                 if r["rank"] in pred.ranks else None)
        out["predicted_straggler"] = pred.straggler
    # the baseline's phases, once per subject (every spec's result reports them)
    base_phases = (s.memo(("phases", ranks), lambda: phase_ms(s.tables, base, ranks))
                   if base is s._cache.get(("baseline", True, True)) else
                   phase_ms(s.tables, base, ranks))
    out["phases"] = {"baseline": {k: dict(v) for k, v in base_phases.items()},
                     "predicted": phase_ms(rewritten, pred, ranks)}
    if jg is None:
        out["predicted_critical_path"] = pred.critical_path
    out["reference_ms"] = ref_ms
    out["gates"] = gates.check(spec, out["notes"], ref_ms, out["predicted_ms"],
                               s.tables, base, rewritten, pred)
    out["notes"] += gates.failed_notes(out["gates"])
    return out


def missing_note(s: Subject) -> str:
    """What a job that lacks ranks is replayed as."""
    have = s.traced_world_size - len(s.missing_ranks)
    return (f"{len(s.missing_ranks)} of the job's {s.traced_world_size} ranks have no trace "
            f"(ranks {rank_ranges(s.missing_ranks)}): the {have} present are replayed as the "
            f"whole job, so its collectives wait only for them")


def iterations_from(tables: dict[str, pa.Table]) -> str | None:
    """How the graph's iterations were found (graphstore.labels): ``ProfilerStep`` markers,
    ``Optimizer.step`` ranges, or ``whole_trace`` (no marker: the trace is one iteration)."""
    it = tables.get("iteration")
    if it is None or "source" not in it.column_names or not it.num_rows:
        return None
    return it["source"][0].as_py()


def error_pct(pred: float, meas: float) -> float | None:
    return None if not meas or pred is None else 100.0 * (pred - meas) / meas


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _ms(ns: float | None) -> float | None:
    """ns -> ms; NaN (no used iteration) and None as None."""
    return None if ns is None or ns != ns else float(ns) / 1e6


def slack_ms(tables: dict[str, pa.Table], used: list[int]) -> dict[str, float]:
    """What the graph does not explain, ms per used iteration, by kind (the slack table's
    positive slack, graphstore.schema.SLACK): summed over edges, so delays on streams that
    ran side by side add up."""
    t = tables.get("slack")
    if t is None or not t.num_rows or not used:
        return {}
    # a row per iteration and kind: a few rows, summed here rather than by a frame
    want, acc = set(used), {}
    for k, i, v in zip(t["kind"].to_pylist(), t["iteration"].to_pylist(),
                       t["slack_ns"].to_pylist(), strict=True):
        if i in want:
            acc[k] = acc.get(k, 0) + v
    return {k: acc[k] / 1e6 / len(used) for k in sorted(acc) if acc[k]}


def inferred_edges(tables: dict[str, pa.Table]) -> dict[str, int]:
    """How many edges of each kind were inferred from a coincidence of times."""
    e = tables["edge"]
    if "inferred" not in e.column_names:
        return {}
    kind = e["kind"].filter(pc.fill_null(e["inferred"], False))
    if pa.types.is_dictionary(kind.type):
        kind = kind.cast(pa.string())
    counts = pc.value_counts(kind).to_pylist()
    return dict(sorted((c["values"], c["counts"]) for c in counts))


def collectives(jg: JobGraph) -> dict:
    """How a job's collectives were matched across ranks, and how long ranks waited in them."""
    c = jg.collective
    if not c.height:
        return {"matched": 0, "kernels_joined": 0, "kernels_unmatched": jg.unmatched,
                "by_type": {}, "waiting_ms": 0.0}
    return {"matched": int(c["coll"].n_unique()), "kernels_joined": c.height,
            "kernels_unmatched": jg.unmatched,
            "by_type": dict(sorted(c.group_by("type").agg(pl.col("coll").n_unique())
                                   .iter_rows())),
            "waiting_ms": float(c["wait_ns"].sum()) / 1e6}


def phase_ms(tables: dict[str, pa.Table], rep: Replay | JobReplay, ranks: int = 1) -> dict:
    """Work per phase over the used iterations, GPU tasks and CPU tasks apart: ms per
    iteration (and per rank, for a job graph of RANKS ranks)."""
    task = tables["task"]
    used = [i.index for i in rep.iterations if i.used]
    in_used = np.isin(task["iteration"].fill_null(-1).to_numpy(), used)
    # work, not the time a task held its unit while it waited (a sync, an idle thread)
    held = (rep.work_ns if rep.work_ns is not None
            else rep.schedule.end_ns - rep.schedule.start_ns)
    phase = task["phase"]
    if pa.types.is_dictionary(phase.type):
        phase = phase.cast(pa.string())
    phase = pc.fill_null(phase, "other").combine_chunks().dictionary_encode()
    codes = phase.indices.to_numpy(zero_copy_only=False)
    gpu = _is_in(task["kind"], GPU_KINDS)
    per = 1e6 * max(len(used), 1) * max(ranks, 1)
    out = {}
    for code, name in sorted(enumerate(phase.dictionary.to_pylist()), key=lambda x: x[1]):
        sel = in_used & (codes == code)
        if sel.any():
            out[name] = {"gpu_ms": float(held[sel & gpu].sum() / per),
                         "cpu_ms": float(held[sel & ~gpu].sum() / per)}
    return out


def _is_in(col: pa.ChunkedArray, values: tuple[str, ...]) -> np.ndarray:
    """Whether each value of a string (or dictionary) column is one of VALUES."""
    arr = col.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        lut = np.isin(np.asarray(arr.dictionary.to_pylist(), object), values)
        return lut[arr.indices.to_numpy(zero_copy_only=False)]
    return pc.is_in(arr, value_set=pa.array(values, arr.type)).to_numpy(zero_copy_only=False)
