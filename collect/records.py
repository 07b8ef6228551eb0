"""CUPTI activity record layouts the collector handles, as numpy structured dtypes.

Source: cupti-python 13.4.0 (NVIDIA's bindings, built on the CUDA 13.4 ``cupti_activity.h``).
Its module ``cupti.cupti`` exposes one numpy dtype per C struct (``activity_kernel13_dtype`` for
``CUpti_ActivityKernel13``, ...) and hands the buffer-completed callback one wrapper object per
record, of the class of the struct (``ActivityKernel13``) with ``.ptr`` at the record's bytes.

Only the fields the reader turns into columns are listed, at the offsets cupti-python's dtypes
give them, with each struct's full size: a record array of these dtypes has exactly the bytes of
CUPTI's, the other fields being opaque. The offsets of these fields are the same in every struct
version of a family (Kernel9 to Kernel13, ...), so one field list serves a family and only the
size differs. ``tests/collect/test_records.py`` checks every entry against cupti-python's own
dtypes when it is installed. A struct not listed here (a newer version) is taken from
cupti-python at collection time.

String fields (``strings``) hold ``const char *`` in CUPTI's records; the collector replaces
them with ids in the file's string table (see ``ingest.cupti_format``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

SOURCE = "cupti-python 13.4.0 dtypes (CUDA 13.4 cupti_activity.h)"

_KERNEL = (
    ("kind", "<i4", 0), ("registers_per_thread", "<u2", 6), ("start", "<u8", 16),
    ("end", "<u8", 24), ("device_id", "<u4", 40), ("context_id", "<u4", 44),
    ("stream_id", "<u4", 48), ("grid_x", "<i4", 52), ("grid_y", "<i4", 56), ("grid_z", "<i4", 60),
    ("block_x", "<i4", 64), ("block_y", "<i4", 68), ("block_z", "<i4", 72),
    ("static_shared_memory", "<i4", 76), ("dynamic_shared_memory", "<i4", 80),
    ("correlation_id", "<u4", 92), ("name", "<i8", 104),
)
_MEMCPY = (
    ("kind", "<i4", 0), ("copy_kind", "|u1", 4), ("src_kind", "|u1", 5), ("dst_kind", "|u1", 6),
    ("bytes", "<u8", 8), ("start", "<u8", 16), ("end", "<u8", 24), ("device_id", "<u4", 32),
    ("context_id", "<u4", 36), ("stream_id", "<u4", 40), ("correlation_id", "<u4", 44),
)
_MEMSET = (
    ("kind", "<i4", 0), ("bytes", "<u8", 8), ("start", "<u8", 16), ("end", "<u8", 24),
    ("device_id", "<u4", 32), ("context_id", "<u4", 36), ("stream_id", "<u4", 40),
    ("correlation_id", "<u4", 44), ("memory_kind", "<u2", 50),
)
_API = (
    ("kind", "<i4", 0), ("cbid", "<u4", 4), ("start", "<u8", 8), ("end", "<u8", 16),
    ("process_id", "<u4", 24), ("thread_id", "<u4", 28), ("correlation_id", "<u4", 32),
    ("return_value", "<u4", 36),
)
_SYNC = (
    ("kind", "<i4", 0), ("type", "<i4", 4), ("start", "<u8", 8), ("end", "<u8", 16),
    ("correlation_id", "<u4", 24), ("context_id", "<u4", 28), ("stream_id", "<u4", 32),
    ("cuda_event_id", "<u4", 36),
)
_EXTERNAL = (
    ("kind", "<i4", 0), ("external_kind", "<i4", 4), ("external_id", "<u8", 8),
    ("correlation_id", "<u4", 16),
)
_MARKER = (
    ("kind", "<i4", 0), ("flags_", "<i4", 4), ("timestamp", "<u8", 8), ("id", "<u4", 16),
    ("object_kind", "<i4", 20), ("object_id.pt.process_id", "<u4", 24),
    ("object_id.pt.thread_id", "<u4", 28), ("name", "<i8", 40), ("domain", "<i8", 48),
)
_DEVICE = (
    ("kind", "<i4", 0), ("global_memory_bandwidth", "<u8", 8), ("global_memory_size", "<u8", 16),
    ("l2cache_size", "<u4", 28), ("num_threads_per_warp", "<u4", 32),
    ("core_clock_rate", "<u4", 36), ("num_multiprocessors", "<u4", 44),
    ("max_shared_memory_per_multiprocessor", "<u4", 60),
    ("max_registers_per_multiprocessor", "<u4", 64), ("max_registers_per_block", "<u4", 68),
    ("max_shared_memory_per_block", "<u4", 72), ("max_threads_per_block", "<u4", 76),
    ("compute_capability_major", "<u4", 104), ("compute_capability_minor", "<u4", 108),
    ("id", "<u4", 112), ("name", "<i8", 136),
)
_CONTEXT = (("kind", "<i4", 0), ("context_id", "<u4", 4), ("device_id", "<u4", 8))

# class name in cupti-python (struct without the CUpti_ prefix) -> (fields, sizeof, strings)
_TABLE: dict[str, tuple[tuple, int, tuple[str, ...]]] = {
    "ActivityKernel9": (_KERNEL, 208, ("name",)),
    "ActivityKernel10": (_KERNEL, 216, ("name",)),
    "ActivityKernel11": (_KERNEL, 224, ("name",)),
    "ActivityKernel12": (_KERNEL, 232, ("name",)),
    "ActivityKernel13": (_KERNEL, 248, ("name",)),
    "ActivityMemcpy5": (_MEMCPY, 88, ()),
    "ActivityMemcpy6": (_MEMCPY, 96, ()),
    "ActivityMemcpy7": (_MEMCPY, 112, ()),
    "ActivityMemset4": (_MEMSET, 88, ()),
    "ActivityMemset5": (_MEMSET, 104, ()),
    "ActivityAPI": (_API, 40, ()),
    "ActivitySynchronization": (_SYNC, 40, ()),
    "ActivitySynchronization2": (_SYNC, 56, ()),
    "ActivityExternalCorrelation": (_EXTERNAL, 24, ()),
    "ActivityMarker2": (_MARKER, 56, ("name", "domain")),
    "ActivityDevice5": (_DEVICE, 184, ("name",)),
    "ActivityDevice6": (_DEVICE, 192, ("name",)),
    "ActivityContext3": (_CONTEXT, 32, ()),
    "ActivityContext4": (_CONTEXT, 40, ()),
}
# Pointer fields by family, for structs taken from cupti-python at run time.
_STRINGS_BY_FAMILY = {"Kernel": ("name",), "Marker": ("name", "domain"), "Device": ("name",),
                      "CdpKernel": ("name",)}


@dataclass(frozen=True)
class Layout:
    """How to read one cupti-python record class."""

    cls: str                 # ActivityKernel13
    struct: str              # CUpti_ActivityKernel13
    dtype: np.dtype
    strings: tuple[str, ...]
    source: str


def dtype_of(fields: tuple, itemsize: int) -> np.dtype:
    names, formats, offsets = zip(*fields, strict=True)
    return np.dtype({"names": list(names), "formats": list(formats), "offsets": list(offsets),
                     "itemsize": itemsize})


def known_classes() -> tuple[str, ...]:
    return tuple(_TABLE)


def layout(cls_name: str) -> Layout | None:
    """The layout of a cupti-python record class: ours when listed, else cupti-python's own dtype
    (None when neither knows it)."""
    entry = _TABLE.get(cls_name)
    if entry is not None:
        fields, size, strings = entry
        return Layout(cls_name, f"CUpti_{cls_name}", dtype_of(fields, size), strings, SOURCE)
    dt = cupti_dtype(cls_name)
    if dt is None:
        return None
    fam = re.match(r"^Activity([A-Za-z]+?)\d*$", cls_name)
    strings = _STRINGS_BY_FAMILY.get(fam.group(1) if fam else "", ())
    strings = tuple(s for s in strings if s in (dt.names or ()))
    return Layout(cls_name, f"CUpti_{cls_name}", dt, strings, "cupti-python dtype at run time")


def cupti_dtype(cls_name: str) -> np.dtype | None:
    """cupti-python's numpy dtype for a record class (``ActivityAPI`` ->
    ``activity_api_dtype``), or None when cupti-python is absent or has none."""
    try:
        from cupti import cupti
    except ImportError:
        return None
    want = cls_name.lower()
    for attr in dir(cupti):
        if attr.endswith("_dtype") and attr[:-len("_dtype")].replace("_", "") == want:
            return getattr(cupti, attr)
    return None


def empty(cls_name: str, n: int = 0) -> np.ndarray:
    """``n`` zeroed records of a listed class (tests build CUPTI buffers with these)."""
    fields, size, _ = _TABLE[cls_name]
    return np.zeros(n, dtype_of(fields, size))
