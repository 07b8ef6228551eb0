"""The general what-if: scale the durations of the tasks a SQL predicate selects."""

from __future__ import annotations

from daydream.base.errors import DaydreamError
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register


@register("scale", example="scale(select=\"kind = 'kernel'\", factor=0.5)")
def scale(g: Graph, ctx: Context, *, select: str, factor: float) -> Graph:
    """Scale the duration of the selected tasks by FACTOR (0.5 = twice as fast).

    SELECT is a SQL WHERE clause over the task table (DuckDB dialect), e.g.
    "kind = 'kernel' AND name LIKE '%gemm%'". Lags (launch latencies, gaps) are kept; observed
    start times are kept so the tasks stay in their place in each unit's order."""
    if factor < 0:
        raise DaydreamError(f"scale: factor must be >= 0, got {factor}")
    return g.scale(select, factor)
