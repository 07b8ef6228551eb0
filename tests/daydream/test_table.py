"""daydream.text_table: a table fits any width without losing a character of a header or a cell,
and prints whole in a pipe."""

from __future__ import annotations

import csv
import io

import pytest

from daydream.text_table import Column, Table, layout, render, to_csv, width

NAMES = ["resnet50_v100_nw0_run1.json.gz", "resnet50_v100_rank0.json.gz",
         "resnet50_ddp_a100_rank0.json.gz", "resnet50_jan21_nw4.json.gz"]


def table() -> Table:
    t = Table("Predictions, best gain first",
              [Column("#", "right"), Column("file"), Column("optimization"),
               Column("measured ms", "right"), Column("predicted ms", "right"),
               Column("speedup", "right"), Column("note")])
    for k, n in enumerate(NAMES):
        t.add(k, n, "dataloader(workers=4)+fused_adam", f"{150 + k:.3f}", f"{100 + k:.3f}",
              "1.500x", "the first iteration is a warm-up outlier, left out of the means")
    return t


def cells_back(t: Table, out: str, limit: int) -> tuple[list[str], list[list[str]]]:
    """The headers and cells of a rendered table, read back from its columns (wrapped pieces
    joined, spaces left out)."""
    gap, ws = layout(t, limit)
    lines = out.splitlines()[1:]  # the title
    starts = [sum(ws[:i]) + len(gap) * i for i in range(len(ws))]

    def split(line: str) -> list[str]:
        return [line[a:a + w].strip() for a, w in zip(starts, ws, strict=True)]

    rule = next(k for k, x in enumerate(lines) if set(x.replace(" ", "")) == {"-"})
    heads = ["".join("".join(p).split()) for p in zip(*[split(x) for x in lines[:rule]],
                                                       strict=True)]
    rows: list[list[str]] = []
    for x in lines[rule + 1:]:
        parts = split(x)
        if parts[0]:
            rows.append(parts)
        else:
            rows[-1] = [a + b for a, b in zip(rows[-1], parts, strict=True)]
    return heads, [["".join(c.split()) for c in r] for r in rows]


def test_in_a_pipe_every_cell_is_whole_on_one_line():
    out = render(table(), None)
    for n in NAMES:
        assert n in out
    assert "…" not in out
    head = out.splitlines()[1]
    for h in ("file", "optimization", "measured ms", "predicted ms", "speedup", "note"):
        assert h in head


def _words_whole(t: Table, out: str) -> None:
    """Every word of every header and cell of T stands whole on some line of OUT."""
    lines = out.splitlines()
    for text in [c.header for c in t.columns] + [c for r in t.rows for c in r]:
        for w in text.split():
            assert any(w in x for x in lines), (w, out)


@pytest.mark.parametrize("limit", [60, 80, 100, 120])
def test_on_a_narrow_terminal_nothing_is_cut_or_broken(limit):
    t = table()
    out = render(t, limit)
    assert max(len(x) for x in out.splitlines()) <= limit
    assert "…" not in out
    _words_whole(t, out)
    if layout(t, limit)[1] is not None:
        heads, rows = cells_back(t, out, limit)
        assert heads == ["".join(c.header.split()) for c in t.columns]
        assert rows == [["".join(c.split()) for c in r] for r in t.rows]


def test_iteration_labels_stay_whole_at_80_columns():
    """The iteration table at 80 columns broke ProfilerStep#101 into 'Profile', 'rStep#1',
    '01' (issue 37)."""
    t = Table("Iterations", [Column("iteration", "right"), Column("label"),
                             Column("measured ms", "right"), Column("replayed ms", "right"),
                             Column("replay error", "right"), Column("explained ms", "right"),
                             Column("predicted ms (1)", "right"),
                             Column("predicted ms (2)", "right"), Column("note")])
    for k in range(99, 104):
        t.add(k, f"ProfilerStep#{k}", "159.246", "159.246", "+0.00%", "158.960", "149.362",
              "147.688", "warm-up" if k == 99 else "")
    for limit in (50, 80):
        out = render(t, limit)
        assert max(len(x) for x in out.splitlines()) <= limit
        _words_whole(t, out)
        for k in range(99, 104):
            assert f"ProfilerStep#{k}" in out
    # at 50 the table comes in parts, each led by the first column
    assert render(t, 50).count("iteration") >= 2


def test_a_long_note_goes_under_the_table():
    t = Table("t", [Column("a"), Column("b")], notes=["iteration 5 (drain): " + "word " * 30])
    t.add("x", "y")
    out = render(t, 40)
    assert max(len(x) for x in out.splitlines()) <= 40
    assert out.splitlines()[4].startswith("iteration 5 (drain): word")


def test_a_folded_name_joins_back_to_itself():
    """A word longer than the whole width is the one thing folded (in the records a table
    too wide for columns prints as)."""
    t = Table("", [Column("file"), Column("ms", "right")])
    t.add("a_very_long_trace_name_without_spaces_at_all.json.gz", "1.000")
    out = render(t, 20)
    assert max(len(x) for x in out.splitlines()) <= 20
    body = [x for x in out.splitlines() if x.strip() and "ms: " not in x]
    joined = "".join(x.replace("file: ", "").strip() for x in body)
    assert joined == "a_very_long_trace_name_without_spaces_at_all.json.gz"


def test_too_narrow_for_columns_prints_records():
    out = render(table(), 24)
    assert max(len(x) for x in out.splitlines()) <= 24
    assert "optimization: " in out or "optimization:" in out


def test_width_follows_columns_in_a_pipe(monkeypatch):
    monkeypatch.setenv("COLUMNS", "77")
    assert width() == 77
    monkeypatch.delenv("COLUMNS")
    assert width() is None  # pytest's stdout is not a terminal


def test_csv_holds_the_records():
    t = table()
    t.records = [{"file": n, "speedup": 1.5} for n in NAMES]
    rows = list(csv.DictReader(io.StringIO(to_csv([t]))))
    assert [r["file"] for r in rows] == NAMES and rows[0]["speedup"] == "1.5"
