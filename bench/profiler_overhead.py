"""The profiler's own CPU cost per recorded op, fitted on the CPU pairs of tests/data/whatif.

Each variant there was timed twice (bench/whatif_record.py, measured.json): profiled (the kept
take's mean step, ``profiled_mean_ms``) and without the profiler (``unprofiled_mean_ms``, the
median of 9 interleaved rounds). The difference per step, over the ops the profiler recorded per
step (``cpu_op`` events inside a ``ProfilerStep#N``, counted from the raw trace), is its cost per
recorded op; the median over the variants is what transforms.constants.PROFILER per_op_ns
holds. The traces are CPU-only: they have no runtime calls, so the cost per traced CUDA runtime
call cannot be fitted here (PROFILER per_call_ns says so).

    .venv/bin/python bench/profiler_overhead.py
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WHATIF = ROOT / "tests" / "data" / "whatif"


def ops_per_step(path: Path) -> float:
    """cpu_op events per ProfilerStep#N of a Kineto trace (read raw, no project code)."""
    with gzip.open(path, "rt") as f:
        ev = json.load(f)["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev
                   if str(e.get("name", "")).startswith("ProfilerStep#") and "dur" in e)
    if not steps:
        raise SystemExit(f"{path}: no ProfilerStep#N events")
    starts = np.array([s for s, _ in steps])
    ends = np.array([e for _, e in steps])
    ts = np.array([e["ts"] for e in ev if e.get("cat") == "cpu_op"], np.float64)
    k = np.searchsorted(starts, ts, "right") - 1
    inside = (k >= 0) & (ts <= ends[np.clip(k, 0, len(ends) - 1)])
    return float(inside.sum()) / len(steps)


def fit(whatif: Path = WHATIF) -> list[dict]:
    """Per variant: ops per step, profiled and unprofiled ms, the cost per op in us."""
    meas = json.loads((whatif / "measured.json").read_text())
    rows = []
    for name, m in sorted(meas.items()):
        if name.startswith("_"):
            continue
        n = ops_per_step(whatif / f"{name}.json.gz")
        d_ms = m["profiled_mean_ms"] - m["unprofiled_mean_ms"]
        rows.append({"variant": name, "ops_per_step": n, "profiled_ms": m["profiled_mean_ms"],
                     "unprofiled_ms": m["unprofiled_mean_ms"],
                     "per_op_us": 1e3 * d_ms / n})
    return rows


def main() -> int:
    rows = fit()
    for r in rows:
        print(f"{r['variant']:24s} {r['ops_per_step']:7.0f} ops/step  profiled "
              f"{r['profiled_ms']:6.2f} ms  unprofiled {r['unprofiled_ms']:6.2f} ms  "
              f"{r['per_op_us']:6.2f} us/op")
    med = float(np.median([r["per_op_us"] for r in rows]))
    print(f"median over {len(rows)} variants: {med:.2f} us per recorded op")
    return 0


if __name__ == "__main__":
    sys.exit(main())
