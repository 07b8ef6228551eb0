"""The format of raw CUPTI record files (``DDCUPTI1``): what the collector (``collect/``), which
writes them inside the training process, and the reader (``ingest.cupti_raw``) share.

The file keeps CUPTI's activity records as CUPTI laid them out in memory, a buffer at a time, so
collection costs a copy and a write, and a file cut off by a crash is readable up to its last
complete chunk. Every record layout is described in the file itself, so the reader needs
neither a GPU nor cupti-python. This module imports nothing beyond numpy and orjson, which the
collector needs anyway: the training process loads no reader (pyarrow, numba, ISA-L).

Format (all integers little-endian)::

    file    := MAGIC header chunk*
    MAGIC   := b"DDCUPTI1"
    header  := u32 n, n bytes of JSON (an object, see below), zero bytes up to a multiple of 8
    chunk   := b"DDCK" u8 type u8 codec u16 layout u32 count u64 stored u64 raw u32 crc32
               (32 bytes), then ``stored`` payload bytes, zero bytes up to a multiple of 8

``crc32`` is zlib's CRC of the stored payload; ``codec`` 0 stores it as is, 1 with zlib (then
``raw`` is the inflated size). Chunk types:

* ``LAYOUT`` (1), JSON: a record layout, ``{"id", "struct", "itemsize", "fields": [[name,
  numpy format, offset, shape], ...], "strings": [field, ...], "source"}``. ``struct`` is the C
  struct (``CUpti_ActivityKernel13``) or ``daydream_Marker``; fields are the struct's scalar
  leaves, nested unions flattened to dotted names (``object_id.pt.thread_id``). A layout comes
  before the first records that use it.
* ``NAMES`` (2), JSON ``{"first": id, "names": [...]}``: entries of the file's string table.
  CUPTI hands names as pointers valid only in the collecting process; the collector resolves
  them when a buffer completes and writes the string table's id in place of the pointer, in the
  fields the layout lists under ``strings`` (-1 = NULL). Names come before records using them.
* ``RECORDS`` (3): ``count`` records of layout ``layout``, the raw bytes of the struct array.
* ``META`` (4), JSON object merged into the trace's facts: ``api_names`` (``{"runtime" |
  "driver": {cbid: name}}``), ``layers`` (module path -> type and parameter bytes),
  ``dropped_records`` and ``collector_errors`` (added up over chunks), anything else last wins.
* ``END`` (5), JSON: the collector closed the file (absent after a crash; counted, not fatal).

Header JSON: ``format`` ("daydream-cupti-raw"), ``version`` (``FORMAT_VERSION``), ``pid``,
``hostname``, ``argv``, ``clock`` (what timestamps count), ``external_correlation_kind`` (the
CUPTI external-correlation kind the layer markers use), ``rank``/``world_size`` when the job
says, versions of cupti-python and libcupti, ``started_at``.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import orjson

FORMAT_NAME = "daydream-cupti-raw"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)
MAGIC = b"DDCUPTI1"

# ---- framing -----------------------------------------------------------------------------------

CHUNK_MAGIC = b"DDCK"
CHUNK_STRUCT = struct.Struct("<4sBBHIQQI")
CHUNK_HEADER_BYTES = CHUNK_STRUCT.size  # 32
LAYOUT, NAMES, RECORDS, META, END = 1, 2, 3, 4, 5
CHUNK_TYPES = {LAYOUT: "layout", NAMES: "names", RECORDS: "records", META: "meta", END: "end"}
RAW, ZLIB = 0, 1
# META keys whose values add up over chunks rather than replace each other
SUMMED_META = ("dropped_records", "collector_errors", "records_skipped")


def pad8(n: int) -> int:
    """Zero bytes that pad N bytes to a multiple of 8."""
    return (-n) % 8


def encode_header(header: dict) -> bytes:
    """MAGIC, the JSON header and its padding: the first bytes of a raw record file."""
    body = orjson.dumps(header)
    out = MAGIC + struct.pack("<I", len(body)) + body
    return out + b"\0" * pad8(len(out))


def encode_chunk(ctype: int, payload: bytes | memoryview, *, layout: int = 0, count: int = 0,
                 codec: int = RAW, level: int = 1) -> bytes:
    """One framed chunk (header, payload, padding), ready to append with a single write."""
    raw_len = len(payload)
    stored = zlib.compress(payload, level) if codec == ZLIB else bytes(payload)
    head = CHUNK_STRUCT.pack(CHUNK_MAGIC, ctype, codec, layout, count, len(stored), raw_len,
                       zlib.crc32(stored))
    return head + stored + b"\0" * pad8(len(stored))


def encode_json_chunk(ctype: int, obj: dict) -> bytes:
    return encode_chunk(ctype, orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS))


# ---- layouts -----------------------------------------------------------------------------------

def flatten_dtype(dtype: np.dtype, prefix: str = "", base: int = 0) -> list[list]:
    """Scalar leaves of a structured dtype as ``[name, format, offset, shape]``; nested structs and
    unions become dotted names (overlapping offsets are kept, as in the C union)."""
    out: list[list] = []
    for name in dtype.names or ():
        sub, off = dtype.fields[name][:2]
        full = f"{prefix}{name}"
        if sub.names:
            out += flatten_dtype(sub, f"{full}.", base + off)
        elif sub.subdtype is not None:
            out.append([full, sub.subdtype[0].str, base + off, list(sub.subdtype[1])])
        else:
            out.append([full, sub.str, base + off, []])
    return out


def dtype_from_fields(fields: list, itemsize: int, only: set[str] | None = None) -> np.dtype:
    """A numpy dtype over records of ``itemsize`` bytes with the given leaves (a subset when
    ``only`` names the fields wanted)."""
    names, formats, offsets = [], [], []
    for name, fmt, off, shape in fields:
        if only is not None and name not in only:
            continue
        names.append(name)
        formats.append(np.dtype((np.dtype(fmt), tuple(shape))) if shape else np.dtype(fmt))
        offsets.append(off)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": itemsize})


def layout_spec(layout_id: int, struct_name: str, dtype: np.dtype, strings: tuple[str, ...] = (),
                source_note: str = "") -> dict:
    """The LAYOUT chunk body describing ``dtype``."""
    return {"id": layout_id, "struct": struct_name, "itemsize": dtype.itemsize,
            "fields": flatten_dtype(dtype), "strings": list(strings), "source": source_note}


# ---- CUPTI constants (cupti_activity.h, CUDA 13; the same values in cupti-python's enums) ------

KIND_MEMCPY, KIND_MEMSET, KIND_KERNEL, KIND_DRIVER, KIND_RUNTIME = 1, 2, 3, 4, 5
KIND_DEVICE, KIND_CONTEXT, KIND_CONCURRENT_KERNEL, KIND_MARKER = 8, 9, 10, 12
KIND_SYNCHRONIZATION, KIND_EXTERNAL_CORRELATION = 38, 39
# CUpti_ExternalCorrelationKind: CUSTOM0 (PyTorch's Kineto uses CUSTOM0/1 for its own ops)
EXTERNAL_KIND_CUSTOM0, EXTERNAL_KIND_CUSTOM1, EXTERNAL_KIND_CUSTOM2 = 3, 4, 5
# CUpti_ActivityFlag for MARKER records. cupti-python 13.4's ActivityFlag enum lacks MARKER_END
# (1 << 2 in cupti_activity.h); the reader also treats any non-start, non-instant record as an end.
MARKER_INSTANTANEOUS, MARKER_START, MARKER_END = 1, 2, 4
OBJECT_KIND_PROCESS, OBJECT_KIND_THREAD = 1, 2
NO_ID_U32 = 0xFFFFFFFF

# ---- daydream's own marker records (layer, phase and iteration markers from collect.hooks) ----

MARKER_STRUCT = "daydream_Marker"
MARKER_DTYPE = np.dtype([
    ("start", "<u8"),        # begin, on the file's clock (ns)
    ("end", "<u8"),          # end, ns
    ("id", "<u8"),           # marker id: the external correlation id pushed while it is open
    ("param_bytes", "<i8"),  # bytes of the module's own parameters (recurse=False); 0 otherwise
    ("pid", "<u4"),
    ("tid", "<u4"),          # OS thread id (gettid), as CUPTI's SYSTEM thread-id type
    ("name", "<i4"),         # string-table id of the display name
    ("module_type", "<i4"),  # string-table id of the module class name, -1 if none
    ("kind", "u1"),          # MARKER_KINDS
    ("phase", "u1"),         # MARKER_PHASES
    ("pad", "u1", (6,)),
])
MARKER_KINDS = ("module", "user_annotation")
MARKER_PHASES = ("", "forward", "backward", "weight_update", "recompute")
MARKER_STRINGS = ("name", "module_type")
