"""Layer, phase and iteration markers: intervals the hooks open and close, tied to CUPTI records.

While a marker is open on a thread its id is pushed as that thread's CUPTI external correlation
id, so every runtime/driver call made inside it (and, through the call's correlation id, every
kernel, copy and set it launched) gets an EXTERNAL_CORRELATION record naming the innermost open
marker. The reader turns those into ``external_id`` columns; the marker itself becomes a
``range`` row whose ``external_id`` is the same id.

CUPTI's external-correlation stack is per thread and last in, first out. Forward markers nest
by construction (Python calls); backward markers close when autograd has run the module's last
node, which can break that order on graphs with branches. A marker that ends while another one
is above it is closed in the record at once, but its id stays pushed until the markers above it
have been popped (counted as ``out_of_order``): calls in between are attributed to the marker
above, which is where they are anyway.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import numpy as np

from daydream.collect.recorder import NameTable
from daydream.ingest import cupti_format as fmt

MODULE, ANNOTATION = (fmt.MARKER_KINDS.index(k) for k in ("module", "user_annotation"))
NO_PHASE, FORWARD, BACKWARD, WEIGHT_UPDATE, RECOMPUTE = (
    fmt.MARKER_PHASES.index(p) for p in ("", "forward", "backward", "weight_update", "recompute"))


class Markers:
    """Open/close intervals with ids; closed ones are drained as ``fmt.MARKER_DTYPE`` arrays.

    ``clock`` gives ns on the trace's clock (CUPTI's timestamp in production); ``push``/``pop``
    are CUPTI's external correlation calls (none in tests). Thread-safe.
    """

    def __init__(self, names: NameTable | None = None, *,
                 clock: Callable[[], int] = time.perf_counter_ns,
                 push: Callable[[int], None] | None = None,
                 pop: Callable[[], None] | None = None):
        self.names = names if names is not None else NameTable()
        self.clock = clock
        self.push = push
        self.pop = pop
        self.pid = os.getpid()
        self.enabled = True
        self.lock = threading.Lock()
        self._next = 1
        self._open: dict[int, list] = {}
        self._closed: list[tuple] = []
        self._stacks: dict[int, list[int]] = {}
        self._ended: set[int] = set()
        self.out_of_order = 0
        self.unclosed = 0

    def begin(self, name: str, *, kind: int = MODULE, phase: int = NO_PHASE,
              param_bytes: int = 0, module_type: str | None = None) -> int:
        """Open a marker on the calling thread; returns its id (0 when disabled)."""
        if not self.enabled:
            return 0
        tid = threading.get_native_id()
        name_id = self.names.id(name)
        type_id = -1 if module_type is None else self.names.id(module_type)
        with self.lock:
            mid = self._next
            self._next += 1
            self._stacks.setdefault(tid, []).append(mid)
        if self.push is not None:
            self.push(mid)
        # the clock is read last on begin and first on end: the marker encloses its own cost
        self._open[mid] = [self.clock(), tid, name_id, type_id, kind, phase, param_bytes]
        return mid

    def end(self, mid: int) -> None:
        if mid == 0:
            return
        now = self.clock()
        rec = self._open.pop(mid, None)
        if rec is None:
            return
        start, tid, name_id, type_id, kind, phase, param_bytes = rec
        here = threading.get_native_id()
        with self.lock:
            self._closed.append((start, now, mid, param_bytes, tid, name_id, type_id, kind, phase))
            stack = self._stacks.get(tid)
            if not stack or mid not in stack:
                return
            # CUPTI pops the calling thread's id: only the opening thread can pop, and only its top
            if here != tid or stack[-1] != mid:
                self.out_of_order += 1
                self._ended.add(mid)
                return
            pops = 1
            stack.pop()
            while stack and stack[-1] in self._ended:  # markers that ended under this one
                self._ended.discard(stack.pop())
                pops += 1
        if self.pop is not None:
            for _ in range(pops):
                self.pop()

    def open_ids(self) -> list[int]:
        return list(self._open)

    def close_all(self) -> int:
        """End every open marker now (collection stopping); returns how many there were."""
        ids = sorted(self._open, reverse=True)  # innermost (latest) first
        for mid in ids:
            self.end(mid)
        self.unclosed += len(ids)
        return len(ids)

    def drain(self) -> np.ndarray:
        """Closed markers since the last drain, as a ``fmt.MARKER_DTYPE`` array."""
        with self.lock:
            closed, self._closed = self._closed, []
        out = np.zeros(len(closed), fmt.MARKER_DTYPE)
        if closed:
            cols = list(zip(*closed, strict=True))
            for name, col in zip(("start", "end", "id", "param_bytes", "tid", "name",
                                  "module_type", "kind", "phase"), cols, strict=True):
                out[name] = col
            out["pid"] = self.pid
        return out
