"""Graph -> rewritten graph: the what-if optimizations (see transforms.registry.rewrite)."""

from transforms.registry import Context, list_opts, rewrite

__all__ = ["Context", "rewrite", "list_opts"]
