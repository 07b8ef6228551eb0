"""docs/accuracy.md and docs/accuracy.json as blocks per section, so that one section can be
rerun (``--only``) and put back in its place without rerunning the others."""

from __future__ import annotations

import re

_BLOCK = re.compile(r"<!-- section: (?P<name>[\w.-]+) -->\n(?P<body>.*?)"
                    r"<!-- /section: (?P=name) -->\n?", re.S)


def block(name: str, lines: list[str]) -> str:
    body = "\n".join(lines).rstrip("\n") + "\n"
    return f"<!-- section: {name} -->\n{body}<!-- /section: {name} -->\n"


def split(text: str) -> tuple[str, dict[str, str]]:
    """(the text before the first block, {name: block text}) of a written file."""
    blocks = {m["name"]: m.group(0) for m in _BLOCK.finditer(text)}
    m = _BLOCK.search(text)
    head = text[:m.start()] if m else text
    return head, blocks


def merge(old: str | None, head: str, new: dict[str, str], order: list[str]) -> str:
    """The file with the blocks in ``new`` replaced or added, the others kept as they were.
    Blocks come in ``order``; blocks of sections no longer registered stay at the end. A file
    written before the harness had blocks is replaced whole."""
    blocks = {}
    if old:
        _, blocks = split(old)
    blocks.update(new)
    names = [n for n in order if n in blocks] + [n for n in blocks if n not in order]
    return head.rstrip("\n") + "\n\n" + "\n".join(blocks[n] for n in names)


def merge_json(old: dict | None, new: dict[str, dict], meta: dict) -> dict:
    out = dict(old or {})
    sections = dict(out.get("sections") or {})
    sections.update(new)
    out.update(meta)
    out["sections"] = sections
    return out
