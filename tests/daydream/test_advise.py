"""``daydream advise``: where the time goes, then every registered optimization predicted and
ranked, or listed with why it does not apply; the gates shown where the pipeline gives them."""

from __future__ import annotations

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from daydream import api
from daydream.advise import (
    advise,
    candidates,
    gpu_utilization,
    tables,
    verdict,
    where_time_goes,
)
from daydream.cli import app
from daydream.graphstore.prediction import PredictionResult, TraceFacts
from daydream.transforms import list_opts
from tests.conftest import DATA

TOY = DATA / "kineto" / "mi250_toy_train_rocm.json.gz"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("advise") / "s"
    api.ingest([TOY], root, jobs=1, strict=True)
    return root


@pytest.fixture(scope="module")
def advice(store):
    return advise(str(TOY), store)


def test_every_registered_optimization_is_ranked_or_said_not_to_apply(advice, store):
    tried = [r["spec"] for r in advice["predictions"]]
    what_ifs = [r["spec"] for r in advice["what_ifs"]]
    skipped = {r["spec"].split("(")[0]: r["reason"] for r in advice["not_applicable"]}
    assert sorted(tried + what_ifs + list(skipped) + ["no_profiler"]) == sorted(
        o["name"] for o in list_opts())
    sp = [r["speedup"] for r in advice["predictions"]]
    assert sp == sorted(sp, reverse=True)
    # each ranked one is what `predict --opt NAME` gives, with its interval and the step its
    # speedup divides
    for r in advice["predictions"][:3]:
        d = api.predict(str(TOY), store, opts=[r["spec"]])
        assert r["predicted_ms"] == d.predicted_ms
        assert r["predicted_interval_ms"] == list(d.predicted_interval_ms)
        assert r["reference_ms"] == d.reference_ms
        assert r["speedup"] == pytest.approx(r["reference_ms"] / r["predicted_ms"])
        # ranked: it changes the step
        assert abs(r["predicted_ms"] - r["reference_ms"]) > 1e-3 * r["reference_ms"]
    # what does not apply says why: the error the optimization raised
    assert skipped["no_straggler"].startswith("no_straggler: needs a job")
    assert skipped["scale"] == "needs parameters: select, factor"
    assert "chain it after ddp" in skipped["p3"]


def test_where_the_time_goes_adds_up_to_the_critical_path(advice, store):
    d = api.predict(str(TOY), store)
    span = d.trace.critical_path["span_ns"] / 1e6
    assert sum(r["ms"] for r in advice["where"]) == pytest.approx(span, rel=1e-6)
    cats = {r["category"]: r["ms"] for r in advice["where"]}
    kinds = {r["kind"]: r["ns"] / 1e6 for r in d.trace.critical_path["by_kind"]}
    assert cats["launch overhead"] == pytest.approx(kinds.get("api", 0) +
                                                    kinds.get("delay: launch", 0) +
                                                    kinds.get("delay: queue", 0))
    assert advice["bound"] in ("GPU-bound", "CPU-bound", "data-bound", "communication-bound")


def test_data_loading_is_taken_out_of_the_cpu_work():
    cp = {"iteration": 2, "span_ns": 100_000_000,
          "by_kind": [{"kind": "host", "ns": 70_000_000}, {"kind": "kernel", "ns": 25_000_000},
                      {"kind": "delay: launch", "ns": 5_000_000}],
          "by_phase": [{"phase": "data_loading", "ns": 40_000_000},
                       {"phase": "forward", "ns": 60_000_000}]}
    replay = PredictionResult(
        trace_id="t", file="", measured_ms=100.0, baseline_ms=100.0, iterations=(),
        baseline_error_pct=0.0, measured_median_ms=None, measured_mean_ms=None,
        measured_spread_ms=None, explained_ms=None, explained_no_inferred_ms=None,
        explained_peer_wait_ms=None, explained_error_pct=None, iterations_from=None,
        trace=TraceFacts(critical_path=cp, unit_load=[], slack_ms={}, inferred_edges={},
                         profiler=None))
    rows, basis = where_time_goes(replay)
    got = {r["category"]: round(r["ms"], 6) for r in rows}
    assert got == {"GPU work": 25.0, "CPU work": 30.0, "data loading": 40.0,
                   "launch overhead": 5.0}
    assert "iteration 2" in basis


def test_gates_are_shown_when_the_pipeline_reports_them():
    a = {"bound": "CPU-bound", "where": [], "where_basis": "x", "not_applicable": [],
         "predictions": [{"spec": "amp", "reference": "replay", "reference_ms": 10.0,
                          "predicted_ms": 9.0, "predicted_interval_ms": [8.5, 9],
                          "speedup": 1.1, "speedup_interval": [1.1, 1.2], "notes": [],
                          "gates": [{"name": "gpu_known", "ok": True, "note": ""},
                                    {"name": "shapes", "ok": False, "note": "no shapes"}]}]}
    _, ranked, _, _ = tables(a)
    assert [c.header for c in ranked.columns][-1] == "gates"
    assert ranked.rows[0][-1] == "1 of 2 ok (failed: shapes)"


def test_candidates_skip_only_what_needs_parameters():
    specs, skipped = candidates()
    assert "amp" in specs and "dataloader" in specs
    # batch(size=N), gpu(NAME) and scale(select, factor) have no default to try
    assert [s["spec"].split("(")[0] for s in skipped] == ["batch", "gpu", "scale"]


def test_advise_cli_text_json_and_csv(store):
    run = CliRunner().invoke
    r = run(app, ["advise", str(TOY), "--store", str(store)], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.stderr
    assert max(len(x) for x in r.stdout.splitlines()) <= 80
    for head in ("Where the time goes", "What to try first", "What does not apply"):
        assert head in r.stdout
    d = json.loads(run(app, ["advise", str(TOY), "--store", str(store), "--json"]).stdout)
    assert d["predictions"] and d["not_applicable"]
    rows = list(csv.DictReader(io.StringIO(
        run(app, ["advise", str(TOY), "--store", str(store), "--format", "csv"]).stdout)))
    assert {"predicted", "not applicable"} <= {r["status"] for r in rows}
    assert len(rows) == (len(d["predictions"]) + len(d["what_ifs"]) + len(d["not_applicable"])
                         + (d["profiler"] is not None))
    for r in rows:
        if r["status"] == "predicted":
            assert float(r["speedup"]) == pytest.approx(
                float(r["reference_ms"]) / float(r["predicted_ms"]))


def _where(**shares: float) -> list[dict]:
    return [{"category": k.replace("_", " "), "ms": 100 * v, "share": v}
            for k, v in shares.items()]


def test_the_verdict_is_one_of_four_and_agrees_with_the_gpus_utilization():
    cpu = _where(GPU_work=0.3, CPU_work=0.4, launch_overhead=0.3)
    # launch overhead is CPU time: 0.7 of the path against the GPU's 0.3
    assert verdict(cpu, None)[0] == "CPU-bound"
    busy = {"share": 0.5, "unit": "gpu 0 stream 7", "basis": "gpu 0 stream 7"}
    bound, why = verdict(cpu, busy)
    assert bound == "CPU-bound" and "the GPU is busy 50.0%" in why
    # a GPU busy 95% of the replay is GPU-bound whatever the path's parts say
    assert verdict(cpu, {**busy, "share": 0.95})[0] == "GPU-bound"
    assert verdict(_where(data_loading=0.6, GPU_work=0.4), None)[0] == "data-bound"
    assert verdict(_where(waiting_on_communication=0.5, GPU_work=0.3), None)[0] == \
        "communication-bound"


def test_the_gpu_utilization_is_the_unit_tables_busiest_stream():
    t = TraceFacts(critical_path={}, slack_ms={}, inferred_edges={}, profiler=None,
                   unit_load=[{"unit": "thread 1:2", "busy_ns": 9, "busy_share": 0.9},
                              {"unit": "gpu 0 stream 7", "busy_ns": 7, "busy_share": 0.7},
                              {"unit": "gpu 0 stream 9", "busy_ns": 1, "busy_share": 0.1}])
    d = PredictionResult(
        trace_id="t", file="", measured_ms=1.0, baseline_ms=1.0, iterations=(),
        baseline_error_pct=0.0, measured_median_ms=None, measured_mean_ms=None,
        measured_spread_ms=None, explained_ms=None, explained_no_inferred_ms=None,
        explained_peer_wait_ms=None, explained_error_pct=None, iterations_from=None, trace=t)
    u = gpu_utilization(d)
    assert (u["share"], u["unit"]) == (0.7, "gpu 0 stream 7")


def test_no_profiler_is_the_profilers_cost_and_unchanged_ones_do_not_apply(tmp_path):
    """On a CPU-only trace: no_profiler is not ranked but shown as the profiler's own cost
    (what `predict --opt no_profiler` takes off the replay); optimizations that change
    nothing (fusion, amp, ...) are listed as not applying, with their note; the ranked
    ones change the step."""
    trace = DATA / "whatif" / "adam_foreach_false.json.gz"
    api.ingest([trace], tmp_path, jobs=1, strict=True)
    a = advise(str(trace), tmp_path)
    nop = api.predict(str(trace), tmp_path, opts=["no_profiler"])
    assert "no_profiler" not in [r["spec"] for r in a["predictions"]]
    assert a["profiler"]["cost_ms"] == pytest.approx(nop.baseline_ms - nop.predicted_ms)
    assert a["profiler"]["cost_ms"] > 0
    why = {r["spec"]: r["reason"] for r in a["not_applicable"]}
    assert why["fusion"].startswith("fusion: ") and "unchanged" in why["fusion"]
    assert "amp" in why
    assert [r["spec"] for r in a["predictions"]][:1] == ["cuda_graphs"]
    assert a["predictions"][0]["reference"] == "replay without profiler"
    text = " ".join(CliRunner().invoke(app, ["advise", str(trace), "--store", str(tmp_path)],
                                       env={"COLUMNS": "100"}).stdout.split())
    assert f"{a['profiler']['cost_ms']:.3f} ms per iteration" in text
    assert "profiler's own cost" in text
    # the gate of one that says it does not apply reads as what it is
    amp = api.predict(str(trace), tmp_path, opts=["amp"])
    g = next(g for g in amp.gates if g.name == "applies")
    assert g.ok and g.note.startswith("amp does not apply to this trace")
    assert "does not apply and changes nothing" not in g.note


def test_advise_reports_progress_by_step(store):
    """advise tells a progress bar its steps: the replay, then each optimization by name."""
    plans, steps = [], []
    d = advise(str(TOY), store, specs=["amp", "cuda_graphs"],
               on_plan=lambda n, first=None: plans.append((n, first)),
               on_step=lambda nxt=None: steps.append(nxt))
    assert plans == [(3, "replaying the trace")]
    assert steps == ["predicting amp", "predicting cuda_graphs", None]
    assert [r["spec"] for r in d["predictions"]] or d["not_applicable"]


def _on_a_terminal(args: list[str]) -> tuple[str, str]:
    """Run the CLI with stderr on a pseudo-terminal: (stdout, what the terminal showed)."""
    import os
    import pty
    import subprocess
    import sys

    main, sub = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "daydream", *args], stdout=subprocess.PIPE,
                         stderr=sub, env={**os.environ, "COLUMNS": "100"})
    os.close(sub)
    shown = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        shown += chunk
    out = p.stdout.read().decode()
    p.wait()
    os.close(main)
    return out, shown.decode(errors="replace")


def test_advise_and_report_show_progress_on_a_terminal_only(store, tmp_path):
    out, shown = _on_a_terminal(["advise", str(TOY), "--store", str(store)])
    assert "What to try first" in out
    assert "advising" in shown or "predicting" in shown or "replaying" in shown
    r = CliRunner().invoke(app, ["advise", str(TOY), "--store", str(store)])
    assert r.exit_code == 0, r.stderr
    assert "replaying the trace" not in r.stderr and "predicting" not in r.stderr
    out, shown = _on_a_terminal(["report", str(TOY), "--store", str(store), "--opt", "amp",
                                 "--out", str(tmp_path / "r.html")])
    assert "predicting" in shown or "writing the report" in shown
    assert (tmp_path / "r.html").exists()
