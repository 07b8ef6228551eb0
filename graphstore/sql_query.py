"""SQL over a store: a query run read-only over the graph tables, their views and the activity
tables (as views of the Parquet files), and its result rendered as a text table, CSV, JSON or a
Parquet file (``daydream sql``, ``daydream.sql``; docs/sql.md). The graph database it opens
is graphstore.db's.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import decimal
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from daydream.base.errors import DaydreamError
from daydream.base.store import COMMIT_ORDER, PART, TRACE_DIR_PREFIX
from daydream.graphstore.db import (
    DEFAULT_TIMEOUT_S,
    VIEWS,
    connect,
    db_path,
    first_line,
    instance,
    sql_literal,
)
from daydream.graphstore.schema import GRAPH_TABLES
from daydream.ingest.store import Store

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

FORMATS = ("table", "csv", "json", "parquet")
# The text table shows at most this many rows (the footer says how many there were).
TABLE_MAX_ROWS = 1000


# --------------------------------------------------------------------------------------------
# Activity tables as views


def register_activity(con: duckdb.DuckDBPyConnection, store_root: str | Path,
                      sql: str | None = None) -> list[str]:
    """Make the Parquet activity tables queryable on ``con`` as temporary views.

    One view per activity table (kernel, memcpy, memset, api, sync, range, flow, trace), with
    ``trace_id`` from the trace's folder, over the files of both layouts (ingest.store). Only
    committed traces are visible: a trace's folder is renamed into place whole, and in the
    older layout the ``trace`` partition is renamed into place last and removed first.
    Works on read-only connections (temporary views live in memory). Returns the view names.
    With ``sql``, only the tables it names (and ``trace``, which the others filter on): creating
    a view lists its table's partitions, which over thousands of traces costs more than a query
    that does not need them.
    """
    activity = Store(Path(store_root)).activity.resolve()
    names = []
    wanted = None if sql is None else _named_tables(sql)
    # trace first: the other views filter on it.
    for table in ("trace", *(t for t in COMMIT_ORDER if t != "trace")):
        if wanted is not None and table not in wanted:
            continue
        # the table's files in either layout (ingest.store): a glob is read where it finds a
        # file (DuckDB fails on one that finds none)
        globs = []
        if next(activity.glob(f"{TRACE_DIR_PREFIX}*/{table}.parquet"), None) is not None:
            globs.append(str(activity / f"{TRACE_DIR_PREFIX}*" / f"{table}.parquet"))
        if next((activity / table).glob(f"{TRACE_DIR_PREFIX}*/{PART}"), None) is not None:
            globs.append(str(activity / table / f"{TRACE_DIR_PREFIX}*" / "*.parquet"))
        if globs:
            # Every file is written with the declared schema, so DuckDB reads the schema of
            # the first file only (no union_by_name, which would open every footer).
            files = "[" + ", ".join(sql_literal(g) for g in globs) + "]"
            src = (f"read_parquet({files}, hive_partitioning = true, "
                   f"hive_types = {{'trace_id': 'VARCHAR'}})")
            if table == "trace":
                sql = f"SELECT * FROM {src}"
            else:
                sql = f"SELECT * FROM {src} WHERE trace_id IN (SELECT trace_id FROM trace)"
            con.execute(f'CREATE OR REPLACE TEMP VIEW "{table}" AS {sql}')
        else:
            import pyarrow as pa  # only for a table no trace has a file of

            from daydream.ingest import schema as activity_schema
            empty = activity_schema.empty(table)
            empty = empty.append_column("trace_id", pa.array([], pa.string()))
            con.register(table, empty)
        names.append(table)
    return names


def _named_tables(sql: str) -> set[str]:
    """Activity tables whose names occur as words in ``sql`` (a superset is harmless)."""
    words = set(re.findall(r"[a-z_][a-z0-9_]*", sql.lower()))
    named = {t for t in COMMIT_ORDER if t in words}
    return named | {"trace"} if named else named


# --------------------------------------------------------------------------------------------
# Queries


def query(store_root: str | Path, sql: str, fmt: str = "table", out: str | Path | None = None,
          *, activity: bool = True, max_rows: int | None = TABLE_MAX_ROWS,
          timeout_s: float = DEFAULT_TIMEOUT_S, fit=None) -> str:
    """Run ``sql`` on a read-only connection to the store and render the result.

    ``fmt``: ``table`` (aligned text with a row-count footer, at most ``max_rows`` rows shown),
    ``csv`` (with a header), ``json`` (a list of records) or ``parquet`` (needs ``out``). With
    ``out`` the result is written there and a one-line summary is returned; otherwise the text.
    With ``activity`` the raw activity tables are views too (:func:`register_activity`). A store
    with activity tables but no graph yet is queried over the activity views alone.
    ``fit(header, numeric, rows)`` lays out a ``table``'s header and text rows (the CLI's:
    fitted to the terminal as its other tables, ``daydream.text_table``); without it every
    column takes the width it needs.
    """
    if fmt not in FORMATS:
        raise DaydreamError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    if fmt == "parquet" and out is None:
        raise DaydreamError("--format parquet needs --out FILE")
    if fmt == "parquet":
        import pyarrow.parquet as pq
        table = _run(store_root, sql, _arrow, activity=activity, timeout_s=timeout_s)
        try:
            pq.write_table(table, out)
        except OSError as e:
            raise DaydreamError(f"cannot write {out}: {e}") from None
        return f"{_rows(table.num_rows)} -> {out}"
    result = _run(store_root, sql, _result, activity=activity, timeout_s=timeout_s)
    if out is not None:
        out = Path(out)
        text = render(result, fmt, max_rows=None)
        try:
            out.write_text(text)
        except OSError as e:
            raise DaydreamError(f"cannot write {out}: {e}") from None
        return f"{_rows(len(result.rows))} -> {out}"
    return render(result, fmt, max_rows=max_rows, fit=fit)


def run_sql(store_root: str | Path, sql: str, *, activity: bool = True,
            timeout_s: float = DEFAULT_TIMEOUT_S) -> pa.Table:
    """Run ``sql`` read-only and return the result of its last statement as an Arrow table."""
    return _run(store_root, sql, _arrow, activity=activity, timeout_s=timeout_s)


def _run(store_root: str | Path, sql: str, fetch, *, activity: bool, timeout_s: float):
    """``fetch`` of the relation of the last statement of ``sql`` (None where it has none),
    run read-only over the store."""
    import duckdb
    root = Path(store_root)
    has_graph = db_path(root).exists()
    has_activity = has_graph or bool(Store(root).trace_ids())
    if not has_graph and not has_activity:
        raise DaydreamError(f"no traces in {root}: ingest some first "
                            f"(`daydream ingest TRACE... --store {root}`)")
    with contextlib.ExitStack() as stack:
        if has_graph:
            con = stack.enter_context(connect(root, read_only=True, timeout_s=timeout_s))
        else:
            con = instance().cursor()  # the process's instance: no second catalog to build
            stack.callback(con.close)
        show = SHOW_TABLES.fullmatch(sql) is not None
        if activity or not has_graph:
            register_activity(con, root, None if show else sql)
        try:
            return fetch(con, con.sql(_show_tables() if show else sql))
        except duckdb.Error as e:
            msg = first_line(str(e))
            if not has_graph and any(v in msg for v in (*GRAPH_TABLES, *VIEWS)):
                msg += (f" (the graph of {root} is not built yet: only the activity tables "
                        "can be queried)")
            raise DaydreamError(f"sql: {msg}") from None


# ``SHOW TABLES`` answered by ``_show_tables``: DuckDB's lists a graph table twice where a
# view over its Parquet partitions shadows it, and omits the activity tables' views
SHOW_TABLES = re.compile(r"\s*show\s+(all\s+)?tables\s*;?\s*", re.IGNORECASE)


def _show_tables() -> str:
    """Every table and view a query can name, once each, with what it is."""
    def kinds(names, kind: str) -> str:
        return " UNION ALL ".join(f"SELECT {sql_literal(n)} AS name, {sql_literal(kind)} AS k"
                                  for n in names)
    known = " UNION ALL ".join([kinds(GRAPH_TABLES, "graph table"), kinds(VIEWS, "view"),
                                kinds(COMMIT_ORDER, "activity table")])
    return ("WITH present AS (SELECT table_name AS name FROM duckdb_tables() UNION "
            "SELECT view_name FROM duckdb_views() WHERE NOT internal), "
            f"known AS ({known}) "
            "SELECT p.name, coalesce(k.k, 'table') AS kind FROM present p "
            "LEFT JOIN known k USING (name) ORDER BY p.name")


def _arrow(con: duckdb.DuckDBPyConnection, rel: duckdb.DuckDBPyRelation | None) -> pa.Table:
    import pyarrow as pa
    return pa.table({}) if rel is None else rel.to_arrow_table()


@dataclass(frozen=True)
class Result:
    """A query's result as Python values, what ``render`` prints: column names, whether each
    is a number (right-aligned), rows."""
    columns: list[str]
    numeric: list[bool]
    rows: list[tuple]


_INTEGERS = {"tinyint", "smallint", "integer", "bigint", "utinyint", "usmallint", "uinteger",
             "ubigint"}
_NUMBERS = _INTEGERS | {"hugeint", "uhugeint", "float", "double", "decimal"}
# Types whose values DuckDB's Python conversion gives as Arrow's does (``pa.Table.to_pylist``),
# HUGEINT but for the Decimal Arrow makes of it, TIMESTAMPTZ (which DuckDB converts through
# pytz) read as microseconds and zoned as Arrow zones them; a result with any other type
# (INTERVAL, MAP, UUID, ...) is fetched through Arrow.
_ZONED = "timestamp with time zone"
_PLAIN = _INTEGERS | {"hugeint", "float", "double", "decimal", "boolean", "varchar", "enum",
                      "date", "time", "timestamp", "blob", _ZONED}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _plain(t: duckdb.DuckDBPyType) -> bool:
    if t.id in ("list", "struct"):
        return all(_plain(c) for _, c in t.children)
    return t.id in _PLAIN


def _result(con: duckdb.DuckDBPyConnection, rel: duckdb.DuckDBPyRelation | None) -> Result:
    """The result as Python values without Arrow (pyarrow's import costs a short query more
    than the query) where DuckDB converts its types alike; through Arrow otherwise."""
    if rel is None:
        return Result([], [], [])
    types = rel.types
    numeric = [t.id in _NUMBERS for t in types]
    zoned = {i for i, t in enumerate(types) if t.id == _ZONED}
    huge = {i for i, t in enumerate(types) if t.id == "hugeint"}
    if all(_plain(t) for t in types) and len(set(rel.columns)) == len(types):
        if zoned:
            names = ['"' + c.replace('"', '""') + '"' for c in rel.columns]
            rel = rel.project(", ".join(f"epoch_us({n}) AS {n}" if i in zoned else n
                                        for i, n in enumerate(names)))
            from zoneinfo import ZoneInfo
            zone = ZoneInfo(con.execute("SELECT current_setting('TimeZone')").fetchall()[0][0])
        rows = rel.fetchall()
        if huge or zoned:
            # HUGEINT as Arrow carries it (decimal128(38, 0)), TIMESTAMPTZ in the session's
            # zone as Arrow gives it
            rows = [tuple(v if v is None else decimal.Decimal(v) if i in huge
                          else (_EPOCH + dt.timedelta(microseconds=v)).astimezone(zone)
                          if i in zoned else v for i, v in enumerate(r)) for r in rows]
    else:
        rows = list(_tuples(rel.to_arrow_table()))
    return Result(rel.columns, numeric, rows)


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def render(t: Result, fmt: str, max_rows: int | None = TABLE_MAX_ROWS, fit=None) -> str:
    """Render a query's result as ``table``, ``csv`` or ``json`` text (FIT: see ``query``)."""
    if fmt == "table":
        return _text_table(t, max_rows, fit)
    if fmt == "csv":
        return _csv(t)
    if fmt == "json":
        return orjson.dumps([dict(zip(t.columns, r, strict=True)) for r in t.rows],
                            default=_json_default).decode() + "\n"
    raise DaydreamError(f"cannot render format {fmt!r} as text; use one of table, csv, json")


def _tuples(t: pa.Table) -> Iterator[tuple]:
    """Rows of ``t`` as tuples, batch by batch (no dict per row)."""
    for batch in t.to_batches():
        yield from zip(*(c.to_pylist() for c in batch.columns), strict=True)


def _cell(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        s = f"{v:.6f}".rstrip("0").rstrip(".")
        return s if s not in ("", "-0") else "0"
    if isinstance(v, dict | list | tuple):
        return orjson.dumps(v, default=_json_default).decode()
    return str(v).replace("\n", "\\n")


def _text_table(t: Result, max_rows: int | None, fit=None) -> str:
    if not t.columns:
        return "(0 rows)\n"
    header = t.columns
    rows = [[_cell(v) for v in r] for r in t.rows[:max_rows]]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(cells, widths, t.numeric, strict=True)).rstrip()

    if fit is not None and rows:
        out = fit(list(header), list(t.numeric), rows).rstrip("\n").split("\n")
    else:
        out = [line(header), "  ".join("-" * w for w in widths)]
        out += [line(r) for r in rows]
    foot = f"({_rows(len(t.rows))}"
    if len(rows) < len(t.rows):
        foot += f", first {len(rows)} shown; use --format csv or --out for all"
    out.append(foot + ")")
    return "\n".join(out) + "\n"


def _csv_cell(v) -> object:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict | list | tuple):
        return orjson.dumps(v, default=_json_default).decode()
    return v


def _csv(t: Result) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(t.columns)
    for r in t.rows:
        w.writerow([_csv_cell(v) for v in r])
    return buf.getvalue()


def _json_default(v):
    if isinstance(v, decimal.Decimal):
        # DuckDB's sum() of BIGINT is a HUGEINT, which Arrow carries as decimal128(38, 0).
        if v == v.to_integral_value() and -(2**63) <= v < 2**63:
            return int(v)
        return float(v)
    if isinstance(v, bytes):
        return v.hex()
    return str(v)
