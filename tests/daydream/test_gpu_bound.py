"""GPU-bound traces respond to a faster GPU: the two real V100 traces whose GPU is busy >= 95%
of every step (tests/data/kineto/SOURCE.md), each with a thread that only polls events.

The physical bounds below are worked out from the raw traces (bench/bounds.py's rule, the
judge's: per step T, G the GPU's busy time, C the CPU's own work, calls at their median cost
and gaps of at most 100 us), not from the model:
- resnet50_v100_rank0, steps 2-4: T 95.7, G 94.6, C of the busiest thread 15.7 ms: with the
  GPU work halved a step takes at least max(G/2, C) = 47.3 ms, 2.02x; 90% of it is 1.82x.
- recsys_v100_rank1_of2: the main thread and the autograd thread never work at the same
  time (0.02 ms of overlap in 5 steps: the main thread waits in backward() while the other
  works), so a step's CPU floor is their sum, 59-66 ms. Per step T/max(G/2, C1 + C2):
  122.1/66.1 = 1.85, 166.4/79.9 = 2.08, 82.0/61.6 = 1.33, 107.2/63.3 = 1.69, 166.3/79.5
  = 2.09. The steady-state step must speed up by at least 90% of the smallest, 1.20x; the
  model without its polling waits and its rounding-tick waits gave 1.196x.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from daydream import api
from tests.conftest import DATA

RESNET = DATA / "kineto" / "resnet50_v100_rank0.json.gz"
RECSYS = DATA / "kineto" / "recsys_v100_rank1_of2.json.gz"
HALF = "scale(select=\"kind IN ('kernel','memcpy','memset','comm')\",factor=0.5)"
TENTH = "scale(select=\"kind IN ('kernel','memcpy','memset','comm')\",factor=0.1)"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("gpu_bound") / "store"


@pytest.mark.parametrize("trace, least", [(RESNET, 1.82), (RECSYS, 1.20)])
def test_halving_the_gpu_work_moves_the_step(store, trace, least):
    d = api.predict(str(trace), store, opts=[HALF])
    assert d.speedup >= least
    # the replay itself is exact: the graph reproduces the trace it came from
    assert all(it.baseline_ms == pytest.approx(it.measured_ms, rel=1e-3)
               for it in d.iterations if it.used)


def test_the_polling_thread_is_not_the_cpu_floor(store):
    """GPU work x0.1 on resnet50_v100_rank0: the floor gate compares the prediction with the
    busiest thread's own work, the main thread's ~15.6 ms (C above), not the polling thread's
    33.7 ms of untraced stretches that it once was."""
    d = api.predict(str(RESNET), store, opts=[TENTH])
    floor = next(g for g in d.gates if g.name == "floor")
    assert floor.ok, floor.note
    assert "-247463936" not in floor.note


def test_advise_calls_a_gpu_bound_trace_gpu_bound(store):
    p = subprocess.run([sys.executable, "-m", "daydream", "advise", str(RESNET), "--store",
                        str(store), "--json"], capture_output=True, text=True, check=True)
    assert json.loads(p.stdout)["bound"] == "GPU-bound"
