"""The optimizations by name, their typed parameters, and ``rewrite`` (the stage's entry point).

An optimization is a function ``fn(g: Graph, ctx: Context, *, param: type = default, ...) ->
Graph`` in a module of ``transforms/opts``, registered with ``@register("name")``. Its keyword
parameters (annotated int, float, str or bool) are what a spec may set; its docstring's first
paragraph is what ``daydream opts`` prints.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from daydream.base.errors import DaydreamError
from daydream.transforms import spec as _spec
from daydream.transforms.primitives import Graph


@dataclass
class Context:
    """What an optimization may know beside the graph. ``daydream.pipeline.context`` builds it
    for every prediction (one trace, one job, a fleet worker's), so that they all agree.

    - ``device``: the GPU the trace ran on, an entry of the trace table's ``devices`` JSON
      (``{"name": "Tesla V100-DGXS-32GB", "computeMajor": 7, ...}``); None: unknown;
    - ``notes``: receives one line per modelling choice an optimization made;
    - ``activity``: reads one of the trace's activity tables by name, e.g. ``activity("range")``
      for the input shapes that offload sizes its copies by (None: no store; optimizations
      that read one fall back to their parameters);
    - ``world_size``: ranks of the traced job (a trace's distributedInfo; a job graph's own
      ranks count instead);
    - ``param_bytes``: the model's parameter bytes, when the user gives them;
    - ``applied``: the optimizations of the chain applied so far, in order (``rewrite`` fills
      it): a model that cannot follow another (``gpu`` reads kernel classes from names that
      ``amp`` does not rewrite) says so;
    - ``memory``: what the chain did so far to a step's memory (``transforms.memory``: batch
      scale, checkpointed layers, offloaded bytes, AMP), so that each memory note is of the
      whole chain;
    - ``link``: the communication link (``transforms.comm.Link``) an optimization earlier in the
      chain put the job on (``ddp``), for the distributed what-ifs after it: they must not fit
      a bandwidth to collectives that the chain itself inserted."""

    device: dict | None = None
    notes: list[str] = field(default_factory=list)
    activity: Callable[[str], pa.Table] | None = None
    world_size: int | None = None
    param_bytes: int | None = None
    applied: list[str] = field(default_factory=list)
    memory: dict = field(default_factory=dict)
    link: object | None = None


@dataclass
class Param:
    name: str
    type: type
    default: object
    doc: str = ""


@dataclass
class Opt:
    name: str
    fn: Callable
    params: list[Param]
    doc: str
    # removes CPU work the profiler inflated: predictions compare it without the profiler
    removes_cpu: bool = False
    # a spec that runs it: its name where every parameter has a default, else the example
    # given at registration (what `make accuracy` asks of every trace)
    example: str = ""
    # only removes or shrinks work (daydream.gates: a chain of these must not predict a slower
    # step); the rest insert work or change the machine
    shrinks: bool = False

    @property
    def summary(self) -> str:
        return self.doc.strip().split("\n\n")[0].replace("\n", " ")

    def signature(self) -> str:
        if not self.params:
            return self.name
        ps = ", ".join(f"{p.name}: {p.type.__name__}" +
                       ("" if p.default is inspect.Parameter.empty else f" = {p.default!r}")
                       for p in self.params)
        return f"{self.name}({ps})"


_REGISTRY: dict[str, Opt] = {}
_LOADED = False


def register(name: str, removes_cpu: bool = False, example: str = "", shrinks: bool = False):
    """Register an optimization; ``removes_cpu``: it removes host work (launch calls, the
    Python between ops) whose profiled cost includes the profiler's own, so its predictions are
    made on the job without the profiler (``daydream.pipeline``). ``example``: a spec that runs
    it, required where a parameter has no default (``batch(size=64)``); checked on first
    use (``examples``). ``shrinks``: it only removes or shrinks work, never inserts any nor
    changes the machine (the ``no_slowdown`` gate of ``daydream.gates`` holds it to that)."""
    def deco(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        hints = inspect.get_annotations(fn, eval_str=True)
        params = []
        for p in list(sig.parameters.values())[2:]:
            t = hints.get(p.name, str)
            params.append(Param(p.name, t, p.default))
        required = [p.name for p in params if p.default is inspect.Parameter.empty]
        if required and not example:
            raise ValueError(f"optimization {name!r} has parameters without a default "
                             f"({', '.join(required)}): register it with an example spec")
        _REGISTRY[name] = Opt(name, fn, params, inspect.getdoc(fn) or "", removes_cpu,
                              example or name, shrinks)
        return fn
    return deco


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    import daydream.transforms.opts as pkg
    for m in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"daydream.transforms.opts.{m.name}")
    _LOADED = True


def opts() -> dict[str, Opt]:
    _load()
    return dict(sorted(_REGISTRY.items()))


def examples() -> dict[str, str]:
    """Every optimization's example spec (its name where every parameter has a default),
    each checked: a spec that does not parse or bind is an error here, not in a benchmark."""
    out = {}
    for o in opts().values():
        steps = check(o.example)
        if [s.name for s, _ in steps] != [o.name]:
            raise ValueError(f"optimization {o.name!r}: example {o.example!r} runs "
                             f"{'+'.join(s.name for s, _ in steps)}")
        out[o.name] = o.example
    return out


def list_opts() -> list[dict]:
    """Every optimization: name, signature, parameters and summary (for ``daydream opts``)."""
    return [{"name": o.name, "signature": o.signature(), "summary": o.summary, "doc": o.doc,
             "example": o.example,
             "params": [{"name": p.name, "type": p.type.__name__,
                         "default": None if p.default is inspect.Parameter.empty
                         else p.default} for p in o.params]}
            for o in opts().values()]


def _coerce(opt: Opt, p: Param, v):
    t = p.type
    if t is float and isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if t is int and isinstance(v, int) and not isinstance(v, bool):
        return v
    if t is bool and isinstance(v, bool):
        return v
    if t is str and isinstance(v, (str, int, float)) and not isinstance(v, bool):
        return str(v)
    raise DaydreamError(f"{opt.name}: parameter {p.name!r} must be {t.__name__}, got {v!r}")


def bind(term: _spec.Term) -> tuple[Opt, dict]:
    """The optimization a spec term names and its checked, typed arguments."""
    known = opts()
    opt = known.get(term.name)
    if opt is None:
        raise DaydreamError(f"unknown optimization {term.name!r}; known: "
                            f"{', '.join(known)}")
    names = [p.name for p in opt.params]
    plist = ", ".join(names) or "none"
    if len(term.args) > len(opt.params):
        raise DaydreamError(f"{opt.name}: takes {len(opt.params)} parameters "
                            f"({plist}), got {len(term.args)} positional")
    kw = dict(zip(names, term.args, strict=False))
    for k, v in term.kwargs.items():
        if k not in names:
            raise DaydreamError(f"{opt.name}: unknown parameter {k!r}; parameters: {plist}")
        if k in kw:
            raise DaydreamError(f"{opt.name}: parameter {k!r} given twice")
        kw[k] = v
    out = {}
    for p in opt.params:
        if p.name in kw:
            out[p.name] = _coerce(opt, p, kw[p.name])
        elif p.default is inspect.Parameter.empty:
            raise DaydreamError(f"{opt.name}: missing parameter {p.name!r}; usage: "
                                f"{opt.signature()}")
    return opt, out


def shrinking(names: list[str]) -> bool:
    """Whether every optimization named was registered with ``shrinks`` (an unknown name is
    not)."""
    known = opts()
    return all(n in known and known[n].shrinks for n in names)


def removes_cpu(spec: str | None) -> bool:
    """Whether a spec chain has an optimization registered with ``removes_cpu``."""
    return bool(spec) and any(o.removes_cpu for o, _ in check(spec))


def check(spec: str) -> list[tuple[Opt, dict]]:
    """Parse and check a spec chain without applying it."""
    return [bind(t) for t in _spec.parse(spec)]


def rewrite(tables: dict[str, pa.Table], spec: str, ctx: Context | None = None
            ) -> dict[str, pa.Table]:
    """The graph tables rewritten by a spec chain (``amp+fused_adam``), applied left to right.

    ``ctx``: what the optimizations may know beside the graph (see ``Context``); None knows
    nothing, and each optimization falls back to the defaults it documents. The chain shares
    it, so an optimization that changes what the next one sees (``ddp`` sets the world size)
    tells it there; ``ctx.notes`` receives one line per modelling choice made (e.g. the GPU
    family assumed). Build a fresh one per chain."""
    return apply(Graph.from_tables(tables), spec, ctx).tables()


def apply(g: Graph, spec: str, ctx: Context | None = None) -> Graph:
    """``rewrite`` on a Graph: the graph a spec chain makes of G (G itself is left as it is),
    for a caller that rewrites one graph several times and converts it once."""
    steps = check(spec)  # all errors before any work
    ctx = ctx if ctx is not None else Context()
    for opt, kw in steps:
        g = opt.fn(g, ctx, **kw)
        ctx.applied.append(opt.name)
    return g
