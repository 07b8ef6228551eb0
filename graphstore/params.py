"""Parameter bytes per layer from the weight shapes a trace recorded (``record_shapes=True``).

Distributed what-ifs (``ddp``, ``p3``, ``dgc``) need the gradient bytes each layer produces.
Where the profiler recorded input shapes, the parameters are the weight and bias inputs of the
ops that own them (convolutions, linear layers, normalizations, embeddings); where it did not,
the user gives ``--param-bytes``. The shapes are in the range table's ``input_dims`` column,
which the graph build does not load (it is large); :func:`weight_ops` streams just the rows
of those ops out of the stored Parquet file.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# op -> positions of its parameter inputs in the recorded input shapes (PyTorch's ATen
# signatures: conv*(input, weight, bias, ...), linear(input, weight, bias),
# addmm(bias, input, weight.t()), batch_norm(input, weight, bias, running_mean, ...),
# layer_norm/group_norm(input, shape or groups, weight, bias, ...), embedding(weight, ...)).
PARAM_INPUTS = {
    "aten::conv1d": (1, 2), "aten::conv2d": (1, 2), "aten::conv3d": (1, 2),
    "aten::conv_transpose1d": (1, 2), "aten::conv_transpose2d": (1, 2),
    "aten::conv_transpose3d": (1, 2), "aten::convolution": (1, 2),
    "aten::linear": (1, 2), "aten::addmm": (0, 2),
    "aten::batch_norm": (1, 2), "aten::layer_norm": (2, 3), "aten::group_norm": (2, 3),
    "aten::embedding": (0,), "aten::embedding_bag": (0,),
}
# bytes per element of the dtype names the profiler records (input_types); unknown: 4
DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "Half": 2,
               "BFloat16": 2, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1}
COLUMNS = ["range_id", "parent", "name", "start_ns", "input_dims", "input_types"]
WEIGHT_OPS_SCHEMA = pa.schema([("range_id", pa.int64()), ("start_ns", pa.int64()),
                               ("param_bytes", pa.int64())])


@lru_cache(maxsize=1 << 14)
def _bytes(name: str, dims_json: str | None, types_json: str | None) -> int:
    """Parameter bytes of one op call from its recorded shapes (0 where none recorded). Worked
    out once per distinct call: a model's layers repeat their shapes (BERT-small's 12 encoder
    layers), and so do the traces of one fleet."""
    if not dims_json:
        return 0
    try:
        dims = orjson.loads(dims_json)
        types = orjson.loads(types_json) if types_json else []
    except orjson.JSONDecodeError:
        return 0
    total = 0
    for k in PARAM_INPUTS[name]:
        if k < len(dims) and isinstance(dims[k], list) and dims[k] and all(
                isinstance(x, int) for x in dims[k]):
            size = DTYPE_BYTES.get(types[k] if k < len(types) else "", 4)
            total += math.prod(dims[k]) * size  # (np.prod: 6 us a call, 40x)
    return total


def weight_ops(batches: Iterable[pa.RecordBatch]) -> pa.Table:
    """The outermost parameter-owning op calls (an ``aten::convolution`` inside an
    ``aten::conv2d`` is the same weights) with their parameter bytes, from record batches of
    the range table with ``COLUMNS``."""
    ids, parents, starts, nbytes = [], [], [], []
    names = pa.array(list(PARAM_INPUTS))
    for b in batches:
        b = b.filter(pc.is_in(b.column("name"), value_set=names))
        if not b.num_rows:
            continue
        for rid, par, name, start, dims, types in zip(*(b.column(c).to_pylist()
                                                        for c in COLUMNS), strict=True):
            ids.append(rid)
            parents.append(-1 if par is None else par)
            starts.append(start)
            nbytes.append(_bytes(name, dims, types))
    ids_a, par_a = np.asarray(ids, np.int64), np.asarray(parents, np.int64)
    outer = ~np.isin(par_a, ids_a)
    keep = outer & (np.asarray(nbytes, np.int64) > 0)
    return pa.table({"range_id": ids_a[keep], "start_ns": np.asarray(starts, np.int64)[keep],
                     "param_bytes": np.asarray(nbytes, np.int64)[keep]},
                    schema=WEIGHT_OPS_SCHEMA)


def weight_ops_from_parquet(path: str | Path, batch_rows: int = 65_536) -> pa.Table:
    """:func:`weight_ops` of a stored range table, read in batches (bounded memory)."""
    f = pq.ParquetFile(path)
    if "input_dims" not in f.schema_arrow.names or not _any_shapes(f):
        return WEIGHT_OPS_SCHEMA.empty_table()
    return weight_ops(f.iter_batches(batch_size=batch_rows, columns=COLUMNS))


def _any_shapes(f: pq.ParquetFile) -> bool:
    """Whether any row has input_dims, from the row groups' statistics where written (a trace
    profiled without record_shapes then costs no column read)."""
    col = f.schema_arrow.names.index("input_dims")
    md = f.metadata
    for r in range(md.num_row_groups):
        rg = md.row_group(r)
        st = rg.column(col).statistics
        if st is None or not st.has_null_count or st.null_count < rg.num_rows:
            return True
    return False


def layer_param_bytes(weights: pa.Table, range_labels: pa.Table, iterations: pa.Table
                      ) -> dict[str, int]:
    """Parameter bytes per layer: its weight ops' bytes in the first iteration in which the
    layer ran one (a layer called twice in an iteration counts twice: shared weights are not
    told apart)."""
    if not weights.num_rows or not range_labels.num_rows:
        return {}
    lab = dict(zip(range_labels["range_id"].to_pylist(), range_labels["layer"].to_pylist(),
                   strict=True))
    its = sorted(zip(iterations["start_ns"].to_pylist(), iterations["end_ns"].to_pylist(),
                     strict=True)) if iterations.num_rows else []
    starts = np.asarray([s for s, _ in its], np.int64)
    per: dict[str, dict[int, int]] = {}
    for rid, t, nb in zip(weights["range_id"].to_pylist(), weights["start_ns"].to_pylist(),
                          weights["param_bytes"].to_pylist(), strict=True):
        layer = lab.get(rid)
        if layer is None:
            continue
        k = int(np.searchsorted(starts, t, side="right")) - 1 if len(starts) else 0
        if len(starts) and (k < 0 or t >= its[k][1]):
            continue  # outside every iteration (warm-up before the first step)
        d = per.setdefault(layer, {})
        d[k] = d.get(k, 0) + nb
    return {layer: d[min(d)] for layer, d in per.items()}
