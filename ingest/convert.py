"""Read any supported trace file into activity tables (format detected from content)."""

from __future__ import annotations

from pathlib import Path

from ingest import source
from ingest.errors import DaydreamError, TraceFormatError
from ingest.model import Converted

FORMATS = ("kineto_json", "nsys_sqlite", "cupti_raw")


def read_trace(path: Path | str) -> Converted:
    """Convert one file. Raises ``TraceFormatError`` naming the file, record and field."""
    path = Path(path)
    try:
        return _read(path)
    except DaydreamError as e:
        if e.file is not None:
            raise
        # raised below the readers (schema casts): the file is named here
        raise type(e)(e.reason, file=str(path), record=e.record, field=e.field) from None


def _read(path: Path) -> Converted:
    if not path.exists():
        raise TraceFormatError("no such file", file=str(path))
    if path.is_dir():
        raise TraceFormatError("is a folder, not a trace file", file=str(path))
    fmt = source.sniff(path)
    if fmt == "kineto_json":
        from ingest.kineto import read_kineto
        return read_kineto(path)
    if fmt == "nsys_sqlite":
        from ingest.nsys import read_nsys
        return read_nsys(path)
    if fmt == "cupti_raw":
        try:
            from ingest.cupti_raw import read_cupti_raw
        except ImportError:
            raise TraceFormatError("raw CUPTI record files are not supported by this version",
                                   file=str(path)) from None
        return read_cupti_raw(path)
    raise TraceFormatError(f"unsupported format {fmt}; supported: {', '.join(FORMATS)}",
                           file=str(path))
