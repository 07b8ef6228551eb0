"""bench/edge_evidence.py: each inferred edge confirmed, contradicted or left undecided by the
raw trace's own records, on a hand-made graph and raw trace."""

from __future__ import annotations

import pyarrow as pa

from bench import edge_evidence as ee


def _graph(tasks, edges, units):
    cols = ("correlation", "unit_id", "start_ns", "obs_dur_ns", "name")
    return {"task": pa.table({c: [t[k] for t in tasks] for k, c in enumerate(cols)}),
            "edge": pa.table({"src": [e[0] for e in edges], "dst": [e[1] for e in edges],
                              "kind": [e[2] for e in edges],
                              "inferred": [e[3] for e in edges]}),
            "unit": pa.table({"unit_id": [u[0] for u in units], "pid": [u[1] for u in units],
                              "tid": [u[2] for u in units], "stream": [u[3] for u in units]})}


def test_by_hand():
    # units: 0 the thread (1, 1); 1 stream 7; 2 stream 9; 3 thread (1, 2)
    units = [(0, 1, 1, None), (1, 0, 7, 7), (2, 0, 9, 9), (3, 1, 2, None)]
    tasks = [
        (10, 0, 0, 1_000, "cudaLaunchKernel"),       # 0 launches 2 on stream 7
        (11, 0, 2_000, 1_000, "cudaLaunchKernel"),   # 1 launches 3 on stream 9
        (10, 1, 5_000, 10_000, "kA"),                # 2 stream 7
        (11, 2, 16_000, 1_000, "kB"),                # 3 stream 9: waits for kA
        (12, 0, 4_000, 13_000, "cudaStreamSynchronize"),  # 4: record names stream 9
        (13, 0, 18_000, 1_000, "cudaDeviceSynchronize"),  # 5
        (14, 0, 14_000, 3_000, "cudaLaunchKernel"),  # 6 blocked: its kernel on stream 7
        (-1, 3, 20_000, 1_000, "op"),                # 7 on thread (1, 2)
        (-1, 0, 30_000, 1_000, "op"),                # 8 on thread (1, 1)
    ]
    edges = [(0, 2, "launch", False), (1, 3, "launch", False),
             (2, 3, "wait", True),          # confirmed: 9 waits on 7 between the launches
             (2, 4, "sync", True),          # contradicted: the record names stream 9
             (3, 5, "sync", True),          # confirmed: device-wide
             (2, 6, "queue", True),         # confirmed: stream 7, kA ends inside the call
             (3, 6, "queue", True),         # contradicted: kB is on stream 9
             (7, 8, "wake", True),          # no flow (2 -> 1): no record
             (2, 3, "contention", True),    # never recorded
             (2, 3, "stream", False)]       # read, not inferred: not counted
    raw = [
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "ts": 1.5, "dur": 1,
         "args": {"cuda_sync_kind": "Stream Wait Event", "stream": 9, "wait_on_stream": 7,
                  "correlation": 20}},
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "ts": 16, "dur": 1,
         "args": {"cuda_sync_kind": "Stream Sync", "stream": 9, "correlation": 12}},
        {"ph": "X", "cat": "kernel", "name": "k6", "ts": 40, "dur": 1,
         "args": {"correlation": 14, "stream": 7}},
        {"ph": "s", "cat": "fwdbwd", "id": 5, "pid": 1, "tid": 1, "ts": 1},
        {"ph": "f", "cat": "fwdbwd", "id": 5, "pid": 1, "tid": 2, "ts": 2},
    ]
    c = ee.classify(_graph(tasks, edges, units), ee.raw_index(raw))
    assert c["wait"] == {"instances": 1, "confirmed": 1, "contradicted": 0, "no_record": 0}
    assert c["sync"] == {"instances": 2, "confirmed": 1, "contradicted": 1, "no_record": 0}
    assert c["queue"] == {"instances": 2, "confirmed": 1, "contradicted": 1, "no_record": 0}
    assert c["wake"] == {"instances": 1, "confirmed": 0, "contradicted": 0, "no_record": 1}
    assert c["contention"]["no_record"] == 1
    # the wait record issued after the waiting task's launch does not confirm it
    raw[0]["ts"] = 2.5
    c = ee.classify(_graph(tasks, edges, units), ee.raw_index(raw))
    assert c["wait"]["no_record"] == 1
    # the flow from the woken thread's side to the waking one: the wake (1, 2) -> (1, 1) is
    # confirmed only by a flow in that direction
    raw[3]["tid"], raw[4]["tid"] = 2, 1
    assert ee.classify(_graph(tasks, edges, units), ee.raw_index(raw))["wake"]["confirmed"] == 1
