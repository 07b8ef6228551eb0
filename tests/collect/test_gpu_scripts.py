"""The scripts for a GPU machine, run here where there is none: bench/gpu_pairs.py in its smoke
mode (CPU, tiny models, the collector's fake CUPTI), every run it knows built and stepped once,
and collect/gpu_smoke.py failing, not passing, when what it needs is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

torch = pytest.importorskip("torch")
import gpu_pairs  # noqa: E402

FAKE = "tests.collect.helpers:FakeBackend"


def test_groups_in_priority_order_and_pairs_name_their_runs():
    gs = gpu_pairs.groups()
    assert [g["name"] for g in gs] == ["resnet50", "gpt_precision", "gpt_adam", "resnet50_data",
                                       "gpt_ckpt_graphs", "gpt_compile"]
    runs = {r["name"] for g in gs for r in g["runs"]}
    for g in gs:
        for _, base, changed in g["pairs"]:
            assert base in runs or base == f"shared:{gpu_pairs.V100_TRACE}", base
            assert changed in runs
    collected = sorted(r["name"] for g in gs for r in g["runs"] if r["collect"])
    assert collected == ["gpt-fp16", "gpt-fp32", "resnet50-fp16", "resnet50-fp32"]
    # the V100 trace's settings: batch 32 at 224x224, FP32, SGD, NCHW
    r50 = gs[0]["runs"][0]
    assert (r50["batch"], r50["image"], r50["precision"], r50["optimizer"],
            r50["channels_last"]) == (32, 224, "fp32", "sgd", False)
    assert 2 + len(gs) <= gpu_pairs.MAX_FILES


def test_every_run_builds_and_steps_on_the_cpu():
    """Each run of every group at its smoke size, one step (CUDA graphs say they need CUDA)."""
    for g in gpu_pairs.groups():
        for r in g["runs"]:
            spec = dict(gpu_pairs.smoke_spec(r), compile_backend="eager")
            if spec.get("cuda_graphs"):
                with pytest.raises(gpu_pairs.NeedsCuda):
                    gpu_pairs.build(spec, "cpu")
                continue
            step, facts = gpu_pairs.build(spec, "cpu")
            step()
            assert facts["params"] > 0, r["name"]
    torch.set_num_threads(os.cpu_count() or 1)  # the loader runs set one thread


def test_smoke_run_writes_its_results(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_pairs.py"), "--smoke",
                           "--out", str(out), "--collect-backend", FAKE, "--only", "resnet50",
                           "gpt_ckpt_graphs"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == ["gpt_ckpt_graphs.tar", "preflight.json", "resnet50.tar", "results.json"]
    assert all((out / f).stat().st_size < 16 << 20 for f in files)
    pre = json.loads((out / "preflight.json").read_text())
    assert pre["collector"]["records_arrive"] is True and pre["machine"]["smoke"] is True
    res = json.loads((out / "results.json").read_text())
    by = {r["name"]: r for r in res["runs"]}
    assert [r["name"] for r in res["runs"]] == [
        "resnet50-fp32", "resnet50-fp16", "resnet50-bf16", "resnet50-fp32+collect",
        "resnet50-fp16+collect", "gpt-ckpt", "small-gpt-eager", "small-gpt-cuda-graphs"]
    assert by["small-gpt-cuda-graphs"]["status"] == "skipped"
    for name in ("resnet50-fp32", "resnet50-fp16", "gpt-ckpt", "small-gpt-eager"):
        r = by[name]
        assert r["status"] == "ok", r
        assert r["no_profiler"]["steps"] == 3 and r["no_profiler"]["cpu_ms"]["median"] > 0
        assert r["model_source" if name.startswith("resnet") else "params"]
    assert by["resnet50-fp32+collect"]["status"] == "ok"
    assert by["resnet50-fp32+collect"]["after_collection"]["steps"] == 3
    assert {p["pair"] for p in res["pairs"]} >= {"FP32 vs AMP FP16 (ResNet-50)",
                                                 "eager vs CUDA graphs (small GPT)"}
    assert [g["name"] for g in res["groups"]] == ["resnet50", "gpt_ckpt_graphs"]

    from daydream.ingest.convert import read_trace
    from daydream.ingest.cupti_raw import read_cupti_raw
    with tarfile.open(out / "resnet50.tar") as tar:
        tar.extractall(tmp_path / "x", filter="data")
    conv = read_trace(tmp_path / "x" / "resnet50-fp32.pt.trace.json.gz")
    names = conv.tables["range"]["name"].to_pylist()
    assert sum(n.startswith("ProfilerStep#") for n in names) == 3
    raw = read_cupti_raw(tmp_path / "x" / "resnet50-fp32.cupti")
    assert raw.metadata["iterations_collected"] == 3
    ranges = raw.tables["range"]["name"].to_pylist()
    assert "model.conv1 (Conv2d) [forward]" in ranges


def test_gpu_smoke_fails_without_a_gpu(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "daydream.collect.gpu_smoke", "--out",
                           str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: gpu_smoke: torch {torch.__version__} cannot reach a GPU (a CPU build)"]
    assert not list(tmp_path.iterdir())


def test_gpu_smoke_check_lists_what_a_file_lacks(tmp_path):
    """A file without layer markers, iterations or devices is a failure, not a pass."""
    from daydream.collect.gpu_smoke import check
    from daydream.collect.recorder import Recorder
    from daydream.collect.writer import RawWriter
    from tests.collect import helpers as h

    path = tmp_path / "bare.cupti"
    rec = Recorder(RawWriter(path, {"external_correlation_kind": h.CUSTOM2}))
    rec.handle_buffer(h.Buffer(h.scenario(h.Strings())[1]).activities)
    rec.close()
    problems = check(path, 3)["problems"]
    assert "no runtime/driver calls" in problems
    assert "layer markers missing" in problems
    assert "0 iterations, not 3" in problems
    assert "no device records or properties" in problems
    assert "libcupti not recorded" in problems
