"""What reaches the file, and when: the last iteration's GPU records (the device synchronized
before every forced flush), a crash (SIGKILL: what periodic flushes delivered), SIGTERM (a
closed file, then the job's own fate), and device records whatever the warm-up. CUPTI is the
fake of tests/collect/helpers.py, which keeps CUPTI's delivery rules: kernels complete a few
launches after they are queued, a forced flush hands back queued ones untimed, a default flush
only buffers whose records are all complete, device records only at CUDA's initialization."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from daydream.collect.api import collect
from daydream.ingest.cupti_raw import read_cupti_raw
from tests.collect import helpers as h

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_cuda_yet(monkeypatch):
    monkeypatch.setitem(h.CUDA, "initialized", False)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def _train(model, opt, steps):
    for _ in range(steps):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()


def _launching(conv) -> set[int]:
    """External ids of the markers that launch (all but the iterations')."""
    r = conv.tables["range"]
    return {e for n, e in zip(r["name"].to_pylist(), r["external_id"].to_pylist(), strict=True)
            if not n.startswith("ProfilerStep")}


def _steps(conv) -> list[str]:
    return [n for n in conv.tables["range"]["name"].to_pylist() if n.startswith("ProfilerStep")]


def test_last_iteration_keeps_its_gpu_records(tmp_path):
    """The kernels of the last collected step are still queued when it returns on the CPU:
    without a synchronize before the final flush they come back untimed and are lost."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with collect(tmp_path, 2, warmup=1, model=model, optimizer=opt, backend=h.FakeBackend,
                 prefix="job") as c:
        _train(model, opt, 3)
    assert c.backend.syncs >= 1
    conv = read_cupti_raw(tmp_path / "job.cupti")
    assert not conv.stats.get("untimed_record")
    kernels = conv.tables["kernel"]
    # one fake launch per layer or optimizer marker, the last step's included
    launched = _launching(conv)
    assert kernels.num_rows == len(launched) > 0
    assert set(kernels["external_id"].to_pylist()) == launched


JOB = textwrap.dedent("""
    import os, signal, sys, time
    import torch
    from daydream.collect.api import collect
    from tests.collect.helpers import FakeBackend
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if sys.argv[2] == "own-handler":
        def bye(signum, frame):
            open(os.path.join(sys.argv[1], "job-handler-ran"), "w").close()
            sys.exit(7)
        signal.signal(signal.SIGTERM, bye)
    c = collect(sys.argv[1], model=model, optimizer=opt, backend=FakeBackend,
                prefix="job").start()
    for i in range(3):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    if sys.argv[2] == "kill":
        time.sleep(2.5)            # more than a flush period: the periodic flush ran
    model(torch.randn(4, 8))       # half an iteration more
    os.kill(os.getpid(), signal.SIGKILL if sys.argv[2] == "kill" else signal.SIGTERM)
    time.sleep(5)
    print("survived the signal")
""")


def _run(tmp_path, mode):
    return subprocess.run([sys.executable, "-c", JOB, str(tmp_path), mode], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=120)


def test_crash_keeps_what_periodic_flushes_delivered(tmp_path):
    """SIGKILL: nothing runs at exit. What a default flush delivered in the last period is in
    the file (complete records only), and the markers of every finished iteration."""
    proc = _run(tmp_path, "kill")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    conv = read_cupti_raw(tmp_path / "job.cupti")
    assert conv.stats.get("collection_not_closed") == 1
    assert _steps(conv) == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    assert conv.metadata.get("iterations_collected") is None  # never stopped
    kernels = conv.tables["kernel"]
    # all launches but the LAG still queued at the kill, and none untimed
    assert kernels.num_rows >= len(_launching(conv)) - h.FakeBackend.LAG
    assert kernels.num_rows > 0 and not conv.stats.get("untimed_record")


def test_sigterm_closes_the_file_then_dies_by_it(tmp_path):
    """torchrun stops surviving ranks with SIGTERM: the file is synchronized, flushed and
    closed, and the process still ends by SIGTERM as the job would have."""
    proc = _run(tmp_path, "term")
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stderr)
    assert "survived" not in proc.stdout
    conv = read_cupti_raw(tmp_path / "job.cupti")
    assert not conv.stats.get("collection_not_closed")
    assert not conv.stats.get("untimed_record")
    assert conv.metadata["iterations_collected"] == 3
    assert conv.metadata.get("stopped_by") == "SIGTERM"
    assert _steps(conv) == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2",
                            "ProfilerStep#3"]
    assert conv.tables["kernel"].num_rows == len(_launching(conv))


def test_sigterm_then_the_jobs_own_handler(tmp_path):
    proc = _run(tmp_path, "own-handler")
    assert proc.returncode == 7, proc.stderr
    assert (tmp_path / "job-handler-ran").exists()
    conv = read_cupti_raw(tmp_path / "job.cupti")
    assert not conv.stats.get("collection_not_closed")
    assert conv.metadata["iterations_collected"] == 3


def test_sigterm_handler_is_the_jobs_again_after_collection(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with collect(tmp_path, 1, model=model, optimizer=opt, backend=h.FakeBackend,
                 prefix="job") as c:
        assert signal.getsignal(signal.SIGTERM) is not before
        _train(model, opt, 1)
        assert c.stopped
        assert signal.getsignal(signal.SIGTERM) is before


def test_devices_recorded_after_warmup(tmp_path):
    """CUDA initializes during the warm-up (the model moves to the GPU before its first step):
    CUPTI writes device records then or never, so their kinds are on from the start."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with collect(tmp_path, 1, warmup=2, model=model, optimizer=opt, backend=h.FakeBackend,
                 prefix="job"):
        h.cuda_init()
        _train(model, opt, 3)
    conv = read_cupti_raw(tmp_path / "job.cupti")
    assert [d["name"] for d in conv.devices] == ["NVIDIA H200"]
    assert conv.devices[0]["numSms"] == 132
    assert conv.tables["kernel"]["context"].to_pylist()[0] == 1


def test_devices_of_a_job_that_initialized_cuda_before_collecting(tmp_path):
    """collect() entered after model.cuda(): CUPTI will not write device records any more;
    the runtime's device properties go in the header instead."""
    h.cuda_init()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with collect(tmp_path, 1, model=model, optimizer=opt, backend=h.FakeBackend, prefix="job"):
        _train(model, opt, 1)
    conv = read_cupti_raw(tmp_path / "job.cupti")
    assert [d["name"] for d in conv.devices] == ["NVIDIA H200 (runtime)"]


def test_process_that_never_collects_leaves_no_file(tmp_path):
    """Device records arrive during the warm-up; a process that never gets past it (a helper,
    a launcher that imports torch) must still leave no file behind."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with collect(tmp_path, 1, warmup=5, model=model, optimizer=opt, backend=h.FakeBackend,
                 prefix="job") as c:
        h.cuda_init()
        _train(model, opt, 2)
    assert c.stop() is None
    assert not list(tmp_path.iterdir())
