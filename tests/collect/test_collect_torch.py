"""The whole collection path on the CPU with CUPTI replaced by a fake (tests/collect/helpers.py):
hooks, markers, iterations, the file, ingest, a crash, a fork, and the `daydream collect`
launcher around an unmodified job."""

from __future__ import annotations

import os
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from daydream.collect.api import collect, collect_steps
from daydream.collect.cli import collect_command
from daydream.ingest.batch_ingest import ingest
from daydream.ingest.cupti_raw import read_cupti_raw
from daydream.ingest.store import Store
from tests.collect import helpers as h

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]

def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def _train(model, opt, steps):
    for _ in range(steps):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_collect_iterations_after_warmup(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with collect(tmp_path, 2, warmup=1, model=model, optimizer=opt, backend=h.FakeBackend,
                 prefix="job") as c:
        _train(model, opt, 5)  # 1 warm-up, 2 collected, 2 more that run uncollected
        assert c.stopped  # stopped by itself after its iterations
    assert c.backend.started == 1 and c.backend.stopped == 1
    path = tmp_path / "job.cupti"
    assert c.stop() == path
    conv = read_cupti_raw(path)
    r = conv.tables["range"]
    names = r["name"].to_pylist()
    assert [n for n in names if n.startswith("ProfilerStep")] == ["ProfilerStep#1",
                                                                   "ProfilerStep#2"]
    counts = Counter(names)
    assert counts["Optimizer.step#SGD.step"] == 2
    assert counts["model.0 (Linear) [forward]"] == 2 and counts["model.0 (Linear) [backward]"] == 2
    # everything nests under the iteration markers
    steps = {i for i, n in enumerate(names) if n.startswith("ProfilerStep")}
    assert all(d == 0 for i, d in enumerate(r["depth"].to_pylist()) if i in steps)
    assert all(d > 0 for i, d in enumerate(r["depth"].to_pylist()) if i not in steps)
    # every layer and optimizer marker's fake launch is linked to it through the external
    # correlation (iteration markers launch nothing)
    kernels = conv.tables["kernel"]
    launching = {e for i, e in enumerate(r["external_id"].to_pylist()) if i not in steps}
    assert kernels.num_rows == len(launching)
    assert set(kernels["external_id"].to_pylist()) == launching
    assert conv.metadata["iterations_collected"] == 2
    assert conv.metadata["activity_kinds"] == ["FAKE"]
    assert conv.metadata["layers"]["model.2"] == {"type": "Linear", "param_bytes": (16 * 2 + 2) * 4,
                                                  "param_bytes_total": (16 * 2 + 2) * 4}
    assert conv.metadata["hook_errors"] == 0
    assert not conv.stats.get("collection_not_closed")
    assert c.backend.pushes.count(("pop", 0)) == sum(1 for p in c.backend.pushes
                                                     if p[0] == "push")


def test_collect_steps_runs_a_callable(tmp_path):
    model = _model()
    opt = torch.optim.Adam(model.parameters())
    calls = []

    def step():
        calls.append(1)
        _train(model, opt, 1)

    path = collect_steps(step, tmp_path, 3, warmup=2, model=model, optimizer=opt,
                         backend=h.FakeBackend, prefix="steps")
    assert len(calls) == 5 and path == tmp_path / "steps.cupti"
    names = read_cupti_raw(path).tables["range"]["name"].to_pylist()
    assert [n for n in names if n.startswith("ProfilerStep")] == [
        "ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert names.count("Optimizer.step#Adam.step") == 3


def test_ingest_detects_and_stores_raw_files(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with collect(tmp_path / "traces", 1, model=model, optimizer=opt, backend=h.FakeBackend,
                 prefix="rank0"):
        _train(model, opt, 1)
    store = Store(tmp_path / "store")
    rep = ingest([tmp_path / "traces"], store, jobs=1, strict=True)
    (res,) = rep.results
    assert res.status == "ingested", res.error
    row = store.trace_row(res.trace_id)
    assert row["source_format"] == "cupti_raw"
    conv = read_cupti_raw(tmp_path / "traces" / "rank0.cupti")
    for name in ("kernel", "api", "range"):
        assert store.read(name, res.trace_id).num_rows == conv.tables[name].num_rows


def test_forked_child_collects_nothing(tmp_path):
    """A data-loader worker forked mid-collection must not touch CUPTI or the parent's file."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with collect(tmp_path, model=model, optimizer=opt, backend=h.FakeBackend,
                 prefix="fork") as c:
        _train(model, opt, 1)
        size = (tmp_path / "fork.cupti").stat().st_size
        pid = os.fork()
        if pid == 0:  # the child: no torch op here (OpenMP and fork do not mix)
            ok = not c.markers.enabled and c.hooks.inert and c.stopped
            c.recorder.meta({"from_child": True})
            c.stop()
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert (tmp_path / "fork.cupti").stat().st_size == size
        _train(model, opt, 1)
    conv = read_cupti_raw(tmp_path / "fork.cupti")
    assert "from_child" not in conv.metadata
    assert conv.metadata["iterations_collected"] == 2




JOB = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(4):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    print("trained")
""")


def test_command_collects_an_unmodified_job(tmp_path, capfd):
    """`daydream collect -- python job.py` with CUPTI faked: the injected start-up code hooks
    every module and optimizer of the job and writes one file for its process."""
    job = tmp_path / "job.py"
    job.write_text(JOB)
    res = collect_command([sys.executable, str(job)], tmp_path / "out", iterations=2, warmup=1,
                          check=False, backend="tests.collect.helpers:FakeBackend")
    out, err = capfd.readouterr()
    assert res.returncode == 0, err
    assert "trained" in out
    (path,) = res.files
    names = read_cupti_raw(path).tables["range"]["name"].to_pylist()
    assert [n for n in names if n.startswith("ProfilerStep")] == ["ProfilerStep#1",
                                                                   "ProfilerStep#2"]
    assert names.count("model (Sequential) [forward]") == 2
    assert names.count("model.2 (Linear) [backward]") == 2
