"""base/columns: an Arrow column as numpy with its nulls filled (numpy_filled), and masks over
string columns (is_in, matching). Hand-made columns: the exact cases, with nulls and without,
one chunk and several, plain and dictionary-encoded."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from daydream.base.columns import is_in, matching, numpy_filled


def test_nulls_take_the_fill_value():
    out = numpy_filled(pa.array([3, None, 5, None], pa.int64()), -1)
    assert out.tolist() == [3, -1, 5, -1]
    assert out.dtype == np.int64


def test_a_column_without_nulls_keeps_its_values_and_type():
    out = numpy_filled(pa.array([7, 8, 9], pa.int32()), -1)
    assert out.tolist() == [7, 8, 9]
    assert out.dtype == np.int32


def test_chunked_columns_with_nulls_in_one_chunk():
    col = pa.chunked_array([pa.array([1, 2], pa.int64()), pa.array([None, 4], pa.int64())])
    assert numpy_filled(col, 0).tolist() == [1, 2, 0, 4]


def test_dictionary_indices_of_null_strings():
    d = pa.array(["a", None, "b", "a"]).dictionary_encode()
    assert numpy_filled(d.indices, -1).tolist() == [0, -1, 1, 0]


def test_a_sliced_column_fills_only_its_own_rows():
    col = pa.array([None, 1, 2, None, 3], pa.int64()).slice(1, 3)  # 1, 2, null
    assert numpy_filled(col, 9).tolist() == [1, 2, 9]


NAMES = ["aten::addmm", None, "aten::relu", "aten::addmm", "Optimizer.step#Adam.step"]


def _forms(values: list) -> list[pa.ChunkedArray]:
    """One column in every form a stored table gives: plain, dictionary-encoded, and as
    two chunks of each (a dictionary per chunk, as Parquet row groups give)."""
    plain = pa.array(values, pa.string())
    enc = plain.dictionary_encode()
    return [pa.chunked_array([plain]), pa.chunked_array([enc]),
            pa.chunked_array([plain[:2], plain[2:]]),
            pa.chunked_array([plain[:2].dictionary_encode(), plain[2:].dictionary_encode()])]


@pytest.mark.parametrize("form", range(4))
def test_is_in_whatever_the_form_and_null_is_never_in(form):
    col = _forms(NAMES)[form]
    assert is_in(col, {"aten::addmm", "aten::mm"}).tolist() == [True, False, False, True, False]
    # a value set that holds None does not make a null row one of them
    assert is_in(col, ("aten::relu", None)).tolist() == [False, False, True, False, False]
    assert is_in(col, ()).tolist() == [False] * 5


@pytest.mark.parametrize("form", range(4))
def test_matching_calls_the_test_once_per_distinct_value(form):
    col = _forms(NAMES)[form]
    seen: list[str] = []

    def test(w: str) -> bool:
        seen.append(w)
        return w.lower().startswith("optimizer.step#")
    assert matching(col, test).tolist() == [False, False, False, False, True]
    assert None not in seen and len(seen) == len(set(seen)) == 3


def test_masks_of_an_empty_column():
    col = pa.chunked_array([], pa.string())
    assert is_in(col, {"a"}).tolist() == []
    assert matching(col, bool).tolist() == []
