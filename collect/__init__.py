"""Trace collection: CUPTI activity records and PyTorch layer markers into raw record files.

``collect`` (a context manager), ``collect_steps`` (a callable run for some iterations) and the
``daydream collect -- <command>`` launcher (``collect.cli``). Everything but
``collect.cupti_backend`` imports without a GPU; docs/collect.md shows the three ways to get a
trace into Daydream.
"""

from __future__ import annotations

__all__ = ["collect", "collect_steps", "Collection"]


def __getattr__(name: str):
    if name in __all__:
        from daydream.collect import api
        return getattr(api, name)
    raise AttributeError(name)
