"""Compile and cache every numba kernel once, at install time (`make` runs this), and the
project's modules to bytecode; with ``--ahead-of-time``, compile the kernels of
KERNEL_MODULES ahead of time instead (daydream.base.compiled; `make` runs that too).

numba compiles on first use and caches the machine code beside the sources; doing it here
means the first `daydream` command after installation is as fast as the next ones. The
bytecode likewise: pip writes it for every package it installs, but not for an editable
install's sources, and a machine with PYTHONDONTWRITEBYTECODE set never writes it, so every
command compiled the modules it imports again (all of them: 0.19 s of CPU here, much of it
on the path of a `daydream ingest`, before and beside the scan).
"""

from __future__ import annotations

import compileall
import json
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the modules that declare compiled kernels (daydream.base.compiled): named here, above every
# stage, so that the loader below them names none
KERNEL_MODULES = ("daydream.ingest.kineto_scan", "daydream.ingest.nesting",
                  "daydream.graphstore.build", "daydream.graphstore.check",
                  "daydream.graphstore.load", "daydream.simulate._core",
                  "daydream.simulate._passes")


def packages() -> list[str]:
    """The folders of the project's packages in a checkout, as pyproject.toml maps them to
    setuptools (each compiled with its subfolders); none outside a checkout, where pip wrote
    the bytecode."""
    project = ROOT / "pyproject.toml"
    if not project.exists():
        return []
    with open(project, "rb") as f:
        mapped = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return sorted({d for d in mapped.values() if "/" not in d})


def compile_bytecode() -> bool:
    """Write the bytecode of the project's packages where it is missing or stale (what
    Python itself reads even where it may not write); True where every module compiled."""
    return all(compileall.compile_dir(ROOT / p, quiet=1) for p in packages())


def warm() -> float:
    t = time.perf_counter()
    compile_bytecode()
    from daydream.graphstore.build import build
    from daydream.graphstore.check import check_acyclic
    from daydream.ingest.kineto import read_kineto

    # two steps of the same work, so that a prediction's steady-state step (timed per
    # iteration) runs too
    ev = []
    for k, at in ((1, 0), (2, 30)):
        ev += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 1,
                "tid": 1, "ts": at, "dur": 25},
               {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": at + 1,
                "dur": 20},
               {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                "tid": 1, "ts": at + 2, "dur": 2,
                "args": {"correlation": k, "External id": k, "grid": [1, 1, 1],
                         "Input Dims": [[1]], "Collective name": "x"}},
               {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": at + 5,
                "dur": 1.5, "args": {"correlation": k, "stream": 7, "device": 0}},
               {"ph": "s", "cat": "ac2g", "id": k, "pid": 1, "tid": 1, "ts": at + 2,
                "name": "\\u00e9"},
               {"ph": "f", "cat": "ac2g", "id": k, "pid": 0, "tid": 7, "ts": at + 5,
                "bp": "e"}]
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "warm.json"
        f.write_text(json.dumps({"traceEvents": ev}))
        conv = read_kineto(f)
        g = build(conv.tables)
        check_acyclic(g.n_tasks, g.src, g.dst, g.anchor, g.name, g.start_ns, g.obs_dur_ns)
        # the whole path of a command: ingest, labels, the graph's DuckDB tables, replay and
        # its reports (each stage compiles kernels of its own)
        from daydream import api
        api.predict(str(f), Path(d) / "store")
    try:
        from daydream.simulate.warmup import warm as warm_sim
        warm_sim()
    except ImportError:
        pass
    return time.perf_counter() - t


if __name__ == "__main__":
    import sys
    if sys.argv[1:] == ["--ahead-of-time"]:
        from daydream.base import compiled
        sys.exit(compiled.main(KERNEL_MODULES))
    print(f"daydream: compiled kernels ready ({warm():.1f} s)")
