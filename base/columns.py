"""Arrow columns as numpy arrays: an integer column (ids, codes, correlations) with its nulls
set to a value of its own, and masks over string columns (names, kinds) tested once per
distinct value."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def numpy_filled(values: pa.Array | pa.ChunkedArray, fill) -> np.ndarray:
    """VALUES as numpy, nulls as FILL. Arrow's fill_null is called only where there is a null:
    it cost 20-50 us a call even on a column without one, and a small trace's conversion and
    labels made some 37 of them, most on columns without nulls (3% of its CPU)."""
    if values.null_count:
        values = values.fill_null(fill)
    return values.to_numpy(zero_copy_only=False)


def is_in(col: pa.Array | pa.ChunkedArray, values) -> np.ndarray:
    """Whether each value of a string column, plain or dictionary-encoded, is one of VALUES
    (null: no). A dictionary column is tested once per distinct value through its dictionary
    (a string per row, and Arrow's own is_in, which decodes it, cost a millisecond a small
    trace's prediction)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(arr.type):
        allowed = frozenset(values)
        return _per_distinct(arr, lambda w: w in allowed)
    return numpy_filled(pc.is_in(arr, value_set=pa.array(list(values), arr.type),
                                 skip_nulls=True), False)  # a null row is in no set


def matching(col: pa.Array | pa.ChunkedArray, test) -> np.ndarray:
    """Whether each value of a string column, plain or dictionary-encoded, passes TEST, a
    function of one string (null: no); TEST is called once per distinct value."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    return _per_distinct(arr, test)


def _per_distinct(arr: pa.DictionaryArray, test) -> np.ndarray:
    lut = np.array([w is not None and bool(test(w)) for w in arr.dictionary.to_pylist()]
                   + [False], bool)  # the last: a null row's (its index filled with -1)
    return lut[numpy_filled(arr.indices, -1).astype(np.int64, copy=False)]
