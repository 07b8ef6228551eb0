"""The shared training traces every per-trace section runs on (../shared/traces, README there;
the copies in tests/data stand in where that folder is absent). Which traces these are is
bench/manifest.py's to say: the sections judge judged traces only."""

from __future__ import annotations

import re
from pathlib import Path

from bench import manifest
from bench.accuracy import ROOT

SHARED = ROOT.parent / "shared" / "traces"
DATA = ROOT / "tests" / "data"

# (label, path relative to ../shared/traces, fallback under tests/data or None): the judged
# training traces of bench/manifest.py
TRAINING = manifest.training()


def resolve(rel: str, fallback: str | None) -> Path | None:
    """The file of a judged trace (or its copy under tests/data), None when neither is here;
    a trace the manifest does not judge is refused (manifest.RoleError)."""
    return manifest.judged_path(rel, fallback)


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
