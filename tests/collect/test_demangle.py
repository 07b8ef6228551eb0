"""Kernel names as the profiler writes them: CUPTI hands kernels' mangled names, Kineto passes
them through __cxa_demangle unless longer than 1024 characters. Checked on real names: mangled
ones from the Nsight exports in tests/data/nsys, whose demangled form must be a kernel name of
the Kineto traces in tests/data/kineto as the Kineto reader gives it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from daydream.collect.demangle import demangle
from daydream.collect.recorder import Recorder
from daydream.collect.writer import RawWriter
from daydream.ingest import cupti_format as fmt
from daydream.ingest.cupti_raw import read_cupti_raw
from tests.collect import helpers as h

DATA = Path(__file__).resolve().parents[1] / "data"
KINETO = ["kineto/resnet50_ddp_a100_rank0.json.gz", "kineto/dlrm_8ranks/rank0.kineto.json.gz",
          "kineto/mi250_toy_train_rocm.json.gz"]


def _nsys_mangled() -> list[str]:
    out = set()
    for f in ("mock_rtx3080.sqlite", "fsdp_t5_2xh100_1s.sqlite"):
        con = sqlite3.connect(DATA / "nsys" / f)
        out.update(v for (v,) in con.execute(
            "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            "JOIN StringIds s ON k.mangledName = s.id"))
    return sorted(out)


@pytest.fixture(scope="module")
def kineto_names() -> set[str]:
    from daydream.ingest.convert import read_trace
    names = set()
    for rel in KINETO:
        names.update(read_trace(DATA / rel).tables["kernel"]["name"].to_pylist())
    return names


def test_demangled_as_kineto_names_them(kineto_names):
    mangled = [m for m in _nsys_mangled() if m.startswith("_Z")]
    found = {m: demangle(m) for m in mangled if demangle(m) in kineto_names}
    # four kernels of the Nsight exports also ran in those Kineto traces (reduce_kernel,
    # elementwise_kernel twice, elementwise_kernel_with_index)
    assert len(found) >= 4, found
    for m, d in found.items():
        assert d != m and not d.startswith("_Z")


def test_long_names_stay_mangled_as_in_kineto(kineto_names):
    """Kineto leaves names over 1024 characters mangled: resnet50_ddp_a100 has two cutlass
    kernels so named. Ours must be the same string."""
    long = sorted(n for n in kineto_names if n.startswith("_Z") and len(n) > 1024)
    assert len(long) >= 2
    for n in long:
        assert demangle(n) == n
    short = "_ZN2at6native13reduce_kernelILi512ELi1EEEvv"
    assert demangle(short) == "void at::native::reduce_kernel<512, 1>()"


def test_plain_names_are_left_alone():
    for n in ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16_kernel", "gemm_kernel",
              "i", "", "_Znot_really"):
        assert demangle(n) == n


def test_collected_kernel_names_are_demangled(tmp_path):
    strings = h.Strings()
    mangled = "_ZN2at6native13reduce_kernelILi512ELi1EEEvv"
    buf = h.Buffer([("ActivityKernel13", h.record(
        "ActivityKernel13", kind=fmt.KIND_CONCURRENT_KERNEL, start=h.T0 + 10, end=h.T0 + 20,
        correlation_id=1, name=strings.ptr(mangled))), ("ActivityKernel13", h.record(
        "ActivityKernel13", kind=fmt.KIND_CONCURRENT_KERNEL, start=h.T0 + 30, end=h.T0 + 40,
        correlation_id=2, name=strings.ptr("gemm_kernel")))])
    path = tmp_path / "k.cupti"
    rec = Recorder(RawWriter(path, {}))
    rec.handle_buffer(buf.activities)
    rec.close()
    names = read_cupti_raw(path).tables["kernel"]["name"].to_pylist()
    assert names == ["void at::native::reduce_kernel<512, 1>()", "gemm_kernel"]
