"""Starts collection in every Python process of a job run by ``daydream collect -- <command>``.

``daydream collect`` puts this folder first on PYTHONPATH and its options in DAYDREAM_COLLECT
(JSON); Python imports ``sitecustomize`` at start-up, before the job's own code. Processes that
are only helpers (multiprocessing spawn/forkserver children such as data-loader workers, and the
torchrun launcher) are left alone. Any sitecustomize that this one shadows is run afterwards.
"""

import os
import sys


def _helper_process() -> bool:
    args = list(getattr(sys, "orig_argv", None) or sys.argv)
    argv = " ".join(args)
    launcher = any(os.path.basename(a) == "torchrun" for a in args[:2]) \
        or "torch.distributed.run" in argv or "torch.distributed.launch" in argv
    mp_child = "--multiprocessing-fork" in argv or (
        "multiprocessing" in argv and ("spawn_main" in argv or "forkserver" in argv))
    return launcher or mp_child


def _start() -> None:
    options = os.environ.get("DAYDREAM_COLLECT")
    if not options or _helper_process():
        return
    try:
        from collect.cli import start_from_env
        start_from_env(options)
    except Exception as e:  # the job runs on, uncollected, and says why
        print(f"daydream collect: error: {e}; process {os.getpid()} runs without collection",
              file=sys.stderr)


def _chain() -> None:
    """Run the sitecustomize this one shadows, if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    mine = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        import importlib
        try:
            importlib.import_module("sitecustomize")
        except ImportError:
            pass
    finally:
        sys.path[:] = saved
        if mine is not None:
            sys.modules["sitecustomize"] = mine


_start()
_chain()
