"""``daydream compare`` on a real pair: ResNet-50 recorded with DataLoader num_workers 0 and
then 4 (pytorch/kineto's tb_plugin samples, Jan 2021; tests/data/kineto/SOURCE.md), the
first predicted with ``dataloader(workers=4)`` and set against the second at every level."""

from __future__ import annotations

import csv
import io

import pytest
from typer.testing import CliRunner

from daydream import api
from daydream.cli import app
from daydream.compare import compare, pair_rows
from tests.conftest import DATA

NW0 = DATA / "kineto" / "resnet50_jan21_nw0.json.gz"
NW4 = DATA / "kineto" / "resnet50_jan21_nw4.json.gz"
SPEC = "dataloader(workers=4)"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare") / "s"
    api.ingest([NW0, NW4], root, jobs=1, strict=True)
    return root


@pytest.fixture(scope="module")
def c(store):
    return compare(str(NW0), SPEC, str(NW4), store)


def test_headline_is_each_traces_steady_state_step(c, store):
    before = api.predict(str(NW0), store, opts=[SPEC])
    after = api.predict(str(NW4), store)
    h = c["headline"]
    assert h["predicted_ms"] == before.predicted_ms
    assert h["measured_ms"] == after.measured_ms
    assert h["error_pct"] == pytest.approx(100 * (h["predicted_ms"] - h["measured_ms"]) /
                                           h["measured_ms"])
    # the prediction is worth having: nearer the real run than "no change" is (README of
    # the shared traces: steps 141-168 ms before, 108-152 ms after)
    assert abs(h["error_pct"]) < abs(h["no_change_error_pct"])
    assert h["no_change_error_pct"] > 10


def test_iterations_phases_layers_and_kernel_classes_side_by_side(c, store):
    after = api.predict(str(NW4), store)
    used = [i for i in after.iterations if i.used]
    assert len(c["iterations"]) == min(len(used),
                                       api.predict(str(NW0), store).used_iterations)
    assert [i["measured_ms"] for i in c["iterations"]] == [i.measured_ms for i in
                                                          used[:len(c["iterations"])]]
    ph = {r["phase"]: r for r in c["phases"]}
    # what the change was about: the training thread's data loading nearly vanishes, in the
    # prediction and in the real run alike
    assert ph["data_loading"]["predicted_cpu_ms"] < 2 and ph["data_loading"]["measured_cpu_ms"] < 5
    classes = {r["class"]: r for r in c["kernel_classes"]}
    assert classes["gemm"]["measured_ms"] > 10  # convolutions dominate ResNet-50's GPU time
    # the GPU work is the same job's: each class within 15% of the real run
    for k in ("gemm", "norm_reduce", "memory_bound"):
        assert abs(classes[k]["error_pct"]) < 15, classes[k]
    assert c["layers"] and all(set(r) >= {"layer", "predicted_gpu_ms", "measured_gpu_ms"}
                               for r in c["layers"])


def test_pair_rows_for_the_accuracy_harness(c):
    rows = pair_rows(c)
    assert {r["level"] for r in rows} == {"headline", "iteration", "phase", "layer",
                                          "kernel_class"}
    for r in rows:
        if r["predicted_ms"] is not None and r["measured_ms"] is not None:
            assert r["error_ms"] == pytest.approx(r["predicted_ms"] - r["measured_ms"])
    assert c["misses"] and abs(c["misses"][0]["error_ms"]) == max(
        abs(r["error_ms"]) for r in rows if r["level"] in ("phase", "layer", "kernel_class"))


def test_compare_cli(store):
    run = CliRunner().invoke
    r = run(app, ["compare", str(NW0), str(NW4), "--opt", SPEC, "--store", str(store)],
            env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.stderr
    assert max(len(x) for x in r.stdout.splitlines()) <= 80
    for head in ("predicted against measured", "Iterations", "Phases", "Layers",
                 "Kernel classes", "missed most"):
        assert head in r.stdout
    rows = list(csv.DictReader(io.StringIO(run(app, [
        "compare", str(NW0), str(NW4), "--opt", SPEC, "--store", str(store), "--format",
        "csv"]).stdout)))
    assert rows[0]["level"] == "headline"


def test_the_parts_the_optimization_does_not_touch_hold_their_miss():
    """A prediction that changed only forward GPU work: data loading's CPU and forward's
    CPU are untouched, and their miss is what the run after measured there."""
    from dataclasses import replace

    from daydream.compare import untouched
    from daydream.graphstore.prediction import Phases, PhaseTimes
    from tests.daydream.test_reference import FUSED
    r = replace(FUSED, phases=Phases(
        baseline={"forward": PhaseTimes(10.0, 2.0), "data_loading": PhaseTimes(0.0, 5.0)},
        predicted={"forward": PhaseTimes(6.0, 2.0), "data_loading": PhaseTimes(0.0, 5.0)}))
    measured = {"forward": {"gpu_ms": 7.0, "cpu_ms": 2.5},
                "data_loading": {"gpu_ms": 0.0, "cpu_ms": 9.0}}
    got = {u["part"]: (u["before_ms"], u["measured_ms"], u["miss_ms"]) for u in untouched(
        r, measured)}
    # forward GPU changed (10 -> 6): not listed; data_loading GPU is nothing on both sides
    assert got == {"data_loading CPU": (5.0, 9.0, -4.0), "forward CPU": (2.0, 2.5, -0.5)}


def test_same_job_reads_the_names_of_host_work():
    import pyarrow as pa

    from daydream.compare import same_job

    def tables(host: list[str], kernels: list[str]) -> dict:
        return {"task": pa.table({"kind": ["host"] * len(host) + ["kernel"] * len(kernels),
                                  "name": host + kernels})}
    a = tables(["aten::conv2d", "aten::relu", "Optimizer.step#SGD.step", "aten::add_"],
               ["sgemm_fp32", "relu_kernel"])
    amp = tables(["aten::conv2d", "aten::relu", "Optimizer.step#SGD.step", "aten::add_",
                  "aten::to"], ["h884gemm_fp16", "relu_kernel"])
    other = tables(["aten::embedding", "aten::layer_norm", "aten::add_", "aten::softmax"],
                   ["softmax_kernel"])
    s = same_job(a, amp)
    assert s["ok"] and s["host_names"]["common"] == 4 and s["host_names"]["share"] == 4 / 5
    s = same_job(a, other)
    assert not s["ok"] and s["host_names"]["share"] == 1 / 7
    assert "look like different jobs" in s["why"] and "1 of the 4 and 4" in s["why"]


def test_compare_warns_when_the_traces_are_not_one_job(tmp_path):
    import json
    adam = DATA / "whatif" / "adam_foreach_false.json.gz"
    fused = DATA / "whatif" / "adam_fused.json.gz"
    other = DATA / "kineto" / "particle_transformer_a100_fwd_bs16.json.gz"
    api.ingest([adam, fused, other], tmp_path, jobs=1, strict=True)
    run = CliRunner().invoke
    r = run(app, ["compare", str(adam), str(other), "--opt", "fused_adam", "--store",
                  str(tmp_path), "--json"])
    assert r.exit_code == 0
    assert "warning: the two traces look like different jobs" in r.stderr
    assert json.loads(r.stdout)["same_job"]["ok"] is False
    r = run(app, ["compare", str(adam), str(fused), "--opt", "fused_adam", "--store",
                  str(tmp_path)], env={"COLUMNS": "100"})
    assert r.exit_code == 0 and "warning" not in r.stderr
    flat = " ".join(r.stdout.split())
    assert "Parts fused_adam does not touch" in flat and "GPU work" in flat
