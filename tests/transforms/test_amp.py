"""AMP from the kernels, the ops and the device (transforms/opts/amp.py).

Expected figures are worked out here by hand from the V100 datasheet peaks (15.7 TFLOPS FP32,
125 TFLOPS FP16 tensor, 900 GB/s; NVIDIA V100 datasheet, SXM2 column), the shapes the traces
record and the documented formulas."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from daydream.base.errors import DaydreamError
from daydream.simulate.replay import replay
from daydream.transforms import Context, rewrite
from daydream.transforms.constants import AMP_INTENSITY
from daydream.transforms.kernel_class import kernel_precision
from daydream.transforms.opts import amp
from daydream.transforms.primitives import Graph
from tests.transforms.conftest import A100, V100

V100_SXM2 = {"name": "Tesla V100-SXM2-32GB", "computeMajor": 7, "computeMinor": 0}
MI300X = {"name": "AMD Instinct MI300X", "computeMajor": 9, "computeMinor": 4}
P32, P16, BW = 15.7e12, 125e12, 900e9


def T(tables):
    return pl.from_arrow(tables["task"])


def test_roofline_ratio_by_hand():
    # compute-bound before and after: the peak ratio 125 / 15.7
    assert amp.roofline_ratio(1000.0, 1.0, P32, P16, BW) == pytest.approx(125 / 15.7)
    # bandwidth-bound before and after: half the bytes
    assert amp.roofline_ratio(7.5, 1.0, P32, P16, BW) == pytest.approx(2.0)
    # 42.17 FLOP/B: compute-bound in FP32 (42.17 / 15.7e12 s per byte), bandwidth-bound in
    # FP16 (0.5 / 900e9): 42.17 x 900e9 / (0.5 x 15.7e12) = 4.834
    assert amp.roofline_ratio(42.17, 1.0, P32, P16, BW) == pytest.approx(4.834, rel=1e-3)


def test_class_ratio_is_the_work_weighted_harmonic_mean():
    """On a V100 a bin's ratio is 2 up to 15.7e12/900e9 = 17.44 FLOP/B, 2 ai x 900e9 /
    15.7e12 up to 125e12/(2 x 900e9) = 69.4, and 125/15.7 beyond."""
    def r(ai):
        return 2.0 if ai <= 17.44 else (2 * ai * BW / P32 if ai <= 69.44 else P16 / P32)
    hist = AMP_INTENSITY["conv"]["value"]
    want = sum(s for _, s in hist) / sum(s / r(a) for a, s in hist)
    assert amp.class_ratio("conv", P32, P16, BW) == pytest.approx(want, rel=1e-3)
    assert 4 < want < 6


def test_speedup_keeps_the_fixed_cost():
    # 10 us at ratio 4 with a 2 us fixed cost: 2 + 8 / 4 = 4 us; a kernel shorter than the
    # fixed cost keeps its time
    got = amp.speedup(np.array([10_000, 1_000]), np.array([4.0, 4.0]), 2_000.0)
    assert got.tolist() == [4_000, 1_000]


def test_op_work_from_recorded_shapes():
    # a 1x1 convolution 64 -> 256 at 56x56, batch 32 (ResNet-50's conv2_x expansion)
    f, b, n = amp.op_work("aten::cudnn_convolution", "[[32, 64, 56, 56], [256, 64, 1, 1]]",
                          [32, 256, 56, 56])
    assert (f, b, n) == (2 * 32 * 256 * 56 * 56 * 64,
                         4 * (32 * 64 * 56 * 56 + 256 * 64 + 32 * 256 * 56 * 56), 1)
    f, b, n = amp.op_work("aten::convolution_backward",
                          "[[32, 256, 56, 56], [32, 64, 56, 56], [256, 64, 1, 1]]")
    assert (f, n) == (2 * 32 * 256 * 56 * 56 * 64, 2)
    assert amp.op_work("aten::mm", "[[512, 1024], [1024, 256]]") == (
        2 * 512 * 256 * 1024, 4 * (512 * 1024 + 1024 * 256 + 512 * 256), 1)
    assert amp.op_work("aten::linear", "[[8, 128, 512], [1024, 512], [1024]]") == (
        2 * 1024 * 1024 * 512, 4 * (8 * 128 * 512 + 1024 * 512 + 1024 * 1024), 1)
    assert amp.op_work("aten::relu", "[[32, 64]]") is None


def test_a_reduced_precision_trace_is_left_unchanged(graphs):
    """The MI300X trace runs BF16 convolutions and GEMMs (MIOpen igemm_*_bf16, Tensile BBS,
    composable kernels): amp does not apply, and says so."""
    notes = []
    g2 = rewrite(graphs["mi300x"], "amp", Context(device=MI300X, notes=notes))
    assert np.array_equal(T(g2)["dur_ns"].to_numpy(), T(graphs["mi300x"])["dur_ns"].to_numpy())
    assert any(n.startswith("amp: does not apply, 100% of its matrix-kernel time already runs "
                            "in FP16/BF16/FP8") for n in notes)


def test_mi300x_is_named_as_such():
    dev, how = amp.amp_device(Context(device=MI300X), [])
    assert dev.key == "mi300x" and dev.fp16_tflops == 1307.4


def test_a_trace_without_a_device_is_read_from_its_kernel_names():
    """hta/small/backward_thread.json records no deviceProperties; its one GEMM is CUTLASS's
    cutlass_80_tensorop_s1688gemm (built for SM 8.0): an A100 is assumed, and said; names that
    spell no architecture leave amp asking for the GPU."""
    name = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(...)"
    dev, how = amp.amp_device(Context(), [name, "triton_poi_fused_add_0"])
    assert dev.key == "a100-sxm4-80gb" and "sm80 kernels" in how
    with pytest.raises(DaydreamError, match=r"give the GPU: amp\(gpu=V100\)"):
        amp.amp_device(Context(), ["triton_poi_fused_add_0"])


def test_bf16_on_a_v100_is_an_error(graphs):
    with pytest.raises(DaydreamError, match="has no BF16 tensor/matrix rate"):
        rewrite(graphs["v100"], "amp(dtype=bf16)", Context(device=V100))


def test_a_conv_from_its_shapes(graphs, activity):
    """ResNet-50's first convolution (7x7, 3 -> 64, stride 2, batch 32 at 224x224) in the V100
    trace with shapes: F = 2 x 32 x 64 x 112 x 112 x 3 x 7 x 7, B = 4 (input + weight +
    output); 61.9 FLOP/B: compute-bound in FP32, bandwidth-bound in FP16, ratio
    (F / 15.7e12) / (B / 2 / 900e9) = 7.09. Its work beyond the fixed cost shrinks by that."""
    g = Graph.from_tables(graphs["v100"])
    kern = g.task.with_row_index("id").with_columns(pl.col("id").cast(pl.Int64)).filter(
        pl.col("kind") == "kernel")
    prec = [kernel_precision(n) for n in kern["name"].fill_null("").to_list()]
    ops = amp.Ops(activity["v100"]("range"))
    dt, rid = amp.kernel_dtypes(g, kern, prec, ops)
    work = amp.matrix_work(kern, prec, ops, rid)
    first = next(j for j, p in enumerate(prec) if p.math and kern["phase"][j] == "forward"
                 and kern["iteration"][j] == 1)
    f = 2 * 32 * 64 * 112 * 112 * 3 * 7 * 7
    b = 4 * (32 * 3 * 224 * 224 + 64 * 3 * 7 * 7 + 32 * 64 * 112 * 112)
    assert work[first][:2] == (f, b)
    assert dt[first] == "reduced"
    ratio = (f / P32) / (b / 2 / BW)
    assert ratio == pytest.approx(7.09, abs=0.01)
    g2 = rewrite(graphs["v100"], "amp(casts=false,loss_scaling=false)",
                 Context(device=V100, activity=activity["v100"]))
    d0 = kern["dur_ns"].to_numpy()
    t0 = np.percentile(d0, 10)
    new = T(g2)["dur_ns"][int(kern["id"][first])]
    # NCHW (the trace's layout): cuDNN transposes x, w and y to and from NHWC around its
    # tensor-core kernel, 2 bytes read and 2 written per element: b bytes at 900 GB/s x 0.7
    # = 193,755 ns
    assert round(b / 630) == 193_755
    assert new == round(t0 + (d0[first] - t0) / ratio) + 193_755
    g3 = rewrite(graphs["v100"], "amp(casts=false,loss_scaling=false,layout=nhwc)",
                 Context(device=V100, activity=activity["v100"]))
    assert T(g3)["dur_ns"][int(kern["id"][first])] == round(t0 + (d0[first] - t0) / ratio)


def test_transposes_without_shapes_by_hand():
    """Two FP32 convolution kernels whose ops record no shapes (no op ranges: the phase says
    the pass), on a V100 (15.7 TFLOPS FP32, 900 GB/s x 0.7 achieved), fixed cost 1,800 ns, a
    rule of 0.01 (forward) and 0.02 (backward) transposed bytes per peak FLOP of work:
    forward 101,800 ns: 100,000 ns x 15.7e12 FLOP/s = 1.57e9 peak FLOPs, 1.57e7 bytes at 630
    bytes/ns = 24,920.6 ns; backward 201,800 ns: 3.14e9 x 0.02 = 6.28e7 bytes = 99,682.5 ns."""
    name = "volta_scudnn_128x64_relu_interior_nn_v1"
    kern = pl.DataFrame({"dur_ns": [101_800, 201_800], "phase": ["forward", "backward"],
                         "name": [name, name], "iteration": [0, 0]})
    prec = [kernel_precision(name)] * 2
    ops = amp.Ops(None)
    add, n = amp.layout_transposes(kern, prec, ["reduced"] * 2, np.ones(2, bool), [None] * 2,
                                   ops, [None] * 2, BW * 0.7, 1_800.0,
                                   {"fp32": P32, "tf32": P32},
                                   rule={"forward": 0.01, "backward": 0.02})
    assert add.tolist() == [24_921, 99_683]
    assert n == {"calls": 0, "shaped_kernels": 0, "rule_kernels": 2}


def _conv_inputs(graphs, activity, key):
    g = Graph.from_tables(graphs[key])
    kern = g.task.with_row_index("id").with_columns(pl.col("id").cast(pl.Int64)).filter(
        pl.col("kind") == "kernel")
    prec = [kernel_precision(n) for n in kern["name"].fill_null("").to_list()]
    ops = amp.Ops(activity[key]("range"))
    dt, rid = amp.kernel_dtypes(g, kern, prec, ops)
    region = np.array([ph in amp.PHASES and it is not None for ph, it in zip(
        kern["phase"].to_list(), kern["iteration"].to_list(), strict=True)], bool)
    t0 = float(np.percentile(kern["dur_ns"].to_numpy(), 10))
    return kern, prec, ops, dt, rid, region, t0


def test_transposes_without_shapes_against_the_shaped_trace(graphs, activity):
    """The calibration trace with shapes (ResNet-50, V100, batch 32; tests/data copy of
    kineto-tb-plugin/resnet50_v100_nw0_run1): its transposes sized from the shapes, and sized
    by constants.AMP_TRANSPOSE with the shapes withheld, agree within the rule's stated error
    (7.8%: each half of the layers sized by the other half's rule, bench/amp_calibration.py).
    In-sample the rule was measured on these calls, so the totals agree closely; the stated
    error is the held-out one."""
    kern, prec, ops, dt, rid, region, t0 = _conv_inputs(graphs, activity, "v100")
    work = amp.matrix_work(kern, prec, ops, rid)
    bw, pk = BW * 0.7, {"fp32": P32, "tf32": P32}
    shaped, n1 = amp.layout_transposes(kern, prec, dt, region, work, ops, rid, bw, t0, pk)
    rule, n2 = amp.layout_transposes(kern, prec, dt, region, [None] * kern.height, ops, rid,
                                     bw, t0, pk)
    assert n1["rule_kernels"] == 0 and n1["shaped_kernels"] == n2["rule_kernels"] == 948
    assert rule.sum() / shaped.sum() - 1 == pytest.approx(0, abs=0.078)
    # per pass too: forward and backward are sized by their own figures
    fwd = (kern["phase"] == "forward").to_numpy()
    assert rule[fwd].sum() / shaped[fwd].sum() - 1 == pytest.approx(0, abs=0.078)


def test_amp_note_counts_the_convolutions_by_rule_and_by_shapes(graphs, activity):
    """The judged HTA V100 ResNet-50 records no shapes: all its lowered convolution kernels
    are sized by the rule, and the note says so."""
    ctx = Context(device=V100_SXM2, activity=activity["v100_hta"])
    rewrite(graphs["v100_hta"], "amp(casts=false,loss_scaling=false)", ctx)
    note = next(n for n in ctx.notes if "NCHW layout" in n)
    assert "0 convolution kernels (0 calls) sized from their shapes, 790 without shapes" in note
    ctx = Context(device=V100, activity=activity["v100"])
    rewrite(graphs["v100"], "amp(casts=false,loss_scaling=false)", ctx)
    note = next(n for n in ctx.notes if "NCHW layout" in n)
    assert "948 convolution kernels (636 calls) sized from their shapes, 0 without" in note


def test_what_autocast_keeps_fp32(graphs, activity):
    """Loss (cross_entropy: log_softmax, nll_loss) kernels, the optimizer's and the gradient
    accumulation's keep their time; batch norm and ReLU after a convolution follow its FP16."""
    g = graphs["v100"]
    g2 = rewrite(g, "amp(casts=false,loss_scaling=false)", Context(device=V100,
                                                                    activity=activity["v100"]))
    t0, t1 = T(g), T(g2)
    same = t0["dur_ns"] == t1["dur_ns"]
    name = t0["name"].fill_null("")
    kern = t0["kind"] == "kernel"
    assert same.filter(kern & (t0["phase"] == "weight_update")).all()
    assert same.filter(kern & name.str.contains("softmax|nll_loss")).all()
    bn = kern & name.str.contains("bn_fw_tr") & (t0["phase"] == "forward")
    assert (~same).filter(bn).all()


def test_weight_casts_and_grad_scaler(graphs, activity):
    """ResNet-50 has 54 weighted layers (53 convolutions, 1 linear): 54 weight casts per
    iteration. Per step GradScaler: one unscale kernel and the found_inf copy before the
    first optimizer kernel, the copy read back by a stream sync that waits for it, one update
    kernel after the optimizer."""
    g = graphs["v100"]
    its = T(g)["iteration"].drop_nulls().n_unique()
    g2 = rewrite(g, "amp", Context(device=V100, activity=activity["v100"]))
    t = T(g2)
    casts = t.filter(pl.col("name") == "amp: cast weight fp32->fp16 (inserted)")
    assert casts.height == 54 * its and set(casts["phase"]) == {"forward"}
    unscale = t.filter(pl.col("name").str.contains("non_finite_check_and_unscale"))
    copies = t.filter(pl.col("name") == "amp: found_inf DtoH (inserted)")
    syncs = t.filter(pl.col("name").str.starts_with("cudaStreamSynchronize (GradScaler"))
    update = t.filter(pl.col("name") == "amp: _amp_update_scale_ (inserted)")
    assert unscale.height == copies.height == syncs.height == update.height == its
    assert syncs["blocking"].all() and set(copies["bytes"]) == {4}
    e = pl.from_arrow(g2["edge"])
    se = e.filter(pl.col("dst").is_in(syncs["task_id"].to_list()), pl.col("kind") == "sync")
    assert sorted(se["src"].to_list()) == sorted(copies["task_id"].to_list())
    assert set(se["anchor"]) == {"end_end"}
    for u, c in zip(unscale["task_id"], copies["task_id"], strict=True):
        assert u < c  # the copy of found_inf follows the unscale on the stream
    r = replay(g2)
    assert r.mean("simulated_ns") > 0


@pytest.mark.parametrize("batch", [128, 256])
def test_v100_resnet50_at_the_published_batch_lands_in_the_published_range(graphs, activity,
                                                                            batch):
    """Like for like: the published NCHW FP32 -> AMP speedups of ResNet-50 training on a V100
    were measured at batch 128 (2.25x: sandeepkumar-skb/pytorch_experiments,
    torchvision_exp/README.md, 342.37 -> 152.20 ms) and 256 (2.22-2.35x: NVIDIA
    DeepLearningExamples resnet50v1.5 README at 3bbe228, pytorch-19.10, apex AMP, NCHW). The
    HTA trace runs batch 32 (no shapes; its Winograd convolution kernels take the time they
    take in the batch-32 kineto-tb-plugin trace: docs/whatif-hw.md), so the trace is taken to
    the published batch first and both steps are predicted there, without the profiler as the
    published runs were: the step ratio must lie in 2.1-2.45x (issue 36's range around them).
    Nothing here was fitted to these figures."""
    g = graphs["v100_hta"]
    ctx = lambda: Context(device=V100_SXM2, activity=activity["v100_hta"])  # noqa: E731
    at = f"batch(size={batch},traced=32)+no_profiler"
    fp32 = replay(rewrite(g, at, ctx())).headline("simulated_ns")
    mixed = replay(rewrite(g, at + "+amp", ctx())).headline("simulated_ns")
    assert 2.1 <= fp32 / mixed <= 2.45


def test_v100_resnet50_nchw_over_nhwc_step_is_the_published_ratio(graphs, activity):
    """What cuDNN's NCHW<->NHWC transposes cost under AMP, against the only published figures
    that compare the two layouts and nothing else (ResNet-50, Volta, AMP, equal batch): the
    step in NCHW over the step in NHWC is 1.31x (PyTorch tutorials, memory_format_tutorial.py,
    'Performance Gains': 0.259 s against 0.198 s a batch-200 step) to 1.37x (the batch-128
    V100 pair in docs/accuracy.md: 152.20 ms against 110.93 ms). The transposes are sized by
    constants.AMP_TRANSPOSE, measured on another trace (the shaped calibration ResNet-50);
    neither figure was fitted. Both steps without the profiler, as the published runs were."""
    g = graphs["v100_hta"]
    ctx = lambda: Context(device=V100_SXM2, activity=activity["v100_hta"])  # noqa: E731
    nchw = replay(rewrite(g, "no_profiler+amp", ctx())).headline("simulated_ns")
    nhwc = replay(rewrite(g, "no_profiler+amp(layout=nhwc)", ctx())).headline("simulated_ns")
    assert 1.31 <= nchw / nhwc <= 1.37


def test_chain_on_a100(graphs):
    g2 = rewrite(graphs["a100"], "amp", Context(device=A100))
    assert replay(g2).mean("simulated_ns") > 0


@pytest.mark.parametrize("key", ["v100", "alexnet", "mi300x"])
def test_host_costs_are_the_medians_of_the_calls(graphs, key):
    """The inserted calls' own costs (one query of three medians) are the medians a Polars
    filter of the calls finds: cudaLaunchKernel, non-blocking cudaMemcpyAsync, blocking
    calls."""
    g = Graph.from_tables(graphs[key])
    api = g.task.filter(pl.col("kind") == "api")
    want = {k: int(api.filter(e)["dur_ns"].median()) for k, e in (
        ("launch", pl.col("name").str.contains("LaunchKernel")),
        ("copy", pl.col("name").str.contains("Memcpy") & ~pl.col("blocking")),
        ("sync", pl.col("blocking")))}
    assert amp._host_costs(g) == want


@pytest.fixture(scope="module")
def recsys_v100(tmp_path_factory):
    """hta/recsys_v100_rank1_of2 (tests/data/kineto): its backward waits across streams, which
    the graph infers from coincidences of times."""
    from daydream.graphstore.read import read_graph
    from tests.conftest import DATA, stored_graphs
    f = DATA / "kineto" / "recsys_v100_rank1_of2.json.gz"
    store = tmp_path_factory.mktemp("recsys_store")
    return read_graph(store, stored_graphs([f], store)[f])


def test_grad_scaler_after_fusion_drops_the_waits_on_later_work(recsys_v100):
    # fusion bypasses the tasks it removes with edges of kind 'inserted', inferred where a
    # wait on their path was; amp's check of inferred waits on work launched later took only
    # the kinds wait and contention, and its found_inf sync then closed a cycle (the replay
    # failed: "deadlock: 72542 of 108606 tasks can never run"). The graph build infers no
    # wait from work launched later (graphstore.build._in_launch_order), but contention from
    # it, which the simulator keeps only while its source runs: amp drops those it finds
    ctx = Context(device=V100)
    g = rewrite(recsys_v100, "fusion+amp", ctx)
    assert replay(g).mean("simulated_ns") > 0
    assert any("inferred cross-stream edges whose source was launched after" in n
               for n in ctx.notes)
    e = pl.from_arrow(recsys_v100["edge"])
    launch = e.filter(pl.col("kind") == "launch").select(pl.col("dst").alias("t"),
                                                         pl.col("src").alias("call"))
    task = pl.from_arrow(recsys_v100["task"]).select(pl.col("task_id").alias("call"),
                                                     pl.col("start_ns").alias("at"))
    at = launch.join(task, on="call").select("t", "at")
    inf = (e.filter(pl.col("inferred") & pl.col("kind").is_in(["wait", "contention"]))
           .join(at.rename({"t": "src", "at": "src_at"}), on="src")
           .join(at.rename({"t": "dst", "at": "dst_at"}), on="dst")
           .with_columns(later=pl.col("src_at") > pl.col("dst_at")))
    assert inf.filter(pl.col("kind") == "wait").height > 100
    assert inf.filter(pl.col("kind") == "wait", pl.col("later")).height == 0
    assert inf.filter(pl.col("kind") == "contention", pl.col("later")).height > 0
