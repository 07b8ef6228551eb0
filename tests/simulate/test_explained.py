"""The graph explains the timeline (ACCURACY.md, measures 1 and 2; issue 14's "done when"), on
the real traces in tests/data, through the stages alone (ingest -> graphstore -> transforms ->
simulate):

- the replay with every slack kept reproduces the trace exactly (a regression test);
- the explained replay (every lag its physical latency, every waiting call at its own cost)
  stays within 2% of every measured iteration used;
- halving the GPU work of a GPU-bound trace moves its step the way the hardware would;
- the critical path of HTA's reference step agrees with Holistic Trace Analysis 0.5.0's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from daydream.graphstore.load import graph_tables
from daydream.ingest.convert import read_trace
from daydream.simulate.replay import replay
from daydream.transforms import Context, rewrite
from tests.conftest import DATA

V100 = DATA / "kineto" / "resnet50_v100_rank0.json.gz"  # HTA's ResNet-50, GPU-bound FP32
TRACES = [V100, DATA / "kineto" / "resnet50_ddp_a100_rank0.json.gz",
          DATA / "kineto" / "resnet50_v100_nw0_run1.json.gz",
          DATA / "kineto" / "dlrm_8ranks" / "rank0.kineto.json.gz"]
GPU = "scale(select=\"kind IN ('kernel','memcpy','memset','comm')\",factor={f})"


_GRAPHS: dict[Path, dict] = {}


def graph(path: Path) -> dict:
    if path not in _GRAPHS:
        _GRAPHS[path] = graph_tables(read_trace(path).tables)[1]
    return _GRAPHS[path]


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_exact_with_slack_and_explained_without(path):
    g = graph(path)
    kept, expl = replay(g), replay(g, slack=False)
    used = [i for i in kept.iterations if i.used]
    assert used
    assert all(i.simulated_ns == i.measured_ns for i in kept.iterations)
    by = {i.index: i.simulated_ns for i in expl.iterations}
    errs = [abs(by[i.index] - i.measured_ns) / i.measured_ns for i in used]
    assert np.mean(errs) < 0.02, errs


def test_halving_the_gpu_work_of_a_gpu_bound_trace():
    # HTA's V100 ResNet-50 keeps its GPU busy 98.8% of every steady step (94.5 of 95.7 ms,
    # bench/bounds.py on the raw JSON), and its CPU's own work is at most a quarter of a step:
    # a GPU twice as fast makes the step close to half (at least 1.7x faster, issue 14), with
    # the trace's slack kept and at zero alike.
    g = graph(V100)
    g2 = rewrite(g, GPU.format(f=0.5), Context())
    for slack in (True, False):
        base, pred = replay(g, slack=slack), replay(g2, slack=slack)
        speedup = base.headline("simulated_ns") / pred.headline("simulated_ns")
        assert 1.7 <= speedup <= 2.05, (slack, speedup)
        # and never faster than the GPU work alone: half of 94.5 ms
        assert pred.headline("simulated_ns") >= 0.5 * 94.5e6


def test_slower_gpu_slows_a_gpu_bound_step_in_proportion():
    g = graph(V100)
    base = replay(g).headline("simulated_ns")
    pred = replay(rewrite(g, GPU.format(f=1.2), Context())).headline("simulated_ns")
    assert pred / base == pytest.approx(1.2, rel=0.03)


def test_faster_cpu_leaves_a_gpu_bound_step_alone():
    g = graph(V100)
    base = replay(g).headline("simulated_ns")
    cpu = "scale(select=\"kind IN ('api','host')\",factor=0.5)"
    pred = replay(rewrite(g, cpu, Context())).headline("simulated_ns")
    assert pred == pytest.approx(base, rel=0.01)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_every_iterations_critical_path_spans_it(path):
    # issue 14: the path spans its iteration within 1% and its parts add up to it. The DDP
    # trace's last iteration ran 7.6% long when its path ended on the iteration's last-ending
    # task: a poller thread's host time that outlasts the step marker
    g = graph(path)
    r = replay(g)
    for i in (i for i in r.iterations if i.used):
        cp = r.critical_path_of(g, i.index)
        assert cp["span_ns"] == pytest.approx(i.simulated_ns, rel=0.01), i
        assert cp["covered_ns"] == cp["span_ns"] == cp["work_ns"] + cp["delay_ns"]


def test_critical_path_of_step_103_agrees_with_hta():
    # Holistic Trace Analysis 0.5.0's critical_path_analysis on ProfilerStep#103 of this trace
    # finds 95.6 ms, all of it GPU: 93.5 ms of compute and 2.0 ms kernel to kernel (issue 14).
    # Ours spans the step within 2%, with at least 90% GPU work, and its parts add up to it.
    g = graph(V100)
    r = replay(g)
    idx = g["iteration"]["label"].to_pylist().index("ProfilerStep#103")
    cp = r.critical_path_of(g, int(g["iteration"]["iteration"][idx].as_py()))
    assert cp["span_ns"] == pytest.approx(95.6e6, rel=0.02)
    assert cp["gpu_ns"] >= 0.9 * cp["span_ns"]
    assert cp["covered_ns"] == cp["span_ns"] == cp["work_ns"] + cp["delay_ns"]
    kinds = {p["kind"]: p["ns"] for p in cp["by_kind"]}
    assert kinds["kernel"] == pytest.approx(93.5e6, rel=0.02)
    assert 0 < kinds["delay: stream"] < 2.0e6


MI300X = DATA / "kineto" / "resnet_actckpt_mi300x_rank0_of8.json.gz"
FSDP = DATA / "nsys" / "fsdp_t5_2xh100_1s.sqlite"


@pytest.mark.parametrize(("path", "f"), [(MI300X, 0.25), (FSDP, 0.25), (FSDP, 0.5)],
                         ids=["mi300x-0.25", "fsdp-0.25", "fsdp-0.5"])
def test_gpu_scaled_step_within_the_bounds_of_the_raw_trace(path, f):
    # The bounds come from bench/bounds.py, which reads the raw file and never the graph: with
    # every GPU task scaled by f the step lies in [max(f G, C_max), f G_all + C_sum + W].
    # MI300X: a backlog from before the window keeps its GPU busy into the first step; made 4x
    # faster, the GPU catches up with a CPU that sets the pace (C_max 8.45 ms), and the step
    # may not fall below it (it fell to 5.2 ms when the steady step was timed completion to
    # completion alone). FSDP slice: 110 ms launch calls whose kernels ran after the slice
    # waited for a full queue; that wait shrinks with the GPU (442 ms against an upper edge of
    # 404 ms at a quarter, when the calls kept it as their own cost).
    from bench import bounds as bnd
    b = bnd.bounds(path)
    lo, hi = bnd.edges({"median": b["mean"]}, "gpu", f)
    g = graph(path)
    pred = replay(rewrite(g, GPU.format(f=f), Context())).headline("simulated_ns") / 1e6
    assert lo * 0.995 <= pred <= hi * 1.005, (lo, pred, hi)
    if b["gpu_bound"] and f * b["mean"]["G_ms"] >= b["mean"]["C_union_ms"]:
        assert pred <= 1.1 * lo, (lo, pred)  # GPU-bound: within 10% of the lower edge
