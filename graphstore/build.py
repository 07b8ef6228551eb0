"""Activity tables of one trace -> the dependency graph (task, edge, unit tables).

Outline (each step set-based over numpy columns; the one per-thread sweep is compiled):
  1. units: every CPU thread with calls or ranges, every (device, stream) with GPU work, and an
     ``origin`` unit holding one zero-length task at the trace's start;
  2. CPU tasks: each runtime/driver call, and each stretch of host time between calls, split
     where the innermost enclosing range changes (a ``host`` task named after that range);
  3. GPU tasks: kernels (NCCL/RCCL ones as ``comm``), copies, sets;
  4. edges: thread order, stream order, launch (by correlation id), synchronization (a blocking
     call waits for the GPU task it waited on), cross-stream waits (recorded in the trace, or
     inferred where a GPU task started exactly when another stream's task ended and nothing else
     explains its start), and an origin edge for tasks with no other predecessor;
  5. the lag rule: of the constraints on a GPU task, the one that bound it in the trace keeps
     the observed lag, the others a typical small latency (never more than observed), so the
     unmodified graph replays the trace exactly and a shrunk predecessor lets work move earlier.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numba
import numpy as np
import pyarrow as pa

from graphstore.schema import EDGE_ANCHORS, EDGE_KINDS, TASK_KINDS
from ingest.nesting import thread_key
from ingest.stats import Stats

CPU_RANGE_KINDS = ("cpu_op", "user_annotation", "python_function", "nvtx", "module")

# Calls that can block the CPU thread until GPU work finishes.
BLOCKING_RE = re.compile(
    r"^(cuda|hip)(Stream|Device|Event|Thread)Synchronize|^cu(Stream|Ctx|Event)Synchronize"
    r"|^(cuda|hip)Memcpy|^cuMemcpy|^(cuda|hip)Memset(2D|3D)?$|^cuMemset[^A]*$"
    r"|^(cuda|hip)Free(Host)?$|^cuMemFree")
COMM_RE = re.compile(r"nccl|rccl", re.IGNORECASE)
# record_function markers that are no operator: the profiler's step and "## name ##" notes
MARKER_RE = re.compile(r"^ProfilerStep#\d+$|^## .* ##$")

# Integer codes of the kind, ekind and anchor columns: positions in the schema's vocabularies
# (graphstore.load names them by indexing those tuples).
KIND_API, KIND_HOST, KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, KIND_COMM = (
    TASK_KINDS.index(k) for k in ("api", "host", "kernel", "memcpy", "memset", "comm"))
EK_THREAD, EK_STREAM, EK_LAUNCH, EK_SYNC, EK_WAIT, EK_ORIGIN, EK_WAKE, EK_QUEUE = (
    EDGE_KINDS.index(k) for k in ("thread", "stream", "launch", "sync", "wait", "origin", "wake",
                                  "queue"))
A_END_START, A_START_START, A_END_END = (
    EDGE_ANCHORS.index(a) for a in ("end_start", "start_start", "end_end"))

# Latencies used when the trace shows none (ns); measured per trace when it does.
DEFAULT_LAUNCH_LAG_NS = 5_000
DEFAULT_STREAM_LAG_NS = 1_000
# A GPU task whose start is this much later than every known constraint is looked at for an
# unrecorded cross-stream wait; the other stream's task must have ended within WAIT_TOL_NS.
UNEXPLAINED_NS = 5_000
WAIT_TOL_NS = 3_000
# A stretch of host time at least this long that ends within WAKE_TOL_NS after a task on another
# thread of the process ended is taken as that thread waiting for the other (the autograd
# thread idle until backward() is called, the main thread blocked until backward is done).
MIN_WAIT_NS = 20_000
# A thread's first task is tied to an event on another thread of its process at most this long
# before it (the autograd thread's first op ~0.5 ms after backward() was called, A100 DDP).
FIRST_WAKE_TOL_NS = 1_000_000
# A stream holds about 1024 launched but unfinished kernels; a launch into a full stream blocks
# until the oldest one finishes (stackoverflow.com/questions/53970187, measured: "the buffer
# size is about 1000 kernels" per stream; NVIDIA forums thread 68937). Without this bound a
# simulated CPU freed of its launch overhead (cuda_graphs) would run ahead of the GPU without
# limit. A trace that shows a deeper queue on some stream uses its own observed depth there.
LAUNCH_QUEUE_DEPTH = 1024
# The bound is enforced on every LAUNCH_QUEUE_STRIDE-th launch of a stream (the launches in
# between follow it in thread order): between depth - stride and depth outstanding, at one
# edge per 64 GPU tasks instead of one per task.
LAUNCH_QUEUE_STRIDE = 64
WAKE_TOL_NS = 500_000  # autograd-engine wake-ups: ~100-200 us (V100 traces), ~350 us (A100 DDP)


@dataclass
class Graph:
    """Columnar graph of one trace, task ids dense in start order."""

    # tasks
    kind: np.ndarray        # int8
    unit: np.ndarray        # int32
    start_ns: np.ndarray    # int64, observed
    obs_dur_ns: np.ndarray  # int64
    dur_ns: np.ndarray      # int64, for the simulator
    name_code: np.ndarray   # int64: index into name_vocab (names repeat: kernels, calls)
    name_vocab: np.ndarray  # object: the names
    bytes_: np.ndarray      # int64, -1 = none
    correlation: np.ndarray  # int64, -1 = none
    range_id: np.ndarray    # int64, -1 = none
    blocking: np.ndarray    # bool
    # edges
    src: np.ndarray
    dst: np.ndarray
    ekind: np.ndarray       # int8
    anchor: np.ndarray      # int8
    lag_ns: np.ndarray      # int64
    binding: np.ndarray     # bool
    # units
    unit_kind: list
    unit_pid: list
    unit_tid: list
    unit_device: list
    unit_stream: list
    unit_name: list
    stats: Stats = field(default_factory=Stats)

    @property
    def n_tasks(self) -> int:
        return len(self.kind)

    @property
    def name(self) -> _Names:
        """Task names, decoded one at a time (for messages and tests)."""
        return _Names(self.name_code, self.name_vocab)

    def name_column(self) -> pa.Array:
        """The task names as an Arrow string column, decoded in C++."""
        return pa.DictionaryArray.from_arrays(
            pa.array(self.name_code.astype(np.int32)),
            pa.array(self.name_vocab, pa.string())).cast(pa.string())


@dataclass(frozen=True)
class _Names:
    """A read-only sequence of task names over (codes, vocabulary)."""

    codes: np.ndarray
    vocab: np.ndarray

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, i):
        return self.vocab[self.codes[i]]

    def __iter__(self):
        return iter(self.vocab[self.codes])


def _col(t: pa.Table, name: str, fill: int = -1) -> np.ndarray:
    """An integer column as a writable int64 array, nulls as ``fill`` (one copy)."""
    c = t[name]
    if c.null_count:
        c = c.fill_null(fill)
    return c.to_numpy().astype(np.int64)


def _dict(t: pa.Table, name: str = "name") -> tuple[np.ndarray, np.ndarray]:
    """(codes, distinct values as an object array) of a string column; null -> ''."""
    col = t[name].combine_chunks() if t.num_rows else pa.array([], pa.string())
    if not pa.types.is_dictionary(col.type):
        col = col.cast(pa.string()).dictionary_encode()
    values = np.asarray(col.dictionary.to_pylist() + [""], dtype=object)
    codes = col.indices.fill_null(len(values) - 1).to_numpy(zero_copy_only=False)
    return codes.astype(np.int64), values


def _names(t: pa.Table, name: str = "name") -> np.ndarray:
    codes, values = _dict(t, name)
    return values[codes]


class _NamePool:
    """Task names as int codes into one vocabulary: the name columns of the activity tables
    are dictionary-encoded in Arrow and their dictionaries appended here, so no Python string
    is touched per task (a vocabulary may repeat a name across tables; harmless)."""

    def __init__(self):
        self._parts: list[np.ndarray] = []
        self._size = 0

    def add(self, codes: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Codes into ``values`` -> codes into the pool."""
        out = codes + self._size
        self._parts.append(values)
        self._size += len(values)
        return out

    def vocab(self) -> np.ndarray:
        return (np.concatenate(self._parts) if self._parts else np.zeros(0, object))


def _flag(t: pa.Table, name: str, pred) -> np.ndarray:
    """pred(value) evaluated once per distinct value of a string column, per row."""
    codes, values = _dict(t, name)
    flags = np.array([bool(pred(v)) for v in values], bool)
    return flags[codes]


# ---- CPU side: one compiled sweep per thread ----------------------------------------------------

@numba.njit(cache=True, inline="always")
def _emit(out, k, t, kind, s, e, label, api):
    """Write task k into the sweep's output columns (thread, kind, start, end, range, call);
    returns k + 1."""
    out[0][k] = t
    out[1][k] = kind
    out[2][k] = s
    out[3][k] = e
    out[4][k] = label
    out[5][k] = api
    return k + 1


@numba.njit(cache=True)
def _cpu_sweep(thr_off_api, a_start, a_end, thr_off_rng, r_start, r_end, r_id,
               o_thread, o_kind, o_start, o_end, o_range, o_api, api_task):
    """Cut each thread's time into api tasks and host tasks.

    Per thread t: calls a_*[thr_off_api[t]:thr_off_api[t+1]] sorted by start, ranges
    r_*[thr_off_rng[t]:...] sorted by (start, -end). Writes tasks into o_* and returns their
    count. api_task[i] is the task of call i (a call nested inside another maps to the outer)."""
    nt = thr_off_api.shape[0] - 1
    out = (o_thread, o_kind, o_start, o_end, o_range, o_api)
    k = 0
    stack = np.empty(r_start.shape[0] + 1, np.int64)
    for t in range(nt):
        a0, a1 = thr_off_api[t], thr_off_api[t + 1]
        q0, q1 = thr_off_rng[t], thr_off_rng[t + 1]
        if a1 == a0 and q1 == q0:
            continue
        begin = np.int64(1) << 62
        finish = -(np.int64(1) << 62)
        if a1 > a0:
            begin = min(begin, a_start[a0])
            for i in range(a0, a1):
                finish = max(finish, a_end[i])
        if q1 > q0:
            begin = min(begin, r_start[q0])
            for i in range(q0, q1):
                finish = max(finish, r_end[i])
        cur = begin
        top = 0
        ai = a0
        ri = q0
        while True:
            na = a_start[ai] if ai < a1 else finish + 1
            nr = r_start[ri] if ri < q1 else finish + 1
            ne = r_end[stack[top - 1]] if top > 0 else finish + 1
            if na > finish and nr > finish and ne > finish:
                break
            label = r_id[stack[top - 1]] if top > 0 else -1
            if ne <= nr and ne <= na:
                # innermost range ends
                if ne > cur:
                    k = _emit(out, k, t, 1, cur, ne, label, -1)
                    cur = ne
                top -= 1
            elif nr < na:
                # a range starts
                if nr > cur:
                    k = _emit(out, k, t, 1, cur, nr, label, -1)
                    cur = nr
                stack[top] = ri
                top += 1
                ri += 1
            else:
                # a call starts: close host time, emit the call, swallow what lies inside it
                if na > cur:
                    k = _emit(out, k, t, 1, cur, na, label, -1)
                end = a_end[ai]
                task = k
                k = _emit(out, k, t, 0, na, end, label, ai)
                api_task[ai] = task
                ai += 1
                while ai < a1 and a_start[ai] < end:
                    api_task[ai] = task  # nested call (e.g. driver call inside runtime call)
                    ai += 1
                while True:
                    ne = r_end[stack[top - 1]] if top > 0 else finish + 1
                    nr = r_start[ri] if ri < q1 else finish + 1
                    if ne <= end and ne <= nr:
                        top -= 1
                    elif nr < end:
                        stack[top] = ri
                        top += 1
                        ri += 1
                    else:
                        break
                cur = max(cur, end)
        if finish > cur:
            k = _emit(out, k, t, 1, cur, finish, -1, -1)
    return k


def _distinct_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense key of each (a, b) pair (numbered in sorted pair order) and the distinct pairs,
    as an int64 array of shape (k, 2) indexed by key. Rows of one thread (or stream) come in
    long runs in time order: the pairs are sorted once per run, not once per row."""
    if not len(a):
        return np.zeros(0, np.int64), np.zeros((0, 2), np.int64)
    heads = np.flatnonzero(np.r_[True, (a[1:] != a[:-1]) | (b[1:] != b[:-1])])
    key = np.repeat(thread_key(a[heads], b[heads]), np.diff(np.r_[heads, len(a)]))
    first = np.zeros(int(key.max()) + 1, np.int64)
    first[key] = np.arange(len(key))
    return key, np.stack([a[first], b[first]], 1)


def _by_thread(thr: np.ndarray, start: np.ndarray, end: np.ndarray | None = None
               ) -> np.ndarray:
    """np.lexsort((start, thr)), or with ``end`` np.lexsort((-end, start, thr)): a stable
    sort on the thread alone where the rows already come in that order of (start, -end), as
    ingest writes them."""
    ds = np.diff(start)
    in_order = bool((ds >= 0).all())
    if in_order and end is not None:
        tie = np.flatnonzero(ds == 0)
        in_order = bool((end[tie + 1] <= end[tie]).all())
    if in_order:
        return order_by_unit(thr)
    return np.lexsort((start, thr)) if end is None else np.lexsort((-end, start, thr))


def _group_offsets(keys_sorted: np.ndarray, n_groups: int) -> np.ndarray:
    off = np.zeros(n_groups + 1, np.int64)
    np.add.at(off, keys_sorted + 1, 1)
    return np.cumsum(off)


def _cpu_tasks(api: pa.Table, rng: pa.Table, stats: Stats):
    """Threads, CPU tasks and the task of each call."""
    a_pid, a_tid = _col(api, "pid"), _col(api, "tid")
    a_start = _col(api, "start_ns")
    a_end = a_start + _col(api, "dur_ns")
    cpu = (_flag(rng, "kind", CPU_RANGE_KINDS.__contains__) if rng.num_rows
           else np.zeros(0, bool))
    r_pid, r_tid = _col(rng, "pid")[cpu], _col(rng, "tid")[cpu]
    r_start = _col(rng, "start_ns")[cpu]
    r_end = r_start + _col(rng, "dur_ns")[cpu]
    r_id = _col(rng, "range_id")[cpu]

    inv, threads = _distinct_pairs(np.concatenate([a_pid, r_pid]),
                                   np.concatenate([a_tid, r_tid]))
    a_thr, r_thr = inv[: len(a_pid)], inv[len(a_pid):]
    nthr = len(threads)
    ao = _by_thread(a_thr, a_start)
    ro = _by_thread(r_thr, r_start, r_end)
    cap = 2 * len(a_start) + 2 * len(r_start) + 2 * nthr + 1
    o_thread = np.empty(cap, np.int64)
    o_kind = np.empty(cap, np.int64)
    o_start = np.empty(cap, np.int64)
    o_end = np.empty(cap, np.int64)
    o_range = np.empty(cap, np.int64)
    o_api = np.empty(cap, np.int64)
    api_task_sorted = np.full(len(a_start), -1, np.int64)
    k = _cpu_sweep(_group_offsets(a_thr[ao], nthr), a_start[ao], a_end[ao],
                   _group_offsets(r_thr[ro], nthr), r_start[ro], r_end[ro], r_id[ro],
                   o_thread, o_kind, o_start, o_end, o_range, o_api, api_task_sorted)
    api_task = np.empty(len(a_start), np.int64)
    api_task[ao] = api_task_sorted
    o_api = o_api[:k]
    # o_api indexes the sorted call order: map back to api rows
    api_row = (np.where(o_api >= 0, ao[np.maximum(o_api, 0)], -1) if len(ao)
               else np.full(len(o_api), -1, np.int64))
    nested = int(len(a_start) - (o_kind[:k] == 0).sum())
    stats.add("nested_calls_merged", nested, severity="info",
              detail="calls inside another call on the same thread (driver inside runtime); "
                     "their GPU work is launched by the outer call's task")
    return threads, (o_thread[:k], o_kind[:k], o_start[:k], o_end[:k], o_range[:k], api_row), \
        api_task


# Bytes per element of the dtype names NCCL kernel args carry ('Float', 'Half', 'c10::BFloat16'...).
DTYPE_BYTES = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8,
               "float64": 8, "int": 4, "int32": 4, "int64": 8, "long": 8, "int8": 1,
               "char": 1, "byte": 1, "uint8": 1, "bool": 1, "short": 2, "int16": 2}


def _message_bytes(t: pa.Table) -> np.ndarray:
    """Collective message bytes per rank: the larger of the input and output element counts
    (an all-gather's output is the gathered tensor) times the dtype size; -1 where unknown.
    An unknown dtype counts 4 bytes (NCCL args name the float types PyTorch sends)."""
    if "in_elems" not in t.column_names:
        return np.full(t.num_rows, -1, np.int64)
    n = np.maximum(_col(t, "in_elems"), _col(t, "out_elems"))
    codes, values = _dict(t, "dtype")
    w = np.array([DTYPE_BYTES.get(str(v).lower().removeprefix("c10::"), 4) for v in values],
                 np.int64)
    return np.where(n >= 0, n * w[codes], -1)


def _median(x: np.ndarray, default: int) -> int:
    return int(np.median(x)) if len(x) else default


def build(tables: dict[str, pa.Table]) -> Graph:
    """Build the graph of one trace from its activity tables."""
    stats = Stats()
    api, rng = tables["api"], tables["range"]
    threads, cpu, api_task_local = _cpu_tasks(api, rng, stats)
    c_thr, c_kind, c_start, c_end, c_range, c_api = cpu
    pool = _NamePool()
    origin_name = pool.add(np.zeros(1, np.int64), np.array(["<trace start>"], object))
    api_names = pool.add(*_dict(api))

    # ---- GPU tasks
    parts = []
    for tname, kcode in (("kernel", KIND_KERNEL), ("memcpy", KIND_MEMCPY),
                         ("memset", KIND_MEMSET)):
        t = tables[tname]
        if not t.num_rows:
            continue
        codes, vocab = _dict(t)
        kind = np.full(t.num_rows, kcode, np.int64)
        if tname == "kernel":
            coll = t["collective"].is_valid().to_numpy(zero_copy_only=False)
            is_comm = _flag(t, "name", COMM_RE.search)
            kind[coll | is_comm] = KIND_COMM
        nbytes = _col(t, "bytes") if "bytes" in t.column_names else np.full(t.num_rows, -1)
        if tname == "kernel":
            # collectives: message bytes per rank from the NCCL args where the trace has them
            nbytes = _message_bytes(t)
        parts.append(dict(kind=kind, device=_col(t, "device", 0), stream=_col(t, "stream", 0),
                          start=_col(t, "start_ns"), dur=_col(t, "dur_ns"),
                          corr=_col(t, "correlation"), name=pool.add(codes, vocab),
                          bytes=nbytes))
    if parts:
        g = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    else:
        g = {k: np.zeros(0, np.int64) for k in ("kind", "device", "stream", "start", "dur",
                                                 "corr", "bytes", "name")}
    ng = len(g["start"])
    if ng:
        g_unit, streams = _distinct_pairs(g["device"], g["stream"])
    else:
        streams, g_unit = np.zeros((0, 2), np.int64), np.zeros(0, np.int64)

    # ---- assemble tasks: origin, CPU, GPU; then renumber in start order
    nthr = len(threads)
    origin_unit = nthr + len(streams)
    firsts = ([int(c_start.min())] if len(c_start) else []) + \
        ([int(g["start"].min())] if ng else [])
    t0 = min(firsts) if firsts else 0
    nc = len(c_start)
    kind = np.concatenate([[KIND_HOST], c_kind, g["kind"]]).astype(np.int8)
    unit = np.concatenate([[origin_unit], c_thr, nthr + g_unit]).astype(np.int32)
    start = np.concatenate([[t0], c_start, g["start"]]).astype(np.int64)
    obs = np.concatenate([[0], c_end - c_start, g["dur"]]).astype(np.int64)
    corr = np.concatenate([[-1], np.where(c_api >= 0, _col(api, "correlation")[np.maximum(
        c_api, 0)], -1) if api.num_rows else np.full(nc, -1), g["corr"]]).astype(np.int64)
    rid = np.concatenate([[-1], c_range, np.full(ng, -1)]).astype(np.int64)
    nbytes = np.concatenate([[-1], np.full(nc, -1), g["bytes"]]).astype(np.int64)
    cpu_names = np.empty(nc, np.int64)
    is_api = c_kind == KIND_API
    cpu_names[is_api] = api_names[c_api[is_api]] if api.num_rows else []
    cpu_names[~is_api] = _range_names(pool, rng, c_range[~is_api])
    names = np.concatenate([origin_name, cpu_names, g["name"]])
    blocking = np.zeros(len(kind), bool)
    if api.num_rows:
        api_blocking = _flag(api, "name", BLOCKING_RE.search)
        blocking[1:1 + nc][is_api] = api_blocking[c_api[is_api]]

    # order: by start, origin first; ties keep unit order so fixed units stay in trace order
    order = np.argsort(start, kind="stable")
    order = np.concatenate([[0], order[order != 0]])
    newid = np.empty(len(order), np.int64)
    newid[order] = np.arange(len(order))
    kind, unit, start, obs = kind[order], unit[order], start[order], obs[order]
    corr, rid, nbytes, names, blocking = (corr[order], rid[order], nbytes[order],
                                          names[order], blocking[order])
    end = start + obs
    gpu_task = newid[1 + nc + np.arange(ng)]            # GPU row -> task id
    api_task = newid[1 + api_task_local] if api.num_rows else np.zeros(0, np.int64)

    src, dst, ek, anc, lag, bind = [], [], [], [], [], []

    def add(s, d, k, a, lg, b):
        src.append(np.asarray(s, np.int64))
        dst.append(np.asarray(d, np.int64))
        ek.append(np.full(len(src[-1]), k, np.int8))
        anc.append(np.full(len(src[-1]), a, np.int8))
        lag.append(np.asarray(lg, np.int64))
        bind.append(np.asarray(b, bool))

    # ---- thread order (CPU tasks are contiguous by construction)
    tasks_by_unit = order_by_unit(unit)
    u_sorted = unit[tasks_by_unit]
    same = u_sorted[1:] == u_sorted[:-1]
    prev_t, next_t = tasks_by_unit[:-1][same], tasks_by_unit[1:][same]
    is_cpu_edge = unit[next_t] < nthr
    p, q = prev_t[is_cpu_edge], next_t[is_cpu_edge]
    thr_prev, thr_next = p, q
    add(p, q, EK_THREAD, A_END_START, np.maximum(start[q] - end[p], 0), np.ones(len(p), bool))

    # ---- GPU constraints: stream order, launch, waits; then the lag rule
    is_gpu_edge = (unit[next_t] >= nthr) & (unit[next_t] < origin_unit)
    sp, sq = prev_t[is_gpu_edge], next_t[is_gpu_edge]
    overlap = int((start[sq] < end[sp]).sum())
    stats.add("stream_overlap", overlap, severity="warning",
              detail="GPU tasks that start before the previous task on their stream ends")

    # launch: GPU task -> its call (correlation within the trace; nsys offsets per process)
    launch_of = np.full(len(kind), -1, np.int64)
    if api.num_rows and ng:
        a_corr = _col(api, "correlation")
        ok = a_corr >= 0
        ac, at = a_corr[ok], api_task[ok]
        o = np.argsort(ac, kind="stable")
        ac, at = ac[o], at[o]
        gc = corr[gpu_task]
        pos = np.searchsorted(ac, gc)
        pos_c = np.minimum(pos, max(len(ac) - 1, 0))
        hit = (len(ac) > 0) & (gc >= 0)
        hit = hit & (ac[pos_c] == gc) if len(ac) else np.zeros(ng, bool)
        launch_of[gpu_task[hit]] = at[pos_c[hit]]
    has_launch = launch_of >= 0
    gpu_mask = (unit >= nthr) & (unit < origin_unit)
    stats.add("gpu_without_launch", int((gpu_mask & ~has_launch).sum()), severity="warning",
              detail="GPU tasks whose launching call is not in the trace; kept, anchored to "
                     "the trace start and their stream")
    # typical latencies, measured on this trace
    ln = np.flatnonzero(has_launch)
    l_lag = start[ln] - start[launch_of[ln]]
    gap_sq = start[sq] - end[sp]  # idle time on the stream before each task that has a prev
    gap = np.zeros(len(kind), np.int64)
    gap[sq] = gap_sq
    has_prev = np.zeros(len(kind), bool)
    has_prev[sq] = True
    idle = ln[~has_prev[ln] | (gap[ln] > 10_000)]
    typ_launch = _median(start[idle] - start[launch_of[idle]], DEFAULT_LAUNCH_LAG_NS)
    typ_stream = _median(gap_sq[(gap_sq >= 0) & (gap_sq < 10_000)], DEFAULT_STREAM_LAG_NS)
    stats.add("gpu_before_launch", int((l_lag < 0).sum()), severity="warning",
              detail="GPU tasks that start before their launching call (clock skew); lag 0")

    # recorded cross-stream waits (Kineto 'Stream Wait Event' records)
    w_src, w_dst = _recorded_waits(tables, corr, unit, start, gpu_task, g, g_unit, nthr,
                                   launch_of, stats)

    # candidates for each GPU task: stream prev, launch, waits
    cand_time = np.full(len(kind), np.iinfo(np.int64).min, np.int64)
    cand_kind = np.full(len(kind), -1, np.int64)

    def offer(tasks, t, k):
        _offer(cand_time, cand_kind, np.asarray(tasks, np.int64), np.asarray(t, np.int64), k)

    offer(sq, end[sp] + typ_stream, EK_STREAM)
    offer(ln, start[launch_of[ln]] + typ_launch, EK_LAUNCH)
    if len(w_src):
        offer(w_dst, end[w_src] + typ_stream, EK_WAIT)

    # inferred waits: start unexplained by every known constraint
    g_ids = np.flatnonzero(gpu_mask)
    unexplained = g_ids[(start[g_ids] - cand_time[g_ids]) > UNEXPLAINED_NS]
    i_src, i_dst = _infer_waits(unexplained, start, end, unit, g_ids, streams, nthr)
    stats.add("inferred_waits", len(i_src), severity="info",
              detail="cross-stream waits not recorded in the trace, inferred from a GPU task "
                     "starting when another stream's task ended")
    if len(i_src):
        offer(i_dst, end[i_src] + typ_stream, EK_WAIT)
        w_src = np.concatenate([w_src, i_src])
        w_dst = np.concatenate([w_dst, i_dst])

    def lagged(s, d, base, k, anchor_time):
        """Observed lag if this edge binds d, else min(typical, observed)."""
        obs_lag = start[d] - anchor_time
        b = cand_kind[d] == k
        lg = np.where(b, obs_lag, np.minimum(base, obs_lag))
        return np.maximum(lg, 0), b

    lg, b = lagged(sp, sq, typ_stream, EK_STREAM, end[sp])
    # stream order; a task that overlapped its predecessor (counted above) waits for it
    add(sp, sq, EK_STREAM, A_END_START, np.maximum(lg, 0), b)
    lg, b = lagged(launch_of[ln], ln, typ_launch, EK_LAUNCH, start[launch_of[ln]])
    add(launch_of[ln], ln, EK_LAUNCH, A_START_START, lg, b)
    if len(w_src):
        lg, b = lagged(w_src, w_dst, typ_stream, EK_WAIT, end[w_src])
        # several waits into one task: only the latest-ending one binds
        add(w_src, w_dst, EK_WAIT, A_END_START, lg, b & (end[w_src] + lg == start[w_dst]))

    # ---- launch queue: a call cannot launch into a stream holding LAUNCH_QUEUE_DEPTH
    # unfinished tasks
    q_src, q_dst, full = _queue_edges(unit, start, end, gpu_mask, launch_of)
    stats.add("launch_queue_full", full, severity="info",
              detail="launch calls made while their stream already held "
                     f"{LAUNCH_QUEUE_DEPTH} unfinished tasks (the call blocked; queue edges "
                     "use the depth the trace shows)")
    if len(q_src):
        add(q_src, q_dst, EK_QUEUE, A_END_START, np.zeros(len(q_src), np.int64),
            np.zeros(len(q_src), bool))

    # ---- synchronization: blocking call ends when the GPU task it waited for ends
    dur = obs.copy()
    s_src, s_dst = _sync_edges(tables, blocking, start, end, unit, corr, gpu_mask, streams,
                               nthr, stats)
    if len(s_src):
        tail = end[s_dst] - end[s_src]
        waited = end[s_src] > start[s_dst]
        dur[s_dst] = np.where(waited, tail, obs[s_dst])
        add(s_src, s_dst, EK_SYNC, A_END_END, np.maximum(tail, 0), waited)

    # ---- cross-thread wake-ups: a host wait ends when the task it waited for ends
    # only host time outside operators can be a wait (inside an op it is the op's own work)
    in_op = np.zeros(len(kind), bool)
    if rng.num_rows:
        r_ids = _col(rng, "range_id")
        op_by_id = np.zeros(int(r_ids.max()) + 2, bool)  # the last slot: range id -1
        # old Kineto traces record record_function markers (ProfilerStep#N, "## x ##") as
        # cpu_op too: a wait directly inside one of those is not an operator's own work
        op_by_id[r_ids] = _flag(rng, "kind", lambda k: k == "cpu_op") & ~_flag(
            rng, "name", lambda n: bool(MARKER_RE.match(n)))
        in_op = op_by_id[rid]
    k_src, k_dst, k_via = _wake_edges(kind, unit, start, end, nthr, threads,
                                      blocking | in_op)
    stats.add("wake_edges", len(k_src), severity="info",
              detail="host waits that end when a task on another thread of the process ends "
                     "or starts")
    if len(k_src):
        anchor_t = np.where(k_via, start[k_src], end[k_src])
        # the wait keeps only the tail after its wake-up; it ends at the wake-up + that tail
        dur[k_dst] = end[k_dst] - np.maximum(start[k_dst], anchor_t)
        e_end = ~k_via
        add(k_src[e_end], k_dst[e_end], EK_WAKE, A_END_END,
            end[k_dst[e_end]] - end[k_src[e_end]], np.ones(int(e_end.sum()), bool))
        # woken by a start: the waiting task's successor on its thread starts from that start
        nxt = np.full(len(kind), -1, np.int64)
        nxt[thr_prev] = thr_next
        w = np.flatnonzero(k_via & (nxt[k_dst] >= 0))
        s_, d_ = k_src[w], nxt[k_dst[w]]
        add(s_, d_, EK_WAKE, A_START_START, start[d_] - start[s_], np.ones(len(w), bool))
        dur[k_dst[w]] = 0

    # ---- a thread's first task: woken by what just happened on another thread of its process
    f_src, f_dst, f_via = _first_task_triggers(kind, unit, start, end, nthr, threads)
    stats.add("thread_start_edges", len(f_src), severity="info",
              detail="threads whose first task follows an event on another thread of the "
                     "process (within FIRST_WAKE_TOL_NS), tied to it instead of to the trace "
                     "start")
    for via_start, anchor in ((False, A_END_START), (True, A_START_START)):
        m = f_via == via_start
        if m.any():
            t_src = start[f_src[m]] if via_start else end[f_src[m]]
            add(f_src[m], f_dst[m], EK_WAKE, anchor, start[f_dst[m]] - t_src,
                np.ones(int(m.sum()), bool))

    # ---- origin: every task without a predecessor hangs off the trace start
    all_dst = np.concatenate(dst) if dst else np.zeros(0, np.int64)
    has_pred = np.zeros(len(kind), bool)
    has_pred[all_dst] = True
    roots = np.flatnonzero(~has_pred)
    roots = roots[roots != 0]
    add(np.zeros(len(roots), np.int64), roots, EK_ORIGIN, A_END_START, start[roots] - t0,
        np.ones(len(roots), bool))

    unit_kind = ["thread"] * nthr + ["stream"] * len(streams) + ["thread"]
    unit_pid = [int(x) for x in threads[:, 0]] + [None] * len(streams) + [None]
    unit_tid = [int(x) for x in threads[:, 1]] + [None] * len(streams) + [None]
    unit_device = [None] * nthr + [int(x) for x in streams[:, 0]] + [None]
    unit_stream = [None] * nthr + [int(x) for x in streams[:, 1]] + [None]
    unit_name = ([f"thread {p}:{t}" for p, t in threads] +
                 [f"gpu {d} stream {s}" for d, s in streams] + ["origin"])
    return Graph(kind=kind, unit=unit, start_ns=start, obs_dur_ns=obs, dur_ns=dur,
                 name_code=names, name_vocab=pool.vocab(), bytes_=nbytes, correlation=corr,
                 range_id=rid, blocking=blocking,
                 src=np.concatenate(src), dst=np.concatenate(dst), ekind=np.concatenate(ek),
                 anchor=np.concatenate(anc), lag_ns=np.concatenate(lag),
                 binding=np.concatenate(bind), unit_kind=unit_kind, unit_pid=unit_pid,
                 unit_tid=unit_tid, unit_device=unit_device, unit_stream=unit_stream,
                 unit_name=unit_name, stats=stats)


@numba.njit(cache=True)
def _offer(cand_time, cand_kind, tasks, t, k):
    """Constraint ``k`` offers start times ``t`` to ``tasks``: each task keeps the latest
    offer (of this call and earlier ones), and the kind that made it (a tie keeps the
    earlier kind)."""
    for i in range(tasks.shape[0]):
        j = tasks[i]
        if t[i] > cand_time[j]:
            cand_time[j] = t[i]
            cand_kind[j] = k


def order_by_unit(unit: np.ndarray) -> np.ndarray:
    """Task ids grouped by unit, in id order within a unit (a stable sort; a radix sort when
    the unit ids fit 16 bits, as they nearly always do)."""
    if len(unit) and int(unit.max()) < 65536 and int(unit.min()) >= 0:
        return np.argsort(unit.astype(np.uint16), kind="stable")
    return np.argsort(unit, kind="stable")


def _queue_edges(unit, start, end, gpu_mask, launch_of):
    """Edges end(i) -> start(call launching j) for every LAUNCH_QUEUE_STRIDE-th launched task
    j of a stream, where i is the task ``depth`` places before j on that stream. ``depth`` is
    LAUNCH_QUEUE_DEPTH, or one more than the most unfinished tasks the stream held at any
    launch in the trace, so every edge holds in the trace (it never binds a baseline replay).
    Returns (src, dst, launches that found their stream full)."""
    g_ids = np.flatnonzero(gpu_mask)
    by_stream = g_ids[order_by_unit(unit[g_ids])]  # ids ascend within a stream
    u = unit[by_stream]
    cuts = np.flatnonzero(np.r_[True, u[1:] != u[:-1], True])
    src, dst, full = [], [], 0
    for a, b in zip(cuts[:-1], cuts[1:], strict=False):
        ids = by_stream[a:b]
        if len(ids) <= LAUNCH_QUEUE_DEPTH - LAUNCH_QUEUE_STRIDE:
            continue
        call = launch_of[ids]
        j = np.flatnonzero(call >= 0)
        t_call = start[call[j]]
        done_by = np.searchsorted(np.maximum.accumulate(end[ids]), t_call, side="right")
        open_ = np.maximum(j - done_by, 0)  # earlier tasks of the stream not yet finished
        full += int((open_ >= LAUNCH_QUEUE_DEPTH).sum())
        depth = max(LAUNCH_QUEUE_DEPTH, int(open_.max(initial=0)) + 1)
        k = j[(j % LAUNCH_QUEUE_STRIDE == 0) & (j >= depth)]
        src.append(ids[k - depth])
        dst.append(launch_of[ids[k]])
    if not src:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), full
    src, dst = np.concatenate(src), np.concatenate(dst)
    return src, dst, full


def _first_task_triggers(kind, unit, start, end, nthr, threads):
    """For each thread whose first task starts within FIRST_WAKE_TOL_NS after a task on another
    thread of its process ended (or after a long host task there started: the caller going
    to wait, as backward() wakes the autograd thread), that task: (src, first task, via_start).
    Without it the first task would hang off the trace start at its observed offset, and a
    what-if that makes the work before it faster could not move it."""
    empty = np.zeros(0, np.int64)
    if nthr < 2:
        return empty, empty, np.zeros(0, bool)
    src, dst, via = _first_triggers(kind, unit, start, end, nthr,
                                    np.ascontiguousarray(threads[:, 0], np.int64))
    return src, dst, via


@numba.njit(cache=True)
def _first_triggers(kind, unit, start, end, nthr, pid):
    """_first_task_triggers over the tasks (ids in start order, 0 the origin): one scan per
    thread head. Of the candidates in a pass the latest event wins, the lowest id among ties;
    a wait beginning (via_start) wins a tie with an end."""
    n = unit.shape[0]
    head = np.full(nthr, -1, np.int64)
    for i in range(1, n):
        u = unit[i]
        if u < nthr and head[u] < 0:
            head[u] = i
    src = np.empty(nthr, np.int64)
    dst = np.empty(nthr, np.int64)
    via = np.empty(nthr, np.bool_)
    k = 0
    for uf in range(nthr):
        f = head[uf]
        if f < 0:
            continue
        t = start[f]
        lo = t - FIRST_WAKE_TOL_NS
        pf = pid[uf]
        best, best_t, best_via = -1, np.int64(-1), False
        for use_start in (False, True):
            j, jt = -1, np.int64(0)
            for i in range(1, n):
                u = unit[i]
                if u >= nthr or u == uf or pid[u] != pf:
                    continue
                if use_start:
                    if start[i] >= t:
                        break  # ids are in start order
                    if kind[i] != KIND_HOST or end[i] - start[i] < MIN_WAIT_NS:
                        continue
                    ev = start[i]
                else:
                    ev = end[i]
                if ev < t and ev >= lo and (j < 0 or ev > jt):
                    j, jt = i, ev
            if j >= 0 and (jt > best_t or (use_start and jt == best_t)):
                best, best_t, best_via = j, jt, use_start
        if best >= 0:
            src[k] = best
            dst[k] = f
            via[k] = best_via
            k += 1
    return src[:k], dst[:k], via[:k]


def _wake_edges(kind, unit, start, end, nthr, threads, blocking):
    """Long host tasks on one thread that end just after something happened on another thread
    of the same process: a task there ended (the main thread blocked in backward() until the
    autograd thread's last op), or started (the autograd thread idle until backward() was
    called). Returns (waited-for task, waiting host task, via_start) arrays. Times strictly
    increase along these links, so they can close no cycle."""
    empty = np.zeros(0, np.int64)
    if nthr < 2:
        return empty, empty, np.zeros(0, bool)
    cpu = np.flatnonzero(unit < nthr)
    cpu = cpu[cpu > 0]
    if not len(cpu):
        return empty, empty, np.zeros(0, bool)
    pid_of_unit = np.full(int(unit.max()) + 1, -1, np.int64)
    pid_of_unit[:nthr] = threads[:, 0]
    # the CPU tasks by end (ids are in start order, so by start they are sorted already)
    by_end = cpu[np.argsort(end[cpu], kind="stable")]
    return _wake(kind, unit, start, end, blocking, cpu, by_end, pid_of_unit)


@numba.njit(cache=True, inline="always")
def _lower_bound(a, v, hint):
    """np.searchsorted(a, v) (side left) for sorted ``a``, galloping out from ``hint``: fast
    when successive queries lie close together, as event times in time order do."""
    n = a.shape[0]
    h = min(max(hint, 0), n)
    if h > 0 and a[h - 1] >= v:  # the answer is at most h - 1
        hi = h - 1
        step = 1
        lo = hi - step
        while lo > 0 and a[lo] >= v:
            hi = lo
            step *= 2
            lo = hi - step
        lo = max(lo, 0)
    else:  # the answer is at least h
        lo = h
        step = 1
        hi = lo + step
        while hi < n and a[hi] < v:
            lo = hi + 1
            step *= 2
            hi = lo + step
        hi = min(hi, n)
    while lo < hi:  # a[hi] >= v or hi == n; everything before lo is < v
        mid = (lo + hi) >> 1
        if a[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(cache=True)
def _wake(kind, unit, start, end, blocking, cpu, by_end, pid_of_unit):
    """_wake_edges' search: for each wait, the latest of the last 8 task ends before its end
    (in (end, id) order) that qualifies, else the latest of the last 8 starts of long host
    tasks."""
    nc = cpu.shape[0]
    ends = np.empty(nc, np.int64)
    for i in range(nc):
        ends[i] = end[by_end[i]]
    # long host tasks (the waits and the start events), in id = start order
    longs = np.empty(nc, np.int64)
    nl = 0
    for i in range(nc):
        c = cpu[i]
        if kind[c] == KIND_HOST and end[c] - start[c] >= MIN_WAIT_NS:
            longs[nl] = c
            nl += 1
    longs = longs[:nl]
    starts = np.empty(nl, np.int64)
    for i in range(nl):
        starts[i] = start[longs[i]]
    src = np.empty(nl, np.int64)
    dst = np.empty(nl, np.int64)
    via = np.empty(nl, np.bool_)
    k = 0
    hint = np.zeros(2, np.int64)  # the waits come in start order: search near the last one
    for i in range(nl):
        w = longs[i]
        if blocking[w]:
            continue
        ew, sw, uw = end[w], start[w], unit[w]
        pw = pid_of_unit[uw]
        found = -1
        found_start = False
        for use_start in (False, True):
            if use_start:
                ys, yt = longs, starts
            else:
                ys, yt = by_end, ends
            pos = _lower_bound(yt, ew, hint[int(use_start)])
            hint[int(use_start)] = pos
            pos -= 1  # the last event before the wait's end
            for back in range(8):
                p = pos - back
                if p < 0:
                    break
                y = ys[p]
                ty = yt[p]
                if (unit[y] != uw and pid_of_unit[unit[y]] == pw
                        and ty >= ew - WAKE_TOL_NS and ty > sw and ty < ew):
                    found = y
                    found_start = use_start
                    break
            if found >= 0:
                break
        if found >= 0:
            src[k] = found
            dst[k] = w
            via[k] = found_start
            k += 1
    return src[:k], dst[:k], via[:k]


def _range_names(pool: _NamePool, rng: pa.Table, range_ids: np.ndarray) -> np.ndarray:
    """Name codes of host tasks: their innermost range's name, "<host>" outside every range."""
    host = pool.add(np.zeros(1, np.int64), np.array(["<host>"], object))[0]
    if not rng.num_rows:
        return np.full(len(range_ids), host, np.int64)
    names = pool.add(*_dict(rng))
    ids = _col(rng, "range_id")
    # one slot more than the ids: range id -1 (none) reads it
    lookup = np.full(int(ids.max()) + 2 if len(ids) else 1, host, np.int64)
    lookup[ids] = names
    return lookup[range_ids]


def _sync_edges(tables, blocking, start, end, unit, corr, gpu_mask, streams, nthr,
                stats: Stats):
    """Blocking call -> the GPU task it waited for (the latest-ending GPU task that ended
    inside the call). Where the trace has sync records, the waited stream narrows the search."""
    calls = np.flatnonzero(blocking)
    if not len(calls) or not gpu_mask.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    g = np.flatnonzero(gpu_mask)
    # stream restriction from sync records, by the call's correlation
    sync = tables["sync"]
    call_stream_unit = np.full(len(calls), -1, np.int64)
    if sync.num_rows:
        s_corr = _col(sync, "correlation")
        s_stream = _col(sync, "stream")
        s_kind = _names(sync, "sync_kind")
        s_wstream = _col(sync, "wait_on_stream")
        s_dev = _col(sync, "device")
        key_unit = _stream_units(streams, nthr)
        wanted = np.where(s_kind == "stream_sync", s_stream,
                          np.where(s_kind == "event_sync", s_wstream, -1))
        c_corr = corr[calls]
        o = np.argsort(s_corr, kind="stable")
        pos = np.searchsorted(s_corr[o], c_corr)
        pos_c = np.minimum(pos, len(o) - 1)
        hit = s_corr[o][pos_c] == c_corr
        for i in np.flatnonzero(hit):
            r = o[pos_c[i]]
            if wanted[r] >= 0:
                call_stream_unit[i] = key_unit.get((int(s_dev[r]), int(wanted[r])),
                                                   key_unit.get((-1, int(wanted[r])), -1))
    # latest-ending GPU task with end <= call end, among GPU tasks launched before the call
    # ends (or by it); per stream where the record says which
    ge = end[g]
    o = np.argsort(ge, kind="stable")
    g_sorted, ge_sorted = g[o], ge[o]
    pos = np.searchsorted(ge_sorted, end[calls], side="right") - 1
    src = np.where(pos >= 0, g_sorted[np.maximum(pos, 0)], -1)
    restricted = np.flatnonzero(call_stream_unit >= 0)
    if len(restricted):
        gu = unit[g_sorted]
        for u in np.unique(call_stream_unit[restricted]):
            sel = gu == u
            ends_u = ge_sorted[sel]
            ids_u = g_sorted[sel]
            ci = restricted[call_stream_unit[restricted] == u]
            p = np.searchsorted(ends_u, end[calls[ci]], side="right") - 1
            src[ci] = np.where(p >= 0, ids_u[np.maximum(p, 0)], -1)
    ok = src >= 0
    ok &= end[np.maximum(src, 0)] > start[calls]
    stats.add("blocking_calls", len(calls), severity="info",
              detail="calls that may wait for GPU work (syncs, copies, frees)")
    stats.add("sync_edges", int(ok.sum()), severity="info",
              detail="blocking calls linked to the GPU task they waited for")
    return src[ok].astype(np.int64), calls[ok].astype(np.int64)


def _stream_units(streams: np.ndarray, nthr: int) -> dict:
    """(device, stream) -> unit id, as build() numbered the stream units (after the threads);
    (-1, stream) finds a stream when a record names no device."""
    out = {}
    for i, (d, st) in enumerate(streams):
        out[(int(d), int(st))] = nthr + i
        out.setdefault((-1, int(st)), nthr + i)
    return out


def _recorded_waits(tables, corr, unit, start, gpu_task, g, g_unit, nthr, launch_of,
                    stats: Stats):
    """Kineto 'Stream Wait Event': the last GPU task on the recording stream launched before the
    cudaEventRecord -> the first GPU task on the waiting stream launched after the wait call."""
    sync = tables["sync"]
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    if not sync.num_rows:
        return empty
    kinds = _names(sync, "sync_kind")
    w = np.flatnonzero(kinds == "stream_wait_event")
    if not len(w):
        return empty
    dev = _col(sync, "device", 0)[w]
    stream = _col(sync, "stream")[w]
    wstream = _col(sync, "wait_on_stream")[w]
    rec_corr = _col(sync, "wait_on_event_record_correlation")[w]
    wait_corr = _col(sync, "correlation")[w]
    gcorr = g["corr"]
    src, dst = [], []
    unresolved = 0
    for i in range(len(w)):  # one per recorded wait: few per iteration
        on_rec = (g["device"] == dev[i]) & (g["stream"] == wstream[i]) & (gcorr >= 0) & \
            (gcorr < rec_corr[i])
        on_wait = (g["device"] == dev[i]) & (g["stream"] == stream[i]) & \
            (gcorr > wait_corr[i])
        if rec_corr[i] < 0 or not on_rec.any() or not on_wait.any():
            unresolved += 1
            continue
        s_row = np.flatnonzero(on_rec)[np.argmax(gcorr[on_rec])]
        d_row = np.flatnonzero(on_wait)[np.argmin(gcorr[on_wait])]
        src.append(gpu_task[s_row])
        dst.append(gpu_task[d_row])
    stats.add("stream_waits_unresolved", unresolved, severity="info",
              detail="recorded stream waits whose recorded or waiting work is not in the trace")
    if not src:
        return empty
    return np.array(src, np.int64), np.array(dst, np.int64)


def _infer_waits(tasks, start, end, unit, g_ids, streams, nthr):
    """For GPU tasks whose start nothing explains: a task on another stream of the same device
    that ended within WAIT_TOL_NS before it started."""
    if not len(tasks):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    dev_of_unit = np.full(int(unit.max()) + 1, -1, np.int64)
    dev_of_unit[nthr:nthr + len(streams)] = streams[:, 0]
    ge = end[g_ids]
    o = np.lexsort((ge, dev_of_unit[unit[g_ids]]))
    gs, gd, gend = g_ids[o], dev_of_unit[unit[g_ids]][o], ge[o]
    # device-major, then end time relative to the earliest end
    base = int(gend.min()) if len(gend) else 0
    key = gd * (1 << 50) + (gend - base)
    q = dev_of_unit[unit[tasks]] * (1 << 50) + (start[tasks] - base)
    pos = np.searchsorted(key, q, side="right") - 1
    return _walk_back(tasks.astype(np.int64), pos, start, unit, dev_of_unit, gs, gd, gend)


@numba.njit(cache=True)
def _walk_back(tasks, pos, start, unit, dev_of_unit, gs, gd, gend):
    """_infer_waits' search: from the last GPU end at or before each task's start on its
    device, walk back over candidates on the task's own stream (a few at most) to the first
    task of another stream that ended within WAIT_TOL_NS."""
    src = np.empty(tasks.shape[0], np.int64)
    dst = np.empty(tasks.shape[0], np.int64)
    k = 0
    for j in range(tasks.shape[0]):
        p = pos[j]
        t = tasks[j]
        d = dev_of_unit[unit[t]]
        while p >= 0 and gd[p] == d and start[t] - gend[p] <= WAIT_TOL_NS:
            if unit[gs[p]] != unit[t]:
                src[k] = gs[p]
                dst[k] = t
                k += 1
                break
            p -= 1
    return src[:k], dst[:k]
