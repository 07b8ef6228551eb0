"""Arrow columns as numpy arrays, nulls filled: what every stage does to read an integer
column (ids, codes, correlations) with its nulls set to a value of its own."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def numpy_filled(values: pa.Array | pa.ChunkedArray, fill) -> np.ndarray:
    """VALUES as numpy, nulls as FILL. Arrow's fill_null is called only where there is a null:
    it cost 20-50 us a call even on a column without one, and a small trace's conversion and
    labels made some 37 of them, most on columns without nulls (3% of its CPU)."""
    if values.null_count:
        values = values.fill_null(fill)
    return values.to_numpy(zero_copy_only=False)
