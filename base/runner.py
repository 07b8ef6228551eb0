"""Where batch work runs: inline, in a local process pool, or as Ray tasks.

Batch ingest and batch prediction hand a runner picklable top-level functions and their
arguments and take the results back in the order they finish. The three runners behave the
same to the caller, so the drivers (ingest.batch_ingest, daydream.fleet) have one code path and only
the driver process ever writes the store's DuckDB file.

- ``workers == 1``: inline, in the calling process (no pickling; what tests and one trace use);
- ``workers > 1``: a ``ProcessPoolExecutor`` on this machine;
- ``ray``: Ray tasks on a cluster (``auto``: the cluster named by ``RAY_ADDRESS`` or started
  with ``ray start`` here, else a local one; or an address such as ``ray://head:10001``).
  Files and the store must be at the same path on every node (a shared file system).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import (
    FIRST_COMPLETED,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    wait,
)
from typing import Any

from daydream.base.errors import DaydreamError


class Runner:
    """Submit ``fn(*args)``; iterate over ``(tag, result)`` as tasks finish."""

    workers = 1

    @property
    def in_flight(self) -> int:
        """How many tasks a caller keeps submitted before it collects finished ones: each
        worker busy with one and one queued behind it (memory stays bounded over thousands of
        tasks, and an interrupt loses little work)."""
        return 2 * self.workers

    def submit(self, tag: Any, fn: Callable, *args) -> None:
        raise NotImplementedError

    def next_inline(self) -> bool:
        """Whether the next ``submit`` runs in this process (its arguments are not sent
        anywhere: a caller need not pack them)."""
        return False

    def pending(self) -> int:
        raise NotImplementedError

    def next_done(self) -> Iterator[tuple[Any, Any]]:
        """Block until at least one task has finished; yield every finished one."""
        raise NotImplementedError

    def cancel(self) -> None:
        """Drop tasks not started yet (on an interrupt or a strict failure)."""

    def close(self) -> None:
        pass

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            self.cancel()
        self.close()


class InlineRunner(Runner):
    def __init__(self) -> None:
        self._done: list[tuple[Any, Any]] = []

    def submit(self, tag, fn, *args) -> None:
        self._done.append((tag, fn(*args)))

    def next_inline(self) -> bool:
        return True

    def pending(self) -> int:
        return len(self._done)

    def next_done(self):
        done, self._done = self._done, []
        yield from done


class PoolRunner(Runner):
    def __init__(self, workers: int) -> None:
        self.workers = workers
        # spawned, not forked: a forked child inherits the locks of the parent's thread pools
        # (polars', Arrow's) in whatever state they were and can hang on its first query
        # (tasks are submitted from the thread that made the runner, which spawns the workers
        # and outlives them: a Linux parent-death signal is bound to that thread)
        self._pool = ProcessPoolExecutor(max_workers=workers,
                                         mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_worker_start, initargs=(os.getpid(),))
        self._futs: dict[Future, Any] = {}

    def submit(self, tag, fn, *args) -> None:
        self._futs[self._pool.submit(fn, *args)] = tag

    def pending(self) -> int:
        return len(self._futs)

    def next_done(self):
        finished, _ = wait(self._futs, return_when=FIRST_COMPLETED)
        yield from self._collect(finished)

    def _collect(self, finished):
        """(tag, result) of each FINISHED future, taken out of the pending ones."""
        for f in finished:
            tag = self._futs.pop(f)
            try:
                yield tag, f.result()
            except Exception as e:  # a worker died (killed, out of memory): report, go on
                yield tag, _failed(e)

    def cancel(self) -> None:
        for f in self._futs:
            f.cancel()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class SharedRunner(PoolRunner):
    """``workers`` in all: this process and ``workers - 1`` spawned ones. A task goes to the
    pool while the pool has fewer than two queued per spawned process, else it runs here, at
    once.
    For a batch whose tasks are small beside a process's start (a fleet's predictions, ~10
    ms each, against ~0.3 s for a worker to import the pipeline, ~0.7 s where numba loads its
    kernels, not compiled ahead of time): the
    driver has that start behind it, so it predicts from its first task, while the spawned
    worker starts, and one start fewer is paid in all."""

    def __init__(self, workers: int, warm: Callable | None = None) -> None:
        super().__init__(workers - 1)
        self.workers = workers
        self._here: list[tuple[Any, Any]] = []
        if warm is not None:  # the workers start now, beside the driver's reading
            for _ in range(workers - 1):
                self._pool.submit(warm)

    @property
    def in_flight(self) -> int:
        """The pool's workers busy and queued as ``Runner.in_flight`` has them, and one task
        here: the caller collects after each task it ran here and refills the pool's queue
        before it runs dry. With two here per collection, a single worker's queue (two tasks
        of the same size) ran dry as often as not: it was idle 0.9 of 3.1 s predicting 100
        DLRM traces, 0.56 of 2.4 s ingesting 100 BERT-small ones."""
        return self._queue + 1

    @property
    def _queue(self) -> int:
        """The tasks the pool holds before the next runs here: two per spawned worker."""
        return 2 * (self.workers - 1)

    def next_inline(self) -> bool:
        return len(self._futs) >= self._queue

    def submit(self, tag, fn, *args) -> None:
        if self.next_inline():
            self._here.append((tag, fn(*args)))
        else:
            super().submit(tag, fn, *args)

    def pending(self) -> int:
        return len(self._futs) + len(self._here)

    def next_done(self):
        if not self._here:
            yield from super().next_done()
            return
        # what ran here first, then whatever the pool has finished already
        done, self._here = self._here, []
        yield from done
        yield from self._collect([f for f in self._futs if f.done()])


class RayRunner(Runner):
    def __init__(self, address: str) -> None:
        try:
            import ray
        except ImportError:
            raise DaydreamError("--ray needs Ray: pip install 'daydream[fleet]'") from None
        self._ray = ray
        if not ray.is_initialized():
            try:
                if address == "auto":
                    ray.init(log_to_driver=False)
                else:
                    ray.init(address=address, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise DaydreamError(f"cannot connect to the Ray cluster at {address}: "
                                    f"{str(e).strip().splitlines()[0]}") from None
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote: dict[Callable, Any] = {}
        self._refs: dict[Any, Any] = {}

    def submit(self, tag, fn, *args) -> None:
        r = self._remote.get(fn)
        if r is None:
            r = self._remote[fn] = self._ray.remote(num_cpus=1, max_retries=1)(fn)
        self._refs[r.remote(*args)] = tag

    def pending(self) -> int:
        return len(self._refs)

    def next_done(self):
        ready, rest = self._ray.wait(list(self._refs), num_returns=1)
        if rest:  # take whatever else has finished too, without waiting
            more, _ = self._ray.wait(rest, num_returns=len(rest), timeout=0)
            ready = [*ready, *more]
        for ref in ready:
            tag = self._refs.pop(ref)
            try:
                yield tag, self._ray.get(ref)
            except Exception as e:  # the task's worker died or the task raised
                yield tag, _failed(e)

    def cancel(self) -> None:
        for ref in self._refs:
            try:
                self._ray.cancel(ref)
            except Exception:  # already finished or gone: nothing to cancel
                pass
        self._refs.clear()


# How often a worker looks for its driver where the kernel cannot tell it (see exit_with_parent)
PARENT_POLL_S = 0.5
_PR_SET_PDEATHSIG = 1


def exit_with_parent(parent: int) -> None:
    """Make this worker process end when ``parent``, its driver, ends, however it ends (a
    SIGKILL or an out-of-memory kill run no cleanup, so the driver cannot stop its workers):
    on Linux the kernel sends it SIGKILL (prctl PR_SET_PDEATHSIG); everywhere, a daemon thread
    sees it adopted by another process (its parent id changed) within PARENT_POLL_S and exits.
    Without it a killed driver's workers and multiprocessing's resource tracker lived on.
    (Ray needs none of this: a raylet started by a driver dies with it, by Ray's own
    parent-death signal, and its workers with the raylet.)"""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL),
                                                    0, 0, 0)
        except (OSError, AttributeError):  # no prctl: the thread below still watches
            pass
    if os.getppid() != parent:  # the driver died before the signal was asked for
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _worker_start(parent: int) -> None:
    """What a local pool worker runs first: it ends with its driver (``exit_with_parent``),
    and when the pool lets it go, at once (``base.ending.end_without_teardown``, an exit
    handler of its own: it runs after the worker's last result is sent, and after
    multiprocessing's finalizers, which a spawned process runs before its exit handlers)."""
    exit_with_parent(parent)
    import atexit

    from daydream.base.ending import end_without_teardown
    atexit.register(end_without_teardown)


def _failed(e: BaseException) -> dict:
    """The result a task function gives for a failure (every task function returns a dict with
    ``ok`` and, when not ok, ``error``)."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return {"ok": False, "error": f"worker failed: {type(e).__name__}: {msg}"}


class Later:
    """A call made when its result is asked for: what ``later`` gives where no thread is
    worth it (errors then come in the order they did with no thread at all)."""

    def __init__(self, fn: Callable, args: tuple) -> None:
        self.fn, self.args = fn, args

    def result(self):
        return self.fn(*self.args)


def later(threaded: bool, fn: Callable, *args) -> Future | Later:
    """``fn(*args)`` started on a thread of its own where ``threaded``, else made when its
    result is asked for."""
    if not threaded:
        return Later(fn, args)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=fn.__name__.strip("_"))
    try:
        return pool.submit(fn, *args)
    finally:
        pool.shutdown(wait=False)


def preload(*targets: str) -> None:
    """A worker's first task: import each ``module:function`` of TARGETS and call the
    function (``module`` alone: imported). Named by strings, so that the process that starts
    the workers need not have imported what they will run (``started_early``)."""
    import importlib
    for t in targets:
        mod, _, fn = t.partition(":")
        m = importlib.import_module(mod)
        if fn:
            getattr(m, fn)()


def started_early(workers: int | None, ray: str | None, *warm: str) -> Runner | None:
    """A ``SharedRunner`` made before the caller imports its own work, its spawned workers
    running ``preload(*WARM)`` beside those imports (a worker's start, ~0.3 s of imports, ~0.7
    s with numba's kernel loads, then overlaps the driver's instead of following it); None
    where the work would run inline or on Ray. The caller hands it to the batch (which closes
    it) and closes it itself where the batch never starts."""
    n = _local_workers(workers, workers or os.cpu_count() or 1)  # the tasks are not known yet
    if ray or n == 1:
        return None
    import functools
    return SharedRunner(n, functools.partial(preload, *warm))


def make_runner(workers: int | None = None, ray: str | None = None, tasks: int = 2,
                isolate: bool = False, share: Callable | None = None) -> Runner:
    """A runner for ``tasks`` tasks: Ray when ``ray`` is given, else ``workers`` local processes
    (default: every core), inline when one would do unless ``isolate`` (work whose memory
    should go back to the system when it is done); with ``share``, this process is one of
    the ``workers`` (``SharedRunner``) and the others run ``share()`` first, at once (what
    loads a task's modules: picklable, top-level)."""
    if ray:
        return RayRunner(ray)
    n = _local_workers(workers, tasks)
    if n == 1 and not isolate:
        return InlineRunner()
    return SharedRunner(n, share) if share is not None and not isolate else PoolRunner(n)


def _local_workers(workers: int | None, tasks: int) -> int:
    return min(max(1, workers or os.cpu_count() or 1), max(1, tasks))
