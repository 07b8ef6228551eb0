"""One table of GPUs for the models that scale kernels by the hardware (AMP, batch, other GPU).

Every figure is a published number with its source beside it (DESIGN.md, "Transforms"): the
vendor's datasheet, whitepaper or documentation, with the table it is in. Where the sources
used do not give a figure it is None, and its source says where it was looked for; nothing is
estimated. Conventions, the same for every device:

- rates are dense peaks (no 2:4 structured sparsity), in TFLOPS (TOPS for INT8). Where a vendor
  gives only the sparse figure, the dense one is half of it and the source says so;
- ``fp16_tflops`` is the FP16 tensor/matrix rate accumulating in FP32 (what autocast GEMMs use),
  ``fp16_acc16_tflops`` the rate accumulating in FP16: GeForce cards run FP32 accumulation at
  half rate, data-center parts at full rate. ``fp8_tflops`` likewise accumulates in FP32;
- ``*_vector_tflops`` and ``fp32_tflops`` are the non-tensor (CUDA core / SIMD) rates;
- memory and cache sizes are binary as vendors mean them (a "40 GB" HBM part is 40 GiB), memory
  and link bandwidths decimal GB/s; PCIe and NVLink/Infinity Fabric bandwidths count both
  directions together, as the datasheets quote them (one direction is half).

An MI250/MI250X package holds two dies (GCDs) that ROCm shows as two GPUs, so a trace sees one
GCD: the table has the package as published and a ``-gcd`` row derived from it (half of every
per-package figure, which the source says).

``python -m daydream.transforms.hardware`` writes docs/hardware.md from this table.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from daydream.base.errors import DaydreamError

GIB = 1 << 30
MIB = 1 << 20
KIB = 1 << 10

# The figures of a device, in the order the doc shows them; each comes with a source.
FIGURES = (
    "compute_capability", "sm_count", "boost_clock_mhz",
    "fp64_tflops", "fp64_matrix_tflops", "fp32_tflops", "fp32_matrix_tflops", "tf32_tflops",
    "fp16_tflops", "fp16_acc16_tflops", "bf16_tflops", "fp8_tflops", "int8_tops",
    "fp16_vector_tflops", "bf16_vector_tflops",
    "memory_gb", "memory_gbps", "l2_bytes", "l2_gbps", "llc_bytes", "llc_gbps",
    "pcie_gen", "pcie_bidir_gbps", "interconnect", "interconnect_bidir_gbps",
)


@dataclass(frozen=True)
class Device:
    """One GPU model: its published peaks, memory and links, each with ``source(figure)``."""

    key: str                    # canonical key, e.g. "a100-sxm4-80gb"
    name: str                   # the product name as the vendor writes it
    vendor: str                 # "nvidia" | "amd"
    architecture: str           # volta, turing, ampere, ada, hopper, blackwell, cdna2, cdna3
    logical_devices: int        # GPUs the package shows to the runtime (2 for MI250/MI250X)
    compute_capability: tuple[int, int] | None  # CUDA compute capability (NVIDIA only)
    sm_count: int | None        # streaming multiprocessors (NVIDIA) or compute units (AMD)
    boost_clock_mhz: float | None   # the clock the vendor's peak rates are computed at
    fp64_tflops: float | None       # FP64, non-tensor / vector
    fp64_matrix_tflops: float | None  # FP64 on tensor cores (NVIDIA) or matrix cores (AMD)
    fp32_tflops: float | None       # FP32, non-tensor / vector
    fp32_matrix_tflops: float | None  # FP32 on matrix cores (AMD CDNA)
    tf32_tflops: float | None       # TF32 tensor (XF32 on CDNA3)
    fp16_tflops: float | None       # FP16 tensor, FP32 accumulate
    fp16_acc16_tflops: float | None  # FP16 tensor, FP16 accumulate
    bf16_tflops: float | None       # BF16 tensor (FP32 accumulate)
    fp8_tflops: float | None        # FP8 tensor, FP32 accumulate
    int8_tops: float | None         # INT8 tensor / matrix
    fp16_vector_tflops: float | None  # FP16 on the CUDA cores / SIMDs
    bf16_vector_tflops: float | None  # BF16 on the CUDA cores / SIMDs
    memory_gb: float | None         # device memory, binary GB as the datasheet writes it
    memory_gbps: float | None       # device memory bandwidth, GB/s
    l2_bytes: int | None            # L2 cache
    l2_gbps: float | None           # L2 bandwidth, GB/s
    llc_bytes: int | None           # a cache level beyond L2 (AMD Infinity Cache)
    llc_gbps: float | None          # its bandwidth, GB/s
    pcie_gen: int | None            # PCIe generation of the host link
    pcie_bidir_gbps: float | None   # PCIe x16, both directions, GB/s
    interconnect: str | None        # "nvlink", "nvlink-bridge" (pairs only), "infinity-fabric"
    interconnect_bidir_gbps: float | None  # GPU-to-GPU link bandwidth per GPU, both directions
    sources: MappingProxyType = field(compare=False, repr=False)

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory_gb is None else int(self.memory_gb * GIB)

    def source(self, figure: str) -> str:
        """Where ``figure`` comes from (or, for None, where it was looked for)."""
        return self.sources[figure]


def _device(*, key: str, name: str, vendor: str, architecture: str, logical_devices: int = 1,
            **figures) -> Device:
    """A Device from ``figure=(value, source)`` pairs; every figure must be given."""
    missing = [f for f in FIGURES if f not in figures]
    extra = [f for f in figures if f not in FIGURES]
    if missing or extra:
        raise ValueError(f"{key}: missing figures {missing}, unknown {extra}")
    for f, pair in figures.items():
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], str)
                and pair[1]):
            raise ValueError(f"{key}: {f} must be (value, source)")
    return Device(key=key, name=name, vendor=vendor, architecture=architecture,
                  logical_devices=logical_devices,
                  sources=MappingProxyType({f: s for f, (_, s) in figures.items()}),
                  **{f: v for f, (v, _) in figures.items()})


def _sparse(figure: float, doc: str) -> tuple[float, str]:
    """A dense rate from a vendor figure quoted with 2:4 sparsity (half of it)."""
    return (round(figure / 2, 2), f"{doc}: {figure:g} with sparsity ('*' figure) halved to "
            f"the dense rate, as the datasheet's footnote says")


def _none(why: str) -> tuple[None, str]:
    return (None, why)


def _pcie(gen: int) -> tuple[int, str]:
    """x16 bandwidth of a PCIe generation, both directions, for a part whose sheet gives only
    the generation."""
    both = 32 * 2 ** (gen - 3)
    return (both, f"derived: PCIe Gen{gen} x16 at {15.75 * 2 ** (gen - 3):g} GB/s per direction "
            f"(A100 whitepaper, 'PCIe Gen 4'), both directions together rounded to {both} GB/s "
            "as NVIDIA datasheets quote it")


# --- NVIDIA documents -----------------------------------------------------------------------
_CUDA_CC = ("NVIDIA CUDA GPUs compute capability list (developer.nvidia.com/cuda-gpus) and "
            "CUDA C++ Programming Guide, 'Compute Capabilities'")
_V100_DS = ("NVIDIA V100 Tensor Core GPU datasheet, specifications table")
_VOLTA_WP = ("NVIDIA Tesla V100 GPU Architecture whitepaper (WP-08608-001), Table 1 "
             "(Tesla V100 SXM2)")
_A100_WP = ("NVIDIA A100 Tensor Core GPU Architecture whitepaper (V1.0), Table 1 (A100 "
            "performance specs)")
_A100_WP_CMP = ("NVIDIA A100 Tensor Core GPU Architecture whitepaper (V1.0), table 'Comparison "
                "of NVIDIA Data Center GPUs'")
_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet, specifications table"
_T4_DS = "NVIDIA T4 Tensor Core GPU datasheet, specifications table"
_A10_DS = "NVIDIA A10 Tensor Core GPU datasheet, specifications table"
_L4_DS = "NVIDIA L4 Tensor Core GPU datasheet, specifications table"
_H100_WP = ("NVIDIA H100 Tensor Core GPU Architecture whitepaper, table comparing A100 and "
            "H100 (H100 SXM5 column, dense figures)")
_H100_WP_PCIE = ("NVIDIA H100 Tensor Core GPU Architecture whitepaper, table comparing A100 "
                 "and H100 (H100 PCIe column)")
_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet, specifications table"
_H200_DS = "NVIDIA H200 Tensor Core GPU datasheet, specifications table (H200 SXM column)"
_HGX_B200 = ("NVIDIA HGX platform specifications (nvidia.com/en-us/data-center/hgx), HGX B200 "
             "column (8 GPUs)")
_DGX_B200 = ("NVIDIA DGX B200 datasheet / product page, specifications (8 Blackwell GPUs: "
             "1,440 GB HBM3e, 64 TB/s, 14.4 TB/s NVLink)")
_TURING_WP = ("NVIDIA Turing GPU Architecture whitepaper (WP-09183-001), Table 1 (GeForce RTX "
              "2080 Ti Founders Edition)")
_GA102_WP = ("NVIDIA Ampere GA102 GPU Architecture whitepaper (V2.0), Table 1 (GeForce RTX "
             "3080)")
_GA102_WP_3090 = ("NVIDIA Ampere GA102 GPU Architecture whitepaper (V2.0), Appendix A, "
                  "'GeForce RTX 3090' table")
_ADA_WP = ("NVIDIA Ada GPU Architecture whitepaper, Table 1 (GeForce RTX 4090 compared with "
           "RTX 3090 Ti)")
_NOT_TC = "not a tensor-core data type on this architecture"
_NO_LLC = "none: the last cache level of NVIDIA GPUs is L2"
_NO_L2BW = "not published as an absolute figure"

# --- AMD documents --------------------------------------------------------------------------
_MI300_ROCM = ("ROCm documentation, 'AMD Instinct MI300 series microarchitecture', table "
               "'Peak-performance capabilities of the MI300X for different data types'")
_MI300X_DS = "AMD Instinct MI300X accelerator data sheet"
_ROCM_SPECS = ("ROCm documentation, 'GPU hardware specifications' (reference/gpu-arch-specs), "
               "AMD Instinct table")
_CDNA3_WP = "AMD CDNA 3 architecture whitepaper, 'AMD Infinity Cache'"
_MI200_DS = ("AMD Instinct MI200 series launch specifications / data sheets (MI250X and MI250 "
             "table: compute units, FP64|FP32 vector and matrix, FP16|BF16, INT8, HBM2e)")
_CDNA2_NOTE = "CDNA2 matrix FP16 accumulates in FP32 (v_mfma_f32_*); no FP16-accumulate rate"


def _v100(key: str, name: str, form: str, memory_gb: int) -> Device:
    sxm = form == "sxm2"
    col = f"{_V100_DS} ({'V100 SXM2' if sxm else 'V100 PCIe'} column)"
    return _device(
        key=key, name=name, vendor="nvidia", architecture="volta",
        compute_capability=((7, 0), _CUDA_CC),
        sm_count=(80, _VOLTA_WP) if sxm else (80, f"derived: 5,120 CUDA cores ({col}) / 64 "
                                                  "FP32 cores per Volta SM (Volta whitepaper)"),
        boost_clock_mhz=(1530, _VOLTA_WP) if sxm else _none(
            f"not in {col}; the Volta whitepaper's Table 1 is the SXM2 part"),
        fp64_tflops=(7.8 if sxm else 7.0, col),
        fp64_matrix_tflops=_none(_NOT_TC + " (Volta tensor cores take FP16 only)"),
        fp32_tflops=(15.7 if sxm else 14.0, col),
        fp32_matrix_tflops=_none("no FP32 matrix unit"),
        tf32_tflops=_none(_NOT_TC + " (TF32 arrived with Ampere)"),
        fp16_tflops=(125.0 if sxm else 112.0, f"{col}, 'Tensor Performance' (FP16 multiply, "
                                              "FP32 accumulate)"),
        fp16_acc16_tflops=(125.0 if sxm else 112.0, f"{col}, 'Tensor Performance'; the Volta "
                           "whitepaper gives one tensor rate for FP16 and FP32 accumulation"),
        bf16_tflops=_none(_NOT_TC + " (BF16 arrived with Ampere)"),
        fp8_tflops=_none(_NOT_TC),
        int8_tops=_none(_NOT_TC + " (Volta tensor cores take FP16 only)"),
        fp16_vector_tflops=(31.4, f"{_A100_WP_CMP}, Tesla V100 column 'Peak FP16'") if sxm
        else _none(f"not in {col}"),
        bf16_vector_tflops=_none("no BF16 arithmetic on Volta"),
        memory_gb=(memory_gb, f"{col}: {memory_gb} GB HBM2"),
        memory_gbps=(900, col),
        l2_bytes=(6144 * KIB, _VOLTA_WP + ": 6144 KB"),
        l2_gbps=_none(_NO_L2BW),
        llc_bytes=_none(_NO_LLC), llc_gbps=_none(_NO_LLC),
        pcie_gen=(3, f"{col}: PCIe Gen3" if not sxm else "Volta whitepaper, GV100 block diagram: "
                  "'PCI Express 3.0 Host Interface'"),
        pcie_bidir_gbps=(32, f"{col}: 32 GB/s interconnect (PCIe)") if not sxm else _pcie(3),
        interconnect=("nvlink", col) if sxm else _none(f"{col}: PCIe only"),
        interconnect_bidir_gbps=(300, f"{col}: NVLink 300 GB/s") if sxm else _none(
            f"{col}: PCIe only"),
    )


def _a100(key: str, name: str, form: str, memory_gb: int, memory_gbps: int,
          bw_source: str) -> Device:
    sxm = form == "sxm4"
    dense = f"{_A100_DS}, the non-starred (dense) figure of 'figure | figure*'"
    return _device(
        key=key, name=name, vendor="nvidia", architecture="ampere",
        compute_capability=((8, 0), _CUDA_CC),
        sm_count=(108, _A100_WP_CMP),
        boost_clock_mhz=(1410, _A100_WP_CMP) if sxm else _none(
            f"not in {_A100_DS}; the whitepaper's comparison is of the SXM4 part"),
        fp64_tflops=(9.7, _A100_DS),
        fp64_matrix_tflops=(19.5, f"{_A100_DS}, 'FP64 Tensor Core'"),
        fp32_tflops=(19.5, _A100_DS),
        fp32_matrix_tflops=_none("no FP32 matrix unit (TF32 is the tensor-core FP32 path)"),
        tf32_tflops=(156.0, dense + " (156 | 312*)"),
        fp16_tflops=(312.0, dense + " (312 | 624*); " + _A100_WP + " gives 312 for FP16 with "
                     "FP32 accumulate"),
        fp16_acc16_tflops=(312.0, _A100_WP + ": 312 for FP16 with FP16 accumulate"),
        bf16_tflops=(312.0, dense + " (312 | 624*)"),
        fp8_tflops=_none(_NOT_TC + " (FP8 arrived with Hopper and Ada)"),
        int8_tops=(624.0, dense + " (624 | 1248*)"),
        fp16_vector_tflops=(78.0, f"{_A100_WP}, 'Peak FP16'"),
        bf16_vector_tflops=(39.0, f"{_A100_WP}, 'Peak BF16'"),
        memory_gb=(memory_gb, f"{_A100_DS}: {memory_gb} GB HBM2{'e' if memory_gb == 80 else ''}"),
        memory_gbps=(memory_gbps, bw_source),
        l2_bytes=(40 * MIB, _A100_WP_CMP + ": 40960 KB"),
        l2_gbps=_none(_NO_L2BW + " (the A100 whitepaper gives a ratio only: 2.3x the L2 read "
                      "bandwidth of V100)"),
        llc_bytes=_none(_NO_LLC), llc_gbps=_none(_NO_LLC),
        pcie_gen=(4, _A100_DS),
        pcie_bidir_gbps=(64, f"{_A100_DS}: PCIe Gen4 64 GB/s"),
        interconnect=("nvlink", _A100_DS) if sxm else (
            "nvlink-bridge", f"{_A100_DS}: NVLink Bridge for 2 GPUs"),
        interconnect_bidir_gbps=(600, f"{_A100_DS}: NVLink 600 GB/s" + (
            "" if sxm else " through the NVLink Bridge, between the 2 GPUs of a pair")),
    )


def _h100_sxm() -> Device:
    return _device(
        key="h100-sxm", name="NVIDIA H100 SXM5 80GB", vendor="nvidia", architecture="hopper",
        compute_capability=((9, 0), _CUDA_CC),
        sm_count=(132, _H100_WP),
        boost_clock_mhz=_none(f"not in {_H100_DS}"),
        fp64_tflops=(33.5, _H100_WP),
        fp64_matrix_tflops=(66.9, _H100_WP + ", 'FP64 Tensor Core'"),
        fp32_tflops=(66.9, _H100_WP),
        fp32_matrix_tflops=_none("no FP32 matrix unit (TF32 is the tensor-core FP32 path)"),
        tf32_tflops=(494.7, _H100_WP + " (989.4 with sparsity)"),
        fp16_tflops=(989.4, _H100_WP + ": FP16 with FP32 accumulate (1978.9 with sparsity)"),
        fp16_acc16_tflops=(989.4, _H100_WP + ": FP16 with FP16 accumulate"),
        bf16_tflops=(989.4, _H100_WP + " (1978.9 with sparsity)"),
        fp8_tflops=(1978.9, _H100_WP + " (3957.8 with sparsity)"),
        int8_tops=(1978.9, _H100_WP + " (3957.8 with sparsity)"),
        fp16_vector_tflops=(133.8, _H100_WP + ", 'Peak FP16 (non-Tensor)'"),
        bf16_vector_tflops=(133.8, _H100_WP + ", 'Peak BF16 (non-Tensor)'"),
        memory_gb=(80, f"{_H100_DS} (H100 SXM column): 80 GB"),
        memory_gbps=(3350, f"{_H100_DS} (H100 SXM column): 3.35 TB/s"),
        l2_bytes=(50 * MIB, _H100_WP + ": 50 MB"),
        l2_gbps=_none(_NO_L2BW),
        llc_bytes=_none(_NO_LLC), llc_gbps=_none(_NO_LLC),
        pcie_gen=(5, _H100_DS),
        pcie_bidir_gbps=(128, f"{_H100_DS}: PCIe Gen5 128 GB/s"),
        interconnect=("nvlink", _H100_DS),
        interconnect_bidir_gbps=(900, f"{_H100_DS} (H100 SXM column): NVLink 900 GB/s"),
    )


def _h100_pcie() -> Device:
    col = f"{_H100_DS} (H100 PCIe column)"
    return _device(
        key="h100-pcie", name="NVIDIA H100 PCIe 80GB", vendor="nvidia", architecture="hopper",
        compute_capability=((9, 0), _CUDA_CC),
        sm_count=(114, _H100_WP_PCIE),
        boost_clock_mhz=_none(f"not in {_H100_DS}"),
        fp64_tflops=(26.0, col),
        fp64_matrix_tflops=(51.0, col + ", 'FP64 Tensor Core'"),
        fp32_tflops=(51.0, col),
        fp32_matrix_tflops=_none("no FP32 matrix unit (TF32 is the tensor-core FP32 path)"),
        tf32_tflops=_sparse(756, col),
        fp16_tflops=_sparse(1513, col + ", 'FP16 Tensor Core' (one rate for both "
                            "accumulators on data-center Hopper)"),
        fp16_acc16_tflops=_sparse(1513, col + ", 'FP16 Tensor Core'"),
        bf16_tflops=_sparse(1513, col),
        fp8_tflops=_sparse(3026, col),
        int8_tops=_sparse(3026, col),
        fp16_vector_tflops=_none(f"not in {_H100_DS}"),
        bf16_vector_tflops=_none(f"not in {_H100_DS}"),
        memory_gb=(80, col + ": 80 GB"),
        memory_gbps=(2000, col + ": 2 TB/s"),
        l2_bytes=(50 * MIB, _H100_WP_PCIE + ": 50 MB"),
        l2_gbps=_none(_NO_L2BW),
        llc_bytes=_none(_NO_LLC), llc_gbps=_none(_NO_LLC),
        pcie_gen=(5, _H100_DS),
        pcie_bidir_gbps=(128, f"{_H100_DS}: PCIe Gen5 128 GB/s"),
        interconnect=("nvlink-bridge", col + ": NVLink through a bridge"),
        interconnect_bidir_gbps=(600, col + ": NVLink 600 GB/s"),
    )


def _h200() -> Device:
    return _device(
        key="h200", name="NVIDIA H200 SXM 141GB", vendor="nvidia", architecture="hopper",
        compute_capability=((9, 0), _CUDA_CC),
        sm_count=_none(f"not in {_H200_DS}"),
        boost_clock_mhz=_none(f"not in {_H200_DS}"),
        fp64_tflops=(34.0, _H200_DS),
        fp64_matrix_tflops=(67.0, _H200_DS + ", 'FP64 Tensor Core'"),
        fp32_tflops=(67.0, _H200_DS),
        fp32_matrix_tflops=_none("no FP32 matrix unit (TF32 is the tensor-core FP32 path)"),
        tf32_tflops=_sparse(989, _H200_DS),
        fp16_tflops=_sparse(1979, _H200_DS + ", 'FP16 Tensor Core'"),
        fp16_acc16_tflops=_sparse(1979, _H200_DS + ", 'FP16 Tensor Core' (one rate for both "
                                  "accumulators on data-center Hopper)"),
        bf16_tflops=_sparse(1979, _H200_DS),
        fp8_tflops=_sparse(3958, _H200_DS),
        int8_tops=_sparse(3958, _H200_DS),
        fp16_vector_tflops=_none(f"not in {_H200_DS}"),
        bf16_vector_tflops=_none(f"not in {_H200_DS}"),
        memory_gb=(141, _H200_DS + ": 141 GB HBM3e"),
        memory_gbps=(4800, _H200_DS + ": 4.8 TB/s"),
        l2_bytes=_none(f"not in {_H200_DS}"),
        l2_gbps=_none(_NO_L2BW),
        llc_bytes=_none(_NO_LLC), llc_gbps=_none(_NO_LLC),
        pcie_gen=(5, _H200_DS),
        pcie_bidir_gbps=(128, _H200_DS + ": PCIe Gen5 128 GB/s"),
        interconnect=("nvlink", _H200_DS),
        interconnect_bidir_gbps=(900, _H200_DS + ": NVLink 900 GB/s"),
    )


def _b200() -> Device:
    per_gpu = f"{_HGX_B200}, divided by 8 GPUs"

    def hgx(total_pflops: float, what: str) -> tuple[float, str]:
        # the HGX table quotes 8-GPU totals, tensor rates with sparsity
        return (round(total_pflops * 1000 / 8 / 2, 2),
                f"{per_gpu}: {what} {total_pflops:g} PFLOPS with sparsity / 8 / 2 (dense). "
                "The earlier Blackwell technical brief gave a 1,000 W HGX B200 slightly "
                "different per-GPU figures (FP64 40, FP32 80, TF32 1,100 TFLOPS)")

    return _device(
        key="b200", name="NVIDIA B200 in HGX B200", vendor="nvidia", architecture="blackwell",
        compute_capability=((10, 0), _CUDA_CC),
        sm_count=_none(f"not in {_HGX_B200} or {_DGX_B200}"),
        boost_clock_mhz=_none(f"not in {_HGX_B200} or {_DGX_B200}"),
        fp64_tflops=(37.0, f"{per_gpu}: FP64/FP64 Tensor Core 296 TFLOPS / 8"),
        fp64_matrix_tflops=(37.0, f"{per_gpu}: FP64/FP64 Tensor Core 296 TFLOPS / 8"),
        fp32_tflops=(75.0, f"{per_gpu}: FP32 600 TFLOPS / 8"),
        fp32_matrix_tflops=_none("no FP32 matrix unit (TF32 is the tensor-core FP32 path)"),
        tf32_tflops=hgx(18, "TF32 Tensor Core"),
        fp16_tflops=hgx(36, "FP16/BF16 Tensor Core"),
        fp16_acc16_tflops=hgx(36, "FP16/BF16 Tensor Core (one rate given)"),
        bf16_tflops=hgx(36, "FP16/BF16 Tensor Core"),
        fp8_tflops=hgx(72, "FP8/FP6 Tensor Core"),
        int8_tops=hgx(72, "INT8 Tensor Core (POPS)"),
        fp16_vector_tflops=_none(f"not in {_HGX_B200}"),
        bf16_vector_tflops=_none(f"not in {_HGX_B200}"),
        memory_gb=(180, f"{_DGX_B200}: 1,440 GB / 8"),
        memory_gbps=(8000, f"{_DGX_B200}: 64 TB/s / 8"),
        l2_bytes=_none(f"not in {_HGX_B200} or {_DGX_B200}"),
        l2_gbps=_none(_NO_L2BW),
        llc_bytes=_none(_NO_LLC), llc_gbps=_none(_NO_LLC),
        pcie_gen=_none(f"the GPU's own host link is not in {_HGX_B200} or {_DGX_B200}"),
        pcie_bidir_gbps=_none(f"not in {_HGX_B200} or {_DGX_B200}"),
        interconnect=("nvlink", _HGX_B200),
        interconnect_bidir_gbps=(1800, f"{_DGX_B200}: 14.4 TB/s NVLink / 8; {_HGX_B200}: "
                                 "1.8 TB/s GPU-to-GPU"),
    )


def _geforce(*, key: str, name: str, architecture: str, cc: tuple[int, int], doc: str,
             sm: int, clock: float, fp32: float, fp16_acc16: float, fp16_acc32: float,
             bf16: float | None, tf32: float | None, fp8: float | None, int8: float,
             fp16_vector: float, memory_gb: int, memory_gbps: float, l2_kib: int,
             pcie_gen: int, pcie_doc: str, nvlink_gbps: float | None,
             nvlink_doc: str) -> Device:
    halved = " (GeForce runs FP32 accumulation at half the FP16-accumulate rate)"
    no_type = f"{_NOT_TC}"
    return _device(
        key=key, name=name, vendor="nvidia", architecture=architecture,
        compute_capability=(cc, _CUDA_CC),
        sm_count=(sm, doc), boost_clock_mhz=(clock, doc),
        fp64_tflops=_none(f"not in {doc}"),
        fp64_matrix_tflops=_none("no FP64 tensor cores on GeForce"),
        fp32_tflops=(fp32, doc),
        fp32_matrix_tflops=_none("no FP32 matrix unit"),
        tf32_tflops=(tf32, doc + ", dense") if tf32 is not None else _none(no_type),
        fp16_tflops=(fp16_acc32, doc + ": FP16 with FP32 accumulate, dense" + halved),
        fp16_acc16_tflops=(fp16_acc16, doc + ": FP16 with FP16 accumulate, dense"),
        bf16_tflops=(bf16, doc + ": BF16 with FP32 accumulate, dense") if bf16 is not None
        else _none(no_type),
        fp8_tflops=(fp8, doc + ": FP8 with FP32 accumulate, dense (twice that with FP16 "
                    "accumulate)") if fp8 is not None else _none(no_type),
        int8_tops=(int8, doc + ", dense"),
        fp16_vector_tflops=(fp16_vector, doc + ", 'Peak FP16 TFLOPS (non-Tensor)'"),
        bf16_vector_tflops=_none(f"not taken from {doc}"),
        memory_gb=(memory_gb, doc), memory_gbps=(memory_gbps, doc),
        l2_bytes=(l2_kib * KIB, f"{doc}: {l2_kib} KB"),
        l2_gbps=_none(_NO_L2BW),
        llc_bytes=_none(_NO_LLC), llc_gbps=_none(_NO_LLC),
        pcie_gen=(pcie_gen, pcie_doc),
        pcie_bidir_gbps=_pcie(pcie_gen),
        interconnect=("nvlink-bridge", nvlink_doc) if nvlink_gbps else _none(
            f"no NVLink ({nvlink_doc})"),
        interconnect_bidir_gbps=(nvlink_gbps, nvlink_doc) if nvlink_gbps else _none(
            f"no NVLink ({nvlink_doc})"),
    )


def _mi200(key: str, name: str, cus: int, fp64: float, fp64_matrix: float, fp16: float,
           links: int) -> Device:
    return _device(
        key=key, name=name, vendor="amd", architecture="cdna2", logical_devices=2,
        compute_capability=_none("NVIDIA only; HIP reports gfx90a as 9.0"),
        sm_count=(cus, f"{_MI200_DS}; {_ROCM_SPECS}: {cus} ({cus // 2} per GCD)"),
        boost_clock_mhz=(1700, f"{_MI200_DS}: peak engine clock 1,700 MHz"),
        fp64_tflops=(fp64, f"{_MI200_DS}, FP64 vector"),
        fp64_matrix_tflops=(fp64_matrix, f"{_MI200_DS}, FP64 matrix"),
        fp32_tflops=(fp64, f"{_MI200_DS}, FP32 vector (packed FP32 doubles it to "
                     f"{fp64_matrix:g})"),
        fp32_matrix_tflops=(fp64_matrix, f"{_MI200_DS}, FP32 matrix"),
        tf32_tflops=_none("no TF32/XF32 on CDNA2 (added in CDNA3)"),
        fp16_tflops=(fp16, f"{_MI200_DS}, FP16 matrix"),
        fp16_acc16_tflops=_none(_CDNA2_NOTE),
        bf16_tflops=(fp16, f"{_MI200_DS}, BF16 matrix"),
        fp8_tflops=_none("no FP8 on CDNA2 (added in CDNA3)"),
        int8_tops=(fp16, f"{_MI200_DS}, INT8 matrix"),
        fp16_vector_tflops=_none(f"not in {_MI200_DS}"),
        bf16_vector_tflops=_none(f"not in {_MI200_DS}"),
        memory_gb=(128, f"{_MI200_DS}: 128 GB HBM2e (64 per GCD)"),
        memory_gbps=(3200, f"{_MI200_DS}: 3.2 TB/s"),
        l2_bytes=(16 * MIB, f"{_ROCM_SPECS}: 16 MB (8 per GCD)"),
        l2_gbps=_none(_NO_L2BW),
        llc_bytes=_none("none: CDNA2 has no Infinity Cache"),
        llc_gbps=_none("none: CDNA2 has no Infinity Cache"),
        pcie_gen=(4, _MI200_DS),
        pcie_bidir_gbps=_pcie(4),
        interconnect=("infinity-fabric", _MI200_DS),
        interconnect_bidir_gbps=(links * 100, f"{_MI200_DS}: {links} Infinity Fabric links "
                                 "x 100 GB/s peak each"),
    )


def _mi300x() -> Device:
    return _device(
        key="mi300x", name="AMD Instinct MI300X", vendor="amd", architecture="cdna3",
        compute_capability=_none("NVIDIA only; HIP reports gfx942 as 9.4"),
        sm_count=(304, f"{_ROCM_SPECS}: 304 (38 per XCD)"),
        boost_clock_mhz=(2100, f"{_MI300X_DS}: peak engine clock 2,100 MHz"),
        fp64_tflops=(81.7, _MI300_ROCM + ", Vector FP64"),
        fp64_matrix_tflops=(163.4, _MI300_ROCM + ", Matrix FP64"),
        fp32_tflops=(163.4, _MI300_ROCM + ", Vector FP32"),
        fp32_matrix_tflops=(163.4, _MI300_ROCM + ", Matrix FP32"),
        tf32_tflops=(653.7, _MI300_ROCM + ", TF32"),
        fp16_tflops=(1307.4, _MI300_ROCM + ", Matrix FP16 (dense; FP32 accumulate)"),
        fp16_acc16_tflops=_none("CDNA3 matrix FP16 accumulates in FP32 (v_mfma_f32_*); no "
                                "FP16-accumulate rate"),
        bf16_tflops=(1307.4, _MI300_ROCM + ", Matrix BF16"),
        fp8_tflops=(2614.9, _MI300_ROCM + ", Matrix FP8"),
        int8_tops=(2614.9, _MI300_ROCM + ", Matrix INT8"),
        fp16_vector_tflops=_none(f"not in {_MI300_ROCM}"),
        bf16_vector_tflops=_none(f"not in {_MI300_ROCM}"),
        memory_gb=(192, f"{_MI300X_DS}: 192 GB HBM3"),
        memory_gbps=(5300, _MI300_ROCM + ": 5.3 TB/s aggregated peak memory bandwidth"),
        l2_bytes=(32 * MIB, f"{_ROCM_SPECS}: 32 MB (4 MB per XCD)"),
        l2_gbps=_none(_NO_L2BW),
        llc_bytes=(256 * MIB, f"{_ROCM_SPECS} and {_CDNA3_WP}: 256 MB Infinity Cache"),
        llc_gbps=(17200, f"{_CDNA3_WP}: 17.2 TB/s peak"),
        pcie_gen=(5, f"{_MI300X_DS}; ROCm MI300 microarchitecture page: PCIe Gen 5 x16"),
        pcie_bidir_gbps=(128, f"{_MI300X_DS}: PCIe Gen5 x16 128 GB/s"),
        interconnect=("infinity-fabric", _MI300_ROCM),
        interconnect_bidir_gbps=(896, f"{_MI300X_DS}: 7 Infinity Fabric links x 128 GB/s "
                                 "peak each (ROCm MI300 page: seven links per OAM)"),
    )


_PER_DIE = ("sm_count", "fp64_tflops", "fp64_matrix_tflops", "fp32_tflops",
            "fp32_matrix_tflops", "tf32_tflops", "fp16_tflops", "fp16_acc16_tflops",
            "bf16_tflops", "fp8_tflops", "int8_tops", "fp16_vector_tflops",
            "bf16_vector_tflops", "memory_gb", "memory_gbps", "l2_bytes")
_PER_PACKAGE = ("pcie_gen", "pcie_bidir_gbps", "interconnect", "interconnect_bidir_gbps")


def per_die(pkg: Device) -> Device:
    """The one die (GCD) of a multi-die package that ROCm shows as a GPU of its own.

    Compute, memory and L2 are split evenly between the dies (same clock, half the CUs, half
    the HBM stacks each); the links are published per package only, so they are left None."""
    n = pkg.logical_devices
    values, sources = {}, dict(pkg.sources)
    for f in _PER_DIE:
        v = getattr(pkg, f)
        if v is not None:
            values[f] = v // n if isinstance(v, int) and v % n == 0 else round(v / n, 3)
            sources[f] = (f"derived: the package figure {v:g} / {n} (one of {n} GCDs, each its "
                          f"own GPU to ROCm); package: {pkg.sources[f]}")
    for f in _PER_PACKAGE:
        values[f] = None
        sources[f] = f"published per package only ({pkg.sources[f]})"
    return dataclasses.replace(pkg, key=f"{pkg.key}-gcd", name=f"{pkg.name} (one GCD)",
                               logical_devices=1, sources=MappingProxyType(sources), **values)


def _table() -> dict[str, Device]:
    a100_40_bw = ("NVIDIA A100 Tensor Core GPU Architecture whitepaper: 40 GB of HBM2 at "
                  "1555 GB/s")
    mi250x = _mi200("mi250x", "AMD Instinct MI250X", 220, 47.9, 95.7, 383.0, 8)
    mi250 = _mi200("mi250", "AMD Instinct MI250", 208, 45.3, 90.5, 362.1, 6)
    turing_nvlink = ("NVIDIA Turing GPU Architecture whitepaper, 'NVLink': TU102 has two x8 "
                     "second-generation NVLink links, 100 GB/s in both directions together")
    turing_pcie = ("NVIDIA GeForce RTX 2080 Ti specifications (nvidia.com), 'Bus Support': "
                   "PCIe 3.0")
    ga102_link = ("NVIDIA Ampere GA102 GPU Architecture whitepaper, 'Third-Generation NVLink': "
                  "GeForce RTX 3090 only, 112.5 GB/s in both directions together")
    ga102_pcie = "NVIDIA Ampere GA102 GPU Architecture whitepaper, 'PCIe Gen 4'"
    devices = [
        _v100("v100-sxm2-16gb", "NVIDIA Tesla V100 SXM2 16GB", "sxm2", 16),
        _v100("v100-sxm2-32gb", "NVIDIA Tesla V100 SXM2 32GB", "sxm2", 32),
        _v100("v100-pcie-16gb", "NVIDIA Tesla V100 PCIe 16GB", "pcie", 16),
        _v100("v100-pcie-32gb", "NVIDIA Tesla V100 PCIe 32GB", "pcie", 32),
        _device(
            key="t4", name="NVIDIA T4", vendor="nvidia", architecture="turing",
            compute_capability=((7, 5), _CUDA_CC),
            sm_count=(40, f"derived: 2,560 CUDA cores ({_T4_DS}) / 64 FP32 cores per Turing "
                          "SM (Turing whitepaper, 'Turing Streaming Multiprocessor')"),
            boost_clock_mhz=_none(f"not in {_T4_DS}"),
            fp64_tflops=_none(f"not in {_T4_DS}"),
            fp64_matrix_tflops=_none(_NOT_TC),
            fp32_tflops=(8.1, _T4_DS),
            fp32_matrix_tflops=_none("no FP32 matrix unit"),
            tf32_tflops=_none(_NOT_TC + " (TF32 arrived with Ampere)"),
            fp16_tflops=(65.0, f"{_T4_DS}, 'Mixed Precision (FP16/FP32)'"),
            fp16_acc16_tflops=_none(f"not in {_T4_DS} (it gives the FP16/FP32 rate only)"),
            bf16_tflops=_none(_NOT_TC + " (BF16 arrived with Ampere)"),
            fp8_tflops=_none(_NOT_TC),
            int8_tops=(130.0, _T4_DS),
            fp16_vector_tflops=_none(f"not in {_T4_DS}"),
            bf16_vector_tflops=_none("no BF16 arithmetic on Turing"),
            memory_gb=(16, f"{_T4_DS}: 16 GB GDDR6"),
            memory_gbps=(320, f"{_T4_DS}: 320+ GB/s"),
            l2_bytes=_none(f"not in {_T4_DS}"),
            l2_gbps=_none(_NO_L2BW),
            llc_bytes=_none(_NO_LLC), llc_gbps=_none(_NO_LLC),
            pcie_gen=(3, f"{_T4_DS}: x16 PCIe Gen3"),
            pcie_bidir_gbps=_pcie(3),
            interconnect=_none(f"PCIe only ({_T4_DS})"),
            interconnect_bidir_gbps=_none(f"PCIe only ({_T4_DS})"),
        ),
        _device(
            key="a10", name="NVIDIA A10", vendor="nvidia", architecture="ampere",
            compute_capability=((8, 6), _CUDA_CC),
            sm_count=(72, f"derived: 72 RT Cores ({_A10_DS}), one per GA10x SM (GA102 "
                          "whitepaper, 'GA10x SM Architecture')"),
            boost_clock_mhz=_none(f"not in {_A10_DS}"),
            fp64_tflops=_none(f"not in {_A10_DS}"),
            fp64_matrix_tflops=_none("no FP64 tensor cores on GA102"),
            fp32_tflops=(31.2, _A10_DS),
            fp32_matrix_tflops=_none("no FP32 matrix unit"),
            tf32_tflops=(62.5, f"{_A10_DS}, the dense figure of '62.5 | 125*'"),
            fp16_tflops=(125.0, f"{_A10_DS}, 'FP16 Tensor Core' dense figure of '125 | 250*'; "
                                "one rate, the same as the datasheet's BF16 (which "
                                "accumulates in FP32), so no GeForce halving"),
            fp16_acc16_tflops=(125.0, f"{_A10_DS}, 'FP16 Tensor Core' dense figure"),
            bf16_tflops=(125.0, f"{_A10_DS}, the dense figure of '125 | 250*'"),
            fp8_tflops=_none(_NOT_TC + " (FP8 arrived with Hopper and Ada)"),
            int8_tops=(250.0, f"{_A10_DS}, the dense figure of '250 | 500*'"),
            fp16_vector_tflops=_none(f"not in {_A10_DS}"),
            bf16_vector_tflops=_none(f"not in {_A10_DS}"),
            memory_gb=(24, f"{_A10_DS}: 24 GB GDDR6"),
            memory_gbps=(600, f"{_A10_DS}: 600 GB/s"),
            l2_bytes=_none(f"not in {_A10_DS}"),
            l2_gbps=_none(_NO_L2BW),
            llc_bytes=_none(_NO_LLC), llc_gbps=_none(_NO_LLC),
            pcie_gen=(4, _A10_DS),
            pcie_bidir_gbps=(64, f"{_A10_DS}: PCIe Gen4 64 GB/s"),
            interconnect=_none(f"PCIe only ({_A10_DS})"),
            interconnect_bidir_gbps=_none(f"PCIe only ({_A10_DS})"),
        ),
        _device(
            key="l4", name="NVIDIA L4", vendor="nvidia", architecture="ada",
            compute_capability=((8, 9), _CUDA_CC),
            sm_count=_none(f"not in {_L4_DS}"),
            boost_clock_mhz=_none(f"not in {_L4_DS}"),
            fp64_tflops=_none(f"not in {_L4_DS}"),
            fp64_matrix_tflops=_none("no FP64 tensor cores on Ada"),
            fp32_tflops=(30.3, _L4_DS),
            fp32_matrix_tflops=_none("no FP32 matrix unit"),
            tf32_tflops=_sparse(120, f"{_L4_DS}, 'TF32 Tensor Core'"),
            fp16_tflops=_sparse(242, f"{_L4_DS}, 'FP16 Tensor Core' (one rate given)"),
            fp16_acc16_tflops=_sparse(242, f"{_L4_DS}, 'FP16 Tensor Core' (one rate given)"),
            bf16_tflops=_sparse(242, f"{_L4_DS}, 'BFLOAT16 Tensor Core'"),
            fp8_tflops=_sparse(485, f"{_L4_DS}, 'FP8 Tensor Core'"),
            int8_tops=_sparse(485, f"{_L4_DS}, 'INT8 Tensor Core'"),
            fp16_vector_tflops=_none(f"not in {_L4_DS}"),
            bf16_vector_tflops=_none(f"not in {_L4_DS}"),
            memory_gb=(24, f"{_L4_DS}: 24 GB GDDR6"),
            memory_gbps=(300, f"{_L4_DS}: 300 GB/s"),
            l2_bytes=_none(f"not in {_L4_DS}"),
            l2_gbps=_none(_NO_L2BW),
            llc_bytes=_none(_NO_LLC), llc_gbps=_none(_NO_LLC),
            pcie_gen=(4, _L4_DS),
            pcie_bidir_gbps=(64, f"{_L4_DS}: PCIe Gen4 x16 64 GB/s"),
            interconnect=_none(f"PCIe only ({_L4_DS})"),
            interconnect_bidir_gbps=_none(f"PCIe only ({_L4_DS})"),
        ),
        _a100("a100-sxm4-40gb", "NVIDIA A100 SXM4 40GB", "sxm4", 40, 1555, a100_40_bw),
        _a100("a100-sxm4-80gb", "NVIDIA A100 SXM4 80GB", "sxm4", 80, 2039,
              f"{_A100_DS} (A100 80GB SXM column): 2,039 GB/s"),
        _a100("a100-pcie-40gb", "NVIDIA A100 PCIe 40GB", "pcie", 40, 1555, a100_40_bw),
        _a100("a100-pcie-80gb", "NVIDIA A100 PCIe 80GB", "pcie", 80, 1935,
              f"{_A100_DS} (A100 80GB PCIe column): 1,935 GB/s"),
        _h100_sxm(), _h100_pcie(), _h200(), _b200(),
        mi250x, per_die(mi250x), mi250, per_die(mi250), _mi300x(),
        _geforce(key="rtx-2080-ti", name="NVIDIA GeForce RTX 2080 Ti", architecture="turing",
                 cc=(7, 5), doc=_TURING_WP, sm=68, clock=1635, fp32=14.2, fp16_acc16=113.8,
                 fp16_acc32=56.9, bf16=None, tf32=None, fp8=None, int8=227.7,
                 fp16_vector=28.5, memory_gb=11, memory_gbps=616, l2_kib=5632, pcie_gen=3,
                 pcie_doc=turing_pcie, nvlink_gbps=100, nvlink_doc=turing_nvlink),
        _geforce(key="rtx-3080", name="NVIDIA GeForce RTX 3080", architecture="ampere",
                 cc=(8, 6), doc=_GA102_WP, sm=68, clock=1710, fp32=29.8, fp16_acc16=119.0,
                 fp16_acc32=59.5, bf16=59.5, tf32=29.8, fp8=None, int8=238.0,
                 fp16_vector=29.8, memory_gb=10, memory_gbps=760, l2_kib=5120, pcie_gen=4,
                 pcie_doc=ga102_pcie, nvlink_gbps=None, nvlink_doc=ga102_link),
        _geforce(key="rtx-3090", name="NVIDIA GeForce RTX 3090", architecture="ampere",
                 cc=(8, 6), doc=_GA102_WP_3090, sm=82, clock=1695, fp32=35.6,
                 fp16_acc16=142.0, fp16_acc32=71.0, bf16=71.0, tf32=35.6, fp8=None,
                 int8=284.0, fp16_vector=35.6, memory_gb=24, memory_gbps=936, l2_kib=6144,
                 pcie_gen=4, pcie_doc=ga102_pcie, nvlink_gbps=112.5, nvlink_doc=ga102_link),
        _geforce(key="rtx-4090", name="NVIDIA GeForce RTX 4090", architecture="ada",
                 cc=(8, 9), doc=_ADA_WP, sm=128, clock=2520, fp32=82.6, fp16_acc16=330.3,
                 fp16_acc32=165.2, bf16=165.2, tf32=82.6, fp8=330.3, int8=660.6,
                 fp16_vector=82.6, memory_gb=24, memory_gbps=1008, l2_kib=73728, pcie_gen=4,
                 pcie_doc=f"{_ADA_WP}: PCIe Gen 4", nvlink_gbps=None,
                 nvlink_doc=f"{_ADA_WP}: no NVLink on the RTX 4090"),
    ]
    return {d.key: d for d in devices}


DEVICES: dict[str, Device] = _table()

# --- typed names: gpu(NAME) -----------------------------------------------------------------
# Family names without a variant pick the SXM part with the larger memory (same peaks as the
# others of the family; only memory, bandwidth and links differ).
_ALIASES = {
    "v100": "v100-sxm2-32gb", "v100sxm2": "v100-sxm2-32gb", "v10016gb": "v100-sxm2-16gb",
    "v10032gb": "v100-sxm2-32gb", "v100pcie": "v100-pcie-32gb",
    "a100": "a100-sxm4-80gb", "a100sxm4": "a100-sxm4-80gb", "a100sxm": "a100-sxm4-80gb",
    "a10040gb": "a100-sxm4-40gb", "a10080gb": "a100-sxm4-80gb", "a100pcie": "a100-pcie-80gb",
    "a100sxm40gb": "a100-sxm4-40gb", "a100sxm80gb": "a100-sxm4-80gb",
    "h100": "h100-sxm", "h100sxm5": "h100-sxm", "h10080gb": "h100-sxm", "h200sxm": "h200",
    "2080ti": "rtx-2080-ti", "3080": "rtx-3080", "3090": "rtx-3090", "4090": "rtx-4090",
}
_VENDOR_WORDS = re.compile(r"nvidia|geforce|tesla|amd|instinct|radeon")


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", _VENDOR_WORDS.sub("", name.lower()))


_TYPED = {**{_norm(k): k for k in DEVICES}, **_ALIASES}


def device(name: str) -> Device:
    """The device a user names in ``gpu(NAME)``: a key ("a100-pcie-40gb") or a short form
    ("A100", "A100-80GB", "h200", "RTX4090", "4090"), case, spaces and dashes ignored."""
    key = _TYPED.get(_norm(str(name)))
    if key is None:
        raise DaydreamError(
            f"unknown GPU {name!r}; known: {', '.join(DEVICES)} (short forms such as "
            f"'A100', 'A100-80GB', 'H100', 'MI300X', '4090' also work)")
    return DEVICES[key]


# --- a trace's deviceProperties -------------------------------------------------------------
def _memory_gb(name: str, props: dict) -> int | None:
    m = re.search(r"(\d+)\s*gb", name)
    if m:
        return int(m.group(1))
    total = _int(props.get("totalGlobalMem"))
    return None if total is None else round(total / GIB)


def _variant(family: str, name: str, props: dict, forms: dict[str, tuple[str, ...]],
             sizes: tuple[int, ...]) -> str | None:
    """``family-form-NNgb`` from the form factor written in the name and the memory size."""
    form = next((f for f, words in forms.items() if any(w in name for w in words)), None)
    gb = _memory_gb(name, props)
    if form is None or gb is None:
        return None
    size = min(sizes, key=lambda s: abs(s - gb))
    return f"{family}-{form}-{size}gb" if abs(size - gb) <= 2 else None


def _mi200_die(pkg: str, props: dict) -> str:
    # ROCm shows each GCD as a GPU; a count of the whole package's CUs means the package
    return pkg if _int(props.get("numSms")) == DEVICES[pkg].sm_count else f"{pkg}-gcd"


# Name rules, first match decides; a rule that returns None means "a GPU of a known family
# that is not in the table" (a V100S, an H100 NVL, a 3080 Ti), which no fallback may guess.
_NAME_RULES = (
    (r"mi300x", lambda n, p: "mi300x"),
    (r"mi250x", lambda n, p: _mi200_die("mi250x", p)),
    (r"mi250", lambda n, p: _mi200_die("mi250", p)),
    (r"instinct|\bmi\d", lambda n, p: None),
    (r"v100s|sxm3|fhhl", lambda n, p: None),
    (r"v100-dgxs", lambda n, p: "v100-sxm2-32gb" if _memory_gb(n, p) == 32 else None),
    (r"v100", lambda n, p: _variant("v100", n, p, {"sxm2": ("sxm2",), "pcie": ("pcie",)},
                                    (16, 32))),
    (r"a100", lambda n, p: _variant("a100", n, p, {"pcie": ("pcie",),
                                                   "sxm4": ("sxm", "pg509")}, (40, 80))),
    (r"h100.*(nvl|pcie)|(nvl|pcie).*h100",
     lambda n, p: "h100-pcie" if "pcie" in n else None),
    (r"h100", lambda n, p: "h100-sxm" if re.search(r"sxm|hbm3", n) else None),
    (r"h200", lambda n, p: None if "nvl" in n else "h200"),
    (r"b200", lambda n, p: "b200"),
    (r"laptop|mobile|max-q|\b(30|40)\d0\s*ti\b|4090\s*d\b", lambda n, p: None),
    (r"2080\s*ti", lambda n, p: "rtx-2080-ti"),
    (r"\b3080\b", lambda n, p: "rtx-3080"),
    (r"\b3090\b", lambda n, p: "rtx-3090"),
    (r"\b4090\b", lambda n, p: "rtx-4090"),
    (r"\bt4\b", lambda n, p: "t4"),
    (r"\ba10\b", lambda n, p: "a10"),
    (r"\bl4\b", lambda n, p: "l4"),
)
_NAME_RES = [(re.compile(r), f) for r, f in _NAME_RULES]

# HIP's major.minor for the gfx targets of the table, as hipDeviceProp_t reports them (seen in
# the MI250 and MI300X traces of tests/data: gfx90a -> 9.0, gfx942 -> 9.4).
_HIP_ARCH = {"cdna2": (9, 0), "cdna3": (9, 4)}


def _int(v) -> int | None:
    try:
        return None if v is None or isinstance(v, bool) else int(v)
    except (TypeError, ValueError):
        return None


def device_from_properties(props: dict | None) -> Device | None:
    """The table's device for a trace's deviceProperties entry (Kineto, nsys, CUPTI), or None.

    The name decides first (an MI300X reports compute capability 9.x like an H100); only a name
    that names no GPU family ("AMD Radeon Graphics" on older ROCm) falls back to compute
    capability, SM count and memory size, which must then match exactly one device."""
    if not isinstance(props, dict):
        return None
    name = str(props.get("name") or "").lower()
    for rx, rule in _NAME_RES:
        if rx.search(name):
            key = rule(name, props)
            return DEVICES[key] if key in DEVICES else None
    return _by_numbers(name, props)


def _by_numbers(name: str, props: dict) -> Device | None:
    cc = (_int(props.get("computeMajor")), _int(props.get("computeMinor")))
    sms, total = _int(props.get("numSms")), _int(props.get("totalGlobalMem"))
    if None in cc or sms is None or total is None:
        return None
    vendor = ("amd" if re.search(r"amd|radeon|gfx", name) else
              "nvidia" if re.search(r"nvidia|tesla|geforce|quadro", name) else None)
    found = []
    for d in DEVICES.values():
        if d.logical_devices != 1 or d.memory_gb is None or (vendor and d.vendor != vendor):
            continue
        d_cc = d.compute_capability if d.vendor == "nvidia" else _HIP_ARCH.get(d.architecture)
        # the runtime reports a little less memory than the datasheet (ECC, reserved pages)
        if d_cc == cc and d.sm_count == sms and 0.85 * d.memory_gb * GIB <= total <= \
                d.memory_gb * GIB:
            found.append(d)
    return found[0] if len(found) == 1 else None


# --- docs/hardware.md -----------------------------------------------------------------------
DOC = Path(__file__).resolve().parent.parent / "docs" / "hardware.md"
_COLUMNS = (
    ("Device and memory", (
        ("architecture", "arch"), ("compute_capability", "CC"), ("sm_count", "SMs/CUs"),
        ("boost_clock_mhz", "boost MHz"), ("memory_gb", "memory GB"),
        ("memory_gbps", "memory GB/s"), ("l2_bytes", "L2 MB"), ("l2_gbps", "L2 GB/s"),
        ("llc_bytes", "LLC MB"), ("llc_gbps", "LLC GB/s"), ("pcie_gen", "PCIe gen"),
        ("pcie_bidir_gbps", "PCIe x16 GB/s"), ("interconnect", "GPU link"),
        ("interconnect_bidir_gbps", "link GB/s"))),
    ("Dense peak rates (TFLOPS; INT8 in TOPS)", (
        ("fp64_tflops", "FP64"), ("fp64_matrix_tflops", "FP64 matrix"),
        ("fp32_tflops", "FP32"), ("fp32_matrix_tflops", "FP32 matrix"),
        ("tf32_tflops", "TF32"), ("fp16_tflops", "FP16 (FP32 acc)"),
        ("fp16_acc16_tflops", "FP16 (FP16 acc)"), ("bf16_tflops", "BF16"),
        ("fp8_tflops", "FP8"), ("int8_tops", "INT8"), ("fp16_vector_tflops", "FP16 vector"),
        ("bf16_vector_tflops", "BF16 vector"))),
)


def _cell(d: Device, f: str) -> str:
    v = getattr(d, f)
    if v is None:
        return "—"
    if f == "compute_capability":
        return f"{v[0]}.{v[1]}"
    if f in ("l2_bytes", "llc_bytes"):
        return f"{v / MIB:g}"
    return v if isinstance(v, str) else f"{v:g}"


def markdown() -> str:
    """docs/hardware.md: the table, every cell footnoted with its source."""
    notes: dict[str, int] = {}

    def ref(d: Device, f: str) -> str:
        n = notes.setdefault(d.source(f), len(notes) + 1)
        return f"[^{n}]"

    out = ["# GPU table", "",
           "Generated by `python -m daydream.transforms.hardware` from "
           "`transforms/hardware.py`; do not edit by hand. Every figure is a published one; "
           "its footnote names the document and table it comes from, and for an empty cell "
           "(—) where it was looked for. Rates are dense (no 2:4 sparsity); FP16 (FP32 acc) "
           "is the rate autocast GEMMs use. "
           "Memory and caches are binary GB/MB; bandwidths decimal GB/s; PCIe and GPU links "
           "count both directions together. A `-gcd` row is one die of an MI250/MI250X "
           "package, the GPU a trace sees.", ""]
    for title, cols in _COLUMNS:
        out += [f"## {title}", "", "| device | " + " | ".join(h for _, h in cols) + " |",
                "|---|" + "---|" * len(cols)]
        for d in DEVICES.values():
            cells = [f"{_cell(d, f)}{ref(d, f)}" if f != "architecture" else d.architecture
                     for f, _ in cols]
            out.append(f"| `{d.key}` ({d.name}) | " + " | ".join(cells) + " |")
        out.append("")
    out += ["## Sources", ""] + [f"[^{n}]: {s}" for s, n in notes.items()]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write docs/hardware.md (``--stdout`` prints it instead)."""
    argv = sys.argv[1:] if argv is None else argv
    text = markdown()
    if "--stdout" in argv:
        sys.stdout.write(text)
    else:
        DOC.write_text(text, encoding="utf-8")
        print(f"wrote {DOC.name}: {len(DEVICES)} devices")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
