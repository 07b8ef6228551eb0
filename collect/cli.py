"""``daydream collect [--out DIR] [--iterations N] [--warmup W] -- <command>``.

The command runs unmodified, as a child process, with two things in its environment:

* ``PYTHONPATH`` starts with ``collect/_site`` (whose ``sitecustomize.py`` Python runs at
  start-up in every process of the job, torchrun's and torch.multiprocessing.spawn's workers
  included), followed by the job's own PYTHONPATH, and nothing else: the folder holding
  the ``daydream`` package (site-packages, for an installed Daydream) would put every package of
  that environment ahead of the job's standard library;
* ``DAYDREAM_COLLECT`` holds the options as JSON, with ``root``, that folder, which the
  sitecustomize appends to ``sys.path`` when it is not there (a source checkout).

Each Python process of the job that is not a helper then starts a ``Collection`` with global
module and optimizer hooks (every optimizer step ends an iteration) and writes
``DIR/<rank>-<host>-<pid>.cupti``; collection stops after ``warmup + iterations`` steps, at
SIGTERM, or at exit. The job must run in an environment where Daydream and cupti-python are
installed (its own interpreter imports them). NVTX ranges are captured too:
``NVTX_INJECTION64_PATH`` is set to libcupti unless already set.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from daydream.base.errors import DaydreamError
from daydream.collect.api import SUFFIX, Collection

ENV = "DAYDREAM_COLLECT"
SITE_DIR = Path(__file__).resolve().parent / "_site"
# the folder that holds the ``daydream`` package: site-packages where it is installed, the
# repository in a source checkout (whose daydream package finds the stages beside it)
PACKAGE_ROOT = Path(__file__).resolve().parents[1] if (
    Path(__file__).resolve().parents[1] / "daydream" / "__init__.py").exists() \
    else Path(__file__).resolve().parents[2]


@dataclass
class CollectResult:
    returncode: int
    files: list[Path] = field(default_factory=list)


def child_env(out: Path, iterations: int | None, warmup: int,
              base: dict[str, str] | None = None, backend: str | None = None) -> dict[str, str]:
    """The environment the job runs in (see the module doc)."""
    env = dict(os.environ if base is None else base)
    opts = {"out": str(out.resolve()), "iterations": iterations, "warmup": warmup,
            "root": str(PACKAGE_ROOT)}
    if backend:
        opts["backend"] = backend
    env[ENV] = json.dumps(opts)
    path = [str(SITE_DIR)]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path)
    if "NVTX_INJECTION64_PATH" not in env:
        from daydream.collect.cupti_backend import nvtx_injection_path
        lib = nvtx_injection_path()
        if lib:
            env["NVTX_INJECTION64_PATH"] = lib
    return env


def collect_command(args: list[str], out: Path | str = "daydream-traces",
                    iterations: int | None = None, warmup: int = 0, *, check: bool = True,
                    backend: str | None = None) -> CollectResult:
    """Run ``args`` (``["python", "train.py", ...]``) with collection; returns its exit code and
    the trace files it wrote. Raises ``DaydreamError`` before running anything when this
    machine cannot collect (``check``) or the arguments are wrong. ``backend``
    (``"module:Class"``) replaces CUPTI in the job's processes (tests)."""
    if not args:
        raise DaydreamError("nothing to run: give the job's command after --, e.g. "
                            "daydream collect -- python train.py")
    if iterations is not None and iterations < 1:
        raise DaydreamError(f"--iterations must be at least 1, got {iterations}")
    if warmup < 0:
        raise DaydreamError(f"--warmup must be 0 or more, got {warmup}")
    if check:
        from daydream.collect.cupti_backend import probe
        probe()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    before = {p: p.stat().st_mtime_ns for p in out.glob(f"*{SUFFIX}")}
    started = time.time_ns()
    try:
        proc = subprocess.run(args, env=child_env(out, iterations, warmup, backend=backend),
                              check=False)
    except FileNotFoundError:
        raise DaydreamError(f"no such command: {args[0]}") from None
    files = sorted(p for p in out.glob(f"*{SUFFIX}")
                   if p not in before or p.stat().st_mtime_ns > max(before[p], started))
    return CollectResult(proc.returncode, files)


def start_from_env(options: str) -> Collection:
    """Start this process's collection from DAYDREAM_COLLECT (called by sitecustomize)."""
    opts = json.loads(options)
    backend = None
    if opts.get("backend"):
        module, _, attr = opts["backend"].partition(":")
        backend = getattr(importlib.import_module(module), attr)
    c = Collection(opts["out"], iterations=opts.get("iterations"),
                   warmup=int(opts.get("warmup") or 0), backend=backend)
    return c.start()  # stops by itself after its iterations, or at exit
