"""The CPU models of fused optimizers and DataLoader workers, on the real CPU what-if traces of
tests/data/whatif (torch.profiler, CPU only; see the README there).

The expected fused-op durations are computed here from the raw trace JSON (top-level ops
nested in each ``Optimizer.step`` range, by their own ts/dur), not from the graph the code
under test reads."""

from __future__ import annotations

import gzip
import json

import numpy as np
import polars as pl
import pytest

from daydream.simulate.replay import replay
from daydream.transforms import rewrite
from daydream.transforms.constants import DATALOADER, FUSED_OPTIMIZER
from daydream.transforms.opts import dataloader as dl_mod
from daydream.transforms.opts import fused_optimizer as fo_mod
from daydream.transforms.primitives import Graph
from tests.conftest import DATA

WHATIF = DATA / "whatif"
IPC = DATALOADER["ipc_ns"]["value"]


@pytest.fixture(scope="module")
def cpu_graphs(tmp_path_factory):
    from daydream.graphstore.read import read_graph
    from tests.conftest import stored_graphs
    store = tmp_path_factory.mktemp("whatif_store")
    names = ("adam_foreach_false", "adagrad_foreach_false", "sgd_foreach_false",
             "dataloader_w0", "adam_fused")
    ids = stored_graphs([WHATIF / f"{f}.json.gz" for f in names], store)
    return {f: read_graph(store, ids[WHATIF / f"{f}.json.gz"]) for f in names}


def T(tables):
    return pl.from_arrow(tables["task"])


def raw_steps(path):
    """Per Optimizer.step range of the raw trace: its duration, its first and last top-level
    op's offsets, and the top-level ops as (name, dur_ns)."""
    ev = [e for e in json.loads(gzip.open(path).read())["traceEvents"] if e.get("ph") == "X"]
    ev.sort(key=lambda e: (e["ts"], -e["dur"]))
    out = []
    for o in (e for e in ev if e["name"].startswith("Optimizer.step#")):
        lo, hi = o["ts"], o["ts"] + o["dur"]
        top, end = [], -1.0
        for e in ev:
            if lo <= e["ts"] <= hi and e is not o and e["ts"] >= end:
                top.append((e["name"], e["dur"] * 1e3))
                end = e["ts"] + e["dur"]
        out.append(top)
    return out


def expected_fused_ns(top, kind):
    """The model of transforms/opts/fused_optimizer.py cpu_plan, written out by hand for
    torch's for-loop Adam/SGD: step-counter add_ ops (the first op and each add_ right after an
    addcdiv_) are kept; every other op counts its duration above the lower median of its
    name (clipped at 0)."""
    names = [n for n, _ in top]
    kept = set()
    if kind in ("adam", "adagrad"):
        kept = {i for i, n in enumerate(names)
                if n == "aten::add_" and (i == 0 or names[i - 1] == "aten::addcdiv_")}
    math = [(n, d) for i, (n, d) in enumerate(top) if i not in kept]
    by: dict[str, list[float]] = {}
    for n, d in math:
        by.setdefault(n, []).append(d)
    floor = {n: sorted(v)[(len(v) - 1) // 2] for n, v in by.items()}
    var = sum(max(0.0, d - floor[n]) for n, d in math)
    return (FUSED_OPTIMIZER["fused_cpu_ns"]["value"] + var * FUSED_OPTIMIZER[kind]["value"],
            len(kept), len(math))


OPS_PER_PARAM = {"adam": 9, "adagrad": 6, "sgd": 3}


@pytest.mark.parametrize("kind,trace", [("adam", "adam_foreach_false"),
                                        ("adagrad", "adagrad_foreach_false"),
                                        ("sgd", "sgd_foreach_false")])
def test_fused_optimizer_cpu_graph(cpu_graphs, kind, trace):
    g = cpu_graphs[trace]
    t0 = T(g)
    g2 = rewrite(g, f"fused_{kind}")
    t1 = T(g2)
    steps = raw_steps(WHATIF / f"{trace}.json.gz")
    assert len(steps) == 3
    # one fused op inserted per step, on the training thread, in the weight update
    fused = t1.filter(pl.col("name") == f"fused_{kind}: _fused_{kind}_ (inserted)")
    assert t1.height == t0.height + 3
    assert fused.height == 3 and set(fused["kind"]) == {"host"}
    assert set(fused["phase"]) == {"weight_update"} and fused["iteration"].to_list() == [0, 1, 2]
    for top, got in zip(steps, fused["dur_ns"].to_list(), strict=True):
        exp, n_kept, _ = expected_fused_ns(top, kind)
        assert len(top) == OPS_PER_PARAM[kind] * 52  # 52 parameter tensors
        assert n_kept == (0 if kind == "sgd" else 52)
        assert got == pytest.approx(exp, abs=1)  # ns: the graph's task times are rounded
    # what stays: the step's first and last gap (Python set-up, wrap-up), the step-counter
    # increments, zero_grad and everything outside the weight update, all unchanged
    old = t0.with_columns(pl.col("dur_ns").alias("d0")).select("start_ns", "name", "unit_id",
                                                                 "phase", "d0")
    new = t1.filter(~pl.col("name").str.starts_with("fused_")).select("dur_ns")
    both = pl.concat([old, new], how="horizontal")
    assert both.filter(pl.col("phase") != "weight_update").select(
        (pl.col("dur_ns") == pl.col("d0")).all()).item()
    wu = both.filter(pl.col("phase") == "weight_update")
    zeroed = wu.filter(pl.col("dur_ns") == 0, pl.col("d0") > 0)
    kept = wu.filter(pl.col("dur_ns") == pl.col("d0"), pl.col("d0") > 0)
    assert wu.filter((pl.col("dur_ns") != 0) & (pl.col("dur_ns") != pl.col("d0"))).height == 0
    step_name = [n for n in wu["name"] if n.startswith("Optimizer.step#")][0]
    gaps = wu.filter(pl.col("name") == step_name)
    # per step: 52*ops_per_param - 1 gaps between ops dropped, the first and last kept
    per = OPS_PER_PARAM[kind] * 52
    assert zeroed.filter(pl.col("name") == step_name).height == 3 * (per - 1)
    assert kept.filter(pl.col("name") == step_name).height == 6
    assert gaps.height == 3 * (per + 1)
    # every kept op task is a step counter (add_ and its nested to/_to_copy/...) or zero_grad
    if kind != "sgd":
        assert kept.filter(pl.col("name") == "aten::add_").height == 3 * 52 * 2  # self time
        assert not kept.filter(pl.col("name").is_in(["aten::lerp_", "aten::sqrt",
                                                     "aten::addcdiv_"])).height
    else:
        assert not kept.filter(pl.col("name").str.starts_with("aten::")).height
    assert kept.filter(pl.col("name").str.contains("zero_grad")).height == 3
    # the prediction: the step shrinks, the iteration gets faster, nothing else moves
    s = replay(Graph.from_tables(g).tables()).mean("simulated_ns") / replay(g2).mean(
        "simulated_ns")
    assert {"adam": 1.3, "adagrad": 1.15, "sgd": 1.05}[kind] < s < {"adam": 2.0, "adagrad": 1.6,
                                                                    "sgd": 1.3}[kind]


def test_contention_model_hand_drawn():
    """Hand-drawn cases (ms): load 12, compute 5 and two workers on two cores: three threads
    share two cores (2/3 each) while the training thread computes (5 -> 7.5 ms), during which
    each worker does 5 ms of its 6 ms batch; the last 1 ms runs at a full core while the
    training thread waits. Load 4, compute 6: the workers' 2 ms each take 3 ms at 2/3 of a
    core, costing the training thread 1 ms: 7 ms, no wait. One worker with a core of its own:
    max(compute, load)."""
    comp, wait = dl_mod.step_model([12.0, 4.0], [5.0, 6.0], workers=2, cores=2.0, ipc_ns=0.0)
    assert comp.tolist() == pytest.approx([7.5, 7.0])
    assert wait.tolist() == pytest.approx([1.0, 0.0])
    comp, wait = dl_mod.step_model([12.0, 4.0], [5.0, 6.0], workers=1, cores=2.0, ipc_ns=0.5)
    assert (comp + wait).tolist() == pytest.approx([12.5, 6.5])
    assert dl_mod.shares(1, 0.0) == (1.0, 1.0)  # 0 = enough cores
    # 1.5 effective cores (a shared VM): one worker and the training thread get 0.75 each:
    # 6 ms of compute take 8, the worker does 6 of its 12 ms meanwhile and the rest alone
    comp, wait = dl_mod.step_model([12.0], [6.0], workers=1, cores=1.5, ipc_ns=0.0)
    assert comp.tolist() == pytest.approx([8.0]) and wait.tolist() == pytest.approx([6.0])


def test_dataloader_cores_graph(cpu_graphs):
    g = cpu_graphs["dataloader_w0"]
    t = T(g)
    it = pl.from_arrow(g["iteration"])
    assert it.height == 10
    g2 = rewrite(g, "dataloader(workers=2,cores=2)")
    t2 = T(g2)
    assert t2.height == t.height
    load_sel = ((t["kind"] == "host") & (t["phase"] == "data_loading")
                & t["iteration"].is_not_null()).to_numpy()
    other_sel = (~load_sel & t["iteration"].is_not_null().to_numpy()
                 & (t["kind"] == "host").to_numpy())
    d0, d2 = t["dur_ns"].to_numpy(), t2["dur_ns"].to_numpy()
    its = t["iteration"].fill_null(-1).to_numpy()
    for r in it.iter_rows(named=True):
        i = r["iteration"]
        load = d0[load_sel & (its == i)].sum()
        span = r["end_ns"] - r["start_ns"]
        comp = span - load
        assert load / span > 0.4  # the job spends most of a step loading (num_workers=0)
        a = load / 2  # per worker; 3 threads on 2 cores: 2/3 of a core each, 1 when waiting
        if a >= comp:
            comp2, wait = comp * 1.5, a - comp + IPC
        else:
            comp2, wait = comp + a * 0.5, IPC
        m = load_sel & (its == i)
        assert np.allclose(d2[m], np.rint(d0[m] * min(1, wait / load)), atol=1)
        m = other_sel & (its == i)
        assert np.allclose(d2[m], np.rint(d0[m] * comp2 / comp), atol=1)
    # tasks outside the iterations are untouched
    m = ~(load_sel | other_sel)
    assert np.array_equal(d2[m], d0[m])
    # more workers than cores can take is slower than enough cores, faster than none
    base = replay(Graph.from_tables(g).tables()).mean("simulated_ns")
    free = replay(rewrite(g, "dataloader(workers=2)")).mean("simulated_ns")
    tight = replay(g2).mean("simulated_ns")
    assert free < tight < base


def test_cpu_step_segments_hand_drawn():
    """Hand-drawn (an edge case no real trace here has): one iteration with two optimizers'
    steps on one thread, ranges 10 and 20 with the same name. Step 10: gap, add_ (with a nested
    to, and add_'s self time after it), gap, addcdiv_, gap. Step 20: gap, mul_, gap, mul_, gap.
    Each step is cut on its own gaps; nested tasks stay in their op's segment."""
    S = "Optimizer.step#SGD.step"
    rows = [  # name, range_id, start_ns, dur_ns
        ("<trace start>", None, 0, 0),
        (S, 10, 100, 5), ("aten::add_", 11, 105, 2), ("aten::to", 12, 107, 3),
        ("aten::add_", 11, 110, 1), (S, 10, 111, 4), ("aten::addcdiv_", 13, 115, 6),
        (S, 10, 121, 9),
        (S, 20, 200, 7), ("aten::mul_", 21, 207, 10), (S, 20, 217, 3),
        ("aten::mul_", 22, 220, 4), (S, 20, 224, 2),
    ]
    task = pl.DataFrame({
        "task_id": list(range(len(rows))), "kind": ["host"] * len(rows),
        "unit_id": [0] * len(rows), "name": [r[0] for r in rows],
        "phase": [None] + ["weight_update"] * (len(rows) - 1),
        "iteration": [None] + [0] * (len(rows) - 1),
        "start_ns": [r[2] for r in rows], "dur_ns": [r[3] for r in rows],
        "range_id": [r[1] for r in rows]}, schema_overrides={"iteration": pl.Int32})
    g = Graph(task, pl.DataFrame(), pl.DataFrame(), pl.DataFrame(), pl.DataFrame())
    seg = fo_mod.cpu_step_segments(g)
    got = [(r["step_id"], r["seq"], r["is_gap"], r["name"], r["ids"], r["dur_ns"])
           for r in seg.iter_rows(named=True)]
    assert got == [
        (10, 0, True, S, [1], 5), (10, 1, False, "aten::add_", [2, 3, 4], 6),
        (10, 2, True, S, [5], 4), (10, 3, False, "aten::addcdiv_", [6], 6),
        (10, 4, True, S, [7], 9),
        (20, 0, True, S, [8], 7), (20, 1, False, "aten::mul_", [9], 10),
        (20, 2, True, S, [10], 3), (20, 3, False, "aten::mul_", [11], 4),
        (20, 4, True, S, [12], 2)]
    fixed = FUSED_OPTIMIZER["fused_cpu_ns"]["value"]
    # adam's rule: the add_ opening the step is its counter (kept); addcdiv_ seen once counts
    # whole; the middle gap goes; step 20's mul_s count above their lower median (10 - 4)
    a = fo_mod.cpu_plan(seg, "adam")
    assert [(p["keep"], p["drop"], p["var_ns"]) for p in a] == [([2, 3, 4], [5, 6], 6),
                                                                ([], [9, 10, 11], 6)]
    assert [p["fused_ns"] for p in a] == [fixed + round(6 * FUSED_OPTIMIZER["adam"]["value"])] * 2
    s = fo_mod.cpu_plan(seg, "sgd")  # no step counter: add_ (6) and addcdiv_ (6) count whole
    assert [(p["keep"], p["drop"], p["var_ns"]) for p in s] == [([], [2, 3, 4, 5, 6], 12),
                                                                ([], [9, 10, 11], 6)]


def test_fused_adam_on_a_fused_trace_changes_nothing(cpu_graphs):
    """adam_fused runs torch's fused=True Adam (aten::_fused_adam_ in its Optimizer.step):
    fused_adam does not apply, says so, and the graph is unchanged."""
    from daydream.transforms import Context
    notes = []
    g = cpu_graphs["adam_fused"]
    g2 = rewrite(g, "fused_adam", Context(notes=notes))
    assert np.array_equal(T(g2)["dur_ns"].to_numpy(), T(g)["dur_ns"].to_numpy())
    assert notes and notes[0].startswith("fused_adam: does not apply, its weight update runs "
                                         "'aten::_fused_adam_'")
