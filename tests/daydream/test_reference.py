"""Every output that shows a prediction shows the step its speedup divides (the reference:
the replay, or for an optimization that removes host work the replay without the profiler),
and the speedup shown is that reference over the predicted step (issue 37)."""

from __future__ import annotations

import csv
import io

from daydream import report
from daydream.graphstore.prediction import IterationTimes, PredictionResult, TraceFacts
from daydream.text_table import render


def _result(spec: str, predicted: float, reference: float, per_it: list[tuple]) -> PredictionResult:
    """A prediction of a two-iteration trace replayed at 16 ms a step, made by hand: PER_IT
    holds (replayed, reference, predicted) ms per iteration."""
    its = tuple(IterationTimes(index=k, label=f"ProfilerStep#{k}", measured_ms=b,
                               baseline_ms=b, error_pct=0.0, used=True, note=None,
                               explained_ms=b, explained_no_inferred_ms=b, predicted_ms=p,
                               predicted_explained_ms=p, reference_ms=r)
                for k, (b, r, p) in enumerate(per_it))
    return PredictionResult(
        trace_id="t", file="t.json", measured_ms=16.0, baseline_ms=16.0, iterations=its,
        baseline_error_pct=0.0, measured_median_ms=16.0, measured_mean_ms=16.0,
        measured_spread_ms=(16.0, 16.0), explained_ms=16.0, explained_no_inferred_ms=16.0,
        explained_peer_wait_ms=None, explained_error_pct=0.0, iterations_from="ProfilerStep",
        trace=TraceFacts(critical_path={}, unit_load=[], slack_ms={}, inferred_edges={},
                         profiler=None),
        spec=spec, predicted_ms=predicted, speedup=reference / predicted,
        predicted_explained_ms=predicted, predicted_interval_ms=(predicted, predicted),
        speedup_interval=(reference / predicted, reference / predicted),
        reference_ms=reference)


# cuda_graphs against the job without the profiler (11.5 ms), fused_adam against the replay
GRAPHS = _result("cuda_graphs", 5.75, 11.5, [(16.0, 11.5, 5.75), (16.0, 11.5, 5.75)])
FUSED = _result("fused_adam", 10.0, 16.0, [(16.0, 16.0, 10.0), (16.0, 16.0, 10.0)])
# fusion on a trace with nothing to fuse: unchanged is the reference's time at 1.000x
UNCHANGED = _result("fusion", 11.5, 11.5, [(16.0, 11.5, 11.5), (16.0, 11.5, 11.5)])


def _rows(t) -> list[dict]:
    return [dict(zip([c.header for c in t.columns], r, strict=True)) for r in t.rows]


def test_the_predictions_table_shows_the_step_its_speedup_divides():
    t = report.predictions_table([GRAPHS, FUSED, UNCHANGED])
    rows = {r["optimization"]: r for r in _rows(t)}
    assert rows["cuda_graphs"]["reference ms"] == "11.500"
    assert rows["cuda_graphs"]["reference"] == "replay without profiler"
    assert rows["cuda_graphs"]["speedup"] == "2.000x"   # 11.5 / 5.75, not 16 / 5.75
    assert rows["fused_adam"]["reference ms"] == "16.000"
    assert rows["fused_adam"]["reference"] == "replay"
    assert rows["fusion"]["reference ms"] == rows["fusion"]["predicted ms"] == "11.500"
    assert rows["fusion"]["speedup"] == "1.000x"
    assert "reference ms / predicted ms" in render(t, None)


def test_csv_has_the_reference_column_a_script_divides():
    text = report.prediction_csv([GRAPHS, FUSED])
    rows = list(csv.DictReader(io.StringIO(text)))
    for r in rows:
        assert float(r["reference_ms"]) / float(r["predicted_ms"]) == float(r["speedup"])
    assert [r["reference_ms"] for r in rows] == ["11.5", "16.0"]


def test_json_names_the_reference_per_prediction_and_per_iteration():
    d = GRAPHS.as_dict()
    assert d["reference_ms"] == 11.5 and d["speedup"] == 2.0
    assert [i["reference_ms"] for i in d["iterations"]] == [11.5, 11.5]
    # a replay without a prediction has no reference
    assert "reference_ms" not in GRAPHS.iterations[0].as_dict(False)


def test_the_iterations_table_divides_the_reference_it_shows():
    t = report.iterations_table([GRAPHS])
    rows = _rows(t)
    assert rows[0]["replayed without profiler ms"] == "11.500"
    assert rows[0]["speedup"] == "2.000x"          # per iteration: 11.5 / 5.75
    assert rows[-1]["speedup"] == "2.000x"         # the steady state
    # against the replay itself: no extra column, and the replay divided
    t = report.iterations_table([FUSED])
    assert "replayed without profiler ms" not in [c.header for c in t.columns]
    assert _rows(t)[0]["speedup"] == "1.600x"


def test_the_fleet_table_shows_the_reference():
    import pyarrow as pa
    rows = pa.Table.from_pylist([{
        "trace_id": "t", "file": "a/t.json", "job": None, "spec": "cuda_graphs",
        "measured_ms": 16.0, "baseline_ms": 16.0, "reference_ms": 11.5, "predicted_ms": 5.75,
        "speedup": 2.0, "speedup_low": 2.0, "speedup_high": 2.0, "gates_failed": []}])
    tab, _ = report.fleet_table(rows, 0)
    r = _rows(tab)[0]
    assert r["reference ms"] == "11.500" and r["speedup"] == "2.000x"


def test_the_pipeline_gives_each_iteration_the_reference_of_its_speedup(tmp_path):
    """On a real trace: cuda_graphs removes host work, so its reference is the job without
    the profiler, which is what `--opt no_profiler` predicts, iteration by iteration."""
    from daydream import api
    from tests.conftest import DATA
    trace = DATA / "whatif" / "adam_foreach_false.json.gz"
    api.ingest([trace], tmp_path, jobs=1, strict=True)
    graphs, unprof, fused = (api.predict(str(trace), tmp_path, opts=[o])
                             for o in ("cuda_graphs", "no_profiler", "fused_adam"))
    assert graphs.reference_ms == unprof.predicted_ms < graphs.baseline_ms
    assert [i.reference_ms for i in graphs.iterations] == [
        i.predicted_ms for i in unprof.iterations]
    assert graphs.speedup == graphs.reference_ms / graphs.predicted_ms
    assert [i.reference_ms for i in fused.iterations] == [
        i.baseline_ms for i in fused.iterations]
