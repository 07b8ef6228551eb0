"""Graph -> rewritten graph: the what-if optimizations (see transforms.registry.rewrite)."""

from transforms.registry import list_opts, rewrite

__all__ = ["rewrite", "list_opts"]
