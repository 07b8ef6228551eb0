"""Parameter bytes per layer from the recorded weight shapes."""

from __future__ import annotations

import pyarrow as pa

from daydream.graphstore import sql_query
from daydream.graphstore.params import COLUMNS, weight_ops
from tests.conftest import DATA, stored_graphs


def test_resnet50_parameter_bytes_from_recorded_shapes(tmp_path):
    # torchvision's ResNet-50 has 25,557,032 parameters (fp32 here); the first conv is
    # 64x3x7x7 and its batch norm has a weight and a bias of 64 each.
    st = tmp_path / "s"
    stored_graphs([DATA / "kineto" / "resnet50_v100_nw0_run1.json.gz"], st)
    total = sql_query.query(st, "SELECT sum(param_bytes) FROM layer", "csv").splitlines()[1]
    assert int(total) == 25_557_032 * 4
    rows = sql_query.query(st, "SELECT layer, param_bytes FROM layer WHERE layer IN "
                        "('conv2d#0', 'batch_norm#0', 'relu_#0') ORDER BY layer", "csv")
    assert rows.splitlines()[1:] == ["batch_norm#0,512", "conv2d#0,37632", "relu_#0,"]


def test_outermost_op_and_dtype():
    # Hand-made rows: a linear (half precision, 10x20 weight + 10 bias) whose addmm child
    # must not count twice; a conv without recorded shapes (nothing to count).
    b = pa.RecordBatch.from_pylist([
        {"range_id": 1, "parent": None, "name": "aten::linear", "start_ns": 0,
         "input_dims": "[[4,20],[10,20],[10]]",
         "input_types": '["c10::Half","c10::Half","c10::Half"]'},
        {"range_id": 2, "parent": 1, "name": "aten::addmm", "start_ns": 1,
         "input_dims": "[[10],[4,20],[20,10]]", "input_types": '["c10::Half","",""]'},
        {"range_id": 3, "parent": None, "name": "aten::conv2d", "start_ns": 2,
         "input_dims": None, "input_types": None},
    ], schema=pa.schema([("range_id", pa.int64()), ("parent", pa.int64()),
                         ("name", pa.string()), ("start_ns", pa.int64()),
                         ("input_dims", pa.string()), ("input_types", pa.string())]))
    assert b.schema.names == COLUMNS
    t = weight_ops([b])
    assert t.to_pylist() == [{"range_id": 1, "start_ns": 0, "param_bytes": (200 + 10) * 2}]
