"""Terminal rendering of a prediction (rich tables). Presentation only."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def _ms(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}"


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.2f}%"


def print_prediction(d: dict) -> None:
    con = Console()
    con.print(f"trace [bold]{d['trace_id']}[/bold]  {d['file']}")
    t = Table(title="iterations")
    for col in ("iteration", "label", "measured ms", "baseline ms", "error", "note"):
        t.add_column(col, justify="right" if "ms" in col or col == "error" else "left")
    for it in d["iterations"]:
        t.add_row(str(it["index"]), it.get("label") or "", _ms(it["measured_ms"]),
                  _ms(it["baseline_ms"]), _pct(it["error_pct"]),
                  it.get("note", "") if not it["used"] else "")
    t.add_row("mean", "(used)", _ms(d["measured_ms"]), _ms(d["baseline_ms"]),
              _pct(d["baseline_error_pct"]), "", style="bold")
    con.print(t)
    cp = d.get("critical_path") or {}
    if cp:
        con.print(f"critical path of iteration {cp['iteration']}: {cp['tasks']} tasks over "
                  f"{cp['span_ns'] / 1e6:.3f} ms")
        for key in ("phase", "kind", "layer"):
            parts = ", ".join(f"{r[key]} {r['ns'] / 1e6:.2f} ms" for r in cp[f"by_{key}"][:5])
            con.print(f"  by {key}: {parts}")
    units = d.get("units") or []
    if units:
        u = Table(title="unit load (share of the simulated span)")
        u.add_column("unit")
        u.add_column("busy ms", justify="right")
        u.add_column("busy", justify="right")
        for r in sorted(units, key=lambda r: -r["busy_share"])[:12]:
            u.add_row(r["unit"], f"{r['busy_ns'] / 1e6:.2f}", f"{100 * r['busy_share']:.1f}%")
        con.print(u)
    if d.get("timeline"):
        con.print(f"timeline written to {d['timeline']} (open in https://ui.perfetto.dev)")
