"""Starts collection in every Python process of a job run by ``daydream collect -- <command>``.

``daydream collect`` puts this folder first on PYTHONPATH and its options in DAYDREAM_COLLECT
(JSON); Python imports ``sitecustomize`` at start-up, before the job's own code. In order:

1. any sitecustomize this one shadows runs first (an environment's own set-up: paths, variables
   the job relies on), with its errors reported as Python reports them and collection going on;
2. Daydream's package root is appended to ``sys.path`` when it is not there already (a source
   checkout): appended, so that it never shadows the standard library or the job's packages;
3. what kind of process this is, from its command line:
   * helpers are left alone: the torchrun launcher, multiprocessing's resource tracker and
     forkserver, torch.compile's compile and autotune workers;
   * a multiprocessing spawn child (``... --multiprocessing-fork``) is a data-loader worker or
     a trainer started by ``torch.multiprocessing.spawn`` alike, so the decision waits until
     the child knows its target: collection starts just before the target runs, unless the
     target is a helper's (a data-loader worker loop, a pool or executor worker, torch.compile's);
     the forkserver gets the same deferred start for the children it forks;
   * any other process is collected from here on.
"""

import os
import sys

# Targets of multiprocessing children that are helpers, by the module that defines them.
HELPER_MODULES = ("multiprocessing", "concurrent.futures", "torch.utils.data", "torch._inductor")


def _args() -> list:
    return list(getattr(sys, "orig_argv", None) or sys.argv)


def _inductor_helper(args: list) -> bool:
    """torch.compile's workers: scripts of torch/_inductor run by path, or -m torch._inductor."""
    marker = os.sep + os.path.join("torch", "_inductor") + os.sep
    for i, a in enumerate(args[1:], 1):
        if marker in a or (args[i - 1] == "-m" and a.startswith("torch._inductor")):
            return True
    return False


def _helper_process():
    """True for a helper, False for a process to collect, None for a multiprocessing child whose
    target decides (see the module doc)."""
    args = _args()
    argv = " ".join(args)
    if any(os.path.basename(a) == "torchrun" for a in args[:2]) \
            or "torch.distributed.run" in argv or "torch.distributed.launch" in argv:
        return True
    if "multiprocessing.resource_tracker" in argv or "multiprocessing.forkserver" in argv:
        return True
    if _inductor_helper(args):
        return True
    if "--multiprocessing-fork" in args or ("multiprocessing.spawn" in argv
                                            and "spawn_main" in argv):
        return None
    return False


def _helper_target(target) -> bool:
    module = getattr(target, "__module__", None) or ""
    return any(module == m or module.startswith(m + ".") for m in HELPER_MODULES)


def _start(options: str):
    try:
        from daydream.collect.cli import start_from_env
        return start_from_env(options)
    except Exception as e:  # the job runs on, uncollected, and says why
        print(f"daydream collect: error: {e}; process {os.getpid()} runs without collection",
              file=sys.stderr)
        return None


def _defer(options: str) -> None:
    """Start collection in a multiprocessing child right before its target runs, unless the
    target is a helper's; stop it when the target returns (fork-started children leave through
    os._exit, past atexit)."""
    from multiprocessing import process

    original = process.BaseProcess._bootstrap

    def _bootstrap(self, *args, **kwargs):
        target = getattr(self, "_target", None) or type(self).run
        c = None if _helper_target(target) else _start(options)
        try:
            return original(self, *args, **kwargs)
        finally:
            if c is not None:
                c.stop()

    process.BaseProcess._bootstrap = _bootstrap


def _chain() -> None:
    """Run the sitecustomize this one shadows, if any, as site.py would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    mine = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        import importlib
        try:
            importlib.import_module("sitecustomize")
        except ImportError as e:
            if e.name != "sitecustomize":
                _report(e)
        except Exception as e:  # noqa: BLE001 - site.py's own behaviour: say it, go on
            _report(e)
    finally:
        sys.path[:] = saved
        if mine is not None:
            sys.modules["sitecustomize"] = mine


def _report(e: BaseException) -> None:
    sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                     f"{type(e).__name__}: {e}\n")


def _main() -> None:
    _chain()
    options = os.environ.get("DAYDREAM_COLLECT")
    if not options:
        return
    try:
        import json
        root = json.loads(options).get("root")
    except ValueError:
        root = None
    if root and root not in sys.path:
        sys.path.append(root)
    kind = _helper_process()
    if kind is None or "multiprocessing.forkserver" in " ".join(_args()):
        _defer(options)
    elif kind is False:
        _start(options)


if __name__ == "sitecustomize":  # imported by site.py (tests load this file by another name)
    _main()
