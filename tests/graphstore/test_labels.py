"""Iterations, layers and phases (graphstore.labels).

Real traces from tests/data, checked against facts read independently of our code (stdlib json,
the model's architecture), and hand-made range tables, one per rule, with their expected labels
written out by hand.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daydream.graphstore.labels import (
    _RULE_MEMO,
    FSDP_MARKER,
    FSDP_PREFIX,
    NAME_PHASE_RULES,
    STEP_PREFIX,
    STEP_RE,
    _innermost,
    _may_name_phase,
    _module_type,
    _Names,
    find_iterations,
    find_layers,
    label_ranges,
    mapped_share,
)
from daydream.graphstore.schema import PHASES
from daydream.ingest.convert import read_trace
from daydream.ingest.schema import conform

DATA = Path(__file__).resolve().parents[1] / "data"
KINETO = DATA / "kineto"
DDP = KINETO / "resnet50_ddp_a100_rank0.json.gz"
TB2021 = KINETO / "resnet50_v100_nw0_run1.json.gz"
MI300X = KINETO / "resnet_actckpt_mi300x_rank0_of8.json.gz"
FSDP = DATA / "nsys" / "fsdp_t5_2xh100_1s.sqlite"
ALL = sorted([*KINETO.glob("*.json*"), *(KINETO / "dlrm_8ranks").glob("*.json*"),
              *(DATA / "nsys").glob("*.sqlite")])


@functools.cache
def _tables(path: Path) -> dict[str, pa.Table]:
    return read_trace(path).tables


@functools.cache
def _labelled(path: Path) -> pl.DataFrame:
    """Ranges with their labels and self time (duration minus the children's)."""
    tables = _tables(path)
    r = pl.from_arrow(tables["range"]).with_columns(pl.col("kind").cast(pl.String),
                                                    pl.col("name").cast(pl.String))
    r = r.join(pl.from_arrow(label_ranges(tables)), on="range_id")
    kids = r.group_by("parent").agg(pl.col("dur_ns").sum().alias("kids"))
    return r.join(kids, left_on="range_id", right_on="parent", how="left").with_columns(
        (pl.col("dur_ns") - pl.col("kids").fill_null(0)).clip(0).alias("self_ns"))


def _cpu_phase_share(path: Path) -> dict[str, float]:
    r = _labelled(path).filter(pl.col("kind") != "gpu_user_annotation")
    total = r["self_ns"].sum()
    return {p: ns / total for p, ns in r.group_by("phase").agg(pl.col("self_ns").sum()).rows()}


# ------------------------------------------------------------------------------------------
# real traces


def _profiler_steps_in_json(path: Path) -> set[str]:
    """ProfilerStep#N names of CPU events, read with the standard library only."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f).get("traceEvents", [])
    return {e["name"] for e in events
            if e.get("ph") == "X" and e.get("cat") != "gpu_user_annotation"
            and re.fullmatch(r"ProfilerStep#\d+", str(e.get("name", "")))}


@pytest.mark.parametrize("path", [p for p in ALL if ".json" in p.name], ids=lambda p: p.name)
def test_profiler_step_iterations_match_json(path):
    its = find_iterations(_tables(path))
    steps = _profiler_steps_in_json(path)
    if steps:
        assert its.num_rows == len(steps)
        assert set(its["label"].to_pylist()) == steps
        assert set(its["source"].to_pylist()) == {"ProfilerStep"}
    else:
        assert "ProfilerStep" not in its["source"].to_pylist()


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_every_range_gets_one_label(path):
    tables = _tables(path)
    its = find_iterations(tables)
    start, end = its["start_ns"].to_numpy(), its["end_ns"].to_numpy()
    assert its["iteration"].to_pylist() == list(range(its.num_rows))
    assert (start[1:] == end[:-1]).all() and (end >= start).all()  # contiguous, in order
    lab = label_ranges(tables)
    assert lab["range_id"].to_pylist() == tables["range"]["range_id"].to_pylist()
    assert set(lab["phase"].to_pylist()) <= set(PHASES)
    layers = find_layers(tables, lab)
    assert set(layers["layer"].to_pylist()) == set(lab["layer"].drop_null().to_pylist())


@pytest.mark.parametrize("path, after", [(TB2021, True), (DDP, False)],
                         ids=["2021", "ddp"])
def test_last_iteration_holds_the_gpu_work_it_launched(path, after):
    tables = _tables(path)
    its = find_iterations(tables)
    steps = pl.from_arrow(tables["range"]).filter(
        pl.col("name").cast(pl.String).str.starts_with("ProfilerStep#")
        & (pl.col("kind").cast(pl.String) != "gpu_user_annotation")).sort("start_ns")
    cpu_end = steps["start_ns"][-1] + steps["dur_ns"][-1]
    gpu_ends = set(np.concatenate([tables[t]["start_ns"].to_numpy() + tables[t]["dur_ns"]
                                   .to_numpy() for t in ("kernel", "memcpy", "memset")]))
    end = its["end_ns"][-1].as_py()
    if after:  # the 2021 trace's last step returns before its GPU work is done
        assert end > cpu_end and end in gpu_ends
    else:  # the DDP trace's last step waits for its GPU work
        assert end == cpu_end


def test_ddp_resnet50_phases_and_layers():
    r = _labelled(DDP)
    share = _cpu_phase_share(DDP)
    assert 0.15 < share["forward"] < 0.6
    assert 0.3 < share["backward"] < 0.8
    assert 0.01 < share["weight_update"] < 0.2
    assert share.get("other", 0) < 0.05
    named = dict(r.filter(pl.col("kind") == "user_annotation").select("name", "phase").rows())
    assert named["## forward ##"] == "forward"
    assert named["## backward ##"] == "backward"
    assert named["## optimizer ##"] == named["Optimizer.step#SGD.step"] == "weight_update"
    # the autograd thread: backward ops and everything else on it
    bwd = r.filter(pl.col("fwd_thread_id") > 0)
    assert bwd.height > 1000 and bwd["tid"].n_unique() == 1
    bg = r.filter(pl.col("tid") == bwd["tid"][0])
    assert set(bg["phase"]) == {"backward"}
    assert bwd["layer"].null_count() == 0
    # forward op and backward op of each fwdbwd flow share a layer
    flow = pl.from_arrow(_tables(DDP)["flow"]).filter(
        pl.col("kind").cast(pl.String) == "fwdbwd")
    at = r.select("pid", "tid", "start_ns", "layer", "phase")
    pairs = (flow.join(at, left_on=["src_pid", "src_tid", "src_ts_ns"],
                       right_on=["pid", "tid", "start_ns"])
             .join(at, left_on=["dst_pid", "dst_tid", "dst_ts_ns"],
                   right_on=["pid", "tid", "start_ns"], suffix="_bwd"))
    assert pairs.height == flow.height == 543
    assert (pairs["layer"] == pairs["layer_bwd"]).all()
    assert set(pairs["phase_bwd"]) == {"backward"}
    # the script computes its loss inside its ``## backward ##`` annotation
    in_bwd = pairs.filter(pl.col("phase") == "backward")
    assert in_bwd["layer"].str.starts_with("cross_entropy_loss#").all()
    assert set(pairs["phase"]) == {"forward", "backward"} and in_bwd.height == 15
    # no modules in this trace: one layer per differentiable top-level op; ResNet-50 has 53
    # convolutions (1 stem + 16 blocks x 3 + 4 downsample) and one fully connected layer
    layers = pl.from_arrow(find_layers(_tables(DDP), label_ranges(_tables(DDP))))
    kinds = dict(layers.group_by("module_type").len().rows())
    assert kinds["aten::conv2d"] == 53 and kinds["aten::linear"] == 1
    assert set(layers["source"]) == {"cpu_op"}


def test_2021_trace_data_loading_and_sequence_numbers():
    tables = _tables(TB2021)
    r = _labelled(TB2021)
    flows = pl.from_arrow(tables["flow"])["kind"].cast(pl.String)
    assert "fwdbwd" not in set(flows)  # backward can only be linked by sequence number
    loader = r.filter(pl.col("name").str.starts_with("enumerate(DataLoader)"))
    assert loader.height == 6 and set(loader["phase"]) == {"data_loading"}
    inside = r.filter(pl.col("parent").is_in(loader["range_id"].implode()))
    assert inside.height and set(inside["phase"]) == {"data_loading"}
    bwd = r.filter(pl.col("fwd_thread_id") > 0)
    assert bwd.height == 1068 and set(bwd["phase"]) == {"backward"}
    assert bwd["layer"].null_count() == 0
    conv_bwd = bwd.filter(pl.col("name") == "CudnnConvolutionBackward")
    assert conv_bwd["layer"].str.starts_with("conv2d#").all()
    assert conv_bwd["layer"].n_unique() == 53
    # no annotations: forward is the span of the ops autograd ran a backward for
    conv = r.filter(pl.col("name") == "aten::conv2d")
    assert set(conv["phase"]) == {"forward"}
    assert set(r.filter(pl.col("name").str.starts_with("Optimizer."))["phase"]) == {
        "weight_update"}
    share = _cpu_phase_share(TB2021)
    assert all(share[p] > 0.05 for p in ("forward", "backward", "weight_update",
                                          "data_loading"))


def test_mi300x_module_paths_and_recomputation():
    r = _labelled(MI300X)
    mods = r.filter(pl.col("name").str.starts_with("nn.Module: "))
    conv15 = mods.filter(pl.col("name") == "nn.Module: Conv2d_15")
    # forward on the main thread, recomputed (activation checkpointing) on the autograd thread
    assert conv15["tid"].n_unique() == 2
    assert conv15["layer"].n_unique() == 1
    assert conv15["layer"][0].endswith(".BasicBlock_6.Conv2d_15")
    assert conv15["layer"][0].startswith("DistributedDataParallel_0.ResNet_0.")
    assert set(conv15["phase"]) == {"forward", "backward"}
    layers = pl.from_arrow(find_layers(_tables(MI300X), label_ranges(_tables(MI300X))))
    assert set(layers["source"]) == {"python_function"}
    assert layers.filter(pl.col("module_type") == "Conv2d").height == 20  # ResNet-18
    assert set(r.filter(pl.col("fwd_thread_id") > 0)["phase"]) == {"backward"}


def test_fsdp_nvtx_units():
    r = _labelled(FSDP)
    markers = r.filter(pl.col("name").str.starts_with("FSDP::pre_forward (encoder.block.3."))
    assert markers.height and set(markers["phase"]) == {"forward"}
    # the ops between a unit's pre and post markers belong to the unit
    unit = r.filter(pl.col("layer") == "encoder.block.3.layer.0")
    assert unit.filter(pl.col("name").str.starts_with("aten::linear")).height > 0
    assert set(unit["phase"]) == {"forward"}
    layers = pl.from_arrow(find_layers(_tables(FSDP), label_ranges(_tables(FSDP))))
    assert set(layers["source"]) == {"nvtx"}
    assert {"shared", "encoder.final_layer_norm"} <= set(layers["layer"])


# ------------------------------------------------------------------------------------------
# hand-made range tables: each row is (range_id, name, start, end, parent, extra columns)

MAIN, BG = 10, 20


def _make(rows, *, flows=(), api=(), kernels=()) -> dict[str, pa.Table]:
    """Activity tables from hand-made rows; depth follows the given parents."""
    parent = {rid: par for rid, _, _, _, par, _ in rows}

    def depth(rid):
        return 0 if parent[rid] is None else 1 + depth(parent[rid])

    cols = {c: [] for c in ("range_id", "pid", "tid", "kind", "name", "start_ns", "dur_ns",
                            "depth", "parent", "external_id", "sequence_number",
                            "fwd_thread_id")}
    for rid, name, start, end, par, extra in rows:
        row = {"range_id": rid, "pid": 1, "tid": MAIN, "kind": "cpu_op", "name": name,
               "start_ns": start, "dur_ns": end - start, "depth": depth(rid), "parent": par,
               "external_id": None, "sequence_number": None, "fwd_thread_id": None, **extra}
        for c in cols:
            cols[c].append(row[c])
    tables = {"range": conform("range", cols)}
    if flows:
        f = {"kind": [], "flow_id": [], "src_pid": [], "src_tid": [], "src_ts_ns": [],
             "dst_pid": [], "dst_tid": [], "dst_ts_ns": []}
        for i, (src, dst) in enumerate(flows):
            for k, v in zip(f, ("fwdbwd", i, 1, MAIN, src, 1, BG, dst), strict=True):
                f[k].append(v)
        tables["flow"] = conform("flow", f)
    if api:
        tables["api"] = conform("api", {
            "pid": [1] * len(api), "tid": [MAIN] * len(api), "name": ["cudaLaunchKernel"] *
            len(api), "kind": ["runtime"] * len(api), "correlation": [c for c, _ in api],
            "start_ns": [s for _, s in api], "dur_ns": [1] * len(api)})
    if kernels:
        tables["kernel"] = conform("kernel", {
            "device": [0] * len(kernels), "stream": [7] * len(kernels),
            "correlation": [c for c, _, _ in kernels], "name": ["k"] * len(kernels),
            "start_ns": [s for _, s, _ in kernels], "dur_ns": [e - s for _, s, e in kernels]})
    return tables


def _labels(tables) -> list[tuple]:
    lab = label_ranges(tables)
    return list(zip(lab["range_id"].to_pylist(), lab["layer"].to_pylist(),
                    lab["phase"].to_pylist(), strict=True))


def _iters(tables) -> list[tuple]:
    its = find_iterations(tables)
    return list(zip(*(its[c].to_pylist() for c in its.column_names), strict=True))


UA = {"kind": "user_annotation"}


def test_profiler_step_iterations_hand_made():
    tables = _make([
        (0, "ProfilerStep#7", 100, 200, None, UA),
        (1, "ProfilerStep#8", 200, 300, None, UA),
        (2, "aten::mm", 250, 260, 1, {}),
    ], api=[(5, 255), (6, 310)], kernels=[(5, 400, 450), (6, 800, 900)])
    # kernel 5 was launched inside step 8 and runs after it: the last iteration waits for it;
    # kernel 6 was launched after the step: not this iteration's work
    assert _iters(tables) == [(0, "ProfilerStep#7", "ProfilerStep", 100, 200),
                              (1, "ProfilerStep#8", "ProfilerStep", 200, 450)]


def test_optimizer_step_iterations_hand_made():
    opt = "Optimizer.step#SGD.step"
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    tables = _make([
        (0, "aten::randperm", 0, 10, None, {}),        # the loader's set-up: not iteration 0
        (1, loader, 20, 30, None, UA),                 # iteration 0 starts here
        (2, "aten::linear", 30, 40, None, {}),
        (3, opt, 50, 60, None, UA),
        (4, "aten::add_", 61, 62, None, {}),
        (5, loader, 63, 70, None, UA),
        (6, opt, 80, 90, None, UA),
        (7, opt, 81, 89, 6, UA),                       # nested: the same step
        (8, "Optimizer.step#EMA.step", 91, 92, None, UA),  # second optimizer, fewer steps
        (9, "aten::add_", 95, 96, None, {}),           # after the last step: no iteration
    ])
    assert _iters(tables) == [(0, opt, "Optimizer.step", 20, 60),
                              (1, opt, "Optimizer.step", 60, 90)]
    # no loader: iteration 0 starts at the main thread's first range or call
    tables = _make([(0, "aten::linear", 5, 10, None, {}), (1, opt, 20, 30, None, UA)],
                   api=[(1, 3)])
    assert _iters(tables) == [(0, opt, "Optimizer.step", 3, 30)]


def test_whole_trace_iteration_hand_made():
    tables = _make([(0, "aten::mm", 10, 20, None, {})], kernels=[(1, 15, 40)])
    assert _iters(tables) == [(0, None, "whole_trace", 10, 40)]


def test_annotation_phases_and_gpu_twins_hand_made():
    bw = {"tid": BG, "fwd_thread_id": 1, "sequence_number": 3}
    tables = _make([
        (0, "ProfilerStep#1", 0, 100, None, UA),
        (1, "Optimizer.zero_grad#SGD.zero_grad", 1, 5, 0, UA),
        (2, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 5, 10, 0, UA),
        (3, "aten::stack", 6, 8, 2, {}),
        (4, "## forward ##", 10, 40, 0, {**UA, "external_id": 76}),
        (5, "aten::linear", 11, 20, 4, {}),
        (6, "## backward ##", 40, 70, 0, {**UA, "external_id": 77}),
        (7, "## optimizer ##", 70, 90, 0, UA),
        (8, "Optimizer.step#SGD.step", 71, 89, 7, UA),
        (9, "aten::add_", 72, 73, 8, {}),
        (10, "aten::zeros", 91, 92, 0, {}),
        # autograd thread: a backward op and the DDP all-reduce its hook starts
        (11, "autograd::engine::evaluate_function: MmBackward0", 48, 58, None, bw),
        (12, "nccl:all_reduce", 50, 55, 11, {**UA, "tid": BG, "external_id": 78}),
        # GPU-side twins of CPU annotations (pid = device, tid = stream)
        (13, "## backward ##", 45, 60, None,
         {"kind": "gpu_user_annotation", "pid": 0, "tid": 7, "external_id": 77}),
        (14, "nccl:all_reduce", 52, 58, None,
         {"kind": "gpu_user_annotation", "pid": 0, "tid": 40, "external_id": 78}),
        (15, "nccl:broadcast", 60, 61, None, {"kind": "gpu_user_annotation", "pid": 0,
                                               "tid": 40, "external_id": 99}),  # no twin
    ])
    assert _labels(tables) == [
        (0, None, "other"), (1, None, "weight_update"), (2, None, "data_loading"),
        (3, None, "data_loading"), (4, None, "forward"), (5, None, "forward"),
        (6, None, "backward"), (7, None, "weight_update"), (8, None, "weight_update"),
        (9, None, "weight_update"), (10, None, "other"), (11, None, "backward"),
        (12, None, "backward"), (13, None, "backward"), (14, None, "backward"),
        (15, None, "other")]


def test_a_gpu_annotation_takes_its_first_twin_in_row_order():
    """Two CPU annotations of one external id and name (a profiler that reused the id): the
    GPU-side one takes the labels of the first (in row order), whichever the other has, and
    one of another name is no twin."""
    tables = _make([
        (0, "ProfilerStep#1", 0, 100, None, UA),
        (1, "## optimizer ##", 10, 40, 0, UA),
        (2, "nccl:all_reduce", 12, 20, 1, {**UA, "external_id": 5}),
        (3, "## forward ##", 40, 80, 0, UA),
        (4, "nccl:all_reduce", 50, 60, 3, {**UA, "external_id": 5}),
        (5, "nccl:broadcast", 61, 62, 3, {**UA, "external_id": 6}),
        (6, "nccl:all_reduce", 14, 30, None,
         {"kind": "gpu_user_annotation", "pid": 0, "tid": 7, "external_id": 5}),
        (7, "nccl:all_reduce", 62, 70, None,
         {"kind": "gpu_user_annotation", "pid": 0, "tid": 7, "external_id": 6}),
    ])
    got = {rid: phase for rid, _, phase in _labels(tables)}
    assert (got[2], got[4]) == ("weight_update", "forward")
    assert got[6] == "weight_update"  # its first twin's, not the second's
    assert got[7] == "other"  # the range of its external id has another name


def _autograd_rows():
    def fw(seq):
        return {"sequence_number": seq, "fwd_thread_id": 0}

    def bw(seq=None):
        return {"tid": BG, "sequence_number": seq, "fwd_thread_id": 1 if seq else None}

    ev = "autograd::engine::evaluate_function: "
    return [
        (0, "ProfilerStep#1", 0, 1000, None, UA),
        (1, "aten::to", 2, 8, 0, {}),                 # input copy, before the forward ops
        (2, "aten::conv2d", 10, 50, 0, fw(1)),
        (3, "aten::convolution", 12, 48, 2, fw(1)),
        (4, "aten::relu_", 50, 60, 0, fw(2)),
        (5, "aten::conv2d", 60, 100, 0, fw(3)),
        (6, "aten::convolution", 62, 98, 5, fw(3)),
        (7, "aten::view", 100, 105, 0, {}),
        (8, "aten::sum", 105, 110, 0, fw(4)),         # the loss
        (9, "aten::ones_like", 120, 125, 0, {}),      # after the loss: not forward
        (10, ev + "SumBackward0", 200, 210, None, bw(4)),
        (11, "SumBackward0", 201, 209, 10, bw(4)),
        (12, ev + "ConvolutionBackward0", 210, 260, None, bw(3)),
        (13, "ConvolutionBackward0", 211, 259, 12, bw(3)),
        (14, "aten::convolution_backward", 212, 258, 13, {"tid": BG}),
        (15, ev + "torch::autograd::AccumulateGrad", 260, 265, None, {"tid": BG}),
        (16, ev + "ReluBackward0", 270, 280, None, bw(2)),
        (17, "ReluBackward0", 271, 279, 16, bw(2)),
        (18, ev + "ConvolutionBackward0", 280, 330, None, bw(1)),
        (19, "ConvolutionBackward0", 281, 329, 18, bw(1)),
    ]


@pytest.mark.parametrize("with_flows", [True, False], ids=["fwdbwd flows", "sequence numbers"])
def test_backward_links_and_op_layers_hand_made(with_flows):
    # flows link each convolution to its ConvolutionBackward0; without them, sequence numbers
    # link the same pairs (the latest forward op with the number: aten::convolution)
    flows = [(62, 211), (12, 281)] if with_flows else ()
    tables = _make(_autograd_rows(), flows=flows)
    assert _labels(tables) == [
        (0, None, "other"), (1, None, "other"),
        (2, "conv2d#0", "forward"), (3, "conv2d#0", "forward"), (4, "relu_#0", "forward"),
        (5, "conv2d#1", "forward"), (6, "conv2d#1", "forward"), (7, None, "forward"),
        (8, "sum#0", "forward"), (9, None, "other"),
        (10, "sum#0", "backward"), (11, "sum#0", "backward"),
        (12, "conv2d#1", "backward"), (13, "conv2d#1", "backward"),
        (14, "conv2d#1", "backward"),
        (15, "conv2d#1", "backward"),  # AccumulateGrad: the node before it on the thread
        (16, "relu_#0", "backward"), (17, "relu_#0", "backward"),
        (18, "conv2d#0", "backward"), (19, "conv2d#0", "backward")]
    layers = find_layers(tables, label_ranges(tables))
    assert list(zip(*(layers[c].to_pylist() for c in layers.column_names), strict=True)) == [
        ("conv2d#0", "cpu_op", "aten::conv2d", 10, None),
        ("relu_#0", "cpu_op", "aten::relu_", 50, None),
        ("conv2d#1", "cpu_op", "aten::conv2d", 60, None),
        ("sum#0", "cpu_op", "aten::sum", 105, None)]


@pytest.mark.parametrize("flows", [[(62, 281), (12, 281)], [(12, 281), (62, 281)]],
                         ids=["later first", "earlier first"])
def test_backward_op_with_two_fwdbwd_flows_takes_the_earliest_forward_op(flows):
    # hand-made: both convolutions flow into the second ConvolutionBackward0; whatever the
    # order of the flow records, it is linked to the earlier forward op (conv2d#0)
    lab = dict((rid, (layer, phase)) for rid, layer, phase in _labels(
        _make(_autograd_rows(), flows=flows)))
    assert lab[18] == lab[19] == ("conv2d#0", "backward")


def test_module_layers_hand_made():
    py = {"kind": "python_function"}
    tables = _make([
        (0, "ProfilerStep#1", 0, 1000, None, UA),
        (1, "nn.Module: Net_0", 10, 100, 0, py),
        (2, "nn.Module: Linear_0", 20, 50, 1, py),
        (3, "aten::linear", 25, 45, 2, {"sequence_number": 1, "fwd_thread_id": 0}),
        (4, "nn.Module: ReLU_0", 50, 60, 1, py),
        (5, "aten::relu", 52, 58, 4, {"sequence_number": 2, "fwd_thread_id": 0}),
        (6, "aten::mse_loss", 110, 120, 0, {"sequence_number": 3, "fwd_thread_id": 0}),
        (7, "torch/_tensor.py(570): backward", 130, 400, 0, py),
        (8, "autograd::engine::evaluate_function: ReluBackward0", 200, 210, None,
         {"tid": BG, "sequence_number": 2, "fwd_thread_id": 1}),
        # recomputed on the autograd thread: same instance, same layer, shorter chain
        (9, "nn.Module: ReLU_0", 202, 208, 8, {**py, "tid": BG}),
        (10, "autograd::engine::evaluate_function: AddmmBackward0", 210, 230, None,
         {"tid": BG, "sequence_number": 1, "fwd_thread_id": 1}),
        (11, "nn.Module: Extra_0", 500, 510, 0, py),  # after the first backward op
    ])
    assert _labels(tables) == [
        (0, None, "other"), (1, "Net_0", "forward"), (2, "Net_0.Linear_0", "forward"),
        (3, "Net_0.Linear_0", "forward"), (4, "Net_0.ReLU_0", "forward"),
        (5, "Net_0.ReLU_0", "forward"), (6, None, "other"), (7, None, "backward"),
        (8, "Net_0.ReLU_0", "backward"), (9, "Net_0.ReLU_0", "backward"),
        (10, "Net_0.Linear_0", "backward"), (11, "Extra_0", "other")]
    layers = find_layers(tables, label_ranges(tables))
    assert list(zip(*(layers[c].to_pylist() for c in layers.column_names), strict=True)) == [
        ("Net_0", "python_function", "Net", 10, None),
        ("Net_0.Linear_0", "python_function", "Linear", 20, None),
        ("Net_0.ReLU_0", "python_function", "ReLU", 50, None),
        ("Extra_0", "python_function", "Extra", 500, None)]


def test_fsdp_markers_hand_made():
    nv = {"kind": "nvtx", "pid": 111, "tid": 111}
    tables = _make([
        (0, "aten::linear, op_id = 1", 0, 10, None, nv),   # the slice cut off its pre marker
        (1, "FSDP::post_forward (encoder.block.0), op_id = 2", 10, 12, None, nv),
        (2, "aten::add, op_id = 3", 13, 14, None, nv),     # between units
        (3, "FSDP::pre_forward (encoder.block.1), op_id = 4", 15, 18, None, nv),
        (4, "aten::to, op_id = 5", 16, 17, 3, nv),
        (5, "aten::mm, op_id = 6", 20, 30, None, nv),
        (6, "FSDP::post_forward (encoder.block.1), op_id = 7", 31, 33, None, nv),
        (7, "FSDP::root_pre_forward, op_id = 8", 35, 36, None, nv),
        (8, "FSDP::pre_forward (encoder), op_id = 9", 40, 41, None, nv),
        (9, "aten::mul, op_id = 10", 42, 43, None, nv),
        (10, "FSDP::pre_forward (encoder.block.2), op_id = 11", 44, 45, None, nv),
        (11, "aten::mm, op_id = 12", 46, 47, None, nv),
        (12, "FSDP::post_forward (encoder.block.2), op_id = 13", 48, 49, None, nv),
        (13, "aten::add, op_id = 14", 50, 51, None, nv),   # back in the enclosing unit
        (14, "FSDP::post_forward (encoder), op_id = 15", 52, 53, None, nv),
        (15, "FSDP::pre_backward (encoder.block.2), op_id = 16", 60, 61, None, nv),
        (16, "aten::mm, op_id = 17", 62, 63, None, nv),    # no post marker: to the end
    ])
    assert _labels(tables) == [
        (0, "encoder.block.0", "forward"), (1, "encoder.block.0", "forward"),
        (2, None, "other"), (3, "encoder.block.1", "forward"),
        (4, "encoder.block.1", "forward"), (5, "encoder.block.1", "forward"),
        (6, "encoder.block.1", "forward"), (7, None, "forward"),
        (8, "encoder", "forward"), (9, "encoder", "forward"),
        (10, "encoder.block.2", "forward"), (11, "encoder.block.2", "forward"),
        (12, "encoder.block.2", "forward"), (13, "encoder", "forward"),
        (14, "encoder", "forward"), (15, "encoder.block.2", "backward"),
        (16, "encoder.block.2", "backward")]
    layers = find_layers(tables, label_ranges(tables))
    assert layers["layer"].to_pylist() == ["encoder.block.0", "encoder.block.1", "encoder",
                                           "encoder.block.2"]
    assert set(layers["source"].to_pylist()) == {"nvtx"}


def test_mapped_share_hand_made():
    task = pa.table({
        "kind": ["kernel", "memcpy", "comm", "memset", "api", "host"],
        "dur_ns": [100, 50, 30, 20, 1000, 500],
        "layer": ["a", None, "b", None, "a", "a"],
        "phase": ["forward", "data_loading", "backward", "other", "forward", "forward"]})
    assert mapped_share(task) == {
        "gpu_ns": 200, "layer_share": 130 / 200, "phase_share": 180 / 200,
        "by_phase": {"forward": 100, "backward": 30, "weight_update": 0, "data_loading": 50,
                     "other": 20}}
    empty = task.slice(4)
    assert mapped_share(empty)["gpu_ns"] == 0 and mapped_share(empty)["layer_share"] == 0.0


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_innermost_interval_matches_brute_force(seed):
    """Random properly nested intervals on two threads against a brute-force search."""
    rng = np.random.default_rng(seed)
    ivs = []
    for tid in (1, 2):
        stack, t = [], 0
        for _ in range(rng.integers(1, 30)):
            t += int(rng.integers(0, 3))
            if stack and rng.random() < 0.45:
                s = stack.pop()
                ivs.append((tid, s, max(t, s + 1), len(ivs)))
                t = max(t, s + 1)
            else:
                stack.append(t)
        while stack:
            t += 1
            s = stack.pop()
            ivs.append((tid, s, max(t, s + 1), len(ivs)))
            t = max(t, s + 1)
    iv = pl.DataFrame(ivs, schema=["tid", "start_ns", "end_ns", "id"], orient="row").with_columns(
        pl.lit(1, pl.Int64).alias("pid"))
    pts = [(i, 1, int(tid), int(t)) for i, (tid, t) in enumerate(
        zip(rng.integers(1, 3, 50), rng.integers(-2, 80, 50), strict=True))]
    points = pl.DataFrame(pts, schema=["pos", "pid", "tid", "t"], orient="row")
    got = dict(_innermost(points, iv).select("pos", "id").rows())
    for pos, _, tid, t in pts:
        inside = [(s, -e) for ti, s, e, _ in ivs if ti == tid and s <= t < e]
        best = max(inside) if inside else None  # latest start, then shortest
        expect = {i for ti, s, e, i in ivs if ti == tid and (s, -e) == best}  # equal twins
        assert (got.get(pos) in expect) if expect else pos not in got


def test_collector_module_markers_name_layer_and_phase():
    # Hand-made: range rows as our CUPTI collector writes them (kind 'module'), plus an op
    # that is no marker; labels inferred elsewhere are overridden only for the markers.
    import pyarrow as pa

    from daydream.graphstore.load import module_labels
    from daydream.ingest.schema import conform

    rng = conform("range", {
        "range_id": [0, 1, 2, 3], "pid": [1] * 4, "tid": [1] * 4,
        "kind": ["module", "module", "module", "cpu_op"],
        "name": ["model.layer1.0.conv1 (Conv2d) [forward]", "model.fc (Linear) [backward]",
                 "model.layer2 (Sequential) [recompute]", "aten::add"],
        "start_ns": [0, 10, 20, 30], "dur_ns": [5, 5, 5, 5], "depth": [0] * 4})
    rl = pa.table({"range_id": pa.array([0, 1, 2, 3], pa.int64()),
                   "layer": pa.array([None, None, "x", "y"], pa.string()),
                   "phase": pa.array(["other"] * 4, pa.string())})
    out = module_labels({"range": rng}, rl)
    assert out.to_pydict() == {
        "range_id": [0, 1, 2, 3],
        "layer": ["model.layer1.0.conv1", "model.fc", "model.layer2", "y"],
        "phase": ["forward", "backward", "backward", "other"]}


@pytest.mark.parametrize("pattern", [p for p, _ in NAME_PHASE_RULES])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_name_phase_prefilter_keeps_every_match(pattern, data):
    """The names the phase rules' prefilter drops match none of the rules: any string a
    rule's pattern matches passes it."""
    name = data.draw(st.from_regex(pattern))
    assert re.search(pattern, name)
    assert _may_name_phase(name), name


@pytest.mark.parametrize("pattern,prefix", [(STEP_RE, STEP_PREFIX), (FSDP_MARKER, FSDP_PREFIX)])
def test_prefixed_regex_matches_as_the_plain_one(pattern, prefix):
    """A pattern run only on the names with its literal prefix finds what it finds on all of
    them (names that share the prefix but do not match, the prefix elsewhere, nulls)."""
    names = ["ProfilerStep#12", "ProfilerStep#12x", "ProfilerStep#", "xProfilerStep#3",
             "ProfilerStep#3\n", "FSDP::pre_forward (encoder.block.3)", "FSDP::post_backward()",
             "FSDP::all_gather", " FSDP::pre_forward (a)", "aten::mm", "", None,
             "ProfilerStep#٣"]
    _RULE_MEMO.clear()  # what another test's names gave the rule must not answer here
    got = _Names(pl.Series(names, dtype=pl.String)).contains(pattern, prefix=prefix)
    want = pl.Series(names, dtype=pl.String).str.contains(pattern).fill_null(False).to_numpy()
    assert got.tolist() == want.tolist()
    assert got.any() and not got.all()
    _RULE_MEMO.clear()
    assert _Names(pl.Series(names, dtype=pl.String)).any_contains(pattern, prefix=prefix)


def test_asof_rows_is_polars_backward_asof_by_group():
    """labels._asof_rows (numpy) matches the Polars as-of join it replaced, on random groups
    and times: the latest right row of the left row's group at or before its time; of right
    rows tied on time, the one with the greatest tie value."""
    from daydream.graphstore.labels import _asof, _asof_rows
    rng = np.random.default_rng(7)
    for _ in range(20):
        nl, nr = rng.integers(0, 40, 2)
        la, lb, lt = rng.integers(0, 3, nl), rng.integers(0, 3, nl), rng.integers(0, 50, nl)
        ra, rb, rt = rng.integers(0, 3, nr), rng.integers(0, 3, nr), rng.integers(0, 50, nr)
        tie = rng.permutation(nr)  # distinct: the expected row is unique
        got = _asof_rows((la, lb, lt), (ra, rb, rt), tie=tie)
        left = pl.DataFrame({"a": la, "b": lb, "t": lt, "i": np.arange(nl)}).sort("t")
        right = pl.DataFrame({"a": ra, "b": rb, "t": rt, "tie": tie,
                              "j": np.arange(nr)}).sort(["t", "tie"])
        j = _asof(left, right, on="t", by=["a", "b"]).sort("i")
        assert got.tolist() == j["j"].fill_null(-1).to_list()


@pytest.mark.parametrize("path, expected", [
    ("ResNet_0.Conv2d_3", "Conv2d"),
    ("BertForMaskedLM_0.BertModel_0.BertEncoder_0.ModuleList_0.BertLayer_11.Linear_2", "Linear"),
    ("Linear_12", "Linear"),           # no dot: the whole path is the last name
    ("Model_0.Block_1_2", "Block_1"),  # only the instance number at the very end goes
    ("Model_0.Block", "Block"),        # no instance number
    ("Model_0.", None),                # ends in a dot: no last name
    ("", None),
])
def test_module_type_is_the_last_name_without_its_instance_number(path, expected):
    assert _module_type(path) == expected
