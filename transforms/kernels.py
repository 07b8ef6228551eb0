"""What a GPU kernel computes, from its name (and its op, where the trace maps it to one): the
one kernel classification that the hardware models share (``gpu``, ``batch``, and AMP).

A kernel gets
- ``math``: the unit whose peak bounds it, which is the figure of the GPU table
  (``transforms.hardware``) that scales it: ``fp32`` (CUDA-core / SIMD FP32), ``tf32``,
  ``fp16``, ``bf16``, ``fp8``, ``int8`` (tensor / matrix cores), ``fp64``, ``memory`` (bound by
  device memory bandwidth: element-wise, normalization, reduction, layout, copy kernels and
  matrix-vector products), ``comm`` (collectives);
- ``op``: ``conv``, ``gemm`` (matrix products), ``memory`` or ``comm``: what the math is for
  (PyTorch's TF32 switches differ for convolutions and matmuls);
- ``dtype``: the element type the name or the op's recorded input types show, where they do
  (``float``, ``half``, ``bfloat16``, ...), else None.

Names are read as the vendors' libraries write them:
- cuBLAS/cuDNN: ``<arch>_[<in>_]<s|h|i><mma shape|gemm|cudnn>...``: ``volta_sgemm_128x64_nn``
  (FP32 on CUDA cores), ``ampere_fp16_s16816gemm_fp16_...`` (FP16 in, FP32 accumulate on
  tensor cores: the ``s`` is the accumulator, the MMA shape 16816/1688/884 the tensor-core
  instruction), ``ampere_fp16_sgemm_fp16_...`` (FP16 storage, FP32 math on CUDA cores: no MMA
  shape), ``volta_scudnn_128x64_relu_...`` (FP32 implicit-GEMM convolution);
- XMMA (cuDNN 8 / cuBLASLt): ``sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_...``: the
  element types are spelled out; ``..._ffma_...`` is CUDA-core FP32;
- CUTLASS: ``cutlass_80_tensorop_f16_s16816gemm_...``, ``cutlass_tensorop_s1688fprop_..._tf32``,
  mangled ``cutlass::...::tfloat32_t``; ``wmma_tensorop_f16`` is the WMMA tensor-core path;
- ROCm: Tensile ``Cijk_..._<A><B><compute>_...`` (``BBS`` BF16 in, FP32 compute; ``HHS`` FP16;
  ``SB`` FP32), MIOpen ``igemm_{fwd,bwd,wrw}_..._<dtype>_...`` (convolutions), composable
  kernels ``ck::tensor_operation::...xdl...`` whose element types are mangled (``DF16_``
  _Float16, ``t`` ck::bhalf_t = unsigned short, ``f`` float).

A bare MMA shape ``s1688``/``s16816`` with no FP16/BF16 marker is TF32 (Ampere's FP32-in
tensor-core path). From Ampere on, PyTorch runs FP32 convolutions on TF32 tensor cores by
default (``torch.backends.cudnn.allow_tf32 = True``) but FP32 matmuls on CUDA cores
(``torch.backends.cuda.matmul.allow_tf32 = False`` since PyTorch 1.12): moving an FP32 job to
another GPU changes a kernel's class, not only its peak (``on_device``).

``tests/data/kernels/names.tsv`` holds every kernel name of the shared traces with its class
checked by hand; the tests read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

MATHS = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8", "fp64", "memory", "comm")
OPS = ("conv", "gemm", "memory", "comm")

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


COMM = Kernel("comm", "comm")

_COMM = re.compile(r"nccl|rccl|msccl")
# Kernels that look like GEMM/conv libraries' but only move or reduce data: split-K
# reductions, cuDNN's offset tables and layout helpers, batch norm, im2col, epilogues, BLAS
# level-1/2 (matrix-vector, dot, scal), FFT transforms of FFT convolutions are math-bound
# (see _FP32_MATH), small-N and K=1 GEMMs are matrix-vector in effect.
_MEMORY_FIRST = re.compile(
    r"splitkreduce|reducesplitk|split_k_reduce|computeoffsets|computeboffsets|computewgrad|"
    r"cask_cudnn|cudnn::bn_|bn_fw_|bn_bw_|batch_norm|batchnorm|im2col|col2im|nchwtonhwc|"
    r"nhwctonchw|transpose|reduce_wgrad|epilogue::impl|scal_kernel|reduce_1block|"
    r"scalepackedtensor|generatewinogradtiles|winograd_nonfused|fft2d_|subtensorop|"
    r"gemv|dot_kernel|gemmk1_kernel|gemmsn_|axpy|"
    # PyTorch's own element-wise, reduction and normalization kernels
    r"at::native::|at_cuda_detail::|cub::|thrust::|fbgemm_gpu::|triton_|"
    r"elementwise|reduce_kernel|softmax|layer_norm|layernorm|rowwisemoments|"
    r"multi_tensor_apply|embedding|bounds_check|_scatter_gather")
_CONV = re.compile(r"conv|cudnn|winograd|fprop|dgrad|wgrad|implicit_gemm|implicitgemm|"
                   r"igemm_(fwd|bwd|wrw)|fft2d|wgrad_alg|explicit_convolve|"
                   r"implicit_convolve")
_GEMM = re.compile(r"gemm|xmma|cutlass|_tensorop|cijk_|mfma|xdlops|_xdl_|magma_|"
                   r"matmul|hgemm|dgemm|zgemm|cgemm")
# the element types of a GEMM/conv kernel, checked in this order
_FP64 = re.compile(r"dgemm|zgemm|_f64|f64f64|double|_db_|dcudnn")
_INT8 = re.compile(r"i8816|imma|int8|_i8i8|s8s8|i8gemm|igemm_.*_int8|_i8_")
_FP8 = re.compile(r"e4m3|e5m2|fp8|f8f8")
_BF16 = re.compile(r"bf16|bfloat16|_bbs_|_bss_|_bbh_")
_FP16 = re.compile(r"fp16|f16|_half|__half|half_t|c10::half|h884|h1688|h16816|h161616|hmma|"
                   r"_hhs_|_hss_|df16_|hcudnn|hgemm")
_TF32 = re.compile(r"tf32|xf32|tfloat32")
# the FP16/BF16 name is storage only: FP32 math on CUDA cores (no MMA shape, 's' gemm/cudnn)
_SIMT = re.compile(r"(^|_)(sgemm|scudnn)(_|$)|ffma|gemmsn|implicit_convolve_sgemm|"
                   r"explicit_convolve_sgemm|wgrad_alg0|winograd(?!.*(h884|s884|fp16))")
_MMA_SHAPE = re.compile(r"[sh](884|1688|16816|161616)")
# composable kernels (ROCm): the mangled template arguments after the layouts spell the
# element types: t = ck::bhalf_t (unsigned short), DF16_ = _Float16, f = float
_CK_BF16 = re.compile(r"(?:e|ee)?(t{2,}f|t+ft|ft{2,}|ttt)")


def _gemm_math(low: str) -> str:
    """The math class of a GEMM/conv kernel's name (lower case)."""
    if _FP64.search(low):
        return "fp64"
    if _FP8.search(low):
        return "fp8"
    if _INT8.search(low):
        return "int8"
    if "ck16tensor_operation" in low or "ck::tensor_operation" in low:
        if "df16_" in low:
            return "fp16"
        return "bf16" if _CK_BF16.search(low) else "fp32"
    if _TF32.search(low):
        return "tf32"
    if _SIMT.search(low) and not _MMA_SHAPE.search(low):
        return "fp32"
    if _BF16.search(low):
        return "bf16"
    if _FP16.search(low):
        return "fp16"
    if _MMA_SHAPE.search(low):
        return "tf32"
    return "fp32"


_DTYPES = (("bfloat16", r"bfloat16|bf16|bhalf"), ("half", r"c10::half|__half|half|fp16|f16"),
           ("double", r"double|fp64|f64"), ("float", r"float|fp32|f32|sgemm|scudnn"))
_DTYPE_RES = [(d, re.compile(p)) for d, p in _DTYPES]
# input types as the profiler records them (range.input_types)
_TYPE_NAMES = {"float": "float", "c10::Half": "half", "c10::BFloat16": "bfloat16",
               "double": "double", "Half": "half", "BFloat16": "bfloat16"}


def _dtype(low: str) -> str | None:
    return next((d for d, rx in _DTYPE_RES if rx.search(low)), None)


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
    if _COMM.search(low):
        return COMM
    conv = bool(_CONV.search(low))
    # library GEMM/conv kernels first: a CUTLASS conv is not an "index" kernel because its
    # mangled name says IteratorOptimized
    if (conv or _GEMM.search(low)) and not _MEMORY_FIRST.search(_head(low)):
        return Kernel(_gemm_math(low), "conv" if conv else "gemm", _dtype(low))
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
    if k.dtype is None and input_types:
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
