"""Tables for people and for machines, from one description.

The same ``Table`` prints as aligned plain columns (a terminal or a pipe), as CSV or as JSON.
On a terminal the table is fitted to its width by wrapping the widest columns: headers and
cells wrap between words, never inside one, so nothing is ever cut off or broken; a table too
wide for even that is printed in parts, each with the first column and as many of the others
as fit; and where not even one fits beside the first, as one block of ``column: value``
lines per row (where a word longer than the whole width is the only thing folded). Into a
pipe (no terminal, no ``COLUMNS``) the columns take the width they need: a script reading the
text gets whole names.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import sys
import textwrap
from dataclasses import dataclass, field

GAP = "  "
# A column is not squeezed below this many characters while another can give up width.
MIN_WRAP = 6


@dataclass
class Column:
    header: str
    align: str = "left"  # or "right" (numbers)
    key: str = ""  # the field name in CSV and JSON; the header when empty

    @property
    def name(self) -> str:
        return self.key or self.header.replace(" ", "_")


@dataclass
class Table:
    title: str
    columns: list[Column]
    rows: list[list[str]] = field(default_factory=list)
    # machine-readable rows (CSV/JSON): raw values keyed by column name; the text cells
    # where not given
    records: list[dict] | None = None
    bold_last: bool = False  # the last row is a total (a rule is drawn above it)
    notes: list[str] = field(default_factory=list)  # lines printed under the table

    def add(self, *cells: object) -> None:
        self.rows.append(["" if c is None else str(c) for c in cells])

    def data(self) -> list[dict]:
        if self.records is not None:
            return self.records
        return [{c.name: v for c, v in zip(self.columns, r, strict=True)} for r in self.rows]


def width() -> int | None:
    """The width to fit text to: the terminal's (``COLUMNS`` first), or ``COLUMNS`` when set
    in a pipe; None (no limit) in a pipe without it."""
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def _wrap(text: str, w: int) -> list[str]:
    """TEXT in lines of at most W characters: broken between words, a longer word folded."""
    out = []
    for para in text.split("\n"):
        out += textwrap.wrap(para, w, break_long_words=True, break_on_hyphens=False) or [""]
    return out


def _natural(t: Table) -> list[int]:
    return [max([len(c.header)] + [len(r[i]) for r in t.rows]) for i, c in enumerate(t.columns)]


def _longest_word(text: str) -> int:
    return max((len(w) for w in text.split()), default=0)


def _floor(t: Table, i: int, cells_wrap: bool) -> int:
    """The narrowest column I may get: its longest header word, and its longest cell unless
    CELLS_WRAP, then its longest word in a cell (numbers never wrap; no word is broken)."""
    head = _longest_word(t.columns[i].header) or 1
    cells = max([len(r[i]) for r in t.rows] or [0])
    if t.columns[i].align == "right" or not cells_wrap:
        return max(head, cells)
    words = max([_longest_word(r[i]) for r in t.rows] or [0])
    return max(head, min(max(MIN_WRAP, words), cells))


def fit(t: Table, limit: int | None, gap: int = len(GAP),
        cells_wrap: bool = True) -> list[int] | None:
    """Column widths that fit LIMIT with GAP spaces between columns (None: natural widths),
    by narrowing the widest columns first; only headers wrap unless CELLS_WRAP. None when even
    the narrowest layout does not fit."""
    ws = _natural(t)
    if limit is None:
        return ws
    floors = [_floor(t, i, cells_wrap) for i in range(len(ws))]
    total = sum(ws) + gap * (len(ws) - 1)
    while total > limit:
        cands = [i for i in range(len(ws)) if ws[i] > floors[i]]
        if not cands:
            return None
        i = max(cands, key=lambda k: (ws[k], -k))
        ws[i] -= 1
        total -= 1
    return ws


# How a table too wide for LIMIT is narrowed, in order of preference: wrap headers only, two
# spaces between columns, then one; then wrap cells too.
LAYOUTS = ((GAP, False), (" ", False), (GAP, True), (" ", True))


def layout(t: Table, limit: int | None) -> tuple[str, list[int] | None]:
    """(the gap between columns, their widths) that ``render`` uses at LIMIT; widths None when
    the table is printed as records."""
    for gap, wrap in LAYOUTS:
        ws = fit(t, limit, len(gap), wrap)
        if ws is not None:
            return gap, ws
    return GAP, None


def parts(t: Table, limit: int | None) -> list[Table] | None:
    """T cut into tables of its first column and as many of the others as fit LIMIT
    (None: not even one other column fits beside the first)."""
    out: list[list[int]] = []
    cur: list[int] = []

    def sub(cols: list[int]) -> Table:
        return Table("", [t.columns[0]] + [t.columns[i] for i in cols],
                     [[r[0]] + [r[i] for i in cols] for r in t.rows], bold_last=t.bold_last)
    for i in range(1, len(t.columns)):
        if layout(sub(cur + [i]), limit)[1] is not None:
            cur.append(i)
        elif cur:
            out.append(cur)
            cur = [i]
            if layout(sub(cur), limit)[1] is None:
                return None
        else:
            return None
    if cur:
        out.append(cur)
    return [sub(c) for c in out] if len(out) > 1 else None


def render(t: Table, limit: int | None = None) -> str:
    """The table as text, at most LIMIT characters a line (None: no limit)."""
    lines = []
    if t.title:
        lines += _wrap(t.title, limit) if limit else [t.title]
    if not t.rows:
        return "\n".join(lines + ["  (none)"] + _notes(t, limit)) + "\n"
    gap, ws = layout(t, limit)
    if ws is None:
        cut = parts(t, limit)
        if cut is None:
            return "\n".join(lines + _records(t, limit) + _notes(t, limit)) + "\n"
        body = [render(p, limit).rstrip("\n") for p in cut]
        return "\n".join(lines + ["\n\n".join(body)] + _notes(t, limit)) + "\n"

    def block(cells: list[str]) -> list[str]:
        parts = [_wrap(c, w) if len(c) > w else [c] for c, w in zip(cells, ws, strict=True)]
        h = max(len(p) for p in parts)
        out = []
        for k in range(h):
            row = []
            for i, p in enumerate(parts):
                s = p[k] if k < len(p) else ""
                row.append(s.rjust(ws[i]) if t.columns[i].align == "right" else s.ljust(ws[i]))
            out.append(gap.join(row).rstrip())
        return out

    # headers wrap between words only; a header line is bottom-aligned over its column
    heads = [_wrap(c.header, w) for c, w in zip(t.columns, ws, strict=True)]
    hh = max(len(h) for h in heads)
    heads = [[""] * (hh - len(h)) + h for h in heads]
    for k in range(hh):
        lines.append(gap.join(h[k].rjust(w) if c.align == "right" else h[k].ljust(w)
                              for h, w, c in zip(heads, ws, t.columns, strict=True)).rstrip())
    rule = gap.join("-" * w for w in ws)
    lines.append(rule)
    for n, r in enumerate(t.rows):
        if t.bold_last and n == len(t.rows) - 1 and n:
            lines.append(rule)
        lines += block(r)
    return "\n".join(lines + _notes(t, limit)) + "\n"


def _notes(t: Table, limit: int | None) -> list[str]:
    out = []
    for n in t.notes:
        out += textwrap.wrap(n, limit, subsequent_indent="  ", break_on_hyphens=False,
                             break_long_words=False) if limit else [n]
    return out


def _records(t: Table, limit: int | None) -> list[str]:
    """One block of ``header: value`` lines per row (a table too wide to be one)."""
    key_w = max(len(c.header) for c in t.columns)
    out = []
    for r in t.rows:
        out.append("")
        for c, v in zip(t.columns, r, strict=True):
            head = f"{c.header.rjust(key_w)}: "
            w = max((limit or 10**6) - len(head), 10)
            for k, line in enumerate(_wrap(v, w) if v else [""]):
                out.append((head if k == 0 else " " * len(head)) + line)
    return out


def to_csv(tables: list[Table]) -> str:
    """CSV of the tables (one header line each; tables after the first follow a blank line)."""
    buf = io.StringIO()
    for k, t in enumerate(tables):
        if k:
            buf.write("\n")
        rows = t.data()
        names = list(rows[0]) if rows else [c.name for c in t.columns]
        w = csv.DictWriter(buf, names, lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _plain(v) for k, v in r.items()})
    return buf.getvalue()


def _plain(v: object) -> object:
    if isinstance(v, list | tuple):
        return " ".join(str(x) for x in v)
    return "" if v is None else v


def paragraph(text: str, limit: int | None, indent: str = "") -> str:
    """TEXT wrapped to LIMIT (when given), continuation lines indented by INDENT."""
    if not limit:
        return text
    return "\n".join(textwrap.wrap(text, limit, subsequent_indent=indent,
                                   break_on_hyphens=False, break_long_words=True))


def fit_rows(header: list[str], numeric: list[bool], rows: list[list[str]],
             limit: int | None) -> str:
    """HEADER and ROWS (text cells; NUMERIC: right-aligned) as a table fitted to LIMIT
    (``daydream sql``: a query's result laid out as every other table of the CLI)."""
    t = Table("", [Column(h, "right" if n else "left") for h, n in zip(header, numeric,
                                                                       strict=True)])
    t.rows = [list(r) for r in rows]
    return render(t, limit)
