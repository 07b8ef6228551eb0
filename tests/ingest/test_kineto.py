"""Kineto JSON ingest checked against an independent reading of the same files.

The reference side uses the standard library's json with Decimal timestamps: slow and simple,
and sharing no code with the compiled scanner.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import numpy as np
import pytest

from daydream.ingest.kineto import read_kineto
from tests.conftest import DATA, kineto_files

FILES = kineto_files()

KERNEL = {"kernel", "Kernel"}
MEMCPY = {"gpu_memcpy", "Memcpy"}
MEMSET = {"gpu_memset", "Memset"}
API = {"cuda_runtime", "Runtime", "cuda_driver"}
RANGE = {"cpu_op", "Operator", "user_annotation", "gpu_user_annotation", "python_function"}


def _load(path: Path) -> dict:
    op = gzip.open if path.name.endswith(".gz") else open
    with op(path, "rt") as f:
        d = json.load(f, parse_float=Decimal)
    return d if isinstance(d, dict) else {"traceEvents": d}


def _ns(us) -> int:
    return int((Decimal(us) * 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP))


@pytest.fixture(scope="module", params=FILES, ids=lambda p: p.name)
def pair(request):
    path = request.param
    return _load(path), read_kineto(path)


def test_counts_match_independent_count(pair):
    ref, conv = pair
    c = Counter(e.get("cat") for e in ref["traceEvents"] if e.get("ph") == "X")
    expect = {
        "kernel": sum(c[k] for k in KERNEL),
        "memcpy": sum(c[k] for k in MEMCPY),
        "memset": sum(c[k] for k in MEMSET),
        "api": sum(c[k] for k in API),
        "sync": c["cuda_sync"],
        "range": sum(c[k] for k in RANGE),
        # the allocator's records: instant events, every one of them well-formed here
        "memory": sum(e.get("name") == "[memory]" and e.get("ph") == "i"
                      for e in ref["traceEvents"]),
    }
    got = {k: conv.tables[k].num_rows for k in expect}
    assert got == expect
    assert conv.events == len(ref["traceEvents"])


def test_kernel_fields_match(pair):
    ref, conv = pair
    kern = [e for e in ref["traceEvents"] if e.get("ph") == "X" and e.get("cat") in KERNEL]
    if not kern:
        pytest.skip("trace has no kernels")  # ads/backward-thread traces: CPU-only cases
    kern.sort(key=lambda e: _ns(e["ts"]))
    t = conv.tables["kernel"].to_pydict()
    exp_start = [_ns(e["ts"]) for e in kern]
    assert t["start_ns"] == exp_start
    assert sorted(t["dur_ns"]) == sorted(max(0, _ns(e["dur"])) for e in kern)
    assert Counter(t["name"]) == Counter(e["name"] for e in kern)
    assert Counter(t["correlation"]) == Counter(e["args"].get("correlation") for e in kern)
    assert Counter(t["stream"]) == Counter(e["args"]["stream"] for e in kern)
    grids = Counter(tuple(e["args"]["grid"]) for e in kern if "grid" in e["args"])
    got = Counter((x, y, z) for x, y, z in zip(t["grid_x"], t["grid_y"], t["grid_z"],
                                              strict=True) if x is not None)
    assert got == grids


def test_kernels_without_launch_counted(pair):
    ref, conv = pair
    ev = ref["traceEvents"]
    launches = {e["args"].get("correlation") for e in ev
                if e.get("ph") == "X" and e.get("cat") in API and "args" in e}
    missing = sum(1 for e in ev if e.get("ph") == "X" and e.get("cat") in KERNEL
                  and e["args"].get("correlation") not in launches)
    assert conv.stats.get("kernel_without_launch") == missing


def test_api_and_range_times_exact(pair):
    ref, conv = pair
    ev = ref["traceEvents"]
    api = sorted(_ns(e["ts"]) for e in ev if e.get("ph") == "X" and e.get("cat") in API)
    assert conv.tables["api"]["start_ns"].to_pylist() == api
    rng = sorted(_ns(e["ts"]) for e in ev if e.get("ph") == "X" and e.get("cat") in RANGE)
    assert conv.tables["range"]["start_ns"].to_pylist() == rng


def test_range_nesting_is_consistent(pair):
    _, conv = pair
    r = conv.tables["range"].to_pydict()
    start = np.array(r["start_ns"])
    end = start + np.array(r["dur_ns"])
    for i, p in enumerate(r["parent"]):
        if p is None:
            assert r["depth"][i] == 0
            continue
        assert r["pid"][p] == r["pid"][i] and r["tid"][p] == r["tid"][i]
        assert start[p] <= start[i] and end[i] <= end[p]
        assert r["depth"][i] == r["depth"][p] + 1


def test_2021_schema_streams_and_flows():
    conv = read_kineto(DATA / "kineto" / "resnet50_v100_nw0_run1.json.gz")
    assert conv.source_version == "1"
    assert set(conv.tables["kernel"]["stream"].to_pylist()) == {7}
    # "external id" (lowercase) in the 2021 schema is read like "External id"
    assert conv.tables["kernel"]["external_id"].null_count == 0
    flow = conv.tables["flow"].to_pydict()
    assert set(flow["kind"]) == {"launch"}
    assert len(flow["flow_id"]) == 9096  # 9096 s/f pairs, category "async", name "launch"
    assert all(s is not None and d is not None for s, d in
               zip(flow["src_ts_ns"], flow["dst_ts_ns"], strict=True))
    # 2021 tids are strings ("25738"; 25772 is the autograd thread): read as numbers
    assert set(conv.tables["api"]["tid"].to_pylist()) == {25738, 25772}


def test_driver_calls_and_rocm():
    tri = read_kineto(DATA / "kineto" / "triton_example.json.gz")
    api = tri.tables["api"].to_pydict()
    kinds = dict(zip(api["name"], api["kind"], strict=True))
    assert kinds["cuLaunchKernel"] == "driver"
    assert all(k == "runtime" for n, k in kinds.items() if n.startswith("cuda"))
    rocm = read_kineto(DATA / "kineto" / "resnet_actckpt_mi300x_rank0_of8.json.gz")
    names = set(rocm.tables["api"]["name"].to_pylist())
    assert "hipLaunchKernel" in names
    assert set(rocm.tables["api"]["kind"].to_pylist()) == {"runtime"}
    assert rocm.rank == 0 and rocm.world_size == 8
    assert rocm.devices and "MI300X" in rocm.devices[0]["name"]


def test_event_sync_records():
    conv = read_kineto(DATA / "kineto" / "event_sync_multi_stream.json.gz")
    ref = _load(DATA / "kineto" / "event_sync_multi_stream.json.gz")
    syncs = [e for e in ref["traceEvents"] if e.get("cat") == "cuda_sync"]
    t = conv.tables["sync"].to_pydict()
    mapping = {"Stream Sync": "stream_sync", "Event Sync": "event_sync",
               "Context Sync": "context_sync", "Stream Wait Event": "stream_wait_event"}
    assert Counter(t["sync_kind"]) == Counter(mapping[e["name"]] for e in syncs)
    waits = [e["args"].get("wait_on_cuda_event_record_corr_id") for e in syncs
             if e["name"] == "Stream Wait Event"]
    got = [c for c, k in zip(t["wait_on_event_record_correlation"], t["sync_kind"],
                             strict=True) if k == "stream_wait_event"]
    assert sorted(got) == sorted(waits)


def test_fwdbwd_flows_and_annotations():
    conv = read_kineto(DATA / "kineto" / "resnet50_ddp_a100_rank0.json.gz")
    flow = conv.tables["flow"].to_pydict()
    assert Counter(flow["kind"])["fwdbwd"] == 543
    names = set(conv.tables["range"]["name"].to_pylist())
    assert {"## forward ##", "## backward ##", "## optimizer ##"} <= names
    assert conv.rank == 0 and conv.world_size == 2
    nccl = conv.tables["kernel"].filter(
        conv.tables["kernel"]["collective"].is_valid()).num_rows
    assert nccl == 21


def test_timestamps_with_fractions_exact(tmp_path):
    # Hand-made: microsecond timestamps with 3 and 4 decimals, an exponent, a negative dur.
    f = tmp_path / "t.json"
    text = ('{"traceEvents": ['
            '{"ph": "X", "cat": "kernel", "name": "k\\u00e9\\"q", "pid": 0, "tid": 7,'
            ' "ts": 4458676522709.0594, "dur": 630.099, "args": {"stream": 7}},'
            '{"ph": "X", "cat": "kernel", "name": "b", "pid": 0, "tid": 7,'
            ' "ts": 1.5e3, "dur": -2, "args": {"stream": 7}}]}')
    f.write_text(text)
    conv = read_kineto(f)
    t = conv.tables["kernel"].to_pydict()
    assert t["start_ns"] == [1_500_000, 4458676522709059]
    assert t["dur_ns"] == [0, 630099]
    assert t["name"] == ["b", 'k\u00e9"q']
    assert conv.stats.get("negative_duration") == 1
