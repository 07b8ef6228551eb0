"""Shared test fixtures: where the real traces are."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
# The shared trace folder beside the repository, when present (developers' machines and CI).
SHARED = ROOT.parent / "shared" / "traces"


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
