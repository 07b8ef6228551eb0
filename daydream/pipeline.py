"""The one prediction path: a trace or a job -> its graph -> the rewrite Context -> the rewritten
graph -> its simulation -> the result (``daydream.graphstore.prediction.PredictionResult``).

Every entry point runs it: ``daydream predict TRACE|JOB`` and ``daydream.predict`` through
``daydream.api.predict``, and every worker of ``daydream predict --all`` (``daydream.fleet``), so
that they cannot disagree. Outline:

  1. ``resolve``: what the user typed (a trace file, id or id prefix, a job name, a folder of
     rank traces) -> a ``Subject``: its graph tables and what the store knows beside them
     (device, world size, a reader of its activity tables);
  2. ``context``: the ``transforms.Context`` every rewrite of that subject gets;
  3. ``predict``: the unmodified graph replayed (once per subject), the rewritten one
     simulated, and ``result`` builds the ``PredictionResult`` that the CLI prints, the API
     returns and the fleet keeps a row of. A trace whose GPU work ran on several devices is a
     job by itself: its prediction adds the job's ranks and collectives.

It writes nothing: storing a job's collectives is the caller's (``daydream.api``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from daydream import gates, jobs
from daydream.base.columns import is_in, numpy_filled
from daydream.base.errors import DaydreamError
from daydream.graphstore.job import JobGraph, Member, build_job, device_ranks, job_activity
from daydream.graphstore.prediction import (
    Gate,
    IterationTimes,
    JobFacts,
    Phases,
    PhaseTimes,
    PredictionResult,
    RankTimes,
    TraceFacts,
)
from daydream.graphstore.schema import GPU_KINDS
from daydream.ingest.store import Store, devices_of
from daydream.report import rank_ranges
from daydream.simulate.job import JobReplay, replay_job
from daydream.simulate.replay import Replay, replay
from daydream.traces import ensure_graphs, resolve_trace
from daydream.transforms import Context
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import apply, check, removes_cpu

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
    devs = devices_of(row.get("devices")) or []
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
    """``result``: what every entry point reports (``PredictionResult``); the rest is what a
    caller may draw (``daydream.api`` writes timelines and plots from it) or keep (the job
    graphs, whose collectives the API stores for SQL)."""

    subject: Subject
    result: PredictionResult
    base: Replay | JobReplay
    pred: Replay | JobReplay | None = None
    rewritten: dict[str, pa.Table] | None = None
    job_graphs: list[JobGraph] = field(default_factory=list)
    # what the chain did to a step's memory (the rewrite Context's ``memory``: the batch
    # sizes, for transforms.memory.predicted_peak); empty for a replay
    memory: dict = field(default_factory=dict)


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


def predict(s: Subject, spec: str | None = None, *, param_bytes: int | None = None,
            detail: bool = True) -> Prediction:
    """Replay S, and with SPEC (an optimization chain, ``amp+fused_adam``) predict it
    rewritten, with the trace's slack kept and at zero (the prediction's interval).
    ``param_bytes``: the model's parameter bytes, where the user gives them. ``detail``
    False: only what a fleet's row keeps (``PredictionResult.row``; ``result``'s DETAIL)."""
    dj = s.device_job()
    if dj is not None:
        return _predict_device_job(s, dj, spec, param_bytes, detail)
    base = s.baseline()
    if not any(i.used for i in base.iterations):
        raise DaydreamError(f"{s.file or s.name}: no iteration with work to time (the graph "
                            f"has {s.tables['task'].num_rows} tasks)")
    explained = {k: s.baseline(*v) for k, v in EXPLAINED.items()
                 if detail or k == "explained"}
    pred = rewritten = pred0 = reference = None
    notes: list[str] = []
    memory: dict = {}
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
        memory = ctx.memory
        if unprof:
            reference = (s.unprofiled(), s.unprofiled(slack=False))
            notes.append(
                f"profiler: {spec} removes host work whose profiled time includes the "
                "profiler's own cost; the prediction is the job without the profiler and its "
                f"speedup is against that job's replay "
                f"({reference[0].headline('simulated_ns') / 1e6:.2f} ms, the trace's "
                f"{base.headline('simulated_ns') / 1e6:.2f} ms)")
    out = result(s, base, pred, spec=spec, notes=notes, rewritten=rewritten,
                 explained=explained, pred_explained=pred0, reference=reference,
                 detail=detail)
    graphs = [s.job] if s.job is not None else []
    return Prediction(s, out, base, pred, rewritten, graphs, memory)


def _predict_device_job(s: Subject, dj: Subject, spec: str | None,
                        param_bytes: int | None, detail: bool = True) -> Prediction:
    """A trace whose GPU work ran on several devices, predicted as the job its devices form
    (so that every job optimization applies to it, and the baseline and the prediction are
    timed alike); what describes the unmodified trace alone (its critical path, unit load,
    slack, inferred edges and profiler, and how its iterations were found) comes from the
    trace's own replay."""
    p = predict(dj, spec, param_bytes=param_bytes, detail=detail)
    base = s.baseline()
    out = replace(p.result, iterations_from=iterations_from(s.tables),
                  trace=trace_facts(s, base, base.headline("measured_ns") / 1e6)
                  if detail else None)
    return Prediction(dj, out, p.base, p.pred, p.rewritten, p.job_graphs, p.memory)


# ---- the result -----------------------------------------------------------------------------

def result(s: Subject, base: Replay | JobReplay, pred: Replay | JobReplay | None = None, *,
           explained: dict[str, Replay | JobReplay],
           spec: str | None = None, notes: list[str] | None = None,
           rewritten: dict[str, pa.Table] | None = None,
           pred_explained: Replay | JobReplay | None = None,
           reference: tuple[Replay | JobReplay, Replay | JobReplay] | None = None,
           detail: bool = True) -> PredictionResult:
    """The result of one prediction (``daydream.graphstore.prediction.PredictionResult``: the
    CLI's report and ``--json``, the API's return value, a fleet's row): the replay of the
    unmodified graph BASE with the EXPLAINED replays (``EXPLAINED``), and with SPEC the
    prediction PRED of the REWRITTEN graph (slack kept; PRED_EXPLAINED: at zero), its speedup
    against BASE or, for a chain that removes CPU work, against the replay of the job without
    the profiler (REFERENCE: slack kept and at zero). DETAIL False: only what the prediction
    table's row keeps (``PredictionResult.row``), for a fleet: EXPLAINED holds the explained
    replay alone (the interval's), and the trace's facts, the phases and the critical
    paths, which no row keeps, are not computed (None)."""
    jg = s.job
    measured_ms = base.headline("measured_ns") / 1e6
    baseline_ms = base.headline("simulated_ns") / 1e6
    ex_its = {k: {i.index: i.simulated_ns for i in r.iterations} for k, r in explained.items()}
    by_idx = {i.index: i for i in pred.iterations} if pred is not None else {}
    by_idx0 = {i.index: i for i in pred_explained.iterations} if pred_explained else {}
    # each iteration's reference: its replay, or its replay without the profiler
    by_ref = ({i.index: i for i in reference[0].iterations} if reference is not None else
              {i.index: i for i in base.iterations} if pred is not None else {})

    def it_pred(by: dict, index: int) -> float | None:
        p = by.get(index)
        return p.simulated_ns / 1e6 if p else None
    iterations = tuple(IterationTimes(
        index=i.index, label=i.label, measured_ms=i.measured_ns / 1e6,
        baseline_ms=i.simulated_ns / 1e6, error_pct=error_pct(i.simulated_ns, i.measured_ns),
        used=i.used, note=i.note or None,
        explained_ms=_ms(ex_its["explained"].get(i.index)),
        explained_no_inferred_ms=_ms(ex_its.get("explained_no_inferred", {}).get(i.index)),
        predicted_ms=it_pred(by_idx, i.index), predicted_explained_ms=it_pred(by_idx0, i.index),
        reference_ms=it_pred(by_ref, i.index))
        for i in base.iterations)
    steps = [i.measured_ns / 1e6 for i in base.iterations if i.used]
    ex_ms = {k: _ms(r.headline("simulated_ns")) for k, r in explained.items()}
    job = trace = None
    all_notes = []
    if jg is not None:
        job = JobFacts(
            name=jg.name, world_size=len(jg.members),
            ranks=tuple(RankTimes(
                rank=m.rank, trace_id=m.trace_id,
                measured_ms=base.rank_mean(m.rank, "measured_ns") / 1e6,
                baseline_ms=base.rank_mean(m.rank, "simulated_ns") / 1e6,
                error_pct=error_pct(base.rank_mean(m.rank, "simulated_ns"),
                                    base.rank_mean(m.rank, "measured_ns")),
                predicted_ms=(pred.rank_mean(m.rank, "simulated_ns") / 1e6
                              if pred is not None and m.rank in pred.ranks else None))
                for m in jg.members),
            collectives=collectives(jg),
            clock_offsets_ns={str(k): v for k, v in sorted(jg.clock_offset_ns.items())},
            straggler=base.straggler, traced_world_size=s.traced_world_size,
            missing_ranks=tuple(s.missing_ranks),
            predicted_straggler=pred.straggler if pred is not None else None)
        all_notes = ([missing_note(s)] if s.missing_ranks else []) + list(jg.notes)
    elif detail:
        trace = trace_facts(s, base, measured_ms)
    out = PredictionResult(
        trace_id=s.name, file=s.file, measured_ms=measured_ms, baseline_ms=baseline_ms,
        iterations=iterations, baseline_error_pct=error_pct(baseline_ms, measured_ms),
        measured_median_ms=float(np.median(steps)) if steps else None,
        measured_mean_ms=float(np.mean(steps)) if steps else None,
        measured_spread_ms=(min(steps), max(steps)) if steps else None,
        explained_ms=ex_ms["explained"],
        explained_no_inferred_ms=ex_ms.get("explained_no_inferred"),
        explained_peer_wait_ms=ex_ms.get("explained_peer_wait"),
        explained_error_pct=error_pct(ex_ms["explained"], measured_ms),
        iterations_from=iterations_from(s.tables), job=job, trace=trace,
        notes=tuple(all_notes))
    if pred is None:
        return out
    # -- the prediction
    all_notes += list(notes or [])
    predicted_ms = _ms(pred.headline("simulated_ns"))
    # the step the speedup is against: the baseline, or for an optimization that removes CPU
    # work the job without the profiler (``reference``)
    ref_ms = baseline_ms if reference is None else _ms(reference[0].headline("simulated_ns"))
    ref0_ms = ex_ms["explained"] if reference is None else _ms(
        reference[1].headline("simulated_ns"))
    speedup = ratio(ref_ms, predicted_ms)
    predicted0_ms = (_ms(pred_explained.headline("simulated_ns"))
                     if pred_explained is not None else None)
    lo_hi = [v for v in (predicted0_ms, predicted_ms) if v is not None]
    sp = [v for v in (speedup, ratio(ref0_ms, predicted0_ms)) if v is not None]
    ranks = len(jg.members) if jg is not None else 1
    phases = None
    if detail:
        # the baseline's phases, once per subject (every spec's result reports them)
        base_phases = (s.memo(("phases", ranks), lambda: phase_ms(s.tables, base, ranks))
                       if base is s._cache.get(("baseline", True, True)) else
                       phase_ms(s.tables, base, ranks))
        phases = Phases(baseline=_phase_times(base_phases),
                        predicted=_phase_times(phase_ms(rewritten, pred, ranks)))
    checked = gates.check(spec, all_notes, ref_ms, predicted_ms, s.tables, base, rewritten,
                          pred)
    all_notes += gates.failed_notes(checked)
    return replace(
        out, notes=tuple(all_notes), spec=spec, predicted_ms=predicted_ms, speedup=speedup,
        predicted_explained_ms=predicted0_ms,
        predicted_interval_ms=(min(lo_hi), max(lo_hi)) if lo_hi else None,
        speedup_interval=(min(sp), max(sp)) if sp else None,
        phases=phases,
        predicted_critical_path=pred.critical_path if jg is None and detail else None,
        reference_ms=ref_ms,
        gates=tuple(Gate(name=g["name"], ok=g["ok"], note=g["note"], floor=g.get("floor"))
                    for g in checked))


def trace_facts(s: Subject, base: Replay, measured_ms: float) -> TraceFacts:
    """What the result of a single trace reports of its replay BASE beyond its times."""
    used = [i.index for i in base.iterations if i.used]
    return TraceFacts(
        critical_path=base.critical_path, unit_load=base.unit_busy,
        slack_ms=dict(s.memo(("slack", tuple(used)), lambda: slack_ms(s.tables, used))),
        inferred_edges=dict(s.memo("inferred_edges", lambda: inferred_edges(s.tables))),
        profiler=s.profiler(used, measured_ms))


def _phase_times(phases: dict[str, dict[str, float]]) -> dict[str, PhaseTimes]:
    return {k: PhaseTimes(gpu_ms=v["gpu_ms"], cpu_ms=v["cpu_ms"]) for k, v in phases.items()}


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
    in_used = np.isin(numpy_filled(task["iteration"], -1), used)
    # work, not the time a task held its unit while it waited (a sync, an idle thread)
    held = (rep.work_ns if rep.work_ns is not None
            else rep.schedule.end_ns - rep.schedule.start_ns)
    phase = task["phase"]
    if pa.types.is_dictionary(phase.type):
        phase = phase.cast(pa.string())
    phase = pc.fill_null(phase, "other").combine_chunks().dictionary_encode()
    codes = phase.indices.to_numpy(zero_copy_only=False)
    gpu = is_in(task["kind"], GPU_KINDS)
    per = 1e6 * max(len(used), 1) * max(ranks, 1)
    out = {}
    for code, name in sorted(enumerate(phase.dictionary.to_pylist()), key=lambda x: x[1]):
        sel = in_used & (codes == code)
        if sel.any():
            out[name] = {"gpu_ms": float(held[sel & gpu].sum() / per),
                         "cpu_ms": float(held[sel & ~gpu].sum() / per)}
    return out
