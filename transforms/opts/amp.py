"""Automatic mixed precision (torch.autocast + GradScaler), from the kernels, the ops and the
device.

Outline (``amp``):

1. the device: the GPU table's entry for the trace's device (``transforms.hardware``: the name
   decides, so an MI300X is an MI300X), else the architecture its kernel names spell
   (``volta_sgemm`` ...), else ``amp(gpu=NAME)``;
2. what the trace computes in (``transforms.kernel_class.kernel_precision``): a trace whose matrix
   kernels already run mostly in FP16/BF16/FP8, or that runs GradScaler's kernels, is left
   unchanged with a note;
3. what autocast does to each kernel (``transforms.kernel_class.autocast_policy``) from the op that
   launched it (its profiler ranges, outermost listed op first): ops on autocast's float16
   list and their backward run in FP16; ops on its float32 list stay FP32; parameters,
   gradients and the optimizer stay FP32; every other op runs in the type of its input, taken
   as that of the last listed op before it on its thread. Without op ranges, the kernels'
   own classes stand in (matrix kernels FP16, softmax/norm/loss kernels FP32);
4. each converted kernel scaled by the roofline of its architecture (``speedup``): its
   fixed cost ``t0`` is kept and its work ``t - t0`` shrinks by the ratio of its roofline times
   ``max(F / P_old, B / BW) / max(F / P_new, B' / BW)``: the fraction of its roofline it
   achieved in the trace is carried over. F and B come from the op's recorded shapes; P_old is
   the peak of the precision it ran in (FP32 on CUDA cores, or TF32), P_new the FP16 (BF16)
   tensor peak, B' = B / 2 (16-bit operands), BW the memory bandwidth, every figure from the
   GPU table. Without shapes, a matrix kernel's arithmetic intensity F / B is unknown: its
   class's work-weighted distribution of intensities measured on a calibration trace with
   shapes (constants.AMP_INTENSITY) gives the expected ratio on this device. Bandwidth-bound
   kernels moving FP32 data that autocast turns into FP16 move half the bytes (ratio 2);
5. autocast's weight casts (one FP32 -> FP16 copy per weighted op in forward, its FP16 -> FP32
   gradient copy in backward) and GradScaler as torch runs it: ``scale(loss)`` (one scalar
   multiply before backward), ``unscale_`` (``_amp_foreach_non_finite_check_and_unscale_``, one
   pass reading and writing every gradient), the host's read of ``found_inf`` (a 4-byte
   device-to-host copy and a stream synchronize: the host waits for the GPU there, which the
   graph's sync edge makes cost only its wait), then ``update`` (``_amp_update_scale_``).
"""

from __future__ import annotations

import math
import re

import numpy as np
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from daydream.base.columns import is_in
from daydream.base.errors import DaydreamError
from daydream.graphstore.latency import LATENCY
from daydream.transforms import hardware, memory
from daydream.transforms.constants import (
    AMP,
    AMP_INTENSITY,
    AMP_TRANSPOSE,
    FUSED_OPTIMIZER_PASSES,
)
from daydream.transforms.kernel_class import (
    KernelPrecision,
    autocast_policy,
    kernel_precision,
    op_kind,
)
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register
from daydream.transforms.work import ranges_of

# the table's device that stands for an architecture a kernel name spells (cuBLAS/cuDNN
# prefixes), used when the trace records no device
ARCH_DEVICE = (("volta", "v100-sxm2-32gb"), ("turing", "rtx-2080-ti"),
               ("ampere", "a100-sxm4-80gb"), ("sm80", "a100-sxm4-80gb"),
               ("hopper", "h100-sxm"), ("sm90", "h100-sxm"))
# cuBLAS/cuDNN name their kernels' architecture; CUTLASS its SM (cutlass_80_tensorop_...)
_ARCH_RE = re.compile(r"(?:^|_)(volta|turing|ampere|hopper|sm80|sm90)_|cutlass_(70|75|80|90)_")
_CUTLASS_SM = {"70": "volta", "75": "turing", "80": "sm80", "90": "sm90"}
DTYPES = {"fp16": "fp16_tflops", "bf16": "bf16_tflops"}
OLD_PEAK = {"fp32": "fp32_tflops", "tf32": "tf32_tflops"}
PHASES = ("forward", "backward")


# ---- 1. the device ---------------------------------------------------------------------------

def amp_device(ctx: Context, names: list[str], gpu: str = "") -> tuple[hardware.Device, str]:
    """The GPU the model takes its peaks from, and how it was found."""
    if gpu:
        return hardware.device(gpu), f"amp(gpu={gpu})"
    dev = hardware.device_from_properties(ctx.device)
    if dev is not None:
        return dev, f"the trace's device {ctx.device.get('name')!r}"
    seen = {}
    for n in names:
        m = _ARCH_RE.search((n or "").lower())
        if m:
            arch = m.group(1) or _CUTLASS_SM[m.group(2)]
            seen[arch] = seen.get(arch, 0) + 1
    if seen:
        arch = max(seen, key=seen.get)
        key = dict(ARCH_DEVICE)[arch]
        return hardware.DEVICES[key], (f"no device in the trace; its kernel names are "
                                       f"{arch} kernels: {hardware.DEVICES[key].name} assumed")
    what = (f"its device {ctx.device.get('name')!r} is not in the GPU table" if ctx.device
            else "it records no device")
    raise DaydreamError(f"amp: {what} and its kernel names name no GPU architecture; give the "
                        "GPU: amp(gpu=V100) (names as in transforms/hardware.py, e.g. A100, "
                        "H100, MI300X, 2080ti)")


def peaks(dev: hardware.Device, dtype: str) -> dict[str, float]:
    """Peaks the model needs (FLOP/s, bytes/s), from the GPU table; a clear error where the
    device lacks one."""
    new = getattr(dev, DTYPES[dtype])
    if new is None:
        raise DaydreamError(f"amp: {dev.name} has no {dtype.upper()} tensor/matrix rate in the "
                            f"GPU table ({dev.source(DTYPES[dtype])}); try amp(dtype=fp16)")
    if dev.fp32_tflops is None or dev.memory_gbps is None:
        raise DaydreamError(f"amp: the GPU table has no FP32 peak or memory bandwidth for "
                            f"{dev.name}")
    out = {"fp32": dev.fp32_tflops * 1e12, "new": new * 1e12, "bw": dev.memory_gbps * 1e9}
    # TF32 kernels only run where the device has TF32; a TF32 name on a device without it
    # (amp(gpu=...) on another GPU) is taken at the FP32 rate
    out["tf32"] = (dev.tf32_tflops or dev.fp32_tflops) * 1e12
    return out


# ---- 4. the roofline -------------------------------------------------------------------------

def roofline_ratio(flops, nbytes, p_old: float, p_new: float, bw: float,
                   byte_ratio: float = 0.5):
    """Old roofline time over new: ``max(F/p_old, B/bw) / max(F/p_new, byte_ratio*B/bw)``
    (arrays or scalars; FLOP/s and bytes/s). The kernel's achieved fraction of its roofline
    is the same before and after, so it cancels."""
    f = np.asarray(flops, np.float64)
    b = np.asarray(nbytes, np.float64)
    old = np.maximum(f / p_old, b / bw)
    new = np.maximum(f / p_new, byte_ratio * b / bw)
    return np.where(new > 0, old / np.where(new > 0, new, 1.0), 1.0)


def class_ratio(op: str, p_old: float, p_new: float, bw: float) -> float:
    """The expected roofline ratio of a matrix kernel of class OP (conv, gemm, attention)
    whose shapes are unknown: the harmonic mean, weighted by work time, of the ratios of a
    calibration workload's intensities (constants.AMP_INTENSITY) on this device."""
    hist = AMP_INTENSITY[op if op in AMP_INTENSITY else "gemm"]["value"]
    ai = np.array([a for a, _ in hist], np.float64)
    share = np.array([s for _, s in hist], np.float64)
    r = roofline_ratio(ai, np.ones_like(ai), p_old, p_new, bw)
    return float(share.sum() / np.sum(share / r))


def speedup(dur_ns: np.ndarray, ratio: np.ndarray, t0_ns: float) -> np.ndarray:
    """New durations: the fixed cost t0 kept, the work ``dur - t0`` divided by RATIO."""
    d = dur_ns.astype(np.float64)
    work = np.maximum(d - t0_ns, 0.0)
    return np.rint(np.minimum(d, d - work + work / np.maximum(ratio, 1.0))).astype(np.int64)


# ---- op shapes: FLOPs and bytes of a matrix op ------------------------------------------------

_CONV_FWD = re.compile(r"(^|::)(cudnn_convolution|miopen_convolution|_convolution|convolution|"
                       r"conv[123]d|conv_transpose[123]d)$")
_CONV_BWD = re.compile(r"(^|::)(convolution_backward|cudnn_convolution_backward|"
                       r"miopen_convolution_backward)$")
_GEMM_OPS = re.compile(r"(^|::)(addmm|mm|bmm|baddbmm|linear|matmul|addbmm)$")


def _tensors(dims) -> list[list[int]]:
    return [d for d in dims if isinstance(d, list) and d and all(isinstance(x, int) for x in d)]


def _prod(xs) -> int:
    return int(math.prod(xs)) if xs else 0


def op_work(name: str, dims_json: str | None, out_dims: list[int] | None = None
            ) -> tuple[float, float, int] | None:
    """(FLOPs of one pass, FP32 bytes, passes) of a matrix op from its recorded input shapes,
    else None. Convolutions: 2 N K P Q (C/g) R S FLOPs, input + weight + output bytes; the
    output's spatial size is OUT_DIMS' (the next op's input) where given, else the input's.
    ``convolution_backward`` makes two passes (data and weight gradient). GEMMs: 2 M N K
    (batched: times the batch), A + B + C bytes."""
    if not dims_json:
        return None
    try:
        dims = orjson.loads(dims_json)
    except orjson.JSONDecodeError:
        return None
    low = name.lower()
    ts = _tensors(dims)
    if _CONV_BWD.search(low) and len(ts) >= 3:
        go, x, w = ts[0], ts[1], ts[2]
        if len(go) < 3 or len(x) < 3 or len(w) < 3:
            return None
        f = 2.0 * _prod(go) * _prod(w[1:])
        return f, 4.0 * (_prod(go) + _prod(x) + _prod(w)), 2
    if _CONV_FWD.search(low) and len(ts) >= 2:
        x, w = ts[0], ts[1]
        if len(x) < 3 or len(w) != len(x):
            return None
        n, k = x[0], w[0]
        spatial = x[2:]
        if out_dims and len(out_dims) == len(x) and out_dims[0] == n and out_dims[1] == k:
            spatial = out_dims[2:]
        out = n * k * _prod(spatial)
        return 2.0 * out * _prod(w[1:]), 4.0 * (_prod(x) + _prod(w) + out), 1
    if _GEMM_OPS.search(low):
        op = low.rsplit("::", 1)[-1]
        if op in ("addmm", "baddbmm", "addbmm") and len(ts) >= 3:
            a, b = ts[1], ts[2]
        elif op == "linear" and len(ts) >= 2:
            x, w = ts[0], ts[1]
            if len(w) != 2 or x[-1] != w[1]:
                return None
            m = _prod(x[:-1])
            return 2.0 * m * w[0] * w[1], 4.0 * (_prod(x) + _prod(w) + m * w[0]), 1
        elif len(ts) >= 2:
            a, b = ts[0], ts[1]
        else:
            return None
        if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
            return None
        batch = max(_prod(a[:-2]) if len(a) > 2 else 1, _prod(b[:-2]) if len(b) > 2 else 1)
        m, kk, n = a[-2], a[-1], b[-1]
        return (2.0 * batch * m * n * kk,
                4.0 * (_prod(a) + _prod(b) + batch * m * n), 1)
    return None


# ---- 3. what autocast does to each kernel ------------------------------------------------------

class Ops:
    """The trace's op ranges (the ``range`` activity table): each range's name, parent,
    shapes, and the next op's input shape on its thread (a convolution's output)."""

    def __init__(self, ranges: pa.Table | None):
        self.ok = ranges is not None and ranges.num_rows > 0
        if not self.ok:
            return
        # in Arrow (a small trace's ranges are a few rows: Polars calls cost more), the frame
        # out_dims reads made from it when first asked
        cols = [c for c in ("range_id", "tid", "name", "parent", "start_ns", "dur_ns",
                            "input_dims", "input_types") if c in ranges.column_names]
        # the op and annotation ranges (kinds tested once per distinct kind), their names
        # decoded after the filter: only the rows kept leave Arrow
        kind = ranges["kind"]
        r = ranges.select(cols).filter(is_in(kind, ("cpu_op", "user_annotation")))
        if not pa.types.is_string(r.schema.field("name").type):
            i = r.schema.get_field_index("name")
            r = r.set_column(i, "name", r["name"].cast(pa.string()))
        if "input_dims" not in r.column_names:
            r = r.append_column("input_dims", pa.nulls(r.num_rows, pa.string()))
        # op ranges say what autocast would do only where they name aten ops (an Nsight
        # export's NVTX ranges do not)
        self.ok = bool(is_in(kind, ("cpu_op",)).any())
        self._ids = r["range_id"].to_pylist()
        self.name = dict(zip(self._ids, r["name"].to_pylist(), strict=True))
        self.parent = dict(zip(self._ids, r["parent"].to_pylist(), strict=True))
        self.has_shapes = r["input_dims"].null_count < r.num_rows
        self._dims: dict[int, str | None] | None = None
        self._arrow = r
        self._policy: dict[int, tuple[str | None, int | None]] = {}
        self._next: dict[int, list[int] | None] | None = None

    @property
    def dims(self) -> dict[int, str | None]:
        """Each op range's recorded input shapes (JSON text), decoded when first asked for:
        only a trace with shapes and matrix kernels reads them."""
        if self._dims is None:
            self._dims = dict(zip(self._ids, self._arrow["input_dims"].to_pylist(),
                                  strict=True))
        return self._dims

    def chain(self, rid: int | None) -> list[int]:
        """The range and its ancestors, innermost first (op ranges only)."""
        out = []
        while rid is not None and rid in self.name and len(out) < 64:
            out.append(rid)
            rid = self.parent.get(rid)
        return out

    def policy(self, rid: int | None) -> tuple[str | None, int | None]:
        """(autocast policy, the op range that decided it) of a launch in range RID: the
        outermost listed op of its ancestry decides (autocast acts where the op is called)."""
        if rid is None:
            return None, None
        if rid not in self._policy:
            pol, by = None, None
            for a in reversed(self.chain(rid)):
                p = autocast_policy(self.name[a])
                if p is not None:
                    pol, by = p, a
                    break
            self._policy[rid] = (pol, by)
        return self._policy[rid]

    def shape_op(self, rid: int | None) -> int | None:
        """The innermost ancestor of RID whose shapes op_work can read (a conv/GEMM op)."""
        for a in self.chain(rid):
            n = self.name[a].lower()
            if (self.dims.get(a) and (_CONV_FWD.search(n) or _CONV_BWD.search(n)
                                      or _GEMM_OPS.search(n))):
                return a
        return None

    def out_dims(self, rid: int) -> list[int] | None:
        """The first input shape of the first later op on the thread whose first input is
        4-d or more: a convolution's output as the next op (batch norm, ReLU) sees it."""
        if self._next is None:
            self._next = {}
            self._by_tid = {}
            ops = pl.from_arrow(self._arrow)
            r = ops.filter(pl.col("input_dims").is_not_null()).sort("tid", "start_ns")
            for (tid,), grp in r.group_by(["tid"], maintain_order=True):
                self._by_tid[tid] = (grp["start_ns"].to_numpy(), grp["input_dims"].to_list())
            self._end = dict(zip(ops["range_id"].to_list(),
                                 zip(ops["tid"].to_list(),
                                     (ops["start_ns"] + ops["dur_ns"]).to_list(),
                                     strict=True), strict=True))
        if rid in self._next:
            return self._next[rid]
        out = None
        if rid in self._end:
            tid, end = self._end[rid]
            starts, dims = self._by_tid.get(tid, (np.empty(0, np.int64), []))
            lo = int(np.searchsorted(starts, end, "left"))
            for j in range(lo, min(lo + 20, len(dims))):
                try:
                    d = _tensors(orjson.loads(dims[j]))
                except orjson.JSONDecodeError:
                    d = []
                if d and len(d[0]) >= 4:
                    out = d[0]
                    break
        self._next[rid] = out
        return out


# kernel names whose op autocast runs in FP32, for traces without op ranges
_FP32_KERNEL_RE = re.compile(r"softmax|layer_norm|layernorm|group_norm|nll_loss|cross_entropy|"
                             r"log_softmax|cunn_softmax|mse|exp_kernel|log_kernel|pow_")


def kernel_dtypes(g: Graph, kern: pl.DataFrame, prec: list[KernelPrecision], ops: Ops,
                  launches: tuple[dict[int, int], dict[int, int]] | None = None
                  ) -> tuple[list[str], list[int | None]]:
    """Per kernel of KERN: the dtype autocast gives it (``reduced``, ``fp32`` or ``keep``) and
    the op range that launched it (None without ranges). ``keep``: not autocast's business
    (parameters, gradients, optimizer, integer or FP64 data). LAUNCHES: ``_launches(g)``
    where the caller has it."""
    launch, _ = _launches(g) if launches is None else launches
    rid_of = g.values("range_id")  # by task id (ids are positions)
    unit_of = g.array("unit_id")
    start_of = g.array("start_ns")
    ids = kern["id"].to_list()
    api = [launch.get(i) for i in ids]
    kname = kern["name"].to_list()
    # program order of the launching calls, per thread (the stream's for unlaunched kernels):
    # a stable sort by (thread, start), ties in kernel order (numpy's lexsort; a Python sort
    # with a key function per kernel cost 0.3 ms of a DLRM rank's 3k kernels)
    launched = np.array([a is not None for a in api], bool)
    # the task each kernel is ordered by: its launching call, else the kernel itself
    owner = np.where(launched, [-1 if a is None else a for a in api], ids).astype(np.int64)
    unit_key = np.where(launched, unit_of[owner], -1 - unit_of[owner])
    order = np.lexsort((start_of[owner], unit_key)).tolist()
    dtype = ["keep"] * len(ids)
    op_rid: list[int | None] = [None] * len(ids)
    last: dict[int, str] = {}
    for j in order:
        p = prec[j]
        key = int(unit_key[j])
        if ops.ok and api[j] is not None:
            rid = rid_of[api[j]]
            pol, by = ops.policy(rid)
            op_rid[j] = rid
        else:  # the kernel's own class stands in for its op
            low = (kname[j] or "").lower()
            pol = ("lower" if p.math else "fp32" if _FP32_KERNEL_RE.search(low) else None)
        if pol == "param":
            dtype[j] = "keep"
            continue
        if pol == "lower":
            d = "reduced"
        elif pol == "fp32":
            d = "fp32"
        else:
            d = last.get(key, "fp32")
        if pol in ("lower", "fp32"):
            last[key] = d
        if p.precision in ("int", "fp64") or p.op == "comm":
            d = "keep"
        dtype[j] = d
    return dtype, op_rid


def op_class(ops: Ops, rid: int | None, p: KernelPrecision) -> str:
    """conv or gemm: the class of a matrix kernel's op where its ranges name one (cuDNN runs
    1x1 convolutions as sgemm kernels: ``transforms.kernel_class.op_kind``), else its name's."""
    if ops.ok and rid is not None:
        for a in ops.chain(rid):
            kind = op_kind(ops.name[a])
            if kind is not None:
                return kind
    return "conv" if p.op == "conv" else "gemm"


def matrix_work(kern: pl.DataFrame, prec: list[KernelPrecision], ops: Ops,
                op_rid: list[int | None]) -> list[tuple[float, float, int] | None]:
    """Per kernel of KERN: (FLOPs, FP32 bytes, passes) of its op where it is a matrix kernel
    whose op's shapes are recorded (``op_work``), else None."""
    out: list[tuple[float, float, int] | None] = [None] * kern.height
    if not (ops.ok and ops.has_shapes):
        return out
    for j, p in enumerate(prec):
        if not p.math:
            continue
        sop = ops.shape_op(op_rid[j])
        if sop is None:
            continue
        name = ops.name[sop]
        out_dims = ops.out_dims(sop) if _CONV_FWD.search(name.lower()) else None
        out[j] = op_work(name, ops.dims[sop], out_dims)
    return out


def conv_kernels(prec: list[KernelPrecision], dt: list[str], region: np.ndarray, ops: Ops,
                 op_rid: list[int | None]) -> list[int]:
    """Positions in KERN of the convolution kernels autocast lowers from FP32 (or TF32) to a
    16-bit tensor-core convolution: those whose layout NCHW makes cuDNN transpose."""
    return [j for j, p in enumerate(prec)
            if region[j] and dt[j] == "reduced" and p.math and not p.reduced
            and p.precision in OLD_PEAK and op_class(ops, op_rid[j], p) == "conv"]


def conv_pass(ops: Ops, rid: int | None, phase: str | None) -> str:
    """forward or backward: the pass of a convolution kernel, from the innermost convolution
    op of its ranges (``*convolution_backward*``: the data- and weight-gradient passes, which
    PyTorch 1.11+ runs in one op), else from its phase."""
    if ops.ok and rid is not None:
        for a in ops.chain(rid):
            n = ops.name[a].lower()
            if "convolution_backward" in n:
                return "backward"
            if _CONV_FWD.search(n):
                return "forward"
    return "backward" if phase == "backward" else "forward"


def peak_flops(work_ns: float, precision: str, p_old: dict[str, float]) -> float:
    """A kernel's FP32 (or TF32) work time counted in FLOPs at its precision's peak: the
    FLOPs it would do at 100% of the peak (the achieved fraction is carried by
    constants.AMP_TRANSPOSE, measured beside the same count)."""
    return max(float(work_ns), 0.0) * 1e-9 * p_old[precision]


def transpose_calls(kern: pl.DataFrame, prec: list[KernelPrecision], conv: list[int],
                    work: list[tuple[float, float, int] | None], ops: Ops,
                    op_rid: list[int | None], t0: float, p_old: dict[str, float]
                    ) -> list[dict]:
    """The convolution calls with recorded shapes among the kernels CONV: per call its pass
    (``conv_pass``), iteration, transposed bytes (passes x B, ``layout_transposes``), the
    peak FLOPs of its kernels' work (``peak_flops``, work = duration - T0) and its kernels'
    positions. What bench/amp_calibration.py measures constants.AMP_TRANSPOSE on."""
    dur = kern["dur_ns"].to_numpy()
    phase, it = kern["phase"].to_list(), kern["iteration"].to_list()
    calls: dict[int, dict] = {}
    for j in conv:
        w = work[j]
        sop = ops.shape_op(op_rid[j]) if ops.ok else None
        if w is None or sop is None:
            continue
        c = calls.setdefault(sop, {"op": sop, "pass": conv_pass(ops, op_rid[j], phase[j]),
                                   "iteration": it[j], "bytes": w[2] * w[1], "flops": 0.0,
                                   "kernels": []})
        c["flops"] += peak_flops(dur[j] - t0, prec[j].precision, p_old)
        c["kernels"].append(j)
    return list(calls.values())


def layout_transposes(kern: pl.DataFrame, prec: list[KernelPrecision], dt: list[str],
                      region: np.ndarray, work: list[tuple[float, float, int] | None],
                      ops: Ops, op_rid: list[int | None], bw: float, t0: float,
                      p_old: dict[str, float], rule: dict[str, float] | None = None
                      ) -> tuple[np.ndarray, dict[str, int]]:
    """Time (ns) the layout transposes of NCHW convolutions add to the kernels of KERN, and
    counts: convolution calls and kernels sized from their shapes, kernels sized by the rule.

    cuDNN runs 16-bit convolutions on Tensor Cores in NHWC: with NCHW tensors it transposes
    each call's inputs to NHWC and its output back (cuDNN Developer Guide, "Tensor
    Transformations": NCHW-to-NHWC transformations to call the Tensor Core operations;
    NVIDIA's channels-last guidance shows the transposes before and after every
    convolution). A forward call moves x, w and y, a backward call's data-gradient pass dy, w
    and dx and its weight-gradient pass x, dy and dw: each 16-bit element read and written,
    4 bytes, so one pass transposes as many bytes as its operands hold in FP32, the op's
    FP32 bytes B per pass (``op_work``). At the achieved memory bandwidth BW: passes x B /
    BW, added once per convolution call, to its first kernel.

    A convolution kernel whose op records no shapes: its transposed bytes are its work's peak
    FLOPs (``peak_flops``: (duration - T0) x the FP32/TF32 peak) times RULE[its pass]
    (constants.AMP_TRANSPOSE): a convolution that does F FLOPs at an achieved fraction e of
    the peak over its work time, at intensity F / B, transposes passes x B = passes x e / (F /
    B) bytes per peak FLOP; the calibration trace's work-weighted figure per pass stands in
    for e and F / B, as constants.AMP_INTENSITY's intensities do for the roofline ratio."""
    rule = AMP_TRANSPOSE["value"] if rule is None else rule
    dur = kern["dur_ns"].to_numpy()
    phase = kern["phase"].to_list()
    add = np.zeros(kern.height, np.float64)
    conv = conv_kernels(prec, dt, region, ops, op_rid)
    calls = transpose_calls(kern, prec, conv, work, ops, op_rid, t0, p_old)
    shaped = {j for c in calls for j in c["kernels"]}
    for c in calls:  # a call's transposes, once, on its first kernel
        add[c["kernels"][0]] = c["bytes"] / bw * 1e9
    rule_kernels = [j for j in conv if j not in shaped]
    for j in rule_kernels:
        flops = peak_flops(dur[j] - t0, prec[j].precision, p_old)
        add[j] = rule[conv_pass(ops, op_rid[j], phase[j])] * flops / bw * 1e9
    n = {"calls": len(calls), "shaped_kernels": len(shaped), "rule_kernels": len(rule_kernels)}
    return np.rint(add).astype(np.int64), n


# ---- 2. what the trace computes in -------------------------------------------------------------

def reduced_share(dur: np.ndarray, prec: list[KernelPrecision]) -> tuple[float, float]:
    """(share of matrix-kernel time in 16-bit or narrower precision, matrix-kernel time ns)."""
    math_ = np.array([p.math for p in prec], bool)
    red = np.array([p.math and p.reduced for p in prec], bool)
    tot = float(dur[math_].sum())
    return (float(dur[red].sum()) / tot if tot > 0 else 0.0), tot


# GradScaler's kernels (their names hold these)
SCALER_KERNELS = ("non_finite_check_and_unscale", "amp_update_scale")


# ---- the optimization --------------------------------------------------------------------------

@register("amp", shrinks=True)
def amp(g: Graph, ctx: Context, *, dtype: str = "fp16", casts: bool = True,
        loss_scaling: bool = True, gpu: str = "", layout: str = "nchw") -> Graph:
    """Automatic mixed precision (torch.autocast to DTYPE fp16 or bf16, and GradScaler).

    Kernels of the ops autocast runs in reduced precision (its float16 list and their backward,
    and the ops that follow them on their inputs' dtype) shrink by the roofline of the GPU (its
    FP32/TF32 and FP16/BF16 peaks and memory bandwidth from transforms/hardware.py): the work
    beyond a kernel's fixed cost by max(F/P_old, B/BW) / max(F/P_new, B/2/BW), F and B from the
    op's recorded shapes, else from the intensity distribution of its class
    (constants.AMP_INTENSITY); bandwidth-bound kernels whose FP32 data become FP16 by 2.
    Softmax, norms, losses and the other ops of autocast's float32 list, the optimizer,
    gradients and collectives keep their time. With CASTS, each weighted op's weight cast
    (forward) and gradient cast (backward) are inserted; with LOSS_SCALING, GradScaler's
    kernels and its found_inf read (a device-to-host copy and a stream sync, which makes the
    host wait for the GPU once per step). GPU: the GPU table's name of the device, where the
    trace names none (or to predict on another GPU's peaks). LAYOUT nchw (PyTorch's default
    memory format): the 16-bit tensor-core convolutions work in NHWC, so each convolution
    call transposes its 16-bit inputs and outputs (``layout_transposes``: from the op's
    shapes, else by the per-pass rule of constants.AMP_TRANSPOSE); nhwc (channels_last):
    none. A trace already in reduced precision is left unchanged with a note."""
    if dtype not in DTYPES:
        raise DaydreamError(f"amp: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if layout not in ("nchw", "nhwc"):
        raise DaydreamError(f"amp: layout must be nchw or nhwc, got {layout!r}")
    # the kernels' rows, with their task ids (positions) as "id": a numpy mask and a gather
    # (a row index and a Polars filter over every task took 0.6 ms of a 4k-task graph)
    kern_ids = np.flatnonzero(g.array("kind") == "kernel")
    kern = g.rows(kern_ids, ("name", "dur_ns", "phase", "iteration")).with_columns(
        pl.Series("id", kern_ids, pl.Int64))
    if not kern.height:
        ctx.notes.append("amp: the trace has no GPU kernels (a CPU-only trace); autocast on "
                         "CUDA does not apply; unchanged")
        return g
    names = [n or "" for n in kern["name"].to_list()]
    prec = [kernel_precision(n) for n in names]
    dur = kern["dur_ns"].to_numpy()
    share, math_ns = reduced_share(dur, prec)
    # one substring search over the names joined (a regular expression over each name
    # took 0.6 ms of a 3k-kernel trace)
    joined = "\n".join(names)
    scaler = any(k in joined for k in SCALER_KERNELS)
    if share >= AMP["reduced_share"]["value"] or scaler:
        why = (f"{100 * share:.0f}% of its matrix-kernel time already runs in FP16/BF16/FP8"
               if share >= AMP["reduced_share"]["value"] else
               "it already runs GradScaler's kernels")
        ctx.notes.append(f"amp: does not apply, {why}: the trace is in mixed precision "
                         "already; unchanged")
        return g
    if math_ns == 0:
        ctx.notes.append("amp: no matrix (GEMM/convolution) kernels; only bandwidth-bound "
                         "kernels change")
    dev, how = amp_device(ctx, names, gpu)
    pk = peaks(dev, dtype)
    ranges = ranges_of(ctx)
    ops = Ops(ranges)
    region = np.array([ph in PHASES and it is not None for ph, it in zip(
        kern["phase"].to_list(), kern["iteration"].to_list(), strict=True)], bool)
    # the launch edges, read once: the casts are placed by them too, and set_duration
    # keeps every edge and id
    launches = _launches(g)
    dt, op_rid = kernel_dtypes(g, kern, prec, ops, launches)
    # the fixed cost of a kernel: the trace's own shortest kernels (10th percentile)
    t0 = float(np.percentile(dur, AMP["fixed_percentile"]["value"])) if len(dur) else 0.0
    work = matrix_work(kern, prec, ops, op_rid)
    ratio = np.ones(kern.height)
    shaped = by_class = 0
    cls_r: dict[tuple[str, str], float] = {}
    per_class: dict[str, list[int]] = {}
    for j, p in enumerate(prec):
        if not region[j] or dt[j] != "reduced" or p.reduced:
            continue
        if p.math:
            if p.precision not in OLD_PEAK:
                continue
            p_old = pk[p.precision]
            w = work[j]
            if w is not None:
                ratio[j] = float(roofline_ratio(w[0], w[1], p_old, pk["new"], pk["bw"]))
                shaped += 1
            else:
                key = (op_class(ops, op_rid[j], p), p.precision)
                if key not in cls_r:
                    cls_r[key] = class_ratio(key[0], p_old, pk["new"], pk["bw"])
                ratio[j] = cls_r[key]
                by_class += 1
            per_class.setdefault(f"{p.op} {p.precision}", []).append(j)
        elif p.precision in ("fp32", None):
            ratio[j] = 1.0 / AMP["byte_ratio"]["value"]
            per_class.setdefault("bandwidth-bound", []).append(j)
    new = speedup(dur, ratio, t0)
    tr_note = ""
    if layout == "nchw":
        add, n = layout_transposes(kern, prec, dt, region, work, ops, op_rid,
                                   pk["bw"] * AMP["achieved_bandwidth"]["value"], t0, pk)
        new = new + add
        tr_note = (f"; NCHW layout: cuDNN's transposes around its NHWC tensor-core "
                   f"convolutions {add.sum() / 1e6:.2f} ms: {n['shaped_kernels']} convolution "
                   f"kernels ({n['calls']} calls) sized from their shapes, "
                   f"{n['rule_kernels']} without shapes by the rule of "
                   f"constants.AMP_TRANSPOSE (bytes per peak FLOP of their FP32 work: "
                   + ", ".join(f"{k} {v:.3g}" for k, v in AMP_TRANSPOSE["value"].items())
                   + ")")
    full = g.array("dur_ns").copy()
    full[kern_ids] = new
    g = g.set_duration(np.ones(g.n_tasks, bool), full)
    parts = []
    for c, js in sorted(per_class.items()):
        js = np.asarray(js)
        parts.append(f"{c} {dur[js].sum() / max(new[js].sum(), 1):.2f}x over "
                     f"{len(js)} kernels")
    ctx.notes.append(
        f"amp: {dev.name} ({how}): {dtype.upper()} peak {pk['new'] / 1e12:g} vs FP32 "
        f"{pk['fp32'] / 1e12:g}" + (f"/TF32 {pk['tf32'] / 1e12:g}" if dev.tf32_tflops else "")
        + f" TFLOPS, {pk['bw'] / 1e9:g} GB/s; fixed kernel cost {t0 / 1e3:.1f} us kept; "
        + ("; ".join(parts) or "no kernel runs in FP32 where autocast would change it: "
                                 "unchanged")
        + (f"; {shaped} matrix kernels from their recorded shapes" if shaped else "")
        + (f"; {by_class} without shapes, by their class's intensity distribution "
           f"({', '.join(f'{a} {b} {v:.2f}x' for (a, b), v in sorted(cls_r.items()))}; "
           f"{AMP_INTENSITY['conv']['source'][:60]}...)" if by_class else "")
        + ("; op ranges: autocast's op lists" if ops.ok else
           "; no op ranges: the kernels' own classes stand in for their ops") + tr_note)
    # the casts and GradScaler's work, placed by the rewritten graph's ids and inserted in one
    # step (an insert rebuilds the task and edge tables: two were a third of the rewrite of a
    # DLRM rank, 12 of 35 ms); the casts' rows first, so that GradScaler's work placed after
    # the same task follows them
    rows: list[dict] = []
    edges: list[tuple] = []
    if casts:
        _cast_rows(g, ctx, ops, pk, t0, launches, rows, edges)
    if loss_scaling:
        g = _loss_scaling_rows(g, ctx, pk, t0, launches, rows, edges)
    if rows:
        ed = pl.DataFrame(edges, schema=["src", "dst", "kind", "anchor", "lag_ns"], orient="row")
        g, _ = g.insert(_frame(rows), ed)
    ctx.notes.extend(memory.notes(g, ctx, "amp", ranges=ranges, amp=True))
    return g


# ---- 5. casts and GradScaler ------------------------------------------------------------------

def _frame(rows: list[dict]) -> pl.DataFrame:
    """Rows of tasks to insert, every key in every row (placed before, not blocking, no bytes
    where a row does not say)."""
    default = {"place": "before", "blocking": False, "bytes": None}
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return pl.DataFrame([{k: r.get(k, default.get(k)) for k in keys} for r in rows],
                        infer_schema_length=None)  # a column's first value may come late


def _host_costs(g: Graph) -> dict[str, int]:
    """Own costs the inserted calls take, measured in the trace: the median cudaLaunchKernel,
    cudaMemcpyAsync (not blocking) and blocking call (after its wait); AMP's figures where
    the trace has no such call."""
    found = {"launch": g.median_call_ns("LaunchKernel"),
             "copy": g.median_call_ns("Memcpy", blocking=False),
             "sync": g.median_call_ns(blocking=True)}
    fallback = {"launch": AMP["launch_ns"], "copy": AMP["launch_ns"], "sync": AMP["sync_ns"]}
    return {k: v if v is not None else int(fallback[k]["value"]) for k, v in found.items()}


def _launches(g: Graph) -> tuple[dict[int, int], dict[int, int]]:
    """Per launched GPU task: its launch call, and the launch edge's lag (one filter)."""
    src, dst, lag = (a.tolist() for a in g.launch_pairs())
    return dict(zip(dst, src, strict=True)), dict(zip(dst, lag, strict=True))


def param_bytes_estimate(g: Graph, ctx: Context, bw_eff: float) -> tuple[float, str]:
    """FP32 parameter bytes: given (--param-bytes), from the layer table's recorded weights,
    else from the optimizer's kernels (their time at the achieved bandwidth over the passes its
    update makes over parameter-sized tensors, constants.FUSED_OPTIMIZER_PASSES)."""
    if ctx.param_bytes:
        return float(ctx.param_bytes), "--param-bytes"
    lay = g.arrow("layer")
    if "param_bytes" in lay.column_names:
        total = pc.sum(lay["param_bytes"]).as_py()  # nulls skipped; None where all are
        if total and total > 0:
            return float(total), "the layers' recorded weight shapes"
    t = g.task
    wu = t.filter(pl.col("kind") == "kernel", pl.col("phase") == "weight_update",
                  pl.col("iteration").is_not_null())
    its = wu["iteration"].n_unique()
    if not its:
        return 0.0, "unknown (no optimizer kernels)"
    kind, _ = optimizer_kind(g)
    passes = FUSED_OPTIMIZER_PASSES.get(kind or "sgd", FUSED_OPTIMIZER_PASSES["sgd"])["value"]
    per_it = float(wu["dur_ns"].sum()) / its
    return per_it * 1e-9 * bw_eff / passes[0], (
        f"the optimizer's kernels ({per_it / 1e6:.2f} ms per step at "
        f"{bw_eff / 1e9:.0f} GB/s over {passes[0]} passes of {kind or 'sgd'})")


def optimizer_kind(g: Graph) -> tuple[str | None, str | None]:
    """(adam, adamw, sgd, adagrad or None; the Optimizer.step class name as the trace shows
    it) from the host tasks' ``Optimizer.step#X.step`` labels."""
    from daydream.transforms.opts.fused_optimizer import trace_optimizer
    return trace_optimizer(g)


def _cast_rows(g: Graph, ctx: Context, ops: Ops, pk: dict, t0: float,
               launches: tuple[dict[int, int], dict[int, int]], rows: list[dict],
               edges: list[tuple]) -> None:
    """One weight cast per weighted FP16 op: before the op's first kernel in forward (FP32
    weight read, FP16 copy written: 6 bytes a parameter), and its gradient's cast back after
    the op's backward node's last kernel (the same bytes). The casts share the parameter
    bytes evenly; each costs t0 plus its bytes at the achieved bandwidth, and one launch.
    Appended to ROWS and EDGES (``Graph.insert``'s, new tasks ``-1 - k`` by their place in
    ROWS). LAUNCHES: ``_launches(g)``."""
    if not ops.ok:
        ctx.notes.append("amp: no op ranges, weight casts not inserted")
        return
    it_of = g.array("iteration", -1)
    phase_of = g.array("phase")
    # elementwise == on an object array: a tenth of the cost of a set lookup per task
    kern = np.flatnonzero((g.array("kind") == "kernel") & (it_of >= 0)
                          & ((phase_of == PHASES[0]) | (phase_of == PHASES[1])))
    launch, lag = launches
    rid_of = g.values("range_id")  # by task id (ids are positions)
    weighted = re.compile(r"conv|linear|addmm|prelu|_cell")
    first: dict[tuple[int, int], tuple[int, int]] = {}  # (iteration, op range) -> (kernel, api)
    lastb: dict[tuple[int, int], tuple[int, int]] = {}
    # in launch order (task ids are in start order): a cast goes before the op's first launch
    # and after its last, so that it never precedes work launched before it
    rows_k = [(launch[kid], kid, int(it_of[kid]), phase_of[kid]) for kid in kern.tolist()
              if kid in launch]
    for api, kid, it, ph in sorted(rows_k):
        pol, by = ops.policy(rid_of[api])
        if pol != "lower" or by is None or not weighted.search(ops.name[by].lower()):
            continue
        key = (it, by)
        if ph == "forward":
            first.setdefault(key, (kid, api))
        else:
            lastb[key] = (kid, api)
    n_fwd = len({k for k in first})
    if not n_fwd:
        return
    its = max(len({k[0] for k in first}), 1)
    bw_eff = pk["bw"] * AMP["achieved_bandwidth"]["value"]
    pbytes, src = param_bytes_estimate(g, ctx, bw_eff)
    per = pbytes / max(n_fwd / its, 1)
    cast_ns = int(round(t0 + per * AMP["cast_bytes_per_param_byte"]["value"] / bw_eff * 1e9))
    host = _host_costs(g)
    unit = g.array("unit_id")
    for (kid, api), where in ([(v, "before") for v in first.values()] +
                              [(v, "after") for v in lastb.values()]):
        k = len(rows)
        rows.append({"at": api, "place": where, "kind": "api", "unit_id": int(unit[api]),
                     "name": "cudaLaunchKernel", "dur_ns": host["launch"]})
        rows.append({"at": kid, "place": where, "kind": "kernel", "unit_id": int(unit[kid]),
                     "name": "amp: " + ("cast weight fp32->fp16" if where == "before" else
                                        "cast weight grad fp16->fp32") + " (inserted)",
                     "dur_ns": cast_ns})
        edges.append((-1 - k, -2 - k, "launch", "start_start", int(lag.get(kid, 0))))
    ctx.notes.append(f"amp: {len(first)} weight casts and {len(lastb)} gradient casts of "
                     f"{cast_ns / 1e3:.1f} us each ({pbytes / 1e6:.1f} MB of FP32 parameters "
                     f"from {src}, {n_fwd // its} weighted FP16 ops per iteration)")


def _loss_scaling_rows(g: Graph, ctx: Context, pk: dict, t0: float,
                       launches: tuple[dict[int, int], dict[int, int]], rows: list[dict],
                       edges: list[tuple]) -> Graph:
    """GradScaler per iteration, as torch.amp.GradScaler runs it: ``scale(loss)`` (one scalar
    multiply) before the first backward kernel; ``unscale_`` before the first optimizer
    kernel (one pass reading and writing every FP32 gradient: 8 bytes a parameter), then
    ``found_inf.item()`` (a 4-byte cudaMemcpyAsync to the host and a cudaStreamSynchronize
    that waits for it); ``update()`` (one small kernel) after the last optimizer kernel.
    Appended to ROWS and EDGES after what is there (``_cast_rows``'); returns G less the
    edges the sync would deadlock on. LAUNCHES: ``_launches(g)``."""
    launch, lag = launches
    it_of, phase = g.array("iteration", -1), g.array("phase")
    launched = np.zeros(g.n_tasks, bool)
    launched[list(launch)] = True
    kern = (g.array("kind") == "kernel") & (it_of >= 0) & launched  # of an iteration
    wu = np.flatnonzero(kern & (phase == "weight_update"))
    if not len(wu):
        ctx.notes.append("amp: no optimizer kernels launched in the trace: GradScaler not "
                         "inserted")
        return g
    host = _host_costs(g)
    bw_eff = pk["bw"] * AMP["achieved_bandwidth"]["value"]
    pbytes, src = param_bytes_estimate(g, ctx, bw_eff)
    unscale_ns = int(round(t0 + pbytes * 2 / bw_eff * 1e9))
    unit = g.array("unit_id")
    # the first and last launched optimizer kernels, and the first launched backward kernel
    # (launch calls' ids are in start order): GradScaler's work goes beside them in launch
    # order, never before work launched earlier
    def by_launch(ids: np.ndarray) -> dict[int, list[int]]:
        """Per iteration, the kernels IDS in the order of their launch calls."""
        out: dict[int, list[int]] = {}
        for i in sorted(ids.tolist(), key=lambda i: launch[i]):  # stable: ties by id
            out.setdefault(int(it_of[i]), []).append(i)
        return out
    first_wu = [(it, ks[0], ks[-1]) for it, ks in sorted(by_launch(wu).items())]
    first_bw = {it: ks[0] for it, ks in
                by_launch(np.flatnonzero(kern & (phase == "backward"))).items()}
    # per stream, its tasks in order with their launch calls: the found_inf copy the host
    # waits for goes after the last task launched before the wait, not merely before the
    # optimizer's first kernel (another thread may have launched work onto the stream later
    # that started earlier, and waits on this thread's later calls)
    api_of = np.full(g.n_tasks, np.iinfo(np.int64).max, np.int64)
    for d, a in launch.items():
        api_of[d] = a
    for it, k, last in first_wu:
        api, api_last = launch[k], launch[last]
        th, st = int(unit[api]), int(unit[k])
        on = np.flatnonzero((unit == st) & (api_of < api))
        at_k, place_k = (int(on.max()), "after") if len(on) else (k, "before")

        def add(row: dict) -> int:
            rows.append(row)
            return -len(rows)
        b = first_bw.get(it)
        if b is not None:
            a0 = add({"at": launch[b], "kind": "api", "unit_id": int(unit[launch[b]]),
                      "name": "cudaLaunchKernel", "dur_ns": host["launch"]})
            k0 = add({"at": b, "kind": "kernel", "unit_id": int(unit[b]),
                      "name": "amp: GradScaler.scale loss * scale (inserted)",
                      "dur_ns": int(round(t0))})
            edges.append((a0, k0, "launch", "start_start", int(lag.get(b, 0))))
        a1 = add({"at": api, "kind": "api", "unit_id": th, "name": "cudaLaunchKernel",
                  "dur_ns": host["launch"]})
        k1 = add({"at": at_k, "place": place_k, "kind": "kernel", "unit_id": st,
                  "name": "amp: _amp_foreach_non_finite_check_and_unscale_ (inserted)",
                  "dur_ns": unscale_ns})
        a2 = add({"at": api, "kind": "api", "unit_id": th,
                  "name": "cudaMemcpyAsync (GradScaler found_inf.item, inserted)",
                  "dur_ns": host["copy"]})
        c2 = add({"at": at_k, "place": place_k, "kind": "memcpy", "unit_id": st, "bytes": 4,
                  "name": "amp: found_inf DtoH (inserted)", "dur_ns": int(round(t0))})
        s2 = add({"at": api, "kind": "api", "unit_id": th, "blocking": True,
                  "name": "cudaStreamSynchronize (GradScaler found_inf.item, inserted)",
                  "dur_ns": host["sync"]})
        a3 = add({"at": api_last, "place": "after", "kind": "api", "unit_id": th,
                  "name": "cudaLaunchKernel", "dur_ns": host["launch"]})
        k3 = add({"at": last, "place": "after", "kind": "kernel", "unit_id": int(unit[last]),
                  "name": "amp: _amp_update_scale_ (inserted)", "dur_ns": int(round(t0))})
        edges += [(a1, k1, "launch", "start_start", int(lag.get(k, 0))),
                  (a2, c2, "launch", "start_start", int(lag.get(k, 0))),
                  (c2, s2, "sync", "end_end", LATENCY["sync"].ns),
                  (a3, k3, "launch", "start_start", int(lag.get(last, 0)))]
    # an inferred cross-stream wait whose source was launched after its destination cannot
    # be a stream wait (cudaStreamWaitEvent waits for work recorded before it is enqueued):
    # with a host that now waits for the GPU once per step it would close a cycle. The graph
    # build infers no wait from later work (graphstore.build._in_launch_order), but
    # contention (held only while its source runs, yet a dependency to the cycle check), and
    # an earlier rewrite may make one around removed tasks (``Graph.remove``, kind
    # 'inserted' where the path mixed kinds: inferred when a wait on its path was)
    e = g.arrow("edge")
    bad = e["inferred"].to_numpy()
    if bad.any():
        src_api = api_of[e["src"].to_numpy()]
        dst_api = api_of[e["dst"].to_numpy()]
        bad = bad & (src_api > dst_api) & (src_api != np.iinfo(np.int64).max)
        if bad.any():
            g = g.drop_edges(bad)
            ctx.notes.append(f"amp: {int(bad.sum())} inferred cross-stream edges whose source "
                             "was launched after their destination dropped (no stream wait "
                             "can wait for later work, and contention from it is no "
                             "dependency; GradScaler's sync would deadlock on them)")
    ctx.notes.append(f"amp: GradScaler in {len(first_wu)} steps: unscale_ "
                     f"{unscale_ns / 1e3:.1f} us ({pbytes / 1e6:.1f} MB of gradients from "
                     f"{src}), found_inf read back with a stream sync (the host waits for "
                     "the GPU's backward once per step), update kernel")
    return g
