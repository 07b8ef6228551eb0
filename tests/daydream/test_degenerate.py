"""Degenerate input is an error a user can act on: one ``error: ...`` line naming the file and
exit 1, never a replay of nothing (``nan``) or a silent success. Run as a user runs them: the
``daydream`` command in a process of its own."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import DATA

TOY = DATA / "kineto" / "mi250_toy_train_rocm.json.gz"


def daydream(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "daydream", *map(str, args)],
                          capture_output=True, text=True)


def one_error(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    errors = [x for x in p.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1, p.stderr
    return errors[0]


@pytest.mark.parametrize("doc, why", [
    ({"traceEvents": []}, "no events: the trace is empty"),
    # events, but none that is work: process names and an instant event
    ({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0,
                       "args": {"name": "python"}},
                      {"ph": "i", "name": "mark", "pid": 1, "tid": 1, "ts": 5, "s": "t"}]},
     "no GPU or CPU work to simulate"),
])
def test_a_trace_with_nothing_to_simulate_is_an_error(tmp_path, doc, why):
    f = tmp_path / "t.json"
    f.write_text(json.dumps(doc))
    for args in (("ingest", f), ("predict", f)):
        line = one_error(daydream(*args, "--store", tmp_path / "s"))
        assert str(f) in line and why in line
    assert "nan" not in daydream("predict", f, "--store", tmp_path / "s").stdout


def test_a_folder_without_traces_lists_what_it_skipped(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "notes.txt").write_text("not a trace")
    (d / "model.et.json.gz").write_bytes(gzip.compress(b'{"nodes": []}'))
    p = daydream("ingest", d, "--store", tmp_path / "s")
    line = one_error(p)
    assert f"no trace files in {d}" in line and "2 files skipped" in line
    assert f"skipped: {d / 'notes.txt'}: not a trace file name" in p.stderr
    assert f"skipped: {d / 'model.et.json.gz'}: a PyTorch execution trace" in p.stderr
    assert "0 ingested" not in p.stderr


def test_execution_traces_beside_traces_are_named_as_skipped(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    shutil.copy(TOY, d / "rank0.kineto.json.gz")
    (d / "rank0.et.json.gz").write_bytes(gzip.compress(b'{"nodes": []}'))
    p = daydream("ingest", d, "--store", tmp_path / "s", "-j", "1")
    assert p.returncode == 0, p.stderr
    assert f"skipped: {d / 'rank0.et.json.gz'}: a PyTorch execution trace" in p.stderr
    assert "1 trace ingested" in p.stderr
