"""Daydream: how much faster would this training iteration be with optimization X?

The public functions live in ``daydream.api``; they are imported on first use (PEP 562), so
that a command that needs only part of the library (``daydream sql``) does not pay for
importing the rest (the simulator's compiled core, the collector)."""

__all__ = ["DaydreamError", "collect", "collect_steps", "info", "ingest", "predict", "sql"]


def __getattr__(name: str):
    if name in __all__:
        from daydream import api
        return getattr(api, name)
    raise AttributeError(f"module 'daydream' has no attribute {name!r}")
