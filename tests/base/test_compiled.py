"""The kernels compiled ahead of time (base/compiled.py): what `make` builds is what loads, a
command then runs without numba, the compiled kernels give the tables numba's JIT gives, and a
call they would mishandle goes to the JIT instead."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from daydream.base import compiled as kernels

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
# real traces (tests/data/*/SOURCE.md): Kineto with a backward pass, with an autograd thread,
# an AMD one, and an Nsight Systems export
TRACES = [DATA / "kineto" / "resnet50_v100_nw0_run1.json.gz",
          DATA / "kineto" / "backward_thread.json",
          DATA / "kineto" / "mi250_toy_train_rocm.json.gz", DATA / "nsys" / "mock_rtx3080.sqlite"]
HAS_CC = shutil.which("cc") is not None or shutil.which("gcc") is not None
needs_build = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the kernels stay on numba's "
                                                    "JIT (daydream.base.compiled.main)")

# ingest's and graphstore's own entry points (tests/conftest.py stored_graphs), which run every
# kernel: the scanner, range nesting, the graph build's sweeps, the cycle check, phase gaps
_INGEST = """
import json, sys
from pathlib import Path
from daydream.base import compiled as kernels
from tests.conftest import stored_graphs
ids = stored_graphs([Path(a) for a in sys.argv[2:]], Path(sys.argv[1]))
print(json.dumps({"ingested": len(set(ids.values())), "state": kernels.state(),
                  "fallbacks": kernels.FALLBACKS, "numba": "numba" in sys.modules}))
"""


def run_on_traces(script: str, store: Path, jit: bool) -> dict:
    """SCRIPT run in a fresh process (``argv``: STORE, then TRACES), on numba's JIT or on the
    compiled kernels: the JSON of its last line."""
    env = {**os.environ, kernels.JIT_ENV: "1" if jit else "0"}
    out = subprocess.run([sys.executable, "-c", script, str(store), *map(str, TRACES)],
                         cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _ingest(store: Path, jit: bool) -> dict:
    return run_on_traces(_INGEST, store, jit)


@needs_build
def test_the_built_kernels_are_those_of_the_sources():
    # make builds them before the tests; a source edited since needs `make` again
    assert kernels.state() == "compiled"


@needs_build
def test_compiled_kernels_give_the_tables_of_the_jit_without_numba(tmp_path):
    aot, jit = _ingest(tmp_path / "aot", jit=False), _ingest(tmp_path / "jit", jit=True)
    assert aot == {"ingested": len(TRACES), "state": "compiled", "fallbacks": [],
                   "numba": False}
    assert jit["numba"] and jit["ingested"] == len(TRACES)
    files = sorted(p.relative_to(tmp_path / "aot")
                   for p in (tmp_path / "aot").rglob("*.parquet"))
    assert {p.parts[0] for p in files} == {"activity", "graph"}
    assert files == sorted(p.relative_to(tmp_path / "jit")
                           for p in (tmp_path / "jit").rglob("*.parquet"))
    for rel in files:
        if rel.parts[0] == "activity" and rel.name == "trace.parquet":
            continue  # when and how fast each trace was ingested
        a, b = pq.read_table(tmp_path / "aot" / rel), pq.read_table(tmp_path / "jit" / rel)
        assert a.equals(b), rel


@needs_build
def test_a_call_of_other_types_runs_on_the_jit():
    # _fill_gaps (graphstore.load) takes int32 task codes and units: hand-made arrays of the
    # declared types, then the same values as int64 (which the compiled function would read
    # as other numbers) and strided (whose every other element it would read)
    from daydream.graphstore.load import _fill_gaps
    assert isinstance(_fill_gaps, kernels._Compiled)
    code = np.array([1, 0, 1, 0, 2], np.int32)
    unit = np.zeros(5, np.int32)
    iteration = np.zeros(5, np.int64)
    kind = np.zeros(5, np.int8)
    want = _fill_gaps(code, unit, iteration, kind, 0, 1, 0)
    assert kernels.FALLBACKS == []
    got = _fill_gaps(code.astype(np.int64), unit, iteration, kind, 0, 1, 0)
    assert kernels.FALLBACKS == ["daydream.graphstore.load._fill_gaps"]
    np.testing.assert_array_equal(got, want)
    wide = np.zeros(10, np.int32)
    wide[::2] = code
    got = _fill_gaps(wide[::2], unit, iteration, kind, 0, 1, 0)
    np.testing.assert_array_equal(got, want)
    assert len(kernels.FALLBACKS) == 2
    kernels.FALLBACKS.clear()


def test_argument_types_are_parsed_as_declared():
    assert kernels._parse_arg("int64[::1]") == (np.dtype(np.int64), 1, False)
    assert kernels._parse_arg("readonly uint8[:, ::1]") == (np.dtype(np.uint8), 2, True)
    assert kernels._parse_arg("bool") == (np.dtype(bool), 0, False)
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels._parse_arg("int64[:]")


def test_a_stamp_of_other_sources_leaves_the_jit(tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "STAMP", tmp_path / "_kernels.stamp")
    (tmp_path / "_kernels.stamp").write_text("0" * 32 + "\n")
    kernels._libraries.cache_clear()
    try:
        assert kernels._libraries() is None
        assert "sources changed" in kernels.state()
        (tmp_path / "_kernels.stamp").write_text("unbuilt: no compiler\n")
        assert kernels.state() == "numba's JIT (unbuilt: no compiler)"
    finally:
        kernels._libraries.cache_clear()
