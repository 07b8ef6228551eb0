"""Collecting a trace from inside a training job.

    from daydream.collect import collect

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
buffers; ``daydream ingest`` reads it (format: ``ingest.cupti_format``). What reaches it, and when:

* the device and context records, whatever the warm-up: their kinds are on from ``start()``
  (CUPTI writes them when CUDA initializes), and when CUDA was initialized before, the
  runtime's device properties go in the header;
* nothing until the first collected iteration ends or the first GPU record arrives: a process
  that never gets there (a helper, a launcher, a job shorter than its warm-up) leaves no file;
* every ``flush_period_s`` a default flush (buffers whose records are all complete), and the
  markers of each iteration when it ends: a process killed outright (SIGKILL) keeps those;
* at stop (the last iteration, exit, or SIGTERM) the device is synchronized, then flushed with
  force, so the last iteration's GPU records are complete; on SIGTERM the process then goes on
  to the fate the job gave SIGTERM (its handler, or death by the signal).
"""

from __future__ import annotations

import atexit
import datetime as dt
import importlib.metadata
import os
import signal
import socket
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

from daydream.base.errors import DaydreamError
from daydream.collect.markers import ANNOTATION, Markers
from daydream.collect.recorder import Recorder
from daydream.collect.writer import RawWriter
from daydream.ingest import cupti_format as fmt

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


def _torch_cuda() -> str | None:
    """The CUDA version torch was built for, when the job has imported torch (never imported
    here: start-up must stay cheap)."""
    torch = sys.modules.get("torch")
    version = getattr(torch, "version", None)
    return getattr(version, "cuda", None)


def _call(backend, name: str):
    fn = getattr(backend, name, None)
    try:
        return fn() if fn is not None else None
    except Exception:  # noqa: BLE001 - optional facts
        return None


class Collection:
    """One process's collection: CUPTI records, layer markers and iteration boundaries, into one
    raw record file. Use through ``collect(...)``."""

    def __init__(self, out_dir: str | Path, *, iterations: int | None = None, warmup: int = 0,
                 model=None, optimizer=None, auto_step: bool = True, backward: bool = True,
                 hooks: bool = True, root_name: str = "model", prefix: str | None = None,
                 codec: int = fmt.ZLIB, backend: Callable | None = None,
                 flush_period_s: float | None = 1.0):
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
        self.flush_period_s = flush_period_s
        self.stopped_by: str | None = None
        self._step_marker = 0
        self._lock = threading.RLock()
        self._flusher: threading.Thread | None = None
        self._flush_stop = threading.Event()
        self._prev_sigterm = None

    # ---- life cycle --------------------------------------------------------------------------

    def start(self) -> Collection:
        if self.started:
            return self
        from daydream.collect import cupti_backend
        header = {
            "pid": os.getpid(), "hostname": socket.gethostname(), "argv": list(sys.argv),
            "started_at": dt.datetime.now(dt.UTC).isoformat(),
            "external_correlation_kind": cupti_backend.EXTERNAL_KIND,
            "rank": _env_int("RANK"), "world_size": _env_int("WORLD_SIZE"),
            "local_rank": _env_int("LOCAL_RANK"),
            "cupti_python": _version("cupti-python"), "torch": _version("torch"),
            "torch_cuda": _torch_cuda(), "warmup": self.warmup, "iterations": self.iterations,
        }
        writer = RawWriter(self.path, header, codec=self.codec, hold=True)
        self.recorder = Recorder(writer)
        self.recorder.on_gpu_records = self._release
        backend = self.backend = (self.make_backend or cupti_backend.CuptiBackend)(self.recorder)
        backend.check()  # the clear error without a GPU, before the job runs on
        writer.header["clock"] = backend.clock_name
        writer.header["libcupti"] = getattr(backend, "library", None)
        self.markers = Markers(self.recorder.names, clock=backend.timestamp, push=backend.push,
                               pop=backend.pop)
        self.markers.enabled = False
        try:
            backend.open()  # device and context records: CUDA may initialize in the warm-up
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
        self._install_sigterm()
        me = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (c := me()) is not None and c._forked())
        return self

    def _install_sigterm(self) -> None:
        """Stop (synchronize, flush, close) on SIGTERM, then do what the job would have done.
        Only from the main thread (Python's rule), and not where the job ignores SIGTERM."""
        if threading.current_thread() is not threading.main_thread():
            return
        prev = signal.getsignal(signal.SIGTERM)
        if prev is signal.SIG_IGN or prev is None:  # ignored, or a handler not set from Python
            return
        self._prev_sigterm = prev
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _restore_sigterm(self) -> None:
        if self._prev_sigterm is None or \
                threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._prev_sigterm)
        self._prev_sigterm = None

    def _on_sigterm(self, signum, frame) -> None:
        prev = self._prev_sigterm
        self.stopped_by = "SIGTERM"
        try:
            self.stop()
        except Exception as e:  # noqa: BLE001 - the job's own fate comes first
            print(f"daydream collect: error: {e}", file=sys.stderr)
        self._restore_sigterm()
        if callable(prev):
            prev(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)  # ends the process by SIGTERM, as without collection
        os._exit(128 + signum)

    def _release(self) -> None:
        """Let the file be written (held until then so that a process that never collects
        leaves none); called on the first GPU record or the first collected iteration."""
        self.recorder.writer.release()

    def _forked(self) -> None:
        """In a forked child (a data-loader worker): collect nothing, touch no CUPTI state."""
        self.stopped = True
        self.collecting = False
        if self.markers is not None:
            self.markers.enabled = False
        if self.hooks is not None:
            self.hooks.inert = True
        atexit.unregister(self.stop)
        self._flusher = None

    def _attach_hooks(self) -> None:
        try:
            from daydream.collect.hooks import LayerHooks
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
        devices = _call(self.backend, "device_properties")
        if devices and not self.recorder.writer.exists:
            # CUDA initialized before the device kinds were on: CUPTI will not describe the GPUs
            self.recorder.writer.header.setdefault("devices", devices)
        self.backend.start()
        self.collecting = True
        self.markers.enabled = True
        self._step_marker = self.markers.begin(f"ProfilerStep#{self.steps}", kind=ANNOTATION)
        if self.flush_period_s:
            self._flush_stop.clear()
            self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                             name="daydream-collect-flush")
            self._flusher.start()

    def _flush_loop(self) -> None:
        """A default flush each period: CUPTI hands back buffers whose records are all complete,
        full or not (its own delivery waits for full ones), so a kill loses about a period."""
        while not self._flush_stop.wait(self.flush_period_s):
            try:
                self.backend.flush(forced=False)
            except Exception as e:  # noqa: BLE001 - counted in the file, the job goes on
                self.recorder.error(e)

    def _stop_flusher(self) -> None:
        self._flush_stop.set()
        t, self._flusher = self._flusher, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10)

    def step(self) -> None:
        """End the current iteration (and start collecting or stop, as the counts say)."""
        with self._lock:
            if not self.started or self.stopped:
                return
            self.steps += 1
            if self.collecting:
                self.markers.end(self._step_marker)
                self.collected += 1
                if self.collected == 1:
                    self._release()
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
        """Stop collecting: synchronize the device, deliver CUPTI's last records, close the
        file; returns its path (None when the process left no file). Idempotent; also runs at
        exit and on SIGTERM."""
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
                    self._stop_flusher()
                    meta = {"iterations_collected": self.collected,
                            "markers_unclosed": unclosed,
                            "markers_out_of_order": self.markers.out_of_order}
                    try:  # the last iteration's kernels are still queued: wait for them
                        self.backend.synchronize()
                    except Exception as e:  # noqa: BLE001 - a sticky CUDA error; flush anyway
                        meta["synchronize_failed"] = f"{type(e).__name__}: {e}"
                    self.backend.stop()
                    self._drain()
                    if self.stopped_by:
                        meta["stopped_by"] = self.stopped_by
                    if self.hooks is not None:
                        meta.update(hook_errors=self.hooks.errors,
                                    hook_first_error=self.hooks.first_error,
                                    backward_walk_limit_hit=self.hooks.walk_limit_hit)
                    self.recorder.meta(meta)
                else:
                    self.backend.stop()  # the early kinds
            finally:
                self.collecting = False
                self._stop_flusher()
                self._restore_sigterm()
                if self.hooks is not None:
                    self.hooks.detach()
                keep = self.collected > 0 or self.recorder.gpu_records > 0
                self.recorder.close({"iterations_collected": self.collected}, keep=keep)
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
            prefix: str | None = None, backend: Callable | None = None,
            flush_period_s: float | None = 1.0) -> Collection:
    """A collection to use as a context manager (``with collect(...) as c``); see the module
    doc. Raises ``DaydreamError`` on a machine without an NVIDIA GPU and CUPTI."""
    return Collection(out_dir, iterations=iterations, warmup=warmup, model=model,
                      optimizer=optimizer, auto_step=auto_step, backward=backward, hooks=hooks,
                      root_name=root_name, prefix=prefix, backend=backend,
                      flush_period_s=flush_period_s)


def collect_steps(step_fn: Callable[[], object], out_dir: str | Path = "daydream-traces",
                  iterations: int = 5, *, warmup: int = 1, **kwargs) -> Path | None:
    """Run ``step_fn`` (one training iteration) ``warmup + iterations`` times, collecting the
    last ``iterations``; returns the raw record file."""
    with collect(out_dir, iterations, warmup=warmup, auto_step=False, **kwargs) as c:
        for _ in range(warmup + iterations):
            step_fn()
            c.step()
    return c.stop()
