"""GPU families: the key every device-dependent constant is given by (AMP speedups, PCIe and
memory bandwidths, the usual interconnect), found from a trace's device entry.

A trace names its GPU in the ``devices`` JSON of the trace table (Kineto ``deviceProperties``,
Nsight's GPU table): ``{"name": "Tesla V100-DGXS-32GB", "computeMajor": 7, ...}``. Constants
are measured per family, not per product: the GPUs of one family share the architecture that
decides them (tensor cores, HBM generation, NVLink generation).
"""

from __future__ import annotations

# Every family a constant table may be keyed by; "default" where the device is unknown.
FAMILIES = ("v100", "a100", "h100", "turing", "mi300x", "default")


def family(device: dict | None) -> str:
    """The GPU family of a trace's device entry (one of FAMILIES): by product name, else by
    compute capability."""
    if not device:
        return "default"
    name = str(device.get("name", "")).lower()
    major, minor = device.get("computeMajor"), device.get("computeMinor")
    if "v100" in name or (major == 7 and minor == 0):
        return "v100"
    if "h100" in name or "h200" in name or "h800" in name or major == 9:
        return "h100"
    if "mi300" in name or "mi250" in name or "mi2" in name or "gfx9" in name:
        return "mi300x"
    if "a100" in name or "a800" in name or major == 8:
        return "a100"
    if major == 7 and minor == 5 or "2080" in name or "t4" in name.split():
        return "turing"
    return "default"
