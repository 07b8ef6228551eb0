"""The simulator's input: a task graph as columnar arrays, never a Python object per task.

Tasks are numbered 0..n-1. Each runs on one unit (a CPU thread, a GPU stream, a communication
channel) and each unit has a scheduling policy. Edges are stored in CSR by source: the out-edges
of task ``i`` are ``dst[indptr[i]:indptr[i+1]]`` with their ``lag_ns`` and ``edge_kind``.

Any numbering works, but number tasks in observed start order (as a trace gives them): the core
sweeps tasks in index order, so it reads its arrays nearly sequentially when edges mostly point
forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from daydream.base.errors import DaydreamError
from daydream.simulate.check import check_edge_list, check_tasks


def _arr(name: str, value, dtype, length: int | None = None) -> np.ndarray:
    """A contiguous array of ``dtype`` (no copy when it already is one); a scalar is broadcast
    to ``length``. Non-integer input is refused rather than truncated."""
    a = np.asarray(value)
    if a.size and a.dtype.kind not in "iub":
        raise DaydreamError(f"{name} must hold integers, got dtype {a.dtype}")
    if a.size and not np.can_cast(a.dtype, dtype):
        # Narrowing (say int64 unit ids to int32): refuse values that would wrap around.
        info = np.iinfo(dtype)
        if a.min() < info.min or a.max() > info.max:
            i = int(np.argmax((a < info.min) | (a > info.max)))
            raise DaydreamError(f"{name}[{i}] = {int(a.reshape(-1)[i])} does not fit "
                                f"{np.dtype(dtype).name}")
    if a.ndim == 0 and length is not None:
        return np.full(length, a, dtype=dtype)
    return np.ascontiguousarray(a, dtype=dtype)


@dataclass(frozen=True, eq=False)
class SimGraph:
    """A task graph ready to simulate.

    Fields (n tasks, u units, m edges):

    - ``dur_ns`` int64[n]: duration of each task, >= 0.
    - ``unit`` int32[n]: the unit that runs each task, in 0..u-1.
    - ``unit_policy`` int8[u]: FIXED (0), FCFS (1) or PRIORITY (2) (``simulate.codes``).
    - ``order_key`` int64[n]: observed start time; on FIXED units tasks run in
      (order_key, task index) order.
    - ``priority`` int64[n]: used on PRIORITY units; lower runs first.
    - ``indptr`` int64[n+1], ``dst`` int64[m], ``lag_ns`` int64[m] (>= 0), ``edge_kind`` int8[m]:
      out-edges by source in CSR form. START (0): dst starts no earlier than src end + lag.
      END (1): dst ends no earlier than src end + lag. START_START (2): dst starts no earlier
      than src start + lag.
    - ``held_if_running`` bool[m] or None: START edges that bind only where their source had
      begun by the time the destination's other bounds let it start (another stream's kernel
      holding the SMs the destination needed: contention). Where the source began later, the
      destination does not wait for it. Into a task of a FCFS/PRIORITY unit such an edge binds
      as a START edge.

    Arrays are coerced to these dtypes on construction (no copy when they already match).
    Values are checked by ``simulate`` at entry (``simulate.check.check_graph``).
    """

    dur_ns: np.ndarray
    unit: np.ndarray
    unit_policy: np.ndarray
    order_key: np.ndarray
    priority: np.ndarray
    indptr: np.ndarray
    dst: np.ndarray
    lag_ns: np.ndarray
    edge_kind: np.ndarray
    held_if_running: np.ndarray | None = None

    def __post_init__(self):
        for name, dtype in (("dur_ns", np.int64), ("unit", np.int32), ("unit_policy", np.int8),
                            ("order_key", np.int64), ("priority", np.int64),
                            ("indptr", np.int64), ("dst", np.int64), ("lag_ns", np.int64),
                            ("edge_kind", np.int8)):
            object.__setattr__(self, name, _arr(name, getattr(self, name), dtype))
        h = self.held_if_running
        if h is not None:
            h = np.ascontiguousarray(h, dtype=bool)
            if h.shape != self.dst.shape:
                raise DaydreamError(f"held_if_running has {h.shape[0]} values for "
                                    f"{self.dst.shape[0]} edges")
            object.__setattr__(self, "held_if_running", h if h.any() else None)

    @property
    def n_tasks(self) -> int:
        return int(self.dur_ns.shape[0])

    @property
    def n_units(self) -> int:
        return int(self.unit_policy.shape[0])

    @property
    def n_edges(self) -> int:
        return int(self.dst.shape[0])

    def edge_src(self) -> np.ndarray:
        """Source task of every edge, in CSR order (int64[m]); allocates m int64."""
        return np.repeat(np.arange(self.n_tasks, dtype=np.int64), np.diff(self.indptr))

    @classmethod
    def from_edges(cls, dur_ns, unit, unit_policy, src, dst, lag_ns, edge_kind,
                   order_key=None, priority=None, held_if_running=None) -> SimGraph:
        """Build a graph from an edge list (any order); edges are sorted into CSR by source.

        ``lag_ns`` and ``edge_kind`` may be scalars, applied to every edge. ``order_key``
        defaults to the task index (tasks of a FIXED unit run in index order), ``priority`` to 0.
        Edges of one source keep their input order. Bad input raises ``DaydreamError`` naming
        the first offending task or edge (edge indices refer to the input list).
        """
        dur_ns = _arr("dur_ns", dur_ns, np.int64)
        n = dur_ns.shape[0]
        unit = _arr("unit", unit, np.int32)
        unit_policy = _arr("unit_policy", unit_policy, np.int8)
        src = _arr("src", src, np.int64)
        dst = _arr("dst", dst, np.int64)
        m = src.shape[0]
        lag_ns = _arr("lag_ns", lag_ns, np.int64, m)
        edge_kind = _arr("edge_kind", edge_kind, np.int8, m)
        order_key = (np.arange(n, dtype=np.int64) if order_key is None
                     else _arr("order_key", order_key, np.int64, n))
        priority = (np.zeros(n, dtype=np.int64) if priority is None
                    else _arr("priority", priority, np.int64, n))
        check_tasks(dur_ns, unit, unit_policy, order_key, priority)
        src_sorted = check_edge_list(n, src, dst, lag_ns, edge_kind)

        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
        held = None if held_if_running is None else np.asarray(held_if_running, bool)
        if m > 1 and not src_sorted:
            order = np.argsort(src, kind="stable")
            dst, lag_ns, edge_kind = dst[order], lag_ns[order], edge_kind[order]
            held = None if held is None else held[order]
            del order
        return cls(dur_ns=dur_ns, unit=unit, unit_policy=unit_policy, order_key=order_key,
                   priority=priority, indptr=indptr, dst=dst, lag_ns=lag_ns,
                   edge_kind=edge_kind, held_if_running=held)
