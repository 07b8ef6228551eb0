"""The loader of compiled kernels (ingest's, graphstore's and the simulator's): built ahead of
time where a C compiler is, else compiled by numba on first use, from the one source either way.

Why: numba's import and its first dispatch in a process (llvmlite, the target context, the
cache index) cost 0.4-0.5 s of one core holding the GIL, a quarter of ``daydream ingest`` of a
million-event trace and all of a small one's start. ``python -m daydream.warmup --ahead-of-time``
(``make`` runs it; that module names the modules that declare kernels, this one names no
stage) compiles every function marked ``@kernel`` with numba's ahead-of-time compiler
(``numba.pycc``) into two extension modules beside this file, one without numba's reference
counting (for kernels declared ``_nrt=False``, which the scanner is: with it, it ran 1.8x
slower), and then writes a stamp: the hash of the sources it compiled and their modules'
names. When a kernel is declared and the stamp matches the sources it names, the kernels are
the compiled functions and numba is not imported at all; otherwise (no compiler, a source
edited since, ``DAYDREAM_JIT=1`` in the environment) they are ``numba.njit`` dispatchers, as before.
Compiled for a generic x86-64, not this CPU: the scanner runs as fast as numba's JIT either
way (0.42-0.61 s against 0.44-0.70 s for a million events), and a virtual environment
carried to another machine still runs.

The compiled functions trust their arguments: an array of another dtype crashed the process
and a strided one gave wrong answers. So each call is checked against the kernel's declared
types first (some microseconds); a call that does not match runs on numba's JIT instead and
is named in FALLBACKS (no module's call does: tests/ingest/test_kernels.py).

Declaring a kernel: ``@kernel(returns, *args, **options)``, ``returns`` a numba type
expression (``"int64"``, ``"UniTuple(int64[::1], 2)"``), each of ``args`` a numpy dtype name,
as an array ``"int64[::1]"`` or ``"uint8[:, ::1]"`` (C-contiguous), ``"readonly uint8[::1]"``
for one the kernel only reads; ``options`` numba.njit's. A function that only kernels call
is a ``@helper(**options)``: compiled into them.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np

# the extension module of kernels with numba's reference counting (True) and without (False)
LIBRARIES = {True: "_kernels", False: "_kernels_nonrt"}
HERE = Path(__file__).resolve().parent
STAMP = HERE / "_kernels.stamp"
JIT_ENV = "DAYDREAM_JIT"  # set to 1: always numba's JIT (the compiled kernels are not loaded)
FALLBACKS: list[str] = []  # "module.kernel" of each call that did not match its declared types

_building = False  # set by build(): the modules imported to be compiled get numba dispatchers
_declared: dict[str, list[_Function]] = {}  # module -> its kernels and helpers, in order


def source_path(module: str) -> Path:
    """The source file of a module of the ``daydream`` package, found without importing it:
    the stages are this package's siblings, installed (daydream/base, daydream/ingest) as in a
    checkout (base/, ingest/)."""
    return HERE.parent.joinpath(*module.removeprefix("daydream.").split(".")).with_suffix(".py")


def source_hash(modules: tuple[str, ...]) -> str:
    """What the compiled kernels were built from: the sources of MODULES and of this file, and
    the numpy they were built against."""
    h = hashlib.blake2b(digest_size=16)
    for name in (*modules, __spec__.name if __spec__ else "daydream.base.compiled"):
        h.update(source_path(name).read_bytes())
    h.update(np.__version__.encode())
    return h.hexdigest()


def _stamp() -> tuple[str, tuple[str, ...]]:
    """The stamp's first word (the hash, or ``unbuilt: ...``) and the modules it names."""
    text = STAMP.read_text().strip()
    if text.startswith("unbuilt"):
        return text, ()
    word, _, modules = text.partition(" ")
    return word, tuple(modules.split())


@functools.cache
def _libraries() -> dict[bool, types.ModuleType] | None:
    """The compiled kernels' modules, or None where numba compiles them (module doc)."""
    if _building or os.environ.get(JIT_ENV) == "1":
        return None
    try:
        word, modules = _stamp()
        if not modules or word != source_hash(modules):
            return None
        package = __spec__.parent if __spec__ else "daydream.base"
        return {nrt: importlib.import_module(f"{package}.{name}")
                for nrt, name in LIBRARIES.items()}
    except (OSError, ImportError):
        return None


def state() -> str:
    """'compiled' where the kernels load ahead of time, else why not (the stamp's note)."""
    if _libraries() is not None:
        return "compiled"
    if os.environ.get(JIT_ENV) == "1":
        return f"numba's JIT ({JIT_ENV}=1)"
    try:
        word, modules = _stamp()
    except OSError:
        return "numba's JIT (not built: python -m daydream.warmup --ahead-of-time)"
    if word.startswith("unbuilt"):
        return f"numba's JIT ({word})"
    try:
        if modules and word == source_hash(modules):
            return "numba's JIT (the compiled modules did not load)"
    except OSError:
        pass
    return ("numba's JIT (sources changed since the build: python -m daydream.warmup "
            "--ahead-of-time)")


class _Function:
    """A kernel or helper as declared: its Python function and numba options."""

    def __init__(self, func: Callable, options: dict, returns: str | None = None,
                 args: tuple[str, ...] = ()):
        self.func, self.options, self.returns = func, options, returns
        # (dtype, ndim, readonly) of each argument: a declaration error shows at import
        self.args = [_parse_arg(a) for a in args]
        self.name = func.__name__
        self.module = func.__module__

    @property
    def export_name(self) -> str:
        return f"{self.module.replace('.', '_')}__{self.name}"

    @property
    def nrt(self) -> bool:
        return self.options.get("_nrt", True)

    def jit(self):
        import numba
        if not _building:  # (the ahead-of-time build says what it compiles itself)
            announce_compiles()
        return numba.njit(cache=True, **self.options)(self.func)


@functools.cache
def announce_compiles() -> None:
    """Say on stderr when numba compiles one of daydream's kernels (on first use, where they
    were not compiled ahead of time and numba's cache has none): at the first, what it is
    doing; at exit, what it compiled and how long it took. Silently, the first ``daydream
    ingest`` after a plain ``pip install`` took 17 s against the next one's 3. Loads from
    numba's cache say nothing (numba fires no compile event for them). Called by every
    module that compiles kernels with numba, once numba is imported."""
    import atexit
    import time

    from numba.core import event

    done: dict[str, int] = {}
    state = {"depth": 0, "t0": 0.0, "total": 0.0}

    class Announce(event.Listener):
        # numba calls these under its global compiler lock: one compile at a time; a kernel's
        # helpers compile inside it (depth > 1) and are counted as part of it
        def on_start(self, ev):
            state["depth"] += 1
            if state["depth"] > 1:
                return
            if not done and not state["total"]:
                print("daydream: numba is compiling the kernels this command needs, once "
                      "(cached for later runs; `python -m daydream.warmup` compiles them all "
                      "now) ...", file=sys.stderr, flush=True)
            state["t0"] = time.perf_counter()

        def on_end(self, ev):
            state["depth"] -= 1
            if state["depth"]:
                return
            state["total"] += time.perf_counter() - state["t0"]
            f = getattr(ev.data.get("dispatcher"), "py_func", None)
            mod = getattr(f, "__module__", "?").removeprefix("daydream.")
            done[mod] = done.get(mod, 0) + 1

    def summary() -> None:
        if done:
            what = ", ".join(f"{m} {n}" for m, n in sorted(done.items()))
            n = sum(done.values())
            print(f"daydream: numba compiled {n} kernel{'s' if n != 1 else ''} ({what}) in "
                  f"{state['total']:.1f} s", file=sys.stderr, flush=True)
            done.clear()

    _summaries.append(summary)
    event.register("numba:compile", Announce())
    atexit.register(summary)


_summaries: list[Callable[[], None]] = []


def say_compiled() -> None:
    """Print what numba compiled in this process so far (announce_compiles), now: for a
    process that ends without running its exit handlers (``daydream``'s ``os._exit``)."""
    for f in _summaries:
        f()


def _parse_arg(arg: str) -> tuple[np.dtype, int, bool]:
    """(dtype, ndim: 0 for a scalar, readonly) of one declared argument type."""
    readonly = arg.startswith("readonly ")
    base, _, dims = arg.removeprefix("readonly ").partition("[")
    ndim = dims.count(":") - dims.count("::") if dims else 0  # "[:, ::1]": 2
    if dims and not dims.rstrip("]").endswith("::1"):
        raise ValueError(f"kernel argument {arg!r}: arrays are declared C-contiguous ([..., ::1])")
    return np.dtype(base), ndim, readonly


def _is_scalar(a, kind: str) -> bool:
    """Whether ``a`` is a Python or numpy scalar of a dtype kind (a bool is no integer)."""
    if kind == "b":
        return isinstance(a, (bool, np.bool_))
    if kind in "iu":
        return isinstance(a, (int, np.integer)) and not isinstance(a, bool)
    return isinstance(a, (float, int, np.floating))


class _Compiled:
    """A kernel compiled ahead of time, called after its arguments are checked against the
    declared types (module doc); a call that does not match runs on numba's JIT."""

    def __init__(self, fn: _Function, native: Callable):
        self.fn, self.native = fn, native
        self.__name__, self.__doc__ = fn.name, fn.func.__doc__
        self.__wrapped__ = fn.func

    def matches(self, args: tuple) -> bool:
        if len(args) != len(self.fn.args):
            return False
        for a, (dtype, ndim, readonly) in zip(args, self.fn.args, strict=True):
            if ndim == 0:
                if not _is_scalar(a, dtype.kind):
                    return False
            elif not (isinstance(a, np.ndarray) and a.dtype == dtype and a.ndim == ndim
                      and a.flags.c_contiguous and a.flags.aligned
                      and (readonly or a.flags.writeable)):
                return False
        return True

    def __call__(self, *args):
        if self.matches(args):
            return self.native(*args)
        FALLBACKS.append(f"{self.fn.module}.{self.fn.name}")
        return _jit_of(self.fn.module)[self.fn.name](*args)


@functools.cache
def _jit_of(module: str) -> dict[str, Callable]:
    """numba dispatchers of a module's kernels and helpers, for calls the compiled kernels do
    not take. They are compiled from copies of the functions whose globals name each other's
    dispatchers; the module's own names stay the compiled kernels."""
    declared = _declared[module]
    scope = dict(vars(sys.modules[module]))
    out = {}
    for fn in declared:
        f = fn.func
        copy = types.FunctionType(f.__code__, scope, f.__name__, f.__defaults__, f.__closure__)
        copy.__module__, copy.__qualname__, copy.__doc__ = f.__module__, f.__qualname__, f.__doc__
        out[fn.name] = scope[fn.name] = _Function(copy, fn.options).jit()
    return out


def _declare(fn: _Function) -> None:
    _declared.setdefault(fn.module, []).append(fn)


def kernel(returns: str, *args: str, **options) -> Callable:
    """Mark an entry point called from Python, with its types (module doc)."""
    def wrap(func: Callable):
        fn = _Function(func, options, returns, args)
        _declare(fn)
        libs = _libraries()
        native = getattr(libs[fn.nrt], fn.export_name, None) if libs else None
        return fn.jit() if native is None else _Compiled(fn, native)
    return wrap


def helper(**options) -> Callable:
    """Mark a function that only kernels call: compiled into them (module doc). Where the
    kernels are compiled ahead of time it stays a Python function."""
    def wrap(func: Callable):
        fn = _Function(func, options)
        _declare(fn)
        return func if _libraries() else fn.jit()
    return wrap


# --------------------------------------------------------------------------------------------
# the build


def build(modules: tuple[str, ...], out_dir: Path = HERE) -> dict[str, int]:
    """Compile every kernel of MODULES ahead of time into LIBRARIES in ``out_dir``, then write
    the stamp there. The old stamp goes first and the new one last, so an interrupted build
    leaves numba's JIT in use, never modules the stamp does not vouch for. Returns the number
    of kernels in each library.

    Every compiled kernel releases the GIL while it runs, as numba's ``nogil`` does (the
    scanner must: the tables of one batch are routed on another thread while it fills the
    next; compiled without it, ``read_trace`` of a million events ran on one core, 0.9 s
    against the JIT's 0.7). They touch no Python object, so this is safe for all of them;
    numba.pycc has no option for it, so its flags are given it here."""
    global _building
    import tempfile

    import numba
    import numba.pycc.compiler as pycc
    from numba.pycc import CC

    loaded = [m for m in modules if m in sys.modules]
    if loaded:
        raise RuntimeError(f"build() must run before {', '.join(loaded)} is imported")
    _building = True
    _libraries.cache_clear()
    for m in modules:
        importlib.import_module(m)
    space = dict(vars(numba.types))
    stamp = out_dir / STAMP.name
    stamp.unlink(missing_ok=True)
    counts = {}
    flags = pycc.Flags

    class ReleasingGil(flags):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.release_gil = True

    pycc.Flags = ReleasingGil
    try:
        with tempfile.TemporaryDirectory(dir=out_dir, prefix=".kernels-") as tmp:
            for nrt, lib in LIBRARIES.items():
                cc = CC(lib)
                cc.output_dir, cc.use_nrt, cc.verbose = tmp, nrt, False
                kernels = [fn for m in modules for fn in _declared.get(m, ())
                           if fn.returns is not None and fn.nrt == nrt]
                for fn in kernels:
                    sig = eval(fn.returns, {}, space)(*(_numba_type(*a, numba) for a in fn.args))
                    cc.export(fn.export_name, sig)(fn.func)
                cc.compile()
                counts[lib] = len(kernels)
            for f in Path(tmp).iterdir():
                if f.name.startswith(tuple(LIBRARIES.values())):
                    os.replace(f, out_dir / f.name)
    finally:
        pycc.Flags = flags
    _write_stamp(stamp, f"{source_hash(modules)} {' '.join(modules)}")
    return counts


def _write_stamp(stamp: Path, text: str) -> None:
    part = stamp.with_suffix(".part")
    part.write_text(text + "\n")
    os.replace(part, stamp)


def _numba_type(dtype: np.dtype, ndim: int, readonly: bool, numba):
    scalar = numba.from_dtype(dtype)
    return numba.types.Array(scalar, ndim, "C", readonly=readonly) if ndim else scalar


def main(modules: tuple[str, ...]) -> int:
    """Build MODULES' kernels, or where that fails (no C compiler, say), leave a stamp that
    says why: numba compiles the kernels on first use instead, and ``make`` does not try
    again until the sources change."""
    import time
    t = time.perf_counter()
    try:
        if _stamp() == (source_hash(modules), modules) and _libraries() is not None:
            os.utime(STAMP)  # built from these very sources: nothing to compile (for make)
            print("daydream: the compiled kernels are up to date")
            return 0
    except OSError:
        pass
    try:
        counts = build(modules)
    except Exception as e:  # noqa: BLE001 - any failure leaves numba's JIT, which works
        reason = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        _write_stamp(STAMP, f"unbuilt: {reason}")
        print(f"daydream: kernels not compiled ahead of time ({reason}); numba compiles "
              "them on first use", file=sys.stderr)
        return 0
    print(f"daydream: {sum(counts.values())} kernels compiled ahead of time "
          f"({time.perf_counter() - t:.0f} s)")
    return 0
