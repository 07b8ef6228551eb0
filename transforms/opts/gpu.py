"""A different GPU: the same job on another device of the GPU table."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from daydream.base.errors import DaydreamError
from daydream.transforms import hardware as hw
from daydream.transforms import kernel_class as K
from daydream.transforms import memory
from daydream.transforms import roofline as rf
from daydream.transforms import work as wk
from daydream.transforms.constants import GPU_ACHIEVED
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register

# copies by direction: the link that bounds them (a copy's name: "Memcpy HtoD (Pageable ->
# Device)"); the GPU table figure of each
_COPY_LINK = {"htod": "pcie_bidir_gbps", "dtoh": "pcie_bidir_gbps", "dtod": "memory_gbps",
              "ptop": "interconnect_bidir_gbps"}


def properties(d: hw.Device) -> dict:
    """A deviceProperties entry for device D, as a trace would record it: what the models
    that follow ``gpu`` in a chain read (``transforms.devices.family``, ``batch``)."""
    out: dict = {"name": d.name}
    if d.compute_capability is not None:
        out["computeMajor"], out["computeMinor"] = d.compute_capability
    if d.memory_bytes is not None:
        out["totalGlobalMem"] = d.memory_bytes
    if d.sm_count is not None:
        out["numSms"] = d.sm_count
    return out


def source_device(ctx: Context) -> hw.Device:
    """The GPU the trace ran on, from its deviceProperties; an error naming what the trace
    says when the GPU table does not know it."""
    if not ctx.device:
        raise DaydreamError("gpu: the trace records no GPU (no deviceProperties): the source "
                            "device's peaks are unknown")
    d = hw.device_from_properties(ctx.device)
    if d is None:
        said = {k: ctx.device.get(k) for k in ("name", "computeMajor", "computeMinor",
                                                "numSms", "totalGlobalMem")
                if ctx.device.get(k) is not None}
        raise DaydreamError(f"gpu: the trace's GPU is not in the GPU table "
                            f"(transforms/hardware.py): the trace says {json.dumps(said)}; "
                            f"known: {', '.join(hw.DEVICES)}")
    return d


@dataclass
class GpuModel:
    """Per task: the new duration, its class on the source and on the target device, and
    the time ratio applied to its work."""

    source: hw.Device
    target: hw.Device
    new_dur_ns: np.ndarray
    gpu: np.ndarray
    src_class: list[str]
    dst_class: list[str]
    ratio: np.ndarray
    fixed_ns: float
    fixed_how: str
    notes: list[str]


# a kernel's group in GPU_ACHIEVED, by its op (transforms.kernel_class); copies and sets are
# memory work
_GROUP = {"gemm": "matrix", "conv": "matrix", "attention": "attention", "memory": "memory"}


def achieved(d: hw.Device) -> dict[str, float] | None:
    """DEVICE's achieved fractions and fixed costs (transforms.constants.GPU_ACHIEVED), or
    None where the table has none for it."""
    e = GPU_ACHIEVED.get(d.key)
    return None if e is None else {k: float(v["value"]) for k, v in e.items()}


def measured_ns(dur: np.ndarray, fixed_src: np.ndarray, fixed_dst: np.ndarray,
                ratio: np.ndarray) -> np.ndarray:
    """Each kernel's time on the target, from its traced time DUR: its fixed cost on the
    source FIXED_SRC comes off, the work that remains runs RATIO times as long (the source's
    achieved rate over the target's), the target's fixed cost FIXED_DST comes on. A kernel
    shorter than the source's fixed cost did no work worth counting: it keeps its proportion to
    the fixed cost (a 0.8 us memset where the fixed cost is 1.3 us takes 0.8/1.3 of the
    target's)."""
    dur = np.asarray(dur, np.float64)
    fs = np.asarray(fixed_src, np.float64)
    ft = np.asarray(fixed_dst, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        small = np.where(fs > 0, ft * dur / fs, dur)
    return np.where(dur > fs, ft + (dur - fs) * np.asarray(ratio, np.float64), small)


def _copy_kind(name: str) -> str | None:
    low = name.lower().replace(" ", "")
    return next((k for k in _COPY_LINK if k in low), None)


def predict(g: Graph, ctx: Context, name: str, conv_tf32: bool = True,
            matmul_tf32: bool = False) -> GpuModel:
    """The per-task durations of the job on GPU NAME (see ``gpu``)."""
    if "amp" in ctx.applied:
        raise DaydreamError("gpu: put gpu(...) before amp in the chain (gpu(X)+amp): gpu "
                            "reads each kernel's precision from its name, which amp does not "
                            "rewrite")
    src = source_device(ctx)
    dst = hw.device(name)
    t = g.task
    n = g.n_tasks
    kind = t["kind"].to_numpy()
    names = t["name"].fill_null("").to_list()
    dur = t["dur_ns"].to_numpy().astype(np.float64)
    local = np.isin(kind, ["kernel", "memcpy", "memset"])
    if n:
        local[0] = False
    la = g.launches()
    ranges = wk.ranges_of(ctx)
    ops = wk.task_ops(kind, t["range_id"].fill_null(-1).to_numpy(), la["api"].to_numpy(),
                      la["gpu"].to_numpy(), ranges)
    src_c = [""] * n
    dst_c = [""] * n
    ratio = np.ones(n)
    missing: dict[str, int] = {}
    changed: dict[tuple[str, str], int] = {}
    a_s, a_t = achieved(src), achieved(dst)
    vendor = a_s is not None and a_t is not None
    group = [""] * n
    for i in np.flatnonzero(local):
        if kind[i] == "kernel":
            k = K.classify(names[i], ops.name[i], ops.types[i])
            if k.math == "comm":
                src_c[i] = dst_c[i] = "comm"
                continue
            group[i] = _GROUP.get(k.op, "memory")
            m_t = K.on_device(k, src, dst, conv_tf32=conv_tf32, matmul_tf32=matmul_tf32)
            src_c[i], dst_c[i] = f"{k.op}/{k.math}", f"{k.op}/{m_t}"
            p_s, p_t = K.peak(src, k.math), K.peak(dst, m_t)
            if p_t is None:  # the target lacks that rate: its FP32 one
                missing[m_t] = missing.get(m_t, 0) + 1
                m_t = "fp32" if k.math != "memory" else "memory"
                dst_c[i] = f"{k.op}/{m_t}"
                p_t = K.peak(dst, m_t)
            if p_s is None:
                p_s = K.peak(src, "fp32")
            if m_t != k.math:
                changed[(k.math, m_t)] = changed.get((k.math, m_t), 0) + 1
            ratio[i] = p_s / p_t
            if vendor:
                g_ = "memory" if k.math == "memory" else group[i]
                group[i] = g_
                ratio[i] *= a_s[f"{g_}_fraction"] / a_t[f"{g_}_fraction"]
        else:
            group[i] = "memory"
            ck = _copy_kind(names[i]) if kind[i] == "memcpy" else "dtod"
            fig = _COPY_LINK.get(ck or "", "memory_gbps")
            a, b = getattr(src, fig), getattr(dst, fig)
            label = f"{kind[i]}/{ck or 'other'}"
            src_c[i] = dst_c[i] = label
            if a and b:
                ratio[i] = a / b
            else:
                missing[fig] = missing.get(fig, 0) + 1
    if vendor:
        return _vendor_model(src, dst, a_s, a_t, dur, local, group, src_c, dst_c, ratio,
                             missing, changed, conv_tf32, matmul_tf32)
    kern_mask = local & (kind == "kernel")
    works = wk.op_works(ranges, ops.op[kern_mask], set())
    tiny = np.asarray([int(o) in works and works[int(o)].bytes_b < rf.TINY_BYTES
                       for o in ops.op[kern_mask]], bool) if works else None
    t0, t0_how = rf.fixed_cost_ns(dur[kern_mask], tiny)
    fixed = np.minimum(dur, t0)
    new = dur.copy()
    sel = local & (ratio != 1.0)
    new[sel] = fixed[sel] + (dur[sel] - fixed[sel]) * ratio[sel]
    return GpuModel(src, dst, np.rint(new).astype(np.int64), local, src_c, dst_c, ratio,
                    t0, t0_how, _notes(dst, missing, changed, conv_tf32, matmul_tf32))


def _notes(dst: hw.Device, missing: dict[str, int], changed: dict[tuple[str, str], int],
           conv_tf32: bool, matmul_tf32: bool) -> list[str]:
    notes = []
    for m, c in sorted(missing.items()):
        notes.append(f"gpu: {dst.name} has no {m} figure in the GPU table; {c} tasks keep "
                     "their time or take its FP32 rate")
    if changed:
        notes.append("gpu: kernels that change class on " + dst.name + ": " + ", ".join(
            f"{c} {a}->{b}" for (a, b), c in sorted(changed.items())) +
            f" (conv_tf32={conv_tf32}, matmul_tf32={matmul_tf32}: PyTorch's defaults are "
            "True and False)")
    return notes


def _vendor_model(src: hw.Device, dst: hw.Device, a_s: dict[str, float],
                  a_t: dict[str, float], dur: np.ndarray, local: np.ndarray,
                  group: list[str], src_c: list[str], dst_c: list[str],
                  ratio: np.ndarray, missing: dict[str, int],
                  changed: dict[tuple[str, str], int], conv_tf32: bool,
                  matmul_tf32: bool) -> GpuModel:
    """Both GPUs in GPU_ACHIEVED: each kernel group's own fixed cost on each device and its
    work at the achieved rates (``measured_ns``); RATIO already holds the achieved-rate
    ratio."""
    sel = local & np.asarray([bool(x) for x in group])
    fs = np.asarray([a_s.get(f"{x}_fixed_ns", 0.0) if x else 0.0 for x in group])
    ft = np.asarray([a_t.get(f"{x}_fixed_ns", 0.0) if x else 0.0 for x in group])
    new = dur.copy()
    new[sel] = measured_ns(dur[sel], fs[sel], ft[sel], ratio[sel])
    how = (f"the source's memory kernels; per kernel group on {src.name} / {dst.name}: memory "
           f"{a_s['memory_fixed_ns'] / 1e3:.2f} / {a_t['memory_fixed_ns'] / 1e3:.2f} us, matrix "
           f"{a_s['matrix_fixed_ns'] / 1e3:.2f} / {a_t['matrix_fixed_ns'] / 1e3:.2f} us, "
           f"attention {a_s['attention_fixed_ns'] / 1e3:.2f} / "
           f"{a_t['attention_fixed_ns'] / 1e3:.2f} us; achieved fractions of peak memory "
           f"{a_s['memory_fraction']:.2f} / {a_t['memory_fraction']:.2f}, matrix "
           f"{a_s['matrix_fraction']:.2f} / {a_t['matrix_fraction']:.2f}, attention "
           f"{a_s['attention_fraction']:.2f} / {a_t['attention_fraction']:.2f} "
           "(transforms.constants.GPU_ACHIEVED)")
    return GpuModel(src, dst, np.rint(new).astype(np.int64), local, src_c, dst_c, ratio,
                    a_s["memory_fixed_ns"], how,
                    _notes(dst, missing, changed, conv_tf32, matmul_tf32))


@register("gpu", example="gpu(name=H100)")
def gpu(g: Graph, ctx: Context, *, name: str, conv_tf32: bool = True,
        matmul_tf32: bool = False) -> Graph:
    """The same job on GPU NAME (V100, T4, A10, L4, A100, H100, H200, B200, MI250X, MI300X,
    RTX3090, RTX4090, or any key of transforms/hardware.py).

    Each GPU task keeps its fixed launch-to-finish cost (the trace's own, as in batch) and
    scales the rest by the ratio of the two devices' peaks for its class
    (transforms/kernel_class.py): FP32, TF32, FP16/BF16/FP8/INT8 tensor rates for GEMMs and
    convolutions, device memory bandwidth for every other kernel, copies and sets, PCIe for
    host copies. An FP32 convolution traced on a GPU without TF32 runs on TF32 tensor cores
    on one that has them (CONV_TF32, torch.backends.cudnn.allow_tf32, default True); an FP32
    matmul only with MATMUL_TF32 (torch.backends.cuda.matmul.allow_tf32, default False).
    Collectives and the CPU side keep their time. The source GPU is the trace's
    (deviceProperties); later optimizations of the chain see the new one. Put it before amp
    (gpu(H100)+amp); it composes with batch either way.

    Between two GPUs with published achieved rates (transforms.constants.GPU_ACHIEVED: the
    H100 SXM and the MI300X, either way) each kernel instead takes its group's fixed cost on
    the target (memory, matrix or attention kernels: AMD and NVIDIA names classified alike)
    plus its work beyond the source's fixed cost at the ratio of the rates the vendors'
    libraries achieve (STREAM Triad, matmul MAMF, FlashAttention-2), docs/whatif-hw.md."""
    m = predict(g, ctx, name, conv_tf32, matmul_tf32)
    g2 = g.set_duration(m.gpu, m.new_dur_ns)
    old = float(g.task["dur_ns"].to_numpy()[m.gpu].sum())
    new = float(m.new_dur_ns[m.gpu].sum())
    ctx.notes.append(f"gpu: {m.source.name} -> {m.target.name}; fixed cost "
                     f"{m.fixed_ns / 1e3:.2f} us ({m.fixed_how}); GPU work {old / 1e6:.2f} -> "
                     f"{new / 1e6:.2f} ms over the trace")
    ctx.notes.extend(m.notes)
    ctx.device = properties(m.target)
    ctx.notes.extend(memory.notes(g2, ctx, "gpu", ranges=wk.ranges_of(ctx)))
    return g2
