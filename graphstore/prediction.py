"""What one prediction reports: ``PredictionResult``, declared field by field (type, unit in the
name, one line of doc), as ``schema.PREDICTION`` declares the row a fleet keeps of it.

``daydream.pipeline.result`` builds it; every entry point returns it (``daydream.api.predict``,
``daydream predict``, ``predict --all``'s workers), and the report, the HTML report,
``compare``, ``advise`` and the fleet's row read its fields. ``as_dict`` is what ``--json``
prints: its keys, their order and their values are a fixed contract (users and scripts read
``measured_ms``, ``predicted_ms``, ``speedup``, ``phases.baseline.<phase>.gpu_ms``, ...), so a
field whose attribute name differs from its JSON key says so in its doc. ``row`` is the
prediction table's row of it (``schema.PREDICTION``, less ``created``).

A result describes either a trace (``trace`` set, ``job`` None), a job of several traces
(``job`` set, ``trace`` None) or a trace whose GPU work ran on several devices, predicted as the
job its devices form (both set: the job's timing, the trace's own critical path, unit load,
slack and profiler). It holds a prediction when ``spec`` is set; without one it is the replay
of the unmodified graph alone.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IterationTimes:
    """One iteration of the trace: measured, replayed and (with a prediction) predicted."""

    index: int  # 0-based index of the iteration in the trace
    label: str | None  # the marker it came from, e.g. 'ProfilerStep#12' (None: whole trace)
    measured_ms: float  # its measured step, ms
    baseline_ms: float  # its step in the replay of the unmodified graph, ms
    error_pct: float | None  # (baseline - measured) / measured, percent
    used: bool  # counted in the steady state
    note: str | None  # why it is not used (JSON: absent when None)
    explained_ms: float | None  # its step with every slack at zero, ms
    explained_no_inferred_ms: float | None  # the same without the inferred edges, ms
    predicted_ms: float | None = None  # its predicted step, slack kept, ms
    predicted_explained_ms: float | None = None  # its predicted step, slack at zero, ms
    reference_ms: float | None = None  # its step in the replay the speedup is against (the
    # result's ``reference_ms``): baseline_ms, or the replay without the profiler, ms

    def as_dict(self, predicted: bool) -> dict:
        """As ``--json`` prints it (PREDICTED: the result holds a prediction)."""
        d = {"index": self.index, "label": self.label, "measured_ms": self.measured_ms,
             "baseline_ms": self.baseline_ms, "error_pct": self.error_pct, "used": self.used}
        if self.note:
            d["note"] = self.note
        d["explained_ms"] = self.explained_ms
        d["explained_no_inferred_ms"] = self.explained_no_inferred_ms
        if predicted:
            d["predicted_ms"] = self.predicted_ms
            d["predicted_explained_ms"] = self.predicted_explained_ms
            d["reference_ms"] = self.reference_ms
        return d


@dataclass(frozen=True)
class RankTimes:
    """One rank of a job: its mean used step, measured, replayed and predicted."""

    rank: int  # the rank
    trace_id: str  # its trace
    measured_ms: float  # its mean measured step, ms
    baseline_ms: float  # its mean step in the job's replay, ms
    error_pct: float | None  # (baseline - measured) / measured, percent
    predicted_ms: float | None = None  # its mean predicted step, ms (None: not in the prediction)

    def as_dict(self, predicted: bool) -> dict:
        d = {"rank": self.rank, "trace_id": self.trace_id, "measured_ms": self.measured_ms,
             "baseline_ms": self.baseline_ms, "error_pct": self.error_pct}
        if predicted:
            d["predicted_ms"] = self.predicted_ms
        return d


@dataclass(frozen=True)
class PhaseTimes:
    """Busy time of one phase per used iteration (and rank, for a job)."""

    gpu_ms: float  # GPU tasks' work, ms
    cpu_ms: float  # CPU tasks' work, ms

    def as_dict(self) -> dict:
        return {"gpu_ms": self.gpu_ms, "cpu_ms": self.cpu_ms}


@dataclass(frozen=True)
class Phases:
    """The phase breakdown before and after the optimization, by phase name (in
    ``pipeline.phase_ms``'s order: sorted by name)."""

    baseline: dict[str, PhaseTimes]  # the unmodified graph's replay
    predicted: dict[str, PhaseTimes]  # the rewritten graph's simulation

    def as_dict(self) -> dict:
        return {"baseline": {k: v.as_dict() for k, v in self.baseline.items()},
                "predicted": {k: v.as_dict() for k, v in self.predicted.items()}}


@dataclass(frozen=True)
class Gate:
    """One plausibility gate of a prediction (``daydream.gates``)."""

    name: str  # no_slowdown, slowdown_named, floor or applies
    ok: bool  # passed
    note: str  # what it checked, and why it failed where it did
    floor: dict | None = None  # floor only: the work left per iteration (cpu_ms, gpu_ms, and
    # the busiest units, cpu_unit and gpu_unit); JSON: absent when None

    def as_dict(self) -> dict:
        d: dict = {"name": self.name, "ok": self.ok}
        if self.floor is not None:
            d["floor"] = self.floor
        d["note"] = self.note
        return d


@dataclass(frozen=True)
class TraceFacts:
    """What describes one trace's replay beyond its times (a job of several traces has
    none)."""

    critical_path: dict  # the median used iteration's critical path by phase, kind and layer
    # (``simulate.replay.critical_path_summary``: span_ns, tasks, by_phase, ...)
    unit_load: list[dict]  # per unit: unit, busy_ns, busy_share (JSON: ``units``)
    slack_ms: dict[str, float]  # slack per used iteration by kind, ms (JSON: ``slack``)
    inferred_edges: dict[str, int]  # count of inferred edges by kind
    profiler: dict | None  # the profiler's estimated cost per iteration
    # (``transforms.profiler.estimate``); None without op ranges


@dataclass(frozen=True)
class JobFacts:
    """What a job's replay reports of its ranks (a single trace has none)."""

    name: str  # the job's name (JSON: ``job``)
    world_size: int  # ranks replayed
    ranks: tuple[RankTimes, ...]  # per rank
    collectives: dict  # collectives matched across ranks (``jobs.collectives``)
    clock_offsets_ns: dict[str, int]  # each rank's clock offset to the first one's, ns
    straggler: dict  # the rank that arrived last at collectives, and why (``simulate.job``)
    traced_world_size: int | None  # the world size its traces record
    missing_ranks: tuple[int, ...]  # ranks of the job that no trace holds
    predicted_straggler: dict | None = None  # the straggler in the prediction


@dataclass(frozen=True)
class PredictionResult:
    """One replay of a trace or job, and with ``spec`` one what-if prediction of it. Times
    are steady-state steps (the used iterations, ``simulate.replay.steady_step``)."""

    trace_id: str  # the trace id; a job: its name
    file: str  # the trace file, or the folder of a job's rank traces
    measured_ms: float  # the measured step, ms
    baseline_ms: float  # the step in the replay of the unmodified graph, ms
    iterations: tuple[IterationTimes, ...]  # per iteration
    baseline_error_pct: float | None  # (baseline - measured) / measured, percent
    measured_median_ms: float | None  # median of the used iterations' measured steps, ms
    measured_mean_ms: float | None  # their mean, ms
    measured_spread_ms: tuple[float, float] | None  # the fastest and slowest used step, ms
    explained_ms: float | None  # the replay with every slack at zero, ms
    explained_no_inferred_ms: float | None  # the same without the inferred edges, ms
    explained_peer_wait_ms: float | None  # with only the collectives' peer waits kept, ms
    explained_error_pct: float | None  # (explained - measured) / measured, percent
    iterations_from: str | None  # how the iterations were found: ProfilerStep,
    # Optimizer.step or whole_trace
    job: JobFacts | None = None  # a job's ranks (None: a single trace)
    trace: TraceFacts | None = None  # a trace's critical path, unit load, slack, profiler
    notes: tuple[str, ...] = ()  # a job's notes, then the prediction's modelling choices and a
    # note per failed gate (JSON: absent for a trace without a prediction)
    # -- the prediction (all None without ``spec``)
    spec: str | None = None  # the optimization spec, e.g. 'amp+fused_adam' (JSON: ``opts``)
    predicted_ms: float | None = None  # the predicted step, slack kept, ms
    speedup: float | None = None  # reference_ms / predicted_ms (> 1 is faster), a ratio
    predicted_explained_ms: float | None = None  # the predicted step, slack at zero, ms
    predicted_interval_ms: tuple[float, float] | None = None  # the lesser and greater of the
    # two predicted steps, ms
    speedup_interval: tuple[float, float] | None = None  # the speedup's interval (the same
    # two replays), ratios
    phases: Phases | None = None  # busy ms per phase, baseline and predicted
    predicted_critical_path: dict | None = None  # a trace: the prediction's critical path
    reference_ms: float | None = None  # the step the speedup is against: baseline_ms, or the
    # replay of the job without the profiler for a chain that removes CPU work, ms
    gates: tuple[Gate, ...] = ()  # the plausibility gates (``daydream.gates``)
    # -- what the API wrote beside it (``daydream.api``)
    timeline_path: str | None = None  # the Chrome trace written (JSON: ``timeline``)
    plot_path: str | None = None  # the PNG written (JSON: ``plot``)
    plot_iteration: int | None = None  # the iteration the plot draws

    @property
    def predicted(self) -> bool:
        """Whether this is a prediction (else the replay alone)."""
        return self.spec is not None

    @property
    def name(self) -> str:
        """The job's name, or the trace id."""
        return self.job.name if self.job is not None else self.trace_id

    @property
    def used_iterations(self) -> int:
        """How many iterations the steady state is over."""
        return sum(bool(i.used) for i in self.iterations)

    @property
    def failed_gates(self) -> list[str]:
        """The names of the gates that failed, in the order they were checked."""
        return [g.name for g in self.gates if not g.ok]

    def as_dict(self) -> dict:
        """The result as ``daydream predict --json`` prints it: every key in its fixed order."""
        p, j, t = self.predicted, self.job, self.trace
        d: dict = {"trace_id": self.trace_id}
        if j is not None:
            d["job"] = j.name
        d["file"] = self.file
        if j is not None:
            d["world_size"] = j.world_size
        d["measured_ms"] = self.measured_ms
        d["baseline_ms"] = self.baseline_ms
        d["iterations"] = [i.as_dict(p) for i in self.iterations]
        if j is not None:
            d["ranks"] = [r.as_dict(p) for r in j.ranks]
            d["collectives"] = j.collectives
            d["clock_offsets_ns"] = j.clock_offsets_ns
            d["notes"] = list(self.notes)
            d["straggler"] = j.straggler
            d["traced_world_size"] = j.traced_world_size
            d["missing_ranks"] = list(j.missing_ranks)
        elif t is not None:
            d["critical_path"] = t.critical_path
            d["units"] = t.unit_load
        d["baseline_error_pct"] = self.baseline_error_pct
        d["measured_median_ms"] = self.measured_median_ms
        d["measured_mean_ms"] = self.measured_mean_ms
        d["measured_spread_ms"] = _list(self.measured_spread_ms)
        d["explained_ms"] = self.explained_ms
        d["explained_no_inferred_ms"] = self.explained_no_inferred_ms
        d["explained_peer_wait_ms"] = self.explained_peer_wait_ms
        d["explained_error_pct"] = self.explained_error_pct
        if j is None and t is not None:
            _trace_tail(d, t)
        d["iterations_from"] = self.iterations_from
        if p:
            d["opts"] = self.spec
            if j is None:
                d["notes"] = list(self.notes)
            d["predicted_ms"] = self.predicted_ms
            d["speedup"] = self.speedup
            d["predicted_explained_ms"] = self.predicted_explained_ms
            d["predicted_interval_ms"] = _list(self.predicted_interval_ms)
            d["speedup_interval"] = _list(self.speedup_interval)
            if j is not None:
                d["predicted_straggler"] = j.predicted_straggler
            d["phases"] = self.phases.as_dict() if self.phases is not None else None
            if j is None:
                d["predicted_critical_path"] = self.predicted_critical_path
            d["reference_ms"] = self.reference_ms
            d["gates"] = [g.as_dict() for g in self.gates]
        if j is not None and t is not None:  # a trace predicted as the job of its devices
            d["critical_path"] = t.critical_path
            d["units"] = t.unit_load
            _trace_tail(d, t)
        if self.timeline_path is not None:
            d["timeline"] = self.timeline_path
        if self.plot_path is not None:
            d["plot"] = self.plot_path
            d["plot_iteration"] = self.plot_iteration
        return d

    def row(self, trace_id: str, spec: str) -> dict:
        """The prediction table's row of this prediction (``schema.PREDICTION``, less
        ``created``): what ``daydream predict`` reports of it, the interval and the failed
        gates included."""
        lo, hi = self.predicted_interval_ms or (None, None)
        slo, shi = self.speedup_interval or (None, None)
        return {
            "trace_id": trace_id, "spec": spec,
            "measured_ms": _num(self.measured_ms), "baseline_ms": _num(self.baseline_ms),
            "predicted_ms": self.predicted_ms, "speedup": self.speedup,
            "reference_ms": _num(self.reference_ms),
            "predicted_low_ms": lo, "predicted_high_ms": hi,
            "speedup_low": slo, "speedup_high": shi,
            "gates_failed": self.failed_gates,
            "iterations": self.used_iterations,
            "notes": "\n".join(self.notes) or None,
        }


def _trace_tail(d: dict, t: TraceFacts) -> None:
    d["slack"] = t.slack_ms
    d["inferred_edges"] = t.inferred_edges
    d["profiler"] = t.profiler


def _list(pair: tuple | None) -> list | None:
    return None if pair is None else list(pair)


def _num(x: float | None) -> float | None:
    return None if x is None or x != x else x  # NaN (no used iteration) is stored as NULL
