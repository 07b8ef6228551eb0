"""How long before its end a kernel that fills the GPU lets another stream's waiting kernel in:
graphstore/build.py DRAIN_BLOCKS, the contention window in mean thread-block run times.

A kernel launched onto a stream while another stream's kernel holds every SM cannot start until
that kernel has no blocks left to schedule and one of its SMs frees room: in the occupant's
last wave. Were every block equally long, that is one block time (its duration over its waves,
``base.occupancy.block_ns``) before the occupant's end; blocks of one kernel are not equally
long, so the window is wider. This script reads the raw kernel records of the calibration
traces (bench/manifest.py ``calibration_path``; never a judged trace) and finds every kernel
that began later than its stream and its launch allowed (by more than UNEXPLAINED_NS), that no
other stream's task ended just before (an inferred wait's case), and during which exactly one
kernel of another stream ran that fills the device and had begun by the time it was ready.
It prints, for each, how many of that occupant's block times before the occupant's end it
began, and DRAIN_BLOCKS = the largest, rounded up.

    .venv/bin/python bench/calibrate_drain.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import manifest  # noqa: E402
from daydream.base import occupancy  # noqa: E402
from daydream.graphstore.build import UNEXPLAINED_NS, WAIT_TOL_NS, is_comm_name  # noqa: E402
from daydream.ingest.convert import read_trace  # noqa: E402

FIT = "contention.drain"


def drain_ratios(path: Path) -> list[dict]:
    """The late kernels of PATH that one filling kernel held (module doc): where each began, in
    that kernel's block times before its end."""
    conv = read_trace(path)
    k, api = conv.tables["kernel"], conv.tables["api"]
    if not k.num_rows:
        return []

    def col(t, c):
        return np.nan_to_num(t[c].to_numpy(zero_copy_only=False).astype(np.float64))

    dev, stream = col(k, "device"), col(k, "stream")
    start, dur = col(k, "start_ns"), col(k, "dur_ns")
    end = start + dur
    names = k["name"].to_pylist()
    comm = np.array([is_comm_name(n or "") for n in names])
    blocks, threads = occupancy.launch_size(*(col(k, c) for c in (
        "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")))
    blk = occupancy.block_ns(conv.devices, dev.astype(np.int64), dur, blocks, threads,
                             col(k, "registers_per_thread"), col(k, "shared_memory_bytes"))
    # ready: the later of the stream predecessor's end and the launching call's return
    launch_end = {int(c): int(s + d) for c, s, d in zip(
        col(api, "correlation"), col(api, "start_ns"), col(api, "dur_ns"), strict=True)}
    corr = col(k, "correlation")
    o = np.lexsort((start, stream, dev))
    prev_end = np.full(len(start), -1.0)
    same = (dev[o][1:] == dev[o][:-1]) & (stream[o][1:] == stream[o][:-1])
    prev_end[o[1:][same]] = end[o[:-1][same]]
    out = []
    for i in range(len(start)):
        ready = max(prev_end[i], launch_end.get(int(corr[i]), -1))
        if ready < 0 or start[i] - ready <= UNEXPLAINED_NS:
            continue
        other = (dev == dev[i]) & (stream != stream[i])
        if (other & (end >= start[i] - WAIT_TOL_NS) & (end <= start[i])).any():
            continue  # another stream's task ended just before: a wait's case, not this one
        occ = np.flatnonzero(other & ~comm & (start <= ready) & (end > start[i]))
        if len(occ) != 1 or blk[occ[0]] <= 0:
            continue
        j = occ[0]
        out.append({"before_end_us": (end[j] - start[i]) / 1e3,
                    "block_us": blk[j] / 1e3, "blocks": (end[j] - start[i]) / blk[j],
                    "occupant": names[j][:60]})
    return out


def main() -> int:
    found = []
    for rel in manifest.calibration(FIT):
        path = manifest.calibration_path(rel)
        if not path.exists():
            print(f"{rel}: not here (../shared/traces)")
            continue
        rows = drain_ratios(path)
        print(f"{rel}: {len(rows)} late kernels held by one filling kernel")
        for r in rows:
            print(f"   {r['blocks']:.2f} block times ({r['before_end_us']:.0f} us, block "
                  f"{r['block_us']:.1f} us) before the end of {r['occupant']}")
        found += [r["blocks"] for r in rows]
    if not found:
        print("no instance: DRAIN_BLOCKS cannot be fitted on these traces")
        return 1
    print(f"DRAIN_BLOCKS = {math.ceil(max(found))} (largest {max(found):.2f} of {len(found)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
