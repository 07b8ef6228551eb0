"""The shared training traces every per-trace section runs on (../shared/traces, README there;
the copies in tests/data stand in where that folder is absent)."""

from __future__ import annotations

import re
from pathlib import Path

from bench.accuracy import ROOT

SHARED = ROOT.parent / "shared" / "traces"
DATA = ROOT / "tests" / "data"

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


def resolve(rel: str, fallback: str | None) -> Path | None:
    p = SHARED / rel
    if not p.exists() and fallback:
        p = DATA / fallback
    return p if p.exists() else None


def training() -> list[tuple[str, Path]]:
    """(label, path) of every training trace that is here."""
    out = []
    for label, rel, fallback in TRAINING:
        p = resolve(rel, fallback)
        if p is not None:
            out.append((label, p))
    return out


def rank_files(folder: Path) -> list[Path]:
    """The rank traces of a job folder (execution traces beside them left out)."""
    return sorted(p for p in folder.iterdir()
                  if p.name.endswith((".json", ".json.gz")) and ".et." not in p.name)


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")
