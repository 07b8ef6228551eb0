"""CUPTI buffers made on the CPU, the way cupti-python hands them to the buffer callback.

A buffer is a list of record wrappers of the record's class (``ActivityKernel13``...) whose
``.ptr`` is the address of the record's bytes; the bytes are laid out with the record layouts of
``collect.records`` (checked against cupti-python's own dtypes in test_records.py). Names are
real C strings, so the collector reads them exactly as it reads CUPTI's.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

import numpy as np

from daydream.collect import records
from daydream.ingest import cupti_format as fmt

_classes: dict[str, type] = {}


def wrapper_class(name: str) -> type:
    """A stand-in for cupti-python's record class ``name`` (only ``.ptr`` is read)."""
    cls = _classes.get(name)
    if cls is None:
        cls = _classes[name] = type(name, (), {"__slots__": ("ptr", "owner")})
    return cls


class Strings:
    """C strings kept alive for the records pointing at them."""

    def __init__(self):
        self._bufs: dict[str, ctypes.Array] = {}

    def ptr(self, text: str) -> int:
        buf = self._bufs.get(text)
        if buf is None:
            buf = self._bufs[text] = ctypes.create_string_buffer(text.encode())
        return ctypes.addressof(buf)


def record(cls_name: str, **fields) -> np.ndarray:
    r = records.empty(cls_name, 1)
    for k, v in fields.items():
        r[k] = v
    return r


class Buffer:
    """Records packed into one block of memory, as CUPTI's buffer, in the given order.
    ``spacing`` > 0 leaves that many bytes between records (not one buffer: the collector must
    then copy record by record)."""

    def __init__(self, recs: list[tuple[str, np.ndarray]], spacing: int = 0):
        sizes = [r.dtype.itemsize for _, r in recs]
        self.memory = np.zeros(sum(sizes) + spacing * len(recs) + 8, np.uint8)
        base = self.memory.ctypes.data
        self.activities = []
        self._at: dict[str, tuple[int, np.dtype]] = {}
        off = 0
        for (cls_name, r), size in zip(recs, sizes, strict=True):
            self.memory[off:off + size] = r.view(np.uint8)
            obj = wrapper_class(cls_name)()
            obj.ptr = base + off
            obj.owner = self.memory  # as cupti-python's wrappers keep their buffer alive
            self.activities.append(obj)
            self._at.setdefault(cls_name, (off, r.dtype))
            off += size + spacing

    def view(self, cls_name: str) -> np.ndarray:
        """The first record of ``cls_name`` in this buffer's memory, writable in place."""
        off, dtype = self._at[cls_name]
        return self.memory[off:off + dtype.itemsize].view(dtype)


API_NAMES = {("runtime", 211): "cudaLaunchKernel_v7000", ("runtime", 41): "cudaMemcpyAsync_v3020",
             ("runtime", 51): "cudaMemsetAsync_v3020", ("runtime", 131):
             "cudaStreamSynchronize_v3020", ("driver", 307): "cuLaunchKernel"}


def api_name(domain: str, cbid: int) -> str | None:
    return API_NAMES.get((domain, cbid))


PID, TID = 4242, 4243
T0 = 1_700_000_000_000_000_000  # CUPTI timestamps are ns since an epoch: large numbers
CUSTOM2 = fmt.EXTERNAL_KIND_CUSTOM2


def scenario(strings: Strings) -> list[list[tuple[str, np.ndarray]]]:
    """Two buffers of one process: calls, kernels, a copy, a set, a stream sync, external
    correlations, NVTX records, device and context. Expected rows: test_roundtrip.py."""
    def api(corr, cbid, s, e, driver=False):
        return ("ActivityAPI", record("ActivityAPI", kind=fmt.KIND_DRIVER if driver else
                                      fmt.KIND_RUNTIME, cbid=cbid, start=T0 + s, end=T0 + e,
                                      process_id=PID, thread_id=TID, correlation_id=corr))

    def kernel(corr, name, s, e):
        return ("ActivityKernel13", record(
            "ActivityKernel13", kind=fmt.KIND_CONCURRENT_KERNEL, start=T0 + s, end=T0 + e,
            device_id=0, context_id=1, stream_id=7, correlation_id=corr, name=strings.ptr(name),
            grid_x=4, grid_y=2, grid_z=1, block_x=128, block_y=1, block_z=1,
            registers_per_thread=32, static_shared_memory=1024, dynamic_shared_memory=512))

    def ext(corr, ext_id, kind=CUSTOM2):
        return ("ActivityExternalCorrelation", record(
            "ActivityExternalCorrelation", kind=fmt.KIND_EXTERNAL_CORRELATION,
            external_kind=kind, external_id=ext_id, correlation_id=corr))

    def nvtx(mid, flags, ts, name=None):
        return ("ActivityMarker2", record(
            "ActivityMarker2", kind=fmt.KIND_MARKER, flags_=flags, timestamp=T0 + ts, id=mid,
            object_kind=fmt.OBJECT_KIND_THREAD, **{"object_id.pt.process_id": PID,
                                                   "object_id.pt.thread_id": TID},
            name=strings.ptr(name) if name else 0, domain=0))

    first = [
        ("ActivityDevice6", record(
            "ActivityDevice6", kind=fmt.KIND_DEVICE, id=0, name=strings.ptr("NVIDIA H200"),
            compute_capability_major=9, compute_capability_minor=0, num_multiprocessors=132,
            global_memory_size=150_000_000_000, global_memory_bandwidth=4_800_000_000,
            core_clock_rate=1_980_000, num_threads_per_warp=32, l2cache_size=50 << 20,
            max_threads_per_block=1024)),
        ("ActivityContext4", record("ActivityContext4", kind=fmt.KIND_CONTEXT, context_id=1,
                                    device_id=0)),
        nvtx(1, fmt.MARKER_START, 985, "nvtx_range"),
        nvtx(2, fmt.MARKER_INSTANTANEOUS, 1005, "a_mark"),
        api(1, 211, 1000, 1010), api(2, 211, 1020, 1030), api(3, 307, 1040, 1045, driver=True),
        api(4, 41, 1050, 1060), api(5, 51, 1070, 1075), api(6, 131, 1080, 1200),
        ext(1, 11), ext(2, 11), ext(3, 12), ext(4, 99, kind=fmt.EXTERNAL_KIND_CUSTOM0),
    ]
    second = [
        kernel(2, "relu_kernel", 1150, 1160), kernel(1, "gemm_kernel", 1100, 1150),
        kernel(3, "gemm_kernel", 1160, 1170),
        ("ActivityMemcpy7", record(
            "ActivityMemcpy7", kind=fmt.KIND_MEMCPY, copy_kind=1, src_kind=1, dst_kind=3,
            bytes=4096, start=T0 + 1061, end=T0 + 1070, device_id=0, context_id=1, stream_id=7,
            correlation_id=4)),
        ("ActivityMemset5", record(
            "ActivityMemset5", kind=fmt.KIND_MEMSET, bytes=256, start=T0 + 1076, end=T0 + 1078,
            device_id=0, context_id=1, stream_id=7, correlation_id=5, memory_kind=3)),
        ("ActivitySynchronization2", record(
            "ActivitySynchronization2", kind=fmt.KIND_SYNCHRONIZATION, type=3, start=T0 + 1085,
            end=T0 + 1195, correlation_id=6, context_id=1, stream_id=7,
            cuda_event_id=fmt.NO_ID_U32)),
        nvtx(1, fmt.MARKER_END, 1300),
    ]
    return [first, second]


def markers(names) -> np.ndarray:
    """Layer and iteration markers of the scenario (ids 10-12, 11 and 12 tie to the calls)."""
    rows = [(980, 1400, 10, 0, "ProfilerStep#0", None, 1, 0),
            (990, 1035, 11, 0, "model (Net) [forward]", "Net", 0, 1),
            (1036, 1046, 12, 4096, "model.fc (Linear) [forward]", "Linear", 0, 1)]
    out = np.zeros(len(rows), fmt.MARKER_DTYPE)
    for i, (s, e, mid, pb, name, typ, kind, phase) in enumerate(rows):
        for k, v in (("start", T0 + s), ("end", T0 + e), ("id", mid), ("param_bytes", pb),
                     ("pid", PID), ("tid", TID), ("name", names.id(name)),
                     ("module_type", -1 if typ is None else names.id(typ)), ("kind", kind),
                     ("phase", phase)):
            out[k][i] = v
    return out


# The FakeBackends of the process, for a job's code to reach (``cuda_init``), and whether the
# job has initialized CUDA (tests that change it restore it with monkeypatch).
CURRENT: list = []
CUDA = {"initialized": False}

DEVICE_RECORD = dict(
    kind=fmt.KIND_DEVICE, id=0, compute_capability_major=9, compute_capability_minor=0,
    num_multiprocessors=132, global_memory_size=150_000_000_000,
    global_memory_bandwidth=4_800_000_000, core_clock_rate=1_980_000, num_threads_per_warp=32,
    l2cache_size=50 << 20, max_threads_per_block=1024)


def cuda_init() -> None:
    """The job initializes CUDA (``model.cuda()``): CUPTI writes DEVICE and CONTEXT records now,
    and only if those kinds are enabled now (they are never written later)."""
    CUDA["initialized"] = True
    if CURRENT:
        CURRENT[-1].cuda_init()


class FakeBackend:
    """What ``collect`` needs from CUPTI, without a GPU, with CUPTI's delivery rules:

    * every marker but an iteration's (``ProfilerStep#``, begun by ``collect.api`` itself,
      launches nothing) fakes one launch inside it, made when it is popped: a runtime call, its
      kernel and the external correlation CUPTI would record for it, one buffer per launch;
    * the GPU runs behind the CPU: a kernel completes ``LAG`` launches later, or at
      ``synchronize()``; a forced flush delivers incomplete kernels with start = end = 0 (what
      CUPTI hands back for an activity still queued), a default flush (``forced=False``) only
      buffers whose records are all complete;
    * DEVICE and CONTEXT records exist only if those kinds were enabled when CUDA initialized
      (``cuda_init``).
    """

    clock_name = "perf_counter_ns (fake backend)"
    LAG = 3
    EARLY = ("DEVICE", "CONTEXT")

    def __init__(self, recorder):
        self.recorder = recorder
        self.recorder.api_name = api_name
        self.pushes: list[tuple[str, int]] = []
        self.started = self.stopped = self.opened = self.syncs = 0
        self.pending: list[Buffer] = []
        self.inflight: list[tuple[Buffer, np.ndarray]] = []  # queued kernels, their records
        self.kinds: set[str] = set()
        self._open: dict[int, list] = {}
        self._last_read: dict[int, int] = {}
        self.strings = Strings()
        self.cuda_initialized = CUDA["initialized"]
        self.library = {"path": "fake", "api_version": 130400}
        CURRENT.append(self)

    def check(self) -> None:
        pass

    def open(self) -> None:
        self.opened += 1
        self.kinds.update(self.EARLY)

    def start(self) -> None:
        self.started += 1
        self.kinds.update(("CONCURRENT_KERNEL", "RUNTIME", "EXTERNAL_CORRELATION") + self.EARLY)
        self.recorder.meta_later({"activity_kinds": ["FAKE"]})

    def stop(self) -> None:
        """CUPTI's last forced flush, then the kinds are off."""
        self.flush(forced=True)
        self.kinds.clear()
        self.stopped += 1

    def cuda_init(self) -> None:
        self.cuda_initialized = True
        if "DEVICE" in self.kinds:
            self.pending.append(Buffer([
                ("ActivityDevice6", record("ActivityDevice6", name=self.strings.ptr(
                    "NVIDIA H200"), **DEVICE_RECORD)),
                ("ActivityContext4", record("ActivityContext4", kind=fmt.KIND_CONTEXT,
                                            context_id=1, device_id=0))]))

    def timestamp(self) -> int:
        """The clock; each thread's reads are kept: the first after a push is its marker's
        start, the last before a pop its end (Markers reads the clock after pushing and
        before popping)."""
        t = time.perf_counter_ns()
        tid = threading.get_native_id()
        stack = self._open.get(tid)
        if stack and stack[-1][1] is None:
            stack[-1][1] = t
        self._last_read[tid] = t
        return t

    def push(self, mid: int) -> None:
        self.pushes.append(("push", mid))
        opener = sys._getframe(2).f_globals.get("__name__")  # who called Markers.begin
        launches = "CONCURRENT_KERNEL" in self.kinds and opener != "daydream.collect.api"
        self._open.setdefault(threading.get_native_id(), []).append([mid, None, launches])

    def pop(self) -> None:
        """The launch happens inside the marker: its call is timed halfway between the
        marker's own clock reads (its start and end), so that it lies within however long the
        thread was held up between those reads and the push or pop."""
        self.pushes.append(("pop", 0))
        tid = threading.get_native_id()
        stack = self._open.get(tid)
        if not stack:
            return
        mid, t_start, launches = stack.pop()
        if launches:
            t_end = self._last_read.get(tid, time.perf_counter_ns())
            t_start = t_end if t_start is None else t_start
            self._launch(mid, (t_start + max(t_end, t_start)) // 2)

    def _launch(self, mid: int, t: int) -> None:
        corr = len(self.pushes)
        tid = threading.get_native_id()
        buf = Buffer([
            ("ActivityAPI", record("ActivityAPI", kind=fmt.KIND_RUNTIME, cbid=211, start=t,
                                   end=t + 1, process_id=os.getpid(), thread_id=tid,
                                   correlation_id=corr)),
            ("ActivityExternalCorrelation", record(
                "ActivityExternalCorrelation", kind=fmt.KIND_EXTERNAL_CORRELATION,
                external_kind=CUSTOM2, external_id=mid, correlation_id=corr)),
            ("ActivityKernel13", record(
                "ActivityKernel13", kind=fmt.KIND_CONCURRENT_KERNEL, start=t + 5, end=t + 9,
                device_id=0, context_id=1, stream_id=7, correlation_id=corr,
                name=self.strings.ptr(f"kernel_{mid % 3}"))),
        ])
        self.pending.append(buf)
        self.inflight.append((buf, buf.view("ActivityKernel13")))
        while len(self.inflight) > self.LAG:  # the GPU caught up with older launches
            self.inflight.pop(0)

    def synchronize(self) -> None:
        self.syncs += 1
        self.inflight.clear()

    def device_properties(self) -> list[dict] | None:
        """What the job's CUDA runtime says of its devices (torch.cuda in production); None
        before CUDA is initialized."""
        if not self.cuda_initialized:
            return None
        return [{"id": 0, "name": "NVIDIA H200 (runtime)", "computeMajor": 9, "computeMinor": 0,
                 "numSms": 132, "totalGlobalMem": 150_000_000_000}]

    def flush(self, forced: bool = True) -> None:
        """Deliver buffers as CUPTI does: whole buffers, latest first."""
        queued = {id(b) for b, _ in self.inflight}
        if forced:
            deliver, keep = self.pending, []
            for _, v in self.inflight:   # what CUPTI hands back for work still queued
                v["start"] = 0
                v["end"] = 0
            self.inflight = []
        else:
            deliver = [b for b in self.pending if id(b) not in queued]
            keep = [b for b in self.pending if id(b) in queued]
        self.pending = keep
        for i in range(0, len(deliver), 4)[::-1]:
            self.recorder.handle_buffer([a for b in deliver[i:i + 4] for a in b.activities])
