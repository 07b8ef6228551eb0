"""The only module that calls CUPTI (through cupti-python); imported when collection starts.

What it turns on (``KINDS``): concurrent kernels, runtime and driver calls, copies, sets,
synchronizations, external correlations (the layer markers), NVTX markers, devices and contexts.
Records are delivered to ``Recorder.handle_buffer`` from CUPTI's worker thread every
``flush_period_ms`` and whenever a buffer fills, so a crash loses at most about that much.
Thread ids are the OS's (``SYSTEM`` type, gettid), the same ids the markers use.

On a machine without an NVIDIA driver, ``start`` raises ``DaydreamError("daydream collect needs
an NVIDIA GPU with CUPTI: <reason>")``.
"""

from __future__ import annotations

import ctypes
import os

from ingest import cupti_raw as fmt
from ingest.errors import DaydreamError

NEEDS_GPU = "daydream collect needs an NVIDIA GPU with CUPTI"
KINDS = ("CONCURRENT_KERNEL", "RUNTIME", "DRIVER", "MEMCPY", "MEMSET", "SYNCHRONIZATION",
         "EXTERNAL_CORRELATION", "MARKER", "DEVICE", "CONTEXT")
# Kinds collection goes on without (noted in the file's metadata) when CUPTI refuses them.
OPTIONAL_KINDS = ("MARKER", "DEVICE", "CONTEXT")
EXTERNAL_KIND = fmt.EXTERNAL_KIND_CUSTOM2  # Kineto uses CUSTOM0/1 for its own ops


def unavailable(reason: str) -> DaydreamError:
    return DaydreamError(f"{NEEDS_GPU}: {reason}")


def load():
    """cupti-python's module, or the clear error."""
    try:
        from cupti import cupti
    except ImportError as e:
        raise unavailable(f"cupti-python is not installed ({e}); pip install "
                          "'daydream[collect]'") from None
    except OSError as e:  # a library it needs could not be loaded
        raise unavailable(str(e)) from None
    return cupti


def nvtx_injection_path() -> str | None:
    """libcupti's path, for NVTX_INJECTION64_PATH (NVTX ranges reach CUPTI only through it, and
    only if it is set before the process's first NVTX call)."""
    try:
        from cuda import pathfinder
        return pathfinder.load_nvidia_dynamic_lib("cupti").abs_path
    except Exception:  # noqa: BLE001 - NVTX ranges are optional
        return None


class CuptiBackend:
    clock_name = "cupti_timestamp_ns"

    def __init__(self, recorder, *, buffer_bytes: int = 8 << 20, flush_period_ms: int = 1000,
                 kinds: tuple[str, ...] = KINDS):
        self.recorder = recorder
        self.buffer_bytes = buffer_bytes
        self.flush_period_ms = flush_period_ms
        self.kinds = kinds
        self.cupti = None
        self.enabled: list = []
        self._dropped = ctypes.c_size_t(0)

    def check(self) -> None:
        """Load cupti-python and reach the driver (cheap), or raise the clear error."""
        cupti = self.cupti = load()
        try:
            cupti.get_timestamp()
        except Exception as e:  # NotSupportedError: "CUDA driver is not found (libcuda.so.1...)"
            raise unavailable(f"{type(e).__name__}: {e}") from None

    def start(self) -> None:
        if self.cupti is None:
            self.check()
        cupti = self.cupti
        if "NVTX_INJECTION64_PATH" not in os.environ:
            path = nvtx_injection_path()
            if path:
                os.environ["NVTX_INJECTION64_PATH"] = path
        self.recorder.api_name = self.api_name
        self.recorder.dropped = self.dropped
        try:
            cupti.activity_register_callbacks(self._requested, self.recorder.handle_buffer)
            cupti.set_thread_id_type(cupti.ActivityThreadIdType.SYSTEM)
            refused = {}
            for name in self.kinds:
                kind = cupti.ActivityKind[name]
                try:
                    cupti.activity_enable(kind)
                except Exception as e:
                    if name not in OPTIONAL_KINDS:
                        raise
                    refused[name] = f"{type(e).__name__}: {e}"
                    continue
                self.enabled.append(kind)
            self.recorder.meta_later({"activity_kinds": [k.name for k in self.enabled],
                                "activity_kinds_refused": refused})
            if self.flush_period_ms:
                cupti.activity_flush_period(self.flush_period_ms)
        except Exception as e:  # cuptiError, NotSupportedError (no driver), ...
            self._disable()
            raise unavailable(f"{type(e).__name__}: {e}") from None

    def _requested(self):
        return self.buffer_bytes, 0

    def api_name(self, domain: str, cbid: int) -> str | None:
        cupti = self.cupti
        dom = cupti.CallbackDomain.DRIVER_API if domain == "driver" else \
            cupti.CallbackDomain.RUNTIME_API
        try:
            return cupti.get_callback_name(dom, cbid)
        except Exception:  # noqa: BLE001 - the reader names it by its id instead
            return None

    def dropped(self) -> int:
        try:
            self.cupti.activity_get_num_dropped_records(0, 0, ctypes.addressof(self._dropped))
        except Exception:  # noqa: BLE001
            return 0
        return int(self._dropped.value)

    def timestamp(self) -> int:
        return int(self.cupti.get_timestamp())

    def push(self, marker_id: int) -> None:
        self.cupti.activity_push_external_correlation_id(EXTERNAL_KIND, marker_id)

    def pop(self) -> None:
        self.cupti.activity_pop_external_correlation_id(EXTERNAL_KIND)

    def flush(self) -> None:
        if self.cupti is not None:
            self.cupti.activity_flush_all(1)  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED

    def _disable(self) -> None:
        for kind in self.enabled:
            try:
                self.cupti.activity_disable(kind)
            except Exception:  # noqa: BLE001, S110
                pass
        self.enabled = []

    def stop(self) -> None:
        """Deliver what CUPTI holds, then stop collecting."""
        if self.cupti is None:
            return
        try:
            self.flush()
        finally:
            self._disable()


def probe() -> None:
    """Raise the clear error unless this machine can collect (used before launching a job)."""
    CuptiBackend(None).check()
