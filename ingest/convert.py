"""Read any supported trace file into activity tables (format detected from content)."""

from __future__ import annotations

from pathlib import Path

from daydream.base.errors import DaydreamError, TraceFormatError
from daydream.ingest import source
from daydream.ingest.converted import Converted

FORMATS = ("kineto_json", "nsys_sqlite", "cupti_raw")


def read_trace(path: Path | str) -> Converted:
    """Convert one file. Raises ``TraceFormatError`` naming the file, record and field."""
    path = Path(path)
    try:
        return _check_work(_read(path), path)
    except DaydreamError as e:
        if e.file is not None:
            raise
        # raised below the readers (schema casts): the file is named here
        raise type(e)(e.reason, file=str(path), record=e.record, field=e.field) from None


# The tables whose rows become tasks of the graph (graphstore.build): GPU activity, CPU calls,
# and the CPU ranges whose host time between calls is work too.
WORK_TABLES = ("kernel", "memcpy", "memset", "api", "range")


def _check_work(conv: Converted, path: Path) -> Converted:
    """A trace with nothing to simulate is an error here, not a store entry that replays to
    nothing: no events at all, or events none of which is GPU or CPU work."""
    if not conv.events:
        raise TraceFormatError("no events: the trace is empty", file=str(path))
    if not any(conv.tables[t].num_rows for t in WORK_TABLES if t in conv.tables):
        raise TraceFormatError(f"no GPU or CPU work to simulate: none of its {conv.events} "
                               "events is a kernel, copy, set, runtime call or CPU range",
                               file=str(path))
    return conv


def _read(path: Path) -> Converted:
    if not path.exists():
        raise TraceFormatError("no such file", file=str(path))
    if path.is_dir():
        raise TraceFormatError("is a folder, not a trace file", file=str(path))
    fmt = source.sniff(path)
    if fmt == "kineto_json":
        from daydream.ingest.kineto import read_kineto
        return read_kineto(path)
    if fmt == "nsys_sqlite":
        from daydream.ingest.nsys import read_nsys
        return read_nsys(path)
    if fmt == "cupti_raw":
        try:
            from daydream.ingest.cupti_raw import read_cupti_raw
        except ImportError:
            raise TraceFormatError("raw CUPTI record files are not supported by this version",
                                   file=str(path)) from None
        return read_cupti_raw(path)
    raise TraceFormatError(f"unsupported format {fmt}; supported: {', '.join(FORMATS)}",
                           file=str(path))
