"""Shared test fixtures: where the real traces are."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
# The shared trace folder beside the repository, when present (developers' machines and CI).
SHARED = ROOT.parent / "shared" / "traces"
# The 8 ranks of one real DLRM run (facebookresearch/param; SOURCE.md beside it).
DLRM = DATA / "kineto" / "dlrm_8ranks"


def kineto_files(include_shared: bool = True) -> list[Path]:
    """Every Kineto JSON trace in tests/data, plus those in ../shared/traces when present."""
    files = sorted(p for p in (DATA / "kineto").rglob("*.json*"))
    if include_shared and SHARED.exists():
        seen = {p.name for p in files}
        files += sorted(p for p in SHARED.rglob("*.json*")
                        if ".et." not in p.name and p.name not in seen)
    return files


@pytest.fixture
def data_dir() -> Path:
    return DATA


def stored_graphs(paths: list[Path], root: Path, job: str | None = None) -> dict[Path, str]:
    """Ingest PATHS into the store at ROOT and build their graphs, with the stages' own entry
    points (``ingest.batch_ingest.ingest``, ``graphstore.load.load``), not through daydream: the
    fixtures of the stage tests depend only on the stages before them. Returns each file's
    trace id."""
    from daydream.graphstore import load
    from daydream.ingest.batch_ingest import ingest
    from daydream.ingest.store import Store

    rep = ingest(paths, Store(root), jobs=1, strict=True, job=job)
    ids = {Path(r.path): r.trace_id for r in rep.results}
    for tid in sorted(set(ids.values())):
        load.load(root, tid)
    return ids


def dlrm_nccl(rank: int) -> list[dict]:
    """A DLRM rank's NCCL kernels straight from its JSON, in start order: what the tests of
    collective matching check against, independent of ingest."""
    with gzip.open(DLRM / f"rank{rank}.kineto.json.gz") as f:
        ev = json.load(f)["traceEvents"]
    ks = [e for e in ev if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
    return sorted(ks, key=lambda e: e["ts"])


def pytest_sessionfinish(session, exitstatus):
    """Every call of a compiled kernel made by the tests matched its declared types: one that
    did not ran on numba's JIT (daydream.base.compiled.FALLBACKS), slower and compiling first;
    the tests that make such calls on purpose clear the list."""
    from daydream.base import compiled
    if compiled.FALLBACKS and exitstatus == 0:
        print(f"\ncalls that fell back to numba's JIT: {sorted(set(compiled.FALLBACKS))}")
        session.exitstatus = 1
