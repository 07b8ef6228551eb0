"""The rewrite primitives over a trace's graph tables: select, scale, remove, insert, reschedule.

A ``Graph`` holds the five graph tables (``graphstore.read.read_graph``) as Polars frames and
every primitive returns a new ``Graph``; ``Graph.tables()`` gives Arrow tables with the graph
schema back for ``simulate.replay``. Invariants kept by every primitive (the simulator and the
iteration timing rely on them):

- task ids stay dense 0..n-1, sorted by observed ``start_ns`` (ties by the old order), task 0
  the ``<trace start>`` origin marker; edges are remapped whenever ids move;
- ``start_ns`` is the observed start and the order key on FIXED units: scaling never changes
  it, an inserted task takes the start of the task it is placed beside;
- ``obs_dur_ns`` is never changed: iteration times are *measured* from the observed trace.

Lags are not scaled. A lag is the latency between two tasks (a launch reaching the GPU, a gap
between calls on a thread that no task covers), not work of either task, so an optimization
that makes a kernel faster does not shorten it. ``remove`` adds the lags of the two edges it
joins (the removed task becomes a zero-length pass-through).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from daydream.base.columns import numpy_filled
from daydream.base.errors import DaydreamError
from daydream.graphstore.schema import GPU_KINDS, POLICIES

# The graph's tables, in the order a Graph takes them.
TABLES = ("task", "edge", "unit", "iteration", "layer")
# Where an anchor attaches on its source and destination.
_SRC_POINT = {"end_start": "end", "start_start": "start", "end_end": "end"}
_DST_POINT = {"end_start": "start", "start_start": "start", "end_end": "end"}
_ANCHOR = {("end", "start"): "end_start", ("start", "start"): "start_start",
           ("end", "end"): "end_end"}

Predicate = "pl.Expr | str | np.ndarray | Sequence[int] | None"
# What an edge an optimization adds carries unless it says otherwise: a new constraint of the
# optimization's model, at no latency and with no slack (nothing in the trace to explain).
_EDGE_DEFAULTS = (("kind", "inserted"), ("anchor", "end_start"), ("lag_ns", 0),
                  ("slack_ns", 0), ("binding", False), ("inferred", False))
# the task columns an inserted task takes from the task it is placed at (``Graph.insert``),
# where its row does not give them (start_ns: always)
_AT_COLUMNS = frozenset({"start_ns", "phase", "iteration", "layer", "rank"})


def _plain(t: pa.Table) -> pa.Table:
    """ENUM columns (Arrow dictionaries) as plain strings: transforms add rows and compare
    values as strings; :meth:`Graph.tables` encodes them again."""
    for i, f in enumerate(t.schema):  # only those columns: a table cast costs every column
        if pa.types.is_dictionary(f.type):
            t = t.set_column(i, pa.field(f.name, f.type.value_type, f.nullable),
                             _plain_column(t.column(i)))
    return t


def _plain_column(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """An ENUM column (an Arrow dictionary) as plain strings; any other as it is."""
    return col.cast(col.type.value_type) if pa.types.is_dictionary(col.type) else col


def isin(values: np.ndarray, allowed) -> np.ndarray:
    """Whether each value of an object array (strings, None) is one of ALLOWED (np.isin sorts,
    which None and strings cannot be)."""
    allowed = frozenset(allowed)
    return np.fromiter((v in allowed for v in values), bool, len(values))


def _edge_defaults(ed: pl.DataFrame, *replace: pl.Series) -> pl.DataFrame:
    """ED with every column of ``_EDGE_DEFAULTS`` present and its nulls filled, and the
    columns REPLACE replaced (one Polars call: a small insert's edges are a few rows)."""
    return ed.with_columns([pl.col(c).fill_null(v) if c in ed.columns else pl.lit(v).alias(c)
                            for c, v in _EDGE_DEFAULTS] + list(replace))


def _as_array(s: pl.Series, null=None) -> np.ndarray:
    """A task column as ``Graph.array`` gives it: read-only numpy, nulls as NULL (strings
    as objects)."""
    if s.dtype == pl.String:
        out = s.to_numpy()  # objects: str, None for null (a list's array: 1.3x)
        if null is not None:
            out = out if out.flags.writeable else out.copy()
            out[out == None] = null  # noqa: E711 (elementwise)
    elif s.null_count():
        if null is None:
            raise DaydreamError(f"task column {s.name!r} has nulls: give NULL")
        # through Arrow: a Polars Series operation costs ~0.1 ms, this ~10 us
        out = pc.fill_null(s.to_arrow(), null).to_numpy(zero_copy_only=False)
    else:
        out = s.to_numpy()
    out.setflags(write=False)
    return out


def _arrow_array(col: pa.ChunkedArray, name: str, null=None) -> np.ndarray:
    """``_as_array`` of an Arrow task column: a dictionary column (an ENUM) decoded through
    its dictionary, one Python string per value it names rather than per row."""
    if pa.types.is_dictionary(col.type):
        parts = []
        for ch in col.chunks:
            values = np.array([*ch.dictionary.to_pylist(), null], object)
            idx = ch.indices.cast(pa.int64())
            if ch.null_count:
                idx = pc.fill_null(idx, len(ch.dictionary))
            parts.append(values[idx.to_numpy()])
        out = (np.concatenate(parts) if len(parts) > 1 else parts[0] if parts
               else np.empty(0, object))
    elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        out = col.to_numpy()  # objects: str, None for null
        if null is not None and col.null_count:
            out[out == None] = null  # noqa: E711 (elementwise)
    elif col.null_count:
        if null is None:
            raise DaydreamError(f"task column {name!r} has nulls: give NULL")
        out = pc.fill_null(col, null).to_numpy()
    else:
        out = col.to_numpy()
    out.setflags(write=False)
    return out


def _set(t: pa.Table, name: str, values: np.ndarray) -> pa.Table:
    """T with its column NAME replaced by VALUES, in the column's type."""
    i = t.schema.get_field_index(name)
    return t.set_column(i, t.schema.field(i), pa.array(values, t.schema.field(i).type))


def _arrow_cast(values: pa.Array, to: pa.DataType) -> pa.Array:
    """VALUES (a column of new rows) as the graph schema's type TO (an ENUM column's
    dictionary from its strings; floats to an integer column truncated, as Polars casts)."""
    if values.type == to:
        return values
    if pa.types.is_floating(values.type) and pa.types.is_integer(to):
        values = pc.trunc(values)
    return values.cast(to)


class _Held:
    """One graph table in the forms made of it so far: an Arrow table with the graph schema,
    a Polars frame, or both. Graphs that share the table share this, so a form made for one
    of them is there for all."""

    __slots__ = ("arrow", "frame")

    def __init__(self, table: pa.Table | pl.DataFrame):
        self.arrow = table if isinstance(table, pa.Table) else None
        self.frame = None if isinstance(table, pa.Table) else table


class Graph:
    """One trace's graph; immutable by convention (primitives return new graphs).

    Each table is held as an Arrow table with the graph schema (as read, or as a primitive
    that works on arrays wrote it), as a Polars frame (as a primitive that works on frames
    wrote it, or an optimization read it), or both (``_Held``): each form is made from the
    other when first asked for, once for all the graphs that share the table. A rewrite that
    scales and inserts (``amp``, ``cuda_graphs``) thus goes from the tables read to the
    tables replayed without converting the large ones between the libraries: on a 4k-task
    graph a conversion each way cost some 1 ms, three times per trace in a fleet's
    ``predict --all``."""

    def __init__(self, task: pl.DataFrame | pa.Table, edge: pl.DataFrame | pa.Table,
                 unit: pl.DataFrame | pa.Table, iteration: pl.DataFrame | pa.Table,
                 layer: pl.DataFrame | pa.Table, schemas: dict[str, pa.Schema] | None = None):
        self._held = {k: _Held(v) for k, v in zip(TABLES, (task, edge, unit, iteration, layer),
                                                   strict=True)}
        self._schemas = schemas or {}
        # what is computed from this graph and asked for more than once (a graph never changes:
        # transforms.profiler's per-thread counts, read by the estimate and by no_profiler)
        self._memo: dict = {}

    # -- the tables -----------------------------------------------------------------------------
    def frame(self, table: str) -> pl.DataFrame:
        """TABLE as a Polars frame (ENUM columns as plain strings, see ``_plain``)."""
        h = self._held[table]
        if h.frame is None:
            h.frame = pl.from_arrow(_plain(h.arrow))
        return h.frame

    def arrow(self, table: str) -> pa.Table:
        """TABLE as an Arrow table with the schema the graph was read with (only the columns
        whose type differs are cast: a table's cast casts every one)."""
        h = self._held[table]
        if h.arrow is None:
            t = h.frame.to_arrow()
            s = self._schemas.get(table)
            if s is not None:
                t = pa.Table.from_arrays(
                    [t[f.name] if t.schema.field(f.name).type == f.type
                     else t[f.name].cast(f.type) for f in s], schema=s)
            h.arrow = t
        return h.arrow

    task = property(lambda self: self.frame("task"))
    edge = property(lambda self: self.frame("edge"))
    unit = property(lambda self: self.frame("unit"))
    iteration = property(lambda self: self.frame("iteration"))
    layer = property(lambda self: self.frame("layer"))

    @classmethod
    def from_tables(cls, tables: dict[str, pa.Table]) -> Graph:
        missing = [k for k in TABLES if k not in tables]
        if missing:
            raise DaydreamError(f"graph tables missing: {', '.join(missing)}")
        return cls(*(tables[k] for k in TABLES), schemas={k: tables[k].schema for k in TABLES})

    def tables(self) -> dict[str, pa.Table]:
        """Arrow tables with the schemas the graph was read with (a table no primitive has
        replaced: the one it was read from)."""
        return {k: self.arrow(k) for k in TABLES}

    def _with(self, arrays: dict | None = None, **kw) -> Graph:
        """A copy with some tables replaced (each a Polars frame or an Arrow table with the
        graph schema): for the primitives of this class only (an optimization changes a graph
        through them, so the invariants above hold). The tables not replaced are shared in
        every form this graph holds them in.

        ARRAYS: the copy's task columns as numpy (``array``) that its primitive derived from
        this graph's (``_arrays``), rather than convert them again: the next step of a
        rewrite asks for kind, phase, iteration ... of each graph it makes, and a string
        column's conversion costs ~0.15 ms on a 4k-task graph. The launch pairs are carried
        where the edge table is kept. Nothing of ``once`` is: it may read any column."""
        g = Graph.__new__(Graph)
        g._held = {k: _Held(kw[k]) if k in kw else h for k, h in self._held.items()}
        g._schemas = self._schemas
        g._memo = dict(arrays or {})
        if "edge" not in kw and "launch_pairs" in self._memo:
            g._memo["launch_pairs"] = self._memo["launch_pairs"]
        return g

    def _task_column(self, name: str, values: np.ndarray) -> Graph:
        """A copy whose task column NAME (an integer column) holds VALUES, in the form the
        task table is held in (Arrow where it is: a column set costs microseconds)."""
        t = self._held["task"].arrow
        if t is not None:
            new = _set(t, name, values)
        else:
            new = self._held["task"].frame.with_columns(pl.Series(name, values, pl.Int64))
        return self._with(self._arrays((name,)), task=new)

    def _arrays(self, changed: tuple[str, ...] = ()) -> dict:
        """The task columns converted so far (``array``), less those named CHANGED: what a
        copy whose other task columns are this graph's may carry (``_with``)."""
        return {key: a for key, a in self._memo.items()
                if isinstance(key, tuple) and key[0] == "array" and key[1] not in changed}

    def _edge_mask(self, sel: np.ndarray | pl.Series | pl.Expr) -> np.ndarray:
        """Boolean mask over edges from a mask or a Polars expression over the edge table."""
        if isinstance(sel, pl.Expr):
            return self.edge.select(sel.fill_null(False)).to_series().to_numpy().astype(bool)
        m = np.asarray(sel.to_numpy() if isinstance(sel, pl.Series) else sel, bool)
        if m.shape != (self.edge.height,):
            raise DaydreamError(f"edge mask has {m.shape} entries for {self.edge.height} edges")
        return m

    @property
    def n_tasks(self) -> int:
        h = self._held["task"]
        return h.arrow.num_rows if h.arrow is not None else h.frame.height

    def array(self, column: str, null=None) -> np.ndarray:
        """A task column as a read-only numpy array, nulls as NULL (strings are objects),
        converted once per graph (a graph never changes). What an optimization reads of a
        small graph: a numpy mask over a hundred tasks costs microseconds where a Polars
        filter or Series operation costs a tenth of a millisecond, and a trace's rewrite
        would make dozens."""
        key = ("array", column, null)
        out = self._memo.get(key)
        if out is None:
            h = self._held["task"]
            out = self._memo[key] = (_as_array(h.frame[column], null) if h.arrow is None
                                     else _arrow_array(h.arrow[column], column, null))
        return out

    def rows(self, ids: np.ndarray, columns: Sequence[str]) -> pl.DataFrame:
        """The task rows at IDS, their COLUMNS, as a Polars frame gathered from the form
        held: from Arrow, only those rows and columns are converted (an optimization's
        kernels, not every task)."""
        h = self._held["task"]
        if h.frame is not None:
            return h.frame.select(columns)[ids]
        return pl.from_arrow(_plain(h.arrow.select(columns).take(pa.array(ids, pa.int64()))))

    def values(self, column: str) -> list:
        """A task column as a Python list (None for null), read from the form held."""
        h = self._held["task"]
        return h.frame[column].to_list() if h.arrow is None else h.arrow[column].to_pylist()

    def once(self, key: str, compute: Callable[[Graph], object]):
        """``compute(self)``, computed once per graph under KEY (a graph never changes): for a
        figure an optimization reads of it at more than one step."""
        if key not in self._memo:
            self._memo[key] = compute(self)
        return self._memo[key]

    def median_call_ns(self, name_part: str = "", blocking: bool | None = None) -> int | None:
        """The median duration of the runtime calls (kind ``api``) whose name holds NAME_PART,
        of those blocking or not where BLOCKING says, as an int (a median of two middle
        values rounded down); None where there are none. Computed once per graph and
        question, from its numpy columns: what a rewrite inserts a call at (a launch, a
        copy, a sync) costs the trace's own median."""
        def compute(g: Graph) -> int | None:
            # the runtime calls and their names, found once for every question of a graph
            api, names = g.once("api_calls", lambda g: (
                (ids := np.flatnonzero(g.array("kind") == "api")),
                g.array("name", "")[ids].tolist()))
            if name_part:
                api = api[np.fromiter((name_part in n for n in names), bool, len(names))]
            if blocking is not None:
                api = api[g.array("blocking")[api] == blocking]
            return int(np.median(g.array("dur_ns")[api])) if len(api) else None
        return self.once(f"median_call_ns:{name_part}:{blocking}", compute)

    def launch_pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(launch call, GPU task, lag ns) of each launch edge in edge order, as numpy,
        computed once per graph (``launches`` as arrays)."""
        out = self._memo.get("launch_pairs")
        if out is None:
            e = self._held["edge"].arrow  # a form held (a conversion costs more than this)
            if e is None:
                e = self._held["edge"].frame
                la = (e["kind"].cast(pl.String) == "launch").fill_null(False).to_numpy()
            else:
                la = numpy_filled(pc.equal(_plain_column(e["kind"]), "launch"), False)
            out = tuple(e[c].to_numpy()[la] for c in ("src", "dst", "lag_ns"))
            for a in out:
                a.setflags(write=False)
            self._memo["launch_pairs"] = out
        return out

    # -- select ---------------------------------------------------------------------------------
    def select(self, pred: Predicate) -> np.ndarray:
        """Boolean mask over tasks. ``pred``: a Polars expression, a SQL WHERE clause over the
        task table (DuckDB dialect, e.g. ``"kind = 'kernel' AND name LIKE '%gemm%'"``), a
        boolean mask, task ids, or None (no task). The origin marker is never selected."""
        n = self.n_tasks
        if pred is None:
            mask = np.zeros(n, bool)
        elif isinstance(pred, pl.Expr):
            mask = self.task.select(pred.fill_null(False)).to_series().to_numpy().astype(bool)
        elif isinstance(pred, str):
            import duckdb  # here only: a fleet worker never selects by SQL (~0.1 s to import)
            task = self.task.to_arrow()  # noqa: F841 (read by duckdb's replacement scan)
            try:
                ids = duckdb.sql(f"SELECT task_id FROM task WHERE {pred}").fetchnumpy()["task_id"]
            except duckdb.Error as e:
                msg = str(e).splitlines()[0]
                raise DaydreamError(f"bad select {pred!r}: {msg}; columns: "
                                    f"{', '.join(self.task.columns)}") from None
            mask = np.zeros(n, bool)
            mask[np.asarray(ids, np.int64)] = True
        else:
            a = np.asarray(pred)
            if a.dtype == bool:
                if a.shape != (n,):
                    raise DaydreamError(f"mask has {a.shape} entries for {n} tasks")
                mask = a.copy()
            else:
                mask = np.zeros(n, bool)
                mask[a.astype(np.int64)] = True
        if n:
            mask[0] = False
        return mask

    # -- scale ------------------------------------------------------------------------------------
    def scale(self, pred: Predicate, factor) -> Graph:
        """Durations (``dur_ns``) of the selected tasks times ``factor`` (a number, or an array
        over all tasks), rounded to ns and never below 0. ``obs_dur_ns``, ``start_ns`` and lags
        are kept (see the module doc)."""
        mask = self.select(pred)
        f = np.broadcast_to(np.asarray(factor, np.float64), (self.n_tasks,))
        if np.any(f[mask] < 0) or not np.all(np.isfinite(f[mask])):
            raise DaydreamError("scale factor must be a finite number >= 0")
        dur = self.array("dur_ns").astype(np.int64)  # a copy
        dur[mask] = np.maximum(np.rint(dur[mask] * f[mask]), 0).astype(np.int64)
        return self._task_column("dur_ns", dur)

    def set_duration(self, pred: Predicate, dur_ns) -> Graph:
        """Durations of the selected tasks set to ``dur_ns`` (number or array over all tasks)."""
        mask = self.select(pred)
        new = np.broadcast_to(np.asarray(dur_ns), (self.n_tasks,)).astype(np.int64)
        dur = self.array("dur_ns").astype(np.int64)  # a copy
        dur[mask] = np.maximum(new[mask], 0)
        return self._task_column("dur_ns", dur)

    def set_bytes(self, pred: Predicate, nbytes) -> Graph:
        """Bytes moved (``bytes``) by the selected tasks, a number or an array over all tasks
        (a message split into slices, say); the other tasks keep theirs (null stays null)."""
        mask = self.select(pred)
        new = np.broadcast_to(np.asarray(nbytes), (self.n_tasks,)).astype(np.int64)
        col = pl.when(pl.Series(mask)).then(pl.Series(new)).otherwise(pl.col("bytes"))
        return self._with(self._arrays(("bytes",)),
                          task=self.task.with_columns(col.cast(pl.Int64).alias("bytes")))

    def set_lags(self, edges: np.ndarray | pl.Series | pl.Expr, lag_ns) -> Graph:
        """Lags of some edges (a boolean mask over the edge table, or a Polars expression over
        it) set to ``lag_ns`` (a number or an array over all edges): what a late start that an
        edge carries becomes under an optimization. Slack is kept."""
        mask = self._edge_mask(edges)
        new = np.broadcast_to(np.asarray(lag_ns), (self.edge.height,)).astype(np.int64)
        lag = self.edge["lag_ns"].to_numpy().copy()
        lag[mask] = new[mask]
        return self._with(self._arrays(),
                          edge=self.edge.with_columns(pl.Series("lag_ns", lag, pl.Int64)))

    def drop_edges(self, edges: np.ndarray | pl.Series | pl.Expr) -> Graph:
        """Remove some edges (a boolean mask over the edge table, or a Polars expression over
        it); every task stays. For constraints an optimization lifts (P3's per-layer waits
        replace the optimizer's wait for every gradient)."""
        mask = self._edge_mask(edges)
        return (self._with(self._arrays(), edge=self.edge.filter(pl.Series(~mask)))
                if mask.any() else self)

    # -- remove -------------------------------------------------------------------------------
    def remove(self, pred: Predicate) -> Graph:
        """Remove the selected tasks; ids are renumbered densely and edges remapped.

        Each path ``p -> r1 -> ... -> rk -> s`` through removed tasks ``r`` from a kept ``p`` to a
        kept ``s`` becomes one edge ``p -> s`` whose lag is the sum of the path's lags (removed
        tasks count as zero-length). Its anchor joins the point of ``p`` the first edge leaves
        from (start or end) to the point of ``s`` the last edge reaches; a path that enters a
        removed task at its end (end_end) and leaves from its start (start_start) carries no
        constraint and is dropped. A start -> end path, which the simulator cannot express,
        becomes end_end with the source's duration taken off the lag. The new edge's kind is the
        shared kind of the path's edges, else ``inserted``; it is binding when all were. Of
        parallel new edges with one anchor the largest lag is kept. Remove tasks rather than
        zero their duration only when they are not iteration anchors (CPU tasks at iteration
        starts); scale those to 0 instead.
        """
        mask = self.select(pred)
        if not mask.any():
            return self
        e = self.edge
        src = e["src"].to_numpy()
        dst = e["dst"].to_numpy()
        lag = e["lag_ns"].to_numpy()
        slk = e["slack_ns"].to_numpy() if "slack_ns" in e.columns else np.zeros(len(lag), int)
        inf = (e["inferred"].to_numpy() if "inferred" in e.columns
               else np.zeros(len(lag), bool))
        anc = e["anchor"].to_list()
        kind = e["kind"].to_list()
        bind = e["binding"].to_numpy()
        dur = self.task["dur_ns"].to_numpy()
        touch = mask[src] | mask[dst]
        # out-edges of removed tasks
        out: dict[int, list[int]] = {}
        for i in np.flatnonzero(mask[src]):
            out.setdefault(int(src[i]), []).append(int(i))
        new = {}  # (p, s, anchor) -> (lag, kind, binding, slack, inferred)
        for i in np.flatnonzero(~mask[src] & mask[dst]):
            p = int(src[i])
            # DFS over removed tasks: state = (task, point reached on it, lag, kind, binding,
            # slack, inferred)
            stack = [(int(dst[i]), _DST_POINT[anc[i]], int(lag[i]), kind[i], bool(bind[i]),
                      int(slk[i]), bool(inf[i]))]
            p_point = _SRC_POINT[anc[i]]
            seen = set()
            while stack:
                r, at, lg, kd, bd, sk, nf = stack.pop()
                if (r, at) in seen:
                    continue  # reached before by another path: keep the first
                seen.add((r, at))
                for j in out.get(r, ()):
                    leave = _SRC_POINT[anc[j]]
                    if at == "end" and leave == "start":
                        continue  # entered at its end, left from its start: no constraint
                    lg2 = lg + int(lag[j])
                    sk2 = sk + int(slk[j])
                    nf2 = nf or bool(inf[j])
                    kd2 = kd if kd == kind[j] else "inserted"
                    bd2 = bd and bool(bind[j])
                    s = int(dst[j])
                    if mask[s]:
                        stack.append((s, _DST_POINT[anc[j]], lg2, kd2, bd2, sk2, nf2))
                        continue
                    s_point = _DST_POINT[anc[j]]
                    if p_point == "start" and s_point == "end":
                        a, lg3 = "end_end", max(0, lg2 - int(dur[p]))
                    else:
                        a, lg3 = _ANCHOR[(p_point, s_point)], lg2
                    key = (p, s, a)
                    old = new.get(key)
                    if old is None or lg3 + sk2 > old[0] + old[3]:
                        new[key] = (lg3, kd2, bd2, sk2, nf2)
        kept = e.filter(pl.Series(~touch))
        if new:
            keys = list(new)
            vals = [new[k] for k in keys]
            cols = {
                "src": [k[0] for k in keys], "dst": [k[1] for k in keys],
                "kind": [v[1] for v in vals], "anchor": [k[2] for k in keys],
                "lag_ns": [v[0] for v in vals], "binding": [v[2] for v in vals],
                "slack_ns": [v[3] for v in vals], "inferred": [v[4] for v in vals]}
            add = pl.DataFrame({c: cols[c] for c in kept.columns}, schema=kept.schema)
            kept = pl.concat([kept, add])
        newid = np.cumsum(~mask) - 1
        lut = pl.Series(newid.astype(np.int64))
        kept = kept.with_columns(pl.col("src").map_batches(lambda s: lut.gather(s)),
                                 pl.col("dst").map_batches(lambda s: lut.gather(s)))
        task = self.task.filter(pl.Series(~mask)).with_columns(
            pl.Series("task_id", np.arange(int((~mask).sum()), dtype=np.int64)))
        return self._with(task=task, edge=kept.sort(["src", "dst"], maintain_order=True))

    def with_launches(self, pred: Predicate) -> np.ndarray:
        """The selected tasks and the launch calls that would launch nothing once they are
        gone (every GPU task the call launches is selected): what removing GPU work removes
        from the CPU side too (fusions drop a fused kernel's launch call with it)."""
        mask = self.select(pred)
        la = self.launches()
        api, gpu = la["api"].to_numpy(), la["gpu"].to_numpy()
        launches_kept = np.zeros(self.n_tasks, bool)
        launches_kept[api[~mask[gpu]]] = True
        launches_gone = np.zeros(self.n_tasks, bool)
        launches_gone[api[mask[gpu]]] = True
        return mask | (launches_gone & ~launches_kept)

    # -- insert -------------------------------------------------------------------------------
    def insert(self, tasks: pl.DataFrame, edges: pl.DataFrame | None = None
               ) -> tuple[Graph, np.ndarray]:
        """Insert tasks; returns the new graph and the new ids of the inserted tasks.

        ``tasks``: one row per new task with ``at`` (an existing task id it is placed beside),
        ``place`` ("before" or "after"; default before), ``kind``, ``unit_id``, ``name``,
        ``dur_ns`` and optionally any other task column (``phase``, ``iteration`` and ``layer``
        default to those of ``at``; ``start_ns`` is always ``at``'s, so the new task sorts next
        to it on its unit and in the iteration timing). With ``splice`` true (default) a task
        placed before ``at`` on ``at``'s own unit takes over ``at``'s in-edges from that unit
        (thread/stream order, lags kept) and gets a zero-lag edge to ``at``, so it runs in
        ``at``'s place without eating the observed gap; placed after, it takes over ``at``'s
        out-edges to that unit.

        ``edges``: src, dst (existing ids >= 0, or ``-1 - k`` for the k-th new task), kind,
        anchor, lag_ns, binding (default ``inserted``, ``end_start``, 0, false).
        Ids of all later tasks shift; existing edges are remapped.
        """
        g, _, ins_ids = self._insert(tasks, edges)
        return g, ins_ids

    def replace(self, pred: Predicate, tasks: pl.DataFrame, edges: pl.DataFrame | None = None
                ) -> tuple[Graph, np.ndarray]:
        """Insert ``tasks`` (as :meth:`insert`) and remove the selected tasks (as
        :meth:`remove`) in one step, both given in this graph's ids: new tasks may be placed
        beside the tasks they replace (a fused optimizer step where its kernels were).
        Returns the new graph and the ids of the inserted tasks in it."""
        mask = self.select(pred)
        g, old_ids, ins_ids = self._insert(tasks, edges)
        gone = np.zeros(g.n_tasks, bool)
        gone[old_ids[mask]] = True
        return g.remove(gone), (np.cumsum(~gone) - 1)[ins_ids]

    def _insert(self, tasks: pl.DataFrame, edges: pl.DataFrame | None
                ) -> tuple[Graph, np.ndarray, np.ndarray]:
        """:meth:`insert`, also returning the new id of every existing task."""
        n = self.n_tasks
        k = tasks.height
        if k == 0:
            return self, np.arange(n, dtype=np.int64), np.empty(0, np.int64)
        t = tasks
        at = t["at"].to_numpy().astype(np.int64)
        if np.any((at < 0) | (at >= n)):
            raise DaydreamError("insert: 'at' must name existing tasks")
        # place defaults to before, splice to true
        after = (np.array([p == "after" for p in t["place"].to_list()], bool)
                 if "place" in t.columns else np.zeros(k, bool))
        # the new rows as Arrow columns of the graph schema; a job graph's tasks carry their
        # rank (graphstore.job): an inserted task joins at's, as its phase, iteration and layer
        old_t = self.arrow("task")
        take_at = pa.array(at)
        given = t.to_arrow()  # one conversion of the rows given (a call per column cost more)
        cols = []
        given_cols = frozenset(t.columns) - {"task_id", "start_ns"}
        for f in old_t.schema:
            c = f.name
            if c in given_cols:
                col = _arrow_cast(given[c].combine_chunks(), f.type)
            elif c in _AT_COLUMNS:
                col = old_t[c].take(take_at).combine_chunks()
            elif c in ("task_id", "obs_dur_ns", "slack_ns", "blocking"):
                col = pa.array(np.zeros(k, bool if c == "blocking" else np.int64), f.type)
            else:
                col = pa.nulls(k, f.type)
            cols.append(col)
        newrows = pa.Table.from_arrays(cols, schema=old_t.schema)
        # order: existing tasks at 2*id (scaled), new ones beside their anchor, ties by input order
        pos = np.concatenate([np.arange(n, dtype=np.float64) * 2,
                              at * 2.0 + np.where(after, 1.0, -1.0)])
        tie = np.concatenate([np.zeros(n), np.arange(1, k + 1) / (k + 2)])
        order = np.lexsort((tie, pos))
        newid = np.empty(n + k, np.int64)
        newid[order] = np.arange(n + k)
        # OLD's rows and the new ones stacked, then gathered in ORDER: on a 4k-task graph
        # ~0.25 ms, where slicing OLD's runs and concatenating them with the new rows took
        # 0.3-0.7 ms, more the more runs the new rows cut
        allt = _set(pa.concat_tables([old_t, newrows]).take(order), "task_id",
                    np.arange(n + k, dtype=np.int64))
        e = self.arrow("edge")
        src = newid[e["src"].to_numpy()]
        dst = newid[e["dst"].to_numpy()]
        ins_ids = newid[n:]
        # splice into the unit order, new tasks in id order so that several placed before
        # one task chain up in input order
        unit = self.array("unit_id")
        tu = t["unit_id"].to_numpy()
        splice = (t["splice"].to_numpy().astype(bool) if "splice" in t.columns
                  else np.ones(k, bool))
        u = self.arrow("unit")
        ukind = dict(zip(u["unit_id"].to_pylist(), u["kind"].to_pylist(), strict=False))
        okind = {"thread": "thread", "stream": "stream"}
        unit_new = np.empty(n + k, np.int64)
        unit_new[newid[:n]] = unit
        unit_new[ins_ids] = tu
        # tasks placed before one task chain up in input order as they are processed in id
        # order; those placed after one take over its out-edges, so they are processed in
        # reverse id order to chain up the same way (at -> first -> second -> ...)
        todo = [j for j in np.argsort(ins_ids) if splice[j] and tu[j] == unit[at[j]]
                and not after[j]]
        todo += [j for j in np.argsort(-ins_ids) if splice[j] and tu[j] == unit[at[j]]
                 and after[j]]
        kinds: list[str] = []
        if todo:
            src, dst, kinds = self._splice(src, dst, todo, newid, ins_ids, at, tu, after,
                                           unit_new, ukind, okind)
        # the edges added, column by column: one per spliced task (unit order, no lag), then
        # EDGES' (``_EDGE_DEFAULTS`` where they give none); as Python lists, then one table:
        # a small insert's cost is its calls, not its rows
        n_e, m = e.num_rows, len(kinds)
        add = {c: [v] * m for c, v in _EDGE_DEFAULTS}
        add.update(src=src[n_e:].tolist(), dst=dst[n_e:].tolist(), kind=kinds)
        if edges is not None and edges.height:
            def m_(col):
                a = edges[col].to_numpy().astype(np.int64)
                return np.where(a < 0, ins_ids[np.clip(-1 - a, 0, k - 1)],
                                newid[np.clip(a, 0, n - 1)])
            u_src, u_dst = m_("src"), m_("dst")
            ends = {"src": u_src.tolist(), "dst": u_dst.tolist()}
            defaults = dict(_EDGE_DEFAULTS)
            for c in e.column_names:  # a column beyond the defaults: EDGES must give it
                if c in ends:
                    vals = ends[c]
                elif c in edges.columns:
                    d = defaults.get(c)
                    vals = edges[c].to_list()
                    vals = vals if d is None else [d if v is None else v for v in vals]
                elif c in defaults:
                    vals = [defaults[c]] * edges.height
                else:
                    raise DaydreamError(f"insert: the new edges give no {c!r}")
                add[c] = add.get(c, [None] * m) + vals
            src, dst = np.concatenate([src, u_src]), np.concatenate([dst, u_dst])
        old = _set(_set(e, "src", src[:n_e]), "dst", dst[:n_e])
        added = pa.Table.from_arrays([_arrow_cast(pa.array(add[f.name]), f.type)
                                      for f in old.schema], schema=old.schema)
        # in (src, dst) order, ties in table order (a stable sort, as every primitive keeps it)
        edge = pa.concat_tables([old, added]).take(np.lexsort((dst, src)))
        # the columns converted so far, each the old rows' and the new ones' in ORDER
        arrays = {}
        for key, a in self._arrays(("task_id",)).items():
            c = key[1]
            if c in _AT_COLUMNS and c not in given_cols:  # at's values, converted already
                new = a[at]
            else:
                try:
                    new = _arrow_array(newrows[c], c, key[2])
                except DaydreamError:  # a null in a new row where none is asked for: left
                    continue           # to array() to say when asked
            arrays[key] = np.concatenate([a, new])[order]
            arrays[key].setflags(write=False)
        return self._with(arrays, task=allt, edge=edge), newid[:n], ins_ids

    @staticmethod
    def _splice(e_src: np.ndarray, e_dst: np.ndarray, todo: list[int], newid: np.ndarray,
                ins_ids: np.ndarray, at: np.ndarray, tu: np.ndarray, after: np.ndarray,
                unit_new: np.ndarray, ukind: dict, okind: dict
                ) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """The unit-order splice of ``_insert`` (the edges' ends in new ids: E_SRC, E_DST): a
        task placed before its anchor takes over the anchor's in-edges from its unit, one
        placed after it the out-edges to its unit, and each gets a zero-lag edge to (from)
        the anchor. Only the edges into (out of) the anchors are looked at. Returns the ends
        of every edge, the old ones first and then one new edge per spliced task, and the
        new edges' kinds."""
        n_e, m = len(e_src), len(todo)
        src = np.empty(n_e + m, np.int64)
        dst = np.empty(n_e + m, np.int64)
        src[:n_e] = e_src
        dst[:n_e] = e_dst
        a_before = np.unique(newid[at[[j for j in todo if not after[j]]]])
        a_after = np.unique(newid[at[[j for j in todo if after[j]]]])
        into: dict[int, list[int]] = {}
        outof: dict[int, list[int]] = {}
        # the anchors looked up by task id (np.isin sorted the ends of every edge)
        is_anchor = np.zeros(len(unit_new), bool)
        is_anchor[a_before] = True
        for i in np.flatnonzero(is_anchor[dst[:n_e]]).tolist():
            into.setdefault(int(dst[i]), []).append(i)
        is_anchor[:] = False
        is_anchor[a_after] = True
        for i in np.flatnonzero(is_anchor[src[:n_e]]).tolist():
            outof.setdefault(int(src[i]), []).append(i)
        kinds = []
        for q, j in enumerate(todo):
            a_new, x, u = int(newid[at[j]]), int(ins_ids[j]), int(tu[j])
            if not after[j]:
                moved = [i for i in into.get(a_new, []) if unit_new[src[i]] == u]
                for i in moved:
                    dst[i] = x
                    into[a_new].remove(i)
                s_, d_ = x, a_new
            else:
                moved = [i for i in outof.get(a_new, []) if unit_new[dst[i]] == u]
                for i in moved:
                    src[i] = x
                    outof[a_new].remove(i)
                s_, d_ = a_new, x
            i = n_e + q
            src[i], dst[i] = s_, d_
            kinds.append(okind.get(ukind.get(u), "inserted"))
            into.setdefault(d_, []).append(i)
            outof.setdefault(s_, []).append(i)
        return src, dst, kinds

    def connect(self, edges: pl.DataFrame) -> Graph:
        """Add edges between existing tasks: src, dst, and optionally kind, anchor, lag_ns,
        binding (default ``inserted``, ``end_start``, 0, false)."""
        if not edges.height:
            return self
        ed = _edge_defaults(edges)
        n = self.n_tasks
        bad = ed.filter((pl.col("src") < 0) | (pl.col("src") >= n) | (pl.col("dst") < 0) |
                        (pl.col("dst") >= n))
        if bad.height:
            raise DaydreamError(f"connect: edge {bad.row(0)} names a task outside 0..{n - 1}")
        e = pl.concat([self.edge, ed.select(self.edge.columns).cast(self.edge.schema)])
        return self._with(self._arrays(), edge=e.sort(["src", "dst"], maintain_order=True))

    # -- reschedule ----------------------------------------------------------------------------
    def set_priority(self, pred: Predicate, priority) -> Graph:
        """Priority (lower runs first on PRIORITY units) of the selected tasks."""
        mask = self.select(pred)
        p = self.task["priority"].fill_null(0).to_numpy().astype(np.int64)
        p[mask] = np.broadcast_to(np.asarray(priority, np.int64), (self.n_tasks,))[mask]
        return self._with(self._arrays(("priority",)),
                          task=self.task.with_columns(pl.Series("priority", p, pl.Int64)))

    def set_policy(self, unit_ids: Sequence[int], policy: str) -> Graph:
        """Scheduling policy (fixed, fcfs, priority) of some units."""
        if policy not in POLICIES:
            raise DaydreamError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
        u = self.unit.with_columns(pl.when(pl.col("unit_id").is_in(list(unit_ids)))
                                   .then(pl.lit(policy)).otherwise(pl.col("policy"))
                                   .alias("policy"))
        return self._with(self._arrays(), unit=u)

    def add_unit(self, name: str, kind: str = "channel", policy: str = "fcfs",
                 device: int | None = None) -> tuple[Graph, int]:
        """A new unit (e.g. a network channel, or a copy stream on GPU ``device``); returns the
        graph and its unit id."""
        uid = int(self.unit["unit_id"].max()) + 1 if self.unit.height else 0
        row = {c: [None] for c in self.unit.columns}
        row.update(unit_id=[uid], kind=[kind], name=[name], policy=[policy])
        if device is not None:
            row["device"] = [device]
        u = pl.concat([self.unit, pl.DataFrame(row, schema=self.unit.schema)])
        return self._with(self._arrays(), unit=u), uid

    def move(self, pred: Predicate, unit_id: int) -> Graph:
        """Run the selected tasks on another unit."""
        mask = self.select(pred)
        u = self.task["unit_id"].to_numpy().copy()
        u[mask] = unit_id
        return self._with(self._arrays(("unit_id",)),
                          task=self.task.with_columns(pl.Series("unit_id", u, pl.Int32)))

    # -- helpers for optimizations --------------------------------------------------------------
    def launches(self) -> pl.DataFrame:
        """(api, gpu) task id pairs joined by launch edges."""
        return self.edge.filter(pl.col("kind") == "launch").select(
            pl.col("src").alias("api"), pl.col("dst").alias("gpu"))

    def gpu_streams(self) -> list[list[int]]:
        """Task ids of each GPU unit's tasks (kernels, copies, sets, collectives; the origin
        marker left out), in start order: what "adjacent on a stream" means to fusions."""
        kind = self.task["kind"].to_numpy()
        unit = self.task["unit_id"].to_numpy()
        gpu = np.isin(kind, list(GPU_KINDS))
        if len(gpu):
            gpu[0] = False
        return [np.flatnonzero(gpu & (unit == u)).tolist() for u in np.unique(unit[gpu])]

