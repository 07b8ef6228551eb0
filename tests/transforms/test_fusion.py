import numpy as np
import polars as pl
import pytest

from daydream.base.errors import DaydreamError
from daydream.graphstore.schema import GPU_KINDS
from daydream.simulate.replay import replay
from daydream.transforms import Context, rewrite
from daydream.transforms.opts import fusion as fu_mod
from daydream.transforms.primitives import Graph


def T(tables):
    return pl.from_arrow(tables["task"])


def expected_chains(t: pl.DataFrame, max_chain: int, optimizer: bool = False
                    ) -> list[list[int]]:
    """Chains by a plain loop over each stream's GPU tasks in start order."""
    gpu = t.filter(pl.col("kind").is_in(GPU_KINDS), pl.col("task_id") > 0).sort("start_ns",
                                                                        "task_id")
    out = []
    for _u, s in gpu.group_by("unit_id"):
        rows = s.sort("start_ns", "task_id").iter_rows(named=True)
        cur: list[dict] = []
        for r in list(rows) + [None]:
            ew = (r is not None and r["kind"] == "kernel" and fu_mod.is_elementwise(r["name"])
                  and (optimizer or r["phase"] != "weight_update"))
            if ew and cur and (r["iteration"], r["phase"]) == (cur[-1]["iteration"],
                                                                cur[-1]["phase"]):
                cur.append(r)
                continue
            while cur:
                piece, cur = cur[:max_chain], cur[max_chain:]
                if len(piece) > 1:
                    out.append([p["task_id"] for p in piece])
            cur = [r] if ew else []
    return sorted(out)


def test_classes():
    ew = fu_mod.is_elementwise
    assert ew("void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>")
    assert ew("void at::native::unrolled_elementwise_kernel<at::native::MulFunctor<float>>")
    assert ew("void at::native::vectorized_elementwise_kernel<4, at::native::threshold_kernel_"
              "impl<float>>")
    assert ew("triton_poi_fused_gelu_0") and ew("add_kernel")
    assert not ew("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>")
    assert not ew("volta_scudnn_128x64_relu_interior_nn_v1")
    assert not ew("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<"
                  "at::native::direct_copy_kernel_cuda>>")
    assert not ew("void at::native::reduce_kernel<512, 1, ReduceOp<float, MeanOps>>")
    assert not ew("void cudnn::bn_fw_tr_1C11_singleread<float, 512, true, 1, 2, 0>")
    assert not ew("ncclKernel_AllReduce_RING_LL_Sum_float") and not ew(None)
    assert fu_mod.fused_ns([100, 100]) == 100  # 200 * 3/6 = 100
    assert fu_mod.fused_ns([100, 100, 100, 100]) == 167  # 400 * 5/12
    assert fu_mod.fused_ns([1000, 10]) == 1000  # never below the longest
    for v in fu_mod.FUSION.values():
        assert v["source"]


@pytest.mark.parametrize("max_chain", [8, 2])
def test_fusion_a100(graphs, baselines, max_chain):
    g = graphs["a100"]
    t0 = T(g)
    e0 = pl.from_arrow(g["edge"])
    cs = expected_chains(t0, max_chain)
    assert cs == fu_mod.chains(Graph.from_tables(g), max_chain)
    assert len(cs) > 100 and all(2 <= len(c) <= max_chain for c in cs)
    if max_chain == 8:
        assert max(len(c) for c in cs) > 2
    notes: list[str] = []
    g2 = rewrite(g, f"fusion(max_chain={max_chain})", Context(notes=notes))
    t1 = T(g2)
    e1 = pl.from_arrow(g2["edge"])
    n = t0.height
    rm_k = np.zeros(n, bool)
    for c in cs:
        rm_k[c[1:]] = True
    la = e0.filter(pl.col("kind") == "launch")
    rm_api = np.zeros(n, bool)
    rm_api[la.filter(pl.Series(rm_k[la["dst"].to_numpy()]))["src"].to_numpy()] = True
    # every launch call launched exactly one kernel here
    assert rm_api.sum() == rm_k.sum() == sum(len(c) - 1 for c in cs)
    rm = rm_k | rm_api
    assert t1.height == n - rm.sum()
    kept = t0.filter(pl.Series(~rm))
    cols = ["kind", "unit_id", "name", "phase", "iteration", "start_ns", "obs_dur_ns"]
    assert kept.select(cols).equals(t1.select(cols))
    # the launch calls of the removed kernels are gone; the others' launch edges kept
    assert (e1["kind"] == "launch").sum() == la.height - rm_k.sum()
    assert (t1["kind"] == "api").sum() == (t0["kind"] == "api").sum() - rm_api.sum()
    # the first kernel of each chain has the fused duration; nothing else changed
    newid = np.cumsum(~rm) - 1
    d0 = t0["dur_ns"].to_numpy()
    want = kept["dur_ns"].to_numpy().copy()
    for c in cs:
        k = len(c)
        d = [int(d0[i]) for i in c]
        want[newid[c[0]]] = max(max(d), int(round(sum(d) * (k + 1) / (3 * k))))
    got = t1["dur_ns"].to_numpy()
    assert np.array_equal(got, want)
    firsts = newid[[c[0] for c in cs]]
    assert (got[firsts] < d0[[c[0] for c in cs]] + np.array(
        [sum(d0[c[1:]]) for c in cs])).all()
    assert notes and f"{len(cs)} chains" in notes[-1]
    # each fused kernel still launched by its own call
    assert set(firsts.tolist()) <= set(e1.filter(pl.col("kind") == "launch")["dst"].to_list())
    base = baselines["a100"]
    s = base.mean("simulated_ns") / replay(g2).mean("simulated_ns")
    assert 1.0 <= s < 2.0


def test_fusion_bad_param(graphs):
    with pytest.raises(DaydreamError):
        rewrite(graphs["a100"], "fusion(max_chain=1)")


def test_fusion_leaves_the_optimizer_step_unless_asked(graphs):
    """The V100 ResNet-50 trace steps an unfused SGD: per-parameter element-wise kernels in
    weight_update. A compiled model leaves them alone; optimizer=true fuses them too."""
    g = graphs["v100"]
    t0 = T(g)
    phase = dict(zip(t0["task_id"].to_list(), t0["phase"].to_list(), strict=True))
    model = fu_mod.chains(Graph.from_tables(g), 8)
    both = fu_mod.chains(Graph.from_tables(g), 8, optimizer=True)
    assert model == expected_chains(t0, 8) and both == expected_chains(t0, 8, optimizer=True)
    assert not any(phase[c[0]] == "weight_update" for c in model)
    wu = [c for c in both if phase[c[0]] == "weight_update"]
    assert len(wu) > 10
    assert [c for c in both if phase[c[0]] != "weight_update"] == model
    d0 = t0["dur_ns"].sum()
    d_model = T(rewrite(g, "fusion"))["dur_ns"].sum()
    d_both = T(rewrite(g, "fusion(optimizer=true)"))["dur_ns"].sum()
    assert d_both < d_model < d0
