"""Values computed once per Arrow table object: a replay of the same graph tables (every
prediction's baseline and explained replays) and the what-ifs of one trace (which share its
range table) read the same tables again. An entry lives as long as its tables (weak
references, so the memo keeps no graph alive), and a new table at a reused id is never
mistaken for an old one."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

# at most this many entries; the memo starts afresh when full (a fleet's worker sees one
# trace's tables at a time)
MAX_ENTRIES = 64

_MEMO: dict = {}


def per_table(name: str, table: pa.Table, fn):
    """``fn(table)`` computed once per table object, under NAME."""
    return per_tables(name, (table,), fn)


def per_tables(name: str, tables: tuple[pa.Table, ...], fn):
    """``fn(*tables)`` computed once per combination of table objects, under NAME."""
    key = (name, *map(id, tables))
    hit = _MEMO.get(key)
    if hit is None or any(r() is not t for r, t in zip(hit[0], tables, strict=True)):
        if len(_MEMO) >= MAX_ENTRIES:
            _MEMO.clear()
        refs = tuple(weakref.ref(t, lambda _, k=key: _MEMO.pop(k, None)) for t in tables)
        hit = _MEMO[key] = (refs, fn(*tables))
    return hit[1]
