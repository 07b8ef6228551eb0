"""Raw CUPTI record files (``DDCUPTI1``, written by ``daydream collect``) -> activity tables.

The format (magic, header, chunks, the marker records) is declared in ``ingest.cupti_format``,
which the collector (``collect/``) writes with inside the training process without loading this
reader. The reader needs neither a GPU nor cupti-python: every record layout is described in
the file itself.

Reading, in order:
  1. map the file (inflating whole-file gzip), check magic and header;
  2. walk the chunks: a chunk cut off (crash mid-write) or a damaged header ends the walk and is
     counted, a payload whose CRC fails is skipped and counted;
  3. per layout, concatenate its record arrays (CUPTI delivers buffers per thread and per
     stream, not in time order) and route records by their ``kind`` field to the tables: kernels,
     copies, sets, runtime and driver calls, synchronizations, NVTX ranges (MARKER), layer
     markers (``daydream_Marker``), devices, contexts, external correlations;
  4. per table, columns by numpy/Arrow ops on whole arrays (never a Python object per record),
     rows sorted by start time, ranges nested per thread; ``external_id`` of calls and GPU
     activity comes from the external-correlation records of the markers' kind.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from daydream.base.errors import TraceFormatError
from daydream.ingest import source
from daydream.ingest.cupti_format import (
    CHUNK_HEADER_BYTES,
    CHUNK_MAGIC,
    CHUNK_STRUCT,
    CHUNK_TYPES,
    END,
    FORMAT_NAME,
    KIND_CONCURRENT_KERNEL,
    KIND_DRIVER,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    KIND_RUNTIME,
    LAYOUT,
    MAGIC,
    MARKER_DTYPE,
    MARKER_INSTANTANEOUS,
    MARKER_KINDS,
    MARKER_START,
    MARKER_STRUCT,
    META,
    NAMES,
    NO_ID_U32,
    RAW,
    RECORDS,
    SUMMED_META,
    SUPPORTED_VERSIONS,
    ZLIB,
    dtype_from_fields,
    pad8,
)
from daydream.ingest.nesting import nest_ranges
from daydream.ingest.schema import SYNC_CALLS, conform, empty
from daydream.ingest.stats import Stats

if TYPE_CHECKING:
    from daydream.ingest.converted import Converted

SOURCE_FORMAT = "cupti_raw"

# CUpti_ActivityMemcpyKind -> Kineto's spelling
COPY_KINDS = (None, "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP")
# CUpti_ActivityMemoryKind
MEMORY_KINDS = (None, "Pageable", "Pinned", "Device", "Array", "Managed", "DeviceStatic",
                "ManagedStatic")
# CUpti_ActivitySynchronizationType
SYNC_KINDS = ("unknown", "event_sync", "stream_wait_event", "stream_sync", "context_sync")

# Fields each reader family needs (a layout lacking one is an error naming it).
_NEEDS = {
    "Kernel": ("kind", "start", "end", "device_id", "context_id", "stream_id", "correlation_id",
               "name", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
               "registers_per_thread", "static_shared_memory", "dynamic_shared_memory"),
    "Memcpy": ("kind", "start", "end", "device_id", "context_id", "stream_id", "correlation_id",
               "bytes", "copy_kind", "src_kind", "dst_kind"),
    "Memset": ("kind", "start", "end", "device_id", "context_id", "stream_id", "correlation_id",
               "bytes", "memory_kind"),
    "API": ("kind", "cbid", "start", "end", "process_id", "thread_id", "correlation_id"),
    "Synchronization": ("kind", "type", "start", "end", "correlation_id", "context_id",
                        "stream_id", "cuda_event_id"),
    "ExternalCorrelation": ("kind", "external_kind", "external_id", "correlation_id"),
    "Marker": ("kind", "flags_", "timestamp", "id", "object_kind", "object_id.pt.process_id",
               "object_id.pt.thread_id", "name"),
    "Device": ("kind", "id", "name"),
    "Context": ("kind", "context_id", "device_id"),
    "daydream_Marker": tuple(MARKER_DTYPE.names),
}
# Device fields -> the names Kineto's deviceProperties (and the nsys reader) use, with a scale.
_DEVICE_PROPERTIES = (
    ("id", "id", 1), ("name", "name", 1),
    ("computeMajor", "compute_capability_major", 1),
    ("computeMinor", "compute_capability_minor", 1),
    ("totalGlobalMem", "global_memory_size", 1),
    ("numSms", "num_multiprocessors", 1),
    ("maxThreadsPerBlock", "max_threads_per_block", 1),
    ("regsPerBlock", "max_registers_per_block", 1),
    ("regsPerMultiprocessor", "max_registers_per_multiprocessor", 1),
    ("warpSize", "num_threads_per_warp", 1),
    ("sharedMemPerBlock", "max_shared_memory_per_block", 1),
    ("sharedMemPerMultiprocessor", "max_shared_memory_per_multiprocessor", 1),
    ("l2CacheSize", "l2cache_size", 1),
    ("clockRateHz", "core_clock_rate", 1000),                       # CUPTI: kHz
    ("memoryBandwidthBytesPerS", "global_memory_bandwidth", 1000),  # CUPTI: kB/s
)
_FAMILY_RE = re.compile(r"^CUpti_Activity([A-Za-z]+?)\d*$")


def family(struct_name: str) -> str | None:
    """Reader family of a layout's struct: Kernel, Memcpy, API, ...; None if not one we read."""
    if struct_name == MARKER_STRUCT:
        return MARKER_STRUCT
    m = _FAMILY_RE.match(struct_name)
    return m.group(1) if m and m.group(1) in _NEEDS else None


# ---- reading -----------------------------------------------------------------------------------

@dataclass
class Layout:
    id: int
    struct: str
    itemsize: int
    fields: list
    strings: tuple[str, ...]
    family: str | None
    parts: list[np.ndarray] = field(default_factory=list)

    def records(self) -> np.ndarray:
        """Every record of this layout in the file, as a structured array of the needed fields
        (raw bytes reinterpreted, no Python object per record)."""
        raw = np.concatenate(self.parts) if self.parts else np.zeros(0, np.uint8)
        dt = dtype_from_fields(self.fields, self.itemsize, set(_NEEDS.get(self.family, ())))
        return raw.view(dt) if len(raw) else np.zeros(0, dt)


def read_cupti_raw(path: Path | str) -> Converted:
    """Read one raw CUPTI record file into the activity tables."""
    path = Path(path)
    if not path.is_file():
        raise TraceFormatError("no such file", file=str(path))
    return _Reader(path, source.load_bytes(path)).read()


class _Reader:
    def __init__(self, path: Path, buf: np.ndarray):
        self.path = path
        self.buf = buf
        self.stats = Stats()
        self.layouts: dict[int, Layout] = {}
        self.names: list[str | None] = []
        self.meta: dict = {}
        self.header: dict = {}
        self.records = 0
        self.closed = False

    def _error(self, message: str, field: str | None = None,
               record: int | None = None) -> TraceFormatError:
        return TraceFormatError(message, file=str(self.path), field=field, record=record)

    # ---- 1-2: header and chunks ----------------------------------------------------------------

    def _read_header(self) -> int:
        buf = self.buf
        if len(buf) < len(MAGIC) or bytes(buf[:len(MAGIC)]) != MAGIC:
            raise self._error("not a raw CUPTI record file (no DDCUPTI1 magic)")
        if len(buf) < len(MAGIC) + 4:
            raise self._error("file ends inside the header")
        (n,) = struct.unpack_from("<I", buf, len(MAGIC))
        start = len(MAGIC) + 4
        if len(buf) < start + n:
            raise self._error("file ends inside the header")
        try:
            header = orjson.loads(bytes(buf[start:start + n]))
        except orjson.JSONDecodeError as e:
            raise self._error(f"header is not valid JSON: {e}", field="header") from None
        if not isinstance(header, dict):
            raise self._error("header is not a JSON object", field="header")
        version = header.get("version")
        if header.get("format") != FORMAT_NAME or version not in SUPPORTED_VERSIONS:
            raise self._error(f"unsupported raw CUPTI format {header.get('format')!r} version "
                              f"{version!r}; supported: {FORMAT_NAME} versions "
                              f"{', '.join(map(str, SUPPORTED_VERSIONS))}", field="header.version")
        self.header = header
        end = start + n
        return end + pad8(end)

    def _walk(self, pos: int) -> None:
        buf = self.buf
        size = len(buf)
        index = 0
        while pos < size:
            if size - pos < CHUNK_HEADER_BYTES:
                self._truncated(pos, index, "inside a chunk header")
                return
            magic, ctype, codec, layout, count, stored, raw_len, crc = \
                CHUNK_STRUCT.unpack_from(buf, pos)
            if magic != CHUNK_MAGIC:
                if not buf[pos:].any():  # zero fill after the last chunk (preallocated file)
                    return
                self.stats.add("corrupt_chunk_header", 1, severity="error",
                               detail=f"no chunk at byte {pos} (chunk {index}); the "
                               f"{size - pos} bytes from there on were not read")
                return
            body = pos + CHUNK_HEADER_BYTES
            if body + stored > size:
                self._truncated(pos, index, "inside a chunk payload")
                return
            payload = buf[body:body + stored]
            pos = body + stored + pad8(stored)
            index += 1
            if zlib.crc32(payload) != crc:
                self.stats.add("chunk_crc_mismatch", 1, severity="error",
                               detail=f"chunk {index - 1} ({CHUNK_TYPES.get(ctype, ctype)}) at "
                               f"byte {body - CHUNK_HEADER_BYTES} is damaged; skipped")
                continue
            try:
                data = self._decode(payload, codec, raw_len)
            except (zlib.error, ValueError) as e:
                self.stats.add("chunk_undecodable", 1, severity="error",
                               detail=f"chunk {index - 1}: {e}; skipped")
                continue
            self._chunk(index - 1, ctype, layout, count, data)

    def _truncated(self, pos: int, index: int, where: str) -> None:
        self.stats.add("truncated_chunk", 1, severity="warning",
                       detail=f"the file ends {where} at byte {pos} (chunk {index}): the "
                       "collecting process stopped mid-write; the "
                       f"{len(self.buf) - pos} bytes after the last complete chunk were ignored")

    @staticmethod
    def _decode(payload: np.ndarray, codec: int, raw_len: int) -> np.ndarray:
        if codec == RAW:
            return payload
        if codec == ZLIB:
            data = np.frombuffer(zlib.decompress(payload), np.uint8)
            if len(data) != raw_len:
                raise ValueError(f"inflated to {len(data)} bytes, expected {raw_len}")
            return data
        raise ValueError(f"unknown codec {codec}")

    def _json(self, data: np.ndarray, index: int) -> dict:
        try:
            obj = orjson.loads(bytes(data))
        except orjson.JSONDecodeError as e:
            raise self._error(f"chunk {index}: not valid JSON: {e}", record=index) from None
        if not isinstance(obj, dict):
            raise self._error(f"chunk {index}: expected a JSON object", record=index)
        return obj

    def _chunk(self, index: int, ctype: int, layout: int, count: int, data: np.ndarray) -> None:
        if ctype == RECORDS:
            lay = self.layouts.get(layout)
            if lay is None:
                self.stats.add("records_without_layout", count, severity="error",
                               detail=f"records of layout {layout}, never described; skipped")
                return
            if len(data) != count * lay.itemsize:
                self.stats.add("records_size_mismatch", 1, severity="error",
                               detail=f"chunk {index}: {len(data)} bytes for {count} records of "
                               f"{lay.itemsize} bytes ({lay.struct}); skipped")
                return
            lay.parts.append(data)
            self.records += count
        elif ctype == LAYOUT:
            spec = self._json(data, index)
            try:
                lay = Layout(int(spec["id"]), str(spec["struct"]), int(spec["itemsize"]),
                             list(spec["fields"]), tuple(spec.get("strings", ())),
                             family(str(spec["struct"])))
                dtype_from_fields(lay.fields, lay.itemsize)
            except (KeyError, TypeError, ValueError) as e:
                raise self._error(f"chunk {index}: bad layout: {e}", record=index,
                                  field="layout") from None
            have = {f[0] for f in lay.fields}
            for need in _NEEDS.get(lay.family, ()):
                if need not in have:
                    raise self._error(f"layout {lay.id} ({lay.struct}) has no field {need}",
                                      field=f"{lay.struct}.{need}")
            self.layouts[lay.id] = lay
        elif ctype == NAMES:
            obj = self._json(data, index)
            first, words = int(obj.get("first", 0)), obj.get("names") or []
            if len(self.names) < first + len(words):
                self.names.extend([None] * (first + len(words) - len(self.names)))
            self.names[first:first + len(words)] = [str(w) for w in words]
        elif ctype == META:
            for key, value in self._json(data, index).items():
                if key in SUMMED_META and isinstance(value, int):
                    self.meta[key] = self.meta.get(key, 0) + value
                elif isinstance(value, dict) and isinstance(self.meta.get(key), dict):
                    _merge(self.meta[key], value)
                else:
                    self.meta[key] = value
        elif ctype == END:
            self.closed = True
            self.meta.setdefault("end", self._json(data, index))
        else:
            self.stats.add("unknown_chunk_type", 1, severity="info",
                           detail=f"chunk types not known to this version (first: {ctype}); "
                           "skipped")

    # ---- 3-4: tables ---------------------------------------------------------------------------

    def read(self) -> Converted:
        self._walk(self._read_header())
        if not self.closed:
            self.stats.add("collection_not_closed", 1, severity="warning",
                           detail="no END chunk: the collecting process did not close the file "
                           "(crash or kill); records CUPTI had not yet delivered are missing")
        dropped = int(self.meta.get("dropped_records", 0) or 0)
        self.stats.add("cupti_dropped_records", dropped, severity="warning",
                       detail="records CUPTI dropped for lack of buffer space "
                       "(cuptiActivityGetNumDroppedRecords)")
        errors = int(self.meta.get("collector_errors", 0) or 0)
        self.stats.add("collector_errors", errors, severity="error",
                       detail=str(self.meta.get("collector_error_first", "")))
        self._collector_stats()

        by_family: dict[str, list[np.ndarray]] = {}
        for lay in self.layouts.values():
            if lay.family is None:
                n = sum(len(p) for p in lay.parts) // lay.itemsize
                self.stats.add("records_not_read", n, severity="info",
                               detail=f"records of layouts this reader does not turn into rows "
                               f"(first: {lay.struct})")
                continue
            recs = lay.records()
            if len(recs):
                # one family can arrive in two struct versions; keep the needed fields only
                by_family.setdefault(lay.family, []).append(_common(recs, _NEEDS[lay.family]))
        fam = {k: np.concatenate(v) if len(v) > 1 else v[0] for k, v in by_family.items()}
        empty_of = {k: np.zeros(0, dtype_from_fields([], 8)) for k in _NEEDS}
        self.fam = {k: fam.get(k, empty_of[k]) for k in _NEEDS}

        self._external_map()
        self.context_device = self._context_devices()
        api = self._api()
        tables = {
            "kernel": self._kernels(),
            "memcpy": self._memcpys(),
            "memset": self._memsets(),
            "api": api,
            "sync": self._syncs(api),
            "range": self._ranges(),
            "flow": empty("flow"),  # CUPTI has no flows; launches link by correlation id
            "memory": empty("memory"),  # the caching allocator's records are PyTorch's
        }
        start_ns, end_ns = _span(tables)
        from daydream.ingest.converted import Converted
        meta = {k: v for k, v in self.header.items()
                if k not in ("format", "version", "rank", "world_size", "devices")}
        meta.update({k: v for k, v in self.meta.items()
                     if k not in ("api_names", "dropped_records", "collector_errors",
                                  "collector_error_first")})
        return Converted(
            source_format=SOURCE_FORMAT, source_version=str(self.header["version"]),
            events=self.records, tables=tables, stats=self.stats,
            devices=self._devices(), rank=_int_or_none(self.header.get("rank")),
            world_size=_int_or_none(self.header.get("world_size")), metadata=meta,
            start_ns=start_ns, end_ns=end_ns)

    def _collector_stats(self) -> None:
        """What the collector itself counted (META keys) as stats beside the reader's own."""
        m = self.meta
        for key, severity, detail in (
                ("records_skipped", "info", "records of classes the collector had no layout for "
                 f"({', '.join(m.get('records_skipped_classes') or [])}); not stored"),
                ("hook_errors", "warning", f"errors inside the layer hooks (first: "
                 f"{m.get('hook_first_error')}); those markers are missing"),
                ("markers_out_of_order", "info", "backward markers that ended under another "
                 "open marker; their external correlation id was popped late"),
                ("markers_unclosed", "info", "markers still open when collection stopped; "
                 "closed at the stop"),
                ("backward_walk_limit_hit", "info", "module calls with too many autograd "
                 "nodes to place a backward marker")):
            value = m.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                self.stats.add(key, value, severity=severity, detail=detail)

    # ---- helpers -------------------------------------------------------------------------------

    def _name_array(self, ids: np.ndarray, what: str) -> pa.DictionaryArray:
        """Dictionary-encoded names of string-table ids (-1 = null); ids the table lacks become
        null and are counted. Only the distinct ids go through Python."""
        ids = np.asarray(ids, np.int64)
        used, inverse = np.unique(ids, return_inverse=True)
        words = [self.names[i] if 0 <= i < len(self.names) else None for i in used.tolist()]
        missing = sum(1 for i, w in zip(used.tolist(), words, strict=True) if i >= 0 and w is None)
        if missing:
            bad = np.isin(ids, [i for i, w in zip(used.tolist(), words, strict=True)
                                if i >= 0 and w is None])
            self.stats.add("unknown_name_id", int(bad.sum()), severity="warning",
                           detail=f"{what} names whose string-table entry is missing; null")
        # the dictionary in sorted order: the same table whatever ids the collector assigned
        distinct = sorted({w for w in words if w is not None})
        pos = {w: i for i, w in enumerate(distinct)}
        code = np.array([-1 if w is None else pos[w] for w in words], np.int32)
        idx = code[inverse.reshape(-1)]
        return pa.DictionaryArray.from_arrays(pa.array(idx, pa.int32(), mask=idx < 0),
                                              pa.array(distinct, pa.string()))

    def _timed(self, recs: np.ndarray, what: str, start: str = "start",
               end: str = "end") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows kept (those with timestamps), in start order (stable), their start and duration.
        CUPTI writes 0 for both when it could not time an activity: such rows are dropped and
        counted; negative durations are clamped to 0 and counted."""
        s = recs[start].astype(np.int64)
        e = recs[end].astype(np.int64)
        untimed = (s == 0) & (e == 0)
        self.stats.add("untimed_record", int(untimed.sum()), severity="info",
                       detail=f"records CUPTI could not time (start = end = 0), first seen in "
                       f"{what}; skipped")
        keep = np.flatnonzero(~untimed)
        keep = keep[np.argsort(s[keep], kind="stable")]
        dur = e[keep] - s[keep]
        neg = dur < 0
        self.stats.add("negative_duration", int(neg.sum()),
                       detail=f"end before start (first seen in {what}); clamped to 0")
        return keep, s[keep], np.where(neg, 0, dur)

    def _external_map(self) -> None:
        ext = self.fam["ExternalCorrelation"]
        kind = self.header.get("external_correlation_kind")
        if kind is not None and len(ext):
            other = ext["external_kind"] != kind
            self.stats.add("external_correlation_other_kind", int(other.sum()), severity="info",
                           detail=f"external correlations of kinds other than the markers' "
                           f"({kind}); ignored")
            ext = ext[~other]
        corr = ext["correlation_id"].astype(np.int64) if len(ext) else np.zeros(0, np.int64)
        order = np.argsort(corr, kind="stable")
        self.ext_corr = corr[order]
        self.ext_id = ext["external_id"].astype(np.int64)[order] if len(ext) else \
            np.zeros(0, np.int64)

    def _external_ids(self, correlation: np.ndarray) -> pa.Array:
        """external_id of each correlation id, null where no external-correlation record."""
        corr = np.asarray(correlation, np.int64)
        if not len(self.ext_corr):
            return pa.nulls(len(corr), pa.int64())
        # the last record of a correlation id wins (searchsorted right - 1)
        pos = np.searchsorted(self.ext_corr, corr, side="right") - 1
        ok = (pos >= 0) & (self.ext_corr[np.maximum(pos, 0)] == corr)
        vals = self.ext_id[np.maximum(pos, 0)]
        return pa.array(vals, pa.int64(), mask=~ok)

    def _context_devices(self) -> dict[int, int]:
        """context id -> device: CONTEXT records, else the device the context's GPU work ran on."""
        ctx = self.fam["Context"]
        pairs = [np.stack([ctx["context_id"].astype(np.int64),
                           ctx["device_id"].astype(np.int64)], 1)] if len(ctx) else []
        for fam in ("Kernel", "Memcpy", "Memset"):
            r = self.fam[fam]
            if len(r):
                pairs.append(np.stack([r["context_id"].astype(np.int64),
                                       r["device_id"].astype(np.int64)], 1))
        if not pairs:
            return {}
        u = np.unique(np.concatenate(pairs), axis=0)
        out: dict[int, int] = {}
        for c, d in u.tolist():  # distinct (context, device) pairs only
            out.setdefault(c, d)
        return out

    def _of_kinds(self, recs: np.ndarray, kinds: tuple[int, ...], what: str) -> np.ndarray:
        """Records whose ``kind`` field is one the table takes; others are counted."""
        if not len(recs):
            return recs
        ok = np.isin(recs["kind"], kinds)
        self.stats.add("record_kind_unexpected", int((~ok).sum()), severity="warning",
                       detail=f"records whose kind field does not fit their struct (first in "
                       f"{what}); skipped")
        return recs[ok]

    def _gpu(self, fam: str, what: str, kinds: tuple[int, ...],
             ) -> tuple[np.ndarray, dict] | None:
        recs = self._of_kinds(self.fam[fam], kinds, what)
        if not len(recs):
            return None
        keep, start, dur = self._timed(recs, what)
        r = recs[keep]
        corr = r["correlation_id"].astype(np.int64)
        cols = {"device": r["device_id"].astype(np.int32), "context": r["context_id"].astype(
            np.int32), "stream": r["stream_id"].astype(np.int64), "correlation": corr,
            "external_id": self._external_ids(corr), "start_ns": start, "dur_ns": dur}
        return r, cols

    def _kernels(self) -> pa.Table:
        got = self._gpu("Kernel", "kernel", (KIND_KERNEL, KIND_CONCURRENT_KERNEL))
        if got is None:
            return empty("kernel")
        r, cols = got
        cols["name"] = self._name_array(r["name"], "kernel")
        for k in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                  "registers_per_thread"):
            cols[k] = r[k].astype(np.int32)
        cols["shared_memory_bytes"] = (r["static_shared_memory"].astype(np.int64)
                                       + r["dynamic_shared_memory"].astype(np.int64))
        return conform("kernel", cols)

    def _enum(self, codes: np.ndarray, labels: tuple, what: str) -> pa.Array:
        """Map small enum codes to labels (None entries are null); unknown codes are counted."""
        codes = np.asarray(codes, np.int64)
        known = (codes >= 0) & (codes < len(labels))
        self.stats.add("unknown_enum_value", int((~known).sum()), severity="info",
                       detail=f"enum values this reader does not know (first in {what}); null")
        table = pa.array(list(labels), pa.string())
        return table.take(pa.array(np.where(known, codes, 0), mask=~known))

    def _memcpys(self) -> pa.Table:
        got = self._gpu("Memcpy", "memcpy", (KIND_MEMCPY,))
        if got is None:
            return empty("memcpy")
        r, cols = got
        kind = self._enum(r["copy_kind"], COPY_KINDS, "memcpy.copy_kind")
        src = self._enum(r["src_kind"], MEMORY_KINDS, "memcpy.src_kind")
        dst = self._enum(r["dst_kind"], MEMORY_KINDS, "memcpy.dst_kind")
        unknown = "Unknown"
        # Kineto's name for the same copy: "Memcpy HtoD (Pageable -> Device)"
        cols["name"] = pc.binary_join_element_wise(
            "Memcpy ", pc.fill_null(kind, unknown), " (", pc.fill_null(src, unknown), " -> ",
            pc.fill_null(dst, unknown), ")", "")
        cols.update(bytes=r["bytes"].astype(np.int64), copy_kind=kind, src_kind=src,
                    dst_kind=dst)
        return conform("memcpy", cols)

    def _memsets(self) -> pa.Table:
        got = self._gpu("Memset", "memset", (KIND_MEMSET,))
        if got is None:
            return empty("memset")
        r, cols = got
        kind = self._enum(r["memory_kind"], MEMORY_KINDS, "memset.memory_kind")
        cols["name"] = pc.binary_join_element_wise("Memset (", pc.fill_null(kind, "Unknown"),
                                                   ")", "")
        cols["bytes"] = r["bytes"].astype(np.int64)
        return conform("memset", cols)

    def _api(self) -> pa.Table:
        recs = self._of_kinds(self.fam["API"], (KIND_RUNTIME, KIND_DRIVER), "api")
        if not len(recs):
            return empty("api")
        keep, start, dur = self._timed(recs, "api")
        r = recs[keep]
        driver = r["kind"] == KIND_DRIVER
        cbid = r["cbid"].astype(np.int64)
        # names per distinct (domain, cbid), from the collector's cbid table
        key = cbid * 2 + driver
        used, inverse = np.unique(key, return_inverse=True)
        tables = self.meta.get("api_names") or {}
        words, unknown = [], 0
        for k in used.tolist():
            domain = "driver" if k & 1 else "runtime"
            name = (tables.get(domain) or {}).get(str(k >> 1))
            if name is None:
                unknown += 1
                name = f"{domain}_cbid_{k >> 1}"
            words.append(re.sub(r"_v\d+$", "", name))
        if unknown:
            missing = [i for i, k in enumerate(used.tolist())
                       if str(k >> 1) not in (tables.get("driver" if k & 1 else "runtime") or {})]
            self.stats.add("api_name_unknown", int(np.isin(inverse, missing).sum()),
                           severity="warning", detail="calls whose callback id the file's "
                           "api_names table lacks; named <domain>_cbid_<id>")
        enc = pc.dictionary_encode(pa.array(words, pa.string()))
        name = pa.DictionaryArray.from_arrays(
            enc.indices.take(pa.array(inverse.reshape(-1), pa.int64())).cast(pa.int32()),
            enc.dictionary)
        corr = r["correlation_id"].astype(np.int64)
        cols = {"pid": r["process_id"].astype(np.int64), "tid": r["thread_id"].astype(np.int64),
                "name": name, "kind": pa.array(np.where(driver, "driver", "runtime")),
                "cbid": cbid.astype(np.int32), "correlation": corr,
                "external_id": self._external_ids(corr), "start_ns": start, "dur_ns": dur}
        return conform("api", cols)

    def _syncs(self, api: pa.Table) -> pa.Table:
        recs = self.fam["Synchronization"]
        if not len(recs):
            return empty("sync")
        keep, start, dur = self._timed(recs, "sync")
        r = recs[keep]
        corr = r["correlation_id"].astype(np.int64)
        call = pc.index_in(pa.array(corr), value_set=api["correlation"].combine_chunks()) \
            if api.num_rows else pa.nulls(len(corr), pa.int32())
        self.stats.add("sync_without_call", call.null_count, severity="info",
                       detail="synchronizations with no runtime/driver call of the same "
                       "correlation id; thread left null, kind from the record's type")
        by_type = self._enum(r["type"], SYNC_KINDS, "sync.type")
        if api.num_rows:
            call_name = api["name"].combine_chunks().take(call)
            by_call = pa.array([SYNC_CALLS.get(w) for w in call_name.dictionary.to_pylist()],
                               pa.string()).take(call_name.indices)
            pid = api["pid"].combine_chunks().take(call)
            tid = api["tid"].combine_chunks().take(call)
        else:
            by_call = pa.nulls(len(corr), pa.string())
            pid = tid = pa.nulls(len(corr), pa.int64())
        disagree = pc.fill_null(pc.not_equal(by_type, by_call), False)
        self.stats.add("sync_kind_from_call", pc.sum(disagree).as_py() or 0,
                       detail="the record's synchronization type disagrees with the "
                       "synchronizing call; kind taken from the call")
        kind = pc.fill_null(pc.coalesce(by_call, by_type), "unknown")
        stream = r["stream_id"].astype(np.int64)
        no_stream = (r["stream_id"] == NO_ID_U32) | pc.equal(kind, "context_sync").to_numpy(
            zero_copy_only=False)
        is_event = pc.is_in(kind, pa.array(["event_sync", "stream_wait_event"])).to_numpy(
            zero_copy_only=False)
        event = r["cuda_event_id"].astype(np.int64)
        no_event = (r["cuda_event_id"] == NO_ID_U32) | ~is_event
        ctx = r["context_id"].astype(np.int64)
        dev = np.array([self.context_device.get(c, -1) for c in np.unique(ctx).tolist()],
                       np.int64)
        dev = dev[np.searchsorted(np.unique(ctx), ctx)] if len(ctx) else dev
        cols = {"pid": pid, "tid": tid, "device": pa.array(dev.astype(np.int32), mask=dev < 0),
                "stream": pa.array(stream, mask=no_stream), "sync_kind": kind,
                "event_id": pa.array(event, mask=no_event), "correlation": corr,
                "start_ns": start, "dur_ns": dur}
        return conform("sync", cols)

    def _ranges(self) -> pa.Table:
        parts = [p for p in (self._markers(), self._nvtx()) if p is not None]
        if not parts:
            return empty("range")
        cols = {k: _concat([p[k] for p in parts]) for k in parts[0]}
        start = np.asarray(cols["start_ns"].to_numpy(zero_copy_only=False), np.int64)
        order = np.argsort(start, kind="stable")
        idx = pa.array(order)
        cols = {k: v.take(idx) for k, v in cols.items()}
        pid = cols["pid"].to_numpy(zero_copy_only=False)
        tid = cols["tid"].to_numpy(zero_copy_only=False)
        depth, parent = nest_ranges(pid, tid, cols["start_ns"].to_numpy(zero_copy_only=False),
                                    cols["dur_ns"].to_numpy(zero_copy_only=False))
        n = len(order)
        cols.update(range_id=pa.array(np.arange(n, dtype=np.int64)), depth=depth,
                    parent=pa.array(parent, mask=parent < 0))
        return conform("range", cols)

    def _markers(self) -> dict | None:
        recs = self.fam[MARKER_STRUCT]
        if not len(recs):
            return None
        keep, start, dur = self._timed(recs, "markers")
        r = recs[keep]
        kind = self._enum(r["kind"], MARKER_KINDS, "marker.kind")
        return {"pid": pa.array(r["pid"].astype(np.int64)),
                "tid": pa.array(r["tid"].astype(np.int64)),
                "kind": kind, "name": pc.fill_null(self._name_array(r["name"], "marker").cast(
                    pa.string()), "(unnamed)"),
                "start_ns": pa.array(start), "dur_ns": pa.array(dur),
                "external_id": pa.array(r["id"].astype(np.int64))}

    def _nvtx(self) -> dict | None:
        """NVTX push/pop and start/end ranges from MARKER records: a start record (with the
        name) and an end record share an id; instantaneous marks are skipped and counted."""
        recs = self.fam["Marker"]
        if not len(recs):
            return None
        flags = recs["flags_"].astype(np.int64)
        instant = (flags & MARKER_INSTANTANEOUS) != 0
        is_start = ((flags & MARKER_START) != 0) & ~instant
        is_end = ~is_start & ~instant
        self.stats.add("nvtx_mark_skipped", int(instant.sum()), severity="info",
                       detail="NVTX marks are instants, not ranges; skipped")
        starts, ends = recs[is_start], recs[is_end]
        end_ids = ends["id"].astype(np.int64)
        order = np.argsort(end_ids, kind="stable")
        end_ids, end_ts = end_ids[order], ends["timestamp"].astype(np.int64)[order]
        sid = starts["id"].astype(np.int64)
        pos = np.searchsorted(end_ids, sid)
        found = (pos < len(end_ids)) & (end_ids[np.minimum(pos, max(len(end_ids) - 1, 0))] == sid) \
            if len(end_ids) else np.zeros(len(sid), bool)
        self.stats.add("nvtx_range_unclosed", int((~found).sum()),
                       detail="NVTX ranges with a start record and no end; skipped")
        s = starts[found]
        t0 = s["timestamp"].astype(np.int64)
        t1 = end_ts[pos[found]]
        dur = t1 - t0
        neg = dur < 0
        self.stats.add("negative_duration", int(neg.sum()),
                       detail="end before start (first seen in nvtx); clamped to 0")
        if not len(s):
            return None
        name = self._name_array(s["name"], "nvtx").cast(pa.string())
        name = pc.fill_null(name, "(unnamed)")
        return {"pid": pa.array(s["object_id.pt.process_id"].astype(np.int64)),
                "tid": pa.array(s["object_id.pt.thread_id"].astype(np.int64)),
                "kind": pa.array(["nvtx"] * len(s), pa.string()),
                "name": name, "start_ns": pa.array(t0), "dur_ns": pa.array(np.where(neg, 0, dur)),
                "external_id": pa.nulls(len(s), pa.int64())}

    def _devices(self) -> list[dict] | None:
        """Device properties from DEVICE records (one per GPU), under the names Kineto's
        deviceProperties uses; the header's list when the file has no DEVICE record."""
        out: dict[int, dict] = {}
        for lay in self.layouts.values():
            if lay.family != "Device" or not lay.parts:
                continue
            have = {f[0] for f in lay.fields}
            wanted = {fld for _, fld, _ in _DEVICE_PROPERTIES} & have
            raw = np.concatenate(lay.parts)
            recs = raw.view(dtype_from_fields(lay.fields, lay.itemsize, wanted))
            for i in range(len(recs)):  # a handful of records: one per GPU
                rec: dict = {}
                for key, fld, scale in _DEVICE_PROPERTIES:
                    if fld not in wanted:
                        continue
                    value = int(recs[fld][i])
                    if fld == "name":
                        rec[key] = self.names[value] if 0 <= value < len(self.names) else None
                    else:
                        rec[key] = value * scale
                out[rec["id"]] = rec
        if not out:
            devices = self.header.get("devices")
            return devices if isinstance(devices, list) else None
        return [out[k] for k in sorted(out)]


def _merge(into: dict, new: dict) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def _common(recs: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    """The named fields of ``recs`` packed into a plain struct array, so that records of two
    struct versions (Kernel11 and Kernel13 in one file) concatenate."""
    out = np.empty(len(recs), [(n, recs.dtype.fields[n][0]) for n in names])
    for n in names:
        out[n] = recs[n]
    return out


def _concat(arrays: list) -> pa.Array:
    arrays = [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays]
    if pa.types.is_dictionary(arrays[0].type):
        arrays = [a.cast(pa.string()) for a in arrays]
    return pa.concat_arrays(arrays) if len(arrays) > 1 else arrays[0]


def _span(tables: dict[str, pa.Table]) -> tuple[int | None, int | None]:
    lo, hi = None, None
    for name in ("kernel", "memcpy", "memset", "api", "sync", "range"):
        t = tables[name]
        if not t.num_rows:
            continue
        s = t["start_ns"].to_numpy()
        e = s + t["dur_ns"].to_numpy()
        lo = int(s.min()) if lo is None else min(lo, int(s.min()))
        hi = int(e.max()) if hi is None else max(hi, int(e.max()))
    return lo, hi


def _int_or_none(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
