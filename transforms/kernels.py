"""What a kernel computes in, read from its name, and what autocast does to the op that
launched it: the part of the kernel classification the AMP model needs (issue 15).

Two questions, each answered by its own documented functions below (the batch and other-GPU
what-ifs of issue 16 classify kernels by work class in their own part of this module):

- ``kernel_precision(name)``: is the kernel a matrix kernel (GEMM, convolution, attention:
  bound by a peak FLOP rate of tensor/matrix cores or FMA pipes) and in which precision does it
  compute (``fp64``, ``fp32`` on CUDA cores/SIMDs, ``tf32``, ``fp16``, ``bf16``, ``fp8``,
  ``int8``); for every other kernel, the element type its name shows (``fp32``, ``fp16``,
  ``bf16``, ``fp64``; ``int`` for integer-only kernels), or None where the name shows none.
- ``autocast_policy(op)``: what ``torch.autocast`` does to an operator: ``lower`` (cast to
  float16/bfloat16), ``fp32`` (run in float32), else None (the op runs in the type of its
  inputs). From the PyTorch documentation, "Automatic Mixed Precision package - torch.amp",
  section "Autocast Op Reference" (CUDA Ops that can autocast to float16 / to float32; ops not
  listed run in the type of their inputs), and its source list
  ``aten/src/ATen/autocast_mode.h`` (AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32).

How the vendors' libraries spell precision in kernel names:

- cuBLAS/cuDNN: ``<arch>_[<in type>_]<acc><mma shape or gemm/cudnn>``: ``volta_sgemm_128x64_nn``
  (FP32 on CUDA cores), ``volta_h884gemm_...`` and ``volta_fp16_s884cudnn_fp16_...`` (FP16 in,
  FP16 or FP32 accumulate on Volta tensor cores), ``ampere_fp16_s16816gemm_fp16_...``,
  ``ampere_bf16_s16816gemm_bf16_...``. A bare tensor-core MMA shape with an FP32 accumulator
  and no 16-bit type (``s1688``, ``s16816`` on Ampere and later) is TF32, the FP32-in path;
  Volta's 884 MMA takes FP16 only. ``ampere_fp16_sgemm_fp16`` is FP16 storage with FP32 math on
  CUDA cores (no MMA shape): its data are FP16 already.
- XMMA (cuDNN 8, cuBLASLt): element types spelled out, ``sm80_xmma_gemm_f32f32_f32f32_f32_..._ffma``
  (FP32 FMA), ``..._tf32f32_tf32f32_f32_...``, ``..._f16f16_f16f32_...``, ``..._bf16bf16_...``.
- CUTLASS: ``cutlass_80_tensorop_f16_s16816gemm_f16`` (FP16), ``cutlass_80_tensorop_s1688gemm``
  (TF32), ``cutlass_tensorop_s1688fprop_optimized_tf32`` (TF32), ``cutlass_80_simt_sgemm``
  (FP32), ``wmma_tensorop_f16`` (FP16 on WMMA).
- ROCm Tensile: ``Cijk_<layouts>_<types>_...``: ``SB`` FP32, ``DB`` FP64, ``HB``/``HHS``/``HSS``
  FP16 (FP32 compute), ``BBS``/``BSS`` BF16 (FP32 compute); MIOpen ``igemm_{fwd,bwd,wrw}_..._bf16``;
  composable kernels (``ck::tensor_operation``), whose element types are the mangled template
  arguments (``DF16_`` _Float16, ``t`` unsigned short = ck::bhalf_t, ``f`` float).
- FlashAttention (``flash_fwd_kernel``, ``flash_bwd_*``) runs in FP16 or BF16 only (Dao,
  "FlashAttention-2", 2023: "Datatype fp16 and bf16"): reduced precision whatever the name says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

# ---- precision of a kernel ------------------------------------------------------------------

PRECISIONS = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")
REDUCED = ("fp16", "bf16", "fp8", "int8")  # what AMP (or a trace already past it) computes in


@dataclass(frozen=True)
class KernelPrecision:
    """``math``: a matrix kernel (GEMM, convolution, attention), bound by a FLOP peak;
    ``op``: ``conv``, ``gemm`` or ``attention`` for a matrix kernel, else ``memory`` (element-wise,
    normalization, reduction, layout, copy, BLAS level 1/2: bound by bandwidth) or ``comm``;
    ``precision``: for a matrix kernel the precision it computes in (one of PRECISIONS), for
    the others the floating element type the name shows (``fp32``, ``fp16``, ``bf16``, ``fp64``),
    ``int`` when it shows integer types only, None when it shows none."""

    math: bool
    op: str
    precision: str | None

    @property
    def reduced(self) -> bool:
        return self.precision in REDUCED


_COMM_RE = re.compile(r"nccl|rccl|msccl")
# Kernels of GEMM/conv libraries that only move, reduce or transform data (split-K
# reductions, cuDNN's offset tables, layout changes, Winograd/FFT data transforms and batch
# norm), and BLAS level 1/2 (matrix-vector products, dot, small-N and K=1 GEMMs, which stream
# their operands once): bandwidth-bound, whatever library wrote them.
_NOT_MATH_RE = re.compile(
    r"splitkreduce|reducesplitk|split_k_reduce|computeoffsets|computeboffsets|"
    r"computewgrad|im2col|col2im|nchwtonhwc|nhwctonchw|transpose|scalepackedtensor|"
    r"generatewinogradtiles|winograd_nonfused|winograd(forward|wgrad)(data|filter|output|"
    r"delta)|reduce_wgrad|bn_fw|bn_bw|batch_norm|batchnorm|gemv|dot_kernel|gemmsn_|"
    r"gemmk1_|reduce_1block|scal_kernel|axpy|subtensorop|elementwise|reduce_kernel|"
    r"multi_tensor_apply|embedding|fbgemm_gpu|softmax|layer_norm|layernorm")
_CONV_RE = re.compile(r"conv|cudnn|fprop|dgrad|wgrad|winograd|fft2d|igemm_(fwd|bwd|wrw)")
_ATTN_RE = re.compile(r"flash_fwd|flash_bwd|flash_attn|fmha|attention_kernel|mha_fwd|mha_bwd")
# a matrix kernel: cuBLAS/cuDNN/XMMA/CUTLASS/Tensile/MIOpen/CK names, and cuDNN's legacy ones
_MATH_RE = re.compile(
    r"gemm|(^|_)(volta|turing|ampere|ada|hopper|maxwell|pascal|sm\d{2,3})_\w*cudnn|scudnn|"
    r"hcudnn|xmma|cutlass|cijk_|igemm_(fwd|bwd|wrw)|ck16tensor_operation|ck::tensor_operation|"
    r"wgrad_alg\d_engine|dgrad_engine|dgrad2d|fft2d_|gcgemm|_tensorop_")

_FP64_RE = re.compile(r"dgemm|zgemm|d884|dmma|f64f64|_db_|\bdouble\b")
_FP8_RE = re.compile(r"e4m3|e5m2|fp8|_f8f8|f8_")
_INT8_RE = re.compile(r"imma|i8816|i16832|_i8i8|int8|s8s8|_i8_")
_BF16_RE = re.compile(r"bf16|bfloat16|_bbs_|_bss_|__nv_bfloat16")
_TF32_RE = re.compile(r"tf32|xf32|tfloat32")
_FP16_RE = re.compile(r"fp16|f16|half|hgemm|hcudnn|h884|h1688|h16816|h161616|hmma|_hhs_|_hss_|"
                      r"_hb_|df16_|wmma")
_FP32_MATH_RE = re.compile(r"sgemm|scudnn|ffma|f32f32|_sb_|simt|convolve_sgemm|wgrad_alg|"
                           r"dgrad_engine|fft2d|gcgemm")
# tensor-core MMA shapes: an FP32 accumulator ('s') on a 16-bit-free name is TF32 on Ampere+;
# Volta's 884 takes FP16 only
_MMA_TF32_RE = re.compile(r"s1688|s16816|s16832")
_MMA_FP16_RE = re.compile(r"s884|s161616")
# composable kernels: mangled template arguments after the layouts; t = unsigned short
# (ck::bhalf_t), DF16_ = _Float16, f = float
_CK_TYPES_RE = re.compile(r"(?<=[ie_])[tf]{3,}")


def _math_precision(low: str) -> str:
    """The precision a matrix kernel computes in, from its lower-cased name (see the module
    doc for the spellings); FP32 where the name shows nothing else."""
    if _ATTN_RE.search(low) and not (_BF16_RE.search(low) or _FP16_RE.search(low)):
        return "fp16"  # FlashAttention-style kernels run in FP16/BF16 only
    if "ck16tensor_operation" in low or "ck::tensor_operation" in low:
        if "df16_" in low:
            return "fp16"
        runs = _CK_TYPES_RE.findall(low)
        return "bf16" if any(r.count("t") >= 2 for r in runs) else "fp32"
    for prec, rx in (("fp64", _FP64_RE), ("fp8", _FP8_RE), ("int8", _INT8_RE),
                     ("bf16", _BF16_RE), ("tf32", _TF32_RE), ("fp16", _FP16_RE)):
        if rx.search(low):
            return prec
    if _MMA_TF32_RE.search(low):
        return "tf32"
    if _MMA_FP16_RE.search(low):
        return "fp16"
    return "fp32"


# element types in a non-matrix kernel's name (template arguments); the first one written wins
# (an op's input type comes first: ``max_pool_backward_nchw<c10::BFloat16, float>``)
_DTYPE_TOKENS = re.compile(r"c10::bfloat16|bfloat16|__nv_bfloat16|bf16|c10::half|__half\b|"
                           r"\bhalf\b|_half\b|float16|fp16|\bdouble\b|\bfloat\b|float2|float4|"
                           r"\bfloat_")
_INT_TOKENS = re.compile(r"<\s*(long|int|bool|unsigned|signed|char|short|c10::complex|int64_t|"
                         r"int32_t|unsigned char)\b|functor<(long|int|bool|unsigned char)\b")


def _element_type(low: str) -> str | None:
    m = _DTYPE_TOKENS.search(low)
    if m:
        t = m.group(0)
        if "bf" in t or "bfloat" in t:
            return "bf16"
        if "half" in t or "16" in t:
            return "fp16"
        return "fp64" if "double" in t else "fp32"
    return "int" if _INT_TOKENS.search(low) else None


@lru_cache(maxsize=65536)
def kernel_precision(name: str | None) -> KernelPrecision:
    """A kernel's precision from its name (see the module doc): a matrix kernel's arithmetic
    precision, or another kernel's element type."""
    low = (name or "").lower()
    if _COMM_RE.search(low):
        return KernelPrecision(False, "comm", _element_type(low))
    head = low.split("(", 1)[0]  # the kernel itself, not its parameter list
    if _ATTN_RE.search(head):
        return KernelPrecision(True, "attention", _math_precision(low))
    if _MATH_RE.search(head) and not _NOT_MATH_RE.search(head):
        op = "conv" if _CONV_RE.search(head) else "gemm"
        return KernelPrecision(True, op, _math_precision(low))
    return KernelPrecision(False, "memory", _element_type(low))


# ---- what autocast does to an op -------------------------------------------------------------

# torch.amp docs, "Autocast Op Reference", "CUDA Ops that can autocast to float16", with the
# aten names of aten/src/ATen/autocast_mode.h AT_FORALL_LOWER_PRECISION_FP (torch 2.x) and the
# backward nodes of those ops (backward ops run in the type autocast chose for their forward op,
# same docs page).
AUTOCAST_LOWER = (
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "convolution", "cudnn_convolution",
    "miopen_convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv",
    "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_efficient_attention_forward", "_flash_attention_forward",
    # backward of the ops above (their autograd nodes and aten backward ops)
    "convolution_backward", "cudnn_convolution_backward", "cudnn_convolution_backward_input",
    "cudnn_convolution_backward_weight", "miopen_convolution_backward",
    "convolutionbackward0", "cudnnconvolutionbackward0", "addmmbackward0", "mmbackward0",
    "bmmbackward0", "baddbmmbackward0", "mvbackward0", "addmvbackward0", "prelubackward0",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward", "_efficient_attention_backward",
    "_flash_attention_backward",
)
# "CUDA Ops that can autocast to float32" (AT_FORALL_FP32 and AT_FORALL_FP32_SET_OPT_DTYPE)
# and the backward nodes/ops of those that have one.
AUTOCAST_FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm",
    "group_norm", "native_group_norm", "frobenius_norm", "nuclear_norm", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "nll_loss_nd",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm",
    "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa", "prod", "softmax",
    "log_softmax", "_softmax", "_log_softmax", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "sum", "norm", "normalize", "cross_entropy", "cross_entropy_loss",
    # backward
    "_softmax_backward_data", "_log_softmax_backward_data", "native_layer_norm_backward",
    "native_group_norm_backward", "nll_loss_backward", "nll_loss2d_backward",
    "mse_loss_backward", "l1_loss_backward", "smooth_l1_loss_backward", "huber_loss_backward",
    "binary_cross_entropy_with_logits_backward", "softmaxbackward0", "logsoftmaxbackward0",
    "nativelayernormbackward0", "layernormbackward0", "nativegroupnormbackward0",
    "nlllossbackward0", "nllloss2dbackward0", "mselossbackward0", "l1lossbackward0",
    "smoothl1lossbackward0", "binarycrossentropywithlogitsbackward0", "expbackward0",
    "logbackward0", "powbackward0", "powbackward1", "rsqrtbackward0", "logsumexpbackward0",
    "cumsumbackward0", "normbackward1", "linalgvectornormbackward0",
)
# Ops that only touch parameters and their gradients, which keep their FP32 dtype under
# autocast (the optimizer's, gradient accumulation, DDP's gradient buckets).
PARAMETER_OPS = ("accumulategrad", "reducer", "copy_bucket_to_grad", "zero_grad",
                 "optimizer", "_amp_")
_LOWER = frozenset(AUTOCAST_LOWER)
_FP32 = frozenset(AUTOCAST_FP32)


def op_key(name: str) -> str:
    """The bare lower-case op name of a profiler range: ``aten::conv2d`` -> ``conv2d``,
    ``autograd::engine::evaluate_function: ConvolutionBackward0`` ->
    ``convolutionbackward0``, ``ConvolutionBackward0`` -> ``convolutionbackward0``."""
    low = name.strip().lower()
    if ":" in low:
        low = low.rsplit(":", 1)[1].strip()
    return low


@lru_cache(maxsize=16384)
def autocast_policy(name: str | None) -> str | None:
    """What torch.autocast does to the op (or autograd node) NAME: ``lower`` (runs in
    float16/bfloat16), ``fp32`` (runs in float32), ``param`` (touches parameters and their
    gradients only: stays float32), or None (not listed: runs in the type of its inputs)."""
    if not name:
        return None
    low = name.lower()
    if any(p in low for p in PARAMETER_OPS):
        return "param"
    k = op_key(name)
    if k in _LOWER:
        return "lower"
    if k in _FP32:
        return "fp32"
    return None
