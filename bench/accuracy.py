"""`make accuracy`: the accuracy suite, written to docs/accuracy.md.

1. Baseline replay error per iteration on every training trace in ../shared/traces (the ones
   shipped in tests/data when that folder is absent).
2. Share of GPU time mapped to a layer and to a phase, per trace.
3. What-if error on real pairs, where the transforms issue has added them (bench/whatif.py).

    python bench/accuracy.py [--store DIR] [--only whatif]

``--only whatif`` reruns the what-if section alone and merges it into the existing
docs/accuracy.md (the baseline section, which takes minutes, is kept as it was).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from daydream import api  # noqa: E402
from graphstore.labels import mapped_share  # noqa: E402
from graphstore.read import read_graph  # noqa: E402

SHARED = ROOT.parent / "shared" / "traces"
DATA = ROOT / "tests" / "data"
OUT = ROOT / "docs" / "accuracy.md"

# (label, path relative to ../shared/traces, fallback under tests/data or None)
TRAINING = [
    ("ResNet-50 DDP, A100 (HTA)", "hta/resnet50_ddp_a100_rank0.json.gz",
     "kineto/resnet50_ddp_a100_rank0.json.gz"),
    ("ResNet-50, V100 (HTA)", "hta/resnet50_v100_rank0.json.gz", None),
    ("Transformer DDP, V100 (HTA)", "hta/transformer_ddp_v100_rank1.json.gz", None),
    ("TorchRec, A100 (HTA)", "hta/torchrec_a100_rank0_of16.json.gz", None),
    ("Recsys DDP, A100 (HTA)", "hta/recsys_a100_rank3_of8.json.gz", None),
    ("ResNet-18, 2080 Ti (param)", "param/resnet18_2080ti.kineto.json.gz", None),
    ("MLP, 2080 Ti (param)", "param/mlp_2080ti.kineto.json.gz", None),
    ("ResNet-50 nw0 run 1, V100 (2021 schema)",
     "kineto-tb-plugin/resnet50_v100_nw0_run1.json.gz", "kineto/resnet50_v100_nw0_run1.json.gz"),
    ("ResNet-50 nw0 run 2, V100 (2021 schema)",
     "kineto-tb-plugin/resnet50_v100_nw0_run2.json.gz", None),
    ("ResNet act. ckpt DDP, MI300X (ROCm)", "tracelens/resnet_actckpt_mi300x_rank0_of8.json.gz",
     "kineto/resnet_actckpt_mi300x_rank0_of8.json.gz"),
    ("FSDP T5 slice, 2xH100 (nsys)", "nsys/fsdp_t5_2xh100_1s.sqlite",
     "nsys/fsdp_t5_2xh100_1s.sqlite"),
    ("DLRM rank 0 of 8, V100 (param)", "param/dlrm_8ranks/rank0.kineto.json.gz",
     "kineto/dlrm_8ranks/rank0.kineto.json.gz"),
    # a folder of rank traces: the job (all 8 ranks, collectives joined); errors per rank
    ("DLRM job, 8 ranks, V100 (param)", "param/dlrm_8ranks", "kineto/dlrm_8ranks"),
]


def traces() -> list[tuple[str, Path]]:
    out = []
    for label, rel, fallback in TRAINING:
        p = SHARED / rel
        if not p.exists() and fallback:
            p = DATA / fallback
        if p.exists():
            out.append((label, p))
    return out


def baseline_rows(store: Path) -> list[str]:
    rows = ["## Baseline replay", "",
            "The unmodified graph simulated and measured by the same rule (an iteration runs "
            "from its first CPU task to the next iteration's first; the last one to the end of "
            "its last task). Error = (simulated - measured) / measured, per iteration; a "
            "first iteration that is a warm-up outlier is shown but left out of the means.", "",
            "| trace | iterations (used) | measured ms (mean) | baseline ms (mean) | "
            "mean abs error | worst abs error | GPU time on a layer | GPU time on a phase |",
            "|---|---|---|---|---|---|---|---|"]
    for label, path in traces():
        d = api.predict(str(path), store)
        errs = [abs(i["error_pct"]) for i in d["iterations"] if i["error_pct"] is not None]
        if d.get("job") and len({r["trace_id"] for r in d.get("ranks", [])}) > 1:
            errs += [abs(r["error_pct"]) for r in d["ranks"] if r["error_pct"] is not None]
        used = sum(i["used"] for i in d["iterations"])
        tid = d["ranks"][0]["trace_id"] if d.get("ranks") else d["trace_id"]
        share = mapped_share(read_graph(store, tid)["task"])
        rows.append(f"| {label} | {len(d['iterations'])} ({used}) | {d['measured_ms']:.3f} | "
                    f"{d['baseline_ms']:.3f} | {sum(errs) / max(len(errs), 1):.3f}% | "
                    f"{max(errs, default=0):.3f}% | {100 * share['layer_share']:.1f}% | "
                    f"{100 * share['phase_share']:.1f}% |")
        print(f"accuracy: {label}: {d['baseline_error_pct']:+.4f}%", file=sys.stderr)
    return rows + [""]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", type=Path, default=ROOT / ".daydream-accuracy")
    ap.add_argument("--only", choices=["whatif"], default=None,
                    help="rerun one section and merge it into the existing file")
    a = ap.parse_args()
    if a.only == "whatif" and OUT.exists():
        import whatif
        text = OUT.read_text()
        head = text.split("## What-if pairs")[0]
        OUT.write_text(head + "\n".join(whatif.rows(a.store)))
        print(f"accuracy: merged the what-if section into {OUT.relative_to(ROOT)}",
              file=sys.stderr)
        return
    out = ["# Accuracy", "",
           f"Written by `make accuracy` on {dt.date.today()}. Traces from ../shared/traces "
           "(see its README); the store is kept in `.daydream-accuracy/` between runs.", ""]
    out += baseline_rows(a.store)
    try:
        import whatif  # noqa: F401  (added with the transforms)
        out += whatif.rows(a.store)
    except ImportError:
        out += ["## What-if pairs", "", "Not measured yet: the transforms are not built.", ""]
    OUT.write_text("\n".join(out))
    print(f"accuracy: wrote {OUT.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "bench"))
    main()
