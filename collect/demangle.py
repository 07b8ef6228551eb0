"""Kernel names as PyTorch's profiler writes them.

CUPTI's kernel records carry the mangled symbol (``_ZN2at6native13reduce_kernel...``). Kineto
passes every name through the C++ runtime's ``__cxa_demangle`` unless it is longer than 1024
characters, and keeps the name as it is where demangling fails; a trace collected here must
name its kernels the same way, or the same job read from the two sources would not have the
same kernels. The same C++ runtime function is called here (libstdc++'s, through ctypes), with
the same length limit. Only names that are Itanium function manglings (``_Z...``) are tried:
Kineto would also turn a kernel named ``f`` into ``float``.

Nsight Systems' exports carry NVIDIA's own demangling (``<(int)4, ...>(int, T2, T3)``), which
``ingest.nsys`` reads as is; it differs from both in template arguments.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

MAX_MANGLED = 1024  # Kineto's kMaxSymbolSize: longer names stay mangled

_lock = threading.Lock()
_cache: dict[str, str] = {}
_fn = None
_free = None
_tried = False


def _load() -> bool:
    global _fn, _free, _tried
    if _tried:
        return _fn is not None
    _tried = True
    for name in ("libstdc++.so.6", ctypes.util.find_library("stdc++"), "libc++abi.so.1",
                 ctypes.util.find_library("c++abi")):
        if not name:
            continue
        try:
            fn = ctypes.CDLL(name).__cxa_demangle
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.POINTER(ctypes.c_int)]
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        libc.free.argtypes = [ctypes.c_void_p]
        _fn, _free = fn, libc.free
        return True
    return False


def available() -> bool:
    """Whether a C++ runtime with ``__cxa_demangle`` could be loaded (else names stay mangled)."""
    return _load()


def demangle(name: str) -> str:
    """``name`` as Kineto writes it; cached, thread-safe."""
    if not name.startswith("_Z") or len(name) > MAX_MANGLED:
        return name
    got = _cache.get(name)
    if got is not None:
        return got
    with _lock:
        if not _load():
            return name
        status = ctypes.c_int(0)
        ptr = _fn(name.encode("utf-8", "surrogateescape"), None, None, ctypes.byref(status))
        if status.value != 0 or not ptr:
            out = name
        else:
            try:
                out = ctypes.string_at(ptr).decode("utf-8", errors="replace")
            finally:
                _free(ptr)
        _cache[name] = out
    return out
