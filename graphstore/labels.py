"""Which training iteration, DNN layer and phase each activity range belongs to.

Set-based over the activity tables (numpy columns, as-of joins, one vectorized step per
nesting level, name rules once per distinct name); Python loops only over the few rows a rule
picks (step markers, modules, layers), where a Polars frame of them cost more than the loop on
a fleet's small traces.

``find_iterations(tables)``  the training iterations of a trace (ITERATION's columns);
``label_ranges(tables)``     layer and phase of every range (range_id, layer, phase): what applies
                             to anything that runs inside that range;
``iterations_and_labels(tables)``  both at once (the labels are found with the iterations);
``find_layers(tables, labels)``  the layers found (LAYER's columns);
``mapped_share(task)``       how much GPU time of a task table the labels cover.

Iterations (first rule that applies)
------------------------------------
1. ``ProfilerStep#N`` ranges (user_annotation; cpu_op in 2021 traces) on the thread holding most
   of them, one per name. Iteration i spans [start of step i, start of step i+1): boundaries in
   CPU time, where the profiler drew them. The last one ends at the later of its CPU end and the
   end of the last GPU activity (kernel, memcpy, memset) launched from within it. GPU work
   belongs to the iteration that launched it even when it runs after the CPU has moved on; a
   launch is the api row with the GPU activity's correlation id, in the step's process, whose
   start lies inside the step.
2. No ProfilerStep: outermost ``Optimizer.step#...`` ranges on the thread holding most of them
   (of one optimizer class, the one with most steps: a job stepping two optimizers per iteration
   is not two iterations). Iteration i ends where optimizer step i ends on the CPU and the next
   begins there. The part before the first step counts as iteration 0 and is taken to be a full
   one (a profile of a loop starts at the loop's top; param's resnet18 trace has 30 steps and
   30 iterations, mlp 40 and 40). It begins at the first ``enumerate(DataLoader)`` range before
   the first step when there is one, the batch fetch that every later iteration begins with
   (what precedes it is the loader's set-up), else at the thread's first range or call. What
   follows the last step belongs to no iteration; the last iteration ends as in rule 1.
3. Otherwise the whole trace is one iteration (label null).

Phases and layers
-----------------
Each range gets an *own* phase and layer from the first rule below that gives one; a range
without its own inherits its parent's (the innermost enclosing range on its thread). Phase
'other' and a null layer are what is left.

Phase, in order of precedence:
  a. names (``NAME_PHASE_RULES``): ``Optimizer.step#``/``Optimizer.zero_grad#`` and
     ``## optimizer ##`` -> weight_update; ``enumerate(DataLoader)#`` and ``## data_load ##``-like
     -> data_loading; ``## forward ##`` (also ``## forward:part ##``), ``*DataParallel.forward``
     and ``FSDP::*forward`` -> forward; ``## backward ##``, ``FSDP::*backward`` and the Python
     frame ``torch/_tensor.py(N): backward`` -> backward. These hold for user_annotation, nvtx,
     python_function and cpu_op ranges alike.
  b. backward ops -> backward: ranges with a forward thread id (``Fwd thread id`` > 0; Kineto
     writes 0 on forward ops) or named ``autograd::engine::evaluate_function: ...``.
  c. outermost ranges on an autograd thread -> backward: a thread with backward ops that is
     not its process's main thread (the thread of the iteration markers, else the one with most
     forward ops). It runs nothing but the backward pass (and the hooks it calls: DDP's
     all-reduces, checkpoint recomputation).
  d. ``nn.Module: X`` python_function ranges off autograd threads that start before the first
     backward op of their iteration -> forward.
  e. FSDP unit intervals -> the unit's phase (see layers, c).
  f. last, where a (thread, iteration) has no forward range at all (no annotations, no modules:
     2021 and param traces): ranges still 'other' that lie within the span from the first to
     the last forward op that autograd later ran a backward op for (taking each such op's
     outermost enclosing op, e.g. aten::conv2d around aten::cudnn_convolution) -> forward.
  g. gpu_user_annotation ranges, the GPU-side spans of CPU annotations, take the phase and
     layer of the CPU range with the same external id and name (a DDP ``nccl:all_reduce`` on
     the NCCL stream is backward because its CPU twin runs on the autograd thread); without a
     twin they go by the rules above on their own stream.

Layer (a, c and d give ranges their own layer, in that order; b reaches the backward ops that
none of them did):
  a. ``nn.Module: X`` python_function ranges: the module path, the ``nn.Module`` names of the
     enclosing modules joined by '.' (``DistributedDataParallel_0.ResNet_0.Conv2d_0``). Kineto's
     names carry a per-instance number, so one instance is one layer wherever it runs: a
     recomputation on the autograd thread (activation checkpointing) sees a shorter chain and
     takes the path of the instance's first appearance on a forward thread.
  b. backward ops: the layer of their forward op. The link is the fwdbwd flow where the trace
     has one (src = forward op start on its thread, dst = backward op start, matched on (pid,
     tid, ts)), else the sequence number: the latest forward op with the backward op's
     sequence number that started before it, in the same process (nested forward ops share the
     number; the latest is the one that made the autograd node). An
     ``autograd::engine::evaluate_function`` wrapper takes its linked node's layer; an
     ``AccumulateGrad`` node with no link takes the layer of the backward op before it on its
     thread (the engine runs it right after the node that produced the gradient).
  c. FSDP NVTX/annotation markers ``FSDP::pre_forward (encoder.block.3)`` ...
     ``FSDP::post_forward (encoder.block.3)`` (and pre/post_backward) are short hooks, not
     ranges around the module: the unit's interval runs from the start of its pre marker to the
     end of its post marker, on that thread; a post marker with no pre (the trace cut it off)
     opens at the thread's first range, a pre with no post closes at its last. Every range
     starting inside an interval takes the innermost one's module path and phase.
  d. only where a trace has none of a-c (no modules, no FSDP markers): each outermost cpu_op
     that holds a forward op linked to a backward op is a layer, named after the op and its
     ordinal among ops of that name in the iteration (``conv2d#3``): one layer per
     differentiable top-level op, the same name in every iteration.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from daydream.base.columns import numpy_filled
from daydream.graphstore.schema import GPU_KINDS, ITERATION, LAYER, PHASES, GTable

FORWARD, BACKWARD, WEIGHT_UPDATE, DATA_LOADING, OTHER = (PHASES.index(p) for p in (
    "forward", "backward", "weight_update", "data_loading", "other"))
NONE = -1
MARKED = -2  # a name rule matched but gives no phase (ProfilerStep)

GPU_TABLES = ("kernel", "memcpy", "memset")

# Range names that carry a phase, first match wins (regular expressions, matched from the start).
NAME_PHASE_RULES: tuple[tuple[str, str], ...] = (
    (r"^ProfilerStep#", ""),  # an iteration, no phase
    (r"^Optimizer\.(step|zero_grad)#", "weight_update"),
    (r"^enumerate\(DataLoader\)", "data_loading"),
    (r"^##\s*(forward|fwd)\b", "forward"),
    (r"^##\s*(backward|bwd)\b", "backward"),
    (r"^##\s*(optimizer|zero_grad)\b", "weight_update"),
    (r"^##\s*(data_load|load_batch|wait_for_batch|copy_batch_to_gpu)\b", "data_loading"),
    # loss.backward() on the calling thread (Python tracing): it waits for the autograd engine
    (r"^torch/_tensor\.py\(\d+\): backward$", "backward"),
    (r"^\w*DataParallel\.forward$", "forward"),
    (r"^FSDP::\w*forward", "forward"),
    (r"^FSDP::\w*backward", "backward"),
)
MODULE_PREFIX = "nn.Module: "
BACKWARD_OP_PREFIX = "autograd::engine::evaluate_function:"
FSDP_MARKER = r"^FSDP::(?<when>pre|post)_(?<phase>forward|backward)\s*\((?<fqn>[^)]*)\)"
FSDP_PREFIX = "FSDP::"  # what every FSDP_MARKER match begins with
STEP_RE = r"^ProfilerStep#\d+$"
STEP_PREFIX = "ProfilerStep#"
OPTIMIZER_STEP = "Optimizer.step#"
DATALOADER = "enumerate(DataLoader)"
# label_ranges writes {layer: source} here, in the result's schema metadata, for find_layers.
LAYER_SOURCES_KEY = b"daydream.layer_sources"

_SQL_ARROW = {"VARCHAR": pa.string(), "BIGINT": pa.int64(), "INTEGER": pa.int32()}


def _arrow_schema(table: GTable, drop: tuple[str, ...] = ("trace_id",)) -> pa.Schema:
    fields = []
    for c in table.columns:
        if c.name in drop:
            continue
        sql = c.sql.split()[0]
        fields.append(pa.field(c.name, _SQL_ARROW[sql], "NOT NULL" not in c.sql))
    return pa.schema(fields)


ITERATION_SCHEMA = _arrow_schema(ITERATION)
LAYER_SCHEMA = _arrow_schema(LAYER)
LABEL_SCHEMA = pa.schema([pa.field("range_id", pa.int64(), False),
                          pa.field("layer", pa.string()),
                          pa.field("phase", pa.string(), False)])

_RANGE_COLS = ("range_id", "pid", "tid", "kind", "name", "start_ns", "dur_ns", "depth", "parent",
               "external_id", "sequence_number", "fwd_thread_id")


# --------------------------------------------------------------------------------------------
# ranges as one frame, and the nesting tree over it


def ranges_frame(tables: dict[str, pa.Table]) -> pl.DataFrame:
    """The range table as polars with string kind/name, end_ns and row position ``pos``."""
    t = tables.get("range")
    if t is None or t.num_rows == 0:
        return pl.DataFrame(schema={
            "range_id": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "kind": pl.String,
            "name": pl.String, "start_ns": pl.Int64, "dur_ns": pl.Int64, "depth": pl.Int32,
            "parent": pl.Int64, "external_id": pl.Int64, "sequence_number": pl.Int64,
            "fwd_thread_id": pl.Int64,
            "end_ns": pl.Int64, "pos": pl.Int64})
    df = pl.from_arrow(t.select(list(_RANGE_COLS)))
    return df.with_columns(pl.col("kind").cast(pl.String), pl.col("name").cast(pl.String),
                           (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
                           pl.int_range(pl.len(), dtype=pl.Int64).alias("pos"))


def _filled(s: pl.Series, value: int) -> np.ndarray:
    """An integer column as numpy with its nulls set to ``value``, through Arrow: a Polars
    Series method (fill_null, is_not_null) runs as a query of its own, ~0.1 ms, a dozen of
    which were a tenth of a small trace's labels."""
    return numpy_filled(s.to_arrow(), value)


def _not_null(s: pl.Series) -> np.ndarray:
    """Which rows of ``s`` are set (``_filled``'s way)."""
    return s.to_arrow().is_valid().to_numpy(zero_copy_only=False)


def _parent_pos(ids: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Row position of each parent range id (-1: none, or not among ``ids``)."""
    if np.array_equal(ids, np.arange(len(ids))):
        return parent
    # range_id is not the row number: map ids to positions
    order = np.argsort(ids, kind="stable")
    known = ids[order]
    at = np.clip(np.searchsorted(known, parent), 0, len(ids) - 1)
    return np.where((parent >= 0) & (known[at] == parent), order[at], -1)


def _factorize(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values of an integer array and each element's index among them
    (np.unique with return_inverse; by a lookup table, without a sort, when the values span a
    short range)."""
    if not len(a):
        return a[:0], np.zeros(0, np.int64)
    lo, hi = int(a.min()), int(a.max())
    if hi - lo > 4 * len(a) + 64:
        values, inverse = np.unique(a, return_inverse=True)
        return values, inverse.reshape(-1)
    seen = np.zeros(hi - lo + 1, bool)
    seen[a - lo] = True
    return np.flatnonzero(seen) + lo, (np.cumsum(seen) - 1)[a - lo]


def _compact(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs (a, b) as dense codes 0..k-1, and the codes of a and of b of each code (codes of
    the distinct values of a and b, in sorted order)."""
    _, ac = _factorize(a)
    bv, bc = _factorize(b)
    key = ac.astype(np.int64) * len(bv) + bc
    if ac.max(initial=0) * len(bv) + len(bv) <= 4 * len(a) + 64:  # small key space: no sort
        seen = np.zeros(ac.max(initial=0) * len(bv) + len(bv), bool)
        seen[key] = True
        uk = np.flatnonzero(seen)
        remap = np.cumsum(seen) - 1
        code = remap[key]
    else:
        uk, code = np.unique(key, return_inverse=True)
    return code.reshape(-1), uk // len(bv), uk % len(bv)


class _Tree:
    """Parent positions and rows grouped by depth, for top-down propagation."""

    def __init__(self, r: pl.DataFrame):
        self.parent = _parent_pos(r["range_id"].to_numpy(),
                                  _filled(r["parent"], -1).astype(np.int64))
        # ingest gives every range its parent's depth + 1, so a level's parents are done
        depth = r["depth"].to_numpy()
        if len(depth) and 0 <= depth.min() and depth.max() < 2 ** 15:
            depth = depth.astype(np.int16)  # a stable sort of 16-bit keys is a radix sort
        order = np.argsort(depth, kind="stable")
        order = order[self.parent[order] >= 0]  # roots inherit nothing
        cut = np.flatnonzero(np.diff(depth[order])) + 1
        # (rows, their parents) per level, top down
        self.levels = [(idx, self.parent[idx]) for idx in np.split(order, cut)
                       if len(idx)] if len(order) else []

    def inherit(self, own: np.ndarray, parent_first: bool = False) -> np.ndarray:
        """own where set (>= 0), else the parent's result; ``parent_first``: the outermost."""
        out = own.copy()
        for idx, p in self.levels:
            up = out[p]
            mine = own[idx]
            if parent_first:
                out[idx] = np.where(up >= 0, up, mine)
            else:
                out[idx] = np.where(mine >= 0, mine, up)
        return out


def _busiest_thread(df: pl.DataFrame) -> tuple[int, int]:
    """The (pid, tid) with most rows; ties: the least pid, then tid."""
    return _busiest(df["pid"].to_numpy(), df["tid"].to_numpy())


def _busiest(pid: np.ndarray, tid: np.ndarray) -> tuple[int, int]:
    """``_busiest_thread`` of rows given as their pid and tid."""
    code, th_pid, th_tid = _compact(pid, tid)  # codes in (pid, tid) order
    top = int(np.argmax(np.bincount(code)))  # the first maximum
    at = np.flatnonzero(code == top)[0]
    return int(pid[at]), int(tid[at])


def _outermost(df: pl.DataFrame) -> pl.DataFrame:
    """Rows not nested in an earlier row of ``df`` on the same thread."""
    df = df.sort(["pid", "tid", "start_ns", "end_ns"], descending=[False, False, False, True])
    prev_end = pl.col("end_ns").cum_max().shift(1).over("pid", "tid")
    return df.filter(prev_end.is_null() | (pl.col("start_ns") >= prev_end))


def _asof(left: pl.DataFrame, right: pl.DataFrame, **kw) -> pl.DataFrame:
    """Backward as-of join; callers sort both sides on the key (polars cannot check that
    within ``by`` groups)."""
    return left.join_asof(right, strategy="backward", check_sortedness=False, **kw)


def _asof_rows(left: tuple[np.ndarray, np.ndarray, np.ndarray],
               right: tuple[np.ndarray, np.ndarray, np.ndarray],
               tie: np.ndarray | None = None) -> np.ndarray:
    """A backward as-of join by group, in numpy: for each left row (a, b, t), the index of the
    right row of the same group (a, b) with the latest t at or before it (-1: none); of right
    rows tied on t, the last by ``tie``, then by index. What ``_asof`` does with ``by`` on a
    few hundred rows, without two Polars frames, their sorts and the join (~0.3 ms each)."""
    n = len(left[0])
    if not n or not len(right[0]):
        return np.full(n, -1, np.int64)
    group, _, _ = _compact(np.concatenate([left[0], right[0]]),
                           np.concatenate([left[1], right[1]]))
    _, rank = _factorize(np.concatenate([left[2], right[2]]))  # times as dense ranks
    key = group.astype(np.int64) * (int(rank.max()) + 1) + rank  # (group, time) in order
    lkey, rkey = key[:n], key[n:]
    order = np.lexsort((np.arange(len(rkey)), *(() if tie is None else (tie,)), rkey))
    at = np.searchsorted(rkey[order], lkey, side="right") - 1
    hit = order[np.maximum(at, 0)]
    return np.where((at >= 0) & (group[n:][hit] == group[:n]), hit, -1)


class _Names:
    """A string column as codes into its distinct values: name rules (prefixes, regular
    expressions) run once per distinct name, not once per range."""

    def __init__(self, s: pl.Series | pa.DictionaryArray):
        d = s if isinstance(s, pa.DictionaryArray) else pc.dictionary_encode(s.to_arrow())
        self.values = pl.Series(d.dictionary.cast(pa.string())).append(
            pl.Series([None], dtype=pl.String))  # the last one stands for null
        idx = d.indices
        if idx.null_count:
            idx = pc.fill_null(idx, len(self.values) - 1)
        self.codes = idx.to_numpy(zero_copy_only=False).astype(np.int64)
        self._list: list | None = None  # values as Python strings, for per_value

    @classmethod
    def of_ranges(cls, tables: dict[str, pa.Table], r: pl.DataFrame, column: str = "name"
                  ) -> _Names:
        """A string column of ``r`` (``ranges_frame(tables)``), from the range table's own
        dictionary where r holds exactly its rows, else encoded afresh."""
        t = tables.get("range")
        if t is not None and t.num_rows == r.height and t[column].num_chunks == 1:
            col = t[column].chunk(0)
            if (isinstance(col, pa.DictionaryArray)
                    and np.array_equal(t["range_id"].to_numpy(), r["range_id"].to_numpy())):
                return cls(col)
        return cls(r[column])

    def per_value(self, rule: tuple, fn: Callable[[pl.Series], pl.Series] | None,
                  py: Callable[[str], bool] | None = None) -> list:
        """``fn`` (a rule over a string Series) of each distinct value, in ``values`` order,
        or ``py`` of each string (null: None) for a rule Python's str methods say exactly (a
        fleet's traces bring new names each, and a Polars call on a few costs more than
        them); what a rule gave a string is kept across traces (``_RULE_MEMO``), so a fleet
        whose traces share their range names runs each rule on the names it has not seen
        only."""
        if self._list is None:
            self._list = self.values.to_list()
        vals = self._list
        memo = _RULE_MEMO.get(rule)
        if memo is None:
            if len(_RULE_MEMO) >= 256:
                _RULE_MEMO.clear()
            memo = _RULE_MEMO[rule] = {}
        new = [v for v in dict.fromkeys(vals) if v not in memo]
        if new:
            if len(memo) + len(new) > _RULE_MEMO_VALUES:
                memo.clear()
            if py is not None:
                memo.update((v, None if v is None else py(v)) for v in new)
            else:
                memo.update(zip(new, fn(pl.Series(new, dtype=pl.String)).to_list(),
                                strict=True))
        return [memo[v] for v in vals]

    def value(self, row: int) -> str | None:
        """The string of one row."""
        if self._list is None:
            self._list = self.values.to_list()
        return self._list[self.codes[row]]

    def _rule_mask(self, rule: tuple, fn: Callable[[pl.Series], pl.Series] | None,
                   py: Callable[[str], bool] | None = None) -> np.ndarray:
        per = self.per_value(rule, fn, py)
        return np.fromiter((v is True for v in per), bool, len(per))[self.codes]

    def starts_with(self, prefix: str) -> np.ndarray:
        return self._rule_mask(("starts_with", prefix), None, lambda v: v.startswith(prefix))

    def contains(self, pattern: str, literal: bool = False, prefix: str = "") -> np.ndarray:
        """A regular expression (Polars', Rust's syntax), or a LITERAL substring. ``prefix``:
        a literal that the pattern is anchored to (``^prefix...``), so that only names
        starting with it can match."""
        if literal:
            return self._rule_mask(("contains", pattern, True), None, lambda v: pattern in v)
        return self._rule_mask(("contains", pattern, False), _regex(pattern, prefix))

    def any_contains(self, pattern: str, prefix: str = "") -> bool:
        """Whether any distinct value (a row's or not) matches ``contains``' pattern."""
        return any(v is True for v in self.per_value(("contains", pattern, False),
                                                     _regex(pattern, prefix)))

    def equals(self, value: str) -> np.ndarray:
        return self._rule_mask(("equals", value), None, lambda v: v == value)

    def differs(self, value: str) -> np.ndarray:
        """Rows whose value is not VALUE (null rows: False)."""
        return self._rule_mask(("differs", value), None, lambda v: v != value)


def _regex(pattern: str, prefix: str) -> Callable[[pl.Series], pl.Series]:
    """``Series.str.contains(pattern)``, run only on the values that start with ``prefix``
    (the others cannot match a pattern anchored to it): a fleet's traces bring new names each,
    and matching a regular expression on all of them was most of the time of a small trace's
    iteration search."""
    def run(s: pl.Series) -> pl.Series:
        if not prefix:
            return s.str.contains(pattern)
        vals = s.to_list()
        out = [None if v is None else False for v in vals]
        at = [i for i, v in enumerate(vals) if v is not None and v.startswith(prefix)]
        if at:
            hits = pl.Series([vals[i] for i in at], dtype=pl.String).str.contains(pattern)
            for i, hit in zip(at, hits.to_list(), strict=True):
                out[i] = hit
        return pl.Series(out, dtype=pl.Boolean)
    return run


# what each name rule gave each distinct string (``_Names.per_value``): rule -> {value: result},
# a rule's entries dropped past _RULE_MEMO_VALUES strings
_RULE_MEMO: dict[tuple, dict] = {}
_RULE_MEMO_VALUES = 100_000


# --------------------------------------------------------------------------------------------
# iterations


def _gpu_end_launched(tables: dict[str, pa.Table], pid: int, lo: int, hi: int) -> int | None:
    """End of the last GPU activity launched by ``pid`` from a call starting in [lo, hi]."""
    api = tables.get("api")
    if api is None or api.num_rows == 0:
        return None
    start = api["start_ns"].to_numpy()
    corr, known = _int_column(api["correlation"])
    at = (api["pid"].to_numpy() == pid) & (start >= lo) & (start <= hi) & known
    if not at.any():
        return None
    corr = np.sort(corr[at])  # duplicates do no harm to the lookup below
    ends = []
    for name in GPU_TABLES:
        t = tables.get(name)
        if t is None or t.num_rows == 0:
            continue
        c, ok = _int_column(t["correlation"])
        i = np.clip(np.searchsorted(corr, c), 0, len(corr) - 1)
        hit = ok & (corr[i] == c)
        if hit.any():
            ends.append(int((t["start_ns"].to_numpy() + t["dur_ns"].to_numpy())[hit].max()))
    return max(ends) if ends else None


def _int_column(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """An integer column as numpy values (0 where null) and a mask of the non-null ones."""
    return numpy_filled(col, 0), col.is_valid().to_numpy()


def _trace_span(tables: dict[str, pa.Table]) -> tuple[int, int] | None:
    lo, hi = [], []
    for name in ("range", "api", *GPU_TABLES):
        t = tables.get(name)
        if t is None or t.num_rows == 0:
            continue
        s = t["start_ns"].to_numpy()
        e = s + t["dur_ns"].to_numpy()
        lo.append(int(s.min()))
        hi.append(int(e.max()))
    return (min(lo), max(hi)) if lo else None


def _iterations(tables: dict[str, pa.Table], r: pl.DataFrame, names: _Names, kinds: _Names
                ) -> tuple[pa.Table, tuple[int, int] | None]:
    """The iteration table and the (pid, tid) of the markers it came from (None: whole trace).
    ``names``, ``kinds``: r's name and kind columns encoded."""
    is_cpu = kinds.differs("gpu_user_annotation")
    # which rule applies is found on the encoded names first: a filter of an empty frame
    # costs as much as one of a small trace's
    at_step = is_cpu & names.contains(STEP_RE, prefix=STEP_PREFIX)
    at_opt = is_cpu & names.starts_with(OPTIMIZER_STEP)
    main: tuple[int, int] | None = None
    if at_step.any():
        # the step markers' rows in numpy (a few per trace: four Polars queries cost ~0.4 ms
        # of a small trace's labels): those of the thread with most, by start then depth,
        # the first of each name
        pid, tid = r["pid"].to_numpy(), r["tid"].to_numpy()
        at = np.flatnonzero(at_step)
        main = _busiest(pid[at], tid[at])
        at = at[(pid[at] == main[0]) & (tid[at] == main[1])]
        start = r["start_ns"].to_numpy()
        at = at[np.lexsort((r["depth"].to_numpy()[at], start[at]))]
        seen, firsts = set(), []
        for i in at.tolist():
            if (name := names.value(i)) not in seen:
                seen.add(name)
                firsts.append(i)
        labels = [names.value(i) for i in firsts]
        starts = start[firsts].astype(np.int64)
        last_end = int(r["end_ns"].to_numpy()[firsts[-1]])
        ends = np.append(starts[1:], last_end).astype(np.int64)
        window = (int(starts[-1]), last_end)
        source = "ProfilerStep"
    else:
        opt = _outermost(r.filter(pl.Series(at_opt))) if at_opt.any() else r.clear()
        if opt.height:
            cpu = r.filter(pl.Series(is_cpu))
            cls = (opt.group_by("name").agg(pl.len(), pl.col("end_ns").mean().alias("e"))
                   .sort(["len", "e"], descending=True)["name"][0])
            opt = opt.filter(pl.col("name") == cls)
            main = _busiest_thread(opt)
            opt = opt.filter((pl.col("pid") == main[0]) & (pl.col("tid") == main[1])
                             ).sort("start_ns")
            step_end = opt["end_ns"].to_numpy().astype(np.int64)
            on_main = cpu.filter((pl.col("pid") == main[0]) & (pl.col("tid") == main[1]))
            fetch = on_main.filter(pl.col("name").str.starts_with(DATALOADER)
                                   & (pl.col("start_ns") < opt["start_ns"][0]))
            if fetch.height:
                first = int(fetch["start_ns"].min())
            else:
                first = int(on_main["start_ns"].min())
                api = tables.get("api")
                if api is not None and api.num_rows:
                    a = pl.from_arrow(api.select(["pid", "tid", "start_ns"])).filter(
                        (pl.col("pid") == main[0]) & (pl.col("tid") == main[1]))
                    if a.height:
                        first = min(first, int(a["start_ns"].min()))
            starts = np.append(first, step_end[:-1]).astype(np.int64)
            ends = step_end.copy()
            labels = opt["name"].to_list()
            window = (int(starts[-1]), int(step_end[-1]))
            source = "Optimizer.step"
        else:
            span = _trace_span(tables)
            if span is None:
                return ITERATION_SCHEMA.empty_table(), None
            return pa.table({"iteration": pa.array([0], pa.int32()),
                             "label": pa.array([None], pa.string()),
                             "source": ["whole_trace"], "start_ns": [span[0]],
                             "end_ns": [span[1]]}, schema=ITERATION_SCHEMA), None
    gpu_end = _gpu_end_launched(tables, main[0], *window)
    if gpu_end is not None and gpu_end > ends[-1]:
        ends[-1] = gpu_end
    n = len(starts)
    table = pa.table({"iteration": pa.array(np.arange(n, dtype=np.int32)),
                      "label": pa.array(labels, pa.string()),
                      "source": pa.array([source] * n, pa.string()),
                      "start_ns": pa.array(starts, pa.int64()),
                      "end_ns": pa.array(ends, pa.int64())}, schema=ITERATION_SCHEMA)
    return table, main


def find_iterations(tables: dict[str, pa.Table], ranges: pl.DataFrame | None = None
                    ) -> pa.Table:
    """Training iterations of one trace: ITERATION's columns without trace_id (module doc).
    ``ranges``: ``ranges_frame(tables)`` when the caller has it already."""
    r = ranges_frame(tables) if ranges is None else ranges
    return _iterations(tables, r, _Names.of_ranges(tables, r),
                       _Names.of_ranges(tables, r, "kind"))[0]


def _iteration_of(t: np.ndarray, its: pa.Table) -> np.ndarray:
    """Index of the iteration whose [start, end) holds each time, else -1."""
    if its.num_rows == 0:
        return np.full(len(t), -1, np.int64)
    starts = its["start_ns"].to_numpy()
    ends = its["end_ns"].to_numpy()
    i = np.searchsorted(starts, t, side="right") - 1
    ok = (i >= 0) & (t < ends[np.clip(i, 0, None)])
    return np.where(ok, i, -1)


# --------------------------------------------------------------------------------------------
# intervals that are not ranges (FSDP unit hooks)


_FSDP_SCHEMA = {"pid": pl.Int64, "tid": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
                "fqn": pl.String, "phase": pl.String}


@functools.cache
def _no_fsdp() -> pl.DataFrame:
    """No FSDP intervals (made once: a frame built from a schema costs ~0.3 ms)."""
    return pl.DataFrame(schema=_FSDP_SCHEMA)


def _fsdp_intervals(r: pl.DataFrame, names: _Names | None = None) -> pl.DataFrame:
    """FSDP unit intervals per thread: pid, tid, start_ns, end_ns, fqn, phase (module doc c).
    ``names``: r's names, when the caller has them encoded."""
    empty = _no_fsdp()
    if names is not None and not names.any_contains(FSDP_MARKER, prefix=FSDP_PREFIX):
        return empty
    m = (r.select("pid", "tid", "start_ns", "end_ns",
                  pl.col("name").str.extract_groups(FSDP_MARKER).alias("g"))
         .unnest("g").filter(pl.col("fqn").is_not_null()))
    if not m.height:
        return empty
    m = m.with_columns(pl.col("fqn").str.strip_chars())
    bounds = r.group_by("pid", "tid").agg(pl.col("start_ns").min().alias("first"),
                                          pl.col("end_ns").max().alias("last"))
    key = ["pid", "tid", "phase", "fqn"]
    m = (m.sort([*key, "start_ns"])
         .with_columns(pl.col("when").shift(-1).over(key).alias("next_when"),
                       pl.col("end_ns").shift(-1).over(key).alias("next_end"),
                       pl.col("when").shift(1).over(key).alias("prev_when"))
         .join(bounds, on=["pid", "tid"]))
    pre = m.filter(pl.col("when") == "pre").select(
        "pid", "tid", "start_ns",
        pl.when(pl.col("next_when") == "post").then(pl.col("next_end"))
        .otherwise(pl.col("last") + 1).alias("end_ns"), "fqn", "phase")
    lead = m.filter((pl.col("when") == "post")
                    & (pl.col("prev_when").is_null() | (pl.col("prev_when") != "pre"))).select(
        "pid", "tid", pl.col("first").alias("start_ns"), "end_ns", "fqn", "phase")
    return pl.concat([pre, lead]).select(empty.columns)


def _innermost(points: pl.DataFrame, iv: pl.DataFrame) -> pl.DataFrame:
    """For points (pos, pid, tid, t): the innermost interval of ``iv`` (pid, tid, start_ns,
    end_ns, payload...) with start_ns <= t < end_ns on the same thread. Exact for properly nested
    intervals: the nesting level at t is (starts <= t) - (ends <= t), and the innermost interval
    is the latest one started at that level minus one."""
    by = ["pid", "tid"]
    iv = (iv.filter(pl.col("end_ns") > pl.col("start_ns"))
          .sort([*by, "start_ns", "end_ns"], descending=[False, False, False, True])
          .with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over(by).alias("rank")))
    n_start = (iv.select(*by, pl.col("start_ns").alias("s"))
               .with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over(by)
                             .alias("n_start")).sort("s"))
    n_end = (iv.select(*by, pl.col("end_ns").alias("e")).sort([*by, "e"])
             .with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over(by)
                           .alias("n_end")).sort("e"))
    # depth of each interval: intervals started before it minus those ended by its start
    iv = (_asof(iv.sort("start_ns"), n_end, left_on="start_ns", right_on="e", by=by)
          .with_columns((pl.col("rank") - pl.col("n_end").fill_null(0)).alias("level"))
          .drop("e", "n_end", "rank"))
    pts = _asof(points.sort("t"), n_start, left_on="t", right_on="s", by=by)
    pts = (_asof(pts, n_end, left_on="t", right_on="e", by=by)
           .with_columns((pl.col("n_start").fill_null(0) - pl.col("n_end").fill_null(0) - 1)
                         .alias("level"))
           .filter(pl.col("level") >= 0).drop("s", "e", "n_start", "n_end"))
    hit = _asof(pts, iv.rename({"start_ns": "iv_start"}).sort("iv_start"), left_on="t",
                right_on="iv_start", by=[*by, "level"])
    return hit.filter(pl.col("end_ns").is_not_null() & (pl.col("t") < pl.col("end_ns")))


# --------------------------------------------------------------------------------------------
# forward <-> backward links


def _backward_links(r: pl.DataFrame, flow: pa.Table | None, is_bwd: np.ndarray) -> pl.DataFrame:
    """(bwd_pos, fwd_pos): each backward op and the forward op it is the gradient of."""
    out = [pl.DataFrame(schema={"bwd_pos": pl.Int64, "fwd_pos": pl.Int64})]
    if flow is not None and flow.num_rows:
        # only the fwdbwd flows cross into polars
        fwdbwd = pc.fill_null(pc.equal(flow["kind"].cast(pa.string()), "fwdbwd"), False)
        f = pl.from_arrow(flow.filter(fwdbwd)).with_columns(pl.col("kind").cast(pl.String))
        if f.height:
            # several ranges may start at the same ts: prefer the one with a sequence number,
            # then the innermost
            at = (r.select("pid", "tid", "start_ns", "pos",
                           pl.col("sequence_number").is_not_null().alias("has_seq"), "depth")
                  .sort(["has_seq", "depth", "pos"], descending=[True, True, False])
                  .unique(["pid", "tid", "start_ns"], keep="first", maintain_order=True)
                  .drop("has_seq", "depth"))
            lk = (f.join(at.rename({"pos": "fwd_pos"}), left_on=["src_pid", "src_tid",
                                                                 "src_ts_ns"],
                         right_on=["pid", "tid", "start_ns"])
                  .join(at.rename({"pos": "bwd_pos"}), left_on=["dst_pid", "dst_tid",
                                                                "dst_ts_ns"],
                        right_on=["pid", "tid", "start_ns"]))
            # a backward op with several flows into it: the earliest forward op (a join's
            # output order is not defined, so pick by value, not by position)
            out.append(lk.group_by("bwd_pos").agg(pl.col("fwd_pos").min()))
    linked = np.zeros(r.height, bool)
    linked[pl.concat(out)["bwd_pos"].to_numpy()] = True
    has_seq = _not_null(r["sequence_number"])
    want_bwd, want_fwd = is_bwd & has_seq & ~linked, ~is_bwd & has_seq
    if want_bwd.any() and want_fwd.any():  # (most small traces have no backward op)
        # the latest forward op of the same process and sequence number that started at or
        # before it; of those started together, the innermost
        pid, seq = r["pid"].to_numpy(), _filled(r["sequence_number"], 0)
        start, depth = r["start_ns"].to_numpy(), r["depth"].to_numpy()
        bwd, fwd = np.flatnonzero(want_bwd), np.flatnonzero(want_fwd)
        # in order of start (a wrapper of two linked ops takes the later one's layer)
        bwd = bwd[np.argsort(start[bwd], kind="stable")]
        hit = _asof_rows((pid[bwd], seq[bwd], start[bwd]), (pid[fwd], seq[fwd], start[fwd]),
                         tie=depth[fwd])
        found = hit >= 0
        out.append(pl.DataFrame({"bwd_pos": bwd[found].astype(np.int64),
                                 "fwd_pos": fwd[hit[found]].astype(np.int64)}))
    return pl.concat(out)


# --------------------------------------------------------------------------------------------
# the labels


def _name_phases(names: _Names) -> np.ndarray:
    """Own phase from NAME_PHASE_RULES; -1 where no rule matches, MARKED where the rule gives
    no phase (iteration markers)."""
    def rules(v: pl.Series) -> pl.Series:
        # only names that may match go through the regular expressions (compiling them cost
        # more than the rest of a small trace's labels); the others match no rule
        may = np.fromiter((x is not None and _may_name_phase(x) for x in v.to_list()), bool,
                          len(v))
        out = np.full(len(v), NONE, np.int8)
        if may.any():
            out[may] = pl.DataFrame({"n": v.filter(pl.Series(may))}).select(
                _name_phase_expr())["p"].to_numpy()
        return pl.Series(out)
    per = names.per_value(("name_phases",), rules)
    return np.array(per, np.int8)[names.codes]


@functools.cache
def _name_phase_expr() -> pl.Expr:
    """NAME_PHASE_RULES as one Polars expression over column ``n``, built once (building it
    cost more than matching a small trace's names)."""
    expr = pl.lit(NONE, pl.Int8)
    for pattern, phase in reversed(NAME_PHASE_RULES):
        code = PHASES.index(phase) if phase else MARKED
        expr = pl.when(pl.col("n").str.contains(pattern)).then(
            pl.lit(code, pl.Int8)).otherwise(expr)
    return expr.alias("p")


# What every name a NAME_PHASE_RULES pattern matches holds: a prefix (the patterns are
# anchored at ^ by a literal), or for the DataParallel rule its literal tail.
_NAME_PHASE_PREFIXES = ("ProfilerStep#", "Optimizer.", "enumerate(DataLoader)", "##",
                        "torch/_tensor.py(", "FSDP::")


def _may_name_phase(name: str) -> bool:
    """False only for a name no NAME_PHASE_RULES pattern can match."""
    return name.startswith(_NAME_PHASE_PREFIXES) or "DataParallel.forward" in name


class _Layers:
    """Layer names as int codes, with the source of each."""

    def __init__(self):
        self.names: list[str] = []
        self.sources: list[str] = []
        self._code: dict[str, int] = {}

    def codes(self, names: pl.Series | list[str], source: str) -> np.ndarray:
        """Codes of ``names``, registering new ones in order of first appearance (a loop in
        Python: a trace's layers are some hundreds, where a Polars unique and replace cost
        ~0.3 ms)."""
        out = []
        for n in names.to_list() if isinstance(names, pl.Series) else names:
            code = self._code.get(n)
            if code is None:
                code = self._code[n] = len(self.names)
                self.names.append(n)
                self.sources.append(source)
            out.append(code)
        return np.array(out, np.int64)


def _module_layers(r: pl.DataFrame, names: _Names, is_mod: np.ndarray, tree: _Tree,
                   autograd: np.ndarray, layers: _Layers) -> np.ndarray:
    """Own layer codes of ``nn.Module: X`` ranges (``is_mod``; module doc, layers a); -1
    elsewhere. ``names``: r's name column encoded."""
    own = np.full(r.height, NONE, np.int64)
    if not is_mod.any():
        return own
    pos = np.arange(r.height)
    # innermost module at or above each range; the enclosing module of a module is its parent's
    inner = tree.inherit(np.where(is_mod, pos, NONE))
    mods = np.flatnonzero(is_mod)
    up = np.where(tree.parent[mods] >= 0, inner[np.maximum(tree.parent[mods], 0)], NONE)
    short = [names.value(i)[len(MODULE_PREFIX):] for i in mods.tolist()]
    # index of each module's enclosing module among mods, -1 for outermost ones
    where = np.full(r.height, NONE, np.int64)
    where[mods] = np.arange(len(mods))
    up = np.where(up >= 0, where[np.maximum(up, 0)], NONE)
    # module paths, one vectorized step per module nesting level (object arrays of str: a
    # level of a small trace's modules costs microseconds, where a Polars frame cost 0.3 ms)
    own_name = np.array(short, object)
    path = np.empty(len(mods), object)
    done = np.zeros(len(mods), bool)
    while not done.all():
        ready = ~done & ((up < 0) | done[np.maximum(up, 0)])
        if not ready.any():  # inconsistent nesting: the rest go by their own names
            ready = ~done
            up = np.where(ready, NONE, up)
        i = np.flatnonzero(ready)
        u = up[i]
        new = own_name[i].copy()
        has = u >= 0
        new[has] = path[u[has]] + "." + own_name[i[has]]
        path[i] = new
        done[i] = True
    # one instance, one path: that of its first appearance, off the autograd threads if any
    # (in Python over the modules: a Polars sort, unique and join cost ~0.4 ms per trace)
    canon: dict[str, str] = {}
    for k in np.lexsort((r["start_ns"].to_numpy()[mods], autograd[mods])).tolist():
        canon.setdefault(short[k], path[k])
    own[mods] = layers.codes([canon[inst] for inst in short], "python_function")
    return own


def _label(tables: dict[str, pa.Table], r: pl.DataFrame | None = None
           ) -> tuple[pl.DataFrame, np.ndarray, np.ndarray, _Layers, pa.Table]:
    """Ranges frame, phase codes, layer codes, the layer dictionary and the iteration table
    (which the labels are found with)."""
    r = ranges_frame(tables) if r is None else r
    n = r.height
    layers = _Layers()
    if n == 0:
        return (r, np.zeros(0, np.int8), np.zeros(0, np.int64), layers,
                find_iterations(tables, r))
    tree = _Tree(r)
    nm = _Names.of_ranges(tables, r)
    kind = _Names.of_ranges(tables, r, "kind")
    its, main = _iterations(tables, r, nm, kind)
    it = _iteration_of(r["start_ns"].to_numpy(), its)
    start = r["start_ns"].to_numpy()
    end = r["end_ns"].to_numpy()
    pid = r["pid"].to_numpy()
    tid = r["tid"].to_numpy()

    is_bwd = (_filled(r["fwd_thread_id"], 0) > 0) | nm.starts_with(BACKWARD_OP_PREFIX)
    is_fwd_op = (~is_bwd) & _not_null(r["sequence_number"])

    # main thread per process: the marker thread, else the one with most forward ops
    thread, th_pid, th_tid = _compact(pid, tid)
    fwd = np.bincount(thread, is_fwd_op, len(th_pid))
    bwd = np.bincount(thread, is_bwd, len(th_pid))
    # per process, the thread with most forward ops (ties: the smaller tid), if it has any
    order = np.lexsort((th_tid, -fwd, th_pid))
    lead = order[np.r_[True, th_pid[order][1:] != th_pid[order][:-1]]]
    lead = lead[fwd[lead] > 0]
    main_tid = np.full(th_pid.max() + 1, NONE)
    main_tid[th_pid[lead]] = th_tid[lead]
    if main is not None:  # the marker thread (its pid and tid are codes of rows, so present)
        at = np.flatnonzero((pid == main[0]) & (tid == main[1]))[0]
        main_tid[th_pid[thread[at]]] = th_tid[thread[at]]
    bg_thread = (bwd > 0) & (th_tid != main_tid[th_pid])
    autograd = bg_thread[thread]

    # ---- own phase, in order of precedence
    own_phase = _name_phases(nm)
    named = own_phase != NONE  # markers and annotations: never layers of rule d
    own_phase[own_phase == MARKED] = NONE
    own_phase[(own_phase < 0) & is_bwd] = BACKWARD
    root = tree.parent < 0
    own_phase[(own_phase < 0) & autograd & root] = BACKWARD
    is_mod = nm.starts_with(MODULE_PREFIX) & kind.equals("python_function")
    if is_mod.any():
        before = _before_first_backward(it, start, is_bwd)
        own_phase[(own_phase < 0) & is_mod & ~autograd & before] = FORWARD

    # ---- own layer
    own_layer = _module_layers(r, nm, is_mod, tree, autograd, layers)
    iv = _fsdp_intervals(r, nm)
    if iv.height:
        hit = _innermost(r.select("pos", "pid", "tid", pl.col("start_ns").alias("t")), iv)
        at = hit["pos"].to_numpy()
        codes = layers.codes(hit["fqn"], "nvtx" if (
            r["kind"].gather(at) == "nvtx").all() else "annotation")
        free = own_layer[at] < 0
        own_layer[at[free]] = codes[free]
        ph = hit["phase"].replace_strict({p: i for i, p in enumerate(PHASES)},
                                         return_dtype=pl.Int8).to_numpy()
        free = own_phase[at] < 0
        own_phase[at[free]] = ph[free]

    links = _backward_links(r, tables.get("flow"), is_bwd)
    bpos = links["bwd_pos"].to_numpy()
    fpos = links["fwd_pos"].to_numpy()

    # the outermost op (cpu_op, not a marker or annotation) around each linked forward op
    is_op = kind.equals("cpu_op") & ~named
    outer = tree.inherit(np.where(is_op, np.arange(n), NONE), parent_first=True)
    fouter = np.where(outer[fpos] >= 0, outer[fpos], fpos) if len(fpos) else fpos
    if not layers.names and len(fpos):
        # layers d: outermost cpu_op holding a linked forward op
        lay = np.unique(outer[fpos])
        lay = lay[lay >= 0]
        lay = lay[~is_bwd[lay] & ~autograd[lay]]
        if len(lay):
            # named after the op and its ordinal among ops of that name in the iteration, in
            # order of start (a loop over these ops: a Polars frame of them cost ~0.6 ms)
            lay = lay[np.argsort(start[lay], kind="stable")]
            seen: dict[tuple[int, str], int] = {}
            named_as = []
            for p, i in zip(lay.tolist(), it[lay].tolist(), strict=True):
                op = nm.value(p).removeprefix("aten::")
                k = seen[i, op] = seen.get((i, op), -1) + 1
                named_as.append(f"{op}#{k}")
            own_layer[lay] = layers.codes(named_as, "cpu_op")

    layer = tree.inherit(own_layer)
    # layers b: backward ops take their forward op's layer; evaluate_function wrappers too
    if len(bpos):
        got = layer[fpos]
        ok = (got >= 0) & (own_layer[bpos] < 0)
        own_layer[bpos[ok]] = got[ok]
        par = tree.parent[bpos[ok]]
        wrap = par >= 0
        par, val = par[wrap], got[ok][wrap]
        is_wrap = nm.starts_with(BACKWARD_OP_PREFIX)[par]
        par, val = par[is_wrap], val[is_wrap]
        free = own_layer[par] < 0
        own_layer[par[free]] = val[free]
        layer = tree.inherit(own_layer)
    # AccumulateGrad nodes with no layer: the backward op just before them on the thread
    acc = autograd & root & (layer < 0) & nm.contains("AccumulateGrad", literal=True)
    if acc.any():
        prev = autograd & root & (layer >= 0)
        hit = _asof_rows((pid[acc], tid[acc], start[acc]),
                         (pid[prev], tid[prev], start[prev]))
        found = hit >= 0
        own_layer[np.flatnonzero(acc)[found]] = layer[prev][hit[found]]
        layer = tree.inherit(own_layer)

    phase = tree.inherit(own_phase.astype(np.int64))
    phase[phase < 0] = OTHER

    # phases f: forward span of threads/iterations that have no forward range at all
    if len(fpos):
        sel = fouter[~autograd[fouter]]
        if len(sel):
            group, _, _ = _compact(thread, it)  # (pid, tid, iteration)
            n_groups = group.max() + 1
            lo = np.full(n_groups, np.iinfo(np.int64).max)
            hi = np.full(n_groups, np.iinfo(np.int64).min)
            np.minimum.at(lo, group[sel], start[sel])
            np.maximum.at(hi, group[sel], end[sel])
            open_ = np.zeros(n_groups, bool)
            open_[group[sel]] = True
            open_[group[phase == FORWARD]] = False
            g = group
            phase[open_[g] & (phase == OTHER) & (start >= lo[g]) & (end <= hi[g])] = FORWARD

    # GPU annotations: the labels of their CPU twin (same external id and name)
    at, tw = _cpu_twins(r, nm, kind)
    phase[at] = phase[tw]
    layer[at] = layer[tw]
    return r, phase.astype(np.int8), layer, layers, its


def _before_first_backward(it: np.ndarray, start: np.ndarray, is_bwd: np.ndarray
                           ) -> np.ndarray:
    """Whether each range starts before the first backward op of its iteration ``it`` (True
    where the iteration has none). By a minimum per iteration code, in numpy: the Polars
    group-by and join it was cost ~0.3 ms of a small trace's labels."""
    _, code = _factorize(it)
    first = np.full(int(code.max(initial=-1)) + 1, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, code[is_bwd], start[is_bwd])
    return start < first[code]


def _cpu_twins(r: pl.DataFrame, names: _Names, kinds: _Names) -> tuple[np.ndarray, np.ndarray]:
    """(at, twin): the rows of gpu_user_annotation ranges and of their CPU twins, the first
    range off the GPU with the same external id and name (both set). In numpy over the name
    codes: the Polars join it was cost ~0.6 ms of a small trace's labels."""
    has = _not_null(r["external_id"]) & (names.codes < len(names.values) - 1)  # name not null
    gpu = np.flatnonzero(kinds.equals("gpu_user_annotation") & has)
    if not len(gpu):
        return gpu, gpu
    cpu = np.flatnonzero(kinds.differs("gpu_user_annotation") & has)
    rows = np.concatenate([cpu, gpu])
    # one code per distinct name (a dictionary may hold a value twice)
    same = numpy_filled(pc.dictionary_encode(names.values.to_arrow()).indices, -1)
    pair, _, _ = _compact(_filled(r["external_id"], 0)[rows], same[names.codes[rows]])
    cpu_pair, gpu_pair = pair[:len(cpu)], pair[len(cpu):]
    twin = np.full(len(rows), -1, np.int64)
    distinct, first = np.unique(cpu_pair, return_index=True)  # cpu rows are in row order
    twin[distinct] = cpu[first]
    tw = twin[gpu_pair]
    found = tw >= 0
    return gpu[found], tw[found]


def label_ranges(tables: dict[str, pa.Table], ranges: pl.DataFrame | None = None) -> pa.Table:
    """Layer and phase of every range: range_id, layer (null where unmapped), phase (one of
    PHASES). The rules are in the module doc. The schema metadata holds {layer: source} under
    ``LAYER_SOURCES_KEY`` for find_layers."""
    return iterations_and_labels(tables, ranges)[1]


def iterations_and_labels(tables: dict[str, pa.Table], ranges: pl.DataFrame | None = None
                          ) -> tuple[pa.Table, pa.Table]:
    """``find_iterations`` and ``label_ranges`` together: the labels are found with the
    iterations, so the iterations are found once."""
    r, phase, layer, layers, its = _label(tables, ranges)
    lay = pa.DictionaryArray.from_arrays(
        pa.array(layer, pa.int64(), mask=layer < 0), pa.array(layers.names, pa.string()))
    ph = pa.DictionaryArray.from_arrays(pa.array(phase, pa.int8()), pa.array(PHASES))
    meta = {LAYER_SOURCES_KEY: json.dumps(dict(zip(layers.names, layers.sources,
                                                   strict=True))).encode()}
    return its, pa.table({"range_id": pa.array(r["range_id"].to_numpy(), pa.int64()),
                          "layer": lay.dictionary_decode(), "phase": ph.dictionary_decode()},
                         schema=LABEL_SCHEMA.with_metadata(meta))


# --------------------------------------------------------------------------------------------
# layers and coverage


_KIND_SOURCE = {"python_function": "python_function", "nvtx": "nvtx", "cpu_op": "cpu_op",
                "user_annotation": "annotation", "gpu_user_annotation": "annotation"}


def find_layers(tables: dict[str, pa.Table], labels: pa.Table,
                ranges: pl.DataFrame | None = None) -> pa.Table:
    """Layers of one trace: LAYER's columns without trace_id, in order of first entry. A layer
    is entered by a range whose layer differs from its parent's; first_start_ns is the earliest
    such start; source is the rule that made the layer (label_ranges' metadata, else the kind
    of the range that first entered it). param_bytes stays null here: graph_tables fills it
    from the recorded weight shapes (graphstore.params), which this table does not load)."""
    r = ranges_frame(tables) if ranges is None else ranges
    if not r.height or not labels.num_rows:
        return LAYER_SCHEMA.empty_table()
    ids = r["range_id"].to_numpy()
    lab_ids = labels["range_id"].to_numpy()
    if not np.array_equal(ids, lab_ids):  # labels of other rows: align them on range_id
        lab = pl.from_arrow(labels.select(["range_id", "layer"]))
        labels = r.select("range_id").join(lab, on="range_id", how="left",
                                           maintain_order="left").to_arrow()
    layer = labels["layer"].combine_chunks()
    if not (pa.types.is_string(layer.type) or pa.types.is_large_string(layer.type)):
        layer = layer.cast(pa.string())  # dictionary or view strings: plain ones compare
    ppos = _parent_pos(ids, _filled(r["parent"], -1).astype(np.int64))
    up = layer.take(pa.array(ppos, mask=ppos < 0))
    enters = pc.and_(layer.is_valid(), pc.fill_null(pc.not_equal(up, layer), True))
    enter = np.flatnonzero(enters.to_numpy(zero_copy_only=False))
    if not len(enter):
        return LAYER_SCHEMA.empty_table()
    meta = (labels.schema.metadata or {}).get(LAYER_SOURCES_KEY)
    sources = json.loads(meta) if meta else {}
    # the earliest entry of each layer, in order of first entry
    start = r["start_ns"].to_numpy()
    enter = enter[np.argsort(start[enter], kind="stable")]
    enc = pc.dictionary_encode(layer.take(enter))
    code = enc.indices.to_numpy(zero_copy_only=False)
    _, first_at = np.unique(code, return_index=True)
    first_at = np.sort(first_at)
    at = enter[first_at]
    # one row per layer, in Python (a layer each: a Polars frame and its string expressions
    # cost ~0.5 ms of a small trace's labels)
    lays = enc.dictionary.cast(pa.string()).take(pa.array(code[first_at])).to_pylist()
    src = [sources.get(lay) or _KIND_SOURCE.get(k, "annotation")
           for lay, k in zip(lays, r["kind"].gather(at).to_list(), strict=True)]
    module_type = [_module_type(lay) if s == "python_function" else n if s == "cpu_op" else None
                   for lay, s, n in zip(lays, src, r["name"].gather(at).to_list(), strict=True)]
    return pa.table({"layer": pa.array(lays, pa.string()), "source": pa.array(src, pa.string()),
                     "module_type": pa.array(module_type, pa.string()),
                     "first_start_ns": pa.array(start[at], pa.int64()),
                     "param_bytes": pa.nulls(len(at), pa.int64())}, schema=LAYER_SCHEMA)


_INSTANCE_NUMBER = re.compile(r"_\d+\Z")


def _module_type(path: str) -> str | None:
    """A module layer's type: the last name of its path without Kineto's instance number
    (``ResNet_0.Conv2d_3`` -> ``Conv2d``); None where the path ends in a dot. The last name is
    cut at the last dot: a search for it (``[^.]+\\Z``) tried every position of the path, 22
    us for a BERT layer's, 3% of a small trace's conversion over its 84 layers."""
    last = path.rpartition(".")[2]
    return _INSTANCE_NUMBER.sub("", last, count=1) if last else None


def mapped_share(task: pa.Table) -> dict:
    """GPU time of a task table (kinds kernel, memcpy, memset, comm) and the share of it that
    has a layer and a phase other than 'other': {'gpu_ns', 'layer_share', 'phase_share',
    'by_phase': {phase: ns}}. Shares are 0.0 when there is no GPU time."""
    t = pl.from_arrow(task.select(["kind", "dur_ns", "layer", "phase"])).with_columns(
        pl.col("kind").cast(pl.String), pl.col("phase").cast(pl.String),
        pl.col("layer").cast(pl.String))
    g = t.filter(pl.col("kind").is_in(list(GPU_KINDS)))
    total = int(g["dur_ns"].sum() or 0)
    with_layer = int(g.filter(pl.col("layer").is_not_null())["dur_ns"].sum() or 0)
    ph = g.with_columns(pl.col("phase").fill_null("other"))
    with_phase = int(ph.filter(pl.col("phase") != "other")["dur_ns"].sum() or 0)
    by = dict.fromkeys(PHASES, 0)
    for p, ns in ph.group_by("phase").agg(pl.col("dur_ns").sum()).iter_rows():
        by[p] = by.get(p, 0) + int(ns)
    return {"gpu_ns": total,
            "layer_share": with_layer / total if total else 0.0,
            "phase_share": with_phase / total if total else 0.0,
            "by_phase": by}
