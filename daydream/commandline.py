"""The ``daydream`` command line, declared once and read two ways.

daydream/cli.py declares each command once: a function registered with ``@command``, whose
parameters say what the command takes (``Annotated[TYPE, Argument(...)]`` or
``Annotated[TYPE, Option(...)]``, with their help, and their defaults). ``Argument`` and
``Option`` hold typer's keyword arguments and cost nothing to import. From those functions:

- ``parse`` reads a plain command line (its options each given once, by the names declared,
  values as ``--name VALUE`` or ``--name=VALUE``, whole numbers in digits) without any CLI
  framework: importing typer, and the pydantic it checks values with, cost more than the
  work of ``daydream opts``, ``info`` and ``sql``, and 0.2 s of an ingest;
- ``typer_app`` makes the typer app of the same functions, for everything else: help, a
  command line ``parse`` does not take (a ``--no-`` form, a repeated option, a short option
  with its value attached...), and so every usage error, reported as typer reports it.

Both call the same function with the same values (tests/daydream/test_output.py checks that
for every parameter of every command), and run it through ``run``, which prints a
``DaydreamError`` as ``error: ...`` and exits 1, never with a traceback.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Annotated, get_args, get_origin


class Argument:
    """A positional parameter; KW are typer.Argument's (help, show_default...)."""

    __slots__ = ("kw",)

    def __init__(self, **kw) -> None:
        self.kw = kw


class Option:
    """An option, named DECLS (else ``--`` and the parameter's name, ``_`` as ``-``); KW are
    typer.Option's (help, show_default...)."""

    __slots__ = ("decls", "kw")

    def __init__(self, *decls: str, **kw) -> None:
        self.decls = decls
        self.kw = kw


class Param:
    """One parameter of a command as ``parse`` reads it."""

    __slots__ = ("name", "marker", "hint", "type", "many", "default", "names")

    def __init__(self, name: str, annotation, default) -> None:
        if get_origin(annotation) is not Annotated:
            raise TypeError(f"{name}: annotate it Annotated[TYPE, Argument(...) or Option(...)]")
        t, *markers = get_args(annotation)
        (self.marker,) = markers
        self.hint = t  # the type as annotated
        if isinstance(t, types.UnionType):  # X | None
            t, *none = get_args(t)
            if none != [type(None)]:
                raise TypeError(f"{name}: only X | None")
        self.many = get_origin(t) is list
        self.type = get_args(t)[0] if self.many else t
        if self.type not in (str, int, Path, bool):
            raise TypeError(f"{name}: str, int, Path or bool, or a list of them")
        self.name = name
        self.default = default
        self.names = (self.marker.decls or ("--" + name.replace("_", "-"),)
                      if isinstance(self.marker, Option) else ())

    @property
    def required(self) -> bool:
        return self.default is _NONE


_NONE = object()  # no default: required

# every command, in the order daydream/cli.py declares them (the order of the help's listing)
COMMANDS: dict[str, Command] = {}


class Command:
    __slots__ = ("fn", "settings", "_params")

    def __init__(self, fn, settings: dict) -> None:
        self.fn = fn
        self.settings = settings
        self._params: list[Param] | None = None

    @property
    def params(self) -> list[Param]:
        if self._params is None:
            code = self.fn.__code__
            names = code.co_varnames[:code.co_argcount]
            defaults = self.fn.__defaults__ or ()
            defaults = (_NONE,) * (len(names) - len(defaults)) + defaults
            self._params = [Param(n, self.fn.__annotations__[n], d)
                            for n, d in zip(names, defaults, strict=True)]
        return self._params


def declared() -> dict[str, Command]:
    """The commands daydream/cli.py declares, by name, in its order."""
    from daydream import cli  # noqa: F401  (its @command registers each)
    return COMMANDS


def command(fn=None, **settings):
    """Register FN as the command of its name; SETTINGS are typer's ``app.command`` ones."""
    def register(fn):
        COMMANDS[fn.__name__] = Command(fn, settings)
        return fn
    return register(fn) if fn is not None else register


def _value(p: Param, text: str):
    """TEXT as P's type, or None where typer may read it otherwise (then typer reads it)."""
    if p.type is int:
        digits = text[1:] if text[:1] == "-" else text
        return int(text) if digits.isascii() and digits.isdigit() else None
    return Path(text) if p.type is Path else text


def parse(argv: list[str]) -> tuple[Command, dict] | None:
    """``(command, {parameter: value})`` where ARGV is a plain command line of a declared
    command, with the values typer would pass; else None (typer's to read)."""
    commands = declared()
    if not argv or argv[0] not in commands:
        return None
    cmd = commands[argv[0]]
    params = cmd.params
    options = {n: p for p in params for n in p.names}
    got: dict = {}
    pos: list[str] = []
    it = iter(argv[1:])
    for a in it:
        if a == "--":
            pos.extend(it)
            break
        if not a.startswith("-") or a == "-":
            pos.append(a)
            continue
        name, eq, text = a.partition("=")
        p = options.get(name)
        if p is None or (p.name in got and not p.many):
            return None
        if p.type is bool:
            if eq:
                return None
            got[p.name] = True
            continue
        if eq and not name.startswith("--"):
            return None  # -f=csv: typer reads "=csv"
        if not eq:
            text = next(it, None)
            if text is None:
                return None
        v = _value(p, text)
        if v is None:
            return None
        if p.many:
            got.setdefault(p.name, []).append(v)
        else:
            got[p.name] = v
    args = [p for p in params if p.names == ()]
    for p in args:
        if p.many:  # takes the rest (only the last argument may)
            vals = [_value(p, x) for x in pos]
            if (not vals and p.required) or any(v is None for v in vals):
                return None
            got[p.name] = vals or p.default
            pos = []
        elif pos:
            v = _value(p, pos.pop(0))
            if v is None:
                return None
            got[p.name] = v
        elif p.required:
            return None
    if pos:
        return None
    for p in params:
        if p.name not in got:
            if p.required:
                return None
            got[p.name] = p.default
    return cmd, got


def typer_app(call=None):
    """The typer app of the declared commands (daydream/cli.py). Each command calls CALL
    (``call(command, {parameter: value})``), by default ``run``."""
    import inspect

    import typer

    from daydream.cli import HELP

    app = typer.Typer(add_completion=False, no_args_is_help=True,
                      pretty_exceptions_enable=False, help=HELP)
    for name, cmd in declared().items():
        sig = []
        for p in cmd.params:
            m = p.marker
            info = (typer.Option(*m.decls, **m.kw) if isinstance(m, Option)
                    else typer.Argument(**m.kw))
            ann = Annotated[p.hint, info]
            sig.append(inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                         default=inspect.Parameter.empty if p.required
                                         else p.default, annotation=ann))

        def callback(_cmd=cmd, **kw):
            return (call or run)(_cmd, kw)
        callback.__name__ = name
        callback.__doc__ = cmd.fn.__doc__
        callback.__signature__ = inspect.Signature(sig)
        callback.__annotations__ = {p.name: p.annotation for p in sig}
        app.command(name, help=_reflow(cmd.fn.__doc__), **cmd.settings)(callback)
    return app


def run(cmd: Command, kw: dict) -> None:
    """Command CMD with the values KW, as the command line runs it, whichever way it was
    read: a ``DaydreamError`` printed as ``error: ...`` with status 1 (no traceback), an
    interrupt with status 130."""
    from daydream.base.errors import DaydreamError
    try:
        cmd.fn(**kw)
    except DaydreamError as e:
        error(str(e))
        sys.exit(1)
    except KeyboardInterrupt:
        # a command that may commit traces to a store says what became of it
        writes = any(p.name == "store" for p in cmd.params) and cmd.fn.__name__ not in READERS
        error("interrupted; the store is unchanged for traces not yet committed" if writes
              else "interrupted")
        sys.exit(130)


# commands with a --store that only read it (an interrupt leaves nothing to say about it)
READERS = frozenset({"sql", "info", "jobs"})


def _reflow(doc: str | None) -> str | None:
    """A docstring as help text: each paragraph one line, which the help then wraps to the
    terminal (typer keeps a docstring's own line breaks inside a paragraph)."""
    if not doc:
        return doc
    import inspect
    paras = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paras)


def error(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None, fast: bool = True) -> None:
    """``daydream ARGV`` (else sys.argv's): read by ``parse`` where it can (unless not FAST),
    else by the typer app; either way the command runs through ``run``."""
    argv = sys.argv[1:] if argv is None else argv
    got = parse(argv) if fast else None
    if got is not None:
        run(*got)
    else:
        _typer_main(argv)


def _typer_main(argv: list[str]) -> None:
    _import_rich_utils_lean()
    import typer
    from typer._click import exceptions as cx
    try:
        rc = typer_app()(argv, standalone_mode=False)
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except cx.ClickException as e:  # usage errors from typer's bundled click
        if type(e).__name__ == "NoArgsIsHelpError":  # `daydream` alone: the help, as typer
            e.show()
            sys.exit(e.exit_code if e.exit_code else 2)
        usage_error(e)
        sys.exit(1)
    except Exception as e:
        abort = getattr(cx, "Abort", None)  # not in every typer's bundled click
        if abort is not None and isinstance(e, abort):
            sys.exit(1)
        raise


def usage_error(e) -> None:
    """A usage error of typer's click (no such option or command, a missing argument, a value
    of the wrong type) as every other error: one line, ``error: ...``, naming the command's
    help."""
    msg = " ".join(e.format_message().split()).rstrip(".")
    ctx = getattr(e, "ctx", None)
    path = getattr(ctx, "command_path", "") or "daydream"
    msg = msg[:1].lower() + msg[1:] if msg[:2] != msg[:2].upper() else msg
    error(f"{msg} (see {path} --help)")


def _import_rich_utils_lean() -> None:
    """Import typer.rich_utils (typer's help and error panels) with stand-ins for the two
    rich modules it imports only for what daydream never asks of it: ``rich.markdown``
    (markdown-it), for help in typer's "markdown" mode, and ``rich.traceback`` (rich.pretty,
    attrs), for pretty tracebacks, which the app turns off. They were 38 ms of the 0.17 s
    of ``daydream --help``. A stand-in's class imports the real module where it is used, so
    nothing typer does changes; the stand-ins leave sys.modules once rich_utils holds them."""
    import importlib

    if "typer.rich_utils" in sys.modules:
        return

    def stand_in(module: str, name: str) -> types.ModuleType:
        def real():
            return getattr(importlib.import_module(module), name)

        class Later(type):
            def __call__(cls, *args, **kw):
                return real()(*args, **kw)

            def __getattr__(cls, attr):
                return getattr(real(), attr)

            def __instancecheck__(cls, obj) -> bool:
                return isinstance(obj, real())

        m = types.ModuleType(module)
        setattr(m, name, Later(name, (), {}))
        return m

    placed = {}
    for module, name in (("rich.markdown", "Markdown"), ("rich.traceback", "Traceback")):
        if module not in sys.modules:
            placed[module] = sys.modules[module] = stand_in(module, name)
    try:
        import typer.rich_utils  # noqa: F401
    finally:
        for module, m in placed.items():
            if sys.modules.get(module) is m:
                del sys.modules[module]
