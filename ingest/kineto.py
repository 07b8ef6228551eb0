"""PyTorch profiler / Kineto Chrome-trace JSON -> activity tables.

Outline:
  1. map the file (plain) or inflate it (gzip) into one byte buffer;
  2. scan it in batches with the compiled scanner (``kineto_scan``): no Python object per event;
  3. route each batch's rows by (ph, cat) to their table, keeping only that table's columns;
  4. per table: concatenate, pair flow endpoints, nest ranges per thread, count what had to be
     repaired (negative durations, kernels with no launch, events outside the profiler window);
  5. read the small top-level metadata (deviceProperties, distributedInfo) with orjson.

Every category spelling seen in the wild maps here, in one place (``_ROUTES``): the 2021
schema (``Operator``, ``Runtime``, ``Kernel``...), the current one (``cpu_op``,
``cuda_runtime``...), HTA-era ``async_cpu_to_gpu`` flows and ROCm traces (same categories,
``hip*`` calls).
"""

from __future__ import annotations

import contextlib
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from daydream.base.columns import numpy_filled
from daydream.base.errors import TraceFormatError
from daydream.ingest import kineto_scan as ks
from daydream.ingest import source
from daydream.ingest.converted import Converted
from daydream.ingest.nesting import nest_ranges
from daydream.ingest.schema import conform
from daydream.ingest.stats import Stats

BATCH_EVENTS = 131_072
FIRST_ROWS = 1024  # rows a batch starts with (more for a larger document); it grows as it fills
STRING_CAPACITY = 48 << 20  # bytes per string column per batch; pages are touched only as used

# (ph, category) -> (table, kind). Category match is exact; ``None`` matches a missing cat.
_X = ord("X")
_ROUTES: dict[str, tuple[str, str]] = {
    "kernel": ("kernel", ""), "Kernel": ("kernel", ""),
    "gpu_memcpy": ("memcpy", ""), "Memcpy": ("memcpy", ""),
    "gpu_memset": ("memset", ""), "Memset": ("memset", ""),
    "cuda_runtime": ("api", "runtime"), "Runtime": ("api", "runtime"),
    "cuda_driver": ("api", "driver"), "Driver": ("api", "driver"),
    "cuda_sync": ("sync", ""),
    "cpu_op": ("range", "cpu_op"), "Operator": ("range", "cpu_op"),
    "user_annotation": ("range", "user_annotation"),
    "gpu_user_annotation": ("range", "gpu_user_annotation"),
    "python_function": ("range", "python_function"), "Python": ("range", "python_function"),
    "nvtx": ("range", "nvtx"),
    "Trace": ("window", ""),
}
_FLOW_KINDS = {"ac2g": "launch", "async": "launch", "async_cpu_to_gpu": "launch",
               "fwdbwd": "fwdbwd"}
# Categories we know and deliberately do not turn into activity rows.
_IGNORED_X = {"overhead", "Overhead", "cuda_profiler_range", "Mtia", "mtia_ccp_events",
              "kineto", "Kineto"}

_TABLE_IDS = {"kernel": 1, "memcpy": 2, "memset": 3, "api": 4, "sync": 5, "range": 6,
              "window": 7, "flow": 8, "meta": 9, "instant": 10, "unknown": 11, "counter": 12,
              "begin_end": 13, "no_ph": 14, "memory": 15}
# The caching allocator's records: instant events of this name (cat "cpu_instant_event" in
# current traces, none in the 2021 schema), recorded with profile_memory=True.
MEMORY_EVENT = "[memory]"
DEVICE_TYPE_CPU = 0  # c10::DeviceType::CPU, the records' "Device Type"

_FIELD_NAMES = {i: k for i, k in enumerate(ks.TOP_KEYS)}
_FIELD_NAMES.update({ks.ARG_FIELD_BASE + i: f"args.{k}" for i, (k, _, _) in
                     enumerate(ks.ARG_KEYS)})

_ERRORS = {
    ks.E_EOF: "unexpected end of file (truncated JSON)",
    ks.E_SYNTAX: "malformed JSON",
    ks.E_TYPE_NUM: "expected a number",
    ks.E_TYPE_STR: "expected a string",
    ks.E_TYPE_OBJ: "expected an object",
    ks.E_DEPTH: f"JSON nested deeper than {ks.MAX_DEPTH} levels",
    ks.E_RANGE: "number out of range",
    ks.E_NOTTRACE: "not a trace: expected a JSON object with traceEvents or an array of events",
    ks.E_BIGEVENT: "one event is larger than the scanner's buffers",
    ks.E_EMPTY: "empty file",
    ks.E_TYPE_NUMSTR: "expected a number or a string",
    ks.E_BADSTR: "bad escape in a string",
    ks.E_TRAILING: "data after the end of the JSON document",
}

_SYNC_KINDS = {"Stream Sync": "stream_sync", "Event Sync": "event_sync",
               "Context Sync": "context_sync", "Stream Wait Event": "stream_wait_event",
               "Device Sync": "context_sync"}

_MEMCPY_RE = re.compile(r"Memcpy (\w+) \((\w+) -> (\w+)\)")


def _describe(code: int) -> str:
    return _ERRORS.get(code, f"scanner error {code}")


def _type_found(buf: np.ndarray, pos: int) -> str:
    if pos >= len(buf):
        return ""
    c = chr(buf[pos])
    kind = {"\"": "a string", "{": "an object", "[": "an array", "t": "a boolean",
            "f": "a boolean", "n": "null"}.get(c)
    if kind is None and (c.isdigit() or c == "-"):
        kind = "a number"
    return f", found {kind}" if kind else ""


class _Batch:
    """Reusable scanner buffers for up to ``BATCH_EVENTS`` events. They start at ``events``
    rows and grow (fourfold, copying what is filled) when the scanner runs out of rows, so a
    small document never pays for a large batch, while a batch still ends where it would in
    buffers of full size: which events share a batch decides the order of names in the
    tables' dictionaries."""

    def __init__(self, events: int, capacity: int, share: _Batch | None = None):
        self.ints = np.zeros((ks.NI, events), np.int64)   # column-major: one row per field
        # one row per event: the scanner clears an event's flags in one cache line (one row
        # per field, each event's clear touched a line of every field's row)
        self.ipres = np.zeros((events, ks.NI), np.uint8)
        self.sdata = np.empty((ks.NS, capacity), np.uint8)
        self.soffs = np.zeros((ks.NS, events + 1), np.int64)
        self.spres = np.zeros((events, ks.NS), np.uint8)
        # the scan state (position, state, top-level keys, counters) is one for the document,
        # shared by the two batches that take turns
        self.counters = share.counters if share else np.zeros(ks.NC, np.int64)
        self.meta = share.meta if share else np.zeros((256, 4), np.int64)
        self.res = share.res if share else np.zeros(ks.NR, np.int64)
        self._str_cache: dict = {}

    def scan(self, buf: np.ndarray, partial: bool = False, start: int = 0) -> int:
        """Scan into this batch from row ``start`` on; the number of rows filled."""
        self._str_cache = {}
        n = start
        while True:
            n = ks.scan(buf, self.res, self.ints, self.ipres, self.sdata, self.soffs,
                        self.spres, self.counters, self.meta, partial, n)
            if self.res[ks.R_FULL] == 1 and self.ints.shape[1] < BATCH_EVENTS:
                self._grow(n, min(BATCH_EVENTS, 4 * self.ints.shape[1]))
                continue
            return n

    def _grow(self, n: int, events: int) -> None:
        for name in ("ints", "ipres", "soffs", "spres"):
            old = getattr(self, name)
            if name in ("spres", "ipres"):
                new = np.zeros((events, old.shape[1]), old.dtype)
                new[:n] = old[:n]
            else:
                extra = 1 if name == "soffs" else 0
                new = np.zeros((old.shape[0], events + extra), old.dtype)
                new[:, :n + extra] = old[:, :n + extra]
            setattr(self, name, new)

    def int_col(self, slot: int, rows: np.ndarray) -> pa.Array:
        vals = self.ints[slot, rows]
        mask = self.ipres[rows, slot] == 0
        return pa.array(vals, type=pa.int64(), mask=mask)

    def str_col(self, col: int, n: int) -> pa.DictionaryArray:
        """All n rows of a string column, dictionary-encoded (dictionary as binary). The
        encoding copies the distinct values out, so the reused buffers can be wrapped as is."""
        key = (col, n)
        hit = self._str_cache.get(key)
        if hit is not None:
            return hit
        offs = np.ascontiguousarray(self.soffs[col, : n + 1])
        used = int(offs[n])
        valid = np.packbits(self.spres[:n, col].astype(bool), bitorder="little")
        arr = pa.Array.from_buffers(
            pa.large_binary(), n,
            [pa.py_buffer(valid), pa.py_buffer(offs), pa.py_buffer(self.sdata[col, :used])])
        out = arr.dictionary_encode()
        self._str_cache[key] = out
        return out


def _decode_dict(arr: pa.DictionaryArray, stats: Stats) -> pa.DictionaryArray:
    """Binary dictionary -> string dictionary; invalid UTF-8 is replaced and counted."""
    try:
        values = arr.dictionary.cast(pa.string())
    except pa.ArrowInvalid:
        py = arr.dictionary.to_pylist()
        bad = 0
        out = []
        for b in py:
            try:
                out.append(b.decode())
            except UnicodeDecodeError:
                bad += 1
                out.append(b.decode(errors="replace"))
        stats.add("invalid_utf8", bad, severity="warning",
                  detail="names with invalid UTF-8 bytes; replaced with U+FFFD")
        values = pa.array(out, pa.string())
    return pa.DictionaryArray.from_arrays(arr.indices, values)


def read_kineto(path: Path, data: np.ndarray | None = None) -> Converted:
    """Read one Kineto / Chrome-trace JSON file (plain or gzipped) into activity tables."""
    stream = None
    if data is None:
        stream = source.open_inflating(path)
        if stream is None:
            data = source.load_bytes(path)
    if stream is not None:
        try:
            return _read(path, stream.buf, stream)
        except source._SizeMismatch:
            data = source.load_bytes(path)  # trailer size was wrong: inflate it whole
    return _read(path, data, None)


# A small document with an event of each kind the scanner routes (a CPU op, a runtime call
# with the arguments it reads, a kernel, a flow) and one value it skips, for warm_up.
_WARM_UP_DOC = (b'{"traceEvents": ['
                b'{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 0, '
                b'"dur": 20, "args": {"Input Dims": [[1]], "skipped": {"a": [1, "b"]}}}, '
                b'{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, '
                b'"tid": 1, "ts": 1, "dur": 2, "args": {"correlation": 1, "External id": 1}}, '
                b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 4, '
                b'"dur": 1.5, "args": {"correlation": 1, "stream": 7, "device": 0}}, '
                b'{"ph": "s", "cat": "ac2g", "id": 1, "pid": 1, "tid": 1, "ts": 1, "name": "f"}, '
                b'{"ph": "f", "cat": "ac2g", "id": 1, "pid": 0, "tid": 7, "ts": 4, "bp": "e"}]}')


def warm_up() -> None:
    """Convert a small document in memory, so that the scanner's compiled kernels are loaded
    (numba's first use in a process, some 0.2 s of it holding the GIL), before anything
    else is started beside it (``daydream.traces.ingest``)."""
    read_kineto(Path("<warm-up>"), np.frombuffer(_WARM_UP_DOC, np.uint8))


def _read(path: Path, full: np.ndarray, stream) -> Converted:
    """Scan and route batch by batch. Two batches take turns: while one batch's rows are
    routed into tables on a worker thread, the (GIL-free) scanner fills the other. A document
    that fits one batch is routed in this thread: with nothing to overlap, neither the second
    batch nor the thread is made."""
    fname = str(path)
    stats = Stats()
    size = stream.size if stream is not None else len(full)
    # strings decoded from a document never take more bytes than the document
    capacity = min(STRING_CAPACITY, size + 16)
    first = _Batch(min(BATCH_EVENTS, max(FIRST_ROWS, size // 256)), capacity)
    batches = [first]
    routing: list[Future | None] = [None, None]
    parts: dict[str, list[pa.Table]] = {t: [] for t in
                                        ("kernel", "memcpy", "memset", "api", "sync", "range",
                                         "flow", "memory", "meta", "window")}
    base = 0
    other_cats: dict[str, int] = {}
    avail, done = (stream.wait(-1) if stream is not None else (len(full), True))
    data = full[:avail]
    release = source.Releaser(full)
    turn = 0
    batch = first
    router: ThreadPoolExecutor | _Inline = _Inline()
    nev = 0  # rows of the batch being filled
    with contextlib.ExitStack() as pool:
        try:
            while True:
                batch = batches[turn]
                if nev == 0:
                    _finish_routing(routing, turn)  # its buffers are about to be refilled
                nev = batch.scan(data, partial=not done, start=nev)
                err = int(batch.res[ks.R_ERR])
                if err == ks.E_MORE:
                    # the batch goes on with the next inflated bytes: batches end at
                    # BATCH_EVENTS events whatever the inflating thread's pace
                    try:
                        avail, done = stream.wait(avail)
                    except (TraceFormatError, source._SizeMismatch):
                        if nev:  # an error in its records comes first
                            routing[turn] = router.submit(_route, batch, nev, base, parts,
                                                          stats, other_cats, fname)
                        raise
                    data = full[:avail]
                    continue
                if nev:
                    if len(batches) == 1 and int(batch.res[ks.R_STATE]) != ks.ST_DONE:
                        # more batches follow: from now on one is routed while the next fills
                        batches.append(_Batch(BATCH_EVENTS, capacity, share=first))
                        router = pool.enter_context(ThreadPoolExecutor(max_workers=1))
                    routing[turn] = router.submit(_route, batch, nev, base, parts, stats,
                                                  other_cats, fname)
                    base += nev
                    turn = (turn + 1) % len(batches)
                    nev = 0
                if err == ks.E_OK:
                    release.upto(int(batch.res[ks.R_POS]))
                if err != ks.E_OK:
                    _finish_routing(routing)  # an error in an earlier record comes first
                    _scan_error(batch, err, data, base, fname)
                if int(batch.res[ks.R_STATE]) == ks.ST_DONE:
                    # check for trailing data (with a batch no longer being routed)
                    _finish_routing(routing)
                    batch.scan(data, partial=False)
                    if int(batch.res[ks.R_ERR]) != ks.E_OK:
                        raise TraceFormatError(_describe(int(batch.res[ks.R_ERR])) +
                                               f" (byte {int(batch.res[ks.R_ERRPOS])})",
                                               file=fname)
                    break
        finally:
            _finish_routing(routing)
    meta = _top_level(data, batch, fname)
    if int(batch.res[ks.R_TOPOBJ]) == 1 and "traceEvents" not in meta.get("_keys", ()):
        keys = ", ".join(meta.get("_keys", ())[:8]) or "none"
        raise TraceFormatError(f"not a trace: no traceEvents array (top-level keys: {keys})",
                               file=fname)
    for slot, cnt in enumerate(batch.counters):
        if cnt:
            stats.add(f"arg_not_numeric.{_slot_name(slot)}", int(cnt), severity="info",
                      detail="values that are not numbers where a number was expected; "
                             "left null")
    for cat, cnt in sorted(other_cats.items()):
        stats.add("unknown_category", cnt, severity="warning", detail=cat)
    return _finish(parts, stats, meta, base, fname)


# Traces of at least this many events build their range and flow tables on a second thread
# (_finish): 0.08 s less on a million events; on small ones a thread costs more than it saves.
THREADED_FINISH_EVENTS = 200_000


class _Inline:
    """Routing in the scanning thread, for documents of one batch (what a
    ThreadPoolExecutor's submit returns, without the thread)."""

    def submit(self, fn, *args) -> Future:
        f: Future = Future()
        try:
            f.set_result(fn(*args))
        except BaseException as e:  # raised by _finish_routing, in order, as the pool would
            f.set_exception(e)
        return f


def _finish_routing(routing: list, which: int | None = None) -> None:
    """Wait for the routing of one batch (or of both), re-raising its error."""
    for k in range(len(routing)) if which is None else (which,):
        f = routing[k]
        if f is not None:
            routing[k] = None
            f.result()


def _scan_error(batch: _Batch, err: int, data: np.ndarray, base: int, fname: str) -> None:
    """Raise the scanner's error as one TraceFormatError naming record and field."""
    field = int(batch.res[ks.R_ERRFIELD])
    pos = int(batch.res[ks.R_ERRPOS])
    state = int(batch.res[ks.R_STATE])
    record = base if state == ks.ST_EVENTS else None
    what = _describe(err)
    if err in (ks.E_TYPE_NUM, ks.E_TYPE_STR, ks.E_TYPE_OBJ, ks.E_TYPE_NUMSTR):
        what += _type_found(data, pos)
    if err not in (ks.E_EMPTY, ks.E_NOTTRACE):
        what += f" (byte {pos})"
    fld = None
    if field == ks.FIELD_EVENT:
        what = f"expected an event object{_type_found(data, pos)} (byte {pos})"
    elif field >= 0:
        fld = _FIELD_NAMES.get(field, str(field))
    raise TraceFormatError(what, file=fname, record=record, field=fld)


def _slot_name(slot: int) -> str:
    for k, kind, s in ks.ARG_KEYS:
        if s == slot and kind in (0, 3, 4):
            return k
    return {ks.I_ID: "id"}.get(slot, str(slot))


def _top_level(data: np.ndarray, batch: _Batch, fname: str) -> dict:
    keys = ["traceEvents"] if int(batch.res[ks.R_SAWEV]) == 1 else []
    out: dict = {}
    for i in range(int(batch.res[ks.R_NMETA])):
        k0, k1, v0, v1 = (int(x) for x in batch.meta[i])
        key = bytes(data[k0:k1]).decode(errors="replace")
        keys.append(key)
        try:
            out[key] = orjson.loads(bytes(data[v0:v1]))
        except orjson.JSONDecodeError as e:
            raise TraceFormatError(f"malformed JSON in top-level value: {e}", file=fname,
                                   field=key) from None
    out["_keys"] = keys
    return out


def _route(batch: _Batch, n: int, base: int, parts: dict, stats: Stats,
           other_cats: dict, fname: str) -> None:
    """Split one scanned batch into per-table Arrow tables holding only their columns."""
    ints, ipres = batch.ints, batch.ipres
    ph = np.where(ipres[:n, ks.I_PH] == 1, ints[ks.I_PH, :n], 0)
    cat = _decode_dict(batch.str_col(ks.S_CAT, n), stats)
    cat_values = cat.dictionary.to_pylist()
    cat_idx = numpy_filled(cat.indices, -1)

    # route id per category dictionary entry, for X and for flow phases
    x_route = np.full(len(cat_values) + 1, _TABLE_IDS["unknown"], np.int64)
    f_route = np.full(len(cat_values) + 1, _TABLE_IDS["unknown"], np.int64)
    for i, c in enumerate(cat_values):
        r = _ROUTES.get(c)
        if r is not None:
            x_route[i] = _TABLE_IDS[r[0]]
        elif c in _IGNORED_X:
            x_route[i] = _TABLE_IDS["instant"]
        if c in _FLOW_KINDS:
            f_route[i] = _TABLE_IDS["flow"]
    table = np.zeros(n, np.int64)
    is_x = ph == _X
    table[is_x] = x_route[cat_idx[is_x]]
    is_flow = (ph == ord("s")) | (ph == ord("f")) | (ph == ord("t"))
    table[is_flow] = f_route[cat_idx[is_flow]]
    table[ph == ord("M")] = _TABLE_IDS["meta"]
    is_instant = (ph == ord("i")) | (ph == ord("I")) | (ph == ord("n"))
    table[is_instant] = _TABLE_IDS["instant"]
    table[ph == ord("C")] = _TABLE_IDS["counter"]
    table[(ph == ord("B")) | (ph == ord("E"))] = _TABLE_IDS["begin_end"]
    table[ph == 0] = _TABLE_IDS["no_ph"]

    unknown = table == _TABLE_IDS["unknown"]
    if unknown.any():
        u_idx, u_cnt = np.unique(cat_idx[unknown], return_counts=True)
        u_ph = {}
        for i, c in zip(u_idx, u_cnt, strict=True):
            name = cat_values[i] if i >= 0 else "(none)"
            key = f"{name}"
            u_ph[key] = u_ph.get(key, 0) + int(c)
        for k, v in u_ph.items():
            other_cats[k] = other_cats.get(k, 0) + v
    # the allocator's records: instant events routed by name
    name = _decode_dict(batch.str_col(ks.S_NAME, n), stats)
    mem_code = pc.index(name.dictionary, MEMORY_EVENT).as_py()
    if mem_code >= 0:
        codes = numpy_filled(name.indices, -1)
        table[is_instant & (codes == mem_code)] = _TABLE_IDS["memory"]
    stats.add("instant_events_skipped", int((table == _TABLE_IDS["instant"]).sum()),
              severity="info", detail="instant events other than the allocator's records, and "
                                      "overhead spans: not activities")
    stats.add("counter_events_skipped", int((table == _TABLE_IDS["counter"]).sum()),
              severity="info")
    stats.add("begin_end_events_skipped", int((table == _TABLE_IDS["begin_end"]).sum()),
              severity="warning", detail="B/E duration events are not supported; use X events")
    stats.add("events_without_ph", int((table == _TABLE_IDS["no_ph"]).sum()), severity="warning")

    # X events must have a timestamp; calls and ranges a name (their tables' name is not
    # nullable): the first record missing either is the error
    ts_missing = (ipres[:n, ks.I_TS] == 0) & (is_x | is_flow)
    name_missing = ((table == _TABLE_IDS["api"]) | (table == _TABLE_IDS["range"])) & \
        (batch.spres[:n, ks.S_NAME] == 0)
    if ts_missing.any() or name_missing.any():
        first_ts = int(np.argmax(ts_missing)) if ts_missing.any() else n
        first_name = int(np.argmax(name_missing)) if name_missing.any() else n
        if first_ts <= first_name:
            raise TraceFormatError("missing timestamp", file=fname, record=base + first_ts,
                                   field="ts")
        raise TraceFormatError("missing name (a CUDA call or a CPU range needs one)",
                               file=fname, record=base + first_name, field="name")
    dur_missing = is_x & (ipres[:n, ks.I_DUR] == 0)
    stats.add("missing_duration", int(dur_missing.sum()), severity="warning",
              detail="X events without dur; taken as 0")

    needs_dur = is_x
    dur = np.where(ipres[:n, ks.I_DUR] == 1, ints[ks.I_DUR, :n], 0)
    neg = needs_dur & (dur < 0)
    if neg.any():
        stats.add("negative_duration", int(neg.sum()), severity="warning",
                  detail="durations below zero clamped to 0")
        dur = np.where(neg, 0, dur)
    ts = ints[ks.I_TS, :n]
    pid, tid = _thread_ids(batch, n, stats)

    def rows(tid_: str) -> np.ndarray:
        return np.flatnonzero(table == _TABLE_IDS[tid_])

    def common(r: np.ndarray) -> dict:
        return {"start_ns": pa.array(ts[r]), "dur_ns": pa.array(dur[r])}

    decoded: dict[int, tuple[pa.DictionaryArray, int]] = {}

    def istr(col: int, r: np.ndarray) -> pa.Array:
        hit = decoded.get(col)
        if hit is None:
            if not batch.spres[:n, col].any():  # no value in this batch: nothing to encode
                hit = decoded[col] = (None, 0)
            else:
                sub = Stats()
                hit = decoded[col] = (_decode_dict(batch.str_col(col, n), sub),
                                      sub.get("invalid_utf8"))
        d, bad = hit
        if bad:  # counted as often as the column is used, as when it was decoded each time
            stats.add("invalid_utf8", bad, severity="warning",
                      detail="names with invalid UTF-8 bytes; replaced with U+FFFD")
        if d is None:
            return pa.DictionaryArray.from_arrays(pa.nulls(len(r), pa.int32()),
                                                  pa.array([], pa.string()))
        return d.take(pa.array(r))

    def ic(slot: int, r: np.ndarray) -> pa.Array:
        return batch.int_col(slot, r)

    name_take = name.take

    # GPU activities
    for tname in ("kernel", "memcpy", "memset"):
        r = rows(tname)
        if not len(r):
            continue
        stream = ints[ks.I_STREAM, r].copy()
        no_stream = ipres[r, ks.I_STREAM] == 0
        if no_stream.any():
            stream[no_stream] = tid[r][no_stream]
            stats.add("gpu_event_without_stream", int(no_stream.sum()), severity="warning",
                      detail="stream taken from the event's tid")
        device = ints[ks.I_DEV, r].copy()
        no_dev = ipres[r, ks.I_DEV] == 0
        device[no_dev] = pid[r][no_dev]
        cols = {
            "device": pa.array(device), "context": ic(ks.I_CTX, r),
            "stream": pa.array(stream), "correlation": ic(ks.I_CORR, r),
            "external_id": ic(ks.I_EXT, r), "name": name_take(pa.array(r)), **common(r),
        }
        if tname == "kernel":
            cols.update({
                "grid_x": ic(ks.I_GRID, r), "grid_y": ic(ks.I_GRID + 1, r),
                "grid_z": ic(ks.I_GRID + 2, r), "block_x": ic(ks.I_BLOCK, r),
                "block_y": ic(ks.I_BLOCK + 1, r), "block_z": ic(ks.I_BLOCK + 2, r),
                "registers_per_thread": ic(ks.I_REGS, r),
                "shared_memory_bytes": ic(ks.I_SHMEM, r),
                "collective": istr(ks.S_COLL, r), "in_elems": ic(ks.I_INEL, r),
                "out_elems": ic(ks.I_OUTEL, r), "group_size": ic(ks.I_GROUP, r),
                "dtype": istr(ks.S_DTYPE, r), "process_group": istr(ks.S_PG, r),
            })
        else:
            cols["bytes"] = ic(ks.I_BYTES, r)
        parts[tname].append(pa.table(cols))

    r = rows("api")
    if len(r):
        parts["api"].append(pa.table({
            "pid": pa.array(pid[r]), "tid": pa.array(tid[r]), "name": name_take(pa.array(r)),
            "cat": cat.take(pa.array(r)), "cbid": ic(ks.I_CBID, r),
            "correlation": ic(ks.I_CORR, r), "external_id": ic(ks.I_EXT, r), **common(r)}))

    r = rows("sync")
    if len(r):
        parts["sync"].append(pa.table({
            "pid": pa.array(pid[r]), "tid": pa.array(tid[r]), "device": ic(ks.I_DEV, r),
            "stream": ic(ks.I_STREAM, r), "sync_name": istr(ks.S_SYNCKIND, r),
            "name": name_take(pa.array(r)),
            "event_id": ic(ks.I_WEVID, r), "wait_on_stream": ic(ks.I_WSTREAM, r),
            "wait_on_event_record_correlation": ic(ks.I_WEVCORR, r),
            "correlation": ic(ks.I_CORR, r), **common(r)}))

    r = rows("range")
    if len(r):
        parts["range"].append(pa.table({
            "pid": pa.array(pid[r]), "tid": pa.array(tid[r]), "cat": cat.take(pa.array(r)),
            "name": name_take(pa.array(r)), **common(r),
            "external_id": ic(ks.I_EXT, r), "sequence_number": ic(ks.I_SEQ, r),
            "fwd_thread_id": ic(ks.I_FWDTID, r), "python_id": ic(ks.I_PYID, r),
            "python_parent_id": ic(ks.I_PYPAR, r),
            "input_dims": istr(ks.S_INDIMS, r).cast(pa.string()),
            "input_types": istr(ks.S_INTYPE, r).cast(pa.string()),
            "collective": istr(ks.S_COLL, r), "in_elems": ic(ks.I_INEL, r),
            "out_elems": ic(ks.I_OUTEL, r)}))

    r = rows("flow")
    if len(r):
        parts["flow"].append(pa.table({
            "cat": cat.take(pa.array(r)), "phase": pa.array(ph[r]),
            "flow_id": ic(ks.I_ID, r), "pid": pa.array(pid[r]), "tid": pa.array(tid[r]),
            "ts_ns": pa.array(ts[r])}))

    r = rows("memory")
    if len(r):
        _memory_rows(batch, r, parts, stats)

    r = rows("meta")
    if len(r):
        parts["meta"].append(pa.table({
            "name": name_take(pa.array(r)), "pid": pa.array(pid[r]), "tid": pa.array(tid[r]),
            "value": istr(ks.S_ARGNAME, r)}))

    r = rows("window")
    if len(r):
        parts["window"].append(pa.table({"name": name_take(pa.array(r)), **common(r)}))


def _memory_rows(batch: _Batch, r: np.ndarray, parts: dict, stats: Stats) -> None:
    """The allocator's records among one batch's rows R. A record needs its time, its size
    ("Bytes") and its device ("Device Id", or "Device Type" 0, the host): one without is
    counted and skipped. Totals ("Total Allocated", "Total Reserved") are kept where written:
    the 2021 schema writes none (PyTorch before 1.10), so their absence is counted as a
    fact of the trace, not a fault."""
    ints, ipres = batch.ints, batch.ipres
    has_type = ipres[r, ks.I_MEMDEVTYPE] == 1
    on_host = has_type & (ints[ks.I_MEMDEVTYPE, r] == DEVICE_TYPE_CPU)
    ok = (ipres[r, ks.I_TS] == 1) & (ipres[r, ks.I_MEMBYTES] == 1) & \
        (on_host | (ipres[r, ks.I_MEMDEV] == 1))
    stats.add("memory_record_malformed", int((~ok).sum()), severity="warning",
              detail=f"allocator records ({MEMORY_EVENT}) without a numeric ts, Bytes or "
                     "Device Id; skipped")
    r = r[ok]
    if not len(r):
        return
    on_host = on_host[ok]
    no_totals = (ipres[r, ks.I_MEMALLOC] == 0) | (ipres[r, ks.I_MEMRES] == 0)
    stats.add("memory_record_without_totals", int(no_totals.sum()), severity="info",
              detail="allocator records without Total Allocated or Total Reserved (the 2021 "
                     "schema writes none); kept, the missing totals null")
    device = np.where(on_host, -1, ints[ks.I_MEMDEV, r])
    parts["memory"].append(pa.table({
        "ts_ns": pa.array(ints[ks.I_TS, r]), "device": pa.array(device),
        "bytes": pa.array(ints[ks.I_MEMBYTES, r]),
        "allocated_bytes": batch.int_col(ks.I_MEMALLOC, r),
        "reserved_bytes": batch.int_col(ks.I_MEMRES, r)}))


def _thread_ids(batch: _Batch, n: int, stats: Stats) -> tuple[np.ndarray, np.ndarray]:
    """pid/tid as int64. Non-numeric string ids ("stream 7", "Spans") become the number they
    end with, or a stable negative id derived from the string."""
    out = []
    for slot, col in ((ks.I_PID, ks.S_PID), (ks.I_TID, ks.S_TID)):
        vals = np.where(batch.ipres[:n, slot] == 1, batch.ints[slot, :n], 0)
        has_str = batch.spres[:n, col] == 1
        if has_str.any():
            d = batch.str_col(col, n)
            words = d.dictionary.to_pylist()
            mapped = np.array([_string_id(w) for w in words] or [0], np.int64)
            idx = numpy_filled(d.indices, 0)
            vals = np.where(has_str, mapped[idx], vals)
        out.append(vals)
    return out[0], out[1]


def _string_id(raw: bytes) -> int:
    s = raw.decode(errors="replace")
    m = re.search(r"(\d+)\s*$", s)
    if m and len(m.group(1)) < 18:
        return int(m.group(1))
    h = 0
    for ch in raw:
        h = (h * 131 + ch) & 0x7FFFFFFF
    return -(h + 1)


def _concat(tables: list[pa.Table]) -> pa.Table | None:
    if not tables:
        return None
    t = pa.concat_tables(tables, promote_options="permissive")
    return t.combine_chunks().unify_dictionaries()


def _concat_sorted(tables: list[pa.Table], by_dur: bool = False) -> pa.Table | None:
    """``_concat(tables).sort_by(start_ns)`` (and dur_ns descending where ``by_dur``) with
    one copy of the rows, not two: the rows are taken in order straight from the batches'
    chunks (rows already in order are only combined). The order comes from numpy's stable
    sort, about linear on a trace's nearly sorted starts, where Arrow's sort_indices is a
    comparison sort; both sorts are stable, so the order is the same."""
    if not tables:
        return None
    t = pa.concat_tables(tables, promote_options="permissive").unify_dictionaries()
    start = np.asarray(t["start_ns"])  # one array (no copy where one chunk)
    order = np.argsort(start, kind="stable")
    if by_dur:
        order = _longest_first(order, start[order], np.asarray(t["dur_ns"]))
    if not (order != np.arange(len(order))).any():
        return t.combine_chunks()
    return t.take(order).combine_chunks()


def _longest_first(order: np.ndarray, start_sorted: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """``order`` (a stable order by start) with each run of equal starts reordered by
    duration, longest first, stably: the order of a stable sort by (start, -dur). Only the
    rows that share their start are sorted again (few: a parent and its first child)."""
    tie = start_sorted[1:] == start_sorted[:-1]
    if not tie.any():
        return order
    shared = np.zeros(len(order), bool)
    shared[1:] = tie
    shared[:-1] |= tie
    run = np.cumsum(np.concatenate(([True], ~tie)))  # run number of each sorted row
    at = np.flatnonzero(shared)
    rows = order[at]
    order = order.copy()
    order[at] = rows[np.lexsort((-dur[rows], run[at]))]
    return order


def _finish(parts: dict, stats: Stats, meta: dict, events: int, fname: str) -> Converted:
    tables: dict[str, pa.Table] = {}
    # ranges and flows (nesting and pairing, compiled without the GIL, and their Arrow work)
    # are built on a thread of their own beside the other tables of a large trace, their
    # counts apart, added in when they are taken
    flow_stats = Stats()
    side = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="finish")
            if events >= THREADED_FINISH_EVENTS else _Inline())
    ranges = side.submit(_ranges, _concat_sorted(parts.pop("range"), by_dur=True))
    flows = side.submit(_flows, _concat(parts.pop("flow")), flow_stats)
    if isinstance(side, ThreadPoolExecutor):
        side.shutdown(wait=False)
    window = _concat(parts.pop("window"))
    win = None
    if window is not None and window.num_rows:
        s = np.asarray(window["start_ns"])
        e = s + np.asarray(window["dur_ns"])
        win = (int(s.min()), int(e.max()))

    for tname in ("kernel", "memcpy", "memset"):
        t = _concat_sorted(parts.pop(tname))
        if t is None:
            tables[tname] = conform(tname, {})
            continue
        if tname == "memcpy":
            t = _memcpy_kinds(t)
        tables[tname] = conform(tname, t)

    api = _concat_sorted(parts.pop("api"))
    if api is not None:
        kind = _api_kind(api)
        api = api.drop_columns(["cat"]).append_column("kind", kind)
        tables["api"] = conform("api", api)
    else:
        tables["api"] = conform("api", {})

    sync = _concat_sorted(parts.pop("sync"))
    if sync is not None:
        raw = sync["sync_name"].to_pylist()
        nm = sync["name"].to_pylist()
        kinds = [_SYNC_KINDS.get(a or b, "unknown") for a, b in zip(raw, nm, strict=True)]
        stats.add("unknown_sync_kind", kinds.count("unknown"), severity="warning")
        sync = sync.drop_columns(["sync_name", "name"]).append_column(
            "sync_kind", pa.array(kinds).dictionary_encode())
        # Kineto's "Event Sync" carries the waited event in wait_on_cuda_event_id.
        tables["sync"] = conform("sync", sync)
    else:
        tables["sync"] = conform("sync", {})

    tables["memory"] = _memory(parts.pop("memory"))
    tables["range"] = ranges.result()
    tables["flow"] = flows.result()
    for st in flow_stats.items.values():
        stats.add(st.name, st.count, severity=st.severity, detail=st.detail)

    # kernels whose launch is not in the trace
    api_corr = _distinct(tables["api"]["correlation"].drop_null().to_numpy())
    for tname in ("kernel", "memcpy", "memset"):
        corr = tables[tname]["correlation"]
        c = numpy_filled(corr, -1)
        missing = int((~_member(c, api_corr)).sum())
        stats.add(f"{tname}_without_launch", missing, severity="warning",
                  detail="no runtime/driver call with its correlation id in the trace "
                         "(launched before the window, or not recorded)")

    start_ns = end_ns = None
    timed = [t for name, t in tables.items() if t.num_rows and name not in ("flow", "memory")]
    starts = [int(np.min(np.asarray(t["start_ns"]))) for t in timed]
    ends = [int(np.max(np.asarray(t["start_ns"]) + np.asarray(t["dur_ns"]))) for t in timed]
    if starts:
        start_ns, end_ns = min(starts), max(ends)
    if win is not None:
        outside = 0
        for tname in ("kernel", "memcpy", "memset", "api", "sync", "range"):
            t = tables[tname]
            if t.num_rows:
                s = np.asarray(t["start_ns"])
                e = s + np.asarray(t["dur_ns"])
                outside += int(((s < win[0]) | (e > win[1])).sum())
        stats.add("outside_window", outside, severity="info",
                  detail="activities that start before or end after the profiler's own span")

    metas = _concat(parts.pop("meta"))
    threads = {}
    processes = {}
    if metas is not None:
        for nm, p, t, v in zip(metas["name"].to_pylist(), metas["pid"].to_pylist(),
                               metas["tid"].to_pylist(), metas["value"].to_pylist(),
                               strict=True):
            if v is None:
                continue
            v = v.decode(errors="replace") if isinstance(v, bytes) else v
            if nm == "thread_name":
                threads[f"{p}:{t}"] = v
            elif nm == "process_name":
                processes[str(p)] = v

    dist = meta.get("distributedInfo") or {}
    rank = dist.get("rank") if isinstance(dist, dict) else None
    world = dist.get("world_size") if isinstance(dist, dict) else None
    devices = meta.get("deviceProperties")
    other = {k: v for k, v in meta.items()
             if k not in ("deviceProperties", "_keys", "schemaVersion")}
    if threads:
        other["thread_names"] = threads
    if processes:
        other["process_names"] = processes
    version = meta.get("schemaVersion")
    return Converted(
        source_format="kineto_json",
        source_version=None if version is None else str(version),
        events=events, tables=tables, stats=stats,
        devices=devices if isinstance(devices, list) else None,
        rank=rank if isinstance(rank, int) else None,
        world_size=world if isinstance(world, int) else None,
        metadata=other, start_ns=start_ns, end_ns=end_ns)


# Sets of ids by sorting: numpy 2's np.unique and np.isin hash int64 keys, several times slower
# than a sort on a million ids.
def _distinct(a: np.ndarray) -> np.ndarray:
    """The sorted distinct values of ``a`` (np.unique)."""
    s = np.sort(a, kind="stable")  # about linear on nearly sorted ids (quicksort: 50x slower)
    if len(s) > 1:
        s = s[np.concatenate(([True], s[1:] != s[:-1]))]
    return s


def _first_of_each(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values of ``a`` and the index of each one's first occurrence
    (np.unique with return_index)."""
    order = np.argsort(a, kind="stable")
    s = a[order]
    first = np.ones(len(s), bool)
    first[1:] = s[1:] != s[:-1]
    return s[first], order[first]


def _merge_keys(s_keys: np.ndarray, f_keys: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sorted union of two sorted distinct key arrays, and each union key's index in
    each (-1 where it is not there): one stable sort of the two runs, a linear merge, where
    a binary search per key in each took 15 ms on a million-event trace's flows."""
    both = np.concatenate([s_keys, f_keys])
    order = np.argsort(both, kind="stable")  # a key in both: its start entry comes first
    v = both[order]
    first = np.ones(len(v), bool)
    first[1:] = v[1:] != v[:-1]
    head = np.flatnonzero(first)
    tail = np.empty_like(head)  # last entry of each key: the end entry where it has one
    tail[:-1] = head[1:] - 1
    tail[-1:] = len(v) - 1
    n_s = len(s_keys)
    s_at = np.where(order[head] < n_s, order[head], -1)
    f_at = np.where(order[tail] >= n_s, order[tail] - n_s, -1)
    return v[head], s_at, f_at


def _member(a: np.ndarray, distinct: np.ndarray) -> np.ndarray:
    """``a``'s values that are in the sorted distinct array ``distinct`` (np.isin)."""
    if not len(distinct):
        return np.zeros(len(a), bool)
    i = np.minimum(np.searchsorted(distinct, a), len(distinct) - 1)
    return distinct[i] == a


def _api_kind(api: pa.Table) -> pa.Array:
    cat_d = api["cat"].combine_chunks()
    name_d = api["name"].combine_chunks()
    cat_is_driver = np.array([c in ("cuda_driver", "Driver") for c in
                              cat_d.dictionary.to_pylist()] or [False])
    name_is_driver = np.array([n.startswith("cu") and not n.startswith("cuda") for n in
                               name_d.dictionary.to_pylist()] or [False])
    ci = numpy_filled(cat_d.indices, 0)
    ni = numpy_filled(name_d.indices, 0)
    drv = cat_is_driver[ci] | name_is_driver[ni]
    return pa.DictionaryArray.from_arrays(pa.array(drv.astype(np.int32)),
                                          pa.array(["runtime", "driver"]))


def _memcpy_kinds(t: pa.Table) -> pa.Table:
    names = t["name"].combine_chunks()
    kinds, srcs, dsts = [], [], []
    for nm in names.dictionary.to_pylist():
        m = _MEMCPY_RE.match(nm or "")
        kinds.append(m.group(1) if m else None)
        srcs.append(m.group(2) if m else None)
        dsts.append(m.group(3) if m else None)
    idx = names.indices
    for col, vals in (("copy_kind", kinds), ("src_kind", srcs), ("dst_kind", dsts)):
        t = t.append_column(col, pa.DictionaryArray.from_arrays(idx, pa.array(vals, pa.string())))
    return t


def _ranges(t: pa.Table | None) -> pa.Table:
    """The range table from its rows in (start, longest first) order (``_concat_sorted``)."""
    if t is None or not t.num_rows:
        return conform("range", {})
    pid = np.asarray(t["pid"])
    tid = np.asarray(t["tid"])
    start = np.asarray(t["start_ns"])
    dur = np.asarray(t["dur_ns"])
    depth, parent = nest_ranges(pid, tid, start, dur)
    cat = t["cat"].combine_chunks()
    kinds = [_ROUTES.get(c, ("range", c))[1] for c in cat.dictionary.to_pylist()]
    kind = pa.DictionaryArray.from_arrays(cat.indices, pa.array(kinds, pa.string()))
    t = t.drop_columns(["cat"])
    t = t.append_column("kind", kind)
    t = t.append_column("range_id", pa.array(np.arange(t.num_rows, dtype=np.int64)))
    t = t.append_column("depth", pa.array(depth))
    t = t.append_column("parent", pa.array(parent, mask=parent < 0))
    return conform("range", t)


def _memory(parts: list[pa.Table]) -> pa.Table:
    """The memory table in time order (stable: records of one time keep the file's order,
    which is the allocator's)."""
    if not parts:
        return conform("memory", {})
    t = pa.concat_tables(parts)
    order = np.argsort(np.asarray(t["ts_ns"]), kind="stable")
    if (order != np.arange(len(order))).any():
        t = t.take(order)
    return conform("memory", t.combine_chunks())


def _flows(t: pa.Table | None, stats: Stats) -> pa.Table:
    if t is None or not t.num_rows:
        return conform("flow", {})
    cat = t["cat"].combine_chunks()
    kinds = [_FLOW_KINDS.get(c, "unknown") for c in cat.dictionary.to_pylist()]
    kind_code = np.array([0 if k == "launch" else 1 for k in kinds] or [0], np.int64)
    ci = numpy_filled(cat.indices, 0)
    kind = kind_code[ci]
    fid = numpy_filled(t["flow_id"], -1)
    phase = np.asarray(t["phase"])
    pid = np.asarray(t["pid"])
    tid = np.asarray(t["tid"])
    ts = np.asarray(t["ts_ns"])
    no_id = fid < 0
    stats.add("flow_without_id", int(no_id.sum()), severity="warning")
    is_s = (phase == ord("s")) & ~no_id
    is_f = (phase == ord("f")) & ~no_id
    stats.add("flow_step_events_skipped", int((phase == ord("t")).sum()), severity="info")
    key = kind * (1 << 62) + fid  # kind in the top bits: ids of different kinds never meet
    s_idx = np.flatnonzero(is_s)
    f_idx = np.flatnonzero(is_f)
    s_keys, s_first = _first_of_each(key[s_idx])
    dup_s = len(s_idx) - len(s_keys)
    f_keys, f_first = _first_of_each(key[f_idx])
    dup_f = len(f_idx) - len(f_keys)
    stats.add("flow_duplicate_endpoint", dup_s + dup_f, severity="info",
              detail="flow ids with more than one start or end; the first is kept")
    all_keys, s_at, f_at = _merge_keys(s_keys, f_keys)
    has_s, has_f = s_at >= 0, f_at >= 0
    stats.add("flow_unpaired", int((~has_s | ~has_f).sum()), severity="info",
              detail="flow ids with only a start or only an end in the trace")
    s_row = np.where(has_s, s_idx[s_first[s_at]], 0) if len(s_keys) else np.zeros_like(s_at)
    f_row = np.where(has_f, f_idx[f_first[f_at]], 0) if len(f_keys) else np.zeros_like(f_at)
    kind_out = (all_keys >> 62).astype(np.int32)

    def pick(arr, rows_, mask):
        return pa.array(arr[rows_], mask=~mask)

    return conform("flow", {
        "kind": pa.DictionaryArray.from_arrays(pa.array(kind_out),
                                               pa.array(["launch", "fwdbwd"])),
        "flow_id": pa.array(all_keys & ((1 << 62) - 1)),
        "src_pid": pick(pid, s_row, has_s), "src_tid": pick(tid, s_row, has_s),
        "src_ts_ns": pick(ts, s_row, has_s),
        "dst_pid": pick(pid, f_row, has_f), "dst_tid": pick(tid, f_row, has_f),
        "dst_ts_ns": pick(ts, f_row, has_f),
    })
