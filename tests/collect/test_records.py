"""daydream.collect.records against cupti-python's own record dtypes, and the collector fed with
cupti-python's own record wrappers (both skipped where cupti-python is not installed: it imports
without a GPU, but is an optional dependency)."""

from __future__ import annotations

import numpy as np
import pytest

from daydream.collect import records
from daydream.collect.recorder import Recorder
from daydream.collect.writer import RawWriter
from daydream.ingest import cupti_format as fmt
from daydream.ingest import cupti_raw
from daydream.ingest.cupti_raw import read_cupti_raw
from tests.collect import helpers as h


def test_layouts_are_self_consistent():
    for cls in records.known_classes():
        lay = records.layout(cls)
        assert lay.struct == f"CUpti_{cls}"
        assert lay.dtype.itemsize % 8 == 0
        for s in lay.strings:
            assert lay.dtype.fields[s][0] == np.dtype("<i8")
        fam = cupti_raw.family(lay.struct)
        assert fam is not None, cls
        have = set(lay.dtype.names)
        assert set(cupti_raw._NEEDS[fam]) <= have, (cls, set(cupti_raw._NEEDS[fam]) - have)


def test_layouts_match_cupti_python():
    cupti = pytest.importorskip("cupti.cupti")
    for cls in records.known_classes():
        assert hasattr(cupti, cls), cls
        theirs = records.cupti_dtype(cls)
        assert theirs is not None, cls
        ours = records.layout(cls).dtype
        assert ours.itemsize == theirs.itemsize, cls
        leaves = {name: (fmt_, off) for name, fmt_, off, _ in fmt.flatten_dtype(theirs)}
        for name in ours.names:
            sub, off = ours.fields[name][:2]
            assert leaves.get(name) == (sub.str, off), (cls, name, leaves.get(name))


def test_unlisted_class_falls_back_to_cupti_python():
    pytest.importorskip("cupti.cupti")
    lay = records.layout("ActivityOverhead3")
    assert lay is not None and lay.dtype.itemsize == 56
    assert records.layout("ActivityNoSuchThing") is None


def test_handles_cupti_python_record_wrappers(tmp_path):
    """The objects cupti-python's buffer callback receives, made with its own ``from_ptr`` over
    a buffer of records: the collector reads them as it reads CUPTI's."""
    cupti = pytest.importorskip("cupti.cupti")
    strings = h.Strings()
    recs = h.scenario(strings)[0] + h.scenario(strings)[1]
    buf = h.Buffer(recs)
    wrappers = []
    for (cls, _), stand_in in zip(recs, buf.activities, strict=True):
        w = getattr(cupti, cls).from_ptr(stand_in.ptr, readonly=True, owner=buf.memory)
        assert w.ptr == stand_in.ptr
        wrappers.append(w)
    kernel = next(w for w in wrappers if type(w).__name__ == "ActivityKernel13")
    assert kernel.name == "relu_kernel"  # cupti-python reads the same bytes the same way
    path = tmp_path / "real.cupti"
    rec = Recorder(RawWriter(path, {"external_correlation_kind": h.CUSTOM2}),
                   api_name=h.api_name)
    rec.handle_buffer(wrappers)
    rec.close()
    conv = read_cupti_raw(path)
    assert sorted(conv.tables["kernel"]["name"].to_pylist()) == [
        "gemm_kernel", "gemm_kernel", "relu_kernel"]
    assert conv.tables["api"].num_rows == 6 and conv.tables["sync"].num_rows == 1
    assert conv.devices[0]["name"] == "NVIDIA H200"
