"""A roofline per kernel, calibrated on the trace itself: what ``batch`` (and the per-class
scaling of ``gpu``) rest on.

A kernel's time is a fixed part and a work part (``kernel_ns``)::

    t = t0_k + max(R_same / f_k, R)

- ``R`` is its roofline time on the device: ``max(flops / peak(math), bytes / bandwidth(ws))``,
  the bandwidth being the L2's while the op's working set ``ws`` fits the L2
  (``transforms.hardware`` l2_bytes) and the device memory's beyond it;
- ``f_k`` is the fraction of its roofline the kernel achieved in the trace, and ``R_same``
  its roofline time with the bandwidth of the regime it ran in there: a kernel that moved
  data at 30% of the L2's bandwidth keeps that rate where its working set still fits, and
  is bounded by the device memory's where it no longer does (``max``), but is not slowed by
  the L2/DRAM ratio when its rate was below the DRAM's anyway;
- ``t0_k`` is its fixed cost: launch to finish of a kernel that does (almost) no work.

Calibration from the trace (``calibrate``): ``t0`` is the trace's own fixed cost, the median
duration of its kernels whose op moves less than ``TINY_BYTES`` (else the 10th percentile of
all its kernel durations); ``f_class`` the median achieved fraction ``R / (t - t0)`` of the
trace's kernels of one math class whose time is mostly work (``t > WORK_DOMINATED * t0``).
Then each kernel splits its own duration ``t_b`` (``split``): a kernel whose work at its
class's typical rate would take ``w = R_b / f_class`` keeps ``t0`` as fixed cost and the rest
as work when ``w >= t0`` (its rate is its own: ``f_k = R_b / (t_b - t0)``), and takes the
part of ``t_b - t0`` that the class rate does not explain as fixed cost when ``w`` is small
(a latency-bound kernel), linearly in between; the work part is never less than the
roofline time. The split uses only the trace at batch b.

The L2 bandwidths are not in NVIDIA's datasheets (``transforms.hardware`` has them None):
``L2_GBPS`` gives published peak figures (bytes per clock times the boost clock), with their
source;
a device without one has no L2 regime (device memory bandwidth throughout, said in a note).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from daydream.base import occupancy
from daydream.transforms.hardware import Device
from daydream.transforms.kernel_class import peak

_L2_SRC = ("peak L2 bandwidth as tabulated in Ultrasonics Sonochemistry 99 (2023) 106546 "
           "(doi:10.1016/j.ultsonch.2023.106546), Table 3 'Hardware features of different "
           "Nvidia GPU architectures': {v} GB/s, i.e. {clk}; the V100/A100 ratio "
           "7219/3133 = 2.30 agrees with the A100 whitepaper's '2.3x the L2 cache read "
           "bandwidth of V100'")
# device architecture/family key prefix -> (GB/s, source)
L2_GBPS: dict[str, tuple[float, str]] = {
    "v100": (3133.0, _L2_SRC.format(v=3133, clk="2048 B/clk x 1530 MHz")),
    "a100": (7219.0, _L2_SRC.format(v=7219, clk="5120 B/clk x 1410 MHz")),
    "h100": (8986.0, _L2_SRC.format(v=8986, clk="5120 B/clk x 1755 MHz, the paper's clock")),
}

TINY_BYTES = 64 * 1024   # an op this small moves its bytes in < 0.1 us on any GPU of the table
WORK_DOMINATED = 3.0     # a kernel at least 3x the fixed cost is mostly work
MIN_TINY = 10            # fewer tiny kernels than this: the fixed cost from the percentile
FIXED_PERCENTILE = 10


def l2_gbps(d: Device) -> tuple[float | None, str]:
    """The device's L2 bandwidth (GB/s) and its source, or None where none is known."""
    for prefix, (v, src) in L2_GBPS.items():
        if d.key.startswith(prefix):
            return v, src
    return None, f"no published L2 bandwidth for {d.name}: device memory bandwidth throughout"


def bandwidth_gbps(d: Device, ws_bytes: np.ndarray) -> np.ndarray:
    """The bandwidth that bounds an op with working set WS_BYTES: the L2's where it fits,
    else the device memory's."""
    ws = np.asarray(ws_bytes, np.float64)
    mem = float(d.memory_gbps)
    l2, _ = l2_gbps(d)
    if l2 is None or d.l2_bytes is None:
        return np.full(ws.shape, mem)
    return np.where(ws <= d.l2_bytes, l2, mem)


def roofline_ns(d: Device, math: list[str] | np.ndarray, flops: np.ndarray,
                nbytes: np.ndarray, bw_gbps: np.ndarray) -> np.ndarray:
    """``max(flops / peak(math), bytes / bandwidth)`` in ns, per kernel (GB/s = bytes per
    ns; TFLOPS = 1e3 FLOPs per ns). A memory-bound kernel's FLOPs count against the FP32
    CUDA-core rate; a class the device has no peak for, likewise."""
    fp32 = peak(d, "fp32")
    rate = np.asarray([(peak(d, m) if m not in ("memory", "comm") else None) or fp32
                       for m in math], np.float64) * 1e3
    t_c = np.asarray(flops, np.float64) / rate
    t_m = np.asarray(nbytes, np.float64) / np.asarray(bw_gbps, np.float64)
    return np.maximum(t_c, t_m)


def fixed_cost_ns(dur_ns: np.ndarray, tiny: np.ndarray | None = None) -> tuple[float, str]:
    """The trace's fixed launch-to-finish cost of a kernel, and how it was found."""
    dur = np.asarray(dur_ns, np.float64)
    if tiny is not None and int(np.sum(tiny)) >= MIN_TINY:
        return float(np.median(dur[tiny])), (f"median of the {int(np.sum(tiny))} kernels "
                                            f"whose op moves < {TINY_BYTES // 1024} KiB")
    if not len(dur):
        return 0.0, "no kernel"
    return float(np.percentile(dur, FIXED_PERCENTILE)), (
        f"{FIXED_PERCENTILE}th percentile of the {len(dur)} kernel durations (too few "
        "kernels with recorded shapes)")


def class_fraction(t_b: np.ndarray, r_b: np.ndarray, t0: float, math: list[str]
                   ) -> dict[str, float]:
    """Per math class, the median achieved fraction of the roofline of the kernels whose time
    is mostly work; 1.0 for a class without any (a note says so)."""
    t_b, r_b = np.asarray(t_b, np.float64), np.asarray(r_b, np.float64)
    m = np.asarray(math)
    out = {}
    for c in np.unique(m):
        sel = (m == c) & (t_b > WORK_DOMINATED * t0) & (r_b > 0)
        if sel.any():
            out[str(c)] = float(np.clip(np.median(r_b[sel] / (t_b[sel] - t0)), 1e-6, 1.0))
    return out


@dataclass(frozen=True)
class Split:
    """Each kernel's fixed cost and work part (ns), its roofline time (ns) and the fraction
    of it the kernel achieved."""

    fixed_ns: np.ndarray
    work_ns: np.ndarray
    roofline_ns: np.ndarray
    fraction: np.ndarray


def split(t_b: np.ndarray, r_b: np.ndarray, t0: float, f_class: np.ndarray) -> Split:
    """Split each kernel's traced time T_B into fixed cost and work (module doc). R_B: its
    roofline time at batch b; F_CLASS: its class's typical achieved fraction."""
    t_b = np.asarray(t_b, np.float64)
    r_b = np.asarray(r_b, np.float64)
    f_c = np.asarray(f_class, np.float64)
    base = np.minimum(t_b, t0)                      # a kernel shorter than t0 is all fixed
    excess = t_b - base
    w = np.where(f_c > 0, r_b / f_c, 0.0)           # its work at the class's typical rate
    lam = np.clip(1.0 - w / t0, 0.0, 1.0) if t0 > 0 else np.zeros_like(w)
    fixed = base + lam * np.maximum(excess - w, 0.0)
    # the work part is at least the roofline time (no kernel beats its roofline)
    work = np.maximum(t_b - fixed, np.minimum(r_b, t_b))
    fixed = t_b - work
    frac = np.where(work > 0, np.minimum(r_b / np.where(work > 0, work, 1.0), 1.0), f_c)
    frac = np.where(frac > 0, frac, np.where(f_c > 0, f_c, 1.0))
    return Split(fixed, work, r_b, frac)


def kernel_ns(s: Split, r_same_n: np.ndarray, r_n: np.ndarray,
              wave: np.ndarray | float = 1.0) -> np.ndarray:
    """Predicted kernel times: ``fixed + max(work * R_same / R_b * wave, R)``, i.e. the work
    at the kernel's own fraction of its roofline in its traced regime (``R_same / f``), the
    WAVE factor for tiled kernels (``wave_factor``, 1 for the others), never faster than the
    roofline R at the new size; a kernel whose traced work part was nothing stays so."""
    r_same = np.asarray(r_same_n, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        growth = np.where(s.roofline_ns > 0, r_same / s.roofline_ns, 1.0)
    w = s.work_ns * growth * np.asarray(wave, np.float64)
    # a kernel that beat its estimated roofline in the trace (data the L2 already held, a
    # byte count that over-counts) keeps that margin at the new size
    with np.errstate(divide="ignore", invalid="ignore"):
        margin = np.where(s.roofline_ns > 0, np.minimum(s.work_ns / s.roofline_ns, 1.0), 1.0)
    floor = np.asarray(r_n, np.float64) * margin
    return s.fixed_ns + np.where(s.work_ns > 0, np.maximum(w, floor), 0.0)


# --- waves: a GEMM or convolution whose tiles do not fill the GPU ---------------------------
def wave_factor(grid_b: np.ndarray, capacity: np.ndarray, growth: np.ndarray) -> np.ndarray:
    """How much less than its work a tiled kernel's time grows when its grid grows by
    GROWTH (its op's work ratio): ``(waves_N / waves_b) / growth``; 1 where the grid is
    unknown (0). A GEMM of 36 tiles on 108 SMs takes one wave at 4x the work as at 1x."""
    g = np.asarray(grid_b, np.float64)
    gr = np.asarray(growth, np.float64)
    w_b = occupancy.waves(g, capacity)
    w_n = occupancy.waves(np.ceil(g * gr), capacity)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where((g > 0) & (gr > 0), (w_n / w_b) / gr, 1.0)
    return q
