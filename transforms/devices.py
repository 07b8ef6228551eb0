"""GPU families: the key of the per-family constant tables (PCIe and memory bandwidths, the usual
interconnect), found from a trace's device entry through the GPU table.

A trace names its GPU in the ``devices`` JSON of the trace table (Kineto ``deviceProperties``,
Nsight's GPU table): ``{"name": "Tesla V100-DGXS-32GB", "computeMajor": 7, ...}``. The family
is the GPU table's device for it (``transforms.hardware.device_from_properties``: the name
decides, so an MI300X, which reports compute capability 9.x like an H100, is an MI300X); only a
device the table does not know falls back to its name's words and compute capability. Models
that need a figure of the GPU itself (AMP's peaks) read the table's device directly.
"""

from __future__ import annotations

from transforms import hardware

# Every family a constant table may be keyed by; "default" where the device is unknown.
FAMILIES = ("v100", "a100", "h100", "turing", "mi300x", "default")

# The family of each device of the GPU table (by key prefix), for the per-family tables.
_BY_KEY = (("v100", "v100"), ("a100", "a100"), ("h100", "h100"), ("h200", "h100"),
           ("t4", "turing"), ("rtx-2080", "turing"), ("mi300x", "mi300x"))


def family(device: dict | None) -> str:
    """The GPU family of a trace's device entry (one of FAMILIES): the GPU table's device for
    it, else the words of its name, else its compute capability; "default" when none fits."""
    if not device:
        return "default"
    dev = hardware.device_from_properties(device)
    if dev is not None:
        return next((f for prefix, f in _BY_KEY if dev.key.startswith(prefix)), "default")
    name = str(device.get("name", "")).lower()
    major, minor = device.get("computeMajor"), device.get("computeMinor")
    if "mi300" in name:
        return "mi300x"
    if "instinct" in name or "radeon" in name or "gfx" in name:
        return "default"
    if "v100" in name or (major == 7 and minor == 0):
        return "v100"
    if "h100" in name or "h200" in name or "h800" in name or major == 9:
        return "h100"
    if "a100" in name or "a800" in name or (major == 8 and minor == 0):
        return "a100"
    if (major == 7 and minor == 5) or "2080" in name or "t4" in name.split():
        return "turing"
    return "default"
