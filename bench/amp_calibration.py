"""The arithmetic intensities of real matrix kernels, for AMP on traces without shapes.

A matrix kernel's AMP speedup on a roofline depends on its arithmetic intensity (FLOPs per
byte): a compute-bound convolution gains the tensor/CUDA-core peak ratio, a bandwidth-bound one
the halved bytes. A trace that records no shapes does not tell it, so ``amp`` takes the
work-weighted distribution of intensities of the same kernel class in traces that do
(transforms.constants.AMP_INTENSITY). This script measures them: for every matrix kernel of
forward and backward whose op's shapes are recorded, intensity = F / B (transforms/opts/amp.py
``op_work``) and work = duration minus the trace's fixed kernel cost; it prints the histogram
(4 bins a decade) to paste into AMP_INTENSITY with this run's date.

It also measures constants.AMP_TRANSPOSE, the rule that sizes cuDNN's NCHW<->NHWC transposes
around a 16-bit convolution whose op records no shapes: per pass (forward, backward), the
transposed bytes of the convolution calls with shapes (passes x B, amp.layout_transposes) over
the peak FLOPs of their kernels' FP32 work (amp.peak_flops), and checks it with the shapes
withheld: the whole trace (in-sample), each half of the layers sized by the other half's rule
(the layer-split check: conv calls alternate between halves by their order in their iteration
and pass), each iteration by the others', and the spread per call.

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
CALIBRATION = {"conv": manifest.calibration("amp.conv"), "gemm": manifest.calibration("amp.gemm"),
               "transpose": manifest.calibration("amp.transpose")}
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


def transpose_calls(path: Path, store: Path) -> tuple[list[dict], int, str]:
    """The convolution calls with shapes of PATH (amp.transpose_calls: pass, iteration,
    transposed bytes, peak FLOPs of their work), the number of lowered convolution kernels, and
    the device whose peaks count the FLOPs."""
    import polars as pl

    from daydream import pipeline
    from daydream.ingest.store import Store
    from daydream.transforms.constants import AMP
    from daydream.transforms.kernel_class import kernel_precision
    from daydream.transforms.opts import amp
    from daydream.transforms.primitives import Graph

    s = pipeline.resolve(str(path), Store(store))
    g = Graph.from_tables(s.tables)
    kern = g.task.with_row_index("id").with_columns(pl.col("id").cast(pl.Int64)).filter(
        pl.col("kind") == "kernel")
    names = kern["name"].fill_null("").to_list()
    prec = [kernel_precision(n) for n in names]
    dev, _ = amp.amp_device(pipeline.context(s), names)
    pk = amp.peaks(dev, "fp16")
    ops = amp.Ops(s.activity("range"))
    dt, op_rid = amp.kernel_dtypes(g, kern, prec, ops)
    work = amp.matrix_work(kern, prec, ops, op_rid)
    dur = kern["dur_ns"].to_numpy()
    t0 = float(np.percentile(dur, AMP["fixed_percentile"]["value"]))
    region = np.array([ph in amp.PHASES and it is not None for ph, it in zip(
        kern["phase"].to_list(), kern["iteration"].to_list(), strict=True)], bool)
    conv = amp.conv_kernels(prec, dt, region, ops, op_rid)
    return amp.transpose_calls(kern, prec, conv, work, ops, op_rid, t0, pk), len(conv), dev.name


def transpose_rule(calls: list[dict]) -> dict[str, float]:
    """Per pass: transposed bytes per peak FLOP of work, work-weighted (sum over sum)."""
    out = {}
    for k in ("forward", "backward"):
        cs = [c for c in calls if c["pass"] == k]
        f = sum(c["flops"] for c in cs)
        if f > 0:
            out[k] = sum(c["bytes"] for c in cs) / f
    return out


def rule_error(fit: list[dict], held: list[dict]) -> float:
    """Relative error of HELD's transposed bytes sized by FIT's rule, against their shapes."""
    q = transpose_rule(fit)
    got = sum(q.get(c["pass"], 0.0) * c["flops"] for c in held)
    want = sum(c["bytes"] for c in held)
    return got / want - 1 if want else float("nan")


def transpose_check(calls: list[dict]) -> dict:
    """The rule's errors with the shapes withheld (see the module's docstring)."""
    pos: dict[tuple, int] = {}
    half = []
    for c in sorted(calls, key=lambda c: c["kernels"][0]):
        key = (c["iteration"], c["pass"])
        half.append(pos.get(key, 0) % 2)
        pos[key] = pos.get(key, 0) + 1
    order = sorted(calls, key=lambda c: c["kernels"][0])
    a = [c for c, h in zip(order, half, strict=True) if h == 0]
    b = [c for c, h in zip(order, half, strict=True) if h == 1]
    its = sorted({c["iteration"] for c in calls})
    per_it = [rule_error([c for c in calls if c["iteration"] != i],
                         [c for c in calls if c["iteration"] == i]) for i in its]
    q = transpose_rule(calls)
    per_call = np.array([abs(q[c["pass"]] * c["flops"] / c["bytes"] - 1) for c in calls
                         if c["bytes"] > 0])
    return {"in_sample": rule_error(calls, calls),
            "per_pass_in_sample": {k: rule_error(calls, [c for c in calls if c["pass"] == k])
                                   for k in q},
            "layer_split": (rule_error(a, b), rule_error(b, a)),
            "iteration_out": per_it,
            "per_call_median": float(np.median(per_call)),
            "per_call_p90": float(np.percentile(per_call, 90))}


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
        if cls == "transpose":
            continue
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
    calls: list[dict] = []
    for rel in CALIBRATION.get("transpose", []):
        p = manifest.calibration_path(rel)
        if not p.exists():
            print(f"# {rel}: not here, skipped", file=sys.stderr)
            continue
        got, n_conv, dev = transpose_calls(p, a.store)
        print(f"# {rel}: {len(got)} convolution calls with shapes "
              f"({sum(len(c['kernels']) for c in got)} of its {n_conv} lowered convolution "
              f"kernels), peaks of the {dev}", file=sys.stderr)
        calls += got
    if calls:
        q = transpose_rule(calls)
        print("AMP_TRANSPOSE value: {" + ", ".join(f'"{k}": {v:.4g}' for k, v in q.items())
              + "}")
        chk = transpose_check(calls)
        print("# check, shapes withheld: in-sample {:+.2%} (per pass {}); layer split "
              "{:+.2%} / {:+.2%}; each iteration by the others {}; per call |error| "
              "median {:.0%}, 90th percentile {:.0%}".format(
                  chk["in_sample"], ", ".join(f"{k} {v:+.2%}" for k, v in
                                               chk["per_pass_in_sample"].items()),
                  *chk["layer_split"], ", ".join(f"{e:+.2%}" for e in chk["iteration_out"]),
                  chk["per_call_median"], chk["per_call_p90"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
