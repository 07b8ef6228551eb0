"""Graph -> rewritten graph: the what-if optimizations (see transforms.registry.rewrite).

The names below are imported on first use (PEP 562): ``daydream opts`` lists the optimizations
from ``transforms.catalog`` without the registry's pyarrow, polars and duckdb."""

__all__ = ["Context", "rewrite", "list_opts"]


def __getattr__(name: str):
    if name == "list_opts":
        from daydream.transforms.catalog import listing
        return listing
    if name in ("Context", "rewrite"):
        from daydream.transforms import registry
        return getattr(registry, name)
    raise AttributeError(f"module 'daydream.transforms' has no attribute {name!r}")
