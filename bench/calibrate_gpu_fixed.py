"""The fixed launch-to-finish cost of a kernel on an H100 and on an MI300X, per kernel group,
for gpu(NAME) between vendors (transforms.constants.GPU_ACHIEVED, ``*_fixed_ns``).

A kernel that does (almost) no work still takes a fixed time from its first block's start to
its last block's end; it differs by GPU and vendor. This script reads it from the raw kernel
records of one calibration trace per GPU: the 10th percentile of the durations of its kernels
of each group (``memory``: element-wise, normalization, reduction, layout kernels; ``matrix``:
GEMMs and convolutions; transforms.kernel_class ``classify``).

    .venv/bin/python bench/calibrate_gpu_fixed.py

The calibration traces are the shared H100 and MI300X traces that no GPU-model case judges:
nsys/fsdp_t5_2xh100_1s (Nsight Systems export) and tracelens/resnet_actckpt_mi300x_rank0_of8
(Kineto JSON), read through bench/manifest.py's calibration_path (the manifest gives them no other
role). The tracelens inference pairs (../shared/judge) are judged and never read here.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import manifest  # noqa: E402
from daydream.transforms import kernel_class as K  # noqa: E402

SHARED = ROOT.parent / "shared" / "traces"
CALIBRATION = {"h100-sxm": "nsys/fsdp_t5_2xh100_1s.sqlite",
               "mi300x": "tracelens/resnet_actckpt_mi300x_rank0_of8.json.gz"}
PERCENTILE = 10


def kernels(path: Path) -> list[tuple[str, float]]:
    """(name, duration in ns) of every kernel of a Kineto JSON or Nsight SQLite trace."""
    if path.suffix == ".sqlite":
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        rows = con.execute("SELECT s.value, k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                           "JOIN StringIds s ON s.id = k.demangledName").fetchall()
        return [(n, float(d)) for n, d in rows]
    with gzip.open(path, "rt") as f:
        ev = json.load(f)["traceEvents"]
    return [(e["name"], float(e["dur"]) * 1e3) for e in ev
            if e.get("ph") == "X" and e.get("cat") == "kernel"]


def group(name: str) -> str | None:
    op = K.classify(name).op
    return {"memory": "memory", "gemm": "matrix", "conv": "matrix",
            "attention": "attention"}.get(op)


def main() -> int:
    for dev, rel in CALIBRATION.items():
        path = manifest.calibration_path(rel)
        if not path.exists():
            print(f"{dev}: {rel} not found (../shared/traces)")
            continue
        by: dict[str, list[float]] = {}
        for name, dur in kernels(path):
            g = group(name)
            if g:
                by.setdefault(g, []).append(dur)
        for g, v in sorted(by.items()):
            print(f"{dev} {g}_fixed_ns: {np.percentile(v, PERCENTILE):.0f} "
                  f"({PERCENTILE}th percentile of {len(v)} kernels of {rel})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
