"""Daydream: how much faster would this training iteration be with optimization X?

The public functions live in ``daydream.api`` (``daydream.api.ingest``, ``.predict``, ``.sql``,
``.collect``, ...); those whose names no stage takes are here too, imported on first use (PEP
562), so
that a command that needs only part of the library (``daydream sql``) does not pay for
importing the rest (the simulator's compiled core, the collector).

Every stage is a subpackage of this one name (``daydream.ingest``, ``daydream.graphstore``,
``daydream.transforms``, ``daydream.simulate``, ``daydream.collect``, and ``daydream.base``
below them all). Installed, they sit in this package's folder; in a source checkout the
repository keeps them as top-level folders beside this one (pyproject.toml maps them), and the
checkout's root is searched for them too, so a checkout runs the same with or without an
install (the collector's start-up hook in a job's other interpreter, for one).
"""

import os as _os

_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_ROOT, "pyproject.toml")) \
        and _os.path.isfile(_os.path.join(_ROOT, "base", "__init__.py")):
    __path__.append(_ROOT)  # noqa: F821 - a package's own __path__

# ``daydream.ingest`` and ``daydream.collect`` are the stages of those names, so the API's
# functions of the same names are ``daydream.api.ingest`` and ``daydream.api.collect`` (a
# package attribute cannot be both: importing the stage sets it to the stage)
__all__ = ["DaydreamError", "collect_steps", "info", "predict", "sql"]


def __getattr__(name: str):
    if name in __all__:
        from daydream import api
        return getattr(api, name)
    raise AttributeError(f"module 'daydream' has no attribute {name!r}")
