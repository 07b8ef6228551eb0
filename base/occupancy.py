"""How many of a kernel's thread blocks a GPU runs at once, and so in how many waves it runs:
the CUDA occupancy limits applied to a trace's deviceProperties and a kernel's launch
geometry. Shared by the graph build (how long a kernel's last wave drains, for contention
edges) and the what-if transforms (how a tiled kernel's time grows with its grid)."""

from __future__ import annotations

import numpy as np

# Resident blocks per SM at most, by compute capability: CUDA C++ Programming Guide,
# "Compute Capabilities", table "Technical Specifications per Compute Capability" ("Maximum
# number of resident blocks per SM").
MAX_BLOCKS_PER_SM = {(7, 0): 32, (7, 2): 32, (7, 5): 16, (8, 0): 32, (8, 6): 16, (8, 7): 16,
                     (8, 9): 24, (9, 0): 32}


def resident_blocks(props: dict | None, threads: np.ndarray, regs: np.ndarray,
                    smem: np.ndarray) -> np.ndarray:
    """Blocks of each kernel one SM holds at once: the CUDA occupancy limits of threads,
    registers and shared memory per SM (the trace's deviceProperties) and the per-SM block
    limit of its compute capability; at least 1. Without those properties: 1."""
    threads = np.maximum(np.asarray(threads, np.float64), 1.0)
    p = props or {}

    def num(k: str) -> float | None:
        v = p.get(k)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 \
            else None

    lim = np.full(threads.shape, np.inf)
    tps = num("maxThreadsPerMultiprocessor")
    if tps:
        lim = np.minimum(lim, np.floor(tps / threads))
    rps = num("regsPerMultiprocessor")
    r = np.asarray(regs, np.float64)
    if rps:
        lim = np.where(r > 0, np.minimum(lim, np.floor(rps / np.maximum(r * threads, 1.0))),
                       lim)
    sps = num("sharedMemPerMultiprocessor")
    sm = np.asarray(smem, np.float64)
    if sps:
        lim = np.where(sm > 0, np.minimum(lim, np.floor(sps / np.maximum(sm, 1.0))), lim)
    cc = (p.get("computeMajor"), p.get("computeMinor"))
    if cc in MAX_BLOCKS_PER_SM:
        lim = np.minimum(lim, MAX_BLOCKS_PER_SM[cc])
    lim = np.where(np.isfinite(lim), lim, 1.0)
    return np.maximum(lim, 1.0)


def waves(grid: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Waves of blocks: ``ceil(grid / capacity)`` (capacity = SMs x resident blocks)."""
    return np.ceil(np.maximum(np.asarray(grid, np.float64), 1.0) /
                   np.maximum(np.asarray(capacity, np.float64), 1.0))


def launch_size(grid_x, grid_y, grid_z, block_x, block_y, block_z
                ) -> tuple[np.ndarray, np.ndarray]:
    """Each kernel's blocks (its grid) and threads per block, from their three dimensions
    each; a y or z of 0 (not recorded) counts as 1."""
    def f(a) -> np.ndarray:
        return np.asarray(a, np.float64)

    return (f(grid_x) * np.maximum(f(grid_y), 1.0) * np.maximum(f(grid_z), 1.0),
            f(block_x) * np.maximum(f(block_y), 1.0) * np.maximum(f(block_z), 1.0))


def block_ns(devices: list[dict] | None, device: np.ndarray, dur_ns: np.ndarray,
             blocks: np.ndarray, threads: np.ndarray, regs: np.ndarray,
             smem: np.ndarray) -> np.ndarray:
    """Each kernel's mean thread-block run time: its duration over its waves (``waves`` of its
    grid on the SMs of its DEVICE, the entry of DEVICES with that id, ``resident_blocks`` a
    SM), for a kernel that fills the device (at least one whole wave); 0 for one that leaves
    SMs free, and where the trace lacks what it takes (the device's properties or SM count,
    the kernel's grid): the caller's default applies."""
    out = np.zeros(len(dur_ns), np.int64)
    for p in devices or ():
        if not isinstance(p, dict) or not isinstance(p.get("id"), int):
            continue
        dev, sms = p["id"], p.get("numSms") or p.get("multiProcessorCount")
        if not isinstance(sms, (int, float)) or isinstance(sms, bool) or sms <= 0:
            continue
        on = np.flatnonzero(np.asarray(device) == dev)
        b = np.asarray(blocks, np.float64)[on]
        cap = float(sms) * resident_blocks(p, np.asarray(threads)[on], np.asarray(regs)[on],
                                           np.asarray(smem)[on])
        dur = np.asarray(dur_ns, np.float64)[on]
        out[on] = np.where((b > 0) & (b >= cap), dur / waves(b, cap), 0.0).astype(np.int64)
    return out
