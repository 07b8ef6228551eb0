"""Appending chunks to a raw record file (format: ``ingest.cupti_format``).

Every chunk goes out in one ``os.write`` of an unbuffered descriptor as soon as it is made, so a
process killed mid-collection leaves a file that is complete up to its last chunk (at worst with
one half-written chunk at the end, which the reader counts and ignores). The file is created on
the first chunk: a process that never produced a record (a launcher, a data-loader worker) leaves
no file behind. A writer made with ``hold=True`` keeps its chunks in memory until ``release()``
(and drops them if closed with ``keep=False``): the collection holds what arrives before it knows
the process is one to record. A forked child never writes to its parent's file.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np

from daydream.ingest import cupti_format as fmt


class RawWriter:
    def __init__(self, path: Path | str, header: dict, *, codec: int = fmt.ZLIB, level: int = 1,
                 hold: bool = False):
        self.path = Path(path)
        self.header = dict(header, format=fmt.FORMAT_NAME, version=fmt.FORMAT_VERSION)
        self.codec = codec
        self.level = level
        self.pid = os.getpid()
        self.lock = threading.RLock()
        self.fd: int | None = None
        self.closed = False
        self.bytes = 0
        self.chunks = 0
        self._layouts: dict[str, int] = {}
        self._held: list[bytes] | None = [] if hold else None

    @property
    def exists(self) -> bool:
        """Whether this writer created its file (it does so on the first chunk)."""
        return self.bytes > 0

    def release(self) -> None:
        """Write what was held and go on writing as chunks come (idempotent)."""
        with self.lock:
            held, self._held = self._held, None
            for data in held or ():
                self._write(data)

    def _write(self, data: bytes) -> None:
        if self.closed or os.getpid() != self.pid:
            return
        if self._held is not None:
            self._held.append(bytes(data))
            return
        if self.fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
                              0o644)
            self._write_all(fmt.encode_header(self.header))
        self._write_all(data)
        self.chunks += 1

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
            self.bytes += n

    def layout(self, struct: str, dtype: np.dtype, strings: tuple[str, ...] = (),
               source: str = "") -> int:
        """The id of a record layout, describing it in the file on first use."""
        with self.lock:
            key = f"{struct}/{dtype.itemsize}"
            lid = self._layouts.get(key)
            if lid is None:
                lid = len(self._layouts) + 1
                self._layouts[key] = lid
                self._write(fmt.encode_json_chunk(
                    fmt.LAYOUT, fmt.layout_spec(lid, struct, dtype, strings, source)))
            return lid

    def names(self, first: int, words: list[str]) -> None:
        if words:
            with self.lock:
                self._write(fmt.encode_json_chunk(fmt.NAMES, {"first": first, "names": words}))

    def records(self, layout_id: int, records: np.ndarray) -> None:
        if len(records):
            data = np.ascontiguousarray(records).view(np.uint8)
            with self.lock:
                self._write(fmt.encode_chunk(fmt.RECORDS, data.data, layout=layout_id,
                                             count=len(records), codec=self.codec,
                                             level=self.level))

    def meta(self, obj: dict) -> None:
        if obj:
            with self.lock:
                self._write(fmt.encode_json_chunk(fmt.META, obj))

    def close(self, end: dict | None = None, *, keep: bool = True) -> None:
        with self.lock:
            if self.closed:
                return
            if self._held is not None:
                if keep:
                    self.release()
                else:
                    self._held = None
            if self.fd is not None and os.getpid() == self.pid:
                self._write(fmt.encode_json_chunk(fmt.END, end or {}))
                os.fsync(self.fd)
                os.close(self.fd)
            self.fd = None
            self.closed = True
