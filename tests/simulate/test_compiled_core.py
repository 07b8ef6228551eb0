"""The simulator's kernels compiled ahead of time (simulate/_core.py, _passes.py through
daydream.base.compiled): a replay runs without importing numba, every call matches its
declared types, and the schedules and reports are those of numba's JIT, on real traces."""

from __future__ import annotations

import numpy as np

from daydream.simulate import _core
from tests.base.test_compiled import TRACES, needs_build, run_on_traces

# replays through the graph tables as the pipeline reads them: the exact and explained replays,
# their schedules, iterations, steady step, critical path and unit load
_REPLAY = """
import json, sys
from pathlib import Path
from daydream.base import compiled as kernels
from daydream.simulate.replay import replay
from tests.conftest import stored_graphs
from daydream.graphstore.read import read_graph
store = Path(sys.argv[1])
ids = stored_graphs([Path(a) for a in sys.argv[2:]], store)
out = {}
for path, tid in sorted(ids.items()):
    g = read_graph(store, tid)
    for slack in (True, False):
        r = replay(g, slack=slack)
        out[f"{Path(path).name} {slack}"] = {
            "start": r.schedule.start_ns.tolist(), "end": r.schedule.end_ns.tolist(),
            "iterations": [(i.index, i.measured_ns, i.simulated_ns, i.used)
                           for i in r.iterations],
            "steady": r.steady, "units": r.unit_busy, "path": r.critical_path}
print(json.dumps({"replays": out, "state": kernels.state(), "fallbacks": kernels.FALLBACKS,
                  "numba": "numba" in sys.modules}, default=str))
"""


@needs_build
def test_replays_run_compiled_without_numba_and_equal_the_jit(tmp_path):
    # the traces of the compiled ingest's test (tests/base/test_compiled.py): a V100 ResNet-50
    # with its dataloader threads, an autograd thread, an AMD one, an Nsight Systems export
    aot = run_on_traces(_REPLAY, tmp_path / "aot", jit=False)
    jit = run_on_traces(_REPLAY, tmp_path / "jit", jit=True)
    assert (aot["state"], aot["fallbacks"], aot["numba"]) == ("compiled", [], False)
    assert jit["numba"]
    assert len(aot["replays"]) == 2 * len(TRACES)
    assert aot["replays"] == jit["replays"]


def test_trailing_zeros_of_every_bit_and_of_words_with_many():
    # the de Bruijn count (no intrinsic), run as Python (its words wrap, as they do compiled),
    # against Python's own reading of the bits
    with np.errstate(over="ignore"):
        _check_trailing_zeros()


def _check_trailing_zeros():
    for bit in range(64):
        word = np.int64(np.uint64(1) << np.uint64(bit))
        assert _core._cttz(word) == bit
    rng = np.random.default_rng(7)
    for w in rng.integers(1, 2**63 - 1, 200, dtype=np.int64):
        low = int(w) & -int(w)
        assert _core._cttz(w) == low.bit_length() - 1
