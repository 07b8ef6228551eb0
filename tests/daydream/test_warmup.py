"""daydream.warmup.compile_bytecode: the project's bytecode written once, at install, so that no
command compiles its modules again (an editable install writes none, and a machine with
PYTHONDONTWRITEBYTECODE set never would)."""

import importlib.util
import os
from pathlib import Path

from daydream.warmup import ROOT, compile_bytecode, packages


def _sources() -> list[Path]:
    return [p for pkg in packages() for p in (ROOT / pkg).rglob("*.py")
            if "__pycache__" not in p.parts]


def test_every_module_of_every_stage_gets_fresh_bytecode():
    # the packages found are the project's stages, each with modules of its own
    assert {"ingest", "graphstore", "transforms", "simulate", "daydream"} <= set(packages())
    sources = _sources()
    assert len(sources) > 40
    missing = sources[0]
    cached = Path(importlib.util.cache_from_source(str(missing)))
    if cached.exists():
        cached.unlink()  # one module's bytecode missing: it must be written again
    assert compile_bytecode()
    for src in sources:
        pyc = Path(importlib.util.cache_from_source(str(src)))
        assert pyc.exists(), src
        assert os.path.getmtime(pyc) >= os.path.getmtime(src), src
