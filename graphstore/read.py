"""Reading a trace's graph back out of DIR/graph.duckdb as Arrow tables (zero-copy), for the
stages after graphstore (transforms, simulate). Never Python rows."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from daydream.base.errors import DaydreamError
from daydream.graphstore import db
from daydream.graphstore.schema import GRAPH_TABLES

# The order each table is read in: by its key, and where the key has ties (parallel edges
# between two tasks, layers starting together) by its other columns too. DuckDB's sort breaks
# ties by how its threads cut the scan (the transformer trace's 2,078 parallel edge pairs came
# back in one order with 1 or 2 threads and another with 4 or 8), and the simulator's critical
# path sees the order of parallel edges: a prediction must not depend on the machine's core
# count, nor on whether the graph was stored in DuckDB or as Parquet. ``anchor`` is compared
# as text: an ENUM in DuckDB, a string in Parquet.
ORDER = {"task": "task_id",
         "edge": "src, dst, kind, anchor::VARCHAR, lag_ns, slack_ns, binding, inferred",
         "unit": "unit_id", "iteration": "iteration", "layer": "first_start_ns, layer",
         "slack": "iteration, kind"}


def read_graph(store_root: Path | str, trace_id: str) -> dict[str, pa.Table]:
    """The graph tables of one trace, ``trace_id`` column dropped, in id order."""
    root = Path(store_root)
    (out,) = read_graphs(root, [trace_id])
    if not out["task"].num_rows:
        raise DaydreamError(f"trace {trace_id} has no graph in {root}; run `daydream ingest` "
                            "on its file again")
    return out


def read_graphs(store_root: Path | str, trace_ids: list[str]) -> list[dict[str, pa.Table]]:
    """The graph tables of several traces, read on one read-only connection (each open costs
    a catalog check), one query per table for all of them (a statement costs about a
    millisecond, a fleet's graphs are small): how a fleet's loader reads them in chunks. A
    trace without a graph gets empty tables."""
    import numpy as np
    import pyarrow.compute as pc

    root = Path(store_root)
    if not db.db_path(root).exists():
        raise DaydreamError(f"no graph in {root}: run `daydream ingest` first")
    out: list[dict[str, pa.Table]] = [{} for _ in trace_ids]
    if not trace_ids:
        return out
    with db.connect(root, read_only=True) as con:
        # graphs stored as Parquet (large ones) are read from their files by the same query
        in_files = set(db.parquet_ids(root)) & set(trace_ids)
        for i, tid in enumerate(trace_ids):
            if tid in in_files:
                for name, t in GRAPH_TABLES.items():
                    cols = ", ".join(c for c in t.names if c != "trace_id")
                    out[i][name] = con.sql(
                        f"SELECT {cols} FROM {db.parquet_select(root, tid, name)} "
                        f"ORDER BY {ORDER[name]}").to_arrow_table()
        rest = [tid for tid in trace_ids if tid not in in_files]
        pos = {tid: i for i, tid in enumerate(trace_ids) if tid not in in_files}
        for name, t in GRAPH_TABLES.items() if rest else ():
            cols = ", ".join(c for c in t.names if c != "trace_id")
            table = db.base_table(con, name) if in_files else name
            if len(rest) == 1:
                out[pos[rest[0]]][name] = con.sql(
                    f"SELECT {cols} FROM {table} WHERE trace_id = $tid ORDER BY {ORDER[name]}",
                    params={"tid": rest[0]}).to_arrow_table()
                continue
            tab = con.sql(
                f"SELECT trace_id, {cols} FROM {table} WHERE trace_id IN (SELECT unnest($ids)) "
                f"ORDER BY trace_id, {ORDER[name]}", params={"ids": rest}).to_arrow_table()
            runs = pc.run_end_encode(tab["trace_id"].combine_chunks())
            ends = runs.run_ends.to_numpy()
            starts = np.concatenate([[0], ends[:-1]]) if len(ends) else ends
            body = tab.drop_columns(["trace_id"])
            for tid, a, b in zip(runs.values.to_pylist(), starts, ends, strict=True):
                # a slice (no copy): a worker gets it as an Arrow IPC stream, which writes
                # the slice's rows alone (``daydream.fleet.pack_graph``; a pickle would carry
                # the chunk's whole buffers)
                out[pos[tid]][name] = body.slice(int(a), int(b - a))
            if len(runs.values) < len(rest):
                for tid in rest:
                    if name not in out[pos[tid]]:
                        out[pos[tid]][name] = body.schema.empty_table()
    return out
