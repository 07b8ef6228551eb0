"""Terminal rendering of a prediction (rich tables). Presentation only."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.table import Table


def _ms(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}"


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.2f}%"


def print_prediction(d: dict) -> None:
    con = Console()
    con.print(f"trace [bold]{d['trace_id']}[/bold]  {d['file']}")
    pred = "predicted_ms" in d
    title = f"iterations: replay and prediction with {d['opts']}" if pred else \
        "iterations: replay"
    t = Table(title=title)
    cols = ["iteration", "label", "measured ms", "baseline ms", "replay error", "explained ms"]
    if pred:
        cols += ["predicted ms", "speedup"]
    cols.append("note")
    for col in cols:
        t.add_column(col, justify="right" if ("ms" in col or col in ("replay error", "speedup"))
                     else "left")
    for it in d["iterations"]:
        row = [str(it["index"]), it.get("label") or "", _ms(it["measured_ms"]),
               _ms(it["baseline_ms"]), _pct(it["error_pct"]), _ms(it.get("explained_ms"))]
        if pred:
            p = it.get("predicted_ms")
            row += [_ms(p), f"{it['baseline_ms'] / p:.3f}x" if p else ""]
        row.append(it.get("note", "") if not it["used"] else "")
        t.add_row(*row)
    mean = ["steady", "(used)", _ms(d["measured_ms"]), _ms(d["baseline_ms"]),
            _pct(d["baseline_error_pct"]), _ms(d.get("explained_ms"))]
    if pred:
        mean += [_ms(d["predicted_ms"]), f"{d['speedup']:.3f}x" if d.get("speedup") else ""]
    mean.append("")
    t.add_row(*mean, style="bold")
    con.print(t)
    print_headline(con, d)
    if pred:
        ph = Table(title="time per phase and iteration (busy ms: GPU / CPU)")
        for col in ("phase", "baseline GPU", "predicted GPU", "baseline CPU", "predicted CPU"):
            ph.add_column(col, justify="left" if col == "phase" else "right")
        b, p = d["phases"]["baseline"], d["phases"]["predicted"]
        for name in sorted(set(b) | set(p)):
            bb, pp = b.get(name, {}), p.get(name, {})
            ph.add_row(name, _ms(bb.get("gpu_ms")), _ms(pp.get("gpu_ms")),
                       _ms(bb.get("cpu_ms")), _ms(pp.get("cpu_ms")))
        con.print(ph)
        for note in d.get("notes") or []:
            con.print(f"  note: {note}")
    if d.get("ranks"):
        print_ranks(con, d)
    cp = d.get("critical_path") or {}
    if cp:
        con.print(f"critical path of iteration {cp['iteration']} (replay): {cp['tasks']} tasks "
                  f"over {cp['span_ns'] / 1e6:.3f} ms")
        for key in ("phase", "kind", "layer"):
            parts = ", ".join(f"{r[key]} {r['ns'] / 1e6:.2f} ms" for r in cp[f"by_{key}"][:5])
            con.print(f"  by {key}: {parts}")
    units = d.get("units") or []
    if units:
        u = Table(title="unit load in the replay (share of the simulated span)")
        u.add_column("unit")
        u.add_column("busy ms", justify="right")
        u.add_column("busy", justify="right")
        for r in sorted(units, key=lambda r: -r["busy_share"])[:12]:
            u.add_row(r["unit"], f"{r['busy_ns'] / 1e6:.2f}", f"{100 * r['busy_share']:.1f}%")
        con.print(u)
    if d.get("timeline"):
        con.print(f"timeline written to {d['timeline']} (open in https://ui.perfetto.dev)")
    if d.get("plot"):
        con.print(f"plot of iteration {d['plot_iteration']} written to {d['plot']}")
    if d.get("predicted_timeline"):
        con.print(f"predicted timeline written to {d['predicted_timeline']}")


def print_headline(con: Console, d: dict) -> None:
    """What the steady-state figures rest on: the trace's own spread, how much of it the
    graph explains, the prediction's interval, and the slack the graph could not explain."""
    spread = d.get("measured_spread_ms")
    if spread:
        con.print(f"measured: steady-state step {d['measured_ms']:.3f} ms; the used steps ran "
                  f"{spread[0]:.3f}-{spread[1]:.3f} ms (median {d['measured_median_ms']:.3f}, "
                  f"mean {d['measured_mean_ms']:.3f})")
    if d.get("explained_ms") is not None:
        con.print(f"explained replay (every slack at zero): {d['explained_ms']:.3f} ms "
                  f"({_pct(d.get('explained_error_pct'))}); without the inferred edges "
                  f"{_ms(d.get('explained_no_inferred_ms'))} ms")
    if d.get("predicted_interval_ms"):
        lo, hi = d["predicted_interval_ms"]
        sp = d.get("speedup_interval") or [None, None]
        con.print(f"predicted: {d['predicted_ms']:.3f} ms with the trace's slack kept, "
                  f"{_ms(d.get('predicted_explained_ms'))} ms with it at zero: "
                  f"[{lo:.3f}, {hi:.3f}] ms, speedup "
                  f"[{sp[0]:.3f}x, {sp[1]:.3f}x]" if sp[0] else "")
    slack = d.get("slack") or {}
    if slack:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(slack.items(), key=lambda kv: -kv[1]))
        con.print(f"slack the graph does not explain (ms per iteration, summed over edges): "
                  f"{parts}")
    inf = d.get("inferred_edges") or {}
    if inf:
        con.print("edges inferred from coincidences: " +
                  ", ".join(f"{k} {v}" for k, v in inf.items()))


def print_ranks(con: Console, d: dict) -> None:
    """A job's ranks, its collectives and its straggler."""
    t = Table(title=f"job {d.get('job')}: {d.get('world_size')} ranks")
    pred = "predicted_ms" in d
    for col in ("rank", "measured ms", "baseline ms", "replay error") + (
            ("predicted ms",) if pred else ()):
        t.add_column(col, justify="right")
    for r in d["ranks"]:
        row = [str(r["rank"]), _ms(r["measured_ms"]), _ms(r["baseline_ms"]),
               _pct(r.get("error_pct"))]
        if pred:
            row.append(_ms(r.get("predicted_ms")))
        t.add_row(*row)
    con.print(t)
    c = d.get("collectives") or {}
    if c.get("matched"):
        con.print(f"collectives: {c['matched']} matched across ranks ({c['kernels_joined']} "
                  f"kernels, {c['kernels_unmatched']} unmatched), "
                  f"{c['waiting_ms']:.3f} ms spent waiting for the last rank")
    s = d.get("straggler") or {}
    if s:
        cause = ", ".join(f"{x['name']} {x['ms']:.2f} ms" for x in s["cause"][:3])
        con.print(f"straggler: rank {s['rank']} arrived last at {s['last_at']} of "
                  f"{s['collectives']} collectives, the others waited {s['wait_caused_ms']:.3f}"
                  f" ms for it; at {s['worst_collective']} it was {s['late_by_ms']:.3f} ms late "
                  f"(its trace started {s['started_late_ms']:.3f} ms after the first rank's); "
                  f"its work before: {cause}")


@contextlib.contextmanager
def fleet_progress(enabled: bool) -> Iterator[tuple[Callable[[int], None], Callable[[], None]]]:
    """A progress bar over (trace, spec) pairs: yields ``plan(total)`` and ``tick()``."""
    if not enabled:
        yield (lambda n: None), (lambda: None)
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    progress = Progress("[progress.description]{task.description}", BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                        transient=True, console=Console(stderr=True))
    task = progress.add_task("predicting", total=None)
    with progress:
        yield (lambda n: progress.update(task, total=n)), (lambda: progress.advance(task))


def print_fleet(t, top: int) -> None:
    """Prediction rows (``daydream.fleet.results``), best gain first."""
    con = Console()
    rows = t.to_pylist()
    shown = rows if top <= 0 else rows[:top]
    tab = Table(title="predictions, best gain first")
    for col in ("trace", "file", "spec", "measured ms", "baseline ms", "predicted ms",
                "speedup"):
        tab.add_column(col, justify="right" if ("ms" in col or col == "speedup") else "left")
    for r in shown:
        tab.add_row(r["trace_id"][:10], _short(r.get("file")), r["spec"], _ms(r["measured_ms"]),
                    _ms(r["baseline_ms"]), _ms(r["predicted_ms"]),
                    f"{r['speedup']:.3f}x" if r["speedup"] else "")
    con.print(tab)
    if len(shown) < len(rows):
        con.print(f"({len(rows)} rows, first {len(shown)} shown; all of them: daydream sql "
                  "'SELECT * FROM prediction ORDER BY speedup DESC')")


def _short(path: str | None) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1] if path else ""
