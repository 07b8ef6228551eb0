"""Distributed what-ifs: the communication model, bandwidth(X), world(N), ddp(...), no_straggler.

Exact tests run on a hand-made toy graph (made here, below: one backward step of two kernels, an
all-reduce on its own stream, an optimizer kernel), whose expected times are worked out by hand
from the documented formulas. Real-trace tests: the fitted bandwidth of the HTA ResNet-50 DDP
A100 rank 0 trace (sizes from its NCCL kernel args), and the DLRM job."""

from __future__ import annotations

import gzip
import json

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from daydream.base.errors import DaydreamError
from daydream.simulate.replay import replay
from daydream.transforms import Context, rewrite
from daydream.transforms.comm import Link, collective_type, cost_terms, parse_bandwidth
from tests.conftest import DATA

TASK = {"task_id": pa.int64(), "kind": pa.string(), "unit_id": pa.int32(), "name": pa.string(),
        "layer": pa.string(), "phase": pa.string(), "iteration": pa.int32(),
        "start_ns": pa.int64(), "dur_ns": pa.int64(), "obs_dur_ns": pa.int64(),
        "bytes": pa.int64(), "correlation": pa.int64(), "range_id": pa.int64(),
        "blocking": pa.bool_(), "priority": pa.int64()}
EDGE = {"src": pa.int64(), "dst": pa.int64(), "kind": pa.string(), "anchor": pa.string(),
        "lag_ns": pa.int64(), "binding": pa.bool_()}
UNIT = {"unit_id": pa.int32(), "kind": pa.string(), "pid": pa.int64(), "tid": pa.int64(),
        "device": pa.int32(), "stream": pa.int64(), "name": pa.string(), "policy": pa.string()}
ITER = {"iteration": pa.int32(), "label": pa.string(), "source": pa.string(),
        "start_ns": pa.int64(), "end_ns": pa.int64()}
LAYER = {"layer": pa.string(), "source": pa.string(), "module_type": pa.string(),
         "first_start_ns": pa.int64(), "param_bytes": pa.int64()}


def _table(rows: list[dict], schema: dict) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=pa.schema(list(schema.items())))


def toy(comm: bool = True, layer_bytes: dict | None = None) -> dict[str, pa.Table]:
    """Hand-made: thread 1 launches bwd kernel A (100 us), bwd kernel B (100 us) and, with
    COMM, a 1 MB all-reduce (50 us) on stream 3, then the optimizer kernel (20 us)."""
    T = []

    def t(kind, unit, name, start, dur, phase=None, nbytes=None, layer=None):
        T.append({"task_id": len(T), "kind": kind, "unit_id": unit, "name": name,
                  "layer": layer, "phase": phase, "iteration": 0 if len(T) else None,
                  "start_ns": start, "dur_ns": dur, "obs_dur_ns": dur, "bytes": nbytes,
                  "blocking": False})
        return len(T) - 1

    o = t("host", 0, "<trace start>", 0, 0)
    la = t("api", 1, "cudaLaunchKernel", 10_000, 5_000, "backward")
    ka = t("kernel", 2, "bwd A", 20_000, 100_000, "backward", layer="l2")
    lb = t("api", 1, "cudaLaunchKernel", 30_000, 5_000, "backward")
    kb = t("kernel", 2, "bwd B", 120_000, 100_000, "backward", layer="l1")
    kc = t("comm", 3, "ncclKernel_AllReduce_RING_LL_Sum_float", 130_000, 50_000,
           "backward", 1_000_000) if comm else None
    lo = t("api", 1, "cudaLaunchKernel", 240_000, 5_000, "weight_update")
    ko = t("kernel", 2, "multi_tensor_apply_kernel", 250_000, 20_000, "weight_update")
    E = [(o, la, "origin", "end_start", 10_000), (la, lb, "thread", "end_start", 15_000),
         (lb, lo, "thread", "end_start", 205_000), (la, ka, "launch", "start_start", 10_000),
         (lb, kb, "launch", "start_start", 5_000), (lo, ko, "launch", "start_start", 10_000),
         (ka, kb, "stream", "end_start", 0), (kb, ko, "stream", "end_start", 30_000)]
    if comm:
        E.append((lb, kc, "launch", "start_start", 100_000))
    edges = [{"src": s, "dst": d, "kind": k, "anchor": a, "lag_ns": lag, "binding": True}
             for s, d, k, a, lag in E]
    units = [{"unit_id": 0, "kind": "thread", "name": "origin", "policy": "fixed"},
             {"unit_id": 1, "kind": "thread", "pid": 1, "tid": 1, "name": "thread 1",
              "policy": "fixed"},
             {"unit_id": 2, "kind": "stream", "device": 0, "stream": 7, "name": "gpu 0 s 7",
              "policy": "fixed"},
             {"unit_id": 3, "kind": "stream", "device": 0, "stream": 9, "name": "gpu 0 s 9",
              "policy": "fixed"}]
    layers = [{"layer": k, "source": "module", "param_bytes": v}
              for k, v in (layer_bytes or {}).items()]
    return {"task": _table(T, TASK), "edge": _table(edges, EDGE), "unit": _table(units, UNIT),
            "iteration": _table([{"iteration": 0, "label": "step", "source": "ProfilerStep",
                                  "start_ns": 10_000, "end_ns": 270_000}], ITER),
            "layer": _table(layers, LAYER)}


def _starts(g):
    return replay(g).schedule


# ---- the model --------------------------------------------------------------------------------

def test_cost_terms_from_the_documented_formulas():
    assert cost_terms("all_reduce", 8) == (14, 1.75)          # ring: 2(n-1), 2(n-1)/n
    assert cost_terms("all_gather", 4) == (3, 0.75)           # (n-1), (n-1)/n
    assert cost_terms("reduce_scatter", 2) == (1, 0.5)
    assert cost_terms("send_recv", 64) == (1, 1.0)
    assert cost_terms("all_reduce", 8, "tree") == (6, 2.0)    # 2 log2(8) steps, 2x the message
    assert cost_terms("all_reduce", 1) == (0, 0)


def test_bandwidth_specs():
    assert parse_bandwidth("100Gbps").gbps == pytest.approx(12.5)
    assert parse_bandwidth("25GB/s").gbps == pytest.approx(25.0)
    assert parse_bandwidth("2x", Link(3000, 10.0, "x")).gbps == pytest.approx(20.0)
    assert parse_bandwidth("ib_hdr").gbps == pytest.approx(25.0 * 0.8)  # peak x efficiency
    from daydream.base.errors import DaydreamError
    with pytest.raises(DaydreamError, match="bad bandwidth"):
        parse_bandwidth("fast")
    assert collective_type("ncclDevKernel_AllGather_RING_LL(x)") == "all_gather"


# ---- bandwidth / world on the toy -------------------------------------------------------------

def test_bandwidth_2x_rescales_the_transfer_exactly():
    """World 2, no device: PCIe 4 latency 5 us per step. Fit from the one size: 1 MB in 50 us ->
    20 GB/s. Split: latency 2 steps x 5 us = 10 us, transfer 1e6/20 = 50 us capped at the
    remaining 40 us, rest 0. At 2x: 10 + 40/2 = 30 us."""
    g = toy()
    notes = []
    g2 = rewrite(g, "bandwidth(2x)", Context(world_size=2, notes=notes))
    assert g2["task"]["dur_ns"].to_pylist()[5] == 30_000
    assert any("fitted bandwidth 20.00 GB/s" in n for n in notes)
    # the optimizer now waits for the all-reduce (DDP's finalize): one inserted wait edge
    e = pl.from_arrow(g2["edge"]).filter(pl.col("kind") == "wait")
    assert e.select("src", "dst").rows() == [(5, 7)]


def test_world_8_follows_the_ring_model_and_delays_the_optimizer():
    """2 -> 8 ranks: latency 14 steps x 5 us = 70 us, transfer 40 us x 1.75/1 = 70 us: 140 us.
    The all-reduce starts at 130 us and ends at 270 us; the optimizer kernel (250 us in the
    trace) starts when it ends."""
    g2 = rewrite(toy(), "world(8)", Context(world_size=2))
    assert g2["task"]["dur_ns"].to_pylist()[5] == 140_000
    s = _starts(g2)
    assert s.end_ns[5] - s.start_ns[5] == 140_000
    assert s.start_ns[7] == s.end_ns[5] == 270_000
    assert _starts(toy()).start_ns[7] == 250_000  # unchanged graph: as traced


def test_world_on_a_single_gpu_trace_is_a_clear_error():
    from daydream.base.errors import DaydreamError
    with pytest.raises(DaydreamError, match="not distributed"):
        rewrite(toy(), "world(8)", Context(world_size=None))


@pytest.mark.parametrize("opt", ["p3", "blueconnect", "dgc(ratio=0.01)"])
def test_gradient_what_ifs_without_an_all_reduce_say_to_chain_after_ddp(opt):
    from daydream.base.errors import DaydreamError
    name = opt.split("(")[0]
    with pytest.raises(DaydreamError, match=rf"^{name}: no gradient all-reduce; chain it after "
                       r"ddp\(world=N"):
        rewrite(toy(comm=False), opt, Context(world_size=None))


# ---- ddp on the toy ---------------------------------------------------------------------------

def test_ddp_buckets_and_durations_exactly():
    """param_bytes 30 MB over kernels A (100 us) and B (100 us): 15 MB each. Buckets: the first
    is capped at 1 MiB, so it closes after A (15 MB); B's 15 MB is the last bucket. 8 ranks at
    100 Gbps (12.5 GB/s), 5 us per step: 14 x 5 us + 1.75 x 15e6 / 12.5 = 70 + 2100 us."""
    notes = []
    g2 = rewrite(toy(comm=False), "ddp(world=8,bandwidth=100Gbps,param_bytes=30000000)",
                 Context(notes=notes))
    t = pl.from_arrow(g2["task"])
    ins = t.filter(pl.col("name").str.starts_with("ddp:"))
    assert ins["name"].to_list() == ["ddp: all_reduce bucket 0 (inserted)",
                                     "ddp: all_reduce bucket 1 (inserted)"]
    assert ins["bytes"].to_list() == [15_000_000, 15_000_000]
    assert ins["dur_ns"].to_list() == [2_170_000, 2_170_000]
    assert ins["kind"].to_list() == ["comm", "comm"]
    chan = pl.from_arrow(g2["unit"]).filter(pl.col("kind") == "channel")
    assert chan["policy"].to_list() == ["fcfs"] and set(ins["unit_id"]) == {chan["unit_id"][0]}
    ids = dict(zip(t["name"].to_list(), t["task_id"].to_list(), strict=False))
    e = pl.from_arrow(g2["edge"])
    b0, b1 = ins["task_id"].to_list()
    dep = e.filter(pl.col("kind") != "launch")
    assert dep.filter(pl.col("dst") == b0)["src"].to_list() == [ids["bwd A"]]
    assert dep.filter(pl.col("dst") == b1)["src"].to_list() == [ids["bwd B"]]
    # each bucket is launched by a call after the one that launched its ready kernel
    la = e.filter(pl.col("kind") == "launch", pl.col("dst").is_in([b0, b1])).sort("dst")
    calls = t.filter(pl.col("task_id").is_in(la["src"].to_list())).sort("task_id")
    assert calls["name"].to_list() == ["cudaLaunchKernel (inserted)"] * 2
    assert calls["unit_id"].to_list() == [1, 1] and calls["dur_ns"].to_list() == [5_000] * 2
    opt = ids["multi_tensor_apply_kernel"]
    assert sorted(e.filter(pl.col("dst") == opt, pl.col("kind") == "wait")["src"]) == [b0, b1]
    assert any("param_bytes=30000000 given" in n for n in notes)
    # simulated: A ends at 120 us, bucket 0 runs 120..2290 us, bucket 1 (B ends at 220 us)
    # waits for the channel: 2290..4460 us; the optimizer starts then
    s = _starts(g2)
    assert s.start_ns[b0] == 120_000 and s.end_ns[b0] == 2_290_000
    assert s.start_ns[b1] == 2_290_000 and s.end_ns[b1] == 4_460_000
    assert s.start_ns[opt] == 4_460_000


def test_ddp_uses_layer_sizes_from_the_trace():
    """Layer markers give l2 4 MB and l1 2 MB: the gradients of l2 are ready after kernel A,
    of l1 after B; bucket_mb=25: bucket 0 (1 MiB cap) after A with 4 MB, bucket 1 with 2 MB."""
    notes = []
    g2 = rewrite(toy(comm=False, layer_bytes={"l2": 4_000_000, "l1": 2_000_000}),
                 "ddp(world=2,bandwidth=25GB/s)", Context(notes=notes))
    ins = pl.from_arrow(g2["task"]).filter(pl.col("name").str.starts_with("ddp:"))
    assert ins["bytes"].to_list() == [4_000_000, 2_000_000]
    # 2 ranks: 2 steps x 5 us + 1 x bytes / 25 GB/s
    assert ins["dur_ns"].to_list() == [10_000 + 160_000, 10_000 + 80_000]
    assert any("trace: parameter sizes of 2 layers" in n for n in notes)


def test_ddp_without_sizes_says_how_to_give_them():
    from daydream.base.errors import DaydreamError
    with pytest.raises(DaydreamError, match="--param-bytes N"):
        rewrite(toy(comm=False), "ddp(world=8)")


# ---- real traces ------------------------------------------------------------------------------

def test_fitted_bandwidth_of_the_resnet50_ddp_trace(graphs):
    """HTA ResNet-50 DDP, A100 rank 0 of 2: message sizes from the NCCL args ('In msg nelems',
    Float), the fastest instance of each size, a least-squares line: bandwidth = 1/slope."""
    from daydream.transforms.comm import fit
    with gzip.open(DATA / "kineto" / "resnet50_ddp_a100_rank0.json.gz") as f:
        ev = json.load(f)["traceEvents"]
    best: dict[tuple, float] = {}
    for e in ev:
        a = e.get("args", {})
        if e.get("cat") == "kernel" and "In msg nelems" in a:
            kind = "all_reduce" if "AllReduce" in e["name"] else "broadcast"
            w = {"Float": 4, "Long": 8}[a["dtype"]]
            key = (kind, a["In msg nelems"] * w)
            best[key] = min(best.get(key, 1e18), e["dur"] * 1000)
    x = np.array([k[1] for k in best], float)  # 2 ranks: ring wire factor 1 for both types
    y = np.array(list(best.values()))
    slope, _ = np.polyfit(x, y, 1)
    f = fit(pl.from_arrow(graphs["a100"]["task"]), 2, 5000)
    assert f.points == len(best) == 7
    assert f.link.gbps == pytest.approx(1 / slope, rel=1e-3)
    assert 10 < f.link.gbps < 20  # ~15 GB/s, waiting for rank 1 included


def test_bandwidth_on_the_resnet50_ddp_trace(graphs, baselines):
    """bandwidth(1x) leaves the prediction as the replay; a slower network only adds time."""
    g = graphs["a100"]
    same = replay(rewrite(g, "bandwidth(1x)", Context(world_size=2)))
    assert same.mean("simulated_ns") == pytest.approx(baselines["a100"].mean("simulated_ns"))
    t1 = pl.from_arrow(rewrite(g, "bandwidth(0.5x)", Context(world_size=2))["task"])
    t0 = pl.from_arrow(g["task"])
    c = (t0["kind"] == "comm").to_numpy()
    assert (t1["dur_ns"].to_numpy()[c] >= t0["dur_ns"].to_numpy()[c]).all()
    assert t1["dur_ns"].to_numpy()[c].sum() > t0["dur_ns"].to_numpy()[c].sum()


# ---- p3, dgc, blueconnect on the toy after ddp ------------------------------------------------
# ddp(world=8, bandwidth=25GB/s) with layer sizes l2 4 MB (ready after A), l1 2 MB (after B):
# buckets of 70 + 1.75 x 4e6 / 25 = 350 us and 70 + 140 = 210 us. The fit on them is exact
# (two sizes): 25 GB/s, latency 14 steps x 5 us.
SIZES = {"l2": 4_000_000, "l1": 2_000_000}
DDP8 = "ddp(world=8,bandwidth=25GB/s)"


def test_p3_slices_priorities_and_schedule():
    """slice_kb=1000, max_overhead=1 (the latency the extra slices add may reach the
    transfer: at most 1 + 280/70 = 5 and 1 + 140/70 = 3 slices): bucket 0 -> 4 slices, bucket
    1 -> 2, each one latency and its share of the transfer, 70 + 280/4 = 70 + 140/2 = 140 us.
    Priority: bucket 1 (ready last: the layers nearest the input) first. Channel: a bucket-0
    slice 120-260 us; then bucket 1's two (260-540) before bucket 0's other three (540-960);
    one iteration only: the optimizer still waits for every slice."""
    g2 = rewrite(toy(comm=False, layer_bytes=SIZES), DDP8 + "+p3(slice_kb=1000,max_overhead=1)")
    t = pl.from_arrow(g2["task"])
    sl = t.filter(pl.col("kind") == "comm").sort("task_id")
    assert sl.height == 6 and set(sl["dur_ns"]) == {140_000}
    by_bucket = sl.with_columns(pl.col("bytes"))
    assert sorted(by_bucket["bytes"].to_list()) == [1_000_000] * 6
    chan = pl.from_arrow(g2["unit"]).filter(pl.col("name") == "p3 slices (inserted)")
    assert chan["policy"].to_list() == ["priority"] and set(sl["unit_id"]) == {
        chan["unit_id"][0]}
    s = _starts(g2)
    ids = sl["task_id"].to_numpy()
    ends = sorted(int(x) for x in s.end_ns[ids])
    assert ends == [260_000, 400_000, 540_000, 680_000, 820_000, 960_000]
    prio = dict(zip(sl["task_id"].to_list(), sl["priority"].to_list(), strict=True))
    first_two_after = sorted(ids, key=lambda i: s.start_ns[i])[1:3]
    assert [prio[i] for i in first_two_after] == [0, 0]
    opt = t.filter(pl.col("name") == "multi_tensor_apply_kernel")["task_id"][0]
    assert s.start_ns[opt] == 960_000


def test_p3_gates_the_next_forward_on_a_real_trace(graphs):
    """ResNet-50 V100 (6 iterations): the slices of iterations 0-4 gate a forward kernel of the
    next iteration instead of the optimizer; the last iteration's keep the optimizer wait."""
    g2 = rewrite(graphs["v100"], "ddp(world=8,bandwidth=10Gbps,param_bytes=102000000)+"
                 "p3(slice_kb=4000)")
    t = pl.from_arrow(g2["task"]).with_row_index("i")
    e = pl.from_arrow(g2["edge"]).filter(pl.col("kind") == "wait")
    sl = t.filter(pl.col("kind") == "comm")
    j = e.join(sl.select(pl.col("i").cast(pl.Int64).alias("src"), pl.col("iteration")
                         .alias("it_s")), on="src").join(
        t.select(pl.col("i").cast(pl.Int64).alias("dst"), pl.col("iteration").alias("it_d"),
                 "phase"), on="dst")
    assert j.filter(pl.col("it_s") < 5).select((pl.col("it_d") == pl.col("it_s") + 1).all(),
                                               (pl.col("phase") == "forward").all()).row(0) \
        == (True, True)
    assert (j.filter(pl.col("it_s") == 5)["phase"] == "weight_update").all()
    assert set(j["src"]) == set(sl["i"].cast(pl.Int64))  # every slice gates something


def test_dgc_shrinks_traffic_and_inserts_selection_kernels():
    """ratio 0.01, 8 ranks: latency 70 us x 7/14 (all-gather steps) = 35 us; transfer
    x (2 x 0.01 x 8 x 7/8) / (14/8) = x 0.08: 280 -> 22.4 us, 140 -> 11.2 us. Selection:
    4 MB x 0.25 / (900 GB/s x 0.7) = 1.6 us, raised to the 5 us minimum."""
    g2 = rewrite(toy(comm=False, layer_bytes=SIZES), DDP8 + "+dgc(ratio=0.01)")
    t = pl.from_arrow(g2["task"])
    assert t.filter(pl.col("kind") == "comm")["dur_ns"].to_list() == [57_400, 46_200]
    sel = t.filter(pl.col("name").str.starts_with("dgc:"))
    assert sel["dur_ns"].to_list() == [5_000, 5_000]
    assert set(sel["unit_id"]) == {2}  # on the compute stream, after the kernels A and B
    s = _starts(g2)
    a = t.filter(pl.col("name") == "bwd A")["task_id"][0]
    assert s.start_ns[sel["task_id"][0]] == s.end_ns[a]


def test_blueconnect_decomposes_over_nodes():
    """16 ranks (2 nodes of 8), intra 100 GB/s, inter the buckets' 25 GB/s, 5 us per step:
    reduce-scatter 35 + 0.875 S/100, all-reduce of S/8 over 2 nodes 10 + S/8/25, all-gather
    35 + 0.875 S/100: 170 us for 4 MB, 125 us for 2 MB (the ring over 16 took 450 and 300)."""
    g1 = rewrite(toy(comm=False, layer_bytes=SIZES), "ddp(world=16,bandwidth=25GB/s)")
    assert pl.from_arrow(g1["task"]).filter(pl.col("kind") == "comm")["dur_ns"].to_list() == [
        450_000, 300_000]
    g2 = rewrite(toy(comm=False, layer_bytes=SIZES), "ddp(world=16,bandwidth=25GB/s)+"
                 "blueconnect(gpus_per_node=8,intra=100GB/s)")
    assert pl.from_arrow(g2["task"]).filter(pl.col("kind") == "comm")["dur_ns"].to_list() == [
        170_000, 125_000]


def test_blueconnect_on_one_node_does_not_apply():
    """8 ranks in nodes of 8: no inter-node all-reduce to split; the collectives keep ddp's
    times (a 100 GB/s intra link would have shortened them) and a note says so."""
    notes = []
    g1 = rewrite(toy(comm=False, layer_bytes=SIZES), "ddp(world=8,bandwidth=25GB/s)")
    g2 = rewrite(toy(comm=False, layer_bytes=SIZES), "ddp(world=8,bandwidth=25GB/s)+"
                 "blueconnect(intra=100GB/s)", Context(notes=notes))
    comm = [pl.from_arrow(g["task"]).filter(pl.col("kind") == "comm")["dur_ns"].to_list()
            for g in (g1, g2)]
    assert comm[0] == comm[1] and len(comm[0]) == 2
    assert any(n.startswith("blueconnect: does not apply: the 8 ranks fit one node of 8")
               for n in notes)


def test_ddp_param_bytes_from_the_command_line_override():
    """--param-bytes reaches ddp through the context; the note names it as the source."""
    notes = []
    g2 = rewrite(toy(comm=False), "ddp(world=8,bandwidth=100Gbps)",
                 Context(param_bytes=30_000_000, notes=notes))
    ins = pl.from_arrow(g2["task"]).filter(pl.col("name").str.starts_with("ddp:"))
    assert ins["dur_ns"].to_list() == [2_170_000, 2_170_000]
    assert any("--param-bytes 30000000" in n for n in notes)


def test_p3_bounds_slices_by_the_latency_they_add():
    """By default a slice may add at most 5% of the transfer in latency: bucket 0's 280 us
    transfer allows 1 + floor(0.05 x 280 / 70) = 1 slice; so P3 reschedules without slicing,
    and the channel's time equals the buckets' (350 + 210 us)."""
    notes = []
    g2 = rewrite(toy(comm=False, layer_bytes=SIZES), DDP8 + "+p3", Context(notes=notes))
    sl = pl.from_arrow(g2["task"]).filter(pl.col("kind") == "comm")
    assert sl["dur_ns"].sort().to_list() == [210_000, 350_000]
    assert any("2 all-reduces (6.0 MB) cut into 2 slices of at most 200 KB" in n for n in notes)
    from daydream.transforms.opts.p3 import slice_counts
    # 10 MB at 200 KB: 50 slices wanted; latency 10 us, transfer 20 ms: 1 + 0.05 x 2000 = 101
    assert slice_counts([10e6], [10e3], [20e6], 200, 64, 0.05).tolist() == [50]
    assert slice_counts([10e6], [10e3], [20e6], 200, 16, 0.05).tolist() == [16]
    assert slice_counts([10e6], [10e3], [200e3], 200, 64, 0.05).tolist() == [2]


def test_p3_without_message_sizes():
    """A trace whose all-reduces carry no sizes keeps them whole (rescheduled, a note says
    so); asking it for slices is an error naming what is missing."""
    from daydream.base.errors import DaydreamError
    t = toy()
    t["task"] = t["task"].set_column(t["task"].schema.get_field_index("bytes"), "bytes",
                                     pa.array([None] * t["task"].num_rows, pa.int64()))
    notes = []
    g2 = rewrite(t, "p3", Context(world_size=8, notes=notes))
    assert pl.from_arrow(g2["task"]).filter(pl.col("kind") == "comm").height == 1
    assert any("no message sizes in the trace: collectives kept whole" in n for n in notes)
    with pytest.raises(DaydreamError, match=r"slice_kb=100 asked, but 1 of 1 all-reduces carry "
                       "no message size"):
        rewrite(t, "p3(slice_kb=100)", Context(world_size=8))


def test_ddp_then_p3_takes_ddps_link_not_a_fit_to_its_buckets():
    """The collectives ddp inserted carry its model's times: p3 after it uses ddp's link and
    says so, instead of 'fitting' a bandwidth to them."""
    notes = []
    rewrite(toy(comm=False, layer_bytes=SIZES), DDP8 + "+p3", Context(notes=notes))
    assert not any("fitted bandwidth" in n for n in notes)
    assert any(n.startswith("comm: the link set earlier in the chain, 25GB/s as given") and
               "(25.00 GB/s" in n for n in notes)


# ---- qsgd and local_sgd -------------------------------------------------------------------------

def test_qsgd_on_the_toy_by_hand():
    """Hand-made toy (exact figures), ddp over 8 ranks at 25 GB/s, buckets of 4 and 2 MB:
    70 us of latency steps and 280 / 140 us of transfer each. qsgd(bits=4): all-gather steps
    70 x 7/14 = 35 us; transfer x (4/32 x 8 x 7/8) / (14/8) = x 0.5: 140 and 70 us. Encode
    (2 + 4/32) x bytes and decode (8 x 4/32 + 1) x bytes at 900 GB/s x 0.7 (the reference
    V100's memory, no device given): 8.5 MB / 630 = 13,492 ns, 4.25 MB -> 6,746 ns; 8 MB ->
    12,698 ns, 4 MB -> 6,349 ns."""
    notes = []
    g2 = rewrite(toy(comm=False, layer_bytes=SIZES), DDP8 + "+qsgd(bits=4)", Context(notes=notes))
    t = pl.from_arrow(g2["task"])
    assert t.filter(pl.col("kind") == "comm")["dur_ns"].to_list() == [175_000, 105_000]
    enc = t.filter(pl.col("name").str.starts_with("qsgd: quantize"))
    dec = t.filter(pl.col("name").str.starts_with("qsgd: dequantize"))
    assert enc["dur_ns"].to_list() == [13_492, 6_746] and set(enc["unit_id"]) == {2}
    assert dec["dur_ns"].to_list() == [12_698, 6_349]
    comm_ids = t.filter(pl.col("kind") == "comm")["task_id"].to_list()
    s = _starts(g2)
    # each collective starts after its encode, each decode after its collective, and the
    # optimizer after the last decode
    e = pl.from_arrow(g2["edge"])
    for q, c in zip(enc["task_id"].to_list(), comm_ids, strict=True):
        assert s.start_ns[c] >= s.end_ns[q]
    for d, c in zip(dec["task_id"].to_list(), comm_ids, strict=True):
        assert s.start_ns[d] >= s.end_ns[c]
    opt = t.filter(pl.col("name") == "multi_tensor_apply_kernel")["task_id"][0]
    assert s.start_ns[opt] >= max(s.end_ns[d] for d in dec["task_id"].to_list())
    assert e.filter(pl.col("dst") == opt, pl.col("src").is_in(dec["task_id"].to_list())).height
    assert any(n.startswith("qsgd: 2 all-reduces quantized to 4 bits") for n in notes)
    # 8 bits on 8 ranks: the all-gather of quarter-size messages moves what the ring did
    t8 = pl.from_arrow(rewrite(toy(comm=False, layer_bytes=SIZES), DDP8 + "+qsgd(bits=8)")[
        "task"])
    assert t8.filter(pl.col("kind") == "comm")["dur_ns"].to_list() == [315_000, 175_000]


def test_qsgd_and_local_sgd_that_do_not_apply():
    for spec in ("qsgd(bits=32)", "local_sgd(every=1)"):
        notes = []
        g = toy(comm=False, layer_bytes=SIZES)
        g1 = rewrite(g, DDP8, Context())
        g2 = rewrite(g, DDP8 + "+" + spec, Context(notes=notes))
        assert g2["task"]["dur_ns"].equals(g1["task"]["dur_ns"])
        assert any("does not apply" in n for n in notes)
    with pytest.raises(DaydreamError, match="bits must be >= 1"):
        rewrite(toy(comm=False, layer_bytes=SIZES), DDP8 + "+qsgd(bits=0)")


def test_qsgd_and_local_sgd_on_the_resnet50_ddp_trace(graphs):
    """HTA ResNet-50 DDP, A100 rank 0 of 2 (a real trace, 7 gradient all-reduces per step with
    their sizes). local_sgd(every=4): each all-reduce at a quarter of its time (rounded).
    qsgd(bits=8) on 2 ranks: latency steps 2 -> 1 and the transfer x (8/32 x 2 x 1/2) / 1 =
    x 1/4, the rest (waiting for rank 1) kept: every all-reduce between a quarter of its time
    and its time, one encode and one decode kernel per all-reduce."""
    g = graphs["a100"]
    t0 = pl.from_arrow(g["task"])
    ar = (pl.col("kind") == "comm") & pl.col("name").str.contains("AllReduce")
    before = t0.filter(ar)["dur_ns"].to_list()
    assert len(before) >= 7
    t1 = pl.from_arrow(rewrite(g, "local_sgd(every=4)", Context(world_size=2))["task"])
    assert t1.filter(ar)["dur_ns"].to_list() == [round(d / 4) for d in before]
    other = (pl.col("kind") != "comm")
    assert t1.filter(other)["dur_ns"].equals(t0.filter(other)["dur_ns"])
    notes = []
    t2 = pl.from_arrow(rewrite(g, "qsgd(bits=8)", Context(world_size=2, notes=notes))["task"])
    after = t2.filter(ar)["dur_ns"].to_list()
    assert all(d / 4 - 1 <= a <= d for a, d in zip(after, before, strict=True))
    assert sum(after) < sum(before)
    assert t2.filter(pl.col("name").str.starts_with("qsgd: quantize")).height <= len(before)
    assert t2.filter(pl.col("name").str.starts_with("qsgd: dequantize")).height == len(before)
