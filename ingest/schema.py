"""The activity tables: every table and column declared once, with type, unit and doc.

Every reader (Kineto JSON, Nsight SQLite, raw CUPTI records) produces exactly these tables, so the
stages after ingest never know where a trace came from. Times are int64 nanoseconds on the trace's
own clock; names are dictionary-encoded strings. Each Parquet file carries ``SCHEMA_VERSION`` and
its table name in its metadata.

In the store a trace's tables live in ``activity/trace_id=<id>/<table>.parquet`` (stores written
before: ``activity/<table>/trace_id=<id>/part-0.parquet``, still read); ``trace_id`` is that
folder's partition column (hive style), not a column inside the files.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pyarrow as pa

from daydream.base.store import COMMIT_ORDER, SCHEMA_VERSION, VERSION_KEY  # noqa: F401  (re-exported)

NAME = pa.dictionary(pa.int32(), pa.string())


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    doc: str
    nullable: bool = True


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[Column, ...]

    # built once: the readers and the writer ask for a table's schema some twenty times per
    # trace (a schema built afresh costs ~20 us, a small trace's whole read ~5 ms)
    @functools.cached_property
    def schema(self) -> pa.Schema:
        meta = {VERSION_KEY.encode(): str(SCHEMA_VERSION).encode(),
                b"daydream.text_table": self.name.encode()}
        return pa.schema([pa.field(c.name, c.type, c.nullable) for c in self.columns],
                         metadata=meta)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]


def C(name: str, type_: pa.DataType, doc: str, nullable: bool = True) -> Column:
    return Column(name, type_, doc, nullable)


_I64 = pa.int64()
_I32 = pa.int32()
_STR = pa.string()

# Columns shared by the GPU activity tables (kernel, memcpy, memset).
_GPU_COMMON = (
    C("device", _I32, "GPU index the activity ran on."),
    C("context", _I32, "CUDA context id, where the source has it."),
    C("stream", _I64, "Stream id on that device."),
    C("correlation", _I64, "CUPTI correlation id; equal to the launching api row's."),
    C("external_id", _I64, "Framework correlation (PyTorch 'External id') to the CPU op."),
    C("name", NAME, "Kernel / copy / set name as the source wrote it."),
    C("start_ns", _I64, "Start time, ns.", False),
    C("dur_ns", _I64, "Duration, ns (negative source durations are clamped to 0 and counted).",
      False),
)

KERNEL = Table("kernel", "GPU kernels, one row per execution.", _GPU_COMMON + (
    C("grid_x", _I32, "Grid dimension x, blocks."),
    C("grid_y", _I32, "Grid dimension y, blocks."),
    C("grid_z", _I32, "Grid dimension z, blocks."),
    C("block_x", _I32, "Block dimension x, threads."),
    C("block_y", _I32, "Block dimension y, threads."),
    C("block_z", _I32, "Block dimension z, threads."),
    C("registers_per_thread", _I32, "Registers per thread."),
    C("shared_memory_bytes", _I64, "Static plus dynamic shared memory per block, bytes."),
    C("collective", NAME, "Collective name for NCCL/RCCL kernels (e.g. allreduce), else null."),
    C("in_elems", _I64, "Collective input message size, elements."),
    C("out_elems", _I64, "Collective output message size, elements."),
    C("group_size", _I32, "Collective process-group size, ranks."),
    C("dtype", NAME, "Collective element type."),
    C("process_group", NAME, "Collective process-group name."),
))

MEMCPY = Table("memcpy", "GPU copies.", _GPU_COMMON + (
    C("bytes", _I64, "Bytes copied."),
    C("copy_kind", NAME, "HtoD, DtoH, DtoD, HtoH, PtoP, or null when unknown."),
    C("src_kind", NAME, "Source memory kind: Pageable, Pinned, Device, Array, Managed."),
    C("dst_kind", NAME, "Destination memory kind."),
))

MEMSET = Table("memset", "GPU memory sets.", _GPU_COMMON + (
    C("bytes", _I64, "Bytes set."),
))

API = Table("api", "CUDA/HIP runtime and driver calls on CPU threads.", (
    C("pid", _I64, "Process id.", False),
    C("tid", _I64, "Thread id.", False),
    C("name", NAME, "Call name without version suffix (cudaLaunchKernel, cuLaunchKernel).",
      False),
    C("kind", NAME, "'runtime' or 'driver'.", False),
    C("cbid", _I32, "CUPTI callback id, where the source has it."),
    C("correlation", _I64, "CUPTI correlation id; links to the GPU activity it launched."),
    C("external_id", _I64, "Framework correlation to the enclosing CPU op."),
    C("start_ns", _I64, "Start time, ns.", False),
    C("dur_ns", _I64, "Duration, ns.", False),
))

# The sync kind a synchronizing call makes: it decides the kind where a record's own type
# disagrees with the call (the raw CUPTI and Nsight readers; Nsight Systems does the same).
SYNC_CALLS = {
    "cudaStreamSynchronize": "stream_sync", "cuStreamSynchronize": "stream_sync",
    "cudaEventSynchronize": "event_sync", "cuEventSynchronize": "event_sync",
    "cudaStreamWaitEvent": "stream_wait_event", "cuStreamWaitEvent": "stream_wait_event",
    "cudaDeviceSynchronize": "context_sync", "cudaThreadSynchronize": "context_sync",
    "cuCtxSynchronize": "context_sync",
}

SYNC = Table("sync", "Synchronization records (CUPTI SYNCHRONIZATION / Kineto cuda_sync).", (
    C("pid", _I64, "Process id of the waiting thread, where known."),
    C("tid", _I64, "Thread id of the waiting thread, where known."),
    C("device", _I32, "GPU index."),
    C("stream", _I64, "Stream waited on (stream sync) or waiting (stream wait event); null for "
      "context syncs."),
    C("sync_kind", NAME, "stream_sync, event_sync, context_sync, stream_wait_event, unknown.",
      False),
    C("event_id", _I64, "CUDA event id, where relevant."),
    C("wait_on_stream", _I64, "Stream that recorded the waited-on event (Kineto)."),
    C("wait_on_event_record_correlation", _I64,
      "Correlation id of the cudaEventRecord that recorded the waited-on event (Kineto)."),
    C("correlation", _I64, "Correlation id of the API call that synchronized."),
    C("start_ns", _I64, "Start time, ns.", False),
    C("dur_ns", _I64, "Duration, ns.", False),
))

RANGE = Table("range", "CPU-side (and GPU-annotation) intervals: cpu_op, user_annotation, NVTX, "
              "python_function, module markers, gpu_user_annotation.", (
    C("range_id", _I64, "Row number within the trace, stable across reloads.", False),
    C("pid", _I64, "Process id (device index for gpu_user_annotation).", False),
    C("tid", _I64, "Thread id (stream for gpu_user_annotation).", False),
    C("kind", NAME, "cpu_op, user_annotation, python_function, nvtx, gpu_user_annotation, "
      "module, cpu_instant.", False),
    C("name", NAME, "Range name.", False),
    C("start_ns", _I64, "Start time, ns.", False),
    C("dur_ns", _I64, "Duration, ns.", False),
    C("depth", _I32, "Nesting depth on its thread (0 = outermost).", False),
    C("parent", _I64, "range_id of the innermost enclosing range on the thread, else null."),
    C("external_id", _I64, "Framework correlation id (links cpu_op to its launches)."),
    C("sequence_number", _I64, "Autograd sequence number (links backward ops to forward)."),
    C("fwd_thread_id", _I64, "Forward thread id of a backward op."),
    C("python_id", _I64, "python_function id."),
    C("python_parent_id", _I64, "python_function parent id."),
    C("input_dims", _STR, "Input shapes as JSON text, where recorded."),
    C("input_types", _STR, "Input dtypes as JSON text, where recorded."),
    C("collective", NAME, "Collective name on record_param_comms ops."),
    C("in_elems", _I64, "Collective input elements on record_param_comms ops."),
    C("out_elems", _I64, "Collective output elements on record_param_comms ops."),
))

FLOW = Table("flow", "Links between events where the source has them: launch (CPU call -> GPU "
             "activity) and fwdbwd (forward op -> backward op).", (
    C("kind", NAME, "'launch' or 'fwdbwd'.", False),
    C("flow_id", _I64, "Flow id in the source.", False),
    C("src_pid", _I64, "Source process."),
    C("src_tid", _I64, "Source thread (or stream)."),
    C("src_ts_ns", _I64, "Source timestamp, ns."),
    C("dst_pid", _I64, "Destination process."),
    C("dst_tid", _I64, "Destination thread (or stream)."),
    C("dst_ts_ns", _I64, "Destination timestamp, ns."),
))

MEMORY = Table("memory", "The caching allocator's records (PyTorch profiler `[memory]` instant "
               "events, recorded with profile_memory=True): one row per allocation or free. "
               "Empty for a trace without them.", (
    C("ts_ns", _I64, "When the allocation or free happened, ns.", False),
    C("device", _I32, "GPU index the memory is on; -1 for host (CPU) memory.", False),
    C("bytes", _I64, "Signed change, bytes: positive for an allocation, negative for a free.",
      False),
    C("allocated_bytes", _I64, "Bytes allocated on the device after this record (the "
      "profiler's Total Allocated); null where the profiler wrote no totals (before PyTorch "
      "1.10)."),
    C("reserved_bytes", _I64, "Bytes the caching allocator held from the device after this "
      "record (Total Reserved); null where the profiler wrote no totals."),
))

STAT = pa.struct([
    pa.field("name", _STR),
    pa.field("severity", _STR),
    pa.field("count", _I64),
    pa.field("detail", _STR),
])

TRACE = Table("trace", "One row per trace: where it came from and what ingest had to do to it.", (
    C("file", _STR, "File name as given at ingest (relative to the ingest root).", False),
    C("source_format", _STR, "kineto_json, nsys_sqlite or cupti_raw.", False),
    C("source_version", _STR, "Schema version the source declares (Kineto schemaVersion, nsys "
      "export schema), or null."),
    C("file_bytes", _I64, "Size of the file as stored, bytes.", False),
    C("events", _I64, "Events (or records) read from the file.", False),
    C("start_ns", _I64, "Earliest activity start, ns."),
    C("end_ns", _I64, "Latest activity end, ns."),
    C("devices", _STR, "Device properties as JSON text (list of objects), or null."),
    C("rank", _I32, "Distributed rank, when the trace says."),
    C("world_size", _I32, "Distributed world size, when the trace says."),
    C("job", _STR, "Job name given at ingest, or null."),
    C("metadata", _STR, "Other top-level metadata of the source as JSON text."),
    C("stats", pa.list_(STAT), "What ingest repaired, skipped or noticed: name, severity "
      "(info, warning, error), count, detail.", False),
    C("ingested_at", pa.timestamp("us", tz="UTC"), "When the trace was ingested.", False),
))

TABLES: dict[str, Table] = {t.name: t for t in
                            (KERNEL, MEMCPY, MEMSET, API, SYNC, RANGE, FLOW, MEMORY,
                             TRACE)}

assert tuple(TABLES) == COMMIT_ORDER


def empty(table: str) -> pa.Table:
    return TABLES[table].schema.empty_table()


def conform(table: str, data: pa.Table | dict) -> pa.Table:
    """Cast ``data`` to the declared schema of ``table``: missing columns become nulls, extra
    columns are an error (a reader producing an undeclared column is a bug)."""
    spec = TABLES[table]
    if isinstance(data, dict):
        n = max((len(v) for v in data.values()), default=0)
        cols = data
    else:
        n = data.num_rows
        cols = {name: data.column(name) for name in data.column_names}
    extra = set(cols) - set(spec.names)
    if extra:
        raise ValueError(f"table {table}: undeclared columns {sorted(extra)}")
    arrays = []
    for col in spec.columns:
        if col.name in cols:
            arr = cols[col.name]
            if not isinstance(arr, (pa.Array, pa.ChunkedArray)):
                arr = pa.array(arr)
            if arr.type != col.type:
                if pa.types.is_dictionary(col.type) and not pa.types.is_dictionary(arr.type):
                    arr = arr.cast(pa.string()).dictionary_encode() if len(arr) else \
                        pa.array([], col.type)
                    if isinstance(arr, pa.ChunkedArray):
                        arr = arr.combine_chunks() if arr.num_chunks else pa.array([], col.type)
                    arr = _cast(arr, col, table)
                else:
                    arr = _cast(arr, col, table)
            if pa.types.is_dictionary(col.type):
                arr = _no_null_dictionary(arr, col.type)
            arrays.append(arr)
        else:
            arrays.append(pa.nulls(n, col.type))
    return pa.Table.from_arrays(arrays, schema=spec.schema)


def _cast(arr, col: Column, table: str):
    """Cast to the declared type; a value that does not fit (a 64-bit number in a 32-bit
    column of a damaged file) is a format error naming the column, not an Arrow traceback."""
    try:
        return arr.cast(col.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        from daydream.base.errors import TraceFormatError
        msg = str(e).strip().splitlines()[0]
        raise TraceFormatError(f"a value does not fit the column's type {col.type}: {msg}",
                               field=f"{table}.{col.name}") from None


def _no_null_dictionary(arr, type_):
    """Parquet cannot store a null inside a dictionary: move such nulls into the indices."""
    chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    if not any(c.dictionary.null_count for c in chunks):
        return arr
    fixed = [c.cast(pa.string()).dictionary_encode().cast(type_) for c in chunks]
    return pa.chunked_array(fixed, type_) if isinstance(arr, pa.ChunkedArray) else fixed[0]


def markdown() -> str:
    """docs/schema.md, generated from the declarations above (a test keeps the two in step)."""
    out = ["# Activity tables", "",
           f"Schema version {SCHEMA_VERSION}. Generated by `python -m daydream.ingest.schema`; "
           "do not edit by hand.", "",
           "Stored as `DIR/activity/trace_id=<id>/<table>.parquet` (stores written before: "
           "`DIR/activity/<table>/trace_id=<id>/part-0.parquet`, still read); `trace_id` (a "
           "content hash of the source file) is the hive partition column. Times are int64 "
           "nanoseconds on the trace's clock; `dict<string>` columns are dictionary-encoded.",
           ""]
    for t in TABLES.values():
        out += [f"## {t.name}", "", t.doc, "", "| column | type | null | doc |",
                "|---|---|---|---|"]
        for c in t.columns:
            ty = "dict<string>" if c.type == NAME else str(c.type)
            if c.name == "stats":
                ty = "list<struct<name, severity, count, detail>>"
            out.append(f"| `{c.name}` | {ty} | {'yes' if c.nullable else 'no'} | {c.doc} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown(), end="")
