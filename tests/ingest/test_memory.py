"""The allocator's records ([memory] instant events, profile_memory=True) -> the memory table,
checked against the raw JSON read with the standard library (no code shared with the
scanner)."""

from __future__ import annotations

import gzip
import json
from decimal import ROUND_HALF_UP, Decimal

import numpy as np

from daydream.ingest import schema
from daydream.ingest.kineto import read_kineto
from tests.conftest import DATA

# BERT inference on an H100 (TraceLens, MIT; tests/data/crossgpu/SOURCE.md): 236 records
# with totals, 218 of GPU 0 and 18 of the host
BERT = DATA / "crossgpu" / "bert_small_uncased_h100_inference.json.gz"
# ResNet-50 on a V100 in the 2021 schema (kineto tb_plugin sample): records without totals
RESNET_2021 = DATA / "kineto" / "resnet50_v100_nw0_run1.json.gz"


def _raw(path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    return [e for e in events if e.get("name") == "[memory]"]


def _ns(us) -> int:
    return int((Decimal(us) * 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def _device(args: dict) -> int:
    return -1 if args["Device Type"] == 0 else args["Device Id"]


def test_every_record_of_a_real_trace_is_a_row():
    raw = _raw(BERT)
    m = read_kineto(BERT).tables["memory"]
    assert m.schema == schema.MEMORY.schema
    assert m.num_rows == len(raw) == 236
    # the file's records are in time order already: row for row
    t = m.to_pydict()
    assert t["ts_ns"] == [_ns(e["ts"]) for e in raw]
    assert t["device"] == [_device(e["args"]) for e in raw]
    assert t["bytes"] == [e["args"]["Bytes"] for e in raw]
    assert t["allocated_bytes"] == [e["args"]["Total Allocated"] for e in raw]
    assert t["reserved_bytes"] == [e["args"]["Total Reserved"] for e in raw]


def test_the_peak_per_device_is_the_largest_total_in_the_file():
    raw = _raw(BERT)
    want: dict[int, int] = {}
    for e in raw:
        d = _device(e["args"])
        want[d] = max(want.get(d, 0), e["args"]["Total Allocated"])
    assert want == {-1: 16, 0: 101_305_344}  # read off the file once, by hand
    m = read_kineto(BERT).tables["memory"]
    dev = m["device"].to_numpy()
    alloc = m["allocated_bytes"].to_numpy()
    assert {int(d): int(alloc[dev == d].max()) for d in np.unique(dev)} == want


def test_records_of_the_2021_schema_have_no_totals():
    raw = _raw(RESNET_2021)
    conv = read_kineto(RESNET_2021)
    m = conv.tables["memory"]
    assert m.num_rows == len(raw) == 12_838
    assert m["allocated_bytes"].null_count == m["reserved_bytes"].null_count == m.num_rows
    assert conv.stats.get("memory_record_without_totals") == len(raw)
    assert conv.stats.get("memory_record_malformed") == 0
    sums: dict[int, int] = {}
    for e in raw:
        d = _device(e["args"])
        sums[d] = sums.get(d, 0) + e["args"]["Bytes"]
    dev, b = m["device"].to_numpy(), m["bytes"].to_numpy()
    assert {int(d): int(b[dev == d].sum()) for d in np.unique(dev)} == sums


def test_a_trace_without_records_has_an_empty_table():
    conv = read_kineto(DATA / "kineto" / "simple_add_a100.json.gz")
    m = conv.tables["memory"]
    assert m.num_rows == 0 and m.schema == schema.MEMORY.schema
    assert conv.stats.get("memory_record_malformed") == 0


def test_malformed_records_are_counted_and_skipped(tmp_path):
    """Hand-made: three good records, four damaged ones, and one without totals; the trace
    is read, the damaged records are counted, not dropped silently."""
    def mem(ts, **args):
        e = {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
             "tid": 1, "args": args}
        if ts is not None:
            e["ts"] = ts
        return e

    good = dict(Bytes=512, **{"Total Allocated": 1536, "Total Reserved": 2048,
                              "Device Id": 0, "Device Type": 1})
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 0,
         "dur": 100},
        mem(10, **good),
        mem(11, Bytes=-512, **{"Total Allocated": 1024, "Total Reserved": 2048,
                                "Device Id": -1, "Device Type": 0}),   # the host
        mem(12, Bytes=64, **{"Total Allocated": 64, "Total Reserved": 0,
                              "Device Type": 0}),                      # host, no Device Id
        mem(13, **{k: v for k, v in good.items() if k != "Bytes"}),    # no Bytes
        mem(14, **{**good, "Bytes": "lots"}),                          # not a number
        mem(15, **{**good, "Device Id": True}),                        # no device
        mem(None, **good),                                             # no time
        mem(16, Bytes=128, **{"Device Id": 1, "Device Type": 1}),      # no totals
        {"ph": "i", "cat": "cpu_instant_event", "name": "other", "pid": 1, "tid": 1,
         "ts": 17},
    ]
    f = tmp_path / "memory.json"
    f.write_text(json.dumps({"traceEvents": events}))
    conv = read_kineto(f)
    t = conv.tables["memory"].to_pydict()
    assert t == {"ts_ns": [10_000, 11_000, 12_000, 16_000], "device": [0, -1, -1, 1],
                 "bytes": [512, -512, 64, 128], "allocated_bytes": [1536, 1024, 64, None],
                 "reserved_bytes": [2048, 2048, 0, None]}
    assert conv.stats.get("memory_record_malformed") == 4
    assert conv.stats.get("memory_record_without_totals") == 1
    assert conv.stats.get("arg_not_numeric.Bytes") == 1
    assert conv.stats.get("arg_not_numeric.Device Id") == 1
    assert conv.stats.get("instant_events_skipped") == 1  # "other" only
    sev = {s["name"]: s["severity"] for s in conv.stats.rows()}
    assert sev["memory_record_malformed"] == "warning"
