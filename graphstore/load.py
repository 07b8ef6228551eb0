"""Activity tables of stored traces -> graph tables in DIR/graph.duckdb.

``load`` is graphstore's entry point: it reads a trace's activity tables from the store, builds
and checks its graph, maps tasks to iterations, layers and phases, and writes the five graph
tables in one transaction.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from daydream.base.columns import numpy_filled
from daydream.base.compiled import kernel
from daydream.base.errors import DaydreamError
from daydream.base.runner import later
from daydream.graphstore import db, labels
from daydream.graphstore.build import (
    EK_LAUNCH,
    KIND_HOST,
    UNEXPLAINED_NS,
    Graph,
    build,
    order_by_unit,
)
from daydream.graphstore.check import check_acyclic, check_launch_edges
from daydream.graphstore.params import (
    COLUMNS,
    layer_param_bytes,
    weight_ops,
    weight_ops_from_parquet,
)
from daydream.graphstore.schema import (
    EDGE_ANCHORS,
    EDGE_KINDS,
    GPU_KINDS,
    SLACK_KINDS,
    TASK_KINDS,
)
from daydream.ingest import schema as activity_schema
from daydream.ingest.store import Store, devices_of

# the activity tables the graph is built from: all but the trace row and the allocator's
# records (the report's memory view reads those, not the graph)
ACTIVITY = [t for t in activity_schema.COMMIT_ORDER if t not in ("trace", "memory")]
GPU_CODES = [TASK_KINDS.index(k) for k in GPU_KINDS]  # build.Graph.kind codes of GPU tasks
# A graph of this many tasks (or of this many rows of work in its activity tables) has its
# labels found on a thread while it is built, and its name column decoded and its cycle check
# run on others while its tasks are labelled: Polars, Arrow and the check's compiled loops run
# without the GIL, and while the graph is built the second core has little else to do
# (0.05-0.2 s each of a million-task graph off the critical path); for a smaller graph a
# thread would cost more than it overlaps.
THREADED_TASKS = 100_000
# ... and no more than this many: a larger graph's arrays are hundreds of MB, and the labels'
# frames beside them raised the peak memory of the 1 GB trace's ingest by 230 MB (2.70 to
# 2.93 GB of its 3 GB budget), for a second or so of its twenty
THREADED_TASKS_MAX = 2_500_000
_IS_GPU = np.isin(np.arange(len(TASK_KINDS)), GPU_CODES)  # by kind code: one lookup per task


def _on_gpu(kind: np.ndarray) -> np.ndarray:
    """``np.isin(kind, GPU_CODES)`` for task kind codes, by a table lookup."""
    return _IS_GPU[kind]


@dataclass
class Loaded:
    trace_id: str
    graph: Graph
    tables: dict[str, pa.Table]  # the graph tables as written


# Columns the graph does not read (large strings on big traces): left out of the load.
UNUSED = {"range": ("input_dims", "input_types")}


def activity_tables(store: Store, trace_id: str) -> dict[str, pa.Table]:
    return {t: _for_graph(t, store.read(t, trace_id)) for t in ACTIVITY}


def _for_graph(t: str, tab: pa.Table) -> pa.Table:
    drop = [c for c in UNUSED.get(t, ()) if c in tab.column_names]
    if drop:
        tab = tab.drop_columns(drop)
        for c in drop:  # keep the declared schema: the columns stay, as nulls
            tab = tab.append_column(activity_schema.TABLES[t].schema.field(c),
                                    pa.nulls(tab.num_rows, pa.string()))
    return tab


def graph_tables(tables: dict[str, pa.Table],
                 weights: pa.Table | Callable[[], pa.Table] | None = None,
                 latency: dict | None = None,
                 devices: list[dict] | None = None) -> tuple[Graph, dict[str, pa.Table]]:
    """Build and check the graph of one trace and return it with its graph tables.
    ``weights``: the trace's parameter-owning op calls (``params.weight_ops``), or a function
    that finds them (called with the labels), which give the layer table its parameter bytes
    where shapes were recorded; ``latency``: edge latencies other than graphstore.latency's
    (the accuracy suite's cross-validation); ``devices``: the trace's device properties
    (``devices_of``)."""
    work_rows = sum(tables[t].num_rows for t in ("kernel", "memcpy", "memset", "api", "range")
                    if t in tables)
    found = later(THREADED_TASKS <= work_rows <= THREADED_TASKS_MAX, _labels, tables, weights)
    g = build(tables, latency, devices)
    large = THREADED_TASKS <= g.n_tasks <= THREADED_TASKS_MAX
    # the cycle check (compiled, without the GIL) runs beside the labelling, which follows no
    # edge; its error still comes first, as when it ran before
    acyclic = later(large, check_acyclic, g.n_tasks, g.src, g.dst, g.anchor, g.name,
                    g.start_ns, g.obs_dur_ns)
    try:
        launch = g.ekind == EK_LAUNCH
        gpu = np.flatnonzero(_on_gpu(g.kind))
        api_corr = tables["api"]["correlation"].drop_null().to_numpy()
        corr = g.correlation[gpu]
        with_call = gpu[_isin_sorted(corr, api_corr) & (corr >= 0)]
        check_launch_edges(with_call, g.dst[launch])

        its, rl, layer_t = found.result()
        iteration = _task_iterations(g, its, launch)
        layer, phase = _task_labels(g, rl, launch, iteration)
    except BaseException:
        acyclic.result()
        raise
    acyclic.result()

    task = pa.table({
        "task_id": pa.array(np.arange(g.n_tasks, dtype=np.int64)),
        "kind": _named(g.kind, TASK_KINDS),
        "unit_id": pa.array(g.unit.astype(np.int32)),
        "name": g.name_column(),
        "layer": layer,
        "phase": phase,
        "iteration": pa.array(iteration, pa.int32(), mask=iteration < 0),
        "start_ns": pa.array(g.start_ns),
        "dur_ns": pa.array(g.dur_ns),
        "slack_ns": pa.array(g.task_slack_ns),
        "obs_dur_ns": pa.array(g.obs_dur_ns),
        "bytes": pa.array(g.bytes_, mask=g.bytes_ < 0),
        "correlation": pa.array(g.correlation, mask=g.correlation < 0),
        "range_id": pa.array(g.range_id, mask=g.range_id < 0),
        "blocking": pa.array(g.blocking),
        "priority": pa.nulls(g.n_tasks, pa.int64()),
    })
    edge = pa.table({
        "src": pa.array(g.src), "dst": pa.array(g.dst),
        "kind": _named(g.ekind, EDGE_KINDS),
        "anchor": _named(g.anchor, EDGE_ANCHORS),
        "lag_ns": pa.array(g.lag_ns), "slack_ns": pa.array(g.slack_ns),
        "binding": pa.array(g.binding), "inferred": pa.array(g.inferred),
    })
    unit = pa.table({
        "unit_id": pa.array(np.arange(len(g.unit_kind), dtype=np.int32)),
        "kind": pa.array(g.unit_kind, pa.string()),
        "pid": pa.array(g.unit_pid, pa.int64()), "tid": pa.array(g.unit_tid, pa.int64()),
        "device": pa.array(g.unit_device, pa.int32()),
        "stream": pa.array(g.unit_stream, pa.int64()),
        "name": pa.array(g.unit_name, pa.string()),
        "policy": pa.array(["fixed"] * len(g.unit_kind), pa.string()),
    })
    return g, {"task": task, "edge": edge, "unit": unit, "iteration": its, "layer": layer_t,
               "slack": slack_table(g, iteration)}


def _labels(tables: dict[str, pa.Table], weights: pa.Table | Callable[[], pa.Table] | None
            ) -> tuple[pa.Table, pa.Table, pa.Table]:
    """What the labels of a trace's tasks are made from, found from its activity tables alone
    (so beside the graph build): its iterations, its labelled ranges and its layer table."""
    ranges = labels.ranges_frame(tables)  # read by the three label passes
    its, rl = labels.iterations_and_labels(tables, ranges)
    rl = module_labels(tables, rl)
    layer_t = labels.find_layers(tables, rl, ranges)
    if callable(weights):
        weights = weights()
    if weights is not None and layer_t.num_rows:
        sizes = layer_param_bytes(weights, rl, its)
        if sizes:
            col = pa.array([sizes.get(x) for x in layer_t["layer"].to_pylist()], pa.int64())
            layer_t = layer_t.set_column(layer_t.schema.get_field_index("param_bytes"),
                                         layer_t.schema.field("param_bytes"), col)
    return its, rl, layer_t


def _isin_sorted(values: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """``np.isin(values, pool)`` for integer arrays, by binary search in the sorted pool:
    numpy's isin sorts both together (0.2 s for the correlations of a million-event trace),
    and its lookup table would span the ids' range (hundreds of MB)."""
    pool = np.sort(pool, kind="stable")  # about linear on nearly sorted ids (quicksort: 50x)
    if not len(pool):
        return np.zeros(len(values), bool)
    at = np.minimum(np.searchsorted(pool, values), len(pool) - 1)
    return pool[at] == values


def slack_table(g: Graph, iteration: np.ndarray) -> pa.Table:
    """The slack table (graphstore.schema.SLACK): binding edges' slack per iteration of their
    destination and kind. A GPU task that began more than UNEXPLAINED_NS later than its
    binding constraint allows, with no wait to explain it, is unexplained GPU idle; GPU work
    hanging off the trace start is origin slack."""
    b = np.flatnonzero(g.binding & (g.slack_ns != 0))
    d = g.dst[b]
    sl = g.slack_ns[b]
    # slack kind codes (into the sorted names) by edge kind code: no string per edge
    sorted_kinds = np.array(sorted(SLACK_KINDS))
    code_of = np.searchsorted(sorted_kinds, np.array(EDGE_KINDS))
    queued = np.isin(np.array(EDGE_KINDS), ["stream", "launch"])[g.ekind[b]]
    idle = _on_gpu(g.kind[d]) & queued & (sl > UNEXPLAINED_NS)
    code = np.where(idle, np.searchsorted(sorted_kinds, "gpu_idle"), code_of[g.ekind[b]])
    key = (iteration[d] + 1) * len(SLACK_KINDS) + code
    uk, inv = _groups(key)
    pos = np.bincount(inv, weights=np.maximum(sl, 0), minlength=len(uk))
    neg = np.bincount(inv, weights=np.minimum(sl, 0), minlength=len(uk))
    cnt = np.bincount(inv, minlength=len(uk))
    its = uk // len(SLACK_KINDS) - 1
    names = sorted_kinds[uk % len(SLACK_KINDS)]
    # task slack: peer waits of collectives, untraced stretches of threads
    for kind, mask in (("peer_wait", _on_gpu(g.kind)), ("untraced", ~_on_gpu(g.kind))):
        pw = np.flatnonzero((g.task_slack_ns > 0) & mask)
        if not len(pw):
            continue
        pit, pinv = np.unique(iteration[pw], return_inverse=True)
        its = np.concatenate([its, pit])
        names = np.concatenate([names, np.full(len(pit), kind)])
        cnt = np.concatenate([cnt, np.bincount(pinv, minlength=len(pit))])
        pos = np.concatenate([pos, np.bincount(pinv, weights=g.task_slack_ns[pw],
                                               minlength=len(pit))])
        neg = np.concatenate([neg, np.zeros(len(pit))])
    return pa.table({
        "iteration": pa.array(its.astype(np.int32), pa.int32(), mask=its < 0),
        "kind": pa.array(names.tolist(), pa.string()),
        "edges": pa.array(cnt.astype(np.int64)),
        "slack_ns": pa.array(np.rint(pos).astype(np.int64)),
        "early_ns": pa.array(np.rint(neg).astype(np.int64)),
    })


def _groups(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(key, return_inverse=True)`` for non-negative keys of a small range (an
    iteration and a kind): a count per key in place of a sort (or a hash) of every edge."""
    if not len(key) or key.min() < 0 or key.max() > 4 * len(key) + 1024:
        return np.unique(key, return_inverse=True)
    present = np.bincount(key) > 0
    rank = np.cumsum(present) - 1
    return np.flatnonzero(present), rank[key]


_MODULE_RE = r"^(?P<layer>.+?) \((?P<type>[^()]*)\) \[(?P<phase>forward|backward|recompute)\]$"
_MODULE_PHASE = {"forward": "forward", "backward": "backward", "recompute": "backward"}


def module_labels(tables: dict[str, pa.Table], rl: pa.Table) -> pa.Table:
    """Layer markers from our collector (range kind 'module', named
    "<module path> (<Type>) [forward|backward|recompute]") name their layer and phase outright:
    they override whatever was inferred for those ranges (recomputation runs in backward)."""
    import polars as pl

    rng = tables["range"]
    if not rng.num_rows or not rl.num_rows or not _has_value(rng["kind"], "module"):
        return rl
    r = pl.from_arrow(rng.select(["range_id", "kind", "name"])).with_columns(
        pl.col("kind").cast(pl.String), pl.col("name").cast(pl.String))
    m = r.filter(pl.col("kind") == "module").with_columns(
        pl.col("name").str.extract_groups(_MODULE_RE).alias("g")).unnest("g").filter(
        pl.col("layer").is_not_null())
    if not m.height:
        return rl
    m = m.select("range_id", pl.col("layer").alias("m_layer"),
                 pl.col("phase").replace_strict(_MODULE_PHASE).alias("m_phase"))
    out = pl.from_arrow(rl).join(m, on="range_id", how="left").with_columns(
        pl.coalesce("m_layer", "layer").alias("layer"),
        pl.coalesce("m_phase", "phase").alias("phase")).drop("m_layer", "m_phase")
    return out.to_arrow().cast(rl.schema).replace_schema_metadata(rl.schema.metadata)


def _has_value(col: pa.ChunkedArray, value: str) -> bool:
    """Whether a string column may hold ``value``: a dictionary-encoded one (as ingest writes
    kinds) is answered from its dictionaries, without a look at each row."""
    if pa.types.is_dictionary(col.type):
        return any(value in c.dictionary.to_pylist() for c in col.chunks)
    return True


def _named(codes: np.ndarray, names: tuple[str, ...]) -> pa.Array:
    """Small integer codes -> their names, as an Arrow dictionary column (what DuckDB reads
    into an ENUM or VARCHAR column without a string per row)."""
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)),
                                          pa.array(names, pa.string()))


def _task_labels(g: Graph, rl: pa.Table, launch: np.ndarray, iteration: np.ndarray
                 ) -> tuple[pa.Array, pa.Array]:
    """CPU tasks take the labels of their innermost range; GPU tasks those of their call."""
    # work on row numbers into the label table (-1 = none), then take once
    n = g.n_tasks
    if rl.num_rows:
        rid = rl["range_id"].to_numpy()
        size = int(max(rid.max(), g.range_id.max()) + 1)
        # one past the last range id: -1, what a task without a range (range_id -1) finds
        by_id = np.full(size + 1, -1, np.int64)
        by_id[rid] = np.arange(len(rid))
        row = by_id[g.range_id]
    else:
        row = np.full(n, -1, np.int64)
    src, dst = g.src[launch], g.dst[launch]
    row[dst] = row[src]
    # both as dictionary columns: codes per task, each label stored once
    if rl.num_rows:
        d = rl["layer"].combine_chunks().dictionary_encode()
        codes = np.append(numpy_filled(d.indices, -1), -1)[row]  # null: -1
        lay = pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32), mask=codes < 0),
                                             d.dictionary)
        pha = _gaps_take_phase(g, rl["phase"], row, iteration)
    else:
        lay = pa.DictionaryArray.from_arrays(pa.nulls(n, pa.int32()), pa.array([], pa.string()))
        pha = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)),
                                             pa.array(["other"]))
    return lay, pha


def _gaps_take_phase(g: Graph, phase: pa.ChunkedArray, row: np.ndarray,
                     iteration: np.ndarray) -> pa.Array:
    """The phase of each task: that of its label row ``row`` (-1: "other"), except that host
    time labelled "other" between two tasks of one phase and one iteration on its
    thread is that phase: interpreter and autograd-engine overhead between operators (between
    two backward nodes on the autograd thread, between two forward ops outside any annotation)
    belongs to the work around it, and transforms that remove a phase's CPU time must remove
    it too. (An idle stretch between two iterations' backward passes stays "other".)"""
    # the label rows' phases as codes into their distinct values, "other" among them
    d = phase.combine_chunks().fill_null("other").dictionary_encode()
    names = d.dictionary
    other = names.index("other").as_py()
    if other < 0:
        other = len(names)
        names = pa.concat_arrays([names, pa.array(["other"], names.type)])
    # one past the last label row: "other", what row -1 finds
    rl_code = np.append(d.indices.to_numpy(zero_copy_only=False).astype(np.int32),
                        np.int32(other))
    code = rl_code[row]
    if len(code):
        code = _fill_gaps(code, g.unit, iteration, g.kind, other, int(g.unit.max()) + 1,
                          KIND_HOST)
    return pa.DictionaryArray.from_arrays(pa.array(code), names)


@kernel("int32[::1]", "int32[::1]", "int32[::1]", "int64[::1]", "int8[::1]", "int64", "int64",
        "int64")
def _fill_gaps(code, unit, iteration, kind, other, n_units, host):
    """_gaps_take_phase's rule in one pass over the tasks in id order, keeping the last two
    tasks seen on each unit: a host task coded ``other`` between two tasks on its unit of one
    code (not ``other``) and one iteration (>= 0) takes that code."""
    out = code.copy()
    last = np.full(n_units, -1, np.int64)
    before = np.full(n_units, -1, np.int64)
    for k in range(code.shape[0]):
        u = unit[k]
        a = before[u]
        m = last[u]
        if (a >= 0 and code[m] == other and kind[m] == host and code[a] == code[k]
                and code[a] != other and iteration[a] == iteration[k] and iteration[a] >= 0):
            out[m] = code[a]
        before[u] = m
        last[u] = k
    return out


def _task_iterations(g: Graph, its: pa.Table, launch: np.ndarray) -> np.ndarray:
    """Iteration of each task by its start (CPU) or its launching call's start (GPU)."""
    it = np.full(g.n_tasks, -1, np.int64)
    if not its.num_rows:
        return it
    starts = its["start_ns"].to_numpy()
    ends = its["end_ns"].to_numpy()
    idx = its["iteration"].to_numpy()
    o = np.argsort(starts)
    # one past the last iteration: ends before any time, what a task before them all (-1)
    # finds, so that one lookup per task answers both
    starts = starts[o]
    ends = np.append(ends[o], np.iinfo(np.int64).min)
    idx = np.append(idx[o].astype(np.int64), -1)
    t = g.start_ns.copy()
    t[g.dst[launch]] = g.start_ns[g.src[launch]]
    pos = np.searchsorted(starts, t, side="right") - 1
    it = np.where(t < ends[pos], idx[pos], -1)
    it[0] = -1  # the origin task belongs to no iteration
    _orphans_follow_stream(g, it, launch)
    return it


def _orphans_follow_stream(g: Graph, it: np.ndarray, launch: np.ndarray) -> None:
    """A GPU task without a launch in the trace takes the iteration of the last launched task
    before it on its stream (a stream runs in order, and the GPU may run far behind the CPU:
    on the MI300X trace an iteration's GPU work ends some 15 ms into the next one's CPU time);
    before the first launched task of its stream it is the backlog of work launched before the
    window (-1); on a stream without launched tasks it keeps the iteration of its start."""
    gpu = np.flatnonzero(_on_gpu(g.kind))
    if not len(gpu):
        return
    launched = np.zeros(g.n_tasks, bool)
    launched[g.dst[launch]] = True
    o = gpu[order_by_unit(g.unit[gpu])]  # by stream, then in start order (ids)
    u = g.unit[o]
    has = launched[o]
    # forward fill within each stream: the position of the last launched task so far
    pos = np.maximum.accumulate(np.where(has, np.arange(len(o)), -1))
    head = np.r_[0, np.flatnonzero(u[1:] != u[:-1]) + 1]
    size = np.diff(np.r_[head, len(o)])
    ok = pos >= np.repeat(head, size)  # a launched task earlier on the same stream
    stream_has = np.repeat(np.logical_or.reduceat(has, head), size)
    it[o[~has & ok]] = it[o[pos[~has & ok]]]
    it[o[~has & ~ok & stream_has]] = -1


def load(store_root: Path | str, trace_id: str) -> Loaded:
    """Build the graph of one stored trace and write it to DIR/graph.duckdb."""
    st = Store(Path(store_root))
    g, gt = _build_stored(st, trace_id)
    db.write_trace(st.root, trace_id, gt)  # as Parquet, when it is large
    return Loaded(trace_id, g, gt)


def _build_stored(st: Store, trace_id: str) -> tuple[Graph, dict[str, pa.Table]]:
    """The graph of a stored trace, built from its activity tables (which are let go before
    it is written)."""
    tables = activity_tables(st, trace_id)
    return graph_tables(tables, weight_ops_from_parquet(st.file("range", trace_id)),
                        devices=devices_of(st.trace_row(trace_id, ["devices"])["devices"]))


def load_many(store_root: Path | str, trace_ids: list[str]) -> tuple[list[str], dict[str, str]]:
    """:func:`load` for many stored traces, their graphs written in batches by a
    :class:`Loader` (a transaction each, on its thread while the next graphs are built: one
    transaction per small graph cost some 60-90 ms of DuckDB's commit and checkpoint, ten
    times the build). Returns the traces built and the error of each whose graph failed its
    checks (the others are built and written all the same)."""
    from daydream.base.store import shared_between_threads
    st = Store(Path(store_root))
    loader = Loader(st, expected=len(trace_ids))
    failed: dict[str, str] = {}
    with shared_between_threads(st.root):
        try:
            for tid in trace_ids:
                try:
                    _, gt = _build_stored(st, tid)
                except DaydreamError as e:
                    failed[tid] = str(e)
                    continue
                loader.add(tid, gt)
            loader.flush()
        except BaseException:
            with contextlib.suppress(Exception):
                loader.wait()
            raise
    return [t for t in trace_ids if t in loader.loaded], failed


def stage_graph(trace_id: str, tables: dict[str, pa.Table], staging: str | None = None) -> dict:
    """Worker side of a batch ingest (``ingest.batch_ingest`` calls it where the trace was
    converted, with its activity tables as staged): build the graph and return ``{"graph": tables}``
    for :class:`Loader` to put into DuckDB, or ``{"graph_error": message}`` when the graph fails its
    checks (the trace is still stored; the error is reported against its file). A large graph is
    written as Parquet into ``staging`` here and returned as ``{"graph_dir": folder}``: the worker
    encodes it, and its tables never travel to the loader."""
    try:
        rng = tables["range"]
        weights = ((lambda: weight_ops(rng.select(COLUMNS).to_batches()))
                   if set(COLUMNS) <= set(rng.column_names) else None)
        trace = tables.get("trace")
        devices = (devices_of(trace["devices"][0].as_py())
                   if trace is not None and trace.num_rows else None)
        _, gt = graph_tables({t: _for_graph(t, tables[t]) for t in ACTIVITY}, weights,
                             devices=devices)
    except DaydreamError as e:
        return {"graph_error": str(e)}
    except Exception as e:  # a bug, not bad input: still report it against the file
        return {"graph_error": f"internal error: {type(e).__name__}: {e}"}
    if staging is not None and db.stored_as_parquet(gt):
        try:
            return {"graph_dir": str(db.stage_parquet(Path(staging) / trace_id, trace_id, gt))}
        except DaydreamError as e:
            return {"graph_error": str(e)}
    return {"graph": gt}


class Loader:
    """The one process that writes DuckDB in a batch ingest: graphs built by the workers
    (:func:`stage_graph`) are written in batches, each one transaction, so the database is
    opened read-write briefly and rarely and readers get their turn in between. Traces are
    committed to the activity store first: one killed before its graph is written has no graph,
    and the next ingest (``missing``) builds it. A batch is written when it holds ``batch``
    graphs or ``max_rows`` rows, or ``every_s`` after the last: a transaction costs some 35 ms
    whatever it holds (a batch of one BERT-small graph, 8,000 rows, in a store of 100 took
    39 ms; of 49, 5.4 ms a graph), so a batch is 256 graphs at most, not one.

    A batch is written on a thread of its own (``base.store.shared_between_threads`` lets the
    driver commit traces meanwhile) while the next fills, and ``flush`` writes the last one:
    the fleet's work that waits for the last graph is that batch alone. So, given
    ``expected`` (the graphs the ingest will bring), batches halve: the first is half of them
    (where that is fewer than ``batch``), each next one half of those still to come, never
    under ``MIN_BATCH`` (100 BERT-small graphs: 50, 25, 13, 8, and 4 left for ``flush``; the
    command ended 0.14-0.16 s after the last conversion, and 0.31-0.34 s where ``flush``
    wrote the other 50)."""

    MIN_BATCH = 8

    def __init__(self, store: Store, batch: int = 256, every_s: float = 5.0,
                 max_rows: int = 2_000_000, expected: int | None = None) -> None:
        self.store = store
        self.batch, self.every_s, self.max_rows = batch, every_s, max_rows
        self.expected = expected
        if expected is not None:
            self.batch = max(1, min(batch, -(-expected // 2)))
        self._handed = 0  # graphs handed to the writer so far
        self._queue: dict[str, dict[str, pa.Table] | Path] = {}
        self._rows = 0
        self._last = time.monotonic()
        self._writing: Future | None = None
        self.loaded: set[str] = set()

    def _limit(self) -> int:
        """The graphs the batch being filled is written at (the first: ``batch``, half the
        expected ones)."""
        if self.expected is None:
            return self.batch
        half = -(-(self.expected - self._handed) // 2)
        return max(min(self.MIN_BATCH, self.batch), min(self.batch, half))

    def add(self, trace_id: str, tables: dict[str, pa.Table] | Path) -> None:
        """Queue a graph: its tables, or the folder :func:`stage_graph` wrote it to."""
        self._queue[trace_id] = tables
        if not isinstance(tables, Path):
            self._rows += sum(t.num_rows for t in tables.values())
        if (len(self._queue) >= self._limit() or self._rows >= self.max_rows
                or time.monotonic() - self._last >= self.every_s):
            self._write(behind=True)

    def flush(self) -> list[str]:
        """Write what is queued, after the batch being written: every graph added is in the
        database when it returns (or its error raised)."""
        return self._write(behind=False)

    def _write(self, behind: bool) -> list[str]:
        self.wait()
        self._last = time.monotonic()
        if not self._queue:
            return []
        batch, self._queue, self._rows = self._queue, {}, 0
        self._handed += len(batch)
        if not behind:
            return self._commit(batch)
        self._writing = later(True, self._commit, batch)
        return []

    def wait(self) -> None:
        """Wait for the batch being written; raise what writing it raised."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def _commit(self, batch: dict[str, dict[str, pa.Table] | Path]) -> list[str]:
        db.write_traces(self.store.root, batch)
        self.loaded.update(batch)
        return list(batch)


def missing(store_root: Path | str) -> list[str]:
    """Stored traces whose graph is not in the graph db yet, or was built by other graph
    rules than this daydream's (``db.stale_ids``): both are (re)built from their activity
    tables."""
    st = Store(Path(store_root))
    rules = db.graph_rules()
    have = {t for t, r in db.graph_stamps(st.root).items() if r == rules}
    return [t for t in st.trace_ids() if t not in have]
