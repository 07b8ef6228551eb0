"""Restructured batch normalization (Jung et al., 'Restructuring Batch Normalization to
Accelerate CNN Training', MLSys 2019): BN split into a statistics sub-layer and a normalization
sub-layer (fission), the latter fused with the following ReLU and, in the full form, both
fused into the neighbouring convolutions (fusion), so that fewer passes go through DRAM."""

from __future__ import annotations

import re

import numpy as np

from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register

_JUNG = ("Jung et al., MLSys 2019, sec. 3-4: BN fission into sub-layers and fusion with the "
         "neighbouring ReLU and CONV layers, to cut main-memory passes")
_DAYDREAM = ("Zhu et al., Daydream, USENIX ATC 2020: modelled by selecting the BN and ReLU GPU "
             "tasks, removing those fused away and scaling the rest by the memory traffic they "
             "keep")
# Constants of the model, each with where it comes from ("estimate" = a modelling choice).
# BN and ReLU kernels are memory-bound, so their time is taken as proportional to the passes
# over activation-sized tensors they make.
BN_RESTRUCTURE = {
    "bn": {
        "value": r"bn_fw|bn_bw|batch_?norm|batchnorm",
        "source": "cuDNN BN kernel names (cudnn::bn_fw_tr_1C11_*, cudnn::bn_bw_1C11_*, "
                  "cudnnBatchNorm*) and PyTorch's native ones (batch_norm_collect_statistics"
                  "_kernel, batch_norm_transform_input_kernel, batch_norm_backward_*); "
                  "matched on the lower-cased kernel name",
    },
    "relu": {
        "value": r"elementwise.*(clamp_min|clamp_scalar|relu|threshold)|relu_kernel|"
                 r"threshold_kernel",
        "source": "PyTorch's element-wise ReLU kernels: relu_/clamp_min (forward, "
                  "clamp_min_scalar_kernel_impl or launch_clamp_scalar) and threshold_backward "
                  "(threshold_kernel_impl); convolution kernels with 'relu' in their name "
                  "(volta_scudnn_*_relu_*) are excluded",
    },
    "exclude": {"value": r"gemm|conv|scudnn|cutlass|xmma|winograd",
                "source": "GEMM/convolution kernels whose names mention relu"},
    "fwd_passes": {
        "value": {"bn": 3, "relu": 2, "restructured": 3, "conv_fused": 0},
        "source": _JUNG + "; " + _DAYDREAM + ". Forward: BN reads X for the statistics "
                  "and reads X / writes Y to normalize (3 passes); ReLU reads and writes Y "
                  "(2). Restructured, the normalization sub-layer applies the ReLU as it "
                  "writes: 3 passes, all in the BN kernel, the ReLU kernel gone. With conv "
                  "fusion the statistics are gathered by the preceding CONV as it writes X "
                  "and the normalization+ReLU is applied by the next CONV as it reads: 0 "
                  "passes of its own (a per-channel finalize kernel is left, see "
                  "min_kernel_ns)",
    },
    "bwd_passes": {
        "value": {"bn": 5, "relu": 3, "restructured": 5, "conv_fused": 3},
        "source": _JUNG + "; in-place activated BN (Rota Bulo et al., CVPR 2018) for the mask. "
                  "Backward: ReLU reads dY and Y and writes dX (3); BN reduces over dY and X "
                  "(2 reads), then reads dY and X and writes dX (3): 5. Restructured, BN derives "
                  "the ReLU mask from X and its statistics while it reads them: 5 passes, the "
                  "ReLU kernel gone. With conv fusion the reduction is gathered by the "
                  "backward CONV that writes dY: 3",
    },
    "min_kernel_ns": {"value": 2000, "source": "estimate, as AMP min_kernel_ns: the shortest "
                      "kernel (launch/latency-bound), here the per-channel finalize left of a "
                      "BN fused into its convolutions"},
}
_BN = re.compile(BN_RESTRUCTURE["bn"]["value"])
_RELU = re.compile(BN_RESTRUCTURE["relu"]["value"])
_EXCL = re.compile(BN_RESTRUCTURE["exclude"]["value"])


def is_bn(name: str | None) -> bool:
    return bool(name) and bool(_BN.search(name.lower()))


def is_relu(name: str | None) -> bool:
    if not name:
        return False
    low = name.lower()
    return bool(_RELU.search(low)) and not _EXCL.search(low) and not _BN.search(low)


def _same(j: int, i: int, bn: np.ndarray, it: list, ph: list) -> bool:
    """Task j is a BN kernel of task i's iteration and phase."""
    return bool(bn[j]) and it[j] == it[i] and ph[j] == ph[i]


def pairs(g: Graph) -> tuple[list[tuple[list[int], int]], list[tuple[int, list[int]]]]:
    """Forward (BN kernels, ReLU kernel) and backward (ReLU kernel, BN kernels) pairs: a ReLU
    kernel right after a run of BN kernels on its stream in the forward phase, and a ReLU
    kernel right before a run of BN kernels in the backward phase (no other GPU task between,
    one iteration)."""
    t = g.task
    kind = t["kind"].to_numpy()
    name = t["name"].to_list()
    ph = t["phase"].to_list()
    it = t["iteration"].to_list()
    k = kind == "kernel"
    bn = np.array([k[i] and is_bn(n) for i, n in enumerate(name)])
    relu = np.array([k[i] and is_relu(n) for i, n in enumerate(name)])
    fwd, bwd = [], []
    for ids in g.gpu_streams():
        for p, i in enumerate(ids):
            if not relu[i] or it[i] is None:
                continue
            if ph[i] == "forward":
                run = []
                q = p - 1
                while q >= 0 and _same(ids[q], i, bn, it, ph):
                    run.insert(0, ids[q])
                    q -= 1
                if run:
                    fwd.append((run, i))
            elif ph[i] == "backward":
                run = []
                q = p + 1
                while q < len(ids) and _same(ids[q], i, bn, it, ph):
                    run.append(ids[q])
                    q += 1
                if run:
                    bwd.append((i, run))
    return sorted(fwd, key=lambda x: x[1]), sorted(bwd)


@register("bn_restructure", shrinks=True)
def bn_restructure(g: Graph, ctx: Context, *, conv_fusion: bool = False) -> Graph:
    """Restructured batch normalization (Jung et al.): BN+ReLU passes fused, fewer DRAM passes.

    BN and ReLU kernels are found by name (BN_RESTRUCTURE in transforms.opts.bn_restructure);
    a forward ReLU kernel right after BN kernels on its stream, and a backward (threshold)
    ReLU kernel right before BN backward kernels, is fused into the BN: the ReLU kernel and its
    launch call are removed (predecessors rewired to successors) and the BN kernels keep their
    time (the restructured normalization applies the ReLU, or derives its mask, in the passes
    it already makes). ReLUs after a residual add are not next to a BN and stay. With
    CONV_FUSION (Jung et al.'s full form, as cuDNN's fused conv+scale/bias/ReLU+BN-statistics
    kernels do it), the BN passes move into the neighbouring convolutions too: paired forward
    BN kernels shrink to min_kernel_ns and backward ones to 3/5 of their time (the passes
    counted in BN_RESTRUCTURE fwd_passes/bwd_passes); the convolutions keep theirs."""
    fwd, bwd = pairs(g)
    if not fwd and not bwd:
        ctx.notes.append("bn_restructure: no BN kernel next to a ReLU kernel; unchanged")
        return g
    n = g.n_tasks
    rm = np.zeros(n, bool)
    for _, r in fwd:
        rm[r] = True
    for r, _ in bwd:
        rm[r] = True
    dur = g.task["dur_ns"].to_numpy()
    saved = int(dur[rm].sum())
    if conv_fusion:
        fp, bp = BN_RESTRUCTURE["fwd_passes"]["value"], BN_RESTRUCTURE["bwd_passes"]["value"]
        floor = BN_RESTRUCTURE["min_kernel_ns"]["value"]
        new = dur.copy()
        fb = sorted({b for bs, _ in fwd for b in bs})
        bb = sorted({b for _, bs in bwd for b in bs})
        new[fb] = np.minimum(dur[fb], np.maximum(np.rint(dur[fb] * fp["conv_fused"] / fp[
            "restructured"]), floor)).astype(np.int64)
        new[bb] = np.maximum(np.rint(dur[bb] * bp["conv_fused"] / bp["restructured"]),
                             np.minimum(dur[bb], floor)).astype(np.int64)
        saved += int((dur - new).sum())
        g = g.set_duration(np.ones(n, bool), new)
    g = g.remove(g.with_launches(rm))
    ctx.notes.append(f"bn_restructure: {len(fwd)} forward and {len(bwd)} backward BN+ReLU "
                     f"pairs fused{' (and into the convolutions)' if conv_fusion else ''}; "
                     f"GPU time {saved / 1e6:.2f} ms less over the trace")
    return g
