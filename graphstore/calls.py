"""What each CUDA/HIP runtime or driver call can wait for, from its name.

The graph gives every call that waited for the GPU only its own cost as duration and makes the
wait an edge (DESIGN.md "The graph"), so it must know which calls can wait and for what. The
rules follow NVIDIA's "API synchronization behavior" page of the CUDA Runtime API reference
(docs.nvidia.com/cuda/cuda-runtime-api/api-sync-behavior.html) and HIP's equivalents:

- enqueue calls (kernel launches, async copies and sets, graph launches): asynchronous, but a
  call into a stream whose queue is full blocks until a slot frees (``LAUNCH_QUEUE_DEPTH``);
  any call that put GPU work into the trace is one, whatever its name;
- stream syncs wait for everything enqueued on one stream before them; device syncs for
  everything on the device; event syncs for the work before the event's record;
- ``cudaFree``/``cuMemFree``/``hipFree`` synchronize the device implicitly before freeing;
- a synchronous copy (``cudaMemcpy``, ``cuMemcpyDtoH``...) to host memory returns once the copy
  is done; an async copy with a pageable host side is synchronous too ("for transfers between
  device memory and pageable host memory, the function might be synchronous with respect to
  host"): device-to-host it returns when the copy is done, host-to-device once the stream's
  earlier work is done and the data is staged; device-to-device copies never block the host;
- ``cudaMemset`` on device memory is asynchronous with respect to the host ("the synchronous
  memset functions are asynchronous with respect to the host except when the target is pinned
  host memory"), so it is only an enqueue call.
"""

from __future__ import annotations

import re

# What a call waits for (``wait_class``): codes stored per call in the graph build.
WAIT_NONE, WAIT_STREAM, WAIT_DEVICE, WAIT_EVENT, WAIT_COPY = range(5)
WAIT_CLASS_NAMES = ("none", "stream", "device", "event", "copy")

_STREAM_SYNC = re.compile(r"^(cuda|hip)StreamSynchronize|^cuStreamSynchronize")
_DEVICE_SYNC = re.compile(
    r"^(cuda|hip)(Device|Thread)Synchronize|^cuCtxSynchronize"
    r"|^(cuda|hip)Free(Host)?$|^hipHostFree$|^cuMemFree(Host)?(_v2)?$")
_EVENT_SYNC = re.compile(r"^(cuda|hip)EventSynchronize|^cuEventSynchronize")
# Copy calls by name: the async ones block only with a pageable host side (decided per copy)
_COPY = re.compile(r"^(cuda|hip)Memcpy|^cuMemcpy")
_ASYNC = re.compile(r"Async(_v\d+)?$")


# Kernel and graph launches by name (a launch whose work the trace does not show is still an
# enqueue call: graphstore.build's unseen queue edges)
_LAUNCH = re.compile(r"Launch(Kernel|CooperativeKernel)|^(cuda|hip|cu)GraphLaunch")


def is_launch(name: str) -> bool:
    return bool(_LAUNCH.search(name))


# Calls that ask whether GPU work is done without waiting for it (a thread that repeats them
# is polling: graphstore.build's poll waits), and calls that only inspect the runtime's state:
# a thread whose calls are all of these launches and waits for nothing itself.
_QUERY = re.compile(r"^(cuda|hip)(Event|Stream)Query|^cu(Event|Stream)Query")
_INSPECT = re.compile(r"^(cuda|hip)(PointerGetAttributes|GetDevice|GetDeviceCount|SetDevice|"
                      r"GetLastError|PeekAtLastError|DeviceGetAttribute|StreamGetPriority|"
                      r"StreamIsCapturing|StreamGetCaptureInfo)|^cu(PointerGetAttribute|"
                      r"CtxGetCurrent|CtxSetCurrent|DeviceGet)")


def poll_kind(name: str) -> int:
    """2 for a query (``cudaEventQuery``, ``cudaStreamQuery``, the HIP and driver ones), 1 for
    a call that only inspects state, 0 for any other."""
    return 2 if _QUERY.search(name) else 1 if _INSPECT.search(name) else 0


def wait_class(name: str) -> int:
    """WAIT_* code of a call name (version suffixes such as ``_v7000`` already stripped)."""
    if _STREAM_SYNC.search(name):
        return WAIT_STREAM
    if _DEVICE_SYNC.search(name):
        return WAIT_DEVICE
    if _EVENT_SYNC.search(name):
        return WAIT_EVENT
    if _COPY.search(name):
        return WAIT_COPY
    return WAIT_NONE


def is_async_copy(name: str) -> bool:
    return bool(_COPY.search(name) and _ASYNC.search(name))


# Copies whose call blocks the host (``copy_blocks``), by copy kind and the host side's memory
# kind as the memcpy activity records them (CUPTI: Pageable, Pinned, Device, ...).
BLOCK_NONE, BLOCK_AFTER_COPY, BLOCK_BEFORE_COPY = range(3)


def copy_blocks(async_call: bool, copy_kind: str | None, src_kind: str | None,
                dst_kind: str | None) -> int:
    """How a copy call waits: BLOCK_AFTER_COPY (returns when its copy has finished),
    BLOCK_BEFORE_COPY (returns once the stream's earlier work is done and the data staged:
    pageable host-to-device) or BLOCK_NONE."""
    ck = (copy_kind or "").upper()
    src, dst = (src_kind or "").lower(), (dst_kind or "").lower()
    if ck in ("DTOD", "PTOP") or (src == "device" and dst == "device"):
        return BLOCK_NONE
    to_host = ck in ("DTOH", "HTOH") or dst in ("pageable", "pinned")
    from_host = ck == "HTOD" or src in ("pageable", "pinned")
    if not async_call:  # synchronous copies (cudaMemcpy, cuMemcpyHtoD, ...)
        if from_host and src == "pageable":
            return BLOCK_BEFORE_COPY
        return BLOCK_AFTER_COPY if (to_host or from_host) else BLOCK_NONE
    if to_host and dst == "pageable":
        return BLOCK_AFTER_COPY
    if from_host and src == "pageable":
        return BLOCK_BEFORE_COPY
    return BLOCK_NONE
