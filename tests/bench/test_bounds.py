"""bench/bounds.py: exact figures on hand-made traces (worked out by hand in toytraces.py),
the same figures from the Kineto and the Nsight form of one toy, and properties on real traces
with the GPU share checked by a second, plain-Python route written here."""

from __future__ import annotations

import ast
import gzip
import json
from decimal import Decimal
from pathlib import Path

import pytest

from bench import bounds
from tests.bench import toytraces as toy
from tests.conftest import DATA, ROOT

KEYS = ("T_ms", "G_ms", "G_all_ms", "G_stream_ms", "C_max_ms", "C_sum_ms", "W_ms")


def _check(fig: dict, expected: dict) -> None:
    for k, v in expected.items():
        assert fig[k] == pytest.approx(v, abs=1e-9), k


def test_toy_a_kineto_by_hand(tmp_path):
    b = bounds.bounds(toy.write_kineto(tmp_path / "a.json.gz", toy.toy_a_events()))
    assert b["rule"] == "ProfilerStep"
    assert [s["steady"] for s in b["steps"]] == [True, True, False]  # #3 is the drain
    assert b["steps"][2]["why"] == "drain (last step)"
    for s in b["steps"][:2]:
        _check(s, toy.TOY_A_EXPECTED_MS)
    _check(b["median"], toy.TOY_A_EXPECTED_MS)
    assert b["steps"][0]["C_thread_ms"] == {"1/1": pytest.approx(0.37),
                                            "1/2": pytest.approx(0.10)}
    assert not b["gpu_bound"] and not b["cpu_bound"]
    # C_serial, by hand: main's own parts [50,350) [400,420) [680,700) [720,730) [780,800),
    # its short gaps [0,50) [350,400) [700,720), bwd's own [150,250): their union is
    # [0,420) + [680,730) + [780,800) = 490 us (C_union, without the gaps: 370)
    assert b["median"]["C_serial_ms"] == pytest.approx(0.49)
    assert b["median"]["C_union_ms"] == pytest.approx(0.37)


def test_toy_a_nsys_same_figures(tmp_path):
    b = bounds.bounds(toy.write_toy_a_nsys(tmp_path / "a.sqlite"))
    assert b["rule"] == "ProfilerStep" and b["steady"] == 2
    _check(b["median"], toy.TOY_A_EXPECTED_MS)


def test_toy_a_edges_by_hand(tmp_path):
    b = bounds.bounds(toy.write_kineto(tmp_path / "a.json", toy.toy_a_events()))
    # GPU x 0.5: [max(0.2875, 0.370), 0.2875 + 0.590 + 0.200]
    assert bounds.edges(b, "gpu", 0.5) == pytest.approx((0.370, 1.0775))
    # CPU x 0.5: [max(0.575, 0.185), 0.575 + 0.295 + 0.200]
    assert bounds.edges(b, "cpu", 0.5) == pytest.approx((0.575, 1.070))
    with pytest.raises(ValueError):
        bounds.edges(b, "disk", 0.5)


def test_toy_b_optimizer_steps_and_warmup(tmp_path):
    b = bounds.bounds(toy.write_kineto(tmp_path / "b.json", toy.toy_b_events()))
    assert b["rule"] == "Optimizer.step"
    assert [round(s["T_ms"], 6) for s in b["steps"]] == [0.4, 1.0, 1.0, 1.0]
    assert [s["steady"] for s in b["steps"]] == [False, True, True, True]
    assert b["steps"][0]["why"] == "warm-up"
    _check(b["median"], {"T_ms": 1.0, "G_ms": 0.0, "G_all_ms": 0.0, "C_max_ms": 0.35,
                         "C_sum_ms": 0.45, "W_ms": 0.55})


def test_whole_trace_and_single_step(tmp_path):
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10,
           "dur": 40},
          {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 30, "dur": 70}]
    b = bounds.bounds(toy.write_kineto(tmp_path / "c.json", ev))
    assert b["rule"] == "whole trace" and b["steady"] == 1
    # window [10, 100) us: GPU 70, CPU 40, nothing between
    _check(b["median"], {"T_ms": 0.09, "G_ms": 0.07, "C_max_ms": 0.04, "W_ms": 0.0})
    one = toy.toy_a_events(steps=1)
    b = bounds.bounds(toy.write_kineto(tmp_path / "d.json", one))
    assert b["steady"] == 1 and "kept" in b["steps"][0]["why"]


def test_interval_helpers():
    import numpy as np
    a = np.array
    ms, me = bounds.merge(a([5, 0, 2, 10]), a([7, 3, 4, 12]))
    assert ms.tolist() == [0, 5, 10] and me.tolist() == [4, 7, 12]
    assert bounds.covered(ms, me, 1, 11) == 3 + 2 + 1
    gs, ge = bounds.gaps(ms, me, 0, 14)
    assert list(zip(gs.tolist(), ge.tolist(), strict=True)) == [(4, 5), (7, 10), (12, 14)]
    s, e = bounds.subtract(ms, me, a([1, 6]), a([2, 11]))
    assert list(zip(s.tolist(), e.tolist(), strict=True)) == [(0, 1), (2, 4), (5, 6), (11, 12)]


def test_reads_no_project_package():
    """The bounds must not come from the code they judge."""
    tree = ast.parse((ROOT / "bench" / "bounds.py").read_text())
    mods = {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    mods |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    assert not mods & {"ingest", "graphstore", "transforms", "simulate", "daydream", "collect"}


def _plain_gpu_share(path: Path) -> list[float]:
    """GPU busy share of each step window (ProfilerStep start to the next one's), by a
    second route: json + a sort-and-sweep union in plain Python, kernels/copies/sets only, in
    exact decimal microseconds (epoch microseconds as floats are only good to 0.25 us)."""
    ev = json.load(gzip.open(path), parse_float=Decimal)["traceEvents"]
    st = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("ph") == "X"
                and e.get("cat") in ("user_annotation", "cpu_op", "Operator")
                and str(e.get("name", "")).startswith("ProfilerStep#"))
    gpu = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("ph") == "X"
                 and str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset",
                                                        "memcpy", "memset"))
    out = []
    for (w0, _), (w1, _) in zip(st, st[1:], strict=False):
        busy, cur_s, cur_e = Decimal(0), None, None
        for s, e in gpu:
            s, e = max(s, w0), min(e, w1)
            if e <= s:
                continue
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    busy += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        if cur_e is not None:
            busy += cur_e - cur_s
        out.append(float(busy / (w1 - w0)))
    return out


def _plain_nothing_ms(path: Path, b: dict) -> list[float]:
    """Per steady step (ProfilerStep windows as bounds.py cuts them: start to the next one's),
    the ms in which no GPU task runs, no thread is inside an operator or a runtime call, and
    no thread is in a gap of at most 100 us between two of its marks."""
    ev = json.load(gzip.open(path), parse_float=Decimal)["traceEvents"]
    x = [e for e in ev if e.get("ph") == "X" and "dur" in e]
    st = sorted(e["ts"] for e in x if str(e.get("name", "")).startswith("ProfilerStep#")
                and e.get("cat") in ("user_annotation", "cpu_op", "Operator"))
    labels = {e["ts"]: e["name"] for e in x if str(e.get("name", "")).startswith("ProfilerStep#")}
    gpu = [(e["ts"], e["ts"] + e["dur"]) for e in x if str(e.get("cat", "")).lower() in
           ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")]
    marks: dict = {}
    for e in x:
        if e.get("cat") in ("cpu_op", "Operator", "cuda_runtime", "Runtime", "cuda_driver",
                            "Driver") and not str(e.get("name", "")).startswith("ProfilerStep#"):
            marks.setdefault((e.get("pid"), e.get("tid")), []).append(
                (e["ts"], e["ts"] + e["dur"]))
    short = []
    for iv in marks.values():
        iv.sort()
        end = None
        for a, z in iv:
            if end is not None and Decimal(0) < a - end <= 100:
                short.append((end, a))
            end = z if end is None else max(end, z)
    cover = sorted(gpu + short + [v for iv in marks.values() for v in iv])
    want = {s["label"] for s in b["steps"] if s["steady"]}
    out = []
    for w0, w1 in zip(st, st[1:], strict=False):
        if labels[w0] not in want:
            continue
        busy, cs, ce = Decimal(0), None, None
        for a, z in cover:
            a, z = max(a, w0), min(z, w1)
            if z <= a:
                continue
            if ce is None or a > ce:
                busy += (ce - cs) if ce is not None else 0
                cs, ce = a, z
            else:
                ce = max(ce, z)
        busy += (ce - cs) if ce is not None else 0
        out.append(float(w1 - w0 - busy) / 1e3)
    return out


@pytest.mark.parametrize("name,lo,hi", [
    # the lead measured 98.8% from the raw JSON for the steady steps (issue 14)
    ("resnet50_v100_rank0.json.gz", 0.985, 0.990),
    # a data-loading-heavy step (num_workers=0): the GPU idles while the CPU loads
    ("resnet50_v100_nw0_run1.json.gz", 0.50, 0.62),
])
def test_real_traces(name, lo, hi):
    path = DATA / "kineto" / name
    b = bounds.bounds(path)
    steady = [s for s in b["steps"] if s["steady"]]
    assert steady and b["rule"] == "ProfilerStep"
    plain = _plain_gpu_share(path)
    for k, s in enumerate(b["steps"][:-1]):
        assert s["G_ms"] / s["T_ms"] == pytest.approx(plain[k], abs=1e-6)
    for s in steady:
        assert 0 < s["G_stream_ms"] <= s["G_ms"] <= s["G_all_ms"] <= s["T_ms"]
        assert 0 < s["C_max_ms"] <= s["C_sum_ms"] and s["C_max_ms"] <= s["T_ms"]
        assert 0 <= s["W_ms"] <= s["T_ms"]
        assert lo <= s["G_ms"] / s["T_ms"] <= hi
        # the measured step lies in ACCURACY.md's own bounds at f = 1, [max(G, C), G + C],
        # without W: on these traces every wait ends on something the trace shows (a launch
        # queue, a sync, the data loader on the main thread), so the GPU's work and the
        # threads' own work with their short gaps must cover the step. W, defined as what the
        # bounds leave over, would make the upper edge hold whatever G and C were.
        assert max(s["G_ms"], s["C_max_ms"]) <= s["T_ms"] <= s["G_all_ms"] + s["C_sum_ms"]
    # W is no less than the time in which nothing the trace holds runs, counted by a second
    # route (plain Python, exact decimals, every work mark at its full length)
    for s, n in zip((s for s in b["steps"] if s["steady"]), _plain_nothing_ms(path, b),
                    strict=True):
        assert s["W_ms"] >= n - 1e-6, s["label"]


def test_hta_v100_warmup_and_drain():
    """Steps 101 (35 ms) and 102 (72 ms) fill the launch queue, 105 is the drain: the steady
    ones are 103 and 104, about 95.7 ms each (read from the trace by hand)."""
    b = bounds.bounds(DATA / "kineto" / "resnet50_v100_rank0.json.gz")
    assert [s["label"] for s in b["steps"] if s["steady"]] == ["ProfilerStep#103",
                                                              "ProfilerStep#104"]
    assert b["median"]["T_ms"] == pytest.approx(95.66, abs=0.01)
    assert b["gpu_bound"]
    # its launches are a small part of a step: the CPU's own work is well under the GPU's
    assert b["median"]["C_max_ms"] < 0.3 * b["median"]["T_ms"]


def test_nsys_real_slice():
    b = bounds.bounds(DATA / "nsys" / "fsdp_t5_2xh100_1s.sqlite")
    assert b["rule"] == "whole trace"
    m = b["median"]
    # two GPUs: G is the busier one's, G_all their union
    assert m["G_ms"] <= m["G_all_ms"] <= m["T_ms"] and m["C_max_ms"] > 0


def test_cli(tmp_path, capsys):
    p = toy.write_kineto(tmp_path / "a.json", toy.toy_a_events())
    bounds.main([str(p)])
    assert "G 0.57" in capsys.readouterr().out
    bounds.main([str(p), "--json"])
    assert json.loads(capsys.readouterr().out)["median"]["C_max_ms"] == pytest.approx(0.37)


def test_toy_c_wait_on_untraced_work_hides_the_gpu(tmp_path):
    b = bounds.bounds(toy.write_kineto(tmp_path / "c.json", toy.toy_c_events()))
    _check(b["median"], {"T_ms": 4.0, "G_ms": 0.5, "C_max_ms": 0.2, "C_sum_ms": 0.2,
                         "W_ms": 3.8})
    # GPU x 0.5: the kernel under the wait shrinks, the wait does not: [0.25 .. 0.2 + 3.8]
    assert bounds.edges(b, "gpu", 0.5) == pytest.approx((0.25, 0.25 + 0.2 + 3.8))


def test_toy_d_collectives_wait_for_peers(tmp_path):
    # Hand-made, one step shape repeated (us): aten::mm [0,100) > cudaLaunchKernel [10,20);
    # kernel k on stream 7 [100,400); ncclKernel_AllReduce on stream 8 [400,900) (transfer and
    # the wait for the slowest peer, which one rank's trace cannot tell apart); aten::add
    # [900,1000), woken as the all-reduce drained. G = G_all = 800, without the collective 300;
    # C_max = C_sum = 200; W = 0.
    ev = []
    for k in range(3):
        t0 = toy.BASE_US + k * 1000
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k + 1}",
                   "pid": 1, "tid": 1, "ts": t0, "dur": 1000})
        for cat, name, s, e, tid in (("cpu_op", "aten::mm", 0, 100, 1),
                                     ("cuda_runtime", "cudaLaunchKernel", 10, 20, 1),
                                     ("cpu_op", "aten::add", 900, 1000, 1),
                                     ("kernel", "k", 100, 400, 7),
                                     ("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float",
                                      400, 900, 8)):
            ev.append({"ph": "X", "cat": cat, "name": name, "pid": 0 if cat == "kernel" else 1,
                       "tid": tid, "ts": t0 + s, "dur": e - s})
    b = bounds.bounds(toy.write_kineto(tmp_path / "d.json", ev))
    _check(b["median"], {"G_ms": 0.8, "G_all_ms": 0.8, "G_nc_ms": 0.3, "G_all_nc_ms": 0.3,
                         "C_max_ms": 0.2, "C_sum_ms": 0.2, "W_ms": 0.0})
    assert bounds.gpu_floor(b["median"]) == pytest.approx(0.5)
    assert bounds.gpu_floor(b["median"], peers_in_trace=True) == pytest.approx(0.3)
    # GPU x 0.5 on one rank: the floor is the busiest stream (the collective's, 500 us) or
    # the other work (300); the upper edge keeps the collective whole: [0.25, 0.15 + 0.5 + 0.2]
    assert bounds.edges(b, "gpu", 0.5) == pytest.approx((0.25, 0.85))
    assert bounds.edges(b, "cpu", 0.5) == pytest.approx((0.5, 0.9))
    # with every rank's trace the waiting can end: the lower edge leaves the collective out
    assert bounds.edges({**b, "peers_in_trace": True}, "gpu", 0.5) == pytest.approx((0.2, 0.85))
    assert bounds.edges({**b, "peers_in_trace": True}, "cpu", 0.5) == pytest.approx((0.3, 0.9))


def _toy_e_events(late_launch: bool) -> list[dict]:
    # Hand-made, one step shape repeated, 3000 us (times from the step's start): aten::mm
    # [0,100) > two cudaLaunchKernel [10,20) and [30,40) (correlations 1 and 2 of the step);
    # kernel 1 on stream 7 [100,300); aten::add [1200,2200), the CPU's work while the GPU
    # idles; kernel 2 on stream 7 [2300,2800). Kernel 2's launch had returned (at 40) before
    # the GPU went idle at 300, and no GPU task ended in [300,2300): nothing the trace shows
    # ended that idle stretch. With ``late_launch`` kernel 2 is launched by a call inside
    # aten::add [2150,2160) instead: the CPU may have held it.
    ev = []
    for k in range(3):
        t0 = toy.BASE_US + k * 3000
        c1, c2 = 10 * k + 1, 10 * k + 2
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k + 1}",
                   "pid": 1, "tid": 1, "ts": t0, "dur": 3000})
        second = (2150, 2160) if late_launch else (30, 40)
        for cat, name, s, e, corr in (("cpu_op", "aten::mm", 0, 100, None),
                                      ("cuda_runtime", "cudaLaunchKernel", 10, 20, c1),
                                      ("cuda_runtime", "cudaLaunchKernel", *second, c2),
                                      ("cpu_op", "aten::add", 1200, 2200, None)):
            ev.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1,
                       "ts": t0 + s, "dur": e - s,
                       "args": {} if corr is None else {"correlation": corr}})
        for s, e, corr in ((100, 300, c1), (2300, 2800, c2)):
            ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7,
                       "ts": t0 + s, "dur": e - s, "args": {"correlation": corr}})
    return ev


def test_toy_e_gpu_idle_nothing_traced_ended(tmp_path):
    # By hand, per step: G = 200 + 500 = 700; C_max = C_sum = 100 + 1000 = 1100 (calls of 10
    # us inside ops, no short gaps). The union of GPU and own work is [0,300) + [1200,2200) +
    # [2300,2800) = 1800, which leaves 1200 of W; the idle stretch [300,2300) waited on what
    # the trace does not show, so W also holds the 1000 us of aten::add under it: W = 2200.
    b = bounds.bounds(toy.write_kineto(tmp_path / "e.json", _toy_e_events(False)))
    _check(b["median"], {"T_ms": 3.0, "G_ms": 0.7, "C_max_ms": 1.1, "C_sum_ms": 1.1,
                         "W_ms": 2.2})
    # CPU x 0.5: the idle does not shrink with the CPU: [0.7 .. 0.7 + 0.55 + 2.2], which
    # holds the step that stays 3.0 ms
    assert bounds.edges(b, "cpu", 0.5) == pytest.approx((0.7, 3.45))
    # the launch returned after the idle began (inside aten::add): the CPU may have held the
    # kernel, and W is the time neither side works
    late = bounds.bounds(toy.write_kineto(tmp_path / "f.json", _toy_e_events(True)))
    _check(late["median"], {"G_ms": 0.7, "C_max_ms": 1.1, "W_ms": 1.2})


@pytest.mark.parametrize("f", [0.5, 1.0])
def test_toy_f_sync_floor_by_hand(tmp_path, f):
    b = bounds.sync_floor(toy.write_kineto(tmp_path / "f.json", toy.toy_f_events()), f)
    assert b["chained"] and b["threads"] == ["1/1", "1/2"]
    assert [r["steady"] for r in b["steps"]] == [True, True, False]
    for r in b["steps"]:
        assert r["floor_ms"] == pytest.approx(toy.TOY_F_FLOOR_MS[f])
    st = b["steady"]
    assert st["steps"] == 2 and st["speedup_max"] == pytest.approx(1.0 / toy.TOY_F_FLOOR_MS[f])


def test_toy_f_sync_floor_short_gaps(tmp_path):
    path = toy.write_kineto(tmp_path / "f.json", toy.toy_f_events())
    b = bounds.sync_floor(path, 0.5, short_gaps=True)
    assert b["steady"]["floor_ms"] == pytest.approx(2 * toy.TOY_F_FLOOR_SHORT_GAPS_MS[0.5])


def test_toy_f_sync_floor_threads_that_overlap_each_alone(tmp_path):
    """Toy F with bwd's op moved to [20,200) (its launch [30,40)), under main's own work: the
    threads overlap, so each is taken alone: main's floor, 570 us, is the larger (bwd: its own
    180). Taken one after another they would give 600 (before the copy: 50 + 30 of own work
    before the first launch, + 360 of GPU work)."""
    ev = toy.toy_f_events()
    for e in ev:
        if e["tid"] == 2 and e["pid"] == 1:
            off = (e["ts"] - toy.BASE_US) // toy.STEP_US * toy.STEP_US + toy.BASE_US
            e["ts"] = off + (20 if e["cat"] == "cpu_op" else 30)
            e["dur"] = 180 if e["cat"] == "cpu_op" else 10
    b = bounds.sync_floor(toy.write_kineto(tmp_path / "f2.json", ev), 0.5)
    assert not b["chained"] and b["overlap_ms"] > 0
    assert b["steady"]["floor_ms"] == pytest.approx(2 * 0.570)


@pytest.mark.parametrize("rule", ["tail", "median"])
def test_toy_g_sync_floor_call_rules(tmp_path, rule):
    path = toy.write_kineto(tmp_path / "g.json", toy.toy_g_events())
    b = bounds.sync_floor(path, 0.5, median_calls=rule == "median")
    assert b["threads"] == ["1/1"] and b["median_calls"] == (rule == "median")
    assert [r["steady"] for r in b["steps"]] == [True, True, False]
    assert b["steady"]["floor_ms"] == pytest.approx(2 * toy.TOY_G_FLOOR_MS[rule])


def test_sync_floor_needs_launching_threads(tmp_path):
    """Toy A's calls carry no correlation ids: no thread launches GPU work the trace ties to
    it, so no floor is taken (0) rather than one from threads that may not hand work over."""
    b = bounds.sync_floor(toy.write_kineto(tmp_path / "a.json", toy.toy_a_events()), 0.5)
    assert b["threads"] == [] and b["steady"]["floor_ms"] == 0


def test_recsys_v100_predictions_keep_above_the_sync_floor():
    """The real GPU-bound recsys trace (tests/data/kineto, the judge's bound case): with every
    GPU task halved, Daydream's prediction of each steady step stays above the floor the
    host's blocking calls leave (bench/bounds.py sync_floor, read from the raw trace alone):
    a model that let the host's work overlap GPU work it waits for would go under it."""
    from daydream.graphstore.read import read_graph
    from daydream.simulate.replay import replay
    from daydream.transforms import Context, rewrite
    from tests.conftest import stored_graphs
    f = DATA / "kineto" / "recsys_v100_rank1_of2.json.gz"
    floor = {r["label"]: r["floor_ms"] for r in bounds.sync_floor(f, 0.5)["steps"]}
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        g = read_graph(Path(d), stored_graphs([f], Path(d))[f])
    g2 = rewrite(g, "scale(select=\"kind IN ('kernel','memcpy','memset','comm')\",factor=0.5)",
                 Context())
    used = [i for i in replay(g2).iterations if i.used]
    assert len(used) == 4
    for i in used:
        assert i.simulated_ns / 1e6 >= floor[i.label], i.label
