"""The GPU table (transforms/hardware.py): the devices of real traces, typed names, and figures
checked by hand against the datasheets they come from."""

from __future__ import annotations

import dataclasses

import pytest

from daydream.base.errors import DaydreamError
from daydream.ingest.convert import read_trace
from daydream.transforms import hardware
from daydream.transforms.hardware import DEVICES, FIGURES, device, device_from_properties
from tests.conftest import DATA, ROOT, SHARED

# Every trace with its GPU, as its deviceProperties name it (None: the trace records none).
TRACES = [
    ("kineto/resnet50_v100_rank0.json.gz", "v100-sxm2-32gb"),
    # Tesla V100-DGXS-32GB: the NVLink V100 of a DGX Station
    ("kineto/resnet50_v100_nw0_run1.json.gz", "v100-sxm2-32gb"),
    ("kineto/dlrm_8ranks/rank0.kineto.json.gz", "v100-sxm2-32gb"),
    ("kineto/dlrm_8ranks/rank5.kineto.json.gz", "v100-sxm2-32gb"),
    # NVIDIA A100-PG509-200: PG509 is the SXM4 board, 42.3e9 bytes the 40 GB part
    ("kineto/resnet50_ddp_a100_rank0.json.gz", "a100-sxm4-40gb"),
    ("kineto/alexnet_fwd_a100.json.gz", "a100-sxm4-40gb"),
    ("kineto/simple_add_a100.json.gz", "a100-sxm4-40gb"),
    ("kineto/event_sync_multi_stream.json.gz", "a100-sxm4-40gb"),
    ("kineto/triton_example.json.gz", "a100-sxm4-40gb"),
    # "AMD Radeon Graphics", 104 CUs, 64 GiB: one GCD of an MI250 (found by its numbers)
    ("kineto/mi250_toy_train_rocm.json.gz", "mi250-gcd"),
    # AMD Instinct MI300X reports compute capability 9.4: it must not be taken for a Hopper
    ("kineto/resnet_actckpt_mi300x_rank0_of8.json.gz", "mi300x"),
    ("kineto/ads_sampled_rank0_of128.json.gz", None),
    ("kineto/backward_thread.json", None),
    ("nsys/mock_rtx3080.sqlite", "rtx-3080"),
    # the 2xH100 FSDP slice has no TARGET_INFO_GPU table: nothing says which H100 it was
    ("nsys/fsdp_t5_2xh100_1s.sqlite", None),
]
# Traces only in ../shared/traces (checked when it is there).
SHARED_TRACES = [
    ("hta/torchrec_a100_rank0_of16.json.gz", "a100-sxm4-80gb"),
    ("hta/recsys_a100_rank3_of8.json.gz", "a100-sxm4-40gb"),
    ("hta/transformer_ddp_v100_rank1.json.gz", "v100-sxm2-32gb"),
    ("param/mlp_2080ti.kineto.json.gz", "rtx-2080-ti"),
    ("param/resnet18_2080ti.kineto.json.gz", "rtx-2080-ti"),
    ("particle/particle_transformer_a100_fwd_bs2.json.gz", "a100-pcie-40gb"),
    ("kineto-tb-plugin/resnet50_jan21_nw0.json.gz", None),
]
# The deviceProperties of the shared-only GPUs, copied from those traces, so that a clone
# without ../shared still checks them (test_recorded_matches_shared keeps the copy honest).
RECORDED = {
    "param/mlp_2080ti.kineto.json.gz": (
        {"name": "NVIDIA GeForce RTX 2080 Ti", "computeMajor": 7, "computeMinor": 5,
         "totalGlobalMem": 11554586624, "numSms": 68}, "rtx-2080-ti"),
    "hta/torchrec_a100_rank0_of16.json.gz": (
        {"name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8, "computeMinor": 0,
         "totalGlobalMem": 84990623744, "numSms": 108}, "a100-sxm4-80gb"),
    "particle/particle_transformer_a100_fwd_bs2.json.gz": (
        {"name": "NVIDIA A100-PCIE-40GB", "computeMajor": 8, "computeMinor": 0,
         "totalGlobalMem": 42346610688, "numSms": 108}, "a100-pcie-40gb"),
}


def _check_trace(path, expected):
    devices = read_trace(path).devices or []
    if expected is None:
        assert all(device_from_properties(p) is None for p in devices)
        return
    assert devices, f"{path.name} records no deviceProperties"
    for props in devices:
        d = device_from_properties(props)
        assert d is not None and d.key == expected, (props.get("name"), d and d.key)
        # the runtime sees a little less memory than the datasheet's (ECC, reserved pages)
        if props.get("totalGlobalMem"):
            assert 0.9 * d.memory_bytes <= props["totalGlobalMem"] <= d.memory_bytes


@pytest.mark.parametrize("rel, expected", TRACES, ids=[t for t, _ in TRACES])
def test_trace_devices(rel, expected):
    _check_trace(DATA / rel, expected)


@pytest.mark.parametrize("rel, expected", SHARED_TRACES, ids=[t for t, _ in SHARED_TRACES])
def test_shared_trace_devices(rel, expected):
    if not (SHARED / rel).exists():
        pytest.skip("../shared/traces is not here")
    _check_trace(SHARED / rel, expected)


@pytest.mark.parametrize("rel", RECORDED)
def test_recorded_properties(rel):
    props, expected = RECORDED[rel]
    assert device_from_properties(props).key == expected


@pytest.mark.parametrize("rel", RECORDED)
def test_recorded_matches_shared(rel):
    if not (SHARED / rel).exists():
        pytest.skip("../shared/traces is not here")
    props, _ = RECORDED[rel]
    first = read_trace(SHARED / rel).devices[0]
    assert {k: first[k] for k in props} == props


def test_nsys_record_agrees_with_the_table():
    # The RTX 3080's own TARGET_INFO_GPU row (written by the driver, not by us) against the
    # GA102 whitepaper's Table 1: 68 SMs, 1710 MHz boost, 5120 KB L2, 760 GB/s.
    props = read_trace(DATA / "nsys" / "mock_rtx3080.sqlite").devices[0]
    d = device_from_properties(props)
    assert props["numSms"] == d.sm_count == 68
    assert props["clockRateHz"] == d.boost_clock_mhz * 1e6 == 1710e6
    assert props["l2CacheSize"] == d.l2_bytes == 5120 * 1024
    assert props["memoryBandwidthBytesPerS"] / 1e9 == pytest.approx(d.memory_gbps, rel=1e-3)


def test_name_decides_before_numbers():
    # an MI300X that reported the compute capability of an H100 is still an MI300X
    mi300x = {"name": "AMD Instinct MI300X", "computeMajor": 9, "computeMinor": 0,
              "totalGlobalMem": 206141652992, "numSms": 304}
    assert device_from_properties(mi300x).key == "mi300x"
    # a known family in a variant the table lacks is not guessed from its numbers, though a
    # V100S reports the V100's 7.0, 80 SMs and 32 GB
    v100s = {"name": "Tesla V100S-PCIE-32GB", "computeMajor": 7, "computeMinor": 0,
             "totalGlobalMem": 34089730048, "numSms": 80}
    assert device_from_properties(v100s) is None
    for name in ("NVIDIA H100 NVL", "NVIDIA GeForce RTX 3080 Ti", "NVIDIA GeForce RTX 3080 "
                 "Laptop GPU", "AMD Instinct MI210", "NVIDIA H100"):
        assert device_from_properties({"name": name, "computeMajor": 9}) is None, name


def test_numbers_when_the_name_says_nothing():
    h100 = {"name": "", "computeMajor": 9, "computeMinor": 0, "numSms": 132,
            "totalGlobalMem": 85_000_000_000}
    assert device_from_properties(h100).key == "h100-sxm"
    # 32 GB V100 numbers: SXM2 and PCIe both have 80 SMs, so the numbers cannot tell them apart
    v100 = {"name": "", "computeMajor": 7, "computeMinor": 0, "numSms": 80,
            "totalGlobalMem": 34079637504}
    assert device_from_properties(v100) is None
    # AMD numbers are not matched against NVIDIA parts, nor the reverse
    assert device_from_properties({**h100, "name": "AMD Radeon Graphics"}) is None
    p100 = {"name": "Tesla P100-SXM2-16GB", "computeMajor": 6, "computeMinor": 0,
            "numSms": 56, "totalGlobalMem": 17071734784}
    assert device_from_properties(p100) is None
    assert device_from_properties(None) is None
    assert device_from_properties({}) is None
    assert device_from_properties({"name": "x", "computeMajor": "?", "numSms": None}) is None


@pytest.mark.parametrize("typed, key", [
    ("V100", "v100-sxm2-32gb"), ("v100-16gb", "v100-sxm2-16gb"),
    ("V100 PCIe", "v100-pcie-32gb"), ("T4", "t4"), ("A10", "a10"), ("L4", "l4"),
    ("A100", "a100-sxm4-80gb"), ("A100-80GB", "a100-sxm4-80gb"),
    ("a100-40gb", "a100-sxm4-40gb"), ("A100 PCIe 40GB", "a100-pcie-40gb"),
    ("H100", "h100-sxm"), ("h100-pcie", "h100-pcie"), ("h200", "h200"), ("B200", "b200"),
    ("MI250X", "mi250x"), ("mi250-gcd", "mi250-gcd"), ("MI300X", "mi300x"),
    ("AMD Instinct MI300X", "mi300x"), ("RTX4090", "rtx-4090"), ("4090", "rtx-4090"),
    ("GeForce RTX 2080 Ti", "rtx-2080-ti"), ("rtx_3090", "rtx-3090"), ("3080", "rtx-3080"),
])
def test_typed_names(typed, key):
    assert device(typed).key == key


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(DaydreamError, match="unknown GPU 'P100'; known: v100-sxm2-16gb, ") as e:
        device("P100")
    assert "rtx-4090" in str(e.value) and "mi300x" in str(e.value)


def test_datasheet_figures():
    # Expected values typed from the documents named in each comment, not from the table.
    v100 = DEVICES["v100-sxm2-32gb"]
    # V100 datasheet, SXM2: 125 TFLOPS tensor vs 15.7 FP32 (the 8x of issue 15)
    assert (v100.fp16_tflops, v100.fp32_tflops, v100.fp64_tflops) == (125, 15.7, 7.8)
    assert (DEVICES["v100-pcie-16gb"].fp16_tflops, DEVICES["v100-pcie-16gb"].fp32_tflops) == (
        112, 14)
    a100 = DEVICES["a100-sxm4-80gb"]
    # A100 datasheet: TF32 "156 | 312*", FP16 "312 | 624*" (* with sparsity); 2,039 GB/s
    assert (a100.tf32_tflops, a100.fp16_tflops, a100.memory_gbps) == (156, 312, 2039)
    assert DEVICES["a100-pcie-40gb"].memory_gbps == 1555
    h100 = DEVICES["h100-sxm"]
    # H100 whitepaper, SXM5 dense: FP16 989.4, TF32 494.7, FP8 1978.9, FP32 66.9, 132 SMs
    assert (h100.fp16_tflops, h100.tf32_tflops, h100.fp8_tflops) == (989.4, 494.7, 1978.9)
    assert (h100.fp32_tflops, h100.sm_count) == (66.9, 132)
    # H100 datasheet, PCIe: FP16 "1,513*" with sparsity -> 756.5 dense
    assert DEVICES["h100-pcie"].fp16_tflops == 756.5
    # H200 datasheet: FP16 "1,979*" with sparsity -> 989.5 dense; 141 GB at 4.8 TB/s
    h200 = DEVICES["h200"]
    assert (h200.fp16_tflops, h200.memory_gb, h200.memory_gbps) == (989.5, 141, 4800)
    # HGX B200, 8 GPUs: FP16/BF16 36 PFLOPS with sparsity -> 36000 / 8 / 2 = 2250 per GPU
    assert DEVICES["b200"].fp16_tflops == 2250
    # L4 datasheet: FP8 "485*" with sparsity -> 242.5 dense
    assert DEVICES["l4"].fp8_tflops == 242.5
    # GA102 whitepaper, RTX 3080: FP16 tensor 119 with FP16 accumulate, 59.5 with FP32
    r3080 = DEVICES["rtx-3080"]
    assert (r3080.fp16_acc16_tflops, r3080.fp16_tflops, r3080.tf32_tflops) == (119, 59.5, 29.8)
    # Ada whitepaper, RTX 4090: 330.3 / 165.2, 72 MB (73728 KB) of L2
    r4090 = DEVICES["rtx-4090"]
    assert (r4090.fp16_acc16_tflops, r4090.fp16_tflops) == (330.3, 165.2)
    assert r4090.l2_bytes == 73728 * 1024
    # ROCm MI300 page: matrix FP16 1307.4, matrix FP32 163.4 (8x), vector FP64 81.7
    mi300x = DEVICES["mi300x"]
    assert (mi300x.fp16_tflops, mi300x.fp32_matrix_tflops, mi300x.fp64_tflops) == (
        1307.4, 163.4, 81.7)
    assert mi300x.llc_bytes == 256 * 2**20 and mi300x.l2_bytes == 32 * 2**20
    # MI250 data sheet: 208 CUs, 362.1 FP16, 128 GB, 3.2 TB/s; one GCD is half of each
    mi250, gcd = DEVICES["mi250"], DEVICES["mi250-gcd"]
    assert (mi250.sm_count, mi250.fp16_tflops, mi250.memory_gb) == (208, 362.1, 128)
    assert (gcd.sm_count, gcd.fp16_tflops, gcd.memory_gb, gcd.memory_gbps) == (
        104, 181.05, 64, 1600)
    assert gcd.source("fp16_tflops").startswith("derived: the package figure 362.1 / 2")
    assert gcd.interconnect_bidir_gbps is None


def test_not_supported_is_none_not_zero():
    assert DEVICES["v100-sxm2-32gb"].tf32_tflops is None
    assert DEVICES["v100-sxm2-32gb"].bf16_tflops is None
    assert DEVICES["a100-sxm4-40gb"].fp8_tflops is None
    assert DEVICES["mi250x"].tf32_tflops is None
    assert "TF32 arrived with Ampere" in DEVICES["t4"].source("tf32_tflops")


def test_every_figure_has_a_source():
    assert len(DEVICES) == 24
    for d in DEVICES.values():
        for f in FIGURES:
            v, s = getattr(d, f), d.source(f)
            assert isinstance(s, str) and len(s) > 10, (d.key, f)
            assert v is None or not isinstance(v, bool), (d.key, f)
            if "with sparsity ('*' figure) halved" in s:
                assert isinstance(v, float), (d.key, f)
        assert d.architecture in {"volta", "turing", "ampere", "ada", "hopper", "blackwell",
                                  "cdna2", "cdna3"}
        assert (d.compute_capability is None) == (d.vendor == "amd"), d.key


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEVICES["t4"].fp32_tflops = 1.0
    with pytest.raises(TypeError):
        DEVICES["t4"].sources["fp32_tflops"] = "x"


def test_committed_doc_is_generated():
    doc = ROOT / "docs" / "hardware.md"
    assert doc.read_text(encoding="utf-8") == hardware.markdown(), (
        "docs/hardware.md is stale: run `python -m daydream.transforms.hardware`")
