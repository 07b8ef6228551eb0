"""Reading a trace's graph back out of DIR/graph.duckdb as Arrow tables (zero-copy), for the
stages after graphstore (transforms, simulate). Never Python rows."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from graphstore import db
from graphstore.schema import GRAPH_TABLES
from ingest.errors import DaydreamError

ORDER = {"task": "task_id", "edge": "src, dst", "unit": "unit_id", "iteration": "iteration",
         "layer": "first_start_ns", "slack": "iteration, kind"}


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
    a catalog check): how a fleet's loader reads them in chunks. A trace without a graph gets
    empty tables."""
    root = Path(store_root)
    if not db.db_path(root).exists():
        raise DaydreamError(f"no graph in {root}: run `daydream ingest` first")
    out = []
    with db.connect(root, read_only=True) as con:
        for tid in trace_ids:
            g = {}
            for name, t in GRAPH_TABLES.items():
                cols = ", ".join(c for c in t.names if c != "trace_id")
                g[name] = con.sql(
                    f"SELECT {cols} FROM {name} WHERE trace_id = $tid ORDER BY {ORDER[name]}",
                    params={"tid": tid}).to_arrow_table()
            out.append(g)
    return out
