"""Collector checks for `make accuracy`, on traces written by `daydream collect`.

    import collector_checks
    lines = collector_checks.rows([(label, raw_path, profiler_path_or_None), ...], store)

For each raw CUPTI file (``*.cupti``), three checks, each a column of one markdown table row:

1. timing: no record CUPTI could not time (start = end = 0, ``untimed_record``) and none that
   ends before it starts (``negative_duration``); the file closed, not cut, no collector error,
   no record dropped by CUPTI;
2. mapping: every kernel has a layer, or belongs to the weight update (optimizer kernels are
   launched outside any module); the unmapped ones are counted and the commonest named;
3. the same tables as the profiler's, where a ``torch.profiler`` recording of the same settings
   is given: both ingest to the same activity-table schema, the same kernels per iteration
   (median count within 2%), the same kernel names (90% of the distinct names shared: Kineto
   and the collector demangle alike) and the same launch calls per iteration (within 2%).
   Two recordings of one job never match to the nanosecond, so times are shown, not checked.

``rows`` returns the section's markdown lines (heading, explanation, table); ``check`` the
numbers of one case. The store is where the traces are ingested (a temporary one if None).
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TIMING_STATS = ("untimed_record", "negative_duration")
FILE_STATS = ("collection_not_closed", "truncated_chunk", "collector_errors",
              "cupti_dropped_records")
GPU_KINDS = ("kernel", "comm")
COUNT_TOLERANCE = 0.02
NAMES_SHARED = 0.90


def _graph(path: Path, store: Path) -> tuple[object, dict]:
    """The trace as read (stats, tables) and its graph tables."""
    from daydream import api
    from daydream.base.errors import DaydreamError
    from daydream.graphstore.read import read_graph
    from daydream.ingest.convert import read_trace

    conv = read_trace(path)
    rep = api.ingest([path], store)
    (res,) = rep.results
    if res.trace_id is None:
        raise DaydreamError(f"{path}: ingest failed: {res.error}")
    return conv, read_graph(store, res.trace_id)


def _per_iteration(task, kinds: tuple[str, ...], name_filter=None) -> list[int]:
    import polars as pl

    t = pl.from_arrow(task.select(["kind", "name", "iteration"])).with_columns(
        pl.col("kind").cast(pl.String), pl.col("name").cast(pl.String))
    t = t.filter(pl.col("kind").is_in(list(kinds)) & pl.col("iteration").is_not_null())
    if name_filter is not None:
        t = t.filter(name_filter(pl.col("name")))
    counts = t.group_by("iteration").len().sort("iteration")["len"].to_list()
    return counts


def _median(xs: list[int]) -> float | None:
    s = sorted(xs)
    return float(s[len(s) // 2]) if s else None


def _launches(col):
    return col.str.starts_with("cudaLaunch") | col.str.starts_with("cuLaunch")


def check(raw: Path, profiler: Path | None = None, store: Path | None = None) -> dict:
    """The three checks of one raw file (and its profiler twin); ``problems`` lists failures."""
    import polars as pl

    tmp = None
    if store is None:
        tmp = tempfile.TemporaryDirectory(prefix="collector-checks-")
        store = Path(tmp.name)
    try:
        conv, g = _graph(Path(raw), store)
        out: dict = {"problems": []}
        stats = {k: int(conv.stats.get(k) or 0) for k in TIMING_STATS + FILE_STATS}
        out["stats"] = stats
        for k, v in stats.items():
            if v:
                out["problems"].append(f"{k} {v}")
        task = pl.from_arrow(g["task"].select(["kind", "name", "layer", "phase"])).with_columns(
            pl.all().cast(pl.String))
        k = task.filter(pl.col("kind").is_in(list(GPU_KINDS)))
        mapped = k.filter(pl.col("layer").is_not_null() | (pl.col("phase") == "weight_update"))
        unmapped = k.filter(pl.col("layer").is_null() & (pl.col("phase") != "weight_update"))
        out.update(kernels=k.height, on_layer=int(k["layer"].is_not_null().sum()),
                   weight_update=mapped.height - int(k["layer"].is_not_null().sum()),
                   unmapped=unmapped.height,
                   unmapped_names=Counter(unmapped["name"].to_list()).most_common(3))
        if not k.height:
            out["problems"].append("no kernels")
        if unmapped.height:
            out["problems"].append(f"{unmapped.height} kernels on no layer")
        if profiler is not None:
            out["profiler"] = _compare(conv, g, Path(profiler), store, out["problems"])
        return out
    finally:
        if tmp is not None:
            tmp.cleanup()


def _compare(conv, g, profiler: Path, store: Path, problems: list[str]) -> dict:
    pconv, pg = _graph(profiler, store)
    cmp: dict = {}
    schema_diff = [name for name, t in conv.tables.items()
                   if name in pconv.tables and t.schema != pconv.tables[name].schema]
    cmp["schema_differs"] = schema_diff
    if schema_diff:
        problems.append(f"tables differ in schema: {', '.join(schema_diff)}")
    for what, kinds, flt in (("kernels", GPU_KINDS, None), ("launches", ("api",), _launches)):
        ours = _median(_per_iteration(g["task"], kinds, flt))
        theirs = _median(_per_iteration(pg["task"], kinds, flt))
        cmp[what] = (ours, theirs)
        if ours is None or theirs is None or \
                abs(ours - theirs) > COUNT_TOLERANCE * max(ours, theirs):
            problems.append(f"{what} per iteration {ours} vs profiler {theirs}")
    names = set(conv.tables["kernel"]["name"].to_pylist())
    pnames = set(pconv.tables["kernel"]["name"].to_pylist())
    shared = len(names & pnames) / max(1, len(names | pnames))
    cmp["names_shared"] = round(shared, 3)
    cmp["names_only_ours"] = sorted(names - pnames)[:3]
    if shared < NAMES_SHARED:
        problems.append(f"{100 * shared:.0f}% of kernel names shared with the profiler's")
    return cmp


def rows(cases: list[tuple[str, Path, Path | None]], store: Path | None = None) -> list[str]:
    """The markdown section for `make accuracy`: one row per (label, raw file, profiler trace
    or None)."""
    out = ["## Collector checks", "",
           "Traces written by `daydream collect`: timing (no untimed or negative-duration "
           "records, the file closed), mapping (every kernel on a layer or in the weight "
           "update), and, beside a `torch.profiler` recording of the same settings, the same "
           "tables (schema, kernels and launch calls per iteration within 2%, 90% of kernel "
           "names shared).", "",
           "| trace | kernels | untimed / negative | file | on a layer / weight update / none "
           "| vs profiler: kernels per iteration | launches per iteration | names shared | "
           "result |",
           "|---|---|---|---|---|---|---|---|---|"]
    if not cases:
        return out[:2] + ["No trace collected on a GPU yet.", ""]
    for label, raw, prof in cases:
        try:
            c = check(raw, prof, store)
        except Exception as e:  # noqa: BLE001 - a row that says why, the others go on
            out.append(f"| {label} | | | | | | | | error: {type(e).__name__}: {e} |")
            continue
        s = c["stats"]
        file_bad = [k for k in FILE_STATS if s[k]]
        none = str(c["unmapped"]) + (f" ({', '.join(n for n, _ in c['unmapped_names'])})"
                                     if c["unmapped"] else "")
        p = c.get("profiler")
        kcol = lcol = ncol = "-"
        if p:
            kcol = f"{_fmt(p['kernels'][0])} vs {_fmt(p['kernels'][1])}"
            lcol = f"{_fmt(p['launches'][0])} vs {_fmt(p['launches'][1])}"
            ncol = f"{100 * p['names_shared']:.0f}%"
        result = "ok" if not c["problems"] else "; ".join(c["problems"])
        out.append(f"| {label} | {c['kernels']} | {s['untimed_record']} / "
                   f"{s['negative_duration']} | {', '.join(file_bad) or 'closed'} | "
                   f"{c['on_layer']} / {c['weight_update']} / {none} | {kcol} | {lcol} | "
                   f"{ncol} | {result} |")
    return out + [""]


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"
