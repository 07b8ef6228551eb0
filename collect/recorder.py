"""From completed CUPTI buffers to chunks of a raw record file.

cupti-python calls the buffer-completed callback with a list of record wrappers, one per record
(that is its API: the Python objects exist before we see them). ``Recorder.handle_buffer`` reads
two things from each wrapper, its class and ``.ptr`` (the record's address), and does everything
else on whole arrays:

  1. group the records by class (one class = one C struct, e.g. ``ActivityKernel13``);
  2. copy their bytes: when the records tile one span of memory (CUPTI's buffer, in order, each
     directly after the previous) with one copy of the span and one gather per class, else one
     ``memmove`` per record;
  3. resolve string pointers (kernel, NVTX and device names) while the buffer is still alive:
     one C-string read per distinct pointer in the buffer, the string stored once in the file's
     string table and its id written over the pointer; kernel names demangled as PyTorch's
     profiler writes them (``collect.demangle``);
  4. name the runtime/driver callback ids seen for the first time (a META chunk);
  5. append one RECORDS chunk per class, after the NAMES chunk it needs.

The callback runs on CUPTI's worker thread (or the thread that flushes) and must never raise:
errors are counted into the file (``collector_errors``) and the job goes on.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

import numpy as np

from daydream.collect import records as rec
from daydream.collect.demangle import demangle
from daydream.collect.writer import RawWriter
from daydream.ingest import cupti_format as fmt

MAX_SPAN_BYTES = 256 << 20
GPU_CLASSES = ("ActivityKernel", "ActivityCdpKernel", "ActivityMemcpy", "ActivityMemset")
MAX_GAP_BYTES = 64  # alignment padding CUPTI may leave between records of one buffer


def c_string(ptr: int) -> str:
    return ctypes.string_at(ptr).decode("utf-8", errors="replace")


class NameTable:
    """Distinct strings of the file, with the ids records refer to; thread-safe."""

    def __init__(self):
        self.ids: dict[str, int] = {}
        self.words: list[str] = []
        self.written = 0
        self.lock = threading.Lock()

    def id(self, word: str) -> int:
        i = self.ids.get(word)
        if i is None:
            with self.lock:
                i = self.ids.get(word)
                if i is None:
                    i = len(self.words)
                    self.words.append(word)
                    self.ids[word] = i
        return i

    def flush_to(self, writer: RawWriter) -> None:
        """Write the names added since the last call (before records that use them)."""
        with self.lock:
            first, new = self.written, self.words[self.written:]
            self.written = len(self.words)
        writer.names(first, new)


class Recorder:
    """Owns a writer and the file's string table; turns buffers and markers into chunks."""

    def __init__(self, writer: RawWriter, *, read_string: Callable[[int], str] = c_string,
                 api_name: Callable[[str, int], str | None] | None = None,
                 dropped: Callable[[], int] | None = None):
        self.writer = writer
        self.names = NameTable()
        self.read_string = read_string
        self.api_name = api_name
        self.dropped = dropped
        self.lock = threading.RLock()
        self._classes: dict[type, int] = {}
        self._layouts: list[rec.Layout | None] = []
        self._cbids: set[tuple[int, int]] = set()
        self.later: dict = {}
        self.buffers = 0
        self.records = 0
        self.gpu_records = 0   # kernels, copies, sets: the process did GPU work
        self.on_gpu_records: Callable[[], None] | None = None
        self.errors = 0
        self.skipped: dict[str, int] = {}

    # ---- cupti-python's buffer-completed callback --------------------------------------------

    def handle_buffer(self, activities) -> None:
        """Record one completed buffer (a list of cupti-python record wrappers). Never raises."""
        try:
            with self.lock:  # CUPTI may complete buffers on more than one thread
                self._handle(activities)
            if self.dropped is not None:
                n = int(self.dropped())
                if n:
                    self.writer.meta({"dropped_records": n})
        except Exception as e:  # noqa: BLE001 - a profiler must not kill the job it watches
            self.error(e)

    def error(self, e: BaseException) -> None:
        with self.lock:
            self.errors += 1
            first = self.errors == 1
        try:
            meta = {"collector_errors": 1}
            if first:
                meta["collector_error_first"] = f"{type(e).__name__}: {e}"
            self.writer.meta(meta)
        except Exception:  # noqa: BLE001, S110 - nothing left to report to
            pass

    def _class_code(self, cls: type) -> int:
        code = self._classes.get(cls)
        if code is None:
            code = len(self._layouts)
            self._layouts.append(rec.layout(cls.__name__))
            self._classes[cls] = code
        return code

    def _handle(self, activities) -> None:
        n = len(activities)
        if not n:
            return
        self.buffers += 1
        ptrs = np.empty(n, np.uint64)
        codes = np.empty(n, np.int32)
        code_of = self._classes
        for i, a in enumerate(activities):  # the one per-record step: read class and address
            cls = type(a)
            c = code_of.get(cls)
            codes[i] = self._class_code(cls) if c is None else c
            ptrs[i] = a.ptr
        sizes = np.array([0 if lay is None else lay.dtype.itemsize for lay in self._layouts],
                         np.int64)[codes]
        span = _span(ptrs, sizes)
        for code in np.unique(codes).tolist():
            lay = self._layouts[code]
            mask = codes == code
            if lay is None:
                name = next(cls.__name__ for cls, c in self._classes.items() if c == code)
                self._skip(name, int(mask.sum()))
                continue
            if span is not None:
                lo, raw = span
                offs = (ptrs[mask] - np.uint64(lo)).astype(np.int64)
                gathered = raw[offs[:, None] + np.arange(lay.dtype.itemsize)]
                arr = gathered.view(lay.dtype).reshape(-1)
            else:
                arr = _copy_each(ptrs[mask], lay.dtype)
            self.add_records(lay, arr)

    def _skip(self, cls_name: str, n: int) -> None:
        with self.lock:
            first = cls_name not in self.skipped
            self.skipped[cls_name] = self.skipped.get(cls_name, 0) + n
        if first:
            self.writer.meta({"records_skipped_classes": sorted(self.skipped)})
        self.writer.meta({"records_skipped": n})

    # ---- record arrays -----------------------------------------------------------------------

    def add_records(self, lay: rec.Layout, arr: np.ndarray) -> None:
        """Write records of one class (string fields still holding pointers, resolved here)."""
        if not len(arr):
            return
        arr = np.array(arr, copy=True)  # we overwrite pointers and must not touch CUPTI's memory
        kernel = lay.cls.startswith(("ActivityKernel", "ActivityCdpKernel"))
        for fld in lay.strings:
            arr[fld] = self._string_ids(arr[fld], demangle if kernel and fld == "name" else None)
        new_api = self._api_names(arr) if lay.struct == "CUpti_ActivityAPI" else None
        if lay.cls.startswith(GPU_CLASSES):
            first = self.gpu_records == 0
            self.gpu_records += len(arr)
            if first and self.on_gpu_records is not None:
                self.on_gpu_records()
        with self.lock:
            self._flush_later()
            lid = self.writer.layout(lay.struct, lay.dtype, lay.strings, lay.source)
            self.names.flush_to(self.writer)
            if new_api:
                self.writer.meta({"api_names": new_api})
            self.writer.records(lid, arr)
            self.records += len(arr)

    def _string_ids(self, ptrs: np.ndarray, rename: Callable[[str], str] | None = None
                    ) -> np.ndarray:
        ptrs = ptrs.astype(np.int64)
        used, inverse = np.unique(ptrs, return_inverse=True)
        read = self.read_string if rename is None else (lambda p: rename(self.read_string(p)))
        ids = np.array([-1 if p == 0 else self.names.id(read(p)) for p in used.tolist()],
                       np.int64)
        return ids[inverse.reshape(-1)]

    def _api_names(self, arr: np.ndarray) -> dict | None:
        """Names of runtime/driver callback ids not yet named in this file."""
        if self.api_name is None:
            return None
        pairs = np.unique(np.stack([arr["kind"].astype(np.int64), arr["cbid"].astype(np.int64)],
                                   1), axis=0)
        out: dict[str, dict[str, str]] = {}
        for kind, cbid in pairs.tolist():
            if (kind, cbid) in self._cbids:
                continue
            self._cbids.add((kind, cbid))
            domain = "driver" if kind == fmt.KIND_DRIVER else "runtime"
            name = self.api_name(domain, cbid)
            if name:
                out.setdefault(domain, {})[str(cbid)] = name
        return out or None

    def add_markers(self, markers: np.ndarray) -> None:
        """Write closed layer/phase/iteration markers (``fmt.MARKER_DTYPE``)."""
        if not len(markers):
            return
        with self.lock:
            self._flush_later()
            lid = self.writer.layout(fmt.MARKER_STRUCT, fmt.MARKER_DTYPE, fmt.MARKER_STRINGS,
                                     "daydream collect.markers")
            self.names.flush_to(self.writer)
            self.writer.records(lid, markers)
            self.records += len(markers)

    def meta(self, obj: dict) -> None:
        with self.lock:
            self.names.flush_to(self.writer)
            self.writer.meta(obj)

    def meta_later(self, obj: dict) -> None:
        """Facts to write with the first records (a process that records nothing leaves no
        file for them)."""
        with self.lock:
            self.later.update(obj)

    def _flush_later(self) -> None:
        if self.later:
            later, self.later = self.later, {}
            self.writer.meta(later)

    def close(self, end: dict | None = None, *, keep: bool = True) -> None:
        """Close the file (``keep=False``: drop what the writer still holds, leaving none)."""
        with self.lock:
            self.names.flush_to(self.writer)
            self.writer.close(dict(end or {}, records=self.records, buffers=self.buffers),
                              keep=keep)


def _span(ptrs: np.ndarray, sizes: np.ndarray) -> tuple[int, np.ndarray] | None:
    """One copy of the memory the records occupy, when they tile it: in list order, each record
    starting at most MAX_GAP_BYTES after the previous one ends. Every byte copied then lies
    within or between records of one buffer (memory that is surely mapped); else None."""
    if len(ptrs) == 0 or (sizes == 0).any():
        return None
    p = ptrs.astype(np.int64)
    gaps = p[1:] - (p[:-1] + sizes[:-1])
    if len(gaps) and ((gaps < 0) | (gaps >= MAX_GAP_BYTES)).any():
        return None
    lo, hi = int(p[0]), int(p[-1] + sizes[-1])
    if hi - lo > MAX_SPAN_BYTES:
        return None
    return lo, np.frombuffer(ctypes.string_at(lo, hi - lo), np.uint8)


def _copy_each(ptrs: np.ndarray, dtype: np.dtype) -> np.ndarray:
    out = np.empty(len(ptrs), dtype)
    base = out.ctypes.data
    size = dtype.itemsize
    for i, p in enumerate(ptrs.tolist()):
        ctypes.memmove(base + i * size, p, size)
    return out
