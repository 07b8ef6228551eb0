"""The measured peak from the allocator's records (transforms.memory.measured) and a
prediction's peak (predicted_peak): on real traces against figures computed here from the
raw JSON with the standard library, and on hand-made tables whose numbers are worked out in
the comments."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pytest

from daydream.ingest import schema
from daydream.transforms import memory
from tests.conftest import DATA, stored_graphs

BERT = DATA / "crossgpu" / "bert_small_uncased_h100_inference.json.gz"


def _raw(path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _ns(us: float) -> int:
    return round(us * 1000)


@pytest.fixture(scope="module")
def bert_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("memory_store")
    return store, stored_graphs([BERT], store)[BERT]


@pytest.fixture(scope="module")
def bert(bert_store):
    from daydream.graphstore.read import read_graph
    from daydream.ingest.store import Store
    store, tid = bert_store
    return Store(store).read("memory", tid), read_graph(store, tid)["iteration"]


def test_sql_reads_the_memory_table(bert_store):
    """docs/sql.md's query: `memory` is the table, not DuckDB's catalog of that name."""
    from daydream.graphstore.sql_query import run_sql
    store, _ = bert_store
    t = run_sql(store, "SELECT device, max(allocated_bytes) AS peak, count(*) AS n "
                       "FROM memory GROUP BY ALL ORDER BY device")
    assert t.to_pylist() == [{"device": -1, "peak": 16, "n": 18},
                             {"device": 0, "peak": 101_305_344, "n": 218}]


def test_the_peak_of_a_real_trace_is_the_files(bert):
    records, iterations = bert
    events = _raw(BERT)
    gpu = [e for e in events if e.get("name") == "[memory]" and e["args"]["Device Type"] == 1]
    step = next(e for e in events if e.get("name") == "ProfilerStep#6" and
                e.get("cat") == "user_annotation")
    # by hand: the file's largest totals; the step's records, the level before its first one
    # (its total less its own size: no GPU record precedes the step), the first record at
    # the peak
    peak = max(e["args"]["Total Allocated"] for e in gpu)
    reserved = max(e["args"]["Total Reserved"] for e in gpu)
    lo, hi = _ns(step["ts"]), _ns(step["ts"] + step["dur"])
    inside = [e for e in gpu if lo <= _ns(e["ts"]) < hi]
    assert len(inside) == len(gpu) == 218
    start = inside[0]["args"]["Total Allocated"] - inside[0]["args"]["Bytes"]
    first_at_peak = next(e for e in inside if e["args"]["Total Allocated"] == peak)
    assert (peak, start) == (101_305_344, 91_360_768)

    devs = {d.device: d for d in memory.measured(records, iterations)}
    assert sorted(devs) == [-1, 0]
    g = devs[0]
    assert g.name == "GPU 0" and g.records == 218 and g.totals
    assert (g.peak_allocated_bytes, g.peak_reserved_bytes) == (peak, reserved)
    assert g.peak_ns == _ns(first_at_peak["ts"])
    (s,) = g.steps
    assert s.label == "ProfilerStep#6" and s.records == 218
    assert s.start_allocated_bytes == start and s.peak_allocated_bytes == peak
    assert s.growth_bytes == peak - start
    assert s.peak_offset_ns == _ns(first_at_peak["ts"]) - iterations["start_ns"][0].as_py()
    assert devs[-1].name == "CPU" and devs[-1].peak_allocated_bytes == 16


def test_without_totals_a_step_grows_by_the_sum_of_its_sizes(graphs, activity):
    """The 2021 ResNet-50 trace (6 steps, records without totals): each step's growth is the
    largest running sum of its GPU records' sizes, from the JSON by a plain loop."""
    events = _raw(DATA / "kineto" / "resnet50_v100_nw0_run1.json.gz")
    gpu = sorted(((_ns(e["ts"]), e["args"]["Bytes"]) for e in events
                  if e.get("name") == "[memory]" and e["args"]["Device Type"] == 1),
                 key=lambda x: x[0])
    its = graphs["v100"]["iteration"].to_pylist()
    want = []
    for it in its:
        level = top = 0
        for ts, b in gpu:
            if it["start_ns"] <= ts < it["end_ns"]:
                level += b
                top = max(top, level)
        want.append(top)
    assert len(want) == 6 and min(want) > 2_000_000_000  # a V100 step at batch 32: ~2.6 GB
    (g,) = [d for d in memory.measured(activity["v100"]("memory"), graphs["v100"]["iteration"])
            if d.device == 0]
    assert not g.totals and g.peak_allocated_bytes is None
    assert [s.growth_bytes for s in g.steps] == want
    assert all(s.start_allocated_bytes is None for s in g.steps)


# A hand-made device: level 1000 before the first record; iterations [10, 20), [20, 30),
# [40, 50).
#   ts  bytes  allocated reserved
#    5   +100     1100     2048   before the steps
#   12   +300     1400     2048   step 0: starts at 1100, peak 1400 at +2, growth 300
#   15   -300     1100     2048
#   22   +500     1600     4096   step 1: starts at 1100, peak 1800 at +5, growth 700
#   25   +200     1800     4096
#   28   -700     1100     4096
# step 2 holds no record: 1100 throughout, growth 0, reserved 4096 (held when it starts).
# A host record (device -1) at 13.
TS = [5, 12, 13, 15, 22, 25, 28]
DEV = [0, 0, -1, 0, 0, 0, 0]
BYTES = [100, 300, 8, -300, 500, 200, -700]
ALLOC = [1100, 1400, 8, 1100, 1600, 1800, 1100]
RES = [2048, 2048, 0, 2048, 4096, 4096, 4096]
ITERATIONS = pa.table({"iteration": [0, 1, 2], "label": ["s0", "s1", "s2"],
                       "start_ns": [10, 20, 40], "end_ns": [20, 30, 50]})


def _records(totals: bool = True) -> pa.Table:
    return schema.conform("memory", {
        "ts_ns": TS, "device": DEV, "bytes": BYTES,
        "allocated_bytes": ALLOC if totals else [None] * len(TS),
        "reserved_bytes": RES if totals else [None] * len(TS)})


def _gpu(totals: bool = True) -> memory.DeviceMemory:
    (g,) = [d for d in memory.measured(_records(totals), ITERATIONS) if d.device == 0]
    return g


def test_steps_of_a_hand_made_device():
    g = _gpu()
    assert (g.records, g.peak_allocated_bytes, g.peak_reserved_bytes, g.peak_ns) == \
        (6, 1800, 4096, 25)
    got = [(s.records, s.start_allocated_bytes, s.peak_allocated_bytes, s.growth_bytes,
            s.peak_offset_ns, s.peak_reserved_bytes) for s in g.steps]
    assert got == [(2, 1100, 1400, 300, 2, 2048), (3, 1100, 1800, 700, 5, 4096),
                   (0, 1100, 1100, 0, None, 4096)]
    # without totals the growth is the same, from the sizes; the levels are unknown
    g = _gpu(totals=False)
    assert [s.growth_bytes for s in g.steps] == [300, 700, 0]
    assert g.peak_allocated_bytes is None and g.steps[0].start_allocated_bytes is None
    assert memory.measured(schema.empty("memory"), ITERATIONS) == []


def test_batch_scales_the_growth_above_the_step_start():
    g = _gpu()
    # batch 4 -> 8 (x2): step 0 1100 + 2 x 300 = 1700, step 1 1100 + 2 x 700 = 2500
    p = memory.predicted_peak(g, "batch(size=8)", {"batches": [(4, 8)]})
    assert (p.peak_allocated_bytes, p.growth_bytes, p.step.label) == (2500, 1400, "s1")
    assert p.modeled and "x2" in p.rule
    # only the steps the replay uses: step 0 alone
    p = memory.predicted_peak(g, "batch(size=8)", {"batches": [(4, 8)]}, used={0})
    assert (p.peak_allocated_bytes, p.growth_bytes) == (1700, 600)
    # two batches in a chain: 4 -> 8 -> 12, x3: 1100 + 3 x 700
    p = memory.predicted_peak(g, "batch(size=8)+batch(size=12)",
                              {"batches": [(4, 8), (8, 12)]})
    assert p.peak_allocated_bytes == 3200
    # a smaller batch shrinks it: 4 -> 2, 1100 + 700 / 2
    assert memory.predicted_peak(g, "batch(size=2)", {"batches": [(4, 2)]}
                                 ).peak_allocated_bytes == 1450
    # without totals: the growth alone
    p = memory.predicted_peak(_gpu(totals=False), "batch(size=8)", {"batches": [(4, 8)]})
    assert p.modeled and p.peak_allocated_bytes is None and p.growth_bytes == 1400


def test_every_other_optimization_is_not_modeled():
    g = _gpu()
    for spec in ("amp", "batch(size=8)+amp", "dataloader(workers=4)", "cuda_graphs",
                 "scale(select=\"kind = 'kernel'\", factor=0.5)"):
        p = memory.predicted_peak(g, spec, {"batches": [(4, 8)]})
        assert not p.modeled and p.peak_allocated_bytes is None, spec
        assert p.rule.startswith("not modeled: "), spec
    assert "FP32 activations" in memory.predicted_peak(g, "amp").rule
    host = next(d for d in memory.measured(_records(), ITERATIONS) if d.device == -1)
    assert not memory.predicted_peak(host, "batch(size=8)", {"batches": [(4, 8)]}).modeled
    # a batch whose transform did not say the traced size
    assert not memory.predicted_peak(g, "batch(size=8)", {}).modeled
    # no step the replay uses holds a record
    assert not memory.predicted_peak(g, "batch(size=8)", {"batches": [(4, 8)]},
                                     used={2}).modeled
