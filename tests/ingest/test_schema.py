"""The declared schema: the generated doc is current, and conform() enforces declarations."""

from __future__ import annotations

import pyarrow as pa
import pytest

from daydream.ingest import schema
from tests.conftest import ROOT


def test_schema_doc_is_current():
    assert (ROOT / "docs" / "schema.md").read_text() == schema.markdown(), \
        "docs/schema.md is stale: run `python -m daydream.ingest.schema > docs/schema.md`"


def test_conform_fills_missing_and_rejects_undeclared():
    t = schema.conform("memset", {"start_ns": [1], "dur_ns": [2], "name": ["Memset (Device)"]})
    assert t.schema == schema.MEMSET.schema
    assert t["bytes"].to_pylist() == [None]
    assert t["name"].type == schema.NAME
    with pytest.raises(ValueError, match="undeclared columns"):
        schema.conform("memset", {"start_ns": [1], "dur_ns": [2], "oops": [3]})


def test_every_time_column_is_int64_ns():
    for t in schema.TABLES.values():
        for c in t.columns:
            if c.name.endswith("_ns"):
                assert c.type == pa.int64(), (t.name, c.name)
