"""The only module that calls CUPTI (through cupti-python); imported when collection starts.

What it turns on: ``EARLY_KINDS`` (devices, contexts) when the collection opens, before any
warm-up, because CUPTI writes those records when CUDA initializes and never later; ``KINDS``
(concurrent kernels, runtime and driver calls, copies, sets, synchronizations, external
correlations for the layer markers, NVTX markers) when collecting begins. Records reach
``Recorder.handle_buffer`` when CUPTI completes a buffer (CUPTI's worker thread) and at every
flush; ``collect.api`` runs a default flush each second (complete records only) and, at stop,
synchronizes the device (``synchronize``) before the forced flush: a forced flush hands back the
records of work still queued incomplete. Thread ids are the OS's (``SYSTEM`` type, gettid), the
same ids the markers use.

Which libcupti the bindings loaded is found from the process's memory map and checked against
cupti-python (``library_facts``, ``check_library``): cupti-python lays records out for the CUPTI
it was built for, and a second libcupti in the process (torch's) is a second CUPTI.

On a machine without an NVIDIA driver, ``check`` raises ``DaydreamError("daydream collect needs
an NVIDIA GPU with CUPTI: <reason>")``.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import re
import sys
from pathlib import Path

from daydream.base.errors import DaydreamError
from daydream.ingest import cupti_format as fmt

NEEDS_GPU = "daydream collect needs an NVIDIA GPU with CUPTI"
EARLY_KINDS = ("DEVICE", "CONTEXT")
KINDS = ("CONCURRENT_KERNEL", "RUNTIME", "DRIVER", "MEMCPY", "MEMSET", "SYNCHRONIZATION",
         "EXTERNAL_CORRELATION", "MARKER")
# Kinds collection goes on without (noted in the file's metadata) when CUPTI refuses them.
OPTIONAL_KINDS = ("MARKER", "DEVICE", "CONTEXT")
# Kinds whose records our own synchronize would add to the trace: off before it.
CALL_KINDS = ("RUNTIME", "DRIVER", "SYNCHRONIZATION", "MARKER")
EXTERNAL_KIND = fmt.EXTERNAL_KIND_CUSTOM2  # Kineto uses CUSTOM0/1 for its own ops
FLUSH_FORCED = 1  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
ANY_CUPTI_ENV = "DAYDREAM_COLLECT_ANY_CUPTI"
_LIB_RE = re.compile(r"(?:^|/)libcupti\.so(?:\.[0-9.]+)?$")


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


# ---- which libcupti ------------------------------------------------------------------------

def loaded_libcupti(maps: str | None = None) -> list[str]:
    """Distinct libcupti files mapped into this process, in map order (``maps``: the text of
    /proc/self/maps, read when not given)."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return []
    out: list[str] = []
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6:
            path = parts[5].strip()
            if _LIB_RE.search(path) and path not in out:
                out.append(path)
    return out


def _soname(path: str) -> str | None:
    """The library's ELF soname (``libcupti.so.13``), its file name when that says it."""
    name = os.path.basename(path)
    if re.fullmatch(r"libcupti\.so\.\d+", name):
        return name
    try:
        from elftools.elf.elffile import ELFFile  # cupti-python's own dependency
        with open(path, "rb") as f:
            dyn = ELFFile(f).get_section_by_name(".dynamic")
            for tag in dyn.iter_tags() if dyn is not None else ():
                if tag.entry.d_tag == "DT_SONAME":
                    return str(tag.soname)
    except Exception:  # noqa: BLE001 - the version then comes from cuptiGetVersion alone
        return None
    return None


CUPTI_WHEELS = ("nvidia-cuda-cupti", "nvidia-cuda-cupti-cu12", "nvidia-cuda-cupti-cu11")


def _package_of(path: str) -> str | None:
    """``nvidia-cuda-cupti 13.4.92``: the installed wheel that owns the file, if any (looked
    up by name: a scan of every distribution costs each process's start-up too much)."""
    real = os.path.realpath(path)
    for name in CUPTI_WHEELS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or ():
            if f.name.startswith("libcupti.so") and \
                    os.path.realpath(str(dist.locate_file(f))) == real:
                return f"{dist.metadata.get('Name') or name} {dist.version}"
    return None


def cupti_api_version(path: str) -> int | None:
    """cuptiGetVersion of the loaded library (xxyyzz from CUDA 13 on, 13.4 -> 1304zz; small
    numbers before); None where it fails (no driver)."""
    try:
        lib = ctypes.CDLL(path)  # already loaded: the same handle
        v = ctypes.c_uint32(0)
        if lib.cuptiGetVersion(ctypes.byref(v)) != 0:
            return None
        return int(v.value)
    except (OSError, AttributeError):
        return None


def _version_of(api: int | None) -> str | None:
    if api is None or api < 10000:
        return None  # before CUDA 13 the API version is a serial number (28 = 12.9 update 1)
    return f"{api // 10000}.{api // 100 % 100}"


def _bindings_version() -> str | None:
    try:
        return importlib.metadata.version("cupti-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def library_facts(*, maps: str | None = None, api_version: int | None = None,
                  bindings: str | None = None) -> dict:
    """What the collection runs on: libcupti's path (``paths`` when more than one), soname,
    CUDA major, API version, the wheel it came from, cupti-python's version. ``maps`` (tests)
    replaces the process's memory map, and then the files are not opened."""
    paths = loaded_libcupti(maps)
    path = paths[0] if paths else None
    real = maps is None and path is not None
    if api_version is None and real:
        api_version = cupti_api_version(path)
    soname = (_soname(path) if real else os.path.basename(path)) if path else None
    major = None
    if soname and re.fullmatch(r"libcupti\.so\.\d+", soname):
        major = int(soname.rsplit(".", 1)[1])
    elif api_version is not None and api_version >= 10000:
        major = api_version // 10000
    facts = {"path": path, "soname": soname, "major": major, "api_version": api_version,
             "version": _version_of(api_version),
             "package": _package_of(path) if real else None,
             "bindings": bindings if bindings is not None else _bindings_version()}
    if len(paths) > 1:
        facts["paths"] = paths
    return facts


def check_library(facts: dict, env: dict | None = None) -> None:
    """Raise the clear error when the loaded libcupti cannot serve cupti-python's records (set
    DAYDREAM_COLLECT_ANY_CUPTI=1 to collect anyway: the mismatch is then recorded)."""
    env = os.environ if env is None else env
    problem = None
    bindings = facts.get("bindings")
    want = tuple(int(x) for x in re.findall(r"\d+", bindings or "")[:2])
    if facts.get("paths"):
        problem = (f"two libcupti are loaded in this process ({', '.join(facts['paths'])}): "
                   "torch's and cupti-python's; install the cupti-python that matches torch's "
                   "CUDA build (docs/collect.md) so both use one")
    elif want and facts.get("major") is not None and facts["major"] != want[0]:
        problem = (f"libcupti {facts['major']} ({facts.get('path')}) cannot serve cupti-python "
                   f"{bindings}, built for CUPTI {want[0]}: with a CUDA {facts['major']} build "
                   f"of torch install cupti-python=={facts['major']}.* (docs/collect.md)")
    elif len(want) == 2 and facts.get("version"):
        have = tuple(int(x) for x in facts["version"].split("."))
        if have < want:
            problem = (f"libcupti {facts['version']} ({facts.get('path')}) is older than the "
                       f"CUPTI {want[0]}.{want[1]} cupti-python {bindings} lays its records out "
                       f"for; install cupti-python=={have[0]}.{have[1]}.* or a newer "
                       "nvidia-cuda-cupti (docs/collect.md)")
    if problem is None:
        return
    facts["mismatch"] = problem
    if env.get(ANY_CUPTI_ENV) != "1":
        raise unavailable(f"{problem}; set {ANY_CUPTI_ENV}=1 to collect anyway")


# ---- the backend ---------------------------------------------------------------------------

class CuptiBackend:
    clock_name = "cupti_timestamp_ns"

    def __init__(self, recorder, *, buffer_bytes: int = 8 << 20):
        self.recorder = recorder
        self.buffer_bytes = buffer_bytes
        self.cupti = None
        self.enabled: dict[str, object] = {}
        self.refused: dict[str, str] = {}
        self.library: dict | None = None
        self._registered = False
        self._dropped = ctypes.c_size_t(0)

    def check(self) -> None:
        """Load cupti-python, reach the driver (cheap) and check the libcupti it loaded, or
        raise the clear error."""
        cupti = self.cupti = load()
        try:
            cupti.get_timestamp()
        except Exception as e:  # NotSupportedError: "CUDA driver is not found (libcuda.so.1...)"
            raise unavailable(f"{type(e).__name__}: {e}") from None
        self.library = library_facts()
        check_library(self.library)

    def _enable(self, names: tuple[str, ...]) -> None:
        cupti = self.cupti
        for name in names:
            if name in self.enabled:
                continue
            kind = cupti.ActivityKind[name]
            try:
                cupti.activity_enable(kind)
            except Exception as e:
                if name not in OPTIONAL_KINDS:
                    raise
                self.refused[name] = f"{type(e).__name__}: {e}"
                continue
            self.enabled[name] = kind

    def open(self) -> None:
        """Register the buffer callbacks and turn on the kinds CUDA's initialization writes."""
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
            if not self._registered:
                cupti.activity_register_callbacks(self._requested, self.recorder.handle_buffer)
                cupti.set_thread_id_type(cupti.ActivityThreadIdType.SYSTEM)
                self._registered = True
            self._enable(EARLY_KINDS)
        except Exception as e:  # cuptiError, NotSupportedError (no driver), ...
            self._disable()
            raise unavailable(f"{type(e).__name__}: {e}") from None

    def start(self) -> None:
        if not self._registered:
            self.open()
        try:
            self._enable(KINDS)
        except Exception as e:
            self._disable()
            raise unavailable(f"{type(e).__name__}: {e}") from None
        self.recorder.meta_later({"activity_kinds": list(self.enabled),
                                  "activity_kinds_refused": self.refused})

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

    def device_properties(self) -> list[dict] | None:
        """Properties of the visible GPUs as Kineto's deviceProperties names them, from torch
        once it has initialized CUDA (None before: never initialize CUDA for the job)."""
        return torch_device_properties()

    def synchronize(self) -> None:
        """Wait for the GPU work queued so far, so that the next flush returns it complete. The
        calls this makes are not recorded (call kinds off first)."""
        self._disable(CALL_KINDS)
        synchronize_devices()

    def flush(self, forced: bool = True) -> None:
        """Deliver buffers: forced, all of them (records of unfinished work incomplete); else
        only those whose records are all complete (safe at any time, from any thread)."""
        if self.cupti is not None:
            self.cupti.activity_flush_all(FLUSH_FORCED if forced else 0)

    def _disable(self, names: tuple[str, ...] | None = None) -> None:
        for name in list(self.enabled) if names is None else names:
            kind = self.enabled.pop(name, None)
            if kind is None:
                continue
            try:
                self.cupti.activity_disable(kind)
            except Exception:  # noqa: BLE001, S110
                pass

    def stop(self) -> None:
        """Deliver what CUPTI holds (forced), then stop collecting."""
        if self.cupti is None:
            return
        try:
            self.flush(forced=True)
        finally:
            self._disable()


def torch_device_properties() -> list[dict] | None:
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        out = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            dev = {"id": i, "name": p.name, "totalGlobalMem": p.total_memory,
                   "computeMajor": p.major, "computeMinor": p.minor,
                   "numSms": p.multi_processor_count,
                   "maxThreadsPerMultiprocessor": p.max_threads_per_multi_processor,
                   "warpSize": p.warp_size}
            for key, attr, scale in (("l2CacheSize", "L2_cache_size", 1),
                                     ("sharedMemPerBlock", "shared_memory_per_block", 1),
                                     ("sharedMemPerMultiprocessor",
                                      "shared_memory_per_multiprocessor", 1),
                                     ("clockRateHz", "clock_rate", 1000)):  # torch: kHz
                v = getattr(p, attr, None)
                if isinstance(v, int):
                    dev[key] = v * scale
            out.append(dev)
        return out or None
    except Exception:  # noqa: BLE001 - device records may still come from CUPTI
        return None


def synchronize_devices() -> None:
    """Synchronize every device this process has a context on (never create one): through
    torch when it drives CUDA, else the calling thread's current context (driver API)."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "cuda"):
        if not torch.cuda.is_initialized():
            return
        has_ctx = getattr(torch._C, "_cuda_hasPrimaryContext", None)
        for i in range(torch.cuda.device_count()):
            if has_ctx is None and i != torch.cuda.current_device():
                continue
            if has_ctx is not None and not has_ctx(i):
                continue
            torch.cuda.synchronize(i)
        return
    from cuda.bindings import driver  # cupti-python's own dependency
    (err,) = driver.cuCtxSynchronize()
    if err not in (driver.CUresult.CUDA_SUCCESS, driver.CUresult.CUDA_ERROR_INVALID_CONTEXT,
                   driver.CUresult.CUDA_ERROR_NOT_INITIALIZED):  # no CUDA work to wait for
        raise RuntimeError(f"cuCtxSynchronize: {err}")


def probe() -> None:
    """Raise the clear error unless this machine can collect (used before launching a job)."""
    CuptiBackend(None).check()
