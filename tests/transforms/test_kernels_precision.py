"""Kernel precision from names and autocast's op policy (transforms/kernel_class.py, the AMP
part)."""

from __future__ import annotations

import gzip

import pytest

from daydream.transforms.kernel_class import autocast_policy, classify, kernel_precision, op_key
from tests.conftest import DATA

TABLE = DATA / "kernels" / "precision.tsv.gz"


def rows():
    with gzip.open(TABLE, "rt") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            prec, math, op, traces, name = line.rstrip("\n").split("\t", 4)
            yield (None if prec == "-" else prec), math == "math", op, name


def test_every_shared_kernel_name():
    """Each of the 767 kernel names of the shared traces gets the precision and class read
    from it by hand."""
    bad = []
    n = 0
    for prec, math, op, name in rows():
        n += 1
        k = kernel_precision(name)
        if (k.precision, k.math, k.op) != (prec, math, op):
            bad.append((name[:100], (k.precision, k.math, k.op), (prec, math, op)))
    assert n == 767
    assert not bad, bad[:5]


def test_the_precision_is_the_one_classifiers_view():
    """kernel_precision reads classify's class: matrix or not and the op are classify's; a
    matrix kernel's precision is its math class, or its 16-bit data where its math is FP32
    (FP16 storage on CUDA cores: the FP32 peak bounds it, autocast has nothing to lower)."""
    for _, _, _, name in rows():
        k, p = classify(name), kernel_precision(name)
        assert (p.math, p.op) == (k.matrix, k.op), name[:100]
        if p.math:
            assert p.precision == (k.dtype if k.math == "fp32" and k.dtype in ("fp16", "bf16")
                                   else k.math), name[:100]
        else:
            assert p.precision == k.dtype, name[:100]
    k = classify("ampere_fp16_sgemm_fp16_32x128_tn")
    assert (k.math, k.dtype) == ("fp32", "fp16")
    assert kernel_precision("ampere_fp16_sgemm_fp16_32x128_tn").precision == "fp16"
    # FFT convolutions' data transforms stream their tiles: bandwidth-bound, not matrix math
    fft = "void fft2d_r2c_32x32<float, false, 0u, false>(float2*, float const*, int)"
    assert classify(fft).math == "memory" and not kernel_precision(fft).math
    flash = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(x)"
    assert (classify(flash).math, classify(flash).op) == ("fp16", "attention")


@pytest.mark.parametrize("name,prec", [
    # the bug: an MMA shape does not make a 16-bit GEMM TF32
    ("ampere_bf16_s1688gemm_bf16_128x128_ldg8_f2f_tn", "bf16"),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_relu_f2f_stages_32x5_tn", "fp16"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_16x4_nn_align4>(x)", "tf32"),
    ("cutlass_tensorop_s1688fprop_optimized_tf32_128x128_16x4_nhwc_align4", "tf32"),
    ("volta_sgemm_128x64_nn", "fp32"),
    ("volta_scudnn_128x64_relu_interior_nn_v1", "fp32"),
    ("volta_h884gemm_64x64_ldg8_nn", "fp16"),
    ("volta_fp16_s884cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1", "fp16"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_"
     "aligna4_alignc4_execute_kernel__5x_cublas", "fp32"),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x128x32", "tf32"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "bf16"),
    ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128", "fp8"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(x)", "fp16"),
    ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN", "fp16"),
    ("Cijk_Ailk_Bljk_SB_MT64x64x8_SN", "fp32"),
    ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x32", "bf16"),
])
def test_spellings(name, prec):
    k = kernel_precision(name)
    assert k.math and k.precision == prec


def test_other_kernels_element_type():
    assert kernel_precision("void at::native::vectorized_elementwise_kernel<4, at::native::"
                            "CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int)"
                            ).precision == "fp32"
    k = kernel_precision("void at::native::batch_norm_backward_kernel<c10::BFloat16, "
                         "c10::BFloat16, float, int>(x)")
    assert (k.math, k.op, k.precision) == (False, "memory", "bf16")
    assert kernel_precision("void at::native::vectorized_elementwise_kernel<4, at::native::"
                            "FillFunctor<long>, at::detail::Array<char*, 1> >(int)"
                            ).precision == "int"
    assert kernel_precision("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)").op == "comm"


@pytest.mark.parametrize("op,policy", [
    ("aten::conv2d", "lower"), ("aten::cudnn_convolution", "lower"), ("aten::linear", "lower"),
    ("aten::addmm", "lower"), ("aten::bmm", "lower"),
    ("autograd::engine::evaluate_function: ConvolutionBackward0", "lower"),
    ("aten::softmax", "fp32"), ("aten::layer_norm", "fp32"), ("aten::cross_entropy_loss", "fp32"),
    ("aten::nll_loss_backward", "fp32"), ("aten::exp", "fp32"), ("aten::sum", "fp32"),
    ("autograd::engine::evaluate_function: LogSoftmaxBackward0", "fp32"),
    ("aten::relu_", None), ("aten::batch_norm", None), ("aten::add_", None),
    ("aten::max_pool2d", None), ("aten::dropout", None),
    ("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", "param"),
    ("Optimizer.step#SGD.step", "param"),
    ("torch::distributed::reducer::mul_out", "param"),
])
def test_autocast_policy(op, policy):
    """From the torch.amp docs' Autocast Op Reference: CUDA ops that autocast to float16 /
    to float32; the rest run in their inputs' type; parameters stay float32."""
    assert autocast_policy(op) == policy


def test_op_key():
    assert op_key("aten::conv2d") == "conv2d"
    assert op_key("autograd::engine::evaluate_function: ConvolutionBackward0") == (
        "convolutionbackward0")
