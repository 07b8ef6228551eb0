"""The prediction result's declared type: ``as_dict`` gives the keys ``daydream predict --json``
prints, in their fixed order, for a trace, a job and a trace predicted as the job of its
devices; ``row`` gives the prediction table's columns."""

from __future__ import annotations

from dataclasses import replace

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
from daydream.graphstore.schema import PREDICTION

IT = IterationTimes(index=0, label="ProfilerStep#1", measured_ms=2.0, baseline_ms=2.0,
                    error_pct=0.0, used=True, note=None, explained_ms=1.5,
                    explained_no_inferred_ms=1.6)
TRACE = TraceFacts(critical_path={"span_ns": 1}, unit_load=[], slack_ms={"launch": 0.5},
                   inferred_edges={"wake": 1}, profiler=None)
JOB = JobFacts(name="j", world_size=2, ranks=(RankTimes(0, "a", 2.0, 2.0, 0.0),
                                              RankTimes(1, "b", 1.0, 1.0, 0.0)),
               collectives={}, clock_offsets_ns={"0": 0, "1": 5}, straggler={},
               traced_world_size=2, missing_ranks=())
REPLAY = PredictionResult(
    trace_id="t", file="f.json", measured_ms=2.0, baseline_ms=2.0, iterations=(IT,),
    baseline_error_pct=0.0, measured_median_ms=2.0, measured_mean_ms=2.0,
    measured_spread_ms=(2.0, 2.0), explained_ms=1.5, explained_no_inferred_ms=1.6,
    explained_peer_wait_ms=1.5, explained_error_pct=-25.0, iterations_from="ProfilerStep",
    trace=TRACE)
PREDICTED = dict(
    spec="amp", predicted_ms=1.0, speedup=2.0, predicted_explained_ms=0.9,
    predicted_interval_ms=(0.9, 1.0), speedup_interval=(2.0, 2.2),
    phases=Phases({"forward": PhaseTimes(1.0, 0.5)}, {"forward": PhaseTimes(0.5, 0.5)}),
    predicted_critical_path={"span_ns": 1}, reference_ms=2.0, notes=("amp: a note",),
    gates=(Gate("floor", True, "ok", {"cpu_ms": 0.1}), Gate("applies", False, "no")))

BASE_KEYS = ["measured_ms", "baseline_ms", "iterations"]
TAIL_KEYS = ["baseline_error_pct", "measured_median_ms", "measured_mean_ms",
             "measured_spread_ms", "explained_ms", "explained_no_inferred_ms",
             "explained_peer_wait_ms", "explained_error_pct"]
JOB_KEYS = ["ranks", "collectives", "clock_offsets_ns", "notes", "straggler",
            "traced_world_size", "missing_ranks"]


def test_a_traces_keys_in_their_order():
    assert list(REPLAY.as_dict()) == ["trace_id", "file", *BASE_KEYS, "critical_path", "units",
                                      *TAIL_KEYS, "slack", "inferred_edges", "profiler",
                                      "iterations_from"]
    d = replace(REPLAY, **PREDICTED, timeline_path="t.json").as_dict()
    assert list(d) == ["trace_id", "file", *BASE_KEYS, "critical_path", "units", *TAIL_KEYS,
                       "slack", "inferred_edges", "profiler", "iterations_from", "opts",
                       "notes", "predicted_ms", "speedup", "predicted_explained_ms",
                       "predicted_interval_ms", "speedup_interval", "phases",
                       "predicted_critical_path", "reference_ms", "gates", "timeline"]
    assert d["predicted_interval_ms"] == [0.9, 1.0] and d["measured_spread_ms"] == [2.0, 2.0]
    assert d["phases"]["predicted"]["forward"] == {"gpu_ms": 0.5, "cpu_ms": 0.5}
    assert d["gates"] == [{"name": "floor", "ok": True, "floor": {"cpu_ms": 0.1}, "note": "ok"},
                          {"name": "applies", "ok": False, "note": "no"}]
    assert list(d["iterations"][0]) == [
        "index", "label", "measured_ms", "baseline_ms", "error_pct", "used", "explained_ms",
        "explained_no_inferred_ms", "predicted_ms", "predicted_explained_ms", "reference_ms"]


def test_a_jobs_keys_and_a_device_jobs_trace_facts_at_the_end():
    job = replace(REPLAY, trace=None, job=JOB, notes=("a job note",))
    assert list(job.as_dict()) == ["trace_id", "job", "file", "world_size", *BASE_KEYS,
                                   *JOB_KEYS, *TAIL_KEYS, "iterations_from"]
    pred = replace(job, **{**PREDICTED, "notes": ("a job note", "amp: a note"),
                           "predicted_critical_path": None})
    d = pred.as_dict()
    assert list(d) == ["trace_id", "job", "file", "world_size", *BASE_KEYS, *JOB_KEYS,
                       *TAIL_KEYS, "iterations_from", "opts", "predicted_ms", "speedup",
                       "predicted_explained_ms", "predicted_interval_ms", "speedup_interval",
                       "predicted_straggler", "phases", "reference_ms", "gates"]
    assert d["notes"] == ["a job note", "amp: a note"]
    assert list(d["ranks"][0]) == ["rank", "trace_id", "measured_ms", "baseline_ms",
                                   "error_pct", "predicted_ms"]
    devices = replace(pred, trace=TRACE).as_dict()
    assert list(devices)[-5:] == ["critical_path", "units", "slack", "inferred_edges",
                                  "profiler"]


def test_row_is_the_prediction_tables_row():
    p = replace(REPLAY, **PREDICTED)
    row = p.row("t", "amp")
    assert list(row) == [n for n in PREDICTION.names if n != "created"]
    assert row["gates_failed"] == ["applies"] and row["iterations"] == 1
    assert (row["predicted_low_ms"], row["speedup_high"]) == (0.9, 2.2)
    assert row["notes"] == "amp: a note"

