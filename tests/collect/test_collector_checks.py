"""bench/collector_checks.py on the CPU: files from the collector with the fake CUPTI pass; a
file with an untimed kernel and one launched outside every layer fails, and so does a
"profiler twin" whose iterations hold other kernels."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from daydream.collect.api import collect
from daydream.collect.recorder import Recorder
from daydream.collect.writer import RawWriter
from daydream.ingest import cupti_format as fmt
from tests.collect import helpers as h

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import collector_checks  # noqa: E402

torch = pytest.importorskip("torch")


def _collected(out: Path, width: int, prefix: str) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 2))
    if width > 16:  # another job: one more layer, so more kernels per iteration
        model.append(torch.nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with collect(out, 3, warmup=1, model=model, optimizer=opt, backend=h.FakeBackend,
                 prefix=prefix):
        for _ in range(5):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    return out / f"{prefix}.cupti"


def test_collected_files_pass(tmp_path):
    a = _collected(tmp_path / "a", 16, "a")
    b = _collected(tmp_path / "b", 16, "b")
    c = collector_checks.check(a, b, tmp_path / "store")
    assert c["problems"] == [], c
    assert c["kernels"] > 0 and c["unmapped"] == 0
    assert c["weight_update"] == 3  # one fake launch per optimizer step
    assert c["profiler"]["kernels"][0] == c["profiler"]["kernels"][1] > 0
    assert c["profiler"]["names_shared"] == 1.0
    lines = collector_checks.rows([("fake pair", a, b)], tmp_path / "store")
    assert lines[0] == "## Collector checks"
    assert lines[-2].startswith("| fake pair | ") and lines[-2].endswith("| ok |")


def test_other_kernels_per_iteration_fail(tmp_path):
    a = _collected(tmp_path / "a", 16, "a")
    b = _collected(tmp_path / "b", 32, "b")
    c = collector_checks.check(a, b, tmp_path / "store")
    assert any(p.startswith("kernels per iteration") for p in c["problems"]), c


def test_untimed_and_unmapped_kernels_fail(tmp_path):
    strings = h.Strings()
    first, second = h.scenario(strings)
    extra = [("ActivityKernel13", h.record(  # still queued when flushed: never timed
        "ActivityKernel13", kind=fmt.KIND_CONCURRENT_KERNEL, start=0, end=0, device_id=0,
        context_id=1, stream_id=7, correlation_id=2, name=strings.ptr("late_kernel"))),
        ("ActivityKernel13", h.record(  # launched by a call no marker encloses
            "ActivityKernel13", kind=fmt.KIND_CONCURRENT_KERNEL, start=h.T0 + 1300,
            end=h.T0 + 1310, device_id=0, context_id=1, stream_id=7, correlation_id=7,
            name=strings.ptr("stray_kernel"))),
        ("ActivityAPI", h.record("ActivityAPI", kind=fmt.KIND_RUNTIME, cbid=211,
                                 start=h.T0 + 1250, end=h.T0 + 1260, process_id=h.PID,
                                 thread_id=h.TID, correlation_id=7))]
    path = tmp_path / "bad.cupti"
    rec = Recorder(RawWriter(path, {"external_correlation_kind": h.CUSTOM2}),
                   api_name=h.api_name)
    for buf in (first, second + extra):
        rec.handle_buffer(h.Buffer(buf).activities)
    rec.add_markers(h.markers(rec.names))
    rec.close()
    c = collector_checks.check(path, None, tmp_path / "store")
    assert "untimed_record 1" in c["problems"]
    assert c["unmapped"] >= 1 and "stray_kernel" in dict(c["unmapped_names"])
    row = collector_checks.rows([("bad", path, None)], tmp_path / "store")[-2]
    assert "untimed_record 1" in row and "kernels on no layer" in row


def test_no_cases_yet():
    assert collector_checks.rows([])[-2] == "No trace collected on a GPU yet."
