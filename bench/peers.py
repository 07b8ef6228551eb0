"""Peer tools for the side-by-side benchmarks, driven from the project's own .venv.

Holistic Trace Analysis (HTA) lives in its own virtual environment, ``<repo>/.venv-hta``
(created by ``bench/hta_env.sh``, which ``make bench`` runs), because it pins pandas<3 and
its own numpy. Every measurement runs ``.venv-hta/bin/python bench/hta_worker.py ...`` in a
fresh subprocess, so no import cache, page cache of Python objects, or allocator state
carries over between repeats, and nothing of HTA is imported into the caller.

    from bench import peers            # or: import peers, with bench/ on sys.path
    if peers.hta_available():
        peers.hta_parse("trace.json.gz")                  # best of 3
        peers.hta_critical_path("trace.json.gz", rank=1, iteration=3)

Also a small CLI for ad-hoc runs:
    python bench/peers.py parse TRACE [REPEATS]
    python bench/peers.py critical_path TRACE RANK ITER [REPEATS]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HTA_VENV = ROOT / ".venv-hta"
HTA_PYTHON = HTA_VENV / "bin" / "python"
HTA_STAMP = HTA_VENV / ".hta-env-stamp"  # written by hta_env.sh only after a good install
HTA_WORKER = ROOT / "bench" / "hta_worker.py"

DEFAULT_TIMEOUT_S = 900.0


def hta_available() -> bool:
    """True when .venv-hta was fully created by bench/hta_env.sh."""
    return HTA_PYTHON.exists() and HTA_STAMP.exists() and HTA_WORKER.exists()


def _require_hta() -> None:
    if not hta_available():
        raise RuntimeError(
            f"HTA (Holistic Trace Analysis) environment not found at {HTA_VENV}: "
            "run `make bench` (it creates it via bench/hta_env.sh), "
            "or `bash bench/hta_env.sh` directly."
        )


def _run_worker(args: list[str], timeout: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    cmd = [str(HTA_PYTHON), str(HTA_WORKER), *args]
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"HTA worker timed out after {timeout:.0f}s: {' '.join(cmd)}") from exc
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.splitlines()[-20:])
        raise RuntimeError(f"HTA worker failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    return json.loads(lines[-1])


def _best_of(args: list[str], repeats: int, timeout: float) -> dict[str, Any]:
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    _require_hta()
    runs = [_run_worker(args, timeout) for _ in range(repeats)]
    best = dict(min(runs, key=lambda r: r["seconds"]))
    best["repeats"] = repeats
    best["all_seconds"] = [r["seconds"] for r in runs]
    best["all_cpu_seconds"] = [r.get("cpu_seconds") for r in runs]
    best["max_peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    return best


def hta_parse(
    trace_path: str | os.PathLike[str], repeats: int = 3, timeout: float = DEFAULT_TIMEOUT_S
) -> dict[str, Any]:
    """Best-of-``repeats`` wall time for HTA to load one trace, as TraceAnalysis does.

    Each repeat is a fresh ``.venv-hta`` subprocess. Returns the best run's JSON
    (``seconds``, ``parse_trace_file_seconds``, ``events``, ``rows``, ``peak_rss_mb``, ...)
    plus ``repeats``, ``all_seconds``, ``all_cpu_seconds`` and ``max_peak_rss_mb``.
    """
    return _best_of(["parse", str(Path(trace_path).resolve())], repeats, timeout)


def hta_critical_path(
    trace_path: str | os.PathLike[str],
    rank: int,
    iteration: int,
    repeats: int = 1,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """Wall time of HTA's critical path analysis for one iteration (ProfilerStep#iteration).

    ``trace_path`` is a trace file or a directory of rank traces. ``seconds`` times
    ``TraceAnalysis.critical_path_analysis`` alone; ``parse_seconds`` is the trace load
    that precedes it; ``nodes``/``edges`` describe HTA's CPGraph. Best of ``repeats``.
    """
    args = ["critical_path", str(Path(trace_path).resolve()), str(int(rank)), str(int(iteration))]
    return _best_of(args, repeats, timeout)


def _main(argv: list[str]) -> int:
    if len(argv) in (2, 3) and argv[0] == "parse":
        out = hta_parse(argv[1], repeats=int(argv[2]) if len(argv) == 3 else 3)
    elif len(argv) in (4, 5) and argv[0] == "critical_path":
        out = hta_critical_path(
            argv[1], int(argv[2]), int(argv[3]), repeats=int(argv[4]) if len(argv) == 5 else 1
        )
    else:
        print(
            "usage: peers.py parse TRACE [REPEATS]\n"
            "       peers.py critical_path TRACE RANK ITER [REPEATS]",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
