"""Kernel classes (transforms/kernel_class.py) against every kernel name of the shared traces, each
class checked by hand (tests/data/kernels/names.tsv), and the class a kernel takes on another
GPU under PyTorch's TF32 defaults; the GPU families (transforms/devices.py) rest on the GPU
table."""

from __future__ import annotations

import gzip
import sqlite3

import orjson
import pytest

from daydream.transforms import hardware as hw
from daydream.transforms.devices import ARCHITECTURE_FAMILY, FAMILIES, family
from daydream.transforms.kernel_class import MATHS, OPS, Kernel, classify, on_device, op_kind
from tests.conftest import DATA, SHARED

NAMES = DATA / "kernels" / "names.tsv"


def rows() -> list[tuple[str, str, str, str]]:
    out = []
    for line in NAMES.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        math, op, where, name = line.split("\t", 3)
        out.append((math, op, where, name))
    return out


def test_every_name_has_its_hand_checked_class():
    table = rows()
    assert len(table) == 767
    wrong = [(name[:90], (math, op), (k.math, k.op)) for math, op, _, name in table
             if (k := classify(name)) and (k.math, k.op) != (math, op)]
    assert not wrong
    assert {m for m, *_ in table} <= set(MATHS) and {o for _, o, *_ in table} <= set(OPS)


def _shared_kernel_names() -> set[str]:
    names: set[str] = set()
    for p in [*SHARED.rglob("*.json.gz"), *SHARED.rglob("*.json")]:
        if ".et." in p.name:
            continue
        with (gzip.open(p) if p.suffix == ".gz" else p.open("rb")) as f:
            d = orjson.loads(f.read())
        ev = d["traceEvents"] if isinstance(d, dict) else d
        names |= {e["name"] for e in ev if str(e.get("cat", "")).lower() == "kernel"}
    for p in SHARED.rglob("*.sqlite"):
        con = sqlite3.connect(p)
        names |= {n for (n,) in con.execute(
            "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
            "ON k.demangledName = s.id")}
    return names


@pytest.mark.skipif(not SHARED.exists(), reason="needs ../shared/traces")
def test_the_table_covers_every_shared_kernel_name():
    assert _shared_kernel_names() == {name for *_, name in rows()}


@pytest.mark.parametrize("name, expected", [
    # FP32 on CUDA cores: a cuBLAS sgemm, a cuDNN scudnn conv, CUTLASS SIMT, XMMA ffma
    ("volta_sgemm_128x64_nn", Kernel("fp32", "gemm", "fp32")),
    ("volta_scudnn_128x64_relu_interior_nn_v1", Kernel("fp32", "conv", "fp32")),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_"
     "aligna4_alignc4_execute_kernel__5x_cublas", Kernel("fp32", "gemm", "fp32")),
    # FP16 storage, FP32 math without an MMA shape: still the CUDA cores
    ("ampere_fp16_sgemm_fp16_32x128_tn", Kernel("fp32", "gemm", "fp16")),
    # tensor cores: FP16 in with FP32 accumulate (the 's' before the MMA shape)
    ("ampere_fp16_s16816gemm_fp16_128x64_ldg8_relu_f2f_stages_32x6_tn",
     Kernel("fp16", "gemm", "fp16")),
    # TF32 spelled out, and a bare s1688 MMA shape (FP32 in on Ampere tensor cores)
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x128x32_"
     "stage5_warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn_infer",
     Kernel("tf32", "conv", "fp32")),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>("
     "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)",
     Kernel("tf32", "gemm", None)),
    # ROCm: Tensile BBS = BF16 in, FP32 compute; MIOpen igemm bf16 convolution
    ("Cijk_Ailk_Bljk_BBS_BH_MT32x32x64_MI16x16x16x1_SN_1LDSB0", Kernel("bf16", "gemm", None)),
    ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt64x128x32_wt32x32x8", Kernel("bf16", "conv", "bf16")),
    # library names that only move data: split-K reduction, cuDNN BN, offsets, gemv
    ("void splitKreduce_kernel<32, 16, int, __half, __half, float, __half, true, true, false>"
     "(cublasSplitKParams<float>)", Kernel("memory", "memory", "fp16")),
    ("cask_cudnn::computeOffsetsKernel(cask_cudnn::ComputeOffsetsParams)",
     Kernel("memory", "memory", None)),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", Kernel("comm", "comm")),
])
def test_examples(name, expected):
    assert classify(name) == expected


def test_op_decides_conv_against_gemm_and_types_the_dtype():
    # cuDNN runs a 1x1 convolution's backward on a cuBLAS sgemm kernel: the op says conv
    assert classify("volta_sgemm_128x64_nn", "aten::cudnn_convolution_backward_weight").op \
        == "conv"
    assert classify("volta_scudnn_128x64_relu_interior_nn_v1", "aten::addmm").op == "gemm"
    assert classify("triton__0d1d2d", "aten::mm").op == "memory"  # not a library GEMM name
    assert classify("SomeKernel", None, '["c10::BFloat16", "float"]').dtype == "bf16"
    assert op_kind("aten::convolution_backward") == "conv"
    assert op_kind("aten::addmm") == op_kind("aten::linear") == op_kind("aten::bmm") == "gemm"
    assert op_kind("aten::add_") is None and op_kind(None) is None


V100, A100, H100 = hw.device("v100"), hw.device("a100-sxm4-40gb"), hw.device("h100")
T4, MI300X = hw.device("t4"), hw.device("mi300x")


@pytest.mark.parametrize("k, src, dst, kw, expected", [
    # V100 FP32 job on an A100: convolutions take TF32 (cudnn.allow_tf32 default True),
    # matmuls stay FP32 (matmul.allow_tf32 default False since PyTorch 1.12)
    (Kernel("fp32", "conv"), V100, A100, {}, "tf32"),
    (Kernel("fp32", "gemm"), V100, A100, {}, "fp32"),
    (Kernel("fp32", "gemm"), V100, A100, {"matmul_tf32": True}, "tf32"),
    (Kernel("fp32", "conv"), V100, A100, {"conv_tf32": False}, "fp32"),
    # traced on an A100, an FP32 conv shows the job turned TF32 off: it stays FP32
    (Kernel("fp32", "conv"), A100, H100, {}, "fp32"),
    (Kernel("tf32", "conv"), A100, H100, {}, "tf32"),
    # back to a GPU without TF32, or to ROCm (XF32 not used by default)
    (Kernel("tf32", "conv"), A100, V100, {}, "fp32"),
    (Kernel("tf32", "gemm"), A100, MI300X, {}, "fp32"),
    (Kernel("fp32", "conv"), V100, MI300X, {}, "fp32"),
    # BF16 on Volta/Turing: no BF16 tensor cores, the FP32 rate
    (Kernel("bf16", "gemm"), A100, V100, {}, "fp32"),
    (Kernel("bf16", "gemm"), A100, T4, {}, "fp32"),
    (Kernel("fp16", "gemm"), A100, T4, {}, "fp16"),
    (Kernel("memory", "memory"), A100, T4, {}, "memory"),
])
def test_on_device(k, src, dst, kw, expected):
    assert on_device(k, src, dst, **kw) == expected


def test_families_rest_on_the_gpu_table():
    assert set(ARCHITECTURE_FAMILY.values()) <= set(FAMILIES)
    assert {d.architecture for d in hw.DEVICES.values()} <= set(ARCHITECTURE_FAMILY)
    # the table's device decides, by its architecture
    assert family({"name": "NVIDIA A100-PCIE-40GB", "totalGlobalMem": 42346610688}) == "a100"
    assert family({"name": "NVIDIA L4"}) == "a100"         # Ada: Ampere's tensor cores
    assert family({"name": "NVIDIA H200"}) == "h100"
    assert family({"name": "AMD Instinct MI300X"}) == "mi300x"
    assert family({"name": "NVIDIA B200"}) == "default"
    # a GPU the table lacks falls back to its compute capability
    assert family({"name": "NVIDIA H800", "computeMajor": 9}) == "h100"
    assert family({"name": "Some GPU", "computeMajor": 8, "computeMinor": 6}) == "a100"
