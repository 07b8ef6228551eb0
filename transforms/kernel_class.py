"""What a GPU kernel computes, from its name (and its op, where the trace maps it to one): the
one kernel classification that the hardware models share (``gpu``, ``batch``, the roofline and
``amp``), and what autocast does to the op that launched a kernel (``amp``).

``classify`` gives a kernel
- ``math``: the unit whose peak bounds it, which is the figure of the GPU table
  (``transforms.hardware``) that scales it: ``fp32`` (CUDA-core / SIMD FP32), ``tf32``,
  ``fp16``, ``bf16``, ``fp8``, ``int8`` (tensor / matrix cores), ``fp64``, ``memory`` (bound by
  device memory bandwidth: element-wise, normalization, reduction, layout, copy kernels, the
  data transforms of Winograd and FFT convolutions, and matrix-vector products), ``comm``
  (collectives);
- ``op``: ``conv``, ``gemm`` (matrix products), ``attention`` (fused attention kernels:
  FlashAttention, FMHA), ``memory`` or ``comm``: what the math is for (PyTorch's TF32 switches
  differ for convolutions and matmuls); the first three are the matrix kernels (``MATRIX_OPS``);
- ``dtype``: the element type the name or the op's recorded input types show, where they do
  (``fp32``, ``fp16``, ``bf16``, ``fp64``; ``int`` for a kernel whose name shows integer types
  only), else None. For a name spelling several, the first one written wins (an op's input type
  comes first: ``max_pool_backward_nchw<c10::BFloat16, float>`` is BF16).

``kernel_precision`` is the view of the same class that the AMP model reads (``KernelPrecision``:
is it a matrix kernel, and in which precision does autocast find it).

Names are read as the vendors' libraries write them:
- cuBLAS/cuDNN: ``<arch>_[<in>_]<s|h|i><mma shape|gemm|cudnn>...``: ``volta_sgemm_128x64_nn``
  (FP32 on CUDA cores), ``ampere_fp16_s16816gemm_fp16_...`` (FP16 in, FP32 accumulate on
  tensor cores: the ``s`` is the accumulator, the MMA shape 16816/1688/884 the tensor-core
  instruction), ``volta_h884gemm_...`` and ``volta_fp16_s884cudnn_fp16_...`` (FP16 on Volta
  tensor cores), ``ampere_fp16_sgemm_fp16_...`` (FP16 storage, FP32 math on CUDA cores: no MMA
  shape), ``volta_scudnn_128x64_relu_...`` (FP32 implicit-GEMM convolution);
- XMMA (cuDNN 8 / cuBLASLt): ``sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_...``: the
  element types are spelled out (``f16f16_f16f32``, ``bf16bf16``, ``e4m3e4m3``);
  ``..._ffma_...`` is CUDA-core FP32;
- CUTLASS: ``cutlass_80_tensorop_f16_s16816gemm_...``, ``cutlass_tensorop_s1688fprop_..._tf32``,
  ``cutlass_80_simt_sgemm``, mangled ``cutlass::...::tfloat32_t``; ``wmma_tensorop_f16`` is the
  WMMA tensor-core path;
- ROCm: Tensile (rocBLAS, hipBLASLt) ``Cijk_<A indices>_<B indices>_<types>_...``, whose type
  field starts with the input type: ``BBS`` BF16 in, FP32 compute; ``HHS`` FP16; ``SB`` FP32,
  ``DB`` FP64; hipBLASLt's newer names put an underscore after the input type
  (``Cijk_Alik_Bljk_B_BS_BH_Bias_...`` BF16 in, ``Cijk_Ailk_Bljk_S_B_Bias_...`` FP32); MIOpen
  ``igemm_{fwd,bwd,wrw}_..._<dtype>_...`` (convolutions),
  composable kernels ``ck::tensor_operation::...xdl...`` whose element types are mangled
  template arguments (``DF16_`` _Float16, ``t`` ck::bhalf_t = unsigned short, ``f`` float);
- FlashAttention (``flash_fwd_kernel``, ``flash_bwd_*``; on ROCm AOTriton's ``attn_fwd``,
  ``attn_bwd``) runs in FP16 or BF16 only (Dao, "FlashAttention-2", 2023: "Datatype fp16 and
  bf16"): FP16 where the name shows neither (the two peaks are equal on every GPU of the
  table that has both).

A bare MMA shape ``s1688``/``s16816`` with no FP16/BF16 marker is TF32 (Ampere's FP32-in
tensor-core path); Volta's 884 and WMMA's 161616 take FP16 only. From Ampere on, PyTorch runs
FP32 convolutions on TF32 tensor cores by default (``torch.backends.cudnn.allow_tf32 = True``)
but FP32 matmuls on CUDA cores (``torch.backends.cuda.matmul.allow_tf32 = False`` since
PyTorch 1.12): moving an FP32 job to another GPU changes a kernel's class, not only its peak
(``on_device``).

``autocast_policy(op)``: what ``torch.autocast`` does to an operator: ``lower`` (cast to
float16/bfloat16), ``fp32`` (run in float32), ``param`` (parameters and their gradients: stay
float32), else None (the op runs in the type of its inputs). From the PyTorch documentation,
"Automatic Mixed Precision package - torch.amp", section "Autocast Op Reference" (CUDA Ops that
can autocast to float16 / to float32; ops not listed run in the type of their inputs), and its
source list ``aten/src/ATen/autocast_mode.h`` (AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32).

Two hand-made tables hold every kernel name of the shared traces: ``tests/data/kernels/
names.tsv`` (math and op) and ``tests/data/kernels/precision.tsv.gz`` (AMP's view: precision,
matrix or not, op); the tests read both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

MATHS = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8", "fp64", "memory", "comm")
OPS = ("conv", "gemm", "attention", "memory", "comm")
MATRIX_OPS = ("conv", "gemm", "attention")  # bound by a FLOP peak
DTYPES = ("fp32", "fp16", "bf16", "fp64", "int")

# The GPU table figure (transforms.hardware.Device) that bounds each math class.
PEAK_FIGURE = {"fp32": "fp32_tflops", "tf32": "tf32_tflops", "fp16": "fp16_tflops",
               "bf16": "bf16_tflops", "fp8": "fp8_tflops", "int8": "int8_tops",
               "fp64": "fp64_tflops", "memory": "memory_gbps"}


@dataclass(frozen=True)
class Kernel:
    """A kernel's class: see the module doc."""

    math: str
    op: str
    dtype: str | None = None

    @property
    def tensor_core(self) -> bool:
        return self.math in ("tf32", "fp16", "bf16", "fp8", "int8")

    @property
    def matrix(self) -> bool:
        """A GEMM, convolution or attention kernel: bound by a FLOP peak."""
        return self.op in MATRIX_OPS


COMM = Kernel("comm", "comm")

# Words a kernel's name holds (``_has_any``: a substring search each; the same words as a
# regular expression's alternation, tried at each position of a 400-character name, took
# ten times as long, and every kernel of a fleet's trace whose names are new is classified)
_COMM = ("nccl", "rccl", "msccl")
# Kernels that look like GEMM/conv libraries' but only move or reduce data: split-K
# reductions, cuDNN's offset tables and layout helpers, batch norm, im2col, epilogues, the
# data transforms of Winograd and FFT convolutions (the FFTs stream their tiles: a few FLOPs per
# byte; the products between them are the gcgemm kernels), BLAS level-1/2 (matrix-vector, dot,
# scal), small-N and K=1 GEMMs (matrix-vector in effect).
_MEMORY_FIRST = re.compile(
    r"splitkreduce|reducesplitk|split_k_reduce|computeoffsets|computeboffsets|computewgrad|"
    r"cask_cudnn|cudnn::bn_|bn_fw|bn_bw|batch_norm|batchnorm|im2col|col2im|nchwtonhwc|"
    r"nhwctonchw|transpose|reduce_wgrad|epilogue::impl|scal_kernel|reduce_1block|"
    r"scalepackedtensor|generatewinogradtiles|winograd_nonfused|"
    r"winograd(forward|wgrad)(data|filter|output|delta)|fft2d_|subtensorop|"
    r"gemv|dot_kernel|gemmk1_|gemmsn_|axpy|"
    # PyTorch's own element-wise, reduction and normalization kernels
    r"at::native::|at_cuda_detail::|cub::|thrust::|fbgemm_gpu|triton_|"
    r"elementwise|reduce_kernel|softmax|layer_norm|layernorm|rowwisemoments|"
    r"multi_tensor_apply|embedding|bounds_check|_scatter_gather")
_ATTENTION = re.compile(r"flash_fwd|flash_bwd|flash_attn|fmha|attention_kernel|mha_fwd|mha_bwd|"
                        r"^attn_(fwd|bwd)")
_CONV = ("conv", "cudnn", "winograd", "fprop", "dgrad", "wgrad", "implicit_gemm",
         "implicitgemm", "igemm_fwd", "igemm_bwd", "igemm_wrw", "fft2d", "wgrad_alg",
         "explicit_convolve", "implicit_convolve")
_GEMM = ("gemm", "xmma", "cutlass", "_tensorop", "cijk_", "mfma", "xdlops", "_xdl_", "magma_",
         "matmul", "hgemm", "dgemm", "zgemm", "cgemm", "ck16tensor_operation",
         "ck::tensor_operation")


def _has_any(low: str, words: tuple[str, ...]) -> bool:
    return any(map(low.__contains__, words))
# Tensile's type field (the first after the two index strings): its first letter is the input
# type (module doc)
_TENSILE_TYPES = re.compile(r"^cijk_a[a-z]+_b[a-z]+_([a-z0-9]+)_")
_TENSILE_INPUT = {"b": "bf16", "h": "fp16", "s": "fp32", "d": "fp64", "i": "int8"}
# the element types of a matrix kernel, checked in this order
_FP64 = re.compile(r"dgemm|zgemm|d884|dmma|_f64|f64f64|double|_db_|dcudnn")
_INT8 = re.compile(r"i8816|i16832|imma|int8|_i8i8|s8s8|i8gemm|igemm_.*_int8|_i8_")
_FP8 = re.compile(r"e4m3|e5m2|fp8|f8f8")
_BF16 = re.compile(r"bf16|bfloat16|_bbs_|_bss_|_bbh_")
_FP16 = re.compile(r"fp16|f16|_half|__half|half_t|c10::half|h884|h1688|h16816|h161616|hmma|"
                   r"_hhs_|_hss_|_hb_|df16_|hcudnn|hgemm")
_TF32 = re.compile(r"tf32|xf32|tfloat32")
# the FP16/BF16 name is storage only: FP32 math on CUDA cores (no MMA shape, 's' gemm/cudnn)
_SIMT = re.compile(r"(^|_)(sgemm|scudnn)(_|$)|ffma|gemmsn|implicit_convolve_sgemm|"
                   r"explicit_convolve_sgemm|wgrad_alg0|winograd(?!.*(h884|s884|fp16))")
_MMA_SHAPE = re.compile(r"[sh](884|1688|16816|161616)")
# an FP32 accumulator ('s') on a 16-bit-free name: Ampere's TF32 shapes; Volta's 884 and
# WMMA's 161616 take FP16 only
_MMA_TF32 = re.compile(r"s(1688|16816)")
_MMA_FP16 = re.compile(r"s(884|161616)")
# composable kernels (ROCm): the mangled template arguments after the layouts spell the
# element types: t = ck::bhalf_t (unsigned short), DF16_ = _Float16, f = float
_CK_TYPES = re.compile(r"(?<=[ie_])[tf]{3,}")


def _matrix_math(low: str, op: str) -> str:
    """The math class of a matrix kernel's name (lower case)."""
    if op == "attention" and not (_BF16.search(low) or _FP16.search(low)):
        return "fp16"  # FlashAttention-style kernels run in FP16/BF16 only
    m = _TENSILE_TYPES.match(low)
    if m and m.group(1)[0] in _TENSILE_INPUT:
        return _TENSILE_INPUT[m.group(1)[0]]
    if _FP64.search(low):
        return "fp64"
    if _FP8.search(low):
        return "fp8"
    if _INT8.search(low):
        return "int8"
    if "ck16tensor_operation" in low or "ck::tensor_operation" in low:
        if "df16_" in low:
            return "fp16"
        return "bf16" if any(r.count("t") >= 2 for r in _CK_TYPES.findall(low)) else "fp32"
    if _TF32.search(low):
        return "tf32"
    if _SIMT.search(low) and not _MMA_SHAPE.search(low):
        return "fp32"
    if _BF16.search(low):
        return "bf16"
    if _FP16.search(low):
        return "fp16"
    if _MMA_TF32.search(low):
        return "tf32"
    if _MMA_FP16.search(low):
        return "fp16"
    return "fp32"


# element types in a name (template arguments, library type fields); the first one written
# wins. Within one alternation the longer spelling comes first (bf16 before f16). Every
# spelling starts with one of the characters of the lookahead, which lets the search skip the
# other positions at once (the alternation, tried at each of a 400-character name's
# positions, was half of a kernel's classification)
_DTYPE_TOKENS = re.compile(
    r"(?=[bcdfhs_])(?:"
    r"(?P<bf16>c10::bfloat16|__nv_bfloat16|bfloat16|bf16|bhalf)|"
    r"(?P<fp16>c10::half|__half\b|\bhalf\b|_half\b|half_t|float16|fp16|(?<![a-z])f16)|"
    r"(?P<fp64>\bdouble\b|fp64|(?<![a-z])f64)|"
    r"(?P<fp32>\bfloat\b|float2|float4|\bfloat_|fp32|(?<![a-z])f32|(?:^|_)sgemm|(?:^|_)scudnn))")
_INT_TOKENS = re.compile(r"<\s*(long|int|bool|unsigned|signed|char|short|c10::complex|int64_t|"
                         r"int32_t|unsigned char)\b|functor<(long|int|bool|unsigned char)\b")
# input types as the profiler records them (range.input_types)
_TYPE_NAMES = {"float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16",
               "double": "fp64", "Half": "fp16", "BFloat16": "bf16"}


def _dtype(low: str) -> str | None:
    m = _DTYPE_TOKENS.search(low)
    if m:
        return m.lastgroup
    return "int" if _INT_TOKENS.search(low) else None


_OP_CONV = re.compile(r"conv|cudnn_convolution|miopen_convolution|mkldnn_convolution")
_OP_GEMM = re.compile(r"(^|::|_)(mm|addmm|bmm|baddbmm|matmul|linear|addbmm|einsum|"
                      r"_scaled_dot_product|scaled_dot_product|addmv|mv|dot|vdot|"
                      r"_addmm_activation)($|_|\b)")


def op_kind(op_name: str | None) -> str | None:
    """``conv`` or ``gemm`` for an operator name (``aten::cudnn_convolution``,
    ``aten::convolution_backward``, ``aten::addmm``), else None."""
    if not op_name:
        return None
    low = op_name.lower()
    if _OP_CONV.search(low):
        return "conv"
    if _OP_GEMM.search(low):
        return "gemm"
    return None


@lru_cache(maxsize=65536)
def _by_name(name: str) -> Kernel:
    low = name.lower()
    if _has_any(low, _COMM):
        return COMM
    head = _head(low)
    if _ATTENTION.search(head):
        return Kernel(_matrix_math(low, "attention"), "attention", _dtype(low))
    conv = _has_any(low, _CONV)
    # library GEMM/conv kernels first: a CUTLASS conv is not an "index" kernel because its
    # mangled name says IteratorOptimized
    if (conv or _has_any(low, _GEMM)) and not _MEMORY_FIRST.search(head):
        op = "conv" if conv else "gemm"
        return Kernel(_matrix_math(low, op), op, _dtype(low))
    return Kernel("memory", "memory", _dtype(low))


def _head(low: str) -> str:
    """The part of a name that says what the kernel is: before its parameter list, without
    the return type (``void``) and the CUTLASS/cuDNN wrapper ``Kernel<...>``, which names the
    real kernel inside it."""
    m = re.match(r"(?:void |std::enable_if<[^>]*>::type )?(.*?)(\(|$)", low)
    head = m.group(1) if m else low
    k = re.match(r"(?:cutlass[\w:]*::)?kernel<(.*)", head)
    if k:
        head = k.group(1)
    return head.split("<", 1)[0] if not head.startswith("_z") else head[:120]


def classify(name: str | None, op_name: str | None = None,
             input_types: str | None = None) -> Kernel:
    """The class of one kernel: by its name; ``op_name`` (the operator that launched it, e.g.
    ``aten::cudnn_convolution``) decides conv against gemm where it is known, and
    ``input_types`` (the op's recorded dtypes, JSON text) the dtype where the name shows
    none."""
    k = _by_name(name or "")
    if k.op in ("conv", "gemm"):
        ok = op_kind(op_name)
        if ok is not None and ok != k.op:
            k = Kernel(k.math, ok, k.dtype)
    if k.dtype is None and input_types and k.op != "comm":
        first = re.search(r'"([^"]+)"', input_types)
        if first and first.group(1) in _TYPE_NAMES:
            k = Kernel(k.math, k.op, _TYPE_NAMES[first.group(1)])
    return k


def _has(device, math: str) -> bool:
    return getattr(device, PEAK_FIGURE[math]) is not None


def _tf32(device) -> bool:
    # TF32 is what PyTorch's allow_tf32 switches reach on NVIDIA parts only (ROCm's XF32 is
    # not used by default)
    return device.vendor == "nvidia" and _has(device, "tf32")


def on_device(k: Kernel, source, target, *, conv_tf32: bool = True,
              matmul_tf32: bool = False) -> str:
    """The math class kernel K of a job traced on SOURCE runs in on TARGET (both
    ``transforms.hardware.Device``), with PyTorch's defaults:

    - an FP32 convolution or matmul traced on a GPU without TF32 takes TF32 tensor cores on a
      target that has them when the job's switch allows it: ``conv_tf32``
      (``torch.backends.cudnn.allow_tf32``, default True) for convolutions, ``matmul_tf32``
      (``torch.backends.cuda.matmul.allow_tf32``, default False since PyTorch 1.12) for
      matmuls. Traced on a GPU with TF32, an FP32 kernel shows the job turned TF32 off: it
      stays FP32;
    - a TF32 kernel on a target without TF32 runs in FP32;
    - BF16 on a target without BF16 tensor cores (Volta, Turing) runs at the FP32 rate; FP8
      without FP8 at the FP16 rate; INT8 without INT8 tensor cores at the FP16 rate."""
    m = k.math
    if m == "fp32" and k.op in ("conv", "gemm") and _tf32(target) and not _tf32(source):
        if (k.op == "conv" and conv_tf32) or (k.op == "gemm" and matmul_tf32):
            return "tf32"
    if m == "tf32" and not _tf32(target):
        return "fp32"
    if m == "bf16" and not _has(target, "bf16"):
        return "fp32"
    if m in ("fp8", "int8") and not _has(target, m):
        return "fp16"
    return m


def peak(device, math: str) -> float | None:
    """DEVICE's peak for a math class: TFLOPS (TOPS for int8), or GB/s for ``memory``."""
    return getattr(device, PEAK_FIGURE[math]) if math in PEAK_FIGURE else None


# ---- AMP's view of a kernel: its precision ----------------------------------------------------

PRECISIONS = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")
REDUCED = ("fp16", "bf16", "fp8", "int8")  # what AMP (or a trace already past it) computes in


@dataclass(frozen=True)
class KernelPrecision:
    """A kernel's class as the AMP model reads it (``kernel_precision``, from ``classify``):
    ``math``: a matrix kernel (GEMM, convolution, attention), bound by a FLOP peak;
    ``op``: the kernel's ``op`` (``conv``, ``gemm``, ``attention``, ``memory``, ``comm``);
    ``precision``: for a matrix kernel the precision it computes in (one of PRECISIONS), or the
    16-bit type of its data where it computes them in FP32 on CUDA cores
    (``ampere_fp16_sgemm_fp16``: autocast has nothing left to lower); for the others the
    element type the name shows (``fp32``, ``fp16``, ``bf16``, ``fp64``), ``int`` when it shows
    integer types only, None when it shows none."""

    math: bool
    op: str
    precision: str | None

    @property
    def reduced(self) -> bool:
        return self.precision in REDUCED


@lru_cache(maxsize=65536)
def kernel_precision(name: str | None) -> KernelPrecision:
    """A kernel's precision from its name: its ``classify`` class as the AMP model reads it
    (see ``KernelPrecision``)."""
    k = classify(name)
    if not k.matrix:
        return KernelPrecision(False, k.op, k.dtype)
    storage = k.math == "fp32" and k.dtype in ("fp16", "bf16")
    return KernelPrecision(True, k.op, k.dtype if storage else k.math)
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
