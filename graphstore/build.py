"""Activity tables of one trace -> the dependency graph (task, edge, unit tables).

Outline (each step set-based over numpy columns; the one per-thread sweep is compiled):
  1. units: every CPU thread with calls or ranges, every (device, stream) with GPU work, and an
     ``origin`` unit holding one zero-length task at the trace's start; after it, a lane unit
     for each parallel branch of a CUDA graph launch seen on a stream (``_graph_lanes``);
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

import numpy as np
import pyarrow as pa

from daydream.base import occupancy
from daydream.base.columns import is_in, matching, numpy_filled
from daydream.base.compiled import helper, kernel
from daydream.graphstore import calls
from daydream.graphstore.latency import LATENCY, LAUNCH_QUEUE_DEPTH, Latency
from daydream.graphstore.schema import EDGE_ANCHORS, EDGE_KINDS, TASK_KINDS
from daydream.ingest.nesting import thread_key
from daydream.ingest.stats import Stats

CPU_RANGE_KINDS = ("cpu_op", "user_annotation", "python_function", "nvtx", "module")

# record_function markers that are no operator: the profiler's step and "## name ##" notes
MARKER_RE = re.compile(r"^ProfilerStep#\d+$|^## .* ##$")


def is_comm_name(name: str) -> bool:
    """Whether a kernel's name is a collective's: it holds ``nccl`` or ``rccl``, in any case.
    Tested as substrings of the lowered name, a tenth of the time of a case-blind regular
    expression over a small trace's 355 distinct kernel names (0.05 against 0.5 ms)."""
    low = name.lower()
    return "nccl" in low or "rccl" in low


# Integer codes of the kind, ekind and anchor columns: positions in the schema's vocabularies
# (graphstore.load names them by indexing those tuples).
KIND_API, KIND_HOST, KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, KIND_COMM = (
    TASK_KINDS.index(k) for k in ("api", "host", "kernel", "memcpy", "memset", "comm"))
EK_THREAD, EK_STREAM, EK_LAUNCH, EK_SYNC, EK_WAIT, EK_ORIGIN, EK_WAKE, EK_QUEUE, EK_CONTENTION = (
    EDGE_KINDS.index(k) for k in ("thread", "stream", "launch", "sync", "wait", "origin", "wake",
                                  "queue", "contention"))
A_END_START, A_START_START, A_END_END = (
    EDGE_ANCHORS.index(a) for a in ("end_start", "start_start", "end_end"))

# A GPU task whose start is this much later than every constraint at its physical latency
# is looked at for an unrecorded cross-stream wait (the other stream's task must have ended
# within WAIT_TOL_NS before it); one that stays unexplained is unexplained GPU idle slack.
# The tolerance is an estimate: a wait on another stream resolves through an event record
# queued behind the awaited task and the waiting stream's front end, each a few stream
# latencies (1 us, graphstore.latency) and the record's own command. 3 us missed TorchRec's
# optimizer kernels that start 4-7 us after the NCCL kernel they wait for.
UNEXPLAINED_NS = 5_000
WAIT_TOL_NS = 10_000
# A kernel that could not start because another stream's kernel filled the SMs starts as that
# kernel's last wave drains: within DRAIN_BLOCKS of its mean thread-block run times before its
# end (``base.occupancy.block_ns``: its duration over its waves), and never less than
# CONTENTION_TAIL_NS before it, the window for a kernel whose launch geometry or device the
# trace lacks (estimate: blocks of the long kernels in these traces run for tens of
# microseconds). DRAIN_BLOCKS from the calibration traces (bench/calibrate_drain.py, manifest
# fit "contention.drain"): the late kernels there that one filling kernel held began 1.74,
# 1.77 and 1.92 of its block times before its end (blocks of one kernel do not all run
# equally long).
CONTENTION_TAIL_NS = 100_000
DRAIN_BLOCKS = 2
# A stretch of a thread with nothing traced in it, while GPU work it launched runs, longer than
# this, is untraced slack (_untraced_gaps): the same line bench/bounds.py draws between a
# thread's own work and waiting (its GAP_NS: host work between operators up to it, waiting
# beyond; tests/graphstore/test_polling.py holds the two equal).
UNTRACED_GAP_NS = 100_000
# A stretch of host time at least this long that ends within WAKE_TOL_NS after a task on another
# thread of the process ended is taken as that thread waiting for the other (the autograd
# thread idle until backward() is called, the main thread blocked until backward is done).
MIN_WAIT_NS = 20_000
WAKE_TOL_NS = 500_000
# A thread's first task is tied to an event on another thread of its process at most this long
# before it (the autograd thread's first op ~0.5 ms after backward() was called).
FIRST_WAKE_TOL_NS = 1_000_000
# An enqueue call counts as blocked by a full queue when its stream held at least its depth
# less this many unfinished slots as it began and a task of them ended inside it (the trace's
# own depth can sit a few commands below LAUNCH_QUEUE_DEPTH: event records take slots too).
QUEUE_BLOCK_SPAN = 64
# A launch whose GPU work ran after the window (not in the trace) and that ended at most this
# long after a task of the stream its thread last launched to ended counts as released by that
# task (a full queue freeing a slot): the calls whose releasing task the trace shows end 5 us
# (median) and at most 81 us after it on hta/resnet50_v100_rank0, which has no unseen launches.
UNSEEN_RELEASE_TOL_NS = 100_000


@dataclass
class Graph:
    """Columnar graph of one trace, task ids dense in start order."""

    # tasks
    kind: np.ndarray        # int8
    unit: np.ndarray        # int32
    start_ns: np.ndarray    # int64, observed
    obs_dur_ns: np.ndarray  # int64
    dur_ns: np.ndarray      # int64, for the simulator: the task's own cost
    task_slack_ns: np.ndarray  # int64: waiting inside the task no edge models (peer waits)
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
    lag_ns: np.ndarray      # int64: the physical latency (graphstore.latency)
    slack_ns: np.ndarray    # int64: observed delay beyond it (signed; 0 on most edges)
    binding: np.ndarray     # bool
    inferred: np.ndarray    # bool: inferred from a coincidence of times, not read
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
        """The task names as an Arrow dictionary column over the names tasks use: the Parquet
        writer stores names as a dictionary anyway, and one string per task (150 MB on a
        million-task graph) would only be hashed back into one."""
        used = np.bincount(self.name_code, minlength=len(self.name_vocab)) > 0
        remap = np.cumsum(used, dtype=np.int32) - 1
        return pa.DictionaryArray.from_arrays(
            pa.array(remap[self.name_code]),
            pa.array(self.name_vocab[used], pa.string()))


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
    return numpy_filled(t[name], fill).astype(np.int64)


def _dict(t: pa.Table, name: str = "name") -> tuple[np.ndarray, np.ndarray]:
    """(codes, distinct values as an object array) of a string column; null -> ''."""
    col = t[name].combine_chunks() if t.num_rows else pa.array([], pa.string())
    if not pa.types.is_dictionary(col.type):
        col = col.cast(pa.string()).dictionary_encode()
    values = np.asarray(col.dictionary.to_pylist() + [""], dtype=object)
    codes = numpy_filled(col.indices, len(values) - 1)
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


# ---- CPU side: one compiled sweep per thread ----------------------------------------------------

@helper(inline="always")
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


@kernel("int64", "int64[::1]", "int64[::1]", "int64[::1]", "int64[::1]", "int64[::1]",
        "int64[::1]", "int64[::1]", "int64[::1]", "int32[::1]", "int8[::1]", "int64[::1]",
        "int64[::1]", "int64[::1]", "int64[::1]", "int64[::1]")
def _cpu_sweep(thr_off_api, a_start, a_end, a_row, thr_off_rng, r_start, r_end, r_id,
               o_thread, o_kind, o_start, o_end, o_range, o_api, api_task):
    """Cut each thread's time into api tasks and host tasks.

    Per thread t: calls a_*[thr_off_api[t]:thr_off_api[t+1]] sorted by start (a_row: each
    one's row in the api table), ranges r_*[thr_off_rng[t]:...] sorted by (start, -end). Writes
    tasks into o_* (o_api: the api row of a call's task, -1 for host time) and returns their
    count. api_task[row] is the task of that call (a call nested inside another maps to the
    outer)."""
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
                k = _emit(out, k, t, 0, na, end, label, a_row[ai])
                api_task[a_row[ai]] = task
                ai += 1
                while ai < a1 and a_start[ai] < end:
                    api_task[a_row[ai]] = task  # nested call (driver call inside runtime call)
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


def _thread_order(c_thr, c_start, c_end, cpu_id, unit, nthr):
    """Thread edges (prev, next task, next's start - prev's end) in (thread, id) order. The
    sweep writes each thread's tasks in time order, threads in unit order, so consecutive rows
    of one thread are its edges; where ids did not rise along them (never seen), they come
    from a sort of all tasks by unit instead."""
    same = c_thr[1:] == c_thr[:-1]
    prev, nxt = cpu_id[:-1][same], cpu_id[1:][same]
    if (nxt > prev).all():
        return prev, nxt, (c_start[1:] - c_end[:-1])[same]
    by_unit = order_by_unit(unit)
    u = unit[by_unit]
    same = (u[1:] == u[:-1]) & (u[1:] < nthr)
    prev, nxt = by_unit[:-1][same], by_unit[1:][same]
    start = np.empty(len(unit), np.int64)
    end = np.empty(len(unit), np.int64)
    start[cpu_id], end[cpu_id] = c_start, c_end
    return prev, nxt, start[nxt] - end[prev]


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
    off[1:] = np.bincount(keys_sorted, minlength=n_groups)
    return np.cumsum(off)


def _cpu_tasks(api: pa.Table, rng: pa.Table, stats: Stats):
    """Threads, CPU tasks and the task of each call."""
    a_pid, a_tid = _col(api, "pid"), _col(api, "tid")
    a_start = _col(api, "start_ns")
    a_end = a_start + _col(api, "dur_ns")
    cpu = is_in(rng["kind"], CPU_RANGE_KINDS) if rng.num_rows else np.zeros(0, bool)
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
    o_thread = np.empty(cap, np.int32)
    o_kind = np.empty(cap, np.int8)
    o_start = np.empty(cap, np.int64)
    o_end = np.empty(cap, np.int64)
    o_range = np.empty(cap, np.int64)
    o_api = np.empty(cap, np.int64)
    api_task = np.full(len(a_start), -1, np.int64)
    k = _cpu_sweep(_group_offsets(a_thr[ao], nthr), a_start[ao], a_end[ao], ao,
                   _group_offsets(r_thr[ro], nthr), r_start[ro], r_end[ro], r_id[ro],
                   o_thread, o_kind, o_start, o_end, o_range, o_api, api_task)
    nested = int(len(a_start) - (o_kind[:k] == 0).sum())
    stats.add("nested_calls_merged", nested, severity="info",
              detail="calls inside another call on the same thread (driver inside runtime); "
                     "their GPU work is launched by the outer call's task")
    return threads, (o_thread[:k], o_kind[:k], o_start[:k], o_end[:k], o_range[:k], o_api[:k]), \
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


def build(tables: dict[str, pa.Table], latency: dict[str, Latency] | None = None,
          devices: list[dict] | None = None) -> Graph:
    """Build the graph of one trace from its activity tables. ``latency``: the edge latencies
    (graphstore.latency.LATENCY by default; the accuracy suite passes constants fitted
    without the trace being judged); ``devices``: the trace's device properties (Kineto's
    deviceProperties), which size each kernel's last wave for contention edges."""
    latency = LATENCY if latency is None else latency
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
            is_comm = np.array([is_comm_name(v) for v in vocab], bool)[codes]
            kind[coll | is_comm] = KIND_COMM
        nbytes = _col(t, "bytes") if "bytes" in t.column_names else np.full(t.num_rows, -1)
        if tname == "kernel":
            # collectives: message bytes per rank from the NCCL args where the trace has them
            nbytes = _message_bytes(t)
        blk_async, blk_sync = _copy_blocks(t) if tname == "memcpy" else (
            np.zeros(t.num_rows, np.int64), np.zeros(t.num_rows, np.int64))
        device, dur_ns = _col(t, "device", 0), _col(t, "dur_ns")
        drain = (_drain_ns(t, device, dur_ns, devices) if tname == "kernel"
                 else np.full(t.num_rows, CONTENTION_TAIL_NS, np.int64))
        parts.append(dict(kind=kind, device=device, stream=_col(t, "stream", 0),
                          start=_col(t, "start_ns"), dur=dur_ns,
                          corr=_col(t, "correlation"), name=pool.add(codes, vocab),
                          bytes=nbytes, blk_async=blk_async, blk_sync=blk_sync, drain=drain))
    if parts:
        g = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    else:
        g = {k: np.zeros(0, np.int64) for k in ("kind", "device", "stream", "start", "dur",
                                                 "corr", "bytes", "name", "blk_async",
                                                 "blk_sync", "drain")}
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
    start = np.concatenate([[t0], c_start, g["start"]]).astype(np.int64)
    # order: by start, origin first; ties keep unit order so fixed units stay in trace order
    order = np.argsort(start, kind="stable")
    if order[0] != 0:  # t0 is the earliest start, so the stable sort puts the origin first
        order = np.concatenate([[0], order[order != 0]])
    n = len(order)
    newid = np.empty(n, np.int64)
    newid[order] = np.arange(n)
    start = start[order]
    cpu_id, gpu_task = newid[1:1 + nc], newid[1 + nc:]  # CPU / GPU row -> task id

    def placed(dtype, origin, cpu_col, gpu_col):
        """A task column written straight into task order (no concatenated copy to permute)."""
        out = np.empty(n, dtype)
        out[0] = origin
        out[cpu_id] = cpu_col
        out[gpu_task] = gpu_col
        return out

    kind = placed(np.int8, KIND_HOST, c_kind, g["kind"])
    unit = placed(np.int32, origin_unit, c_thr, nthr + g_unit)
    obs = placed(np.int64, 0, c_end - c_start, g["dur"])
    rid = placed(np.int64, -1, c_range, -1)
    nbytes = placed(np.int64, -1, -1, g["bytes"])
    # names: a host task's is its innermost range's, a call task's its call's (set below)
    names = placed(np.int64, origin_name[0], _range_names(pool, rng)[c_range], g["name"])
    corr = placed(np.int64, -1, -1, g["corr"])
    if api.num_rows:
        is_api = c_kind == KIND_API  # the tasks with an api row (c_api >= 0)
        api_ids, api_rows = cpu_id[is_api], c_api[is_api]
        corr[api_ids] = _col(api, "correlation")[api_rows]
        names[api_ids] = api_names[api_rows]
    # what each call can wait for (graphstore.calls)
    vocab = pool.vocab()
    wclass = (np.where(kind == KIND_API, _by_call_name(calls.wait_class, vocab, names, kind,
                                                       np.int8)[names],
                       np.int8(calls.WAIT_NONE)) if api.num_rows
              else np.full(n, calls.WAIT_NONE, np.int8))
    end = start + obs
    api_task = newid[1 + api_task_local] if api.num_rows else np.zeros(0, np.int64)

    edges = _Edges()
    dur = obs.copy()
    L = {k: v.ns for k, v in latency.items()}

    # ---- thread order (CPU tasks are contiguous by construction: no latency, no slack)
    thr_prev, thr_next, thr_gap = _thread_order(c_thr, c_start, c_end, cpu_id, unit, nthr)
    edges.add(thr_prev, thr_next, EK_THREAD, A_END_START, L["thread"], thr_gap - L["thread"],
              True)
    # the sweep's columns are placed: their memory (37 MB on a 1M-event trace) can take the
    # arrays made below, which a fresh process would otherwise fault in page by page
    del cpu, c_thr, c_kind, c_start, c_end, c_range, c_api, order, thr_gap

    # ---- GPU constraints: stream order, launch, waits; the latest one binds
    gpu_mask = (unit >= nthr) & (unit < origin_unit)
    per_stream = _stream_tasks(unit, gpu_mask)
    sp = np.concatenate([ids[:-1] for ids in per_stream.values()] + [np.zeros(0, np.int64)])
    sq = np.concatenate([ids[1:] for ids in per_stream.values()] + [np.zeros(0, np.int64)])
    overlap = start[sq] < end[sp]
    stats.add("stream_overlap", int(overlap.sum()), severity="warning",
              detail="GPU tasks that start before the previous task on their stream ends")
    # graph lanes: the nodes of one CUDA graph launch that ran side by side on their stream
    lanes = _graph_lanes(per_stream, np.unique(unit[sq[overlap]]), start, end, corr) if (
        overlap.any()) else None
    if lanes is not None:
        keep = ~np.isin(unit[sq], lanes.streams)
        sp, sq = np.r_[sp[keep], lanes.src], np.r_[sq[keep], lanes.dst]
        stats.add("graph_lanes", len(lanes.task), severity="info",
                  detail="GPU tasks of one graph launch (one correlation id) that ran beside "
                         "another of its nodes on their stream: run on a lane unit of the "
                         "stream, after the nodes of the stream that ended before they began")
    several = (EK_WAIT,) if lanes is None else (EK_WAIT, EK_STREAM)
    launch_of = _launches(api, api_task, corr, gpu_task, len(kind))
    has_launch = launch_of >= 0
    stats.add("gpu_without_launch", int((gpu_mask & ~has_launch).sum()), severity="warning",
              detail="GPU tasks whose launching call is not in the trace (launched before the "
                     "window, or by an untraced thread): bound by their stream predecessor, "
                     "the gap its slack")
    ln = np.flatnonzero(has_launch)
    stats.add("gpu_before_launch", int((start[ln] < start[launch_of[ln]]).sum()),
              severity="warning", detail="GPU tasks that start before their launching call "
                                         "(clock skew)")
    w_src, w_dst = _recorded_waits(tables, corr, unit, start, gpu_task, g, g_unit, nthr,
                                   launch_of, stats)

    # the earliest start each constraint allows, at its physical latency; the latest wins
    cand_time = np.full(len(kind), np.iinfo(np.int64).min, np.int64)
    cand_kind = np.full(len(kind), -1, np.int8)  # an edge kind, -1: none yet

    def offer(tasks, t, k):
        _offer(cand_time, cand_kind, np.asarray(tasks, np.int64), np.asarray(t, np.int64), k)

    # a blocking copy's call enqueues its copy and then waits for it: the copy may start
    # once the call has begun (start_start); every other launch as its call returns
    copy_mode = _copy_mode(n, names, vocab, launch_of, gpu_task, g, kind)
    ss = copy_mode[ln] != calls.BLOCK_NONE
    l_anchor = np.where(ss, start[launch_of[ln]], end[launch_of[ln]])
    offer(sq, end[sp] + L["stream"], EK_STREAM)
    offer(ln, l_anchor + L["launch"], EK_LAUNCH)
    if len(w_src):
        offer(w_dst, end[w_src] + L["wait"], EK_WAIT)
    o_src, o_dst = _call_order_waits(tables, kind, unit, start, end, corr, names, vocab,
                                     launch_of, gpu_mask, stats)
    if len(o_src):
        offer(o_dst, end[o_src] + L["wait"], EK_WAIT)
    # inferred waits: a start no constraint explains, right after another stream's task ended
    g_ids = np.flatnonzero(gpu_mask)
    unexplained = g_ids[(start[g_ids] - cand_time[g_ids]) > UNEXPLAINED_NS]
    i_src, i_dst = _infer_waits(unexplained, start, end, unit, g_ids, streams, nthr)
    i_src, i_dst = _in_launch_order(i_src, i_dst, launch_of, start, stats)
    stats.add("inferred_waits", len(i_src), severity="info",
              detail="cross-stream waits not recorded in the trace, inferred from a GPU task "
                     "starting when another stream's task ended")
    if len(i_src):
        offer(i_dst, end[i_src] + L["wait"], EK_WAIT)
    # contention: another stream's kernel held the SMs until just before the task began
    late = g_ids[(start[g_ids] - cand_time[g_ids]) > UNEXPLAINED_NS]
    late = late[cand_kind[late] >= 0]
    drain = placed(np.int64, 0, 0, g["drain"])
    c_src, c_dst = _contention(late, cand_time[late], start, end, unit, g_ids, streams, nthr,
                               drain)
    stats.add("contention_edges", len(c_src), severity="info",
              detail="GPU tasks that began as another stream's running kernel drained (it held "
                     "the SMs; inferred from that coincidence)")
    if len(c_src):
        offer(c_dst, end[c_src] + L["contention"], EK_CONTENTION)
    # a GPU task with no launch in the trace (launched before the window: a backlog the stream
    # works through) keeps its stream predecessor as its binding edge, the gap as that edge's
    # slack, so that it moves with the work before it; only one that nothing precedes hangs
    # off the trace start at its observed offset (origin slack), where nothing can move it
    orphan = g_ids[~has_launch[g_ids] & (cand_kind[g_ids] < 0)
                   & ((start[g_ids] - cand_time[g_ids]) > UNEXPLAINED_NS)]
    offer(orphan, start[orphan], EK_ORIGIN)

    def gpu_edge(s, d, k, anchor_t, lag_ns, anchor, inferred):
        b = cand_kind[d] == k
        if k in several:  # several waits (or lane edges) into one task: the latest binds
            b &= anchor_t + lag_ns == cand_time[d]
        beyond = start[d] - anchor_t - lag_ns  # what the trace shows beyond the latency
        # an edge that did not bind gives back only what makes it hold in the trace
        edges.add(s, d, k, anchor, lag_ns, np.where(b, beyond, np.minimum(beyond, 0)), b,
                  inferred)

    gpu_edge(sp, sq, EK_STREAM, end[sp], L["stream"], A_END_START, False)
    for m, anchor in ((~ss, A_END_START), (ss, A_START_START)):
        gpu_edge(launch_of[ln[m]], ln[m], EK_LAUNCH, l_anchor[m], L["launch"], anchor, False)
    if len(w_src):
        gpu_edge(w_src, w_dst, EK_WAIT, end[w_src], L["wait"], A_END_START, False)
    if len(o_src):
        gpu_edge(o_src, o_dst, EK_WAIT, end[o_src], L["wait"], A_END_START, True)
    if len(i_src):
        gpu_edge(i_src, i_dst, EK_WAIT, end[i_src], L["wait"], A_END_START, True)
    if len(c_src):
        gpu_edge(c_src, c_dst, EK_CONTENTION, end[c_src], L["contention"], A_END_START, True)
    if len(orphan):
        edges.add(np.zeros(len(orphan), np.int64), orphan, EK_ORIGIN, A_END_START,
                  L["origin"], start[orphan] - t0 - L["origin"], True)

    # ---- waits of CPU tasks (END edges: the task resumes its own work once they are done)
    waits = _EndWaits()
    # launch queue: an enqueue call cannot finish while its stream holds LAUNCH_QUEUE_DEPTH
    # unfinished commands
    q_src, q_dst, q_inf, full = _queue_edges(start, end, per_stream, launch_of)
    stats.add("launch_queue_full", full, severity="info",
              detail=f"enqueue calls that blocked because their stream held {LAUNCH_QUEUE_DEPTH}"
                     " unfinished commands (each waits, by a queue edge, for the task whose end "
                     "released it)")
    waits.add(q_src, q_dst, EK_QUEUE, L["queue"], q_inf)
    u_src, u_dst = _unseen_queue_edges(kind, unit, start, end, names, vocab, launch_of,
                                       gpu_mask, per_stream)
    stats.add("launch_queue_full_unseen", len(u_src), severity="info",
              detail="launches whose GPU work is not in the trace (it ran after the window) "
                     "that blocked until a task of their stream ended (inferred from that "
                     "coincidence: a queue edge from it)")
    waits.add(u_src, u_dst, EK_QUEUE, L["queue"], True)
    # synchronization: syncs, blocking copies and implicit syncs wait for the GPU work they
    # name (graphstore.calls)
    unit_pid = np.array([int(x) for x in threads[:, 0]] + [-1] * (len(streams) + 1),
                        np.int64)
    s_src, s_dst, s_inf, blocking = _sync_edges(tables, wclass, copy_mode, per_stream, kind,
                                                 start, end, unit, corr, launch_of, gpu_mask,
                                                 streams, nthr, unit_pid, stats)
    waits.add(s_src, s_dst, EK_SYNC, L["sync"], s_inf)
    # cross-thread wake-ups: a host wait ends when the task it waited for ends (only host
    # time outside operators can be a wait: inside an op it is the op's own work)
    in_op = np.zeros(len(kind), bool)
    if rng.num_rows:
        r_ids = _col(rng, "range_id")
        op_by_id = np.zeros(int(r_ids.max()) + 2, bool)  # the last slot: range id -1
        # old Kineto traces record record_function markers (ProfilerStep#N, "## x ##") as
        # cpu_op too: a wait directly inside one of those is not an operator's own work
        op_by_id[r_ids] = is_in(rng["kind"], ("cpu_op",)) & ~matching(rng["name"],
                                                                     MARKER_RE.match)
        in_op = op_by_id[rid]
    # polling: a thread that asks whether GPU work is done (cudaEventQuery, ...) is waiting for
    # it, not working: each stretch of its time in which GPU work of its process ended waits
    # for the last such task (the trace does not say which event was polled), and only what
    # it ran after that task ended is its own
    p_src, p_dst, pollers = _poll_waits(kind, unit, start, end, names, vocab, rid, nthr,
                                        threads, thr_prev, thr_next, in_op, launch_of,
                                        gpu_mask)
    stats.add("polling_threads", pollers, severity="info",
              detail="threads whose calls only ask whether GPU work is done (or inspect "
                     "state): their time between calls is waiting for the GPU, not work")
    stats.add("poll_waits", len(p_src), severity="info",
              detail="stretches of a polling thread, or between two queries outside any "
                     "operator, that wait for the last GPU task of the process ending in "
                     "them (inferred from that coincidence: a sync edge from it)")
    waits.add(p_src, p_dst, EK_SYNC, L["sync"], True)
    k_src, k_dst, k_via = _wake_edges(kind, unit, start, end, nthr, threads,
                                      blocking | in_op)
    stats.add("wake_edges", len(k_src), severity="info",
              detail="host waits that end when a task on another thread of the process ends "
                     "or starts (inferred from that coincidence)")
    if len(k_src):
        e_end = ~k_via
        waits.add(k_src[e_end], k_dst[e_end], EK_WAKE, L["wake"], True)
    if k_via.any():
        # woken by a start: the waiting stretch is idle time, and the next task on its
        # thread starts from that start
        nxt = np.full(len(kind), -1, np.int64)
        nxt[thr_prev] = thr_next
        w = np.flatnonzero(k_via & (nxt[k_dst] >= 0))
        s_, d_ = k_src[w], nxt[k_dst[w]]
        edges.add(s_, d_, EK_WAKE, A_START_START, L["wake"],
                  start[d_] - start[s_] - L["wake"], True, True)
        dur[k_dst[w]] = 0
    waits.resolve(edges, dur, start, end)

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
            edges.add(f_src[m], f_dst[m], EK_WAKE, anchor, L["wake"],
                      start[f_dst[m]] - t_src - L["wake"], True, True)

    # ---- origin: every task without a predecessor hangs off the trace start; a thread's
    # first recorded task at its offset (when the window caught it), GPU work as origin slack
    has_pred = edges.has_predecessor(len(kind))
    roots = np.flatnonzero(~has_pred)
    roots = roots[roots != 0]
    on_gpu = gpu_mask[roots]
    off = start[roots] - t0
    edges.add(np.zeros(len(roots), np.int64), roots, EK_ORIGIN, A_END_START,
              np.where(on_gpu, L["origin"], off), np.where(on_gpu, off - L["origin"], 0), True)

    unit_kind = ["thread"] * nthr + ["stream"] * len(streams) + ["thread"]
    unit_pid = [int(x) for x in threads[:, 0]] + [None] * len(streams) + [None]
    unit_tid = [int(x) for x in threads[:, 1]] + [None] * len(streams) + [None]
    unit_device = [None] * nthr + [int(x) for x in streams[:, 0]] + [None]
    unit_stream = [None] * nthr + [int(x) for x in streams[:, 1]] + [None]
    unit_name = ([f"thread {p}:{t}" for p, t in threads] +
                 [f"gpu {d} stream {s}" for d, s in streams] + ["origin"])
    # ---- collectives on one rank's trace: transfer plus waiting for the other ranks
    task_slack = _peer_wait(kind, names, nbytes, obs, dur, stats)
    gaps = _untraced_gaps(kind, unit, start, end, obs, dur, rid, blocking, nthr, launch_of,
                          gpu_mask)
    stats.add("untraced_gaps", len(gaps), severity="info",
              detail=f"stretches of a thread longer than {UNTRACED_GAP_NS // 1000} us with "
                     "nothing traced in them while GPU work it launched ran: the trace cannot "
                     "tell CPU work from waiting, so they are untraced slack (kept by the "
                     "headline, dropped at the interval's low end)")
    task_slack[gaps] = dur[gaps]
    dur[gaps] = 0
    if lanes is not None:  # the lanes' units follow the origin's, each beside its stream's
        for u, n_lanes in zip(lanes.streams, lanes.n_lanes, strict=True):
            i = u - nthr
            for k in range(1, n_lanes):
                lanes.unit_id[(lanes.stream == u) & (lanes.lane == k)] = len(unit_kind)
                unit_kind.append("stream")
                unit_pid.append(None)
                unit_tid.append(None)
                unit_device.append(int(streams[i, 0]))
                unit_stream.append(int(streams[i, 1]))
                unit_name.append(f"gpu {streams[i, 0]} stream {streams[i, 1]} lane {k}")
        unit[lanes.task] = lanes.unit_id
    e = edges.arrays()
    return Graph(kind=kind, unit=unit, start_ns=start, obs_dur_ns=obs, dur_ns=dur,
                 task_slack_ns=task_slack,
                 name_code=names, name_vocab=pool.vocab(), bytes_=nbytes, correlation=corr,
                 range_id=rid, blocking=blocking, src=e["src"], dst=e["dst"],
                 ekind=e["kind"], anchor=e["anchor"], lag_ns=e["lag"], slack_ns=e["slack"],
                 binding=e["binding"], inferred=e["inferred"], unit_kind=unit_kind,
                 unit_pid=unit_pid, unit_tid=unit_tid, unit_device=unit_device,
                 unit_stream=unit_stream, unit_name=unit_name, stats=stats)


@dataclass
class _Lanes:
    """The graph lanes of a trace (``_graph_lanes``)."""

    streams: np.ndarray  # the stream units with lanes
    n_lanes: list        # lanes of each, the stream's own unit (lane 0) counted
    task: np.ndarray     # the tasks on lanes 1.., by task id
    stream: np.ndarray   # the stream unit of each
    lane: np.ndarray     # its lane (>= 1)
    unit_id: np.ndarray  # its lane's unit (set by build once the units are numbered)
    src: np.ndarray      # the stream edges of the laned streams (in place of their
    dst: np.ndarray      # adjacent pairs)


def _graph_lanes(per_stream: dict, overlapped: np.ndarray, start: np.ndarray, end: np.ndarray,
                 corr: np.ndarray) -> _Lanes | None:
    """Lanes for the nodes of one CUDA graph launch that ran side by side on their stream.

    A graph runs its nodes on parallel branches, yet the profiler puts every one of them on
    the stream the graph was launched onto, so on that stream some of them overlap. A stream
    unit runs one task at a time, which would stretch the replay. The rule, on each stream
    ``overlapped`` names (those with a task starting before an earlier one ended; no other
    stream is looked at, so a trace without overlaps pays nothing):

    - a *cluster* is a maximal run of the stream's tasks (in start order) each of which starts
      before every earlier task of the run has ended; a cluster of several tasks that all share
      one correlation id (>= 0: one launching call, i.e. one graph launch) is a *graph
      cluster*. Other clusters (tasks of different launches overlapping) are left as they
      are: serialized on the stream, as before;
    - in a graph cluster each task goes to the lowest lane whose last task ended by its
      start (lane 0 is the stream's own unit; lane k >= 1 a unit of its own, named
      ``gpu D stream S lane k``), so a lane never holds two overlapping tasks, and every task
      outside graph clusters stays on lane 0;
    - stream edges (end_start) keep the order the trace shows: each task follows the task
      before it on its lane, and on every other lane of its stream the last task that ended
      by its start (with every earlier task of that lane), unless that task already precedes
      the task before it on its own lane. So a node starts after every node of its stream
      that ended before it began, as measured, and nothing more: under a what-if the nodes
      still serialize where they did and run side by side where they did.

    Returns None when no overlap is one of a graph launch's nodes."""
    streams, n_lanes, tasks, t_stream, t_lane, srcs, dsts = [], [], [], [], [], [], []
    for u in overlapped:
        ids = per_stream[int(u)]
        s, e = start[ids], end[ids]
        head = np.r_[True, s[1:] >= np.maximum.accumulate(e)[:-1]]
        first = np.flatnonzero(head)
        size = np.diff(np.r_[first, len(ids)])
        c = corr[ids]
        cid = np.cumsum(head) - 1
        mixed = np.bincount(cid, weights=c != c[first][cid], minlength=len(first)) > 0
        graph = (size > 1) & ~mixed & (c[first] >= 0)
        if not graph.any():
            continue
        lane = np.zeros(len(ids), np.int64)
        for a, m in zip(first[graph], size[graph], strict=True):
            free = [e[a]]  # the end of each lane's last task
            for p in range(a + 1, a + m):
                k = next((k for k, f in enumerate(free) if f <= s[p]), len(free))
                if k == len(free):
                    free.append(e[p])
                else:
                    free[k] = e[p]
                lane[p] = k
        n = int(lane.max()) + 1
        prev = np.full(len(ids), -1, np.int64)  # the task before each on its lane
        on = [np.flatnonzero(lane == k) for k in range(n)]
        for o in on:
            prev[o[1:]] = o[:-1]
            srcs.append(ids[o[:-1]])
            dsts.append(ids[o[1:]])
        for k, o in enumerate(on):
            q = np.flatnonzero(lane != k)
            # lane k's tasks that ended by q's start, every earlier one of the lane with them
            cnt = np.minimum(np.searchsorted(np.maximum.accumulate(e[o]), s[q], "right"),
                             np.searchsorted(o, q))
            src = np.where(cnt > 0, o[np.maximum(cnt - 1, 0)], -1)
            by = np.full(len(ids), -1, np.int64)
            by[q] = src
            new = (src >= 0) & ((prev[q] < 0) | (by[np.maximum(prev[q], 0)] != src))
            srcs.append(ids[src[new]])
            dsts.append(ids[q[new]])
        streams.append(int(u))
        n_lanes.append(n)
        moved = np.flatnonzero(lane > 0)
        tasks.append(ids[moved])
        t_stream.append(np.full(len(moved), int(u), np.int64))
        t_lane.append(lane[moved])
    if not streams:
        return None
    task = np.concatenate(tasks)
    return _Lanes(streams=np.array(streams, np.int64), n_lanes=n_lanes, task=task,
                  stream=np.concatenate(t_stream), lane=np.concatenate(t_lane),
                  unit_id=np.zeros(len(task), np.int32), src=np.concatenate(srcs),
                  dst=np.concatenate(dsts))


class _Edges:
    """Edge columns collected in batches (one per kind of edge) and concatenated once."""

    def __init__(self):
        self._parts: list[tuple] = []

    def add(self, s, d, kind, anchor, lag_ns, slack_ns, binding, inferred=False):
        s = np.asarray(s, np.int64)
        n = len(s)
        if not n:
            return
        self._parts.append((s, np.asarray(d, np.int64), np.full(n, kind, np.int8),
                            np.full(n, anchor, np.int8),
                            np.broadcast_to(np.asarray(lag_ns, np.int64), (n,)),
                            np.broadcast_to(np.asarray(slack_ns, np.int64), (n,)),
                            np.broadcast_to(np.asarray(binding, bool), (n,)),
                            np.broadcast_to(np.asarray(inferred, bool), (n,))))

    def has_predecessor(self, n: int) -> np.ndarray:
        """Per task: whether an edge so far ends at it."""
        out = np.zeros(n, bool)
        for p in self._parts:
            out[p[1]] = True
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        names = ("src", "dst", "kind", "anchor", "lag", "slack", "binding", "inferred")
        if not self._parts:
            return {k: np.zeros(0, np.int8 if k in ("kind", "anchor") else
                                bool if k in ("binding", "inferred") else np.int64)
                    for k in names}
        return {k: np.concatenate([p[i] for p in self._parts]) for i, k in enumerate(names)}


class _EndWaits:
    """The END edges of CPU tasks that wait (queue, sync, wake), resolved together: a task
    waits for the latest of them, at its physical latency, then does its own work. The one
    that ended last binds; the task's duration becomes what it ran after it (its own cost);
    a wait that ended before the task began cost nothing, and the task keeps its duration."""

    def __init__(self):
        self._parts: list[tuple] = []

    def add(self, s, d, kind, lag_ns, inferred):
        s = np.asarray(s, np.int64)
        if len(s):
            n = len(s)
            self._parts.append((s, np.asarray(d, np.int64), np.full(n, kind, np.int8),
                                np.full(n, lag_ns, np.int64),
                                np.broadcast_to(np.asarray(inferred, bool), (n,))))

    def resolve(self, edges: _Edges, dur: np.ndarray, start: np.ndarray, end: np.ndarray):
        if not self._parts:
            return
        s, d, k, lg, inf = (np.concatenate([p[i] for p in self._parts]) for i in range(5))
        ready = end[s] + lg  # when each wait lets its task go on
        o = np.lexsort((-ready, d))  # per destination, the latest-ready wait first
        first = np.r_[True, d[o][1:] != d[o][:-1]]
        top = o[first]  # the binding candidate of each destination
        waited = ready[top] > start[d[top]]
        t = d[top[waited]]
        dur[t] = np.maximum(end[t] - ready[top[waited]], 0)
        binding = np.zeros(len(s), bool)
        binding[top[waited]] = True
        # a task that ended before the latency elapsed: the edge gives the difference back,
        # whether it bound or not (every END edge must hold in the trace)
        slack = np.minimum(end[d] - ready, 0)
        for kind in np.unique(k):
            m = k == kind
            edges.add(s[m], d[m], int(kind), A_END_END, lg[m], slack[m], binding[m], inf[m])


def _untraced_gaps(kind, unit, start, end, obs, dur, rid, blocking, nthr, launch_of,
                   gpu_mask) -> np.ndarray:
    """Host stretches that the trace cannot attribute: outside every traced range, longer than
    UNTRACED_GAP_NS, no wait bound them (their own cost is still their whole length), and GPU
    work their thread launched before them was still running as they began. Either untraced
    CPU work (Python, a library without ranges) or a wait the trace does not show."""
    h = np.flatnonzero(obs > UNTRACED_GAP_NS)  # few: the rest is checked on them alone
    h = h[(kind[h] == KIND_HOST) & (unit[h] < nthr) & (rid[h] < 0) & ~blocking[h]
          & (dur[h] == obs[h])]
    g = np.flatnonzero(gpu_mask & (launch_of >= 0))
    if not len(h) or not len(g):
        return np.zeros(0, np.int64)
    call = launch_of[g]
    g = g[unit[call] < nthr]
    call = launch_of[g]
    # per thread, by launch (ids are in start order: a key of unit and id sorts both at once,
    # every key distinct): the latest end of the GPU work launched so far
    o = np.argsort(unit[call].astype(np.int64) * len(kind) + call)
    g, call = g[o], call[o]
    u = unit[call].astype(np.int64)
    base = int(start.min())
    # a running max within each thread: each thread's ends lifted above the previous ones'
    seg = np.cumsum(np.r_[True, u[1:] != u[:-1]]) - 1
    lift = seg * (int(end.max()) - base + 1)
    gend = np.maximum.accumulate(end[g] - base + lift) - lift + base
    key = u * (1 << 50) + (start[call] - base)
    pos = np.searchsorted(key, unit[h].astype(np.int64) * (1 << 50) + (start[h] - base),
                          side="left") - 1
    ok = pos >= 0
    p = np.maximum(pos, 0)
    ok &= (u[p] == unit[h]) & (gend[p] > start[h])
    return h[ok]


def _peer_wait(kind, names, nbytes, obs, dur, stats: Stats) -> np.ndarray:
    """A collective kernel on one rank lasts as long as its slowest peer. Of the instances of
    one collective kernel and message size in the trace, the fastest waited least: its time is
    taken as the transfer, and each instance's excess over it as waiting for peers (task
    slack). Kernels without a message size, or seen once, keep their whole duration. Sets the
    comm tasks' ``dur`` to the transfer; returns the task slack column."""
    slack = np.zeros(len(kind), np.int64)
    c = np.flatnonzero((kind == KIND_COMM) & (nbytes > 0))
    if not len(c):
        return slack
    key = np.stack([names[c], nbytes[c]], 1)
    _, grp, cnt = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    grp = grp.reshape(-1)
    fastest = np.full(len(cnt), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(fastest, grp, obs[c])
    split = cnt[grp] >= 2
    t = c[split]
    slack[t] = obs[t] - fastest[grp[split]]
    dur[t] = fastest[grp[split]]
    stats.add("peer_wait_split", int(split.sum()), severity="info",
              detail="collective kernels split into transfer (the fastest instance of the "
                     "same kernel and message size) and waiting for peers (task slack)")
    return slack


def _launches(api: pa.Table, api_task: np.ndarray, corr: np.ndarray, gpu_task: np.ndarray,
              n: int) -> np.ndarray:
    """The call task that launched each GPU task (by correlation id within the trace; nsys
    offsets them per process), -1 where the call is not in the trace."""
    launch_of = np.full(n, -1, np.int64)
    if not api.num_rows or not len(gpu_task):
        return launch_of
    a_corr = _col(api, "correlation")
    ok = a_corr >= 0
    ac, at = a_corr[ok], api_task[ok]
    o = np.argsort(ac, kind="stable")
    ac, at = ac[o], at[o]
    if not len(ac):
        return launch_of
    gc = corr[gpu_task]
    pos_c = np.minimum(np.searchsorted(ac, gc), len(ac) - 1)
    hit = (gc >= 0) & (ac[pos_c] == gc)
    launch_of[gpu_task[hit]] = at[pos_c[hit]]
    return launch_of


def _copy_blocks(t: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Per memcpy row, how its call blocks the host (graphstore.calls.BLOCK_*) when the call
    is an async copy and when it is a synchronous one (the call's name decides which)."""
    cols = [_dict(t, c) if c in t.column_names else (np.zeros(t.num_rows, np.int64),
                                                      np.array([""], object))
            for c in ("copy_kind", "src_kind", "dst_kind")]
    # the three codes as one integer key (np.unique over rows sorts a structured view: slow)
    key = np.zeros(t.num_rows, np.int64)
    for codes, values in cols:
        key = key * len(values) + codes
    uniq_key, inv = np.unique(key, return_inverse=True)
    uniq = np.empty((len(uniq_key), 3), np.int64)
    for j in (2, 1, 0):
        uniq_key, uniq[:, j] = np.divmod(uniq_key, len(cols[j][1]))
    out = []
    for async_call in (True, False):
        modes = np.array([calls.copy_blocks(async_call, *(str(cols[j][1][u[j]]) or None
                                                          for j in range(3)))
                          for u in uniq], np.int64)
        out.append(modes[inv] if len(uniq) else np.zeros(0, np.int64))
    return out[0], out[1]


@kernel("none", "int64[::1]", "int8[::1]", "int64[::1]", "int64[::1]", "int64")
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


def _queue_edges(start, end, per_stream, launch_of):
    """Queue edges (task i -> the call that enqueued task j, END): j's call cannot finish
    before i has, where i is ``depth`` places before j on their stream. ``depth`` is
    LAUNCH_QUEUE_DEPTH, or more where the trace shows its stream holding more unfinished tasks
    at a launch (the queue is at least that deep: newer drivers and ROCm allow more). A call
    that blocked in the trace waits instead for the task whose end released it, read from the
    trace (``_blocked``). Returns (src, dst, inferred, calls that blocked)."""
    src, dst, inf, full = [], [], [], 0
    for ids in per_stream.values():
        if len(ids) < LAUNCH_QUEUE_DEPTH - QUEUE_BLOCK_SPAN:  # never near the limit either way
            continue
        call = launch_of[ids]
        cmd, first, last = _commands(call)
        j = first[call[first] >= 0]  # each launched command's first task
        if not len(j):  # none of the stream's tasks was launched in the trace
            continue
        c = call[j]
        done = np.maximum.accumulate(end[ids])  # tasks of a stream finish in order
        r = np.searchsorted(done, end[c], side="right") - 1  # last task done before c ended
        rr = np.maximum(r, 0)
        took = end[c] - start[c]
        # counted by task (a graph launch's nodes one each) and by command (once)
        by_task, depth = _blocked(j, np.arange(len(ids)), done, start[c], rr, took)
        by_cmd, _ = _blocked(cmd[j], cmd, done[last], start[c], rr, took)
        blocked = (r >= 0) & (end[ids[rr]] > start[c]) & (by_task | by_cmd)
        deep = ~blocked & (j >= depth)
        full += int(blocked.sum())
        src += [ids[rr[blocked]], ids[j[deep] - depth]]
        dst += [c[blocked], c[deep]]
        inf += [np.ones(int(blocked.sum()), bool), np.zeros(int(deep.sum()), bool)]
    if not src:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool), full
    return np.concatenate(src), np.concatenate(dst), np.concatenate(inf), full


def _blocked(pos, slot_of, slot_done, call_start, rr, took) -> tuple[np.ndarray, int]:
    """Which launches (POS: each one's place among its stream's queue slots) blocked on a full
    queue, and the queue's depth: the stream held at least ``depth - QUEUE_BLOCK_SPAN``
    unfinished slots as the call began, the task that released it (RR, a task position; it
    ended inside the call) was between that many and ``depth`` slots before it, and the call ran
    more than twice as long as the stream's calls further from the limit. SLOT_OF: each task's
    slot; SLOT_DONE: when each slot was done. The trace does not say how many slots a CUDA
    graph launch's nodes take (build counts them both ways, each a bound): counted one per node
    the calls that blocked on hta/torchrec_a100_rank0_of16 sit 960-994 slots deep while
    hta/recsys_v100_rank1_of2's sit at 1,013-1,065 with free calls up to 1,337; counted once
    per launch, recsys's blocked at 957-1,013 with free calls up to 1,012, TorchRec's at 907."""
    open_ = pos - np.searchsorted(slot_done, call_start, side="right")
    depth = max(LAUNCH_QUEUE_DEPTH, int(open_.max(initial=0)) + 1)
    lo = depth - QUEUE_BLOCK_SPAN
    behind = pos - slot_of[rr]  # slots from the releasing task's to the call's
    free = took[open_ < lo]
    typical = np.median(free) if len(free) else np.median(took)
    return ((open_ >= lo) & (behind >= lo) & (behind <= depth) & (took > 2 * typical)), depth


def _commands(call: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The commands of a stream's tasks (CALL: each task's launching call in stream order, -1
    where the trace lacks it): the tasks one call put there in a row are one command. Returns
    each task's command and each command's first and last task (positions in CALL)."""
    if not len(call):
        z = np.zeros(0, np.int64)
        return z, z, z
    new = np.r_[True, (call[1:] != call[:-1]) | (call[1:] < 0)]
    first = np.flatnonzero(new)
    return np.cumsum(new) - 1, first, np.r_[first[1:] - 1, len(call) - 1]


def _by_call_name(fn, vocab: np.ndarray, names: np.ndarray, kind: np.ndarray,
                  dtype=bool) -> np.ndarray:
    """FN(name) per vocabulary entry, asked of the call names alone (the vocabulary holds
    every task's name: some 1,400 on a 4k-task inference trace, tens of them calls); 0 for
    the others."""
    out = np.zeros(len(vocab), dtype)
    called = np.flatnonzero(np.bincount(names[kind == KIND_API], minlength=len(vocab)))
    out[called] = [fn(str(v)) for v in vocab[called]]
    return out


def _unseen_queue_edges(kind, unit, start, end, names, vocab, launch_of, gpu_mask,
                        per_stream):
    """Queue edges into launches that put no GPU task into the trace (their work ran after the
    window, so _queue_edges cannot place them on a stream): a launch that ran more than twice
    as long as the launches the trace shows the work of, and ended within
    UNSEEN_RELEASE_TOL_NS after a task of the stream its thread last launched to ended (that
    stream busy when it began), waited for that task to free a queue slot. Returns (src, dst)."""
    empty = np.zeros(0, np.int64)
    launch_name = _by_call_name(calls.is_launch, vocab, names, kind)
    is_launch = (kind == KIND_API) & launch_name[names]
    seen = np.zeros(len(kind), bool)
    seen[launch_of[launch_of >= 0]] = True
    shown = np.flatnonzero(is_launch & seen)
    cand = np.flatnonzero(is_launch & ~seen)
    if not len(cand) or not len(shown):
        return empty, empty
    cand = cand[end[cand] - start[cand] > 2 * np.median(end[shown] - start[shown])]
    su = _last_launched_stream(cand, unit, start, launch_of, gpu_mask)
    cand, su = cand[su >= 0], su[su >= 0]
    if not len(cand):
        return empty, empty
    src, dst = [], []
    for s_unit in np.unique(su):
        # tasks of a stream finish in order: the last one done by each call's end
        ids = per_stream[int(s_unit)]
        fin = np.maximum.accumulate(end[ids])
        c = cand[su == s_unit]
        r = np.searchsorted(fin, end[c], side="right") - 1
        ok = r >= 0
        rr = np.maximum(r, 0)
        ok &= (fin[rr] > start[c]) & (end[c] - fin[rr] <= UNSEEN_RELEASE_TOL_NS)
        src.append(ids[rr[ok]])
        dst.append(c[ok])
    return np.concatenate(src), np.concatenate(dst)


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


@kernel("Tuple((int64[::1], int64[::1], bool_[::1]))", "int8[::1]", "int32[::1]", "int64[::1]",
        "int64[::1]", "int64", "int64[::1]")
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


def _poll_waits(kind, unit, start, end, names, vocab, rid, nthr, threads, thr_prev, thr_next,
                in_op, launch_of, gpu_mask) -> tuple[np.ndarray, np.ndarray, int]:
    """The waits of polling (graphstore.calls.poll_kind): (GPU task, host stretch) pairs and
    the number of polling threads.

    A stretch polls when its thread is a polling thread (every call a query or an inspection,
    at least one query, no operator of its own, nothing launched), or when it lies between two
    queries outside any operator (a Python loop over ``event.query()``). It waits for the
    last GPU task launched by its process that ended within it; a stretch in which no such
    task ended is left as it is (nothing in the trace says what it waited for)."""
    empty = np.zeros(0, np.int64)
    if nthr == 0 or not gpu_mask.any():
        return empty, empty, 0
    api_ids = np.flatnonzero(kind == KIND_API)
    pk = _by_call_name(calls.poll_kind, vocab, names, kind, np.int8)
    if not (pk == 2).any():  # most traces make no query
        return empty, empty, 0
    apk = pk[names[api_ids]]  # per call: 2 query, 1 inspect, 0 other
    q = api_ids[apk == 2]
    # polling threads: of the threads that query, those with no other call, no ranged host
    # time and no launch
    cand = np.unique(unit[q])
    cand = cand[cand < nthr]
    by_unit = np.zeros(int(unit.max()) + 1, bool)  # lookups by unit and by task: no np.isin
    by_unit[cand] = True
    mine = np.flatnonzero(by_unit[unit])  # the tasks of the threads that query
    busy = np.concatenate([unit[api_ids[apk == 0]], unit[launch_of[launch_of >= 0]],
                           unit[mine[(kind[mine] == KIND_HOST) & (rid[mine] >= 0)]]])
    by_unit[busy] = False
    pollers = np.flatnonzero(by_unit)
    h = mine[by_unit[unit[mine]] & (kind[mine] == KIND_HOST)] if len(pollers) else empty
    # a stretch between two queries outside any operator: the task after a query, a host
    # stretch, whose next task is a query
    is_query = np.zeros(len(kind), bool)
    is_query[q] = True
    after_q = thr_next[is_query[thr_prev]]
    after_q = after_q[(kind[after_q] == KIND_HOST) & ~in_op[after_q]]
    mark = np.zeros(len(kind), bool)
    mark[after_q] = True
    sel = mark[thr_prev]
    between = thr_prev[sel][is_query[thr_next[sel]]]
    h = np.union1d(h, between).astype(np.int64)
    if not len(h):
        return empty, empty, len(pollers)
    g = np.flatnonzero(gpu_mask & (launch_of >= 0))
    if not len(g):
        return empty, empty, len(pollers)
    # the GPU tasks of each process by end (a process: the launching thread's pid)
    _, pid_rank = np.unique(threads[:, 0], return_inverse=True)
    gp = pid_rank.reshape(-1)[unit[launch_of[g]]]
    base = int(end[g].min())
    key = gp * (1 << 50) + (end[g] - base)
    o = np.argsort(key, kind="stable")
    g, key = g[o], key[o]
    hp = pid_rank.reshape(-1)[unit[h]]
    pos = np.searchsorted(key, hp * (1 << 50) + (end[h] - base), side="right") - 1
    ok = pos >= 0
    c = g[np.maximum(pos, 0)]
    ok &= (key[np.maximum(pos, 0)] >> 50 == hp) & (end[c] > start[h])
    return c[ok], h[ok], len(pollers)


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
    if len(cpu) and cpu[0] == 0:  # the ids ascend: only the first can be the origin
        cpu = cpu[1:]
    if not len(cpu):
        return empty, empty, np.zeros(0, bool)
    pid_of_unit = np.full(int(unit.max()) + 1, -1, np.int64)
    pid_of_unit[:nthr] = threads[:, 0]
    # the CPU tasks by end (ids are in start order, so by start they are sorted already)
    by_end = cpu[np.argsort(end[cpu], kind="stable")]
    return _wake(kind, unit, start, end, blocking, cpu, by_end, pid_of_unit)


@helper(inline="always")
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


@kernel("Tuple((int64[::1], int64[::1], bool_[::1]))", "int8[::1]", "int32[::1]", "int64[::1]",
        "int64[::1]", "bool[::1]", "int64[::1]", "int64[::1]", "int64[::1]")
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


def _range_names(pool: _NamePool, rng: pa.Table) -> np.ndarray:
    """Name code of each range id (a host task's name is its innermost range's); the last
    slot, read by range id -1, is "<host>" (outside every range)."""
    host = pool.add(np.zeros(1, np.int64), np.array(["<host>"], object))[0]
    if not rng.num_rows:
        return np.full(1, host, np.int64)
    names = pool.add(*_dict(rng))
    ids = _col(rng, "range_id")
    # one slot more than the ids: range id -1 (none) reads it
    lookup = np.full(int(ids.max()) + 2 if len(ids) else 1, host, np.int64)
    lookup[ids] = names
    return lookup


def _copy_mode(n, names, vocab, launch_of, gpu_task, g, kind) -> np.ndarray:
    """Per task: how the call that launched it blocks the host, if it is a copy
    (graphstore.calls.BLOCK_*; BLOCK_NONE for every other task). The call's name says whether
    it is an async copy, the copy row's blk_async / blk_sync how each kind of call blocks."""
    mode = np.zeros(n, np.int64)
    rows = np.flatnonzero(g["kind"] == KIND_MEMCPY)
    t = gpu_task[rows]
    launched = launch_of[t] >= 0
    rows, t = rows[launched], t[launched]
    if len(t):
        is_async = _by_call_name(calls.is_async_copy, vocab, names, kind)
        mode[t] = np.where(is_async[names[launch_of[t]]], g["blk_async"][rows],
                           g["blk_sync"][rows])
    return mode


def _stream_tasks(unit, gpu_mask):
    """{stream unit: its task ids in stream order}, streams in unit order (build's stream
    edges, queue edges and syncs share it)."""
    g_ids = np.flatnonzero(gpu_mask)
    if not len(g_ids):
        return {}
    by = g_ids[order_by_unit(unit[g_ids])]
    u = unit[by]
    cuts = np.flatnonzero(np.r_[True, u[1:] != u[:-1], True])
    return {int(u[a]): by[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=False)}


def _sync_edges(tables, wclass, copy_mode, per_stream, kind, start, end, unit, corr, launch_of,
                gpu_mask, streams, nthr, unit_pid, stats: Stats):
    """Waits of synchronizing calls, by what the call waits for (graphstore.calls): a device
    sync (or implicit one: cudaFree) for the last task enqueued before it on every stream of
    its process; a stream or event sync for the last one on the stream its sync record names,
    else on the stream its thread last launched onto (inferred); a blocking copy for its own
    copy (device to host) or for the work before it on its stream (pageable host to device).
    A target that ended after the call returned cannot have been waited for and is dropped
    (counted). Returns (src, dst, inferred, blocking mask)."""
    n = len(kind)
    blocking = np.zeros(n, bool)
    empty = np.zeros(0, np.int64)
    if not per_stream:
        return empty, empty, np.zeros(0, bool), blocking
    s_pid = {}  # stream -> process of the calls that launch onto it
    done_enq = {}  # stream -> latest enqueue time so far along it
    for su, ids in per_stream.items():
        c = launch_of[ids]
        # enqueue time of each GPU task: its call's start (-inf: launched before the window)
        enq = np.where(c >= 0, start[np.maximum(c, 0)], np.iinfo(np.int64).min)
        done_enq[su] = np.maximum.accumulate(enq)
        c = c[c >= 0]
        s_pid[su] = unit_pid[unit[c[0]]] if len(c) else None

    def last_before(su, t):
        """The last task of stream su enqueued before times t (-1: none)."""
        ids = per_stream[su]
        p = np.searchsorted(done_enq[su], t, side="left") - 1
        return np.where(p >= 0, ids[np.maximum(p, 0)], -1)

    src, dst, inf = [], [], []

    def emit(s, d, inferred):
        ok = s >= 0
        src.append(s[ok])
        dst.append(d[ok])
        inf.append(np.full(int(ok.sum()), inferred, bool))

    pid_of = unit_pid
    # device syncs: every stream of the process
    dev = np.flatnonzero(wclass == calls.WAIT_DEVICE)
    for su in per_stream:
        mine = dev[[s_pid[su] in (None, pid_of[unit[c]]) for c in dev]] if len(dev) else dev
        if len(mine):
            emit(last_before(su, start[mine]), mine, False)
    # stream and event syncs: the stream from the sync record, else inferred: the stream the
    # thread last launched onto, where that is consistent with when the call returned, else
    # the stream whose pending work ended last inside the call
    one = np.flatnonzero((wclass == calls.WAIT_STREAM) | (wclass == calls.WAIT_EVENT))
    if len(one):
        rec = _recorded_sync_streams(tables, corr[one], streams, nthr)
        for su in per_stream:
            m = rec == su
            if m.any():
                emit(last_before(su, start[one[m]]), one[m], False)
        todo = one[rec < 0]
        if len(todo):
            guess = _last_launched_stream(todo, unit, start, launch_of, gpu_mask)
            cands = {su: last_before(su, start[todo]) for su in per_stream
                     if s_pid[su] is None or np.any(unit_pid[unit[todo]] == s_pid[su])}
            pick = np.full(len(todo), -1, np.int64)
            best = np.full(len(todo), np.iinfo(np.int64).min, np.int64)
            is_mine = np.zeros(len(todo), bool)
            for su, tgt in cands.items():
                te = np.where(tgt >= 0, end[np.maximum(tgt, 0)], np.iinfo(np.int64).min)
                fits = (tgt >= 0) & (te <= end[todo])
                mine = fits & (guess == su)
                inside = fits & ~mine & ~is_mine & (te > start[todo]) & (te > best)
                best = np.where(inside, te, best)
                pick = np.where(mine | inside, tgt, pick)
                is_mine |= mine
            emit(pick, todo, True)
    # blocking copies
    cp = np.flatnonzero(gpu_mask & (copy_mode != calls.BLOCK_NONE))
    after = cp[copy_mode[cp] == calls.BLOCK_AFTER_COPY]
    emit(after, launch_of[after], False)
    before = cp[copy_mode[cp] == calls.BLOCK_BEFORE_COPY]
    if len(before):
        prev = np.full(n, -1, np.int64)
        for ids in per_stream.values():
            prev[ids[1:]] = ids[:-1]
        emit(prev[before], launch_of[before], False)
    s, d, i = np.concatenate(src), np.concatenate(dst), np.concatenate(inf)
    late = end[s] > end[d]
    stats.add("sync_targets_after_call", int(late.sum()), severity="info",
              detail="GPU tasks a synchronizing call would wait for by its semantics that ended "
                     "after the call returned (its stream was guessed wrong): no edge")
    s, d, i = s[~late], d[~late], i[~late]
    blocking[d] = True
    n_sync = int((wclass != calls.WAIT_NONE).sum())
    stats.add("blocking_calls", int(blocking.sum()), severity="info",
              detail=f"calls that wait for GPU work: syncs, blocking copies, implicit syncs "
                     f"(of {n_sync} sync and copy calls)")
    stats.add("sync_edges", len(s), severity="info",
              detail="synchronizing calls linked to the GPU tasks they wait for")
    stats.add("sync_edges_inferred", int(i.sum()), severity="info",
              detail="stream and event syncs without a sync record, tied to the stream their "
                     "thread last launched onto")
    return s, d, i, blocking


def _recorded_sync_streams(tables, call_corr, streams, nthr) -> np.ndarray:
    """The stream unit each call's sync record names (Kineto cuda_sync / CUPTI
    SYNCHRONIZATION records, by correlation): the synced stream, or the stream an event sync
    waits on; -1 where there is no record."""
    out = np.full(len(call_corr), -1, np.int64)
    sync = tables["sync"]
    if not sync.num_rows:
        return out
    s_corr = _col(sync, "correlation")
    kinds = _names(sync, "sync_kind")
    wanted = np.where(kinds == "stream_sync", _col(sync, "stream"),
                      np.where(kinds == "event_sync", _col(sync, "wait_on_stream"), -1))
    s_dev = _col(sync, "device")
    key_unit = _stream_units(streams, nthr)
    o = np.argsort(s_corr, kind="stable")
    pos = np.minimum(np.searchsorted(s_corr[o], call_corr), len(o) - 1)
    hit = (s_corr[o][pos] == call_corr) & (call_corr >= 0)
    for i in np.flatnonzero(hit):
        r = o[pos[i]]
        if wanted[r] >= 0:
            out[i] = key_unit.get((int(s_dev[r]), int(wanted[r])),
                                  key_unit.get((-1, int(wanted[r])), -1))
    return out


def _last_launched_stream(calls_, unit, start, launch_of, gpu_mask) -> np.ndarray:
    """For each call, the stream unit of the last GPU task its thread launched before it
    began (-1: none)."""
    g = np.flatnonzero(gpu_mask & (launch_of >= 0))
    out = np.full(len(calls_), -1, np.int64)
    if not len(g) or not len(calls_):  # (no call ran long enough to have waited: none)
        return out
    c = launch_of[g]
    base = int(min(start[c].min(), start[calls_].min()))
    span = int(max(start[c].max(), start[calls_].max())) - base + 1
    key = unit[c].astype(np.int64) * span + (start[c] - base)
    o = np.argsort(key, kind="stable")
    key, su = key[o], unit[g][o]
    q = unit[calls_].astype(np.int64) * span + (start[calls_] - base)
    p = np.searchsorted(key, q, side="left") - 1
    ok = (p >= 0) & (key[np.maximum(p, 0)] // span == unit[calls_])
    out[ok] = su[p[ok]]
    return out


def _stream_units(streams: np.ndarray, nthr: int) -> dict:
    """(device, stream) -> unit id, as build() numbered the stream units (after the threads);
    (-1, stream) finds a stream when a record names no device."""
    out = {}
    for i, (d, st) in enumerate(streams):
        out[(int(d), int(st))] = nthr + i
        out.setdefault((-1, int(st)), nthr + i)
    return out


_WAIT_EVENT_RE = re.compile(r"^(cuda|hip)StreamWaitEvent|^cuStreamWaitEvent")


def _call_order_waits(tables, kind, unit, start, end, corr, names, vocab, launch_of, gpu_mask,
                      stats: Stats):
    """Cross-stream waits from the order of calls where the trace has no sync record for
    them: PyTorch's ``wait_stream``/``wait_event`` records an event on the current stream and
    makes another wait for it, then launches onto that one; so a wait call waits, on the
    stream of the next GPU task its thread launches, for the last task its thread launched
    onto another stream before it (inferred; dropped where the waiting task began before that
    task ended). Returns (src, dst)."""
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    is_wait = _by_call_name(lambda v: bool(_WAIT_EVENT_RE.match(v)), vocab, names, kind)
    w = np.flatnonzero((kind == KIND_API) & is_wait[names])
    sync = tables["sync"]
    if len(w) and sync.num_rows:  # recorded ones are _recorded_waits'
        rec = _col(sync, "correlation")[_names(sync, "sync_kind") == "stream_wait_event"]
        w = w[~np.isin(corr[w], rec)]
    g = np.flatnonzero(gpu_mask & (launch_of >= 0))
    if not len(w) or not len(g):
        return empty
    c = launch_of[g]
    base = int(min(start[c].min(), start[w].min()))
    span = int(max(start[c].max(), start[w].max())) - base + 1
    key = unit[c].astype(np.int64) * span + (start[c] - base)
    o = np.lexsort((g, key))
    key, gs = key[o], g[o]
    q = unit[w].astype(np.int64) * span + (start[w] - base)
    nxt = np.searchsorted(key, q, side="right")
    ok = (nxt < len(key)) & (key[np.minimum(nxt, len(key) - 1)] // span == unit[w])
    w, nxt = w[ok], nxt[ok]
    d = gs[nxt]
    p = nxt - 1
    # walk back over this thread's launches onto the waiting stream itself
    for _ in range(64):
        same = (p >= 0) & (key[np.maximum(p, 0)] // span == unit[w]) & \
            (unit[gs[np.maximum(p, 0)]] == unit[d])
        if not same.any():
            break
        p = np.where(same, p - 1, p)
    ok = (p >= 0) & (key[np.maximum(p, 0)] // span == unit[w])
    s = gs[np.maximum(p, 0)]
    ok &= (unit[s] != unit[d]) & (start[d] >= end[s])
    stats.add("call_order_waits", int(ok.sum()), severity="info",
              detail="cross-stream waits without a sync record, from the order of the wait "
                     "call and the launches around it on its thread (inferred)")
    return s[ok].astype(np.int64), d[ok].astype(np.int64)


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


def _in_launch_order(src, dst, launch_of, start, stats: Stats):
    """The inferred waits (src -> dst, GPU tasks) whose src was launched no later than dst. A
    cross-stream wait is an event recorded after the awaited work and waited for before the
    waiting work is enqueued, so it never runs from work launched later: such a coincidence
    of the trace's timing is contention at most (``_contention`` may take it, an edge the
    simulator keeps only while its source runs). Edges with a launch outside the trace are
    kept."""
    ls = np.where(launch_of[src] >= 0, start[np.maximum(launch_of[src], 0)], -1)
    ld = np.where(launch_of[dst] >= 0, start[np.maximum(launch_of[dst], 0)], -1)
    late = (ls >= 0) & (ld >= 0) & (ls > ld)
    stats.add("inferred_waits_after_launch", int(late.sum()), severity="info",
              detail="inferred waits not made because the other stream's task was launched "
                     "after the task it would hold back (no wait runs from later work)")
    return src[~late], dst[~late]


def _drain_ns(t: pa.Table, device: np.ndarray, dur_ns: np.ndarray,
              devices: list[dict] | None) -> np.ndarray:
    """How long before its end each kernel's last wave begins to drain, at most (the window of
    ``_contention``): DRAIN_BLOCKS of its mean block run times (``base.occupancy.block_ns``),
    at least CONTENTION_TAIL_NS, which is all a kernel gets whose geometry or device (its SM
    count) the trace lacks."""
    out = np.full(t.num_rows, CONTENTION_TAIL_NS, np.int64)
    if not devices or not t.num_rows:
        return out
    blocks, threads = occupancy.launch_size(*(_col(t, c, 0) for c in (
        "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")))
    b = occupancy.block_ns(devices, device, dur_ns, blocks, threads,
                           _col(t, "registers_per_thread", 0), _col(t, "shared_memory_bytes", 0))
    return np.maximum(out, DRAIN_BLOCKS * b)


def _contention(tasks, ready, start, end, unit, g_ids, streams, nthr, drain):
    """For GPU tasks that began later than every constraint allows: a kernel on another stream
    of the device that was already running when the task became ready and ended at most
    WAIT_TOL_NS before its start, or at most its drain window (``_drain_ns``) after. It held
    the SMs: the task started as its last wave drained. The simulator keeps such an edge
    only where its source is running when the task's other bounds let it start
    (``SimGraph.held_if_running``): under a what-if that readies the task sooner, it does not
    wait for a kernel not yet begun. Returns (src, dst)."""
    if not len(tasks):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    dev_of_unit = np.full(int(unit.max()) + 1, -1, np.int64)
    dev_of_unit[nthr:nthr + len(streams)] = streams[:, 0]
    ge = end[g_ids]
    o = np.lexsort((ge, dev_of_unit[unit[g_ids]]))
    gs, gd, gend = g_ids[o], dev_of_unit[unit[g_ids]][o], ge[o]
    base = int(gend.min())
    key = gd * (1 << 50) + (gend - base)
    q = dev_of_unit[unit[tasks]] * (1 << 50) + (start[tasks] - base) + int(drain[gs].max())
    pos = np.searchsorted(key, q, side="right") - 1
    return _occupant(tasks.astype(np.int64), ready.astype(np.int64), pos, start, unit,
                     dev_of_unit, gs, gd, gend, drain)


@kernel("UniTuple(int64[::1], 2)", "int64[::1]", "int64[::1]", "int64[::1]", "int64[::1]",
        "int32[::1]", "int64[::1]", "int64[::1]", "int64[::1]", "int64[::1]", "int64[::1]")
def _occupant(tasks, ready, pos, start, unit, dev_of_unit, gs, gd, gend, drain):
    """_contention's search: walk back from the last end the longest drain window after each
    task's start to WAIT_TOL_NS before it; of the kernels of other streams that began by the
    task's ready time and ended within their own drain window after its start, the one that
    ended nearest its start."""
    src = np.empty(tasks.shape[0], np.int64)
    dst = np.empty(tasks.shape[0], np.int64)
    k = 0
    for j in range(tasks.shape[0]):
        p = pos[j]
        t = tasks[j]
        d = dev_of_unit[unit[t]]
        best, best_d = -1, np.int64(1) << 62
        while p >= 0 and gd[p] == d and gend[p] >= start[t] - WAIT_TOL_NS:
            c = gs[p]
            if unit[c] != unit[t] and start[c] <= ready[j] and gend[p] - start[t] <= drain[c]:
                dist = abs(gend[p] - start[t])
                if dist < best_d:
                    best, best_d = c, dist
            p -= 1
        if best >= 0:
            src[k] = best
            dst[k] = t
            k += 1
    return src[:k], dst[:k]


def timestamp_tick_ns(start: np.ndarray, end: np.ndarray) -> int:
    """The resolution of a trace's GPU timestamps: 1 us where every one is a whole microsecond
    (Kineto's JSON writes microseconds, most traces with no fraction), else 0 (nanoseconds).
    Two tasks' times rounded to it can put an end up to one tick after the start it
    released."""
    if not len(start) or (start % 1_000).any() or (end % 1_000).any():
        return 0
    return 1_000


def _infer_waits(tasks, start, end, unit, g_ids, streams, nthr):
    """For GPU tasks whose start nothing explains: a task on another stream of the same device
    that ended within WAIT_TOL_NS before it started, or up to one timestamp tick after it
    (``timestamp_tick_ns``: the two times were rounded apart)."""
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
    tick = timestamp_tick_ns(start[g_ids], ge)
    q = dev_of_unit[unit[tasks]] * (1 << 50) + (start[tasks] - base + tick)
    pos = np.searchsorted(key, q, side="right") - 1
    return _walk_back(tasks.astype(np.int64), pos, start, unit, dev_of_unit, gs, gd, gend)


@kernel("UniTuple(int64[::1], 2)", "int64[::1]", "int64[::1]", "int64[::1]", "int32[::1]",
        "int64[::1]", "int64[::1]", "int64[::1]", "int64[::1]")
def _walk_back(tasks, pos, start, unit, dev_of_unit, gs, gd, gend):
    """_infer_waits' search: from the last GPU end at or before each task's start (plus a
    timestamp tick) on its device, walk back over candidates on the task's own stream (a few
    at most) to the first task of another stream that ended within WAIT_TOL_NS."""
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
