"""One module per optimization; each registers itself with ``transforms.registry.register``."""
