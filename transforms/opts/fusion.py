"""Element-wise kernel fusion (torch.compile/TorchInductor, XLA, TVM, MetaFlow style)."""

from __future__ import annotations

import re

import numpy as np

from daydream.base.errors import DaydreamError
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register

# Constants of the model, each with where it comes from ("estimate" = a modelling choice).
FUSION = {
    "elementwise": {
        "value": (r"elementwise_kernel|elementwise|add_kernel|mul_kernel|relu|gelu|silu|"
                  r"sigmoid|tanh|threshold|functor|clamp|hardswish|leaky|elu_kernel"),
        "source": "PyTorch ATen CUDA kernel names (at::native::vectorized_elementwise_kernel, "
                  "unrolled_elementwise_kernel, elementwise_kernel with the op's functor: "
                  "AddFunctor, MulScalarFunctor, threshold_kernel_impl, clamp, activations); "
                  "the pointwise ops TorchInductor fuses (Ansel et al., PyTorch 2, ASPLOS "
                  "2024). Matched on the lower-cased kernel name.",
    },
    "exclude": {
        "value": (r"gemm|conv|cudnn|cutlass|xmma|reduce|norm|softmax|copy|nccl|"
                  r"multi_tensor_apply|welford|pool|scatter|gather|index|cat_|embedding|"
                  r"upsample|cross_entropy|nll_loss|dropout|nchwtonhwc|nhwctonchw"),
        "source": "estimate: kernels that are not pointwise (GEMM/conv, reductions, "
                  "normalization, softmax, layout copies, collectives, optimizer "
                  "multi-tensor kernels, indexing/pooling) are not fused into an element-wise "
                  "chain by TorchInductor's pointwise fusion or MetaFlow's element-wise rules; "
                  "checked after 'elementwise' and wins over it.",
    },
    "passes_per_op": {
        "value": 3,
        "source": "estimate: element-wise kernels are memory-bound (Daydream, Zhu et al., "
                  "USENIX ATC 2020; Williams et al. roofline), so their time is proportional "
                  "to the tensor passes through DRAM. An average element-wise op in a chain "
                  "makes 3 passes (binary op: two reads and one write), k unfused ops 3k.",
    },
    "fused_passes": {
        "value": "k + 1",
        "source": "estimate: the fused kernel keeps only the tensors crossing its boundary: "
                  "one external operand per op on average (unary ops none, binary ops one, "
                  "the first op its input) and the one final write, k + 1 passes; the "
                  "intermediates stay in registers (TVM, Chen et al., OSDI 2018; MetaFlow, Jia "
                  "et al., SysML 2019; TorchInductor). Fused time = total * (k + 1) / (3k), "
                  "never below the chain's longest kernel (a fused kernel does at least the "
                  "work of its biggest op).",
    },
}
_EW = re.compile(FUSION["elementwise"]["value"])
_EXCL = re.compile(FUSION["exclude"]["value"])


def is_elementwise(name: str | None) -> bool:
    """Whether a kernel name is an element-wise (pointwise) kernel fusion can merge."""
    if not name:
        return False
    low = name.lower()
    return bool(_EW.search(low)) and not _EXCL.search(low)


def fused_ns(durs: list[int]) -> int:
    """Duration of one kernel fusing a chain of k element-wise kernels of durations DURS."""
    k = len(durs)
    p = FUSION["passes_per_op"]["value"]
    return max(max(durs), int(round(sum(durs) * (k + 1) / (p * k))))


def chains(g: Graph, max_chain: int = 8, optimizer: bool = False) -> list[list[int]]:
    """Task ids of each chain to fuse: runs of >= 2 element-wise kernels adjacent on their
    stream (no other GPU task between), in one iteration and phase, cut into pieces of at most
    MAX_CHAIN kernels (pieces of one kernel are left alone). Kernels of the weight update
    count only with OPTIMIZER (a compiled model leaves the optimizer step eager)."""
    t = g.task
    kind = t["kind"].to_numpy()
    name = t["name"].to_list()
    it = t["iteration"].to_list()
    ph = t["phase"].to_list()
    ew = np.array([k == "kernel" and is_elementwise(n) and (optimizer or p != "weight_update")
                   for k, n, p in zip(kind, name, ph, strict=True)])
    out: list[list[int]] = []
    for ids in g.gpu_streams():
        run: list[int] = []
        for i in ids + [-1]:
            if i >= 0 and ew[i] and run and it[i] == it[run[-1]] and ph[i] == ph[run[-1]]:
                run.append(i)
                continue
            for j in range(0, len(run), max_chain):
                piece = run[j:j + max_chain]
                if len(piece) >= 2:
                    out.append(piece)
            run = [i] if i >= 0 and ew[i] else []
    return sorted(out)


@register("fusion", removes_cpu=True, shrinks=True)
def fusion(g: Graph, ctx: Context, *, max_chain: int = 8, optimizer: bool = False) -> Graph:
    """Element-wise kernel fusion: chains of adjacent element-wise kernels become one kernel.

    On each GPU stream, maximal runs of element-wise kernels (name patterns in
    transforms.opts.fusion.FUSION: vectorized/unrolled elementwise_kernel, add/mul, activation
    and threshold kernels; not GEMM/conv, reductions, norms, softmax, copies or collectives)
    with no other GPU task between them and in one iteration and phase are cut into chains of
    at most MAX_CHAIN kernels, as torch.compile/TorchInductor or MetaFlow would fuse them. Each
    chain of k >= 2 kernels keeps its first kernel, which lasts
    max(longest, total * (k + 1) / (3k)) (memory-traffic estimate, see FUSION), and loses the
    others together with their launch calls (predecessors rewired to successors). The weight
    update's kernels are left alone unless OPTIMIZER: `torch.compile(model)` compiles the
    model, not the optimizer step (use fused_adam and friends for that, or optimizer=true for
    a compiled step)."""
    if max_chain < 2:
        raise DaydreamError(f"fusion: max_chain must be >= 2, got {max_chain}")
    cs = chains(g, max_chain, optimizer)
    if not cs:
        ctx.notes.append("fusion: no chains of adjacent element-wise kernels; unchanged")
        return g
    n = g.n_tasks
    dur = g.task["dur_ns"].to_numpy()
    new = dur.copy()
    first = np.zeros(n, bool)
    rm = np.zeros(n, bool)
    for c in cs:
        first[c[0]] = True
        new[c[0]] = fused_ns([int(dur[i]) for i in c])
        rm[c[1:]] = True
    rm = g.with_launches(rm)
    before = int(dur[first].sum() + dur[rm & (g.task["kind"] == "kernel").to_numpy()].sum())
    g = g.set_duration(first, new)
    g = g.remove(rm)
    k = sum(len(c) for c in cs)
    ctx.notes.append(f"fusion: {len(cs)} chains of {k} element-wise kernels fused into "
                     f"{len(cs)} ({k - len(cs)} kernels and their launch calls removed); "
                     f"kernel time {before / 1e6:.3f} -> {new[first].sum() / 1e6:.3f} ms")
    return g
