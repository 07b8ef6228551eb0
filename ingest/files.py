"""Which files an ingest reads, and how large they are, from their names and a few bytes: no
converter is imported here, so that ``daydream ingest`` knows whether worker processes will
convert its files before it loads the converters (``base.runner.started_early``)."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from pathlib import Path

from daydream.base.errors import DaydreamError

# File names a folder is searched for. Named files are always tried, whatever their name.
TRACE_PATTERNS = ("*.json", "*.json.gz", "*.sqlite", "*.cupti", "*.cupti.gz")
# PyTorch execution traces sit beside profiler traces (param's et_replay) but are not traces
# of activity; folder expansion leaves them out.
EXCLUDED_SUFFIXES = (".et.json", ".et.json.gz")
# A trace of more JSON than this (a gzipped one counted inflated) has its graph built after its
# conversion, from the stored tables (see ``batch_ingest.ingest``); a smaller one where it was
# converted, from the tables in memory (the two together fit: some 1.3 GB for 217 MB of JSON).
BIG_BYTES = 256 << 20
# the first two bytes of a gzip file
GZIP_MAGIC = b"\x1f\x8b"


def expand(paths: Iterable[str | Path]) -> list[Path]:
    """Files named by paths: files as given, folders searched recursively, globs expanded."""
    out: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = []
            for pat in TRACE_PATTERNS:
                found.extend(q for q in p.rglob(pat) if q.is_file())
            found = [q for q in found if not q.name.endswith(EXCLUDED_SUFFIXES)]
            cands = sorted(found)
        elif p.exists():
            cands = [p]
        else:
            matches = sorted(Path(m) for m in glob.glob(str(raw), recursive=True))
            if not matches:
                raise DaydreamError("no such file, folder or matching glob", file=str(raw))
            cands = [m for m in matches if m.is_file()]
        for c in cands:
            key = c.resolve()
            if key not in seen:
                seen.add(key)
                out.append(c)
    return out


def gzip_isize(path: Path) -> int:
    """Uncompressed size hint from the gzip trailer (mod 2**32)."""
    with open(path, "rb") as f:
        return _trailer_isize(f)


def _trailer_isize(f) -> int:
    """``gzip_isize`` of the open file F."""
    f.seek(-4, os.SEEK_END)
    return int.from_bytes(f.read(4), "little")


def json_bytes(path: Path) -> int:
    """The size of a trace once inflated: a gzipped file's trailer tells it (mod 2**32, so
    never taken below the file's own size), any other file is its size. One open of the
    file: ``converted_beside`` asks it of every file before the workers start."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 18 or f.read(2) != GZIP_MAGIC:
            return size
        return max(size, _trailer_isize(f))


def is_big(path: Path) -> bool:
    """Whether the trace's graph is built after its conversion (``BIG_BYTES``), in the process
    that converted it and never beside other work. A file that cannot be read is not (its
    ingest reports it)."""
    try:
        return json_bytes(path) > BIG_BYTES
    except OSError:
        return False


def converted_beside(files: list[Path]) -> bool:
    """Whether a batch ingest of FILES may give worker processes some of them: two files or
    more, none big (``batch_ingest.ingest`` converts one file, or a batch that holds a big
    one, without the workers started early). A file found stored already is not converted,
    which only the content hash tells: such a batch may still leave the workers unused."""
    return len(files) > 1 and not any(map(is_big, files))
