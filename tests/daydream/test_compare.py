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
from daydream.compare import compare, pair_rows, same_job
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


def test_same_job_reads_the_names_of_host_work_and_their_counts():
    import pyarrow as pa

    from daydream.compare import same_job

    def tables(host: list[str], kernels: list[str], iterations: int = 1) -> dict:
        """Host tasks in iteration 0 (each name as often as listed) over ITERATIONS rows."""
        return {"task": pa.table({"kind": ["host"] * len(host) + ["kernel"] * len(kernels),
                                  "name": host + kernels,
                                  "iteration": [0] * (len(host) + len(kernels))}),
                "iteration": pa.table({"iteration": list(range(iterations))})}
    a = tables(["aten::conv2d", "aten::relu", "Optimizer.step#SGD.step", "aten::add_",
                "torch/nn/modules/module.py(1743): _call_impl", "ProfilerStep#5"],
               ["sgemm_fp32", "relu_kernel"])
    # another torch version, another step: the same names once line numbers, addresses and
    # step numbers are gone; amp adds a cast
    amp = tables(["aten::conv2d", "aten::relu", "Optimizer.step#SGD.step", "aten::add_",
                  "torch/nn/modules/module.py(1755): _call_impl", "ProfilerStep#12",
                  "aten::to"], ["h884gemm_fp16", "relu_kernel"])
    s = same_job(a, amp)
    assert s["ok"] and s["host_names"]["common"] == 6 and s["host_names"]["share"] == 6 / 7
    assert s["host_counts"]["share"] == 6 / 7
    other = tables(["aten::embedding", "aten::layer_norm", "aten::add_", "aten::softmax"],
                   ["softmax_kernel"])
    s = same_job(a, other)
    assert not s["ok"] and s["host_names"]["share"] == 1 / 9
    assert "look like different jobs" in s["why"] and "1 of the 6 and 4" in s["why"]
    # the same operators, twelve times as many of one of them (a deeper model), over two
    # iterations: per iteration conv2d 6 against 0.5, relu 1 against 0.5
    deep = tables(["aten::conv2d"] * 12 + ["aten::relu"] * 2, [], iterations=2)
    shallow = tables(["aten::conv2d"] * 1 + ["aten::relu"] * 1, [], iterations=2)
    s = same_job(deep, shallow)
    assert s["host_names"]["share"] == 1.0
    assert s["host_counts"]["share"] == pytest.approx((0.5 + 0.5) / (6 + 1))
    assert not s["ok"] and "matches by name" in s["why"]
    assert "names of their host work" not in s["why"]
    assert s["differ_most"][0] == {"name": "aten::conv2d", "before_per_iteration": 6.0,
                                   "after_per_iteration": 0.5}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Real traces' graphs by file name: pairs of one job and of different ones."""
    from daydream import pipeline
    from daydream.traces import open_store
    files = [DATA / "crossgpu" / f"bert_small_uncased_{g}_inference.json.gz"
             for g in ("h100", "mi300x")] + [
        DATA / "kineto" / f"particle_transformer_a100_fwd_bs{b}.json.gz" for b in (16, 64)] + [
        DATA / "whatif" / f"{n}.json.gz" for n in ("adam_foreach_false", "adam_fused",
                                                    "dataloader_w0", "dataloader_w2")]
    root = tmp_path_factory.mktemp("pairs") / "s"
    api.ingest(files, root, jobs=1, strict=True)
    st = open_store(root)
    return {f.name.split(".")[0]: pipeline.resolve(str(f), st).tables for f in files}


@pytest.mark.parametrize("a, b", [
    ("bert_small_uncased_h100_inference", "bert_small_uncased_mi300x_inference"),
    ("particle_transformer_a100_fwd_bs16", "particle_transformer_a100_fwd_bs64"),
    ("adam_foreach_false", "adam_fused"),
    ("dataloader_w0", "dataloader_w2")])
def test_one_job_before_and_after_a_change_is_one_job(pairs, a, b):
    """The same model on an H100 and an MI300X (the Python frames' line numbers and the
    objects' addresses differ), at batch 16 and 64, with a for-loop and a fused Adam (the
    per-parameter ops gone), with 0 and 2 loader workers."""
    assert same_job(pairs[a], pairs[b])["ok"]


def test_different_jobs_alike_in_their_operators_are_told_apart_by_their_counts(pairs):
    """The 26-layer MLP of the optimizer pairs and the 4-layer one of the loader pairs run
    the same operators; per iteration, they run them in other numbers."""
    s = same_job(pairs["adam_foreach_false"], pairs["dataloader_w0"])
    assert s["host_names"]["share"] >= 0.7 and s["host_counts"]["share"] < 0.25
    assert not s["ok"]
    s = same_job(pairs["bert_small_uncased_h100_inference"],
                 pairs["particle_transformer_a100_fwd_bs16"])
    assert s["host_names"]["share"] < 0.5 and not s["ok"]


def test_compare_refuses_two_jobs_unless_forced(tmp_path):
    """ResNet-50 against the Particle Transformer was compared as if one job; now it is an
    error that names the evidence, and --force compares them, marked."""
    import json
    import re
    other = DATA / "kineto" / "particle_transformer_a100_fwd_bs16.json.gz"
    api.ingest([NW0, other], tmp_path, jobs=1, strict=True)
    run = CliRunner().invoke
    args = ["compare", str(NW0), str(other), "--opt", SPEC, "--store", str(tmp_path)]
    r = run(app, args, env={"COLUMNS": "200"})
    assert r.exit_code == 1 and not r.stdout
    assert r.stderr.startswith("error: the two traces look like different jobs: they share ")
    assert "names of their host work" in r.stderr and "most different: " in r.stderr
    assert "not compared (--force compares them anyway)" in r.stderr
    r = run(app, [*args, "--force", "--json"])
    assert r.exit_code == 0 and "warning: the two traces look like different jobs" in r.stderr
    assert json.loads(r.stdout)["same_job"]["ok"] is False
    r = run(app, [*args, "--force"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    assert re.search(r"^same job +NO, compared anyway \(--force\)", r.stdout, re.M)


def test_compare_of_one_job_says_so(c, store):
    assert c["same_job"]["ok"]
    r = CliRunner().invoke(app, ["compare", str(NW0), str(NW4), "--opt", SPEC, "--store",
                                 str(store)], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "warning" not in r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("same job"))
    assert line.split(None, 2)[2].startswith("yes: ")
