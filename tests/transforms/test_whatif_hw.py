"""batch(size=N) and gpu(NAME) on small real traces, task by task; the roofline's parts
(transforms/roofline.py) and the op work (transforms/work.py) on hand-computed figures; the
step memory (transforms/memory.py).

The Particle Transformer trace (tests/data/kineto/particle_transformer_a100_fwd_bs16) is one
forward pass at batch 16 on an A100 PCIe 40GB with recorded shapes; the ResNet-50 V100 trace
(resnet50_v100_nw0_run1) is six training steps at batch 32 with shapes."""

from __future__ import annotations

import numpy as np
import orjson
import polars as pl
import pyarrow.compute as pc
import pytest

from daydream.base import occupancy
from daydream.base.errors import DaydreamError
from daydream.transforms import Context, rewrite
from daydream.transforms import hardware as hw
from daydream.transforms import memory as mem
from daydream.transforms import roofline as rf
from daydream.transforms import work as wk
from daydream.transforms.opts import batch as B
from daydream.transforms.opts import gpu as G
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import list_opts
from tests.conftest import DATA, stored_graphs
from tests.transforms.conftest import V100

PARTICLE = DATA / "kineto" / "particle_transformer_a100_fwd_bs16.json.gz"
A100_PCIE = {"name": "NVIDIA A100-PCIE-40GB", "totalGlobalMem": 42346610688,
             "computeMajor": 8, "computeMinor": 0, "maxThreadsPerMultiprocessor": 2048,
             "regsPerMultiprocessor": 65536, "sharedMemPerMultiprocessor": 167936,
             "numSms": 108}


@pytest.fixture(scope="session")
def particle(tmp_path_factory):
    """(graph tables, context factory) of the batch-16 Particle Transformer trace."""
    from daydream.graphstore.read import read_graph
    from daydream.ingest.store import Store
    root = tmp_path_factory.mktemp("particle_store")
    tid = stored_graphs([PARTICLE], root)[PARTICLE]
    st = Store(root)
    dev = orjson.loads(st.trace_row(tid)["devices"])[0]

    def ctx(notes=None):
        return Context(device=dev, notes=[] if notes is None else notes,
                       activity=lambda name: st.read(name, tid))
    return read_graph(root, tid), ctx


def _kernels(tables, ctx, op: str, dims: str) -> pl.DataFrame:
    """The GPU tasks whose op is OP with recorded input dims DIMS, in start order."""
    g = Graph.from_tables(tables)
    t, la = g.task, g.launches()
    ranges = ctx().activity("range")
    ops = wk.task_ops(t["kind"].to_numpy(), t["range_id"].fill_null(-1).to_numpy(),
                      la["api"].to_numpy(), la["gpu"].to_numpy(), ranges)
    d = dict(zip(ranges["range_id"].to_pylist(), ranges["input_dims"].to_pylist(),
                 strict=True))
    ids = [i for i in range(g.n_tasks) if ops.name[i] == op and d.get(int(ops.op[i])) == dims]
    return t.filter(pl.col("task_id").is_in(ids)).sort("task_id")


# --- batch on the Particle Transformer -------------------------------------------------------

def test_batch_reads_the_traced_batch_from_the_inputs(particle):
    tables, ctx = particle
    m = B.predict(Graph.from_tables(tables), ctx(), 64)
    # the first op of the forward pass: aten::to of the [16, 1, 128] particle mask
    assert m.traced == 16 and "aten::to [16, 1, 128]" in m.how


def test_batch_kernels_by_hand(particle):
    tables, ctx = particle
    g = Graph.from_tables(tables)
    m = B.predict(g, ctx(), 64)
    dur = g.task["dur_ns"].to_numpy()
    # A bias cast, copy_ [128] -> half: a parameter (the shape of a layer norm weight), so
    # its work does not grow: the kernel keeps its time.
    bias = _kernels(tables, ctx, "aten::copy_", "[[128], [128], []]")["task_id"].to_list()
    assert len(bias) > 10 and all(m.new_dur_ns[i] == dur[i] for i in bias)
    # The broadcast bias add_ of a pair embedding: [16, 64, 1, 2211] half += [1, 64, 1, 1].
    # Bytes at 16: read 16*64*2211*2 = 4,528,128 and 128 (the bias), write 4,528,128:
    # 9,056,384, an L2-resident working set (40 MiB on the A100); at 64 the activation
    # bytes are 4x: 36,225,152, still within the L2. At a typical memory-kernel rate the
    # kernel's work is well above the fixed cost, so all of its time beyond the fixed cost
    # is work, which grows 36,225,152 / 9,056,384 = 3.999986x. Two such kernels then differ
    # at 64 by that ratio times their difference at 16, whatever the fixed cost.
    adds = _kernels(tables, ctx, "aten::add_", "[[16, 64, 1, 2211], [1, 64, 1, 1], []]")
    a, b = adds["task_id"].to_list()[1:3]
    assert (dur[a], dur[b]) == (23423, 23839)
    ratio = 36_225_152 / 9_056_384
    assert m.new_dur_ns[b] - m.new_dur_ns[a] == pytest.approx((23839 - 23423) * ratio, abs=1)
    assert m.new_dur_ns[b] == pytest.approx(m.fixed_ns + (23839 - m.fixed_ns) * ratio, abs=1)
    # A tiled GEMM in one wave at both batches: addmm [1056, 128] x [128, 128] half on a
    # WMMA kernel of 132 blocks of 128 threads, 96 registers per thread, 17,408 B of shared
    # memory. One SM holds min(2048 / 128 = 16, 65536 / (96 * 128) = 5, 167936 / 17408 = 9,
    # 32) = 5 of them: 540 blocks on 108 SMs; at 64 the grid is 4 * 132 = 528 blocks, still
    # one wave, and 4x the FLOPs take the time 1x did (its roofline, 2 * 4224 * 128 * 128 /
    # 312 TFLOPS = 0.44 us, far below it).
    gemm = _kernels(tables, ctx, "aten::addmm", "[[128], [1056, 128], [128, 128], [], []]")
    ids = gemm["task_id"].to_list()
    assert ids and all(m.new_dur_ns[i] == dur[i] for i in ids)


def test_batch_graph(particle):
    tables, ctx = particle
    notes: list[str] = []
    t0 = pl.from_arrow(tables["task"])
    g2 = rewrite(tables, "batch(size=64)", ctx(notes))
    t1 = pl.from_arrow(g2["task"])
    # nothing is added or removed, and only GPU work changes: there is no data loading here
    assert t1.height == t0.height
    cpu = pl.col("kind").is_in(["api", "host"])
    assert t1.filter(cpu)["dur_ns"].equals(t0.filter(cpu)["dur_ns"])
    gpu = pl.col("kind").is_in(["kernel", "memcpy", "memset"])
    assert t1.filter(gpu)["dur_ns"].sum() > t0.filter(gpu)["dur_ns"].sum()
    # never below the trace's own time: the batch grew, no kernel gets faster
    assert (t1.filter(gpu)["dur_ns"] >= t0.filter(gpu)["dur_ns"]).all()
    # the five scalar read-backs (.item(), DtoH) keep their bytes and time
    dtoh = pl.col("name").str.contains("DtoH")
    assert t1.filter(dtoh).select("dur_ns", "bytes").equals(
        t0.filter(dtoh).select("dur_ns", "bytes"))
    assert any(n.startswith("batch: traced at 16") for n in notes)
    assert any(n.startswith("memory after batch: predicted peak") for n in notes)


def test_batch_errors(particle):
    tables, ctx = particle
    for spec, msg in (("batch(size=0)", "size must be >= 1"),
                      ("batch(size=8, traced=-1)", "traced must be >= 0")):
        with pytest.raises(DaydreamError, match=msg):
            rewrite(tables, spec, ctx())
    # without the range table (no store) the batch is unknown: the error says how to give it
    with pytest.raises(DaydreamError, match=r"give it as batch\(size=64, traced=B\)"):
        rewrite(tables, "batch(size=64)", Context(device=A100_PCIE))


# --- batch on the ResNet-50 training trace -----------------------------------------------------

def test_batch_resnet_training(graphs, activity):
    g = graphs["v100"]
    notes: list[str] = []
    ctx = Context(device=V100, notes=notes, activity=activity["v100"])
    m = B.predict(Graph.from_tables(g), ctx, 64)
    # the input batch copied to the GPU: 32 x 3 x 224 x 224 FP32 = 19,267,584 bytes
    assert m.traced == 32 and "host-to-device" in m.how
    g2 = rewrite(g, "batch(size=64)", ctx)
    t0, t1 = pl.from_arrow(g["task"]), pl.from_arrow(g2["task"])
    h2d = (pl.col("kind") == "memcpy") & pl.col("name").str.contains("HtoD")
    big = t0.filter(h2d, pl.col("bytes") == 19_267_584)["task_id"].to_list()
    assert len(big) == 6  # one per step
    assert t1.filter(pl.col("task_id").is_in(big))["bytes"].to_list() == [38_535_168] * 6
    # data loading on the CPU doubles; every other CPU task keeps its cost
    cpu = pl.col("kind").is_in(["api", "host"])
    dl = t0.filter(cpu, pl.col("phase") == "data_loading")
    assert dl.height and t1.filter(pl.col("task_id").is_in(dl["task_id"].to_list()))[
        "dur_ns"].to_list() == [2 * d for d in dl["dur_ns"].to_list()]
    rest = t0.filter(cpu, pl.col("phase") != "data_loading")["task_id"].to_list()
    assert t1.filter(pl.col("task_id").is_in(rest))["dur_ns"].equals(
        t0.filter(pl.col("task_id").is_in(rest))["dur_ns"])
    # the weight update's kernels work on parameters: their time stays
    wu = (pl.col("phase") == "weight_update") & (pl.col("kind") == "kernel")
    assert t1.filter(wu)["dur_ns"].equals(t0.filter(wu)["dur_ns"])
    assert any(n.startswith("memory after batch: predicted peak") for n in notes)


def test_batch_holds_the_optimizer_fixed(graphs, activity, monkeypatch):
    """The issue's case: batch 32 -> 2056 (64.25x) on the ResNet-50 training trace. The SGD
    step's kernels (phase weight_update: add_, mul_, fill_ on parameters, gradients and
    momentum) keep their time, also where the model's parameters are not recognised from
    its shapes (an LSTM's or a raw ``x @ W``'s weights: here the weight shapes are withheld),
    while the forward and backward grow."""
    g = graphs["v100"]
    t0 = pl.from_arrow(g["task"])
    wu = (pl.col("phase") == "weight_update") & (pl.col("kind") == "kernel")
    fwd = (pl.col("phase") == "forward") & (pl.col("kind") == "kernel")
    assert t0.filter(wu).height == 3864  # 4 kernels for each of 161 parameter tensors, 6 steps
    # without the parameters' shapes an optimizer op looks batch-sized: add_ of two [64, 3,
    # 7, 7] tensors would grow 64.25x (what the model predicted before it kept the phase)
    w = wk.op_work("aten::add_", "[[64, 3, 7, 7], [64, 3, 7, 7], []]",
                   '["float", "float", "Scalar"]', set(), 2056 / 32)
    assert w.bytes_n == pytest.approx(2056 / 32 * w.bytes_b)
    for params in (None, set()):
        if params is not None:
            monkeypatch.setattr(wk, "param_shapes", lambda ranges: set())
        ctx = Context(device=V100, notes=[], activity=activity["v100"])
        t1 = pl.from_arrow(rewrite(g, "batch(size=2056)", ctx)["task"])
        assert t1.filter(wu)["dur_ns"].equals(t0.filter(wu)["dur_ns"])
        assert t1.filter(fwd)["dur_ns"].sum() > 30 * t0.filter(fwd)["dur_ns"].sum()


def test_batch_without_shapes_given_the_traced_batch(graphs):
    """A trace without recorded shapes (the HTA ResNet-50) runs with traced=B: every kernel
    of the forward and backward scales its work above the fixed cost by N/b; the weight
    update keeps its time (before, an empty class list made a float mask and the run
    failed)."""
    g = graphs["v100_hta"]
    t0 = pl.from_arrow(g["task"])
    t1 = pl.from_arrow(rewrite(g, "batch(size=64, traced=32)",
                               Context(device=V100, notes=[]))["task"])
    k = pl.col("kind") == "kernel"
    for ph in ("forward", "backward"):
        a = t0.filter(k, pl.col("phase") == ph)["dur_ns"].sum()
        b = t1.filter(k, pl.col("phase") == ph)["dur_ns"].sum()
        assert a > 0 and 1.8 * a < b <= 2 * a
    wu = k & (pl.col("phase") == "weight_update")
    assert t1.filter(wu)["dur_ns"].equals(t0.filter(wu)["dur_ns"])


def test_batch_scales_activation_collectives_not_gradient_ones(tmp_path):
    """DLRM rank 0 of 8 (V100, a real trace without shapes; traced=B given): at twice the
    batch its SendRecv kernels (the embeddings' all-to-all, activations) grow, at most 2x;
    its AllReduce kernels (gradients, parameter-sized) keep their time."""
    from daydream.graphstore.read import read_graph
    f = DATA / "kineto" / "dlrm_8ranks" / "rank0.kineto.json.gz"
    tid = stored_graphs([f], tmp_path)[f]
    g = read_graph(tmp_path, tid)
    notes: list[str] = []
    t0 = pl.from_arrow(g["task"])
    t1 = pl.from_arrow(rewrite(g, "batch(size=64, traced=32)",
                               Context(device=V100, notes=notes))["task"])
    comm = pl.col("kind") == "comm"
    for part, grows in (("SendRecv", True), ("AllReduce", False)):
        sel = comm & pl.col("name").str.contains(part)
        a, b = t0.filter(sel)["dur_ns"].to_numpy(), t1.filter(sel)["dur_ns"].to_numpy()
        assert len(a) > 0
        if grows:
            assert (b > a).all() and (b <= 2 * a).all()
        else:
            assert (b == a).all()
    assert any("collectives that move activations" in n for n in notes)


def test_batch_sequence_errors(particle):
    tables, ctx = particle
    with pytest.raises(DaydreamError, match="give both seq and traced_seq"):
        rewrite(tables, "batch(size=64, seq=128)", ctx())


# --- gpu ------------------------------------------------------------------------------------

def test_gpu_v100_to_a100(graphs, activity):
    g = graphs["v100"]
    ctx = Context(device=V100, activity=activity["v100"])
    m = G.predict(Graph.from_tables(g), ctx, "a100-sxm4-40gb")
    t = pl.from_arrow(g["task"])
    dur = t["dur_ns"].to_numpy()
    assert (m.source.key, m.target.key) == ("v100-sxm2-32gb", "a100-sxm4-40gb")
    # the trace's durations are whole microseconds and its work-free kernels take 1 us
    assert m.fixed_ns == 1000
    k = m.fixed_ns
    cls = np.asarray(m.src_class)
    dst = np.asarray(m.dst_class)
    work = np.maximum(dur - k, 0)

    def check(src_class, ratio):
        sel = np.flatnonzero(cls == src_class)
        assert len(sel)
        assert np.allclose(m.new_dur_ns[sel], np.minimum(dur[sel], k) + work[sel] * ratio,
                           atol=0.5)
    # FP32 convolutions on a V100 take TF32 tensor cores on an A100 (PyTorch's cuDNN
    # default): 15.7 TFLOPS FP32 (V100 SXM2) against 156 TFLOPS TF32 (A100), datasheets
    check("conv/fp32", 15.7 / 156)
    assert set(dst[cls == "conv/fp32"]) == {"conv/tf32"}
    # the classifier's FP32 matmul (the fc layer's addmm) stays FP32: 15.7 / 19.5
    check("gemm/fp32", 15.7 / 19.5)
    assert set(dst[cls == "gemm/fp32"]) == {"gemm/fp32"}
    # every other kernel is bound by device memory: 900 GB/s against 1,555 GB/s
    check("memory/memory", 900 / 1555)
    # host copies by PCIe: Gen3 x16 (32 GB/s both ways) against Gen4 x16 (64 GB/s)
    check("memcpy/htod", 32 / 64)
    # the CPU side is unchanged
    cpu = np.isin(t["kind"].to_numpy(), ["api", "host"])
    assert np.array_equal(m.new_dur_ns[cpu], dur[cpu])
    # with matmul TF32 allowed the addmm takes TF32 too
    m2 = G.predict(Graph.from_tables(g), ctx, "a100-sxm4-40gb", matmul_tf32=True)
    assert set(np.asarray(m2.dst_class)[cls == "gemm/fp32"]) == {"gemm/tf32"}


def test_gpu_chain_and_errors(graphs, activity):
    g = graphs["v100"]
    notes: list[str] = []
    ctx = Context(device=V100, notes=notes, activity=activity["v100"])
    rewrite(g, "gpu(H100)+amp", ctx)
    # amp after gpu sees the new GPU
    assert hw.device_from_properties(ctx.device).key == "h100-sxm"
    assert any(n.startswith("amp: NVIDIA H100 SXM5 80GB (the trace's device") for n in notes)
    with pytest.raises(DaydreamError, match=r"put gpu\(\.\.\.\) before amp"):
        rewrite(g, "amp+gpu(H100)", Context(device=V100, activity=activity["v100"]))
    with pytest.raises(DaydreamError, match="unknown GPU 'X9000'"):
        rewrite(g, "gpu(X9000)", Context(device=V100))
    with pytest.raises(DaydreamError, match=r'the trace says \{"name": "NVIDIA Foo 7", '
                                            r'"computeMajor": 12\}'):
        rewrite(g, "gpu(A100)", Context(device={"name": "NVIDIA Foo 7", "computeMajor": 12}))
    with pytest.raises(DaydreamError, match="records no GPU"):
        rewrite(g, "gpu(A100)", Context())


def test_gpu_properties_round_trip():
    # what gpu hands on in the context finds its device again
    for d in hw.DEVICES.values():
        assert hw.device_from_properties(G.properties(d)) == d, d.key


def test_listed_by_opts():
    by = {o["name"]: o for o in list_opts()}
    assert by["batch"]["signature"] == \
        "batch(size: int, traced: int = 0, seq: int = 0, traced_seq: int = 0)"
    assert by["gpu"]["signature"] == ("gpu(name: str, conv_tf32: bool = True, "
                                      "matmul_tf32: bool = False)")
    assert by["batch"]["summary"].startswith("The same job at batch SIZE")
    assert by["gpu"]["summary"].startswith("The same job on GPU NAME")


# --- the roofline's parts, by hand -------------------------------------------------------------

A100_40 = hw.device("a100-sxm4-40gb")


def test_roofline_by_hand():
    # the L2 (40 MiB) holds a 10 MiB working set, not a 50 MiB one: 7,219 against 1,555 GB/s
    assert rf.bandwidth_gbps(A100_40, np.array([10 << 20, 50 << 20])).tolist() == [7219, 1555]
    # an FP16 GEMM of 2 * 1056 * 128 * 512 FLOPs at 312 TFLOPS: 443.6 ns, above its 1.48 MB
    # at 7,219 GB/s (205.5 ns)
    r = rf.roofline_ns(A100_40, ["fp16"], np.array([138_412_032.0]), np.array([1_483_776.0]),
                       np.array([7219.0]))
    assert r[0] == pytest.approx(138_412_032 / 312e3)
    # a device without an L2 figure: device memory throughout
    t4 = hw.device("t4")
    assert rf.l2_gbps(t4)[0] is None
    assert rf.bandwidth_gbps(t4, np.array([1.0]))[0] == t4.memory_gbps


def test_split_by_hand():
    # work-dominated: 20 us for 1 us of roofline work at a class rate of 5%: 20 us of work
    # expected at that rate >= the 8 us fixed cost, so the fixed cost is 8 us and the
    # kernel's own fraction 1 / 12
    s = rf.split(np.array([20_000.0]), np.array([1_000.0]), 8_000.0, np.array([0.05]))
    assert s.fixed_ns[0] == 8_000 and s.fraction[0] == pytest.approx(1 / 12)
    assert rf.kernel_ns(s, np.array([4_000.0]), np.array([4_000.0]))[0] == \
        pytest.approx(8_000 + 4 * 12_000)
    # latency-bound: 9 us for 10 ns of roofline work: 200 ns at the class rate, 1 - 200 /
    # 8000 = 97.5% of the unexplained 800 ns is fixed: 8,780 ns fixed, 220 ns of work
    s = rf.split(np.array([9_000.0]), np.array([10.0]), 8_000.0, np.array([0.05]))
    assert s.fixed_ns[0] == pytest.approx(8_780) and s.fraction[0] == pytest.approx(10 / 220)
    assert rf.kernel_ns(s, np.array([40.0]), np.array([40.0]))[0] == \
        pytest.approx(8_780 + 4 * 220)
    # below the fixed cost with its roofline time as work: 5 us, 1 us roofline
    s = rf.split(np.array([5_000.0]), np.array([1_000.0]), 8_000.0, np.array([0.05]))
    assert s.fixed_ns[0] == pytest.approx(4_000) and s.fraction[0] == 1.0
    # the L2 regime: a kernel at 30% of the L2's rate keeps that rate when its working set
    # spills (max with the DRAM roofline, which is slower only above 1555 / 7219 = 21.5%)
    s = rf.split(np.array([10_000.0]), np.array([3_000.0]), 0.0, np.array([0.3]))
    spill = 4 * 3_000 * 7219 / 1555
    assert rf.kernel_ns(s, np.array([12_000.0]), np.array([spill]))[0] == \
        pytest.approx(max(40_000, spill))


def test_fixed_cost_and_waves_by_hand():
    dur = np.array([5_000, 6_000, 7_000, 9_000, 50_000] * 4, float)
    tiny = np.array([True, True, True, False, False] * 4)
    assert rf.fixed_cost_ns(dur, tiny)[0] == 6_000  # median of the 12 tiny ones
    t0, how = rf.fixed_cost_ns(dur, None)
    assert t0 == np.percentile(dur, 10) and "10th percentile" in how
    # 5 resident blocks (registers bind: 65536 / (96 * 128)) on 108 SMs
    k = occupancy.resident_blocks(A100_PCIE, np.array([128]), np.array([96]), np.array([17_408]))
    assert k[0] == 5
    # 132 blocks -> 528 blocks: one wave both times, so the time grows 1x for 4x the work
    assert rf.wave_factor(np.array([132]), np.array([540]), np.array([4.0]))[0] == 0.25
    # 300 blocks -> 1200: 1 wave -> 3 waves: 3x for 4x the work
    assert rf.wave_factor(np.array([300]), np.array([540]), np.array([4.0]))[0] == 0.75


# --- op work, by hand --------------------------------------------------------------------------

def test_op_work_by_hand():
    params = {(512,), (128, 512), (512, 128)}
    # addmm(bias [512], x [1056, 128], w^T [128, 512]) in half: 2 * 1056 * 128 * 512 FLOPs;
    # bytes 1,024 + 270,336 + 131,072 read, 1,081,344 written; at 4x the batch only x and
    # the output grow
    w = wk.op_work("aten::addmm", "[[512], [1056, 128], [128, 512], [], []]",
                   '["c10::Half", "c10::Half", "c10::Half", "Scalar", "Scalar"]', params, 4.0)
    assert w.flops_b == 138_412_032 and w.flops_n == 4 * 138_412_032
    assert w.bytes_b == 1_024 + 270_336 + 131_072 + 1_081_344
    assert w.bytes_n == 1_024 + 4 * 270_336 + 131_072 + 4 * 1_081_344
    # a weight gradient mm(grad^T [512, 4096], x [4096, 128]): FLOPs grow with the batch
    # (the contracted dim), its [512, 128] output does not
    w = wk.op_work("aten::mm", "[[512, 4096], [4096, 128]]", '["float", "float"]', params, 2.0)
    assert w.flops_n == 2 * w.flops_b == 2 * 2 * 512 * 4096 * 128
    assert w.bytes_n == 2 * (512 * 4096 + 4096 * 128) * 4 + 512 * 128 * 4
    # a reduction writes (almost) nothing; an in-place add reads and writes input 0
    w = wk.op_work("aten::sum", "[[16, 2, 2211], [], [], []]", '["float"]', set(), 1.0)
    assert w.bytes_b == 16 * 2 * 2211 * 4
    w = wk.op_work("aten::add_", "[[16, 64, 1, 2211], [1, 64, 1, 1], []]",
                   '["c10::Half", "c10::Half", "Scalar"]', {(64,)}, 4.0)
    assert (w.bytes_b, w.bytes_n) == (9_056_384, 36_225_152)
    assert wk.op_work("aten::lt", "[[], []]", '["long int", "Scalar"]', set(), 2.0) is None


def test_op_work_along_the_sequence_by_hand():
    """Batch 16 -> 64 and length 66 -> 128 (the Particle Transformer's batches 16 and 64 ran
    66 and 64 particles): 8 heads of 16 dims, FP32."""
    seq = (66, 128 / 66)
    f32 = '["float", "float"]'
    # QK^T: bmm [128, 66, 16] x [128, 16, 66] -> [128, 66, 66]; at the new size [512, 128,
    # 16] x [512, 16, 128] -> [512, 128, 128]: 2 * 512 * 128 * 16 * 128 FLOPs
    w = wk.op_work("aten::bmm", "[[128, 66, 16], [128, 16, 66]]", f32, set(), 4.0, 16, seq)
    assert w.flops_b == 2 * 128 * 66 * 16 * 66
    assert w.flops_n == pytest.approx(2 * 512 * 128 * 16 * 128)
    assert w.bytes_b == (2 * 128 * 66 * 16 + 128 * 66 * 66) * 4
    assert w.bytes_n == pytest.approx((2 * 512 * 128 * 16 + 512 * 128 * 128) * 4)
    # scores @ V: [128, 66, 66] x [128, 66, 16]: the same FLOPs, contracted over the length
    w = wk.op_work("aten::bmm", "[[128, 66, 66], [128, 66, 16]]", f32, set(), 4.0, 16, seq)
    assert w.flops_n == pytest.approx(2 * 512 * 128 * 128 * 16)
    # a linear layer on batch and length flattened: [1056 = 16 x 66, 17] x w [128, 17] ->
    # [8192 = 64 x 128, 17] x [128, 17]; the weight and bias stay
    w = wk.op_work("aten::linear", "[[1056, 17], [128, 17], [128]]", '["float", "float", "float"]',
                   {(128, 17), (17, 128), (128,)}, 4.0, 16, seq)
    assert w.flops_n == pytest.approx(2 * 8192 * 17 * 128)
    assert w.bytes_n == pytest.approx((8192 * 17 + 128 * 17 + 128 + 8192 * 128) * 4)
    # the Particle Transformer's pair features: a 1x1 conv1d over [16, 64, 2211], 2211 =
    # 66 x 67 / 2 pairs of 66 particles; at 128 particles 128 x 129 / 2 = 8256 pairs, the
    # model's (128/66)^2 = 3.761x of 2211 (the triangle's exact ratio 3.734x)
    w = wk.op_work("aten::conv1d", "[[16, 64, 2211], [64, 64, 1], [64]]",
                   '["float", "float", "float"]', {(64, 64), (64,)}, 4.0, 16, seq)
    grow = 4 * (128 / 66) ** 2
    assert w.bytes_n == pytest.approx((16 * 64 * 2211 * 2 * grow + 64 * 64 + 64) * 4)
    assert w.flops_n == pytest.approx(w.flops_b * grow)
    assert wk.seq_dims((16, 64, 2211), 66, 16) == 2 and wk.seq_dims((66, 16, 17), 66, 16) == 1
    # at 64 particles the model's 64-wide pair embedding has a dim of the length: only the
    # pairs (64 x 65 / 2 = 2080) and batch x length (1024) are taken to follow it
    assert wk.seq_dims((64, 64, 2080), 64, 16, plain=False) == 2
    assert wk.seq_dims((1024, 64), 64, 16, plain=False) == 1
    assert wk.seq_dims((64, 64, 2080), 64, 16) == 4
    # without a sequence the same op grows with the batch only
    w = wk.op_work("aten::linear", "[[1056, 17], [128, 17], [128]]", '["float", "float", "float"]',
                   {(128, 17), (17, 128), (128,)}, 4.0, 16)
    assert w.flops_n == 4 * w.flops_b


# --- memory ------------------------------------------------------------------------------------

def test_resnet50_parameters_and_memory(graphs, activity):
    ranges = activity["v100"]("range")
    m = mem.step_memory(Graph.from_tables(graphs["v100"]), ranges)
    # torchvision's ResNet-50 has 25,557,032 parameters (its model card), FP32
    assert m.params_bytes == 25_557_032 * 4
    assert m.grads_bytes == m.params_bytes
    assert m.optimizer_bytes == m.params_bytes  # SGD with momentum: one buffer per parameter
    assert m.activations_bytes > 0


def test_memory_reads_ranges_whose_ids_are_not_row_numbers(graphs, activity):
    """step_memory finds each range's parent by row where the ids are the row numbers, as
    ingest writes them; a table whose ids are not (shifted here, parents with them) takes the
    path through an id index, and must count the same step."""
    g = Graph.from_tables(graphs["v100"])
    ranges = activity["v100"]("range")
    shifted = ranges.set_column(
        ranges.schema.get_field_index("range_id"), "range_id",
        pc.add(ranges["range_id"], 10**9)).set_column(
        ranges.schema.get_field_index("parent"), "parent", pc.add(ranges["parent"], 10**9))
    a, b = mem.step_memory(g, ranges), mem.step_memory(g, shifted)
    assert a.activations_bytes > 0 and a.layer_activations
    assert (a.params_bytes, a.activations_bytes, a.optimizer_bytes, a.how) == \
        (b.params_bytes, b.activations_bytes, b.optimizer_bytes, b.how)
    # the graph's tasks name the unshifted ranges: the shifted table's ops find no layer
    assert not b.layer_activations


def test_memory_what_ifs_by_hand():
    m = mem.StepMemory(params_bytes=100, grads_bytes=100, optimizer_bytes=200,
                       activations_bytes=1_000, layer_activations={"a": 300, "b": 200},
                       layer_inputs={"a": 50, "b": 40})
    assert mem.predicted(m) == 1_400
    assert mem.predicted(m, batch_scale=2) == 2_400
    # checkpointing a and b: keep their inputs (90) instead of 500, recompute at most 300
    assert mem.predicted(m, checkpointed=["a", "b"]) == 400 + (1_000 - 500 + 90 + 300)
    assert mem.predicted(m, offloaded_bytes=250) == 1_150
    # AMP: activations halve, an FP16 copy of the weights is added
    assert mem.predicted(m, amp=True) == 400 + 500 + 50


def test_memory_note_says_when_it_does_not_fit(particle):
    tables, ctx = particle
    notes: list[str] = []
    rewrite(tables, "batch(size=100000)", ctx(notes))
    note = next(n for n in notes if n.startswith("memory after batch"))
    assert "of 39.4 GiB: would likely NOT fit the device's memory" in note


def _peak(notes: list[str], what: str) -> tuple[float, float]:
    """(predicted, traced) GiB of WHAT's memory note."""
    import re
    n = next(x for x in notes if x.startswith(f"memory after {what}: predicted peak"))
    m = re.search(r"peak ([\d.]+) GiB .*traced step ([\d.]+) GiB", n)
    return float(m.group(1)), float(m.group(2))


def test_memory_notes_of_a_chain(graphs, activity):
    g = graphs["v100"]

    def notes_of(spec):
        notes: list[str] = []
        rewrite(g, spec, Context(device=V100, notes=notes, activity=activity["v100"]))
        return notes
    for spec, what in (("amp", "amp"), ("offload", "offload")):
        p, base = _peak(notes_of(spec), what)
        assert p < base, spec
    # this trace's layers are single ops (conv2d#k): a checkpointed convolution keeps its
    # input, which is all it kept anyway, and its recomputation holds one layer's
    # activations again: checkpointing saves nothing here and the peak grows a little
    p, base = _peak(notes_of("checkpointing(layers=conv, every=2)"), "checkpointing")
    assert base <= p < 1.1 * base
    # a chain composes: the batch doubles the activations, offload then saves from that
    n = notes_of("batch(size=64)+offload")
    p_batch, base = _peak(n, "batch")
    p_off, _ = _peak(n, "offload")
    assert p_batch > base and p_off < p_batch
