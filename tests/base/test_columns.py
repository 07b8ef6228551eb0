"""numpy_filled: an Arrow column as numpy with its nulls filled (hand-made columns: the
exact cases, with nulls and without, one chunk and several)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from daydream.base.columns import numpy_filled


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
