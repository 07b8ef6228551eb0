"""Which libcupti the collection actually uses, recorded and checked against the bindings:
cupti-python lays out records for the CUPTI it was built for, and one process must not load two
libcupti (torch's and the bindings'). Runs without a GPU: libcupti itself loads without one."""

from __future__ import annotations

import importlib.metadata
import sys

import pytest

from daydream.base.errors import DaydreamError
from daydream.collect import cupti_backend as cb
from daydream.collect.api import collect
from daydream.ingest.cupti_raw import read_cupti_raw
from tests.collect import helpers as h

CU13 = "/env/lib/python3.12/site-packages/nvidia/cu13/lib/libcupti.so.13"
CU12 = "/env/lib/python3.12/site-packages/nvidia/cuda_cupti/lib/libcupti.so.12"


def _maps(*paths: str) -> str:
    return "".join(f"7f00{i:04x}000-7f00{i:04x}fff r-xp 00000000 08:01 {i} {p}\n"
                   for i, p in enumerate(paths)) + "7fff0000-7fff1000 rw-p 0 0:0 0 [stack]\n"


def test_loaded_libraries_from_the_process_map():
    assert cb.loaded_libcupti(_maps(CU13, CU13, "/usr/lib/libc.so.6")) == [CU13]
    assert cb.loaded_libcupti(_maps(CU13, CU12)) == [CU13, CU12]
    assert cb.loaded_libcupti(_maps("/usr/lib/libc.so.6")) == []


def test_two_libcupti_in_one_process_is_an_error():
    facts = cb.library_facts(maps=_maps(CU13, CU12), api_version=130400, bindings="13.4.0")
    with pytest.raises(DaydreamError, match=r"two libcupti.*libcupti\.so\.13.*libcupti\.so\.12"):
        cb.check_library(facts, env={})


def test_major_mismatch_is_an_error_that_names_the_fix():
    facts = cb.library_facts(maps=_maps(CU12), api_version=28, bindings="13.4.0")
    assert facts["major"] == 12
    with pytest.raises(DaydreamError, match=r"libcupti 12.*cupti-python 13\.4\.0.*"
                                            r"cupti-python==12\."):
        cb.check_library(facts, env={})


def test_older_minor_is_an_error():
    facts = cb.library_facts(maps=_maps(CU13), api_version=130001, bindings="13.4.0")
    assert facts["version"] == "13.0"
    with pytest.raises(DaydreamError, match=r"libcupti 13\.0 .*older than.*13\.4"):
        cb.check_library(facts, env={})
    # said, recorded and overridden on request
    facts = cb.library_facts(maps=_maps(CU13), api_version=130001, bindings="13.4.0")
    cb.check_library(facts, env={"DAYDREAM_COLLECT_ANY_CUPTI": "1"})
    assert "older than" in facts["mismatch"]


def test_matching_library_passes():
    facts = cb.library_facts(maps=_maps(CU13), api_version=130500, bindings="13.4.0")
    cb.check_library(facts, env={})
    assert facts["version"] == "13.5" and "mismatch" not in facts


def test_real_libcupti_is_found_and_named():
    """cupti-python's libcupti, loaded the way the bindings load it (cuda.pathfinder): its path,
    soname and the wheel it came from."""
    pytest.importorskip("cupti.cupti")
    pathfinder = pytest.importorskip("cuda.pathfinder")
    lib = pathfinder.load_nvidia_dynamic_lib("cupti")
    facts = cb.library_facts()
    assert facts["path"] is not None and facts["path"].endswith(lib.abs_path.rsplit("/", 1)[-1])
    assert facts["soname"].startswith("libcupti.so.") and facts["major"] == 13
    dist = importlib.metadata.version("nvidia-cuda-cupti")
    assert facts["package"] == f"nvidia-cuda-cupti {dist}"
    assert facts["bindings"] == importlib.metadata.version("cupti-python")


def test_header_records_the_library(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with collect(tmp_path, 1, model=model, optimizer=opt, backend=h.FakeBackend, prefix="job"):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    conv = read_cupti_raw(tmp_path / "job.cupti")
    assert conv.metadata["libcupti"] == {"path": "fake", "api_version": 130400}


def test_import_of_the_backend_needs_no_gpu():
    assert "cupti_backend" in cb.__name__ and sys.modules["daydream.collect.cupti_backend"] is cb
