"""The accuracy harness behind `make accuracy`: one module per measure of ACCURACY.md.

Each measure lives in its own module of this package and registers a section with
``@section(name, title, order)``; the decorated function takes the run's ``Context`` and returns
a ``Result`` (its markdown lines and a machine-readable dict). Every module in the package is
imported by ``discover()``, so a new measure (e.g. ``gpu_pairs.py``, batch-size pairs) is one new
file, with no edit to anyone else's code. ``python -m bench.accuracy`` runs them in order into
docs/accuracy.md and docs/accuracy.json; ``--only NAME`` reruns one and merges it in.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OUT_MD = ROOT / "docs" / "accuracy.md"
OUT_JSON = ROOT / "docs" / "accuracy.json"
PLOTS = ROOT / "docs" / "accuracy"
STORE = ROOT / ".daydream-accuracy"

from bench import manifest  # noqa: E402

NA = "not available yet"


@dataclass
class Result:
    """A section's output: markdown lines (its own ``## title`` first) and numbers for
    docs/accuracy.json, which tests and later sessions read instead of parsing markdown."""

    lines: list[str]
    data: dict = field(default_factory=dict)


@dataclass
class Section:
    name: str
    title: str
    order: int
    run: Callable[[Context], Result]


SECTIONS: dict[str, Section] = {}


def section(name: str, title: str, order: int = 50):
    """Register a section; ``order`` places it in docs/accuracy.md (ACCURACY.md's measures are
    10, 20, ... 50; a module that belongs beside one takes a number next to it)."""
    def deco(fn: Callable[[Context], Result]) -> Callable[[Context], Result]:
        if name in SECTIONS and SECTIONS[name].run is not fn:
            raise ValueError(f"accuracy section {name!r} is registered twice")
        SECTIONS[name] = Section(name, title, order, fn)
        return fn
    return deco


def discover() -> dict[str, Section]:
    """Import every module of this package so that each registers its sections."""
    for m in pkgutil.iter_modules(__path__):
        if not m.name.startswith("_"):
            importlib.import_module(f"{__name__}.{m.name}")
    return dict(sorted(SECTIONS.items(), key=lambda kv: (kv[1].order, kv[0])))


def shown(path: str | Path) -> str:
    """A trace's path as the docs write it: relative to the repository (tests/data/...), or
    to the folder beside it (../shared/traces/...), never this machine's own path; a shared
    trace by that name also where ../shared is a link to a folder elsewhere."""
    p = Path(path).resolve()
    shared = manifest.SHARED.resolve()
    for base, prefix in ((ROOT, ""), (shared, "../shared/traces/"), (ROOT.parent, "../")):
        if p.is_relative_to(base):
            return prefix + p.relative_to(base).as_posix()
    return p.name


def reason(e: BaseException) -> str:
    """One line for a table cell: why something is missing."""
    return f"{type(e).__name__}: {e}".splitlines()[0][:200].replace("|", "\\|")


def _json(d) -> dict:
    """A prediction's JSON form (``PredictionResult.as_dict``); a stand-in's dict as it is."""
    return d.as_dict() if hasattr(d, "as_dict") else d


class Context:
    """What the sections of one run share: the store, and memoized predictions and bounds, so
    that two sections asking for the same prediction pay for it once. Every prediction made
    goes into ``log`` (the gates section reads their ``gates`` from there)."""

    def __init__(self, store: Path = STORE, predict: Callable | None = None):
        self.store = Path(store)
        self._predict = predict
        self._memo: dict = {}
        self._bounds: dict = {}
        self.log: list[tuple[str, str | None, dict]] = []
        self.shared: dict = {}

    def predict(self, trace: str | Path, opts: list[str] | None = None) -> dict:
        """``daydream.api.predict`` memoized, as ``daydream predict --json`` prints it (the
        harness reads a prediction's JSON fields, as its stand-ins in tests/bench give them);
        an exception is raised again on every ask."""
        key = (str(trace), tuple(opts or ()))
        if key not in self._memo:
            manifest.check_judged(trace)  # a measure judges judged traces only
            fn = self._predict
            if fn is None:
                from daydream import api
                fn = api.predict
            try:
                d = _json(fn(str(trace), self.store, opts=list(opts) if opts else None))
                self._memo[key] = d
                self.log.append((str(trace), "+".join(opts) if opts else None, d))
            except Exception as e:  # a broken trace must not take the whole report down
                self._memo[key] = e
        v = self._memo[key]
        if isinstance(v, BaseException):
            raise v
        return v

    def predict_each(self, trace: str | Path, specs: list[str]) -> dict[str, dict | Exception]:
        """One prediction per spec of SPECS (each a chain), memoized as ``predict``'s; the
        trace's graph is read and its baseline replayed once for all of them (the api's
        ``predictions`` shares them too, but stops at the first spec that fails). A spec
        that fails gives its exception."""
        manifest.check_judged(trace)
        todo = [s for s in specs if (str(trace), (s,)) not in self._memo]
        if todo and self._predict is None:
            from daydream import pipeline
            from daydream.api import open_store
            try:
                subject = pipeline.resolve(str(trace), open_store(self.store))
            except Exception as e:  # the trace itself is broken: every spec fails so
                subject, err = None, e
            for s in todo:
                key = (str(trace), (s,))
                try:
                    if subject is None:
                        raise err
                    d = pipeline.predict(subject, s).result.as_dict()
                    self._memo[key] = d
                    self.log.append((str(trace), s, d))
                except Exception as e:
                    self._memo[key] = e
        out = {}
        for s in specs:
            try:
                out[s] = self.predict(trace, [s])
            except Exception as e:
                out[s] = e
        return out

    def bounds(self, trace: str | Path) -> dict:
        """bench/bounds.py's figures for one trace file (memoized)."""
        from bench import bounds
        k = str(trace)
        manifest.check_judged(trace)
        if k not in self._bounds:
            self._bounds[k] = bounds.bounds(trace)
        return self._bounds[k]
