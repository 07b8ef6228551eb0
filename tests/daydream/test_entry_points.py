"""Every registered optimization gives one prediction whichever entry point runs it:
``daydream predict`` (``daydream.api.predict``, and the CLI), and ``daydream predict --all`` on
local worker processes and on Ray. On a real trace that records input shapes (ResNet-50 on a
V100: offload sizes its copies by them, which predict --all once ignored) and on the 8 rank
traces of the real DLRM job (world size 8 from distributedInfo, which predict --all once
ignored too); the job itself through ``predict JOB``, by the API and the CLI."""

from __future__ import annotations

import shutil
import subprocess
import sys

import orjson
import pytest

from daydream import api, fleet
from daydream.base.errors import DaydreamError
from daydream.graphstore import sql_query
from daydream.transforms import list_opts
from tests.conftest import DATA

RESNET = DATA / "kineto" / "resnet50_v100_nw0_run1.json.gz"
DLRM = DATA / "kineto" / "dlrm_8ranks"
# Every registered optimization, with the parameters it needs; the gradient what-ifs also
# chained after ddp, so that the single-GPU trace runs them too. A spec that does not apply
# to a trace must fail alike everywhere.
SPECS = [
    "amp", "bn_restructure(conv_fusion=true)", "checkpointing", "cuda_graphs",
    "dataloader(workers=4)", "ddp(world=8)", "ddp(world=8)+p3", "ddp(world=8)+dgc",
    "ddp(world=8)+blueconnect", "ddp(world=8)+qsgd(bits=8)", "ddp(world=8)+local_sgd(every=4)",
    "p3", "dgc", "blueconnect", "qsgd", "local_sgd", "bandwidth(bw=\"2x\")",
    "world(n=16)", "no_straggler", "fused_adam", "fused_adamw", "fused_sgd", "fused_adagrad",
    "fused_optimizer(kind=sgd)", "fusion", "offload", "offload(layers=linear, layer_mb=4)",
    "scale(select=\"kind = 'kernel' AND name LIKE '%gemm%'\", factor=0.5)",
    "batch(size=64)", "gpu(H100)", "gpu(H100)+amp", "no_profiler", "no_profiler+cuda_graphs",
]


def test_specs_cover_every_registered_optimization():
    named = {t.split("(")[0] for s in SPECS for t in s.split("+")}
    assert {o["name"] for o in list_opts()} <= named


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("entry") / "store"
    rep = api.ingest([RESNET, DLRM], root, jobs=1, strict=True)
    assert rep.count("ingested") == 9
    return root


def _one(store, target: str, spec: str) -> tuple:
    """(predicted_ms, notes) of one prediction, or the error it failed with."""
    try:
        d = api.predict(target, store, opts=[spec])
    except DaydreamError as e:
        return ("error", str(e))
    return (d.predicted_ms, "\n".join(d.notes) or None)


@pytest.fixture(scope="module")
def single(store) -> dict:
    """Every (trace, spec) through ``daydream.api.predict``."""
    return {(tid, s): _one(store, tid, s) for tid in api.open_store(store).trace_ids()
            for s in SPECS}


def _fleet(root, **kw) -> dict:
    rep = fleet.predict_all(root, SPECS, force=True, **kw)
    out = {}
    for r in rep.results:
        if r.status == "failed":
            out[r.trace_id, r.spec] = ("error", r.error.removeprefix(f"trace {r.trace_id}: "))
        else:
            out[r.trace_id, r.spec] = (r.row["predicted_ms"], r.row["notes"])
    return out


def _as_the_fleet_says(single: dict) -> dict:
    """``single`` with each error as the fleet reports it: prefixed by the spec, unless the
    pipeline's own message starts with the optimization's name already."""
    out = {}
    for (tid, spec), v in single.items():
        if v[0] == "error" and not (v[1].startswith(f"{spec.split('(')[0]}:")
                                    or v[1].startswith(f"{spec}:")):
            v = ("error", f"{spec}: {v[1]}")
        out[tid, spec] = v
    return out


def _copy(store, tmp_path):
    dst = tmp_path / "s"
    shutil.copytree(store, dst)
    return dst


def test_predict_all_on_local_workers_agrees_with_predict(store, single, tmp_path):
    root = _copy(store, tmp_path)
    got = _fleet(root, workers=2)
    assert got.keys() == single.keys()
    want = _as_the_fleet_says(single)
    assert {k: (v, want[k]) for k, v in got.items() if v != want[k]} == {}
    # and the prediction table keeps what the workers sent
    rows = sql_query.run_sql(
        root, "SELECT trace_id, spec, predicted_ms FROM prediction").to_pylist()
    assert len(rows) == sum(v[0] != "error" for v in single.values())
    assert all(single[r["trace_id"], r["spec"]][0] == r["predicted_ms"] for r in rows)


def test_predict_all_on_ray_agrees_with_predict(store, single, tmp_path):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        got = _fleet(_copy(store, tmp_path), ray="auto")
    finally:
        ray.shutdown()
    want = _as_the_fleet_says(single)
    assert got.keys() == want.keys()
    assert {k: (v, want[k]) for k, v in got.items() if v != want[k]} == {}


def test_offload_sizes_its_copies_by_the_recorded_shapes(store, single):
    """The ResNet-50 trace records input shapes: offload copies every conv input (some MB
    each, at PCIe speed) and the iteration gets slower; without shapes (and layer_mb 0) it
    would have left the trace unchanged."""
    tid = api.predict(str(RESNET), store)
    pred, notes = single[tid.trace_id, "offload"]
    assert pred > 1.2 * tid.baseline_ms
    assert "layer-iterations" in notes and "unchanged" not in notes


def test_dlrm_ranks_know_their_world_size(store, single):
    """bandwidth(2x) rewrites a rank's all-reduces only when it knows there are 8 ranks (its
    trace's distributedInfo): every entry point must give it the world size."""
    ranks = [t for t in api.open_store(store).trace_ids()
             if api.info(t, store)["world_size"] == 8]
    assert len(ranks) == 8
    for tid in ranks:
        pred, notes = single[tid, "bandwidth(bw=\"2x\")"]
        assert pred != "error", notes


@pytest.mark.parametrize("spec", ["amp", "offload(layers=linear, layer_mb=4)",
                                  "bandwidth(bw=\"2x\")"])
def test_dlrm_job_through_the_cli_matches_the_api(store, spec):
    d = api.predict("dlrm_8ranks", store, opts=[spec])
    p = subprocess.run([sys.executable, "-m", "daydream", "predict", "dlrm_8ranks", "--store",
                        str(store), "--opt", spec, "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    c = orjson.loads(p.stdout)
    assert c["job"] == "dlrm_8ranks" and c["world_size"] == 8
    assert (c["predicted_ms"], c["notes"]) == (d.predicted_ms, list(d.notes))
    assert [r["predicted_ms"] for r in c["ranks"]] == [r.predicted_ms for r in d.job.ranks]


def test_param_bytes_reach_the_fleet_workers_as_they_reach_predict(store, tmp_path):
    """--param-bytes overrides the recorded layer sizes for ddp; predict --all passes it to
    every worker (here ResNet-50's 25.6M FP32 parameters, given rather than read)."""
    nb = 25_557_032 * 4
    d = api.predict(str(RESNET), store, opts=["ddp(world=8)"], param_bytes=nb)
    assert any("--param-bytes" in n for n in d.notes)
    root = _copy(store, tmp_path)
    rep = fleet.predict_all(root, ["ddp(world=8)"], workers=2, param_bytes=nb,
                            where=f"trace_id = '{d.trace_id}'")
    (r,) = rep.results
    assert (r.row["predicted_ms"], r.row["notes"]) == (d.predicted_ms, "\n".join(d.notes))
    p = subprocess.run([sys.executable, "-m", "daydream", "predict", "--all", "--store",
                        str(root), "--opt", "ddp(world=8)", "--param-bytes", str(nb),
                        "--where", f"trace_id = '{d.trace_id}'", "--force", "--workers",
                        "1", "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert [x["predicted_ms"] for x in orjson.loads(p.stdout)] == [d.predicted_ms]


def test_a_job_reads_its_ranks_recorded_shapes(store):
    """The DLRM ranks record input shapes; offload on the job sizes every linear layer's copy
    by them (the job once got no activity tables and fell back to layer_mb)."""
    import re
    d = api.predict("dlrm_8ranks", store, opts=["offload(layers=linear, layer_mb=4)"])
    (note,) = [n for n in d.notes if n.startswith("offload:")]
    n, m = map(int, re.search(r"\((\d+) of (\d+) sized from input shapes\)", note).groups())
    assert n == m > 0
    assert d.predicted_ms > d.baseline_ms
