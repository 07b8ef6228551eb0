"""``daydream predict`` and ``daydream opts`` as a user runs them: the JSON fields, the Perfetto
timeline, the error for an unknown trace, the list of optimizations."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import DATA


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("predict") / "store"


def test_cli_json_and_timeline(store, tmp_path):
    tl = tmp_path / "tl.json"
    p = subprocess.run([sys.executable, "-m", "daydream", "predict",
                        str(DATA / "kineto" / "mi250_toy_train_rocm.json.gz"), "--store",
                        str(store), "--json", "--timeline", str(tl)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    for key in ("measured_ms", "baseline_ms", "iterations"):
        assert key in d
    for it in d["iterations"]:
        assert {"index", "measured_ms", "baseline_ms"} <= set(it)
    trace = json.loads(tl.read_text())
    procs = {e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {"measured", "replayed (baseline)"}
    # the tasks, once per schedule (the measured one also draws the operators, and each an
    # iterations track)
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"
          and e.get("cat") not in ("op", "iteration")]
    assert len(xs) % 2 == 0 and xs


def test_unknown_trace_is_a_clear_error(store):
    p = subprocess.run([sys.executable, "-m", "daydream", "predict", "nope123", "--store",
                        str(store)], capture_output=True, text=True)
    assert p.returncode == 1
    assert p.stderr.startswith("error: no trace file or stored trace id matches 'nope123'")

def test_opts_lists_them():
    p = subprocess.run([sys.executable, "-m", "daydream", "opts"], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "checkpointing(layers: str = '', every: int = 1)" in out
    assert "offload(layers: str = 'conv', every: int = 1, layer_mb: float = 0.0)" in out
    assert "bn_restructure(conv_fusion: bool = False)" in out
    assert "vDNN activation offloading" in out and "Activation checkpointing" in out
