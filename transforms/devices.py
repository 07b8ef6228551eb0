"""GPU families: the key every device-dependent constant is given by, found from a trace's
device entry; and the trace's GPU in the table (``gpu``), whose own figures (memory bandwidth,
PCIe generation, NVLink) the models read.

A trace names its GPU in the ``devices`` JSON of the trace table (Kineto ``deviceProperties``,
Nsight's GPU table): ``{"name": "Tesla V100-DGXS-32GB", "computeMajor": 7, ...}``. Constants
are measured per family, not per product: the GPUs of one family share the architecture that
decides them (tensor cores, HBM generation, NVLink generation).

The device itself is looked up in one place, the GPU table (``transforms.hardware``,
``device_from_properties``: the name decides, so an MI300X, which reports compute capability
9.x like an H100, is an MI300X); a family is its architecture. Only an entry the table does not
know (a part it lacks, or properties without a usable name) falls back to its name's words and
then its compute capability, an AMD name never by a CUDA compute capability. Models that need
a figure of the GPU itself (AMP's and the roofline's peaks) read the table's device directly.
"""

from __future__ import annotations

import re

from daydream.transforms.constants import GPU_MEMORY
from daydream.transforms.hardware import DEVICES, Device, device_from_properties

# Every family a constant table may be keyed by; "default" where the device is unknown.
FAMILIES = ("v100", "a100", "h100", "turing", "mi300x", "default")

# The family of each architecture of the GPU table. Ada shares Ampere's third-generation
# tensor cores and TF32/BF16 support; CDNA2 is keyed with CDNA3 (one AMD family). Blackwell
# has no measured constants yet: "default".
ARCHITECTURE_FAMILY = {"volta": "v100", "turing": "turing", "ampere": "a100", "ada": "a100",
                       "hopper": "h100", "blackwell": "default", "cdna2": "mi300x",
                       "cdna3": "mi300x"}

# The part of the table that stands for a family where the trace's GPU is not in the table:
# the one its constants were measured on ("default", an unknown GPU: a V100).
REFERENCE = {"v100": "v100-sxm2-32gb", "a100": "a100-sxm4-40gb", "h100": "h100-sxm",
             "turing": "rtx-2080-ti", "mi300x": "mi300x", "default": "v100-sxm2-32gb"}

# Names of parts the table lacks: a CDNA2/CDNA3 part (keyed as the table's), or another AMD
# part (whose compute capability, HIP's gfx version, is no CUDA one).
_CDNA = re.compile(r"mi2\d\d|mi3\d\d|gfx90a|gfx94\d")
_AMD = re.compile(r"\bamd\b|instinct|radeon|gfx\d")


def family(device: dict | None) -> str:
    """The GPU family of a trace's device entry (one of FAMILIES): the architecture of its
    device in the GPU table, else by product name and compute capability."""
    if not device:
        return "default"
    d = device_from_properties(device)
    if d is not None:
        return ARCHITECTURE_FAMILY[d.architecture]
    name = str(device.get("name", "")).lower()
    major, minor = device.get("computeMajor"), device.get("computeMinor")
    if _CDNA.search(name):
        return "mi300x"
    if _AMD.search(name):
        return "default"
    if "v100" in name or (major == 7 and minor == 0):
        return "v100"
    if "h100" in name or "h200" in name or "h800" in name or major == 9:
        return "h100"
    if "a100" in name or "a800" in name or major == 8:
        return "a100"
    if (major == 7 and minor == 5) or "2080" in name or "t4" in name.split():
        return "turing"
    return "default"


def gpu(device: dict | None, figure: str | None = None) -> Device:
    """The trace's GPU in the table (``transforms.hardware``), else the REFERENCE part of its
    family. With ``figure``, the part whose figure that is: the reference part also where the
    table gives none for the trace's own (a link published per package only, for one GCD)."""
    d = device_from_properties(device) if device else None
    if d is None or (figure is not None and getattr(d, figure) is None):
        return DEVICES[REFERENCE[family(device)]]
    return d


def achieved_memory_bandwidth(device: dict | None) -> float:
    """Bytes per ns the GPU's memory moves for an inserted bandwidth-bound kernel (a copy, a
    gradient encode or decode): its memory_gbps (``gpu``) times GPU_MEMORY achieved."""
    return gpu(device, "memory_gbps").memory_gbps * GPU_MEMORY["achieved"]["value"]
