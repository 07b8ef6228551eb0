"""Read an Nsight Systems SQLite export (``nsys export --type sqlite``) into the activity tables.

Why set-based: an export of a long run holds millions of rows. Each table is read with one SQL
query (joins, enum and string lookups done by SQLite) whose rows are fetched in batches straight
into Arrow columns; everything after that is Arrow/numpy, never a Python loop per event. The
sqlite3 module makes one Python object per value, which is what dominates the time (about 1 s
per million rows), so the queries return as few columns as they can: threads are decoded from
``globalTid`` in Arrow, rows are put in time order by a stable Arrow sort rather than by SQLite,
and names stay integer ``StringIds`` references until they become the dictionary of a
dictionary-encoded column (renaming, such as stripping version suffixes, is done once per
distinct name). The file is opened read-only (``mode=ro`` URI) and never modified.

Quirks of the export that this reader relies on (checked on the files in tests/data/nsys):

* ``globalTid`` packs a VM/hardware id, the pid and the tid:
  ``pid = (globalTid >> 24) & 0xFFFFFF`` and ``tid = globalTid & 0xFFFFFF`` (the Nsight Systems
  docs write it as ``globalTid / 0x1000000 % 0x1000000``); bits 48 and up hold the VM id (1 in
  both test files). ``globalPid`` is the same with tid 0. The decoded pids equal ``PROCESSES.pid``
  for every process, and tid == pid on the main thread, as on Linux.
* Correlation ids are unique only within a process: in the 2-rank file 11 kernels of one rank
  carry the correlation id of a runtime call of the other rank. When CUDA activity comes from
  more than one process, the correlation ids of the k-th process (sorted by ``globalPid``) are
  therefore offset by ``k << 32`` in every table (CUPTI ids are 32-bit), so that a join on
  ``correlation`` alone, here and downstream, pairs each GPU activity and sync with the call of
  its own process; ``metadata['correlation_offset_by_pid']`` records the offsets.
* ``CUPTI_ACTIVITY_KIND_RUNTIME`` holds driver calls (``cu*``, eventClass 1) beside runtime
  calls; runtime names carry the CUPTI API version (``cudaLaunchKernel_v7000``), stripped here.
* SYNCHRONIZATION has no thread: pid/tid come from the RUNTIME row of the same process and
  correlationId (the cudaStreamSynchronize / cudaStreamWaitEvent call). eventId 0xFFFFFFFF means
  "no event" (stream and context syncs) and becomes null. Two of its fields are not to be
  trusted: syncType (ENUM_CUPTI_SYNC_TYPE: 1 event sync, 2 stream wait event, 3 stream sync,
  4 context sync, 0 unknown) is 2 on the mock file's cudaStreamSynchronize, so the kind comes
  from the synchronizing call where that call is known; and deviceId is 0 for both ranks of the
  2-GPU file although rank 1's context runs its kernels on device 1, so the device comes from
  the context (the device its kernels, copies and sets ran on). Both repairs are counted.
* Enum ids (copy kind, memory kind, sync type, NVTX event type) are resolved through the export's
  own ``ENUM_*`` tables; nsys numbers memory kinds differently from CUPTI (0 = Pageable).
* NVTX marks (instantaneous, no end) are not intervals: they are skipped and counted, as are
  ranges never closed (end null). Push/pop and start/end ranges are kept, on the thread that
  opened them; NVTX domains are not kept.
"""

from __future__ import annotations

import gc
import sqlite3
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from daydream.base.columns import numpy_filled
from daydream.base.errors import DaydreamError, TraceFormatError
from daydream.ingest.converted import Converted
from daydream.ingest.nesting import nest_ranges
from daydream.ingest.schema import SYNC_CALLS, conform, empty
from daydream.ingest.stats import Stats

SOURCE_FORMAT = "nsys_sqlite"

_SQLITE_MAGIC = b"SQLite format 3\x00"
_ID_MASK = 0xFFFFFF         # pid and tid are 24-bit fields of globalTid
_NO_EVENT_ID = 0xFFFFFFFF   # CUPTI's "invalid event" in SYNCHRONIZATION.eventId
_CORRELATION_BITS = 32      # CUPTI correlation ids are uint32
_BATCH_ROWS = 1 << 16       # rows fetched from SQLite per batch

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
NVTX = "NVTX_EVENTS"
ACTIVITY_TABLES = (KERNEL, MEMCPY, MEMSET, RUNTIME, SYNC, NVTX)

_GPU_COLUMNS = ("start", "end", "deviceId", "contextId", "streamId", "correlationId")
# Columns without which a table cannot be read; others (globalPid, memKind) are optional.
_REQUIRED = {
    KERNEL: _GPU_COLUMNS + ("demangledName", "shortName", "gridX", "gridY", "gridZ", "blockX",
                            "blockY", "blockZ", "registersPerThread", "staticSharedMemory",
                            "dynamicSharedMemory"),
    MEMCPY: _GPU_COLUMNS + ("bytes", "copyKind", "srcKind", "dstKind"),
    MEMSET: _GPU_COLUMNS + ("bytes",),
    RUNTIME: ("start", "end", "globalTid", "correlationId", "nameId"),
    SYNC: _GPU_COLUMNS + ("syncType", "eventId"),
    NVTX: ("start", "end", "eventType", "text", "textId", "globalTid"),
}

_SYNC_KINDS = {"EVENT_SYNCHRONIZE": "event_sync", "STREAM_WAIT_EVENT": "stream_wait_event",
               "STREAM_SYNCHRONIZE": "stream_sync", "CONTEXT_SYNCHRONIZE": "context_sync",
               "UNKNOWN": "unknown"}
# ENUM_NSYS_EVENT_TYPE names; the ids are the fallback when an export lacks that table.
_NVTX_RANGE_TYPES = {"NvtxPushPopRange": 59, "NvtxStartEndRange": 60,
                     "NvtxtPushPopRange": 70, "NvtxtStartEndRange": 71}
_NVTX_MARK_TYPES = {"NvtxMark": 34, "NvtxtMark": 65}

# TARGET_INFO_GPU columns under the names Kineto's deviceProperties uses, plus a few extras.
_GPU_PROPERTIES = {
    "id": "id", "cudaId": "cuDevice", "name": "name", "totalGlobalMem": "totalMemory",
    "computeMajor": "computeMajor", "computeMinor": "computeMinor",
    "maxThreadsPerBlock": "maxThreadsPerBlock", "regsPerBlock": "maxRegistersPerBlock",
    "regsPerMultiprocessor": "maxRegistersPerSm", "warpSize": "threadsPerWarp",
    "sharedMemPerBlock": "maxShmemPerBlock", "sharedMemPerMultiprocessor": "maxShmemPerSm",
    "sharedMemPerBlockOptin": "maxShmemPerBlockOptin", "numSms": "smCount",
    "l2CacheSize": "l2CacheSize", "clockRateHz": "clockRate",
    "memoryBandwidthBytesPerS": "memoryBandwidth", "busLocation": "busLocation", "uuid": "uuid",
    "chipName": "chipName",
}


def read_nsys(path: Path) -> Converted:
    """Read one Nsight Systems SQLite export into the activity tables."""
    path = Path(path)
    con = _open(path)
    try:
        return _Reader(path, con).read()
    except sqlite3.DatabaseError as e:
        raise TraceFormatError(f"unreadable SQLite database: {e}", file=str(path)) from e
    except UnicodeDecodeError as e:  # sqlite3 decodes TEXT as UTF-8: a damaged page or string
        raise TraceFormatError(f"damaged export: text that is not UTF-8 ({e.reason} at byte "
                               f"{e.start} of a {len(e.object)}-byte string)",
                               file=str(path)) from None
    finally:
        con.close()


def _open(path: Path) -> sqlite3.Connection:
    """Check the file is a SQLite database before SQLite sees it, then open it read-only."""
    if not path.is_file():
        raise DaydreamError("no such file", file=str(path))
    with path.open("rb") as f:
        head = f.read(len(_SQLITE_MAGIC))
    if not head:
        raise TraceFormatError("empty file, not an Nsight Systems SQLite export",
                               file=str(path))
    if head != _SQLITE_MAGIC:
        raise TraceFormatError("not a SQLite database (bad header); expected an Nsight Systems "
                               "export made with `nsys export --type sqlite`", file=str(path))
    return sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)


# ---- globalTid / globalPid decoding (see module doc) --------------------------------------------

def _process(global_id: pa.Array) -> pa.Array:
    """VM id and pid (``global_id >> 24``): unique per process across a multi-VM report."""
    return pc.shift_right(global_id, 24)


def _pid(global_id: pa.Array) -> pa.Array:
    return pc.bit_wise_and(pc.shift_right(global_id, 24), _ID_MASK)


def _tid(global_tid: pa.Array) -> pa.Array:
    return pc.bit_wise_and(global_tid, _ID_MASK)


def _true_count(mask: pa.Array) -> int:
    return pc.sum(mask).as_py() or 0


def _encode(words: pa.Array, positions: np.ndarray,
            transform: Callable[[pa.Array], pa.Array] | None = None) -> pa.DictionaryArray:
    """Dictionary-encode ``words[positions]`` (-1 = null), applying ``transform`` to the distinct
    words only; words that become equal after the transform share one dictionary entry."""
    used, inverse = np.unique(positions, return_inverse=True)
    distinct = words.take(pa.array(used, pa.int64(), mask=used < 0))
    if transform is not None:
        distinct = transform(distinct)
    enc = pc.dictionary_encode(distinct)
    indices = enc.indices.take(pa.array(inverse.reshape(-1), pa.int64()))
    return pa.DictionaryArray.from_arrays(indices.cast(pa.int32()), enc.dictionary)


class _Reader:
    def __init__(self, path: Path, con: sqlite3.Connection):
        self.path = path
        self.con = con
        self.stats = Stats()
        self.columns: dict[str, set[str]] = {}
        # every table's columns in one query (an export has a hundred tables or more: a
        # PRAGMA per table was most of the cost of reading a small one)
        for table, column in con.execute(
                "SELECT m.name, p.name FROM sqlite_master AS m, pragma_table_info(m.name) AS p "
                "WHERE m.type = 'table'"):
            self.columns.setdefault(table, set()).add(column)
        for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            self.columns.setdefault(name, set())  # a table without columns (damaged schema)

    # ---- plumbing ------------------------------------------------------------------------------

    def _error(self, message: str, field: str | None = None) -> TraceFormatError:
        return TraceFormatError(message, file=str(self.path), field=field)

    def _has(self, table: str, column: str | None = None) -> bool:
        return table in self.columns and (column is None or column in self.columns[table])

    def _fetch(self, sql: str, table: str, text: tuple[str, ...] = ()) -> dict[str, pa.Array]:
        """Run ``sql`` and return its result as Arrow columns (int64, or string for ``text``).

        Rows are fetched in batches, so no per-row Python object outlives its batch, with the
        cyclic garbage collector paused: the row tuples hold no cycles, and letting it scan
        them again and again costs a third of the read time."""
        cur = self.con.execute(sql)
        names = [d[0] for d in cur.description]
        types = {n: pa.string() if n in text else pa.int64() for n in names}
        parts: dict[str, list[pa.Array]] = {n: [] for n in names}
        collecting = gc.isenabled()
        gc.disable()
        try:
            while rows := cur.fetchmany(_BATCH_ROWS):
                for name, values in zip(names, zip(*rows, strict=True), strict=True):
                    try:
                        parts[name].append(pa.array(values, types[name]))
                    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
                        raise self._error(f"unexpected value in {table}: {e}",
                                          field=f"{table}.{name}") from e
                del rows
        finally:
            if collecting:
                gc.enable()
        return {n: pa.concat_arrays(parts[n]) if parts[n] else pa.array([], types[n])
                for n in names}

    def _timed(self, sql: str, table: str, text: tuple[str, ...] = ()) -> dict[str, pa.Array]:
        """``_fetch`` a query returning ``start_ns`` and ``end_ns`` in rowid order; return the
        rows sorted by start (stable, so ties keep file order) with ``dur_ns`` in place of
        ``end_ns``, negative durations clamped to 0 and counted."""
        cols = self._fetch(sql, table, text)
        order = pc.sort_indices(cols["start_ns"])
        cols = {name: col.take(order) for name, col in cols.items()}
        dur_ns = pc.subtract(cols.pop("end_ns"), cols["start_ns"])
        negative = pc.less(dur_ns, 0)
        self.stats.add("negative_duration", _true_count(negative),
                       detail=f"end before start (first seen in {table}); clamped to 0")
        cols["dur_ns"] = pc.if_else(negative, 0, dur_ns)
        return cols

    def _count(self, sql_from: str) -> int:
        return self.con.execute(f"SELECT COUNT(*) FROM {sql_from}").fetchone()[0]

    def _rebase(self, correlation: pa.Array, process: pa.Array) -> pa.Array:
        """Make correlation ids unique across processes (see module doc)."""
        if len(self.processes) < 2 or len(correlation) == 0:
            return correlation
        ordinal = np.searchsorted(self.processes, numpy_filled(process, 0)).astype(np.int64)
        return pc.add(correlation, pa.array(ordinal << _CORRELATION_BITS))  # null stays null

    # ---- names and enums -----------------------------------------------------------------------

    def _load_strings(self) -> None:
        self._ids = np.zeros(0, np.int64)
        self._words = pa.array([], pa.string())
        if self._has("StringIds"):
            cols = self._fetch("SELECT id, value FROM StringIds ORDER BY id", "StringIds",
                               text=("value",))
            self._ids = cols["id"].to_numpy()
            self._words = cols["value"]

    def _positions(self, ids: pa.Array) -> np.ndarray:
        """Row of each StringIds id in ``self._words``; -1 for null ids and for ids StringIds
        does not hold (those are counted)."""
        q = numpy_filled(ids, -1)
        pos = np.minimum(np.searchsorted(self._ids, q), max(len(self._ids) - 1, 0))
        found = pc.is_valid(ids).to_numpy(zero_copy_only=False)
        found &= self._ids[pos] == q if len(self._ids) else False
        self.stats.add("unknown_string_id", int((~found).sum()) - ids.null_count,
                       detail="name ids not in StringIds; name left null")
        return np.where(found, pos, -1)

    def _enum(self, table: str) -> dict[int, tuple[str, str]]:
        """id -> (symbol, label) of one of the export's ENUM_* tables."""
        if not self._has(table):
            return {}
        out = {}
        for i, name, label in self.con.execute(f'SELECT id, name, label FROM "{table}"'):
            for field, v, want in (("id", i, int), ("name", name, str), ("label", label, str)):
                if v is not None and not isinstance(v, want):
                    raise self._error(f"enum row {i!r}: {field} is {type(v).__name__}, expected "
                                      f"{'an integer' if want is int else 'text'}",
                                      field=f"{table}.{field}")
            out[i] = (name or "", label or "")
        return out

    def _map(self, ids: pa.Array, mapping: dict[int, str | None], enum: str) -> pa.Array:
        """Map enum ids to strings; ids the enum does not list become null and are counted."""
        keys = pa.array(list(mapping), pa.int64())
        values = pa.array(list(mapping.values()), pa.string())
        idx = pc.index_in(ids, value_set=keys)
        unknown = pc.and_(pc.is_valid(ids), pc.is_null(idx))
        self.stats.add("unknown_enum_value", _true_count(unknown),
                       detail=f"ids not listed in the export's enum table (first: {enum})")
        return values.take(idx)

    # ---- tables --------------------------------------------------------------------------------

    def read(self) -> Converted:
        present = [t for t in self.columns if t.startswith("CUPTI_ACTIVITY_KIND_") or t == NVTX]
        if not present:
            raise self._error("not an Nsight Systems export: no CUPTI_ACTIVITY_KIND_* or "
                              "NVTX_EVENTS table")
        for table, required in _REQUIRED.items():
            for col in required if table in self.columns else ():
                if col not in self.columns[table]:
                    raise self._error(f"table {table} has no column {col}; not a supported "
                                      "Nsight Systems export", field=f"{table}.{col}")
        if any(self._has(t) for t in (KERNEL, RUNTIME, NVTX)) and not self._has("StringIds"):
            raise self._error("no StringIds table: kernel, API and NVTX names cannot be "
                              "resolved", field="StringIds")
        self._load_strings()
        self.processes = self._activity_processes()
        if len(self.processes) > 1:
            self.stats.add("correlation_rebased", len(self.processes), severity="info",
                           detail="correlation ids repeat across processes; those of the k-th "
                           "process are offset by k << 32 so launch links stay unique")
        # the calls first: kernels, copies, sets and syncs are matched to them
        self.api = self._api()
        tables = {
            "kernel": self._kernels(),
            "memcpy": self._memcpys(),
            "memset": self._memsets(),
            "api": self.api,
            "sync": self._syncs(),
            "range": self._ranges(),
            "flow": empty("flow"),  # nsys has no flows; launches link by correlation id
            # its CUDA memory-usage records are not the caching allocator's: not read
            "memory": empty("memory"),
        }
        export = self._export_metadata()
        return Converted(
            source_format=SOURCE_FORMAT,
            source_version=export.get("EXPORT_SCHEMA_VERSION"),
            events=sum(self._count(t) for t in ACTIVITY_TABLES if self._has(t)),
            tables=tables,
            stats=self.stats,
            devices=self._devices(),
            metadata=self._metadata(export),
        )

    def _activity_processes(self) -> np.ndarray:
        """Sorted ``globalPid >> 24`` (VM id and pid) of every process with CUDA activity."""
        parts = [f'SELECT DISTINCT globalPid >> 24 AS p FROM "{t}"'
                 for t in (KERNEL, MEMCPY, MEMSET, SYNC) if self._has(t, "globalPid")]
        if self._has(RUNTIME):
            parts.append(f"SELECT DISTINCT globalTid >> 24 AS p FROM {RUNTIME}")
        if not parts:
            return np.zeros(0, np.int64)
        rows = self.con.execute(f"SELECT DISTINCT p FROM ({' UNION '.join(parts)}) "
                                "WHERE p IS NOT NULL ORDER BY p").fetchall()
        return np.array([r[0] for r in rows], np.int64)

    def _calls_of(self, correlation: pa.Array) -> pa.Array:
        """Row of the api table holding the call with each (already rebased) correlation id,
        null where the call is not in the export. Rebasing made the ids unique across
        processes, so the id alone finds the call of the right process."""
        return pc.index_in(correlation, value_set=self.api["correlation"].combine_chunks(),
                           skip_nulls=True)

    def _context_devices(self, alias: str) -> tuple[str, str]:
        """A CTE ``devs`` mapping (process, contextId) to the deviceId its kernels, copies and
        sets ran on, and its LEFT JOIN onto ``alias`` (a SYNCHRONIZATION row)."""
        parts = [f'SELECT DISTINCT {"globalPid >> 24" if self._has(t, "globalPid") else "NULL"} '
                 f'AS gpid, contextId, deviceId FROM "{t}"' for t in (KERNEL, MEMCPY, MEMSET)
                 if self._has(t)]
        if not parts:
            parts = ["SELECT NULL AS gpid, NULL AS contextId, NULL AS deviceId WHERE 0"]
        cte = (f"devs AS (SELECT gpid, contextId, MIN(deviceId) AS deviceId FROM "
               f"({' UNION ALL '.join(parts)}) GROUP BY 1, 2)")
        gpid = f"{alias}.globalPid >> 24" if self._has(SYNC, "globalPid") else "NULL"
        return cte, f"LEFT JOIN devs d ON d.contextId = {alias}.contextId AND d.gpid IS {gpid}"

    def _gpu(self, table: str, extra: str, what: str, joins: str = "",
             ) -> dict[str, pa.Array] | None:
        """Columns every GPU activity shares, plus ``extra`` select terms of ``table`` (alias
        ``t``, with ``joins``); counts rows with no launching call in RUNTIME."""
        if not self._has(table):
            return None
        global_pid = "t.globalPid" if self._has(table, "globalPid") else "NULL"
        cols = self._timed(f"""
            SELECT t.start AS start_ns, t."end" AS end_ns, t.deviceId AS device,
                   t.contextId AS context, t.streamId AS stream, t.correlationId AS correlation,
                   {global_pid} AS global_pid, {extra}
            FROM "{table}" t {joins} ORDER BY t.rowid""", table)
        cols["correlation"] = self._rebase(cols["correlation"],
                                           _process(cols.pop("global_pid")))
        without = self._calls_of(cols["correlation"]).null_count
        self.stats.add(f"{what}_without_launch", without,
                       detail=f"{what}s with no RUNTIME call of the same process and "
                       "correlationId: launched before the capture window, or the call was "
                       "not traced")
        return cols

    def _kernels(self) -> pa.Table:
        # the demangled name (with templates), else the short one
        cols = self._gpu(KERNEL, """CASE WHEN dm.value <> '' THEN t.demangledName
                                    ELSE t.shortName END AS name_id,
            t.gridX AS grid_x, t.gridY AS grid_y, t.gridZ AS grid_z, t.blockX AS block_x,
            t.blockY AS block_y, t.blockZ AS block_z, t.registersPerThread AS registers_per_thread,
            t.staticSharedMemory + t.dynamicSharedMemory AS shared_memory_bytes""", "kernel",
            joins="LEFT JOIN StringIds dm ON dm.id = t.demangledName")
        if cols is None:
            return empty("kernel")
        cols["name"] = _encode(self._words, self._positions(cols.pop("name_id")))
        return conform("kernel", cols)

    def _memory_kinds(self) -> dict[int, str | None]:
        """ENUM_CUDA_MEM_KIND labels (Pageable, Pinned, Device, ...), 'Unknown' as null."""
        return {i: (None if label == "Unknown" else label)
                for i, (_, label) in self._enum("ENUM_CUDA_MEM_KIND").items()}

    def _memcpys(self) -> pa.Table:
        cols = self._gpu(MEMCPY, "t.bytes AS bytes, t.copyKind, t.srcKind, t.dstKind", "memcpy")
        if cols is None:
            return empty("memcpy")
        copy_kinds = {i: _copy_kind(symbol)
                      for i, (symbol, _) in self._enum("ENUM_CUDA_MEMCPY_OPER").items()}
        mem_kinds = self._memory_kinds()
        kind = self._map(cols.pop("copyKind"), copy_kinds, "ENUM_CUDA_MEMCPY_OPER")
        src = self._map(cols.pop("srcKind"), mem_kinds, "ENUM_CUDA_MEM_KIND")
        dst = self._map(cols.pop("dstKind"), mem_kinds, "ENUM_CUDA_MEM_KIND")
        # Kineto's name for the same copy: "Memcpy HtoD (Pageable -> Device)"
        unknown = "Unknown"
        cols["name"] = pc.binary_join_element_wise(
            "Memcpy ", pc.fill_null(kind, unknown), " (", pc.fill_null(src, unknown), " -> ",
            pc.fill_null(dst, unknown), ")", "")
        cols.update(copy_kind=kind, src_kind=src, dst_kind=dst)
        return conform("memcpy", cols)

    def _memsets(self) -> pa.Table:
        mem_kind = "t.memKind" if self._has(MEMSET, "memKind") else "NULL"
        cols = self._gpu(MEMSET, f"t.bytes AS bytes, {mem_kind} AS memKind", "memset")
        if cols is None:
            return empty("memset")
        kind = self._map(cols.pop("memKind"), self._memory_kinds(), "ENUM_CUDA_MEM_KIND")
        # Kineto's name: "Memset (Device)"
        cols["name"] = pc.binary_join_element_wise("Memset (", pc.fill_null(kind, "Unknown"),
                                                   ")", "")
        return conform("memset", cols)

    def _api(self) -> pa.Table:
        if not self._has(RUNTIME):
            return empty("api")
        self.stats.add("api_without_thread", self._count(f"{RUNTIME} WHERE globalTid IS NULL"),
                       detail="RUNTIME rows with null globalTid; skipped")
        cols = self._timed(f"""
            SELECT globalTid AS global_tid, nameId, correlationId AS correlation,
                   start AS start_ns, "end" AS end_ns
            FROM {RUNTIME} WHERE globalTid IS NOT NULL ORDER BY rowid""", RUNTIME)
        name = _encode(self._words, self._positions(cols.pop("nameId")), _api_name)
        # driver calls are cu* (cuLaunchKernel), runtime calls cuda* (cudaLaunchKernel)
        words = name.dictionary
        driver = pc.and_(pc.starts_with(words, "cu"), pc.invert(pc.starts_with(words, "cuda")))
        global_tid = cols.pop("global_tid")
        cols.update(pid=_pid(global_tid), tid=_tid(global_tid), name=name,
                    kind=pc.if_else(driver, "driver", "runtime").take(name.indices),
                    correlation=self._rebase(cols["correlation"], _process(global_tid)))
        return conform("api", cols)

    def _syncs(self) -> pa.Table:
        """Synchronizations, with the thread and the kind taken from the synchronizing call and
        the device from the context, where the export's own fields disagree (see module doc)."""
        if not self._has(SYNC):
            return empty("sync")
        global_pid = "s.globalPid" if self._has(SYNC, "globalPid") else "NULL"
        devs, join_devs = self._context_devices("s")
        cols = self._timed(f"""WITH {devs}
            SELECT {global_pid} AS global_pid, s.deviceId, d.deviceId AS context_device,
                   s.streamId AS stream, s.syncType, NULLIF(s.eventId, {_NO_EVENT_ID}) AS event_id,
                   s.correlationId AS correlation, s.start AS start_ns, s."end" AS end_ns
            FROM {SYNC} s {join_devs} ORDER BY s.rowid""", SYNC)
        global_pid = cols.pop("global_pid")
        cols["correlation"] = self._rebase(cols["correlation"], _process(global_pid))

        # the synchronizing call: its thread, and its name for the kind
        call = self._calls_of(cols["correlation"])
        self.stats.add("sync_without_call", call.null_count, severity="info",
                       detail="synchronizations with no RUNTIME call of the same process and "
                       "correlationId; tid left null, kind from syncType")
        cols["pid"] = pc.coalesce(self.api["pid"].combine_chunks().take(call), _pid(global_pid))
        cols["tid"] = self.api["tid"].combine_chunks().take(call)
        call_name = self.api["name"].combine_chunks().take(call)

        kinds = {i: _SYNC_KINDS.get(symbol.removeprefix("CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_"))
                 for i, (symbol, _) in self._enum("ENUM_CUPTI_SYNC_TYPE").items()}
        by_type = self._map(cols.pop("syncType"), kinds, "ENUM_CUPTI_SYNC_TYPE")
        by_call = pa.array([SYNC_CALLS.get(w) for w in call_name.dictionary.to_pylist()],
                           pa.string()).take(call_name.indices)
        disagree = pc.fill_null(pc.not_equal(by_type, by_call), False)
        self.stats.add("sync_kind_from_call", _true_count(disagree),
                       detail="syncType disagrees with the synchronizing call (e.g. 'stream wait' "
                       "on cudaStreamSynchronize); kind taken from the call")
        kind = pc.fill_null(pc.coalesce(by_call, by_type), "unknown")
        self.stats.add("sync_kind_unknown", _true_count(pc.equal(kind, "unknown")),
                       severity="info", detail="synchronizations of unknown type")
        cols["sync_kind"] = kind
        # a context sync waits on no stream
        cols["stream"] = pc.if_else(pc.equal(kind, "context_sync"),
                                    pa.scalar(None, pa.int64()), cols["stream"])

        reported, by_context = cols.pop("deviceId"), cols.pop("context_device")
        moved = pc.fill_null(pc.not_equal(reported, by_context), False)
        self.stats.add("sync_device_from_context", _true_count(moved),
                       detail="SYNCHRONIZATION.deviceId differs from the device its context's "
                       "kernels ran on; device taken from the context")
        cols["device"] = pc.coalesce(by_context, reported)
        return conform("sync", cols)

    def _nvtx_types(self) -> tuple[list[int], list[int]]:
        """eventType ids of NVTX ranges and of NVTX marks."""
        if not self._has("ENUM_NSYS_EVENT_TYPE"):
            return list(_NVTX_RANGE_TYPES.values()), list(_NVTX_MARK_TYPES.values())
        by_name = {symbol: i for i, (symbol, _) in self._enum("ENUM_NSYS_EVENT_TYPE").items()}
        return ([by_name[n] for n in _NVTX_RANGE_TYPES if n in by_name],
                [by_name[n] for n in _NVTX_MARK_TYPES if n in by_name])

    def _ranges(self) -> pa.Table:
        if not self._has(NVTX):
            return empty("range")
        ranges, marks = self._nvtx_types()
        is_range = f"n.eventType IN ({','.join(map(str, ranges)) or 'NULL'})"
        is_mark = f"n.eventType IN ({','.join(map(str, marks)) or 'NULL'})"
        closed = f'{is_range} AND n."end" IS NOT NULL'
        nvtx = f"{NVTX} n WHERE"
        self.stats.add("nvtx_mark_skipped", self._count(f"{nvtx} {is_mark}"),
                       severity="info", detail="NVTX marks are instants, not ranges; skipped")
        self.stats.add("nvtx_other_skipped",
                       self._count(f"{nvtx} NOT {is_range} AND NOT {is_mark}"),
                       severity="info", detail="NVTX_EVENTS rows that are neither ranges nor "
                       "marks (domain or category names); skipped")
        self.stats.add("nvtx_range_unclosed", self._count(f'{nvtx} {is_range} AND n."end" IS NULL'),
                       detail="NVTX ranges never closed (end null); skipped")
        self.stats.add("nvtx_range_without_thread",
                       self._count(f"{nvtx} {closed} AND n.globalTid IS NULL"),
                       detail="NVTX ranges with null globalTid; skipped")
        # the name is the explicit text or the registered string (textId)
        cols = self._timed(f"""
            SELECT n.globalTid AS global_tid, COALESCE(n.text, s.value) AS name,
                   n.start AS start_ns, n."end" AS end_ns
            FROM {NVTX} n LEFT JOIN StringIds s ON s.id = n.textId
            WHERE {closed} AND n.globalTid IS NOT NULL ORDER BY n.rowid""", NVTX, text=("name",))
        self.stats.add("nvtx_range_unnamed", cols["name"].null_count, severity="info",
                       detail="NVTX ranges with neither text nor a known textId; named "
                       "'(unnamed)'")
        cols["name"] = pc.fill_null(cols["name"], "(unnamed)")
        global_tid = cols.pop("global_tid")
        cols.update(pid=_pid(global_tid), tid=_tid(global_tid))
        n = len(cols["start_ns"])
        depth, parent = nest_ranges(cols["pid"].to_numpy(), cols["tid"].to_numpy(),
                                    cols["start_ns"].to_numpy(), cols["dur_ns"].to_numpy())
        cols.update(range_id=pa.array(np.arange(n, dtype=np.int64)), depth=depth,
                    parent=pa.array(parent, mask=parent < 0),
                    kind=pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)),
                                                        pa.array(["nvtx"])))
        return conform("range", cols)

    # ---- trace-level facts ---------------------------------------------------------------------

    def _export_metadata(self) -> dict[str, str]:
        if not self._has("META_DATA_EXPORT"):
            return {}
        # text only: a key or value of another type is not metadata we can use
        return {k: v for k, v in self.con.execute("SELECT name, value FROM META_DATA_EXPORT")
                if isinstance(k, str) and isinstance(v, str | None)}

    def _devices(self) -> list[dict] | None:
        if self._has("TARGET_INFO_GPU"):
            present = {k: c for k, c in _GPU_PROPERTIES.items()
                       if self._has("TARGET_INFO_GPU", c)}
            cur = self.con.execute(f"SELECT {', '.join(present.values())} FROM TARGET_INFO_GPU "
                                   "ORDER BY id")
            return [dict(zip(present, row, strict=True)) for row in cur]
        if self._has("TARGET_INFO_CUDA_DEVICE"):
            cur = self.con.execute("SELECT DISTINCT cudaId, gpuId, uuid, numMultiprocessors "
                                   "FROM TARGET_INFO_CUDA_DEVICE ORDER BY cudaId")
            return [{"id": cuda, "gpuId": gpu, "uuid": uuid, "numSms": sms}
                    for cuda, gpu, uuid, sms in cur]
        return None

    def _metadata(self, export: dict[str, str]) -> dict:
        meta: dict = {"nsys_version": export.get("EXPORT_PRODUCT_VERSION"),
                      "tables_absent": [t for t in ACTIVITY_TABLES if not self._has(t)]}
        # a file cut from a larger export says so (nsys-ai's fixtures carry DERIVED_*)
        meta.update({k.lower(): v for k, v in export.items() if k.startswith("DERIVED_")})
        if self._has("TARGET_INFO_SESSION_START_TIME"):
            row = self.con.execute("SELECT utcEpochNs, utcTime FROM "
                                   "TARGET_INFO_SESSION_START_TIME").fetchone()
            if row:
                meta["session_start_utc_ns"], meta["session_start_utc"] = row
        active = set(self.processes.tolist())
        processes = {gpid & _ID_MASK: None for gpid in active}
        if self._has("PROCESSES"):
            for gpid, name in self.con.execute("SELECT globalPid >> 24, name FROM PROCESSES"):
                if gpid in active:
                    processes[gpid & _ID_MASK] = name
        meta["processes"] = {str(pid): name for pid, name in sorted(processes.items())}
        if len(self.processes) > 1:
            meta["correlation_offset_by_pid"] = {
                str(int(p) & _ID_MASK): k << _CORRELATION_BITS
                for k, p in enumerate(self.processes)}
        return meta


def _copy_kind(symbol: str) -> str | None:
    """CUDA_MEMCPY_KIND_HTOD -> HtoD (Kineto's spelling); unified-memory kinds map to their
    direction; UNKNOWN -> None."""
    kind = symbol.removeprefix("CUDA_MEMCPY_KIND_").removeprefix("UVM_")
    src, sep, dst = kind.partition("TO")
    if not sep or not src or not dst:
        return None
    return f"{src}to{dst}"


def _api_name(words: pa.Array) -> pa.Array:
    """cudaLaunchKernel_v7000 -> cudaLaunchKernel."""
    return pc.replace_substring_regex(words, r"_v\d+$", "")
