"""Trace ids: a hash of each file's bytes, worked out on a thread.

Standard library only, so that ``daydream ingest`` starts hashing the files it was given
before it imports anything else (:func:`hash_ahead`, called by ``daydream/__main__.py``):
hashing runs without the GIL, and a large file's hash (some 0.3 s for 200 MB) then overlaps
the command's imports (0.4 s) instead of following them.
"""

from __future__ import annotations

import hashlib
import mmap
import threading
from concurrent.futures import Future
from pathlib import Path

# Files hash_ahead is hashing: file -> the future of the ids of the files hashed with it
_AHEAD: dict[Path, Future] = {}
_AHEAD_LOCK = threading.Lock()


def content_id(path: Path) -> str:
    """Trace id: a hash of the file's bytes (20 hex digits of BLAKE2b).

    A regular file is hashed through a memory map in one call, which holds the GIL once,
    not once per chunk: in a thread beside the imports of a starting command, a chunked hash
    of 200 MB waited for the GIL at every chunk and took a third longer."""
    h = hashlib.blake2b(digest_size=10)
    with open(path, "rb") as f:
        try:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                h.update(mm)
            return h.hexdigest()
        except (ValueError, OSError):  # empty, or not a file a map can show (a pipe)
            f.seek(0)
            h = hashlib.blake2b(digest_size=10)
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _hash_on_thread(paths: list[Path], first: list[Future] | None = None) -> Future:
    """The ids of ``paths`` (a dict of path to id, or to the OSError reading it raised),
    hashed on a thread, after merging what the futures in ``first`` hashed."""
    out: Future = Future()

    def run() -> None:
        ids: dict[Path, str | OSError] = {}
        try:
            for fut in first or ():
                ids.update(fut.result())
            for p in paths:
                if p not in ids:
                    try:
                        ids[p] = content_id(p)
                    except OSError as e:
                        ids[p] = e
            out.set_result({p: ids[p] for p in paths})
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits
            out.set_exception(e)

    threading.Thread(target=run, name="content-ids", daemon=True).start()
    return out


def hash_ahead(args: list[str]) -> None:
    """Start hashing the files ``args`` name (``ingest.files.expand``: folders searched, globs
    expanded) now, for :func:`content_ids_in_background` to take up when it is asked for
    them."""
    from daydream.base.errors import DaydreamError
    from daydream.ingest.files import expand
    found: dict[Path, None] = {}
    for a in args:
        try:
            found.update(dict.fromkeys(expand([a])))
        except (DaydreamError, OSError, ValueError):  # names nothing: the ingest's to report
            pass
    files = list(found)
    if not files:
        return
    fut = _hash_on_thread(files)
    with _AHEAD_LOCK:
        for p in files:
            _AHEAD.setdefault(p, fut)


def content_ids_in_background(paths: list[Path]) -> Future:
    """The content ids of ``paths`` (a dict of path to id, or to the OSError reading it raised),
    hashed on a thread: hashing runs without the GIL, so the imports the caller does meanwhile
    (a second of them before a trace is converted) cost no time of their own. Files that
    :func:`hash_ahead` is hashing already are not hashed again."""
    with _AHEAD_LOCK:
        first = list({id(f): f for p in paths if (f := _AHEAD.pop(p, None)) is not None}
                     .values())
    return _hash_on_thread(list(paths), first)
