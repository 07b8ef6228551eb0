"""Collecting a trace from inside a training job.

    from collect import collect          # daydream.collect once the public API re-exports it

    with collect("traces", iterations=5, warmup=2):
        for batch in loader:
            train_step(batch)            # each optimizer.step() ends an iteration

    with collect("traces", model=model, optimizer=opt, auto_step=False) as c:
        for batch in loader:
            train_step(batch)
            c.step()                     # explicit iteration boundaries

    collect_steps(train_step, "traces", iterations=5, warmup=2)   # a callable, run 7 times

An iteration ends at ``step()``: called by hand, or (``auto_step``) after each step of the first
optimizer seen. The first ``warmup`` iterations run uncollected (cuDNN autotuning, allocator
growth); the next ``iterations`` are collected (``None``: until the block ends), each inside a
``ProfilerStep#<n>`` annotation, as PyTorch's profiler writes them; then collection stops and
the job goes on. Layer markers come from ``collect.hooks``: every module of ``model`` (or of the
process, when no model is given) and the optimizer's steps.

One raw record file per process, ``<out_dir>/<prefix>.cupti``, written as CUPTI delivers
buffers; ``daydream ingest`` reads it (format: ``ingest.cupti_raw``).
"""

from __future__ import annotations

import atexit
import datetime as dt
import importlib.metadata
import os
import socket
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

from collect.markers import ANNOTATION, Markers
from collect.recorder import Recorder
from collect.writer import RawWriter
from ingest import cupti_raw as fmt
from ingest.errors import DaydreamError

SUFFIX = ".cupti"


def default_prefix() -> str:
    """File name of this process's trace: rank (when torchrun says), host and pid."""
    host = socket.gethostname().split(".")[0] or "host"
    rank = os.environ.get("RANK")
    base = f"{host}-{os.getpid()}"
    return f"rank{rank}-{base}" if rank and rank.isdigit() else base


def _env_int(name: str) -> int | None:
    v = os.environ.get(name, "")
    return int(v) if v.isdigit() else None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


class Collection:
    """One process's collection: CUPTI records, layer markers and iteration boundaries, into one
    raw record file. Use through ``collect(...)``."""

    def __init__(self, out_dir: str | Path, *, iterations: int | None = None, warmup: int = 0,
                 model=None, optimizer=None, auto_step: bool = True, backward: bool = True,
                 hooks: bool = True, root_name: str = "model", prefix: str | None = None,
                 codec: int = fmt.ZLIB, backend: Callable | None = None):
        if iterations is not None and iterations < 1:
            raise DaydreamError(f"iterations must be at least 1, got {iterations}")
        if warmup < 0:
            raise DaydreamError(f"warmup must be 0 or more, got {warmup}")
        self.path = Path(out_dir) / f"{prefix or default_prefix()}{SUFFIX}"
        self.iterations = iterations
        self.warmup = warmup
        self.model = model
        self.optimizer = optimizer
        self.auto_step = auto_step
        self.backward = backward
        self.use_hooks = hooks
        self.root_name = root_name
        self.codec = codec
        self.make_backend = backend
        self.backend = None
        self.recorder: Recorder | None = None
        self.markers: Markers | None = None
        self.hooks = None
        self.steps = 0            # iterations completed since start()
        self.collected = 0        # of which collected
        self.collecting = False
        self.started = False
        self.stopped = False
        self._step_marker = 0
        self._lock = threading.RLock()

    # ---- life cycle --------------------------------------------------------------------------

    def start(self) -> Collection:
        if self.started:
            return self
        from collect import cupti_backend
        header = {
            "pid": os.getpid(), "hostname": socket.gethostname(), "argv": list(sys.argv),
            "started_at": dt.datetime.now(dt.UTC).isoformat(),
            "external_correlation_kind": cupti_backend.EXTERNAL_KIND,
            "rank": _env_int("RANK"), "world_size": _env_int("WORLD_SIZE"),
            "local_rank": _env_int("LOCAL_RANK"),
            "cupti_python": _version("cupti-python"), "libcupti": _version("nvidia-cuda-cupti"),
            "torch": _version("torch"), "warmup": self.warmup, "iterations": self.iterations,
        }
        writer = RawWriter(self.path, header, codec=self.codec)
        self.recorder = Recorder(writer)
        backend = self.backend = (self.make_backend or cupti_backend.CuptiBackend)(self.recorder)
        backend.check()  # the clear error without a GPU, before the job runs on
        writer.header["clock"] = backend.clock_name
        self.markers = Markers(self.recorder.names, clock=backend.timestamp, push=backend.push,
                               pop=backend.pop)
        self.markers.enabled = False
        try:
            if self.use_hooks:
                self._attach_hooks()
            if self.warmup == 0:
                self._begin_collecting()
        except BaseException:
            if self.hooks is not None:
                self.hooks.detach()
            raise
        self.started = True
        atexit.register(self.stop)
        me = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (c := me()) is not None and c._forked())
        return self

    def _forked(self) -> None:
        """In a forked child (a data-loader worker): collect nothing, touch no CUPTI state."""
        self.stopped = True
        self.collecting = False
        if self.markers is not None:
            self.markers.enabled = False
        if self.hooks is not None:
            self.hooks.inert = True
        atexit.unregister(self.stop)

    def _attach_hooks(self) -> None:
        try:
            from collect.hooks import LayerHooks
        except ImportError:  # no torch: CUDA records only
            return
        self.hooks = LayerHooks(self.markers, root_name=self.root_name, backward=self.backward,
                                on_step=self.step if self.auto_step else None)
        if self.model is not None:
            self.hooks.attach_model(self.model)
        else:
            self.hooks.attach_global()
        if self.optimizer is not None:
            self.hooks.attach_optimizer(self.optimizer)
        else:
            self.hooks.attach_optimizers_global()

    def _begin_collecting(self) -> None:
        self.backend.start()
        self.collecting = True
        self.markers.enabled = True
        self._step_marker = self.markers.begin(f"ProfilerStep#{self.steps}", kind=ANNOTATION)

    def step(self) -> None:
        """End the current iteration (and start collecting or stop, as the counts say)."""
        with self._lock:
            if not self.started or self.stopped:
                return
            self.steps += 1
            if self.collecting:
                self.markers.end(self._step_marker)
                self.collected += 1
                self._drain()
                if self.iterations is not None and self.collected >= self.iterations:
                    self.stop()
                    return
                self._step_marker = self.markers.begin(f"ProfilerStep#{self.steps}",
                                                       kind=ANNOTATION)
            elif self.steps >= self.warmup:
                try:
                    self._begin_collecting()
                except DaydreamError as e:  # inside the job's optimizer step: say it, go on
                    print(f"daydream collect: error: {e}", file=sys.stderr)
                    self.stop()

    def _drain(self) -> None:
        self.recorder.add_markers(self.markers.drain())
        if self.hooks is not None:
            layers = self.hooks.take_new_layers()
            if layers:
                self.recorder.meta({"layers": layers})

    def stop(self) -> Path | None:
        """Stop collecting, deliver CUPTI's last records and close the file; returns its path
        (None when the process produced no record). Idempotent; also runs at exit."""
        with self._lock:
            if not self.started or self.stopped:
                return self.path if self.stopped and self.recorder.writer.exists else None
            self.stopped = True
            atexit.unregister(self.stop)
            try:
                if self.collecting:
                    self.markers.end(self._step_marker)
                    unclosed = self.markers.close_all()
                    self.markers.enabled = False
                    self.backend.stop()
                    self._drain()
                    meta = {"iterations_collected": self.collected,
                            "markers_unclosed": unclosed,
                            "markers_out_of_order": self.markers.out_of_order}
                    if self.hooks is not None:
                        meta.update(hook_errors=self.hooks.errors,
                                    hook_first_error=self.hooks.first_error,
                                    backward_walk_limit_hit=self.hooks.walk_limit_hit)
                    self.recorder.meta(meta)
            finally:
                self.collecting = False
                if self.hooks is not None:
                    self.hooks.detach()
                self.recorder.close({"iterations_collected": self.collected})
            return self.path if self.recorder.writer.exists else None

    def __enter__(self) -> Collection:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self.hooks is not None:
            self.hooks.detach()  # now outside any hook: the handles can go


def collect(out_dir: str | Path = "daydream-traces", iterations: int | None = None, *,
            warmup: int = 0, model=None, optimizer=None, auto_step: bool = True,
            backward: bool = True, hooks: bool = True, root_name: str = "model",
            prefix: str | None = None, backend: Callable | None = None) -> Collection:
    """A collection to use as a context manager (``with collect(...) as c``); see the module
    doc. Raises ``DaydreamError`` on a machine without an NVIDIA GPU and CUPTI."""
    return Collection(out_dir, iterations=iterations, warmup=warmup, model=model,
                      optimizer=optimizer, auto_step=auto_step, backward=backward, hooks=hooks,
                      root_name=root_name, prefix=prefix, backend=backend)


def collect_steps(step_fn: Callable[[], object], out_dir: str | Path = "daydream-traces",
                  iterations: int = 5, *, warmup: int = 1, **kwargs) -> Path | None:
    """Run ``step_fn`` (one training iteration) ``warmup + iterations`` times, collecting the
    last ``iterations``; returns the raw record file."""
    with collect(out_dir, iterations, warmup=warmup, auto_step=False, **kwargs) as c:
        for _ in range(warmup + iterations):
            step_fn()
            c.step()
    return c.stop()
