"""Opening trace files: format detection from the bytes, inflating gzip.

Format is decided from content, never from the file name alone: gzip magic, SQLite magic, the
raw-CUPTI record magic, or a JSON document.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import threading
import zlib
from pathlib import Path

import numpy as np
from isal import igzip, isal_zlib

from daydream.base.errors import TraceFormatError
from daydream.ingest.cupti_format import MAGIC as CUPTI_MAGIC  # raw record files (collect/)
from daydream.ingest.files import GZIP_MAGIC, gzip_isize

SQLITE_MAGIC = b"SQLite format 3\x00"

# Inflate in memory up to this size; larger files go through a temporary file and mmap, so
# memory holds pages of the file rather than a second copy of it.
IN_MEMORY_LIMIT = 256 << 20


def sniff(path: Path) -> str:
    """Return 'kineto_json', 'nsys_sqlite' or 'cupti_raw' from the file's first bytes."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError as e:
        raise TraceFormatError(f"cannot read: {e.strerror}", file=str(path)) from None
    if not head:
        raise TraceFormatError("empty file", file=str(path))
    if head.startswith(SQLITE_MAGIC):
        return "nsys_sqlite"
    if head.startswith(CUPTI_MAGIC):
        return "cupti_raw"
    if head.startswith(GZIP_MAGIC):
        inner = _gunzip_head(path)
        if inner.startswith(CUPTI_MAGIC):
            return "cupti_raw"
        head = inner
    stripped = head.lstrip(b" \t\r\n\xef\xbb\xbf")
    if stripped[:1] in (b"{", b"["):
        return "kineto_json"
    if not stripped and len(head) < 64:
        raise TraceFormatError("empty file", file=str(path))
    raise TraceFormatError("not a trace: not JSON, gzip, an Nsight Systems SQLite export or a "
                           "raw CUPTI record file", file=str(path))


def _gunzip_head(path: Path) -> bytes:
    try:
        with igzip.open(path, "rb") as f:
            return f.read(64)
    except (OSError, EOFError, zlib.error) as e:
        raise TraceFormatError(f"damaged gzip: {e}", file=str(path)) from None


class Releaser:
    """Drops pages of a memory-mapped trace once the scanner has passed them, so resident
    memory holds the tables being built rather than the whole file. A no-op for in-memory
    buffers. Pages are re-read from the file if anything looks back (top-level metadata)."""

    def __init__(self, data: np.ndarray):
        base = data.base
        self.mm = base.obj if isinstance(base, memoryview) and \
            isinstance(base.obj, mmap.mmap) else None
        self.done = 0

    def upto(self, pos: int) -> None:
        if self.mm is None:
            return
        page = mmap.PAGESIZE
        end = (pos // page) * page
        if end - self.done >= (64 << 20):
            self.mm.madvise(mmap.MADV_DONTNEED, self.done, end - self.done)
            self.done = end


def load_bytes(path: Path) -> np.ndarray:
    """The decompressed bytes of a file as a read-only uint8 array (mmap for large files)."""
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic != GZIP_MAGIC:
        size = os.path.getsize(path)
        if size == 0:
            return np.zeros(0, np.uint8)
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(mm, np.uint8)
    try:
        if os.path.getsize(path) * 8 < IN_MEMORY_LIMIT and gzip_isize(path) < IN_MEMORY_LIMIT:
            with open(path, "rb") as f:
                return np.frombuffer(igzip.decompress(f.read()), np.uint8)
        return _inflate_to_tempfile(path)
    except EOFError:
        raise TraceFormatError("truncated gzip: the compressed data ends before its end marker",
                               file=str(path)) from None
    except (OSError, zlib.error, igzip.BadGzipFile) as e:
        raise TraceFormatError(f"damaged gzip: {e}", file=str(path)) from None


def _inflate_to_tempfile(path: Path) -> np.ndarray:
    tmp = tempfile.TemporaryFile(prefix="daydream-inflate-")
    with igzip.open(path, "rb") as src:
        while chunk := src.read(16 << 20):
            tmp.write(chunk)
    tmp.flush()
    if tmp.tell() == 0:
        return np.zeros(0, np.uint8)
    mm = mmap.mmap(tmp.fileno(), 0, access=mmap.ACCESS_READ)
    tmp.close()  # the mapping keeps the (unlinked) file alive
    return np.frombuffer(mm, np.uint8)


class Inflating:
    """A gzipped file inflated into one preallocated buffer (memory for small files, a
    memory-mapped temporary file for large ones), so that scanning can start on the first
    megabytes while the rest is still being inflated. For a large file a background thread
    inflates: ISA-L releases the GIL, and so does the compiled scanner, so on two cores the two
    overlap. A small one is inflated by ``wait`` itself, chunk by chunk as the scanner asks,
    in the same chunks: a thread would only add its start and a wake-up per chunk.

    ``avail`` bytes of ``buf`` are ready; ``wait(n)`` blocks until more than ``n`` are, or the
    end. A damaged stream raises TraceFormatError from ``wait``."""

    CHUNK = 4 << 20
    THREAD_BYTES = 16 << 20  # inflated sizes from which a thread inflates

    def __init__(self, path: Path, size: int):
        self.path = path
        self.size = size
        if size <= IN_MEMORY_LIMIT:
            self.buf = np.empty(size, np.uint8)
            self._tmp = None
        else:
            self._tmp = tempfile.TemporaryFile(prefix="daydream-inflate-")
            self._tmp.truncate(size)
            mm = mmap.mmap(self._tmp.fileno(), size)
            self.buf = np.frombuffer(mm, np.uint8)
        self.avail = 0
        self.done = False
        self.error: Exception | None = None
        self._cv = threading.Condition()
        self._steps = self._inflate()
        self._thread = None
        if size > self.THREAD_BYTES:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _inflate(self):
        """Inflate the file, publishing ``avail`` after each chunk; yields after each."""
        try:
            d = isal_zlib.decompressobj(16 + isal_zlib.MAX_WBITS)
            out = memoryview(self.buf)
            with open(self.path, "rb") as f:
                pos = 0
                while True:
                    raw = f.read(self.CHUNK)
                    if not raw:
                        break
                    while raw:
                        chunk = d.decompress(raw, self.CHUNK)
                        raw = d.unconsumed_tail
                        if pos + len(chunk) > self.size:
                            raise _SizeMismatch()
                        out[pos:pos + len(chunk)] = chunk
                        pos += len(chunk)
                        if d.eof and d.unused_data:
                            raise _SizeMismatch()  # several gzip members: size hint is wrong
                        with self._cv:
                            self.avail = pos
                            self._cv.notify_all()
                        yield
                    if d.eof:
                        break
            if not d.eof:
                raise EOFError("compressed data ends before the end-of-stream marker")
            if pos != self.size:
                raise _SizeMismatch()
        except Exception as e:  # handed to the reader by wait()
            self.error = e
        finally:
            with self._cv:
                self.done = True
                self._cv.notify_all()

    def _run(self) -> None:
        for _ in self._steps:
            pass

    def wait(self, have: int) -> tuple[int, bool]:
        """Block until more than ``have`` bytes are ready or inflation ended: (avail, done)."""
        if self._thread is None:  # all inflated is not done: the end is checked after
            while not self.done and (self.avail <= have or self.avail == self.size):
                next(self._steps, None)
        with self._cv:
            while not self.done and self.avail <= have:
                self._cv.wait()
            avail, done = self.avail, self.done
        if done and self.error is not None:
            e = self.error
            if isinstance(e, _SizeMismatch):
                raise e
            if isinstance(e, EOFError):
                raise TraceFormatError("truncated gzip: the compressed data ends before its "
                                       "end marker", file=str(self.path)) from None
            raise TraceFormatError(f"damaged gzip: {e}", file=str(self.path)) from None
        return avail, done


class _SizeMismatch(Exception):
    """The gzip trailer's size was not the real size (multi-member file, or over 4 GiB)."""


def open_inflating(path: Path) -> Inflating | None:
    """An Inflating reader for a gzipped file whose trailer gives a plausible size, else None
    (then ``load_bytes`` inflates it whole)."""
    with open(path, "rb") as f:
        if f.read(2) != GZIP_MAGIC:
            return None
    comp = os.path.getsize(path)
    size = gzip_isize(path)
    if size < comp // 2 or size == 0:
        return None
    return Inflating(path, size)
