import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from daydream.simulate.replay import replay
from daydream.transforms import Context, rewrite
from daydream.transforms.constants import CUDA_GRAPHS, DATALOADER, FUSED_OPTIMIZER
from daydream.transforms.devices import FAMILIES, family
from daydream.transforms.opts import dataloader as dl_mod
from daydream.transforms.opts import fused_optimizer as fo_mod
from daydream.transforms.primitives import Graph
from tests.transforms.conftest import A100, V100


def speedup(base, g2):
    return base.mean("simulated_ns") / replay(g2).mean("simulated_ns")


def T(tables):
    return pl.from_arrow(tables["task"])


def test_scale_kernels_half(graphs, baselines):
    g = graphs["v100"]
    g2 = rewrite(g, "scale(select=\"kind = 'kernel'\", factor=0.5)")
    t0, t1 = T(g), T(g2)
    k = (t0["kind"] == "kernel").to_numpy()
    assert np.array_equal(t1["dur_ns"].to_numpy()[k], np.rint(t0["dur_ns"].to_numpy()[k] * .5))
    assert np.array_equal(t1["dur_ns"].to_numpy()[~k], t0["dur_ns"].to_numpy()[~k])
    s = speedup(baselines["v100"], g2)
    assert 1.0 <= s <= 2.0


def test_amp_family():
    """The family rests on the GPU table (transforms.hardware): the name decides."""
    assert family(V100) == "v100" and family(A100) == "a100"
    assert family({"name": "NVIDIA H100 80GB HBM3", "computeMajor": 9}) == "h100"
    assert family({"name": "NVIDIA GeForce RTX 2080 Ti", "computeMajor": 7,
                   "computeMinor": 5}) == "turing"
    # an MI300X reports compute capability 9.4 like a Hopper part: the name decides
    assert family({"name": "AMD Instinct MI300X", "computeMajor": 9, "computeMinor": 4}) == (
        "mi300x")
    assert family(None) == "default"
    # every family the lookup can return stands for a part of the GPU table, and the figures
    # the models read of a GPU come from that table: the PCIe generation of every part that
    # gives one has its achieved bandwidth in offload's constants
    from daydream.transforms.devices import ARCHITECTURE_FAMILY, REFERENCE, gpu
    from daydream.transforms.hardware import DEVICES
    from daydream.transforms.opts.offload import OFFLOAD
    assert set(FAMILIES) == set(REFERENCE) and set(REFERENCE.values()) <= set(DEVICES)
    assert {d.pcie_gen for d in DEVICES.values()} - {None} <= set(OFFLOAD["pcie_gbps"])
    for f in FAMILIES:
        d = DEVICES[REFERENCE[f]]
        assert d.memory_gbps and d.pcie_gen and ARCHITECTURE_FAMILY[d.architecture] in (
            f, "v100")
    # a part's own figure, its family's reference part's where the table has none for it
    assert gpu({"name": "NVIDIA A100-SXM4-80GB"}, "memory_gbps").memory_gbps == 2039
    assert gpu({"name": "AMD Instinct MI250"}).pcie_gen is None
    assert gpu({"name": "AMD Instinct MI250"}, "pcie_gen").key == "mi300x"
    assert gpu({"name": "a GPU nobody knows"}).key == "v100-sxm2-32gb"


@pytest.mark.parametrize("key", ["v100", "a100"])
def test_fused_sgd(graphs, baselines, key):
    g = graphs[key]
    gr = Graph.from_tables(g)
    reg = fo_mod.step_regions(gr)
    assert reg.height == {"v100": 6, "a100": 3}[key]
    kern = [i for r in reg["kernels"] for i in r]
    apis = [i for r in reg["apis"] for i in r]
    g2 = rewrite(g, "fused_sgd")
    t1 = T(g2)
    assert t1.height == gr.n_tasks - len(kern) - len(apis) + 2 * reg.height
    fused = t1.filter(pl.col("name").str.starts_with("fused_sgd"))
    f = FUSED_OPTIMIZER["sgd"]["value"]
    assert fused["dur_ns"].to_list() == [max(round(s * f), FUSED_OPTIMIZER["min_kernel_ns"]
                                             ["value"]) for s in reg["kernel_ns"]]
    assert set(fused["phase"]) == {"weight_update"}
    # host time of the step is gone, zero_grad's kept
    wu0 = T(g).filter(pl.col("phase") == "weight_update", pl.col("kind") == "kernel")
    wu1 = t1.filter(pl.col("phase") == "weight_update", pl.col("kind") == "kernel")
    assert wu1["dur_ns"].sum() < wu0["dur_ns"].sum()
    hosts = [i for r in reg["hosts"] for i in r]
    assert hosts and T(g)["dur_ns"].gather(hosts).sum() > 0
    s = speedup(baselines[key], g2)
    if key == "a100":
        assert 1.0 < s < 1.5
    else:  # CPU-bound on the autograd thread's idle `<host>` tasks (see report)
        assert 0.99 < s < 1.5


def test_dataloader_factors(graphs):
    g = graphs["v100"]
    gr = Graph.from_tables(g)
    f = dl_mod.factors(gr, 4)
    assert f.height == 6
    t = T(g)
    for r in f.iter_rows(named=True):
        it = pl.from_arrow(g["iteration"]).filter(pl.col("iteration") == r["iteration"])
        load = t.filter(pl.col("kind") == "host", pl.col("phase") == "data_loading",
                        pl.col("iteration") == r["iteration"])["dur_ns"].sum()
        span = int(it["end_ns"][0] - it["start_ns"][0])
        assert load / span > 0.3  # ~35-40% of each step is data loading (num_workers=0)
        wait = max(0, load / 4 - (span - load)) + DATALOADER["ipc_ns"]["value"]
        assert r["factor"] == pytest.approx(min(1, wait / load))
    g2 = rewrite(g, "dataloader(workers=4)")
    t1 = T(g2)
    sel = ((t["kind"] == "host") & (t["phase"] == "data_loading")
           & t["iteration"].is_not_null()).to_numpy()
    fac = dict(zip(f["iteration"], f["factor"], strict=False))
    exp = np.rint(t["dur_ns"].to_numpy()[sel] * np.array([fac[i] for i in
                                                          t["iteration"].to_numpy()[sel]]))
    assert np.array_equal(t1["dur_ns"].to_numpy()[sel], exp)
    assert np.array_equal(t1["dur_ns"].to_numpy()[~sel], t["dur_ns"].to_numpy()[~sel])
    # one worker cannot hide loading slower than the step: unchanged when load > compute
    f1 = dl_mod.factors(gr, 1)
    assert (f1["factor"] < 1).all()


def test_dataloader_prediction(graphs, baselines):
    s = speedup(baselines["v100"], rewrite(graphs["v100"], "dataloader(workers=4)"))
    assert s > 1.3


def test_cuda_graphs(graphs, baselines):
    from daydream.transforms.opts.cuda_graphs import region_tasks
    g = graphs["v100"]
    gr = Graph.from_tables(g)
    sel = region_tasks(gr)
    # the numpy selection is the region as a Polars filter writes it
    assert sel.sum() > 100 and sel.tolist() == gr.task.select(
        pl.col("kind").is_in(["api", "host"]) & pl.col("phase").is_in(["forward", "backward"])
        & pl.col("iteration").is_not_null() & ~pl.col("blocking")).to_series().to_list()
    pairs = gr.task.filter(pl.Series(sel)).select("iteration", "unit_id").unique().height
    g2 = rewrite(g, "cuda_graphs", Context(device=V100))
    t1 = T(g2)
    # no blocking call inside the region: one graph per iteration and thread; per step one
    # static-input copy and the call that launches it
    assert t1.height == gr.n_tasks + pairs + 2 * 6
    gl = t1.filter(pl.col("name") == "cudaGraphLaunch")
    assert gl.height == pairs and set(gl["dur_ns"]) == {CUDA_GRAPHS["graph_launch_ns"]["value"]}
    # the step's inputs, 32 x 3 x 224 x 224 FP32 images and 32 int64 labels: 19,267,840
    # bytes read and written at 900 GB/s x 0.7 (V100): 61,168 ns
    cp = t1.filter(pl.col("name").str.starts_with("Memcpy DtoD (Device -> Device) static"))
    assert cp["bytes"].to_list() == [19_267_840] * 6
    assert cp["dur_ns"].to_list() == [61_168] * 6
    region = t1.filter(pl.col("kind").is_in(["api", "host"]), pl.col("phase").is_in(
        ["forward", "backward"]), pl.col("iteration").is_not_null(), ~pl.col("blocking"),
        pl.col("name") != "cudaGraphLaunch")
    assert region["dur_ns"].sum() == 0
    s = speedup(baselines["v100"], g2)
    assert 1.0 < s < 2.0


def _gpu_bound_toy():
    """Hand-made (an exact edge case): one GPU-bound step. Thread 1 copies 1.26 MB of inputs
    to the GPU (100 us) and launches a forward kernel F and a backward kernel B (200 us each),
    each call 5 us; the GPU runs them back to back."""
    from tests.transforms.test_distributed import EDGE, ITER, LAYER, TASK, UNIT, _table
    T_ = []

    def t(kind, unit, name, start, dur, phase, nbytes=None):
        T_.append({"task_id": len(T_), "kind": kind, "unit_id": unit, "name": name,
                   "phase": phase, "iteration": 0 if T_ else None, "start_ns": start,
                   "dur_ns": dur, "obs_dur_ns": dur, "bytes": nbytes, "blocking": False})
        return len(T_) - 1

    o = t("host", 0, "<trace start>", 0, 0, None)
    lc = t("api", 1, "cudaMemcpyAsync", 10_000, 5_000, "other")
    cp = t("memcpy", 2, "Memcpy HtoD (Pageable -> Device)", 20_000, 100_000, "other", 1_260_000)
    lf = t("api", 1, "cudaLaunchKernel", 15_000, 5_000, "forward")
    kf = t("kernel", 2, "fwd F", 120_000, 200_000, "forward")
    lb = t("api", 1, "cudaLaunchKernel", 20_000, 5_000, "backward")
    kb = t("kernel", 2, "bwd B", 320_000, 200_000, "backward")
    E = [(o, lc, "origin", "end_start", 10_000), (lc, lf, "thread", "end_start", 0),
         (lf, lb, "thread", "end_start", 0), (lc, cp, "launch", "start_start", 10_000),
         (lf, kf, "launch", "start_start", 10_000), (lb, kb, "launch", "start_start", 10_000),
         (cp, kf, "stream", "end_start", 0), (kf, kb, "stream", "end_start", 0)]
    edges = [{"src": s_, "dst": d, "kind": k, "anchor": a, "lag_ns": lag, "binding": True}
             for s_, d, k, a, lag in E]
    units = [{"unit_id": 0, "kind": "thread", "name": "origin", "policy": "fixed"},
             {"unit_id": 1, "kind": "thread", "pid": 1, "tid": 1, "name": "thread 1",
              "policy": "fixed"},
             {"unit_id": 2, "kind": "stream", "device": 0, "stream": 7, "name": "gpu 0 s 7",
              "policy": "fixed"}]
    return {"task": _table(T_, TASK), "edge": _table(edges, EDGE), "unit": _table(units, UNIT),
            "iteration": _table([{"iteration": 0, "label": "step", "source": "ProfilerStep",
                                  "start_ns": 10_000, "end_ns": 520_000}], ITER),
            "layer": _table([], LAYER)}


def test_cuda_graphs_predicts_a_slowdown_on_a_gpu_bound_step():
    """By hand: the GPU runs the input copy 20..120 us, F 120..320, B 320..520 us; the host
    calls are hidden behind it. With a graph the 10 us of forward/backward calls vanish (the
    GPU did not wait for them), a cudaGraphLaunch (10 us) is added, and the replay first
    copies the 1.26 MB of inputs into its static buffers: read and written at 900 GB/s x 0.7
    (the reference V100, no device given), 2 x 1,260,000 / 630 = 4,000 ns, between the copy
    from the host and F. B then ends at 524 us: 4 us slower. Without the static copy (the
    loader writes into the static buffers) the step is unchanged."""
    g = _gpu_bound_toy()
    base = replay(g).schedule
    kb = 6
    assert base.end_ns[kb] == 520_000
    notes = []
    g2 = rewrite(g, "cuda_graphs", Context(notes=notes))
    t2 = T(g2)
    cp = t2.filter(pl.col("name").str.starts_with("Memcpy DtoD"))
    assert cp["dur_ns"].to_list() == [4_000] and cp["bytes"].to_list() == [1_260_000]
    s2 = replay(g2).schedule
    b2 = t2.filter(pl.col("name") == "bwd B")["task_id"][0]
    assert s2.end_ns[b2] == 524_000
    assert any(n.startswith("cuda_graphs: 1 graph launches") for n in notes)
    g3 = rewrite(g, "cuda_graphs(static_inputs=false)")
    b3 = T(g3).filter(pl.col("name") == "bwd B")["task_id"][0]
    assert replay(g3).schedule.end_ns[b3] == 520_000


def test_cuda_graphs_a_blocking_call_ends_a_graph():
    """The toy with the backward's launch made a blocking call (an ``.item()`` between the
    passes, hand-made): the forward is one graph and what follows the sync another, so two
    cudaGraphLaunch calls; the blocking call keeps its cost."""
    from daydream.transforms.opts.cuda_graphs import region_tasks, segments
    g = _gpu_bound_toy()
    t = g["task"].to_pylist()
    t.insert(5, {**t[3], "task_id": None, "name": "cudaStreamSynchronize", "blocking": True,
                 "phase": "backward"})
    # renumber: a blocking call between the forward and the backward launch, on the thread
    for i, row in enumerate(t):
        row["task_id"] = i
    e = g["edge"].to_pylist()
    for row in e:  # ids at and after 5 shift by one
        row["src"] += row["src"] >= 5
        row["dst"] += row["dst"] >= 5
    e = [r for r in e if not (r["src"] == 3 and r["dst"] == 6)]
    e += [{"src": 3, "dst": 5, "kind": "thread", "anchor": "end_start", "lag_ns": 0,
           "binding": True},
          {"src": 5, "dst": 6, "kind": "thread", "anchor": "end_start", "lag_ns": 0,
           "binding": True}]
    g = {**g, "task": pa.Table.from_pylist(t, schema=g["task"].schema),
         "edge": pa.Table.from_pylist(e, schema=g["edge"].schema)}
    gr = Graph.from_tables(g)
    assert len(segments(gr, region_tasks(gr))) == 2
    t2 = T(rewrite(g, "cuda_graphs"))
    assert t2.filter(pl.col("name") == "cudaGraphLaunch").height == 2
    assert t2.filter(pl.col("name") == "cudaStreamSynchronize")["dur_ns"].to_list() == [5_000]


def test_chain(graphs, baselines):
    g2 = rewrite(graphs["a100"], "amp+fused_sgd", Context(device=A100))
    assert replay(g2).mean("simulated_ns") > 0


def test_fused_optimizer_reads_the_traces_optimizer(graphs):
    """The ResNet-50 traces run SGD (Optimizer.step#SGD.step): fused Adam is an error that
    names it; fused SGD applies."""
    from daydream.base.errors import DaydreamError
    with pytest.raises(DaydreamError, match=r"fused_adam: the trace runs SGD "
                       r"\(Optimizer.step#SGD.step\), not adam; ask for fused_sgd"):
        rewrite(graphs["v100"], "fused_adam")
    with pytest.raises(DaydreamError, match="runs SGD"):
        rewrite(graphs["a100"], "fused_optimizer(kind=adagrad)")
    assert fo_mod.trace_optimizer(Graph.from_tables(graphs["v100"])) == ("sgd", "SGD")


def test_every_optimization_has_a_spec_that_runs_it():
    """`make accuracy` asks every registered optimization of every trace: one whose parameters
    all have defaults by its name, one with a required parameter by the example it was
    registered with (and registering one without an example is an error)."""
    from daydream.transforms.registry import examples, opts, register
    ex = examples()
    assert set(ex) == set(opts())
    assert ex["amp"] == "amp" and ex["batch"] == "batch(size=64)"
    assert ex["gpu"] == "gpu(name=H100)"
    assert ex["scale"].startswith("scale(select=") and "factor=0.5" in ex["scale"]
    with pytest.raises(ValueError, match="example"):
        @register("needs_example_test")
        def needs(g, ctx, *, size: int):
            return g
