"""Parsing optimization specs: ``amp``, ``dataloader(workers=4)``, ``amp+fused_adam``,
``scale(select="kind = 'kernel' AND name LIKE '%gemm%'", factor=0.5)``.

Grammar: ``chain := term ('+' term)*``, ``term := NAME ['(' [arg (',' arg)*] ')']``,
``arg := [NAME '='] value``, ``value := 'str' | "str" | number | true | false | bare-word``.
A ``+`` inside quotes or parentheses does not split terms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from daydream.base.errors import DaydreamError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUM = re.compile(r"[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?)$")


@dataclass
class Term:
    name: str
    args: list = field(default_factory=list)          # positional values
    kwargs: dict = field(default_factory=dict)        # name -> value
    text: str = ""


def _value(tok: str):
    t = tok.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    if _NUM.match(t):
        return float(t) if any(c in t for c in ".eE") else int(t)
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    if not t:
        raise ValueError("empty value")
    return t  # bare word (e.g. kind=adamw)


def _split(s: str, sep: str) -> list[str]:
    """Split on ``sep`` outside quotes and parentheses."""
    out, depth, quote, cur = [], 0, None, []
    for ch in s:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise DaydreamError(f"bad spec {s!r}: unbalanced ')'")
        elif ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    if quote:
        raise DaydreamError(f"bad spec {s!r}: unterminated quote")
    if depth:
        raise DaydreamError(f"bad spec {s!r}: unbalanced '('")
    out.append("".join(cur))
    return out


def parse(spec: str) -> list[Term]:
    """The terms of a spec chain, in order."""
    if not spec or not spec.strip():
        raise DaydreamError("empty optimization spec")
    terms = []
    for raw in _split(spec, "+"):
        text = raw.strip()
        m = _NAME.match(text)
        if not m:
            raise DaydreamError(f"bad spec term {text!r}: expected a name like amp or "
                                "dataloader(workers=4)")
        name, rest = m.group(0), text[m.end():].strip()
        term = Term(name, text=text)
        if rest:
            if not (rest.startswith("(") and rest.endswith(")")):
                raise DaydreamError(f"bad spec term {text!r}: expected '(' after {name!r}")
            inner = rest[1:-1].strip()
            if inner:
                for a in _split(inner, ","):
                    a = a.strip()
                    km = re.match(r"([A-Za-z_][A-Za-z0-9_]*)\s*=(?!=)", a)
                    try:
                        if km:
                            key = km.group(1)
                            if key in term.kwargs:
                                raise DaydreamError(f"{name}: parameter {key!r} given twice")
                            term.kwargs[key] = _value(a[km.end():])
                        else:
                            if term.kwargs:
                                raise DaydreamError(f"{name}: positional value {a!r} after "
                                                    "named ones")
                            term.args.append(_value(a))
                    except ValueError:
                        raise DaydreamError(f"{name}: empty value in {text!r}") from None
        terms.append(term)
    return terms
