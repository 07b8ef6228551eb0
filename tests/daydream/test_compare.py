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
