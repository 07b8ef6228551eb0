"""The arithmetic intensities of real matrix kernels, for AMP on traces without shapes.

A matrix kernel's AMP speedup on a roofline depends on its arithmetic intensity (FLOPs per
byte): a compute-bound convolution gains the tensor/CUDA-core peak ratio, a bandwidth-bound one
the halved bytes. A trace that records no shapes does not tell it, so ``amp`` takes the
work-weighted distribution of intensities of the same kernel class in traces that do
(transforms.constants.AMP_INTENSITY). This script measures them: for every matrix kernel of
forward and backward whose op's shapes are recorded, intensity = F / B (transforms/opts/amp.py
``op_work``) and work = duration minus the trace's fixed kernel cost; it prints the histogram
(4 bins a decade) to paste into AMP_INTENSITY with this run's date.

    .venv/bin/python bench/amp_calibration.py [--store DIR]

The calibration traces are bench/manifest.py's for "amp.conv" and "amp.gemm", read through
``manifest.calibration_path`` (which refuses a judged trace): none that the AMP check of
bench/accuracy (hta/resnet50_v100_rank0, which records no shapes) or any other measure judges.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import manifest  # noqa: E402

SHARED = manifest.SHARED
CALIBRATION = {"conv": manifest.calibration("amp.conv"), "gemm": manifest.calibration("amp.gemm")}
BINS_PER_DECADE = 4


def intensities(path: Path, store: Path) -> dict[str, list[tuple[float, float]]]:
    """(intensity, work ns) of every shaped matrix kernel of forward and backward, by class."""
    import polars as pl

    from daydream import pipeline
    from daydream.ingest.store import Store
    from daydream.transforms.kernel_class import kernel_precision
    from daydream.transforms.opts import amp
    from daydream.transforms.primitives import Graph

    s = pipeline.resolve(str(path), Store(store))
    g = Graph.from_tables(s.tables)
    kern = g.task.with_row_index("id").with_columns(pl.col("id").cast(pl.Int64)).filter(
        pl.col("kind") == "kernel")
    prec = [kernel_precision(n) for n in kern["name"].fill_null("").to_list()]
    ops = amp.Ops(s.activity("range"))
    _, op_rid = amp.kernel_dtypes(g, kern, prec, ops)
    work = amp.matrix_work(kern, prec, ops, op_rid)
    dur = kern["dur_ns"].to_numpy()
    t0 = float(np.percentile(dur, 10))
    phase = kern["phase"].to_list()
    out: dict[str, list[tuple[float, float]]] = {}
    for j, p in enumerate(prec):
        if p.math and work[j] is not None and phase[j] in amp.PHASES and work[j][1] > 0:
            f, b, _ = work[j]
            out.setdefault(p.op, []).append((f / b, max(float(dur[j]) - t0, 0.0)))
    return out


def histogram(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(bin centre intensity, share of work) per occupied log bin."""
    ai = np.array([a for a, _ in points])
    w = np.array([x for _, x in points])
    lo = np.floor(np.log10(ai.min()) * BINS_PER_DECADE)
    hi = np.ceil(np.log10(ai.max()) * BINS_PER_DECADE) + 1
    edges = 10 ** (np.arange(lo, hi + 1) / BINS_PER_DECADE)
    idx = np.clip(np.searchsorted(edges, ai, "right") - 1, 0, len(edges) - 2)
    out = []
    for b in np.unique(idx):
        share = w[idx == b].sum() / w.sum()
        if share > 0:
            out.append((round(float(np.sqrt(edges[b] * edges[b + 1])), 2), round(float(share), 4)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=ROOT / ".daydream-accuracy")
    a = ap.parse_args(argv)
    for cls, files in CALIBRATION.items():
        pts: list[tuple[float, float]] = []
        for rel in files:
            p = manifest.calibration_path(rel)
            if not p.exists():
                print(f"# {rel}: not here, skipped", file=sys.stderr)
                continue
            got = intensities(p, a.store).get(cls, [])
            print(f"# {rel}: {len(got)} {cls} kernels with shapes", file=sys.stderr)
            pts += got
        if pts:
            print(f'"{cls}": {histogram(pts)},')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
