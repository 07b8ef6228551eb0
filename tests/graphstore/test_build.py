"""Graph building: exact edges on small real and hand-made traces, invariants on all traces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from daydream.base.errors import DaydreamError
from daydream.graphstore.build import build, is_comm_name
from daydream.graphstore.check import check_acyclic
from daydream.graphstore.latency import Latency
from daydream.graphstore.schema import EDGE_ANCHORS, EDGE_KINDS, GPU_KINDS, TASK_KINDS
from daydream.ingest.convert import read_trace
from tests.conftest import DATA, SHARED, kineto_files

# Round latencies for the hand-made traces, so that the expected lags and slack below can be
# worked out by hand (the real constants live in graphstore.latency, with their sources).
LAT = {k: Latency(v, "test") for k, v in dict(
    stream=1000, launch=0, wait=1000, sync=1000, queue=1000, wake=1000, contention=0,
    origin=0, thread=0).items()}


def edges(g, kinds=None):
    """Edges as (kind, anchor, lag_ns, slack_ns, binding, src name, dst name) tuples."""
    out = []
    for s, d, k, a, lg, sl, b in zip(g.src, g.dst, g.ekind, g.anchor, g.lag_ns, g.slack_ns,
                                     g.binding, strict=True):
        if kinds is None or EDGE_KINDS[k] in kinds:
            out.append((EDGE_KINDS[k], EDGE_ANCHORS[a], int(lg), int(sl), bool(b),
                        g.name[s], g.name[d]))
    return sorted(out)


def inferred(g, kind):
    return sorted((g.name[s], g.name[d]) for s, d, k, i in zip(g.src, g.dst, g.ekind,
                                                               g.inferred, strict=True)
                  if i and EDGE_KINDS[k] == kind)


def task_of(g, name):
    ids = [i for i, n in enumerate(g.name) if n == name]
    assert len(ids) == 1, (name, ids)
    return ids[0]


def X(cat, name, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def write(tmp_path: Path, events: list[dict]) -> Path:
    f = tmp_path / "hand.json"
    f.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return f


def test_launch_stream_sync_inferred_wait(tmp_path):
    # Hand-made trace (times in us):
    #
    # thread 1: |launchA 0-5|host 5-10|launchB 10-15|h|launchC 16-18|StreamSync 20-32| ...
    # stream 7:         |kA 8---------20|kB 20------30|
    # stream 8:                                       |kC 30.5--35|
    # thread 1 (cont.): |launchD 40-42| ... |launchE 62-64| ...      (op range 0-80)
    # stream 9:                  |kD 48-49|          |kE 70-71|
    #
    # With the round latencies of LAT (launch: the call's end; stream: 1 us after the
    # predecessor; wait: 1 us; sync: 1 us), each GPU task's latest constraint binds, and its
    # slack is what the trace shows beyond it:
    # kA: its call ended at 5, it started at 8: launch slack 3 us.  kB: stream-bound, started
    # at kA's end, 1 us sooner than the latency: slack -1 us.  kC: launched at 18, started at
    # 30.5, right after kB on another stream: an inferred cross-stream wait, 0.5 us sooner than
    # its latency.  kD, kE: 6 us after their calls ended, more than UNEXPLAINED_NS, with
    # nothing on another stream to explain it: launch slack (unexplained GPU idle).
    # The stream sync has no sync record; its thread last launched onto stream 8, whose kC
    # ended after the call returned, so the stream whose pending work ended inside the call
    # is taken (kB, inferred). The call waited: it keeps 32 - (30 + 1) = 1 us of its own.
    ev = [
        X("cpu_op", "op", 0, 80),
        X("cuda_runtime", "launchD", 40, 2, correlation=5),
        X("cuda_runtime", "launchE", 62, 2, correlation=6),
        X("kernel", "kD", 48, 1, pid=0, tid=9, stream=9, correlation=5, device=0),
        X("kernel", "kE", 70, 1, pid=0, tid=9, stream=9, correlation=6, device=0),
        X("cuda_runtime", "launchA", 0, 5, correlation=1),
        X("cuda_runtime", "launchB", 10, 5, correlation=2),
        X("cuda_runtime", "launchC", 16, 2, correlation=3),
        X("cuda_runtime", "cudaStreamSynchronize", 20, 12, correlation=4),
        X("kernel", "kA", 8, 12, pid=0, tid=7, stream=7, correlation=1, device=0),
        X("kernel", "kB", 20, 10, pid=0, tid=7, stream=7, correlation=2, device=0),
        X("kernel", "kC", 30.5, 4.5, pid=0, tid=8, stream=8, correlation=3, device=0),
    ]
    g = build(read_trace(write(tmp_path, ev)).tables, LAT)
    got = edges(g, {"launch", "stream", "sync", "wait"})
    assert got == sorted([
        ("launch", "end_start", 0, 3000, True, "launchA", "kA"),
        ("launch", "end_start", 0, 0, False, "launchB", "kB"),
        ("stream", "end_start", 1000, -1000, True, "kA", "kB"),
        ("launch", "end_start", 0, 0, False, "launchC", "kC"),
        ("wait", "end_start", 1000, -500, True, "kB", "kC"),
        ("sync", "end_end", 1000, 0, True, "kB", "cudaStreamSynchronize"),
        ("launch", "end_start", 0, 6000, True, "launchD", "kD"),
        ("launch", "end_start", 0, 6000, True, "launchE", "kE"),
        ("stream", "end_start", 1000, 0, False, "kD", "kE"),
    ])
    assert inferred(g, "wait") == [("kB", "kC")]
    assert inferred(g, "sync") == [("kB", "cudaStreamSynchronize")]
    sync = task_of(g, "cudaStreamSynchronize")
    assert g.dur_ns[sync] == 1000 and g.obs_dur_ns[sync] == 12000 and g.blocking[sync]
    # host time between calls is a task named after the enclosing range
    hosts = [(int(g.start_ns[i]), int(g.obs_dur_ns[i])) for i in range(g.n_tasks)
             if TASK_KINDS[g.kind[i]] == "host" and g.name[i] == "op"]
    assert hosts == [(5000, 5000), (15000, 1000), (18000, 2000), (32000, 8000),
                     (42000, 20000), (64000, 16000)]
    # thread order covers the thread without gaps: no latency, no slack
    thread = [e for e in edges(g, {"thread"})]
    assert all(lag == 0 and sl == 0 and b for _, _, lag, sl, b, _, _ in thread)
    assert len(thread) == 11  # 12 CPU tasks in a chain


@pytest.mark.parametrize("y_first", [True, False])
def test_inferred_waits_follow_launch_order(tmp_path, y_first):
    # Hand-made trace (times in us):
    #
    # thread 1: |launchP 0-2| |launchX 4-6| ... |launchY 50-51|   (launchY at 3-4 if y_first)
    # stream 7:    |kP 3--------------------------100|   |kX 112-120|
    # stream 8:                                |kY 53---------111|   (kY 5-111 if y_first)
    #
    # kX is ready at 101 (kP's end + the 1 us stream latency) and starts 11 us later, just as
    # kY ends. Launched before kX, kY may be what kX's stream waited for: an inferred wait,
    # 1 us latency, no slack. Launched after kX, it cannot be (a wait is enqueued before the
    # work that waits): kY was running when kX became ready, so it is taken as contention
    # (0 latency: kX began 1 us after kY ended), an edge the simulator keeps only while kY
    # runs (tests/simulate/test_toy.py: test_a_held_edge_binds_only_while_its_source_runs).
    y_at = 3 if y_first else 50  # kY starts 2 us after its call began (1 us after it ended)
    ev = [X("cpu_op", "op", 0, 200),
          X("cuda_runtime", "launchP", 0, 2, correlation=1),
          X("cuda_runtime", "launchX", 4, 2, correlation=2),
          X("cuda_runtime", "launchY", y_at, 1, correlation=3),
          X("kernel", "kP", 3, 97, pid=0, tid=7, stream=7, correlation=1, device=0),
          X("kernel", "kX", 112, 8, pid=0, tid=7, stream=7, correlation=2, device=0),
          X("kernel", "kY", y_at + 2, 109 - y_at, pid=0, tid=8, stream=8, correlation=3,
            device=0)]
    g = build(read_trace(write(tmp_path, ev)).tables, LAT)
    into_x = [e for e in edges(g) if e[6] == "kX"]
    base = [("launch", "end_start", 0, 0, False, "launchX", "kX"),
            ("stream", "end_start", 1000, 0, False, "kP", "kX")]
    if y_first:
        assert into_x == sorted(base + [("wait", "end_start", 1000, 0, True, "kY", "kX")])
        assert inferred(g, "wait") == [("kY", "kX")]
        assert g.stats.get("inferred_waits_after_launch") == 0
    else:
        assert into_x == sorted(base + [("contention", "end_start", 0, 1000, True, "kY",
                                         "kX")])
        assert inferred(g, "wait") == [] and inferred(g, "contention") == [("kY", "kX")]
        assert g.stats.get("inferred_waits_after_launch") == 1


# A hand-made device of 2 SMs, each holding 2 blocks of 1024 threads (maxThreadsPerMultiprocessor
# / threads per block binds; registers and shared memory leave room): 4 blocks a wave.
TWO_SMS = {"id": 0, "name": "hand-made", "numSms": 2, "maxThreadsPerMultiprocessor": 2048,
           "regsPerMultiprocessor": 65536, "sharedMemPerMultiprocessor": 98304,
           "computeMajor": 8, "computeMinor": 0}


@pytest.mark.parametrize("before_end_us, grid, devices, held", [
    (150, 16, True, True),     # 16 blocks: 4 waves of 100 us; 150 us <= 2 blocks (200 us)
    (250, 16, True, False),    # 250 us before the end: not its last waves
    (150, 3, True, False),     # 3 blocks leave an SM free: they held nothing
    (150, 16, False, False),   # no deviceProperties: the fixed 100 us window only
    (60, 16, False, True),     # ... which holds without them
])
def test_contention_window_is_the_occupants_last_waves(tmp_path, before_end_us, grid, devices,
                                                       held):
    # Hand-made (times in us): kY (stream 8, 400 us, GRID blocks of 1024 threads, 32 registers
    # each) is running when kX (stream 7) is launched; kX starts BEFORE_END_US before kY ends,
    # long after its call returned, and nothing else ended then.
    #
    # thread 1: |launchY 0-1| |launchX 10-11|
    # stream 8:   |kY 2------------------------------------402|
    # stream 7:                         |kX 402-BEFORE_END_US ... +5|
    #
    # With 16 blocks kY runs 4 waves on TWO_SMS, a block 100 us: a kernel that fills the SMs
    # lets a waiting kernel in during its last DRAIN_BLOCKS (2) block times, 200 us. kX is then
    # held by kY: a contention edge, 0 latency, its slack the 150 us by which kX began before
    # kY's end. Else (too early, a kernel that leaves SMs free, no device properties to size
    # its waves with) the window is CONTENTION_TAIL_NS (100 us) and kX's lateness stays its
    # launch edge's slack (unexplained).
    start = 402 - before_end_us
    ev = [X("cpu_op", "op", 0, 500),
          X("cuda_runtime", "launchY", 0, 1, correlation=1),
          X("cuda_runtime", "launchX", 10, 1, correlation=2),
          X("kernel", "kY", 2, 400, pid=0, tid=8, stream=8, correlation=1, device=0,
            grid=[grid, 1, 1], block=[1024, 1, 1], **{"registers per thread": 32,
                                                      "shared memory": 0}),
          X("kernel", "kX", start, 5, pid=0, tid=7, stream=7, correlation=2, device=0,
            grid=[1, 1, 1], block=[32, 1, 1])]
    doc = {"schemaVersion": 1, "traceEvents": ev}
    if devices:
        doc["deviceProperties"] = [TWO_SMS]
    f = tmp_path / "hand.json"
    f.write_text(json.dumps(doc))
    conv = read_trace(f)
    g = build(conv.tables, LAT, conv.devices)
    into_x = [e for e in edges(g) if e[6] == "kX"]
    launch_slack = (start - 11) * 1000
    if held:
        assert into_x == sorted([
            ("launch", "end_start", 0, 0, False, "launchX", "kX"),
            ("contention", "end_start", 0, -before_end_us * 1000, True, "kY", "kX")])
    else:
        assert into_x == [("launch", "end_start", 0, launch_slack, True, "launchX", "kX")]


def test_nested_driver_call_and_kernel_without_launch(tmp_path):
    # Hand-made: a runtime call with a driver call inside it (the kernel carries the driver
    # call's correlation), and kernels whose launch is not in the trace (launched before the
    # window).
    #
    # thread 1: |cudaLaunchKernel 0-10 [cuLaunchKernel 2-8]|
    # stream 7:                 |k1 12-14|       |orphan 21-22|
    # stream 9:                                          |first 30-31|
    # The orphan starts 6 us after k1's end + the stream latency: more than UNEXPLAINED_NS.
    # Its stream edge binds and holds what lies beyond the 1 us latency as slack (21 - 14 - 1
    # = 6 us), so it moves with k1; "first" has no predecessor
    # at all and hangs off the trace start at its offset (origin slack).
    ev = [
        X("cuda_runtime", "cudaLaunchKernel", 0, 10, correlation=1),
        X("cuda_driver", "cuLaunchKernel", 2, 6, correlation=2),
        X("kernel", "k1", 12, 2, pid=0, tid=7, stream=7, correlation=2, device=0),
        X("kernel", "orphan", 21, 1, pid=0, tid=7, stream=7, correlation=99, device=0),
        X("kernel", "first", 30, 1, pid=0, tid=9, stream=9, correlation=98, device=0),
    ]
    g = build(read_trace(write(tmp_path, ev)).tables, LAT)
    assert edges(g, {"launch"}) == [("launch", "end_start", 0, 2000, True, "cudaLaunchKernel",
                                     "k1")]
    assert g.stats.get("nested_calls_merged") == 1
    assert g.stats.get("gpu_without_launch") == 2
    origin = edges(g, {"origin"})
    # the first CPU task hangs off the trace start at its offset (0); "first" by slack
    assert origin == sorted([("origin", "end_start", 0, 0, True, "<trace start>",
                              "cudaLaunchKernel"),
                             ("origin", "end_start", 0, 30000, True, "<trace start>",
                              "first")])
    assert edges(g, {"stream"}) == [("stream", "end_start", 1000, 6000, True, "k1", "orphan")]


def test_event_sync_single_stream_real():
    """HTA's CUDA event sync trace, one stream: each synchronizing call waits for the work its
    semantics name, whether or not it had to wait in the trace."""
    g = build(read_trace(DATA / "kineto" / "event_sync_single_stream.json.gz").tables, LAT)
    assert edges(g, {"sync", "wait"}) == sorted([
        # cudaMemcpyAsync to pageable memory returns once its copy is done (2.935-2.937 ms)
        ("sync", "end_end", 1000, 0, True, "Memcpy DtoH (Device -> Pageable)",
         "cudaMemcpyAsync"),
        # the stream sync (record: stream 7) comes after that copy has ended: no wait
        ("sync", "end_end", 1000, 0, False, "Memcpy DtoH (Device -> Pageable)",
         "cudaStreamSynchronize"),
        # cudaEventSynchronize waits for the spin kernel recorded before the event
        ("sync", "end_end", 1000, 0, True,
         "at::cuda::(anonymous namespace)::spin_kernel(long)", "cudaEventSynchronize"),
        # the device sync finds the spin kernel long done
        ("sync", "end_end", 1000, 0, False,
         "at::cuda::(anonymous namespace)::spin_kernel(long)", "cudaDeviceSynchronize"),
    ])
    assert g.stats.get("blocking_calls") == 4
    # own cost after the wait: the copy call ran 2.917-2.946 ms, its copy ended at 2.937 ms,
    # +1 us latency: 8 us; the event sync ran 3.047-3.081, the kernel ended at 3.073: 7 us
    assert g.dur_ns[task_of(g, "cudaMemcpyAsync")] == 8000
    assert g.dur_ns[task_of(g, "cudaEventSynchronize")] == 7000
    assert g.dur_ns[task_of(g, "cudaStreamSynchronize")] == 6000  # did not wait: all its own
    assert not g.inferred[np.array([EDGE_KINDS[k] == "sync" for k in g.ekind])].any()


def test_event_sync_multi_stream_real():
    """HTA's CUDA event sync trace on several streams: the recorded cudaStreamWaitEvent links
    the sgemm recorded on stream 20 (corr 27, event recorded by corr 1385) to the first work
    enqueued on stream 24 after the wait (memset corr 1411); the device sync waits for the last
    task enqueued on each of the three streams, and the sgemm on stream 24 ends last."""
    g = build(read_trace(DATA / "kineto" / "event_sync_multi_stream.json.gz").tables, LAT)
    got = edges(g, {"sync", "wait"})
    assert got == sorted([
        ("wait", "end_start", 1000, 0, False, "ampere_sgemm_128x64_nn", "Memset (Device)"),
        ("sync", "end_end", 1000, 0, False, "ampere_sgemm_128x64_nn", "cudaDeviceSynchronize"),
        ("sync", "end_end", 1000, 0, False, "ampere_sgemm_128x64_nn", "cudaDeviceSynchronize"),
        ("sync", "end_end", 1000, 0, True, "ampere_sgemm_128x64_nn", "cudaDeviceSynchronize"),
    ])
    dev = [i for i in range(len(g.src)) if EDGE_KINDS[g.ekind[i]] == "sync"
           and g.binding[i]][0]
    assert g.unit_name[g.unit[g.src[dev]]] == "gpu 0 stream 24"
    w = [i for i in range(len(g.src)) if EDGE_KINDS[g.ekind[i]] == "wait"][0]
    assert g.correlation[g.src[w]] == 27 and g.correlation[g.dst[w]] == 1411
    assert g.unit_name[g.unit[g.src[w]]] == "gpu 0 stream 20"
    assert g.unit_name[g.unit[g.dst[w]]] == "gpu 0 stream 24"


TRAINING = [p for p in kineto_files() if "small" not in str(p) and "ads_sampled" not in p.name
            and p.name not in ("backward_thread.json", "triton_example.json.gz")]
if SHARED.exists():
    TRAINING.append(SHARED / "nsys" / "fsdp_t5_2xh100_1s.sqlite")
else:
    TRAINING.append(DATA / "nsys" / "fsdp_t5_2xh100_1s.sqlite")


@pytest.mark.parametrize("path", TRAINING, ids=lambda p: p.name)
def test_real_trace_invariants(path):
    tables = read_trace(path).tables
    g = build(tables)
    check_acyclic(g.n_tasks, g.src, g.dst, g.anchor, g.name)
    # every GPU task whose correlation id has a call in the trace has its launch edge
    api_corr = set(tables["api"]["correlation"].drop_null().to_pylist())
    expect = sum(1 for t in ("kernel", "memcpy", "memset")
                 for c in tables[t]["correlation"].to_pylist() if c in api_corr)
    launch = np.array([EDGE_KINDS[k] == "launch" for k in g.ekind])
    assert launch.sum() == expect
    assert len(np.unique(g.dst[launch])) == expect
    # every task but the origin has a predecessor; every GPU row became a task
    assert set(np.unique(g.dst)) == set(range(1, g.n_tasks))
    gpu_rows = sum(tables[t].num_rows for t in ("kernel", "memcpy", "memset"))
    assert sum(TASK_KINDS[k] in GPU_KINDS for k in g.kind) == gpu_rows
    # every edge holds in the trace at its lag + slack, and the one that bound its
    # destination with equality: what makes the unmodified graph replay exactly
    obs_end = g.start_ns + g.obs_dur_ns
    t_src = np.where(g.anchor == 1, g.start_ns[g.src], obs_end[g.src]) + g.lag_ns + g.slack_ns
    start_like = g.anchor != 2
    d_start = g.start_ns[g.dst]
    assert np.all(t_src[start_like] <= d_start[start_like])
    b = start_like & g.binding
    assert np.array_equal(t_src[b], d_start[b])
    # an END edge lets its task's own work begin (wait, then work: dur_ns after it)
    end_like = ~start_like
    work_from = obs_end[g.dst] - g.dur_ns[g.dst]
    assert np.all(t_src[end_like] <= work_from[end_like])
    b = end_like & g.binding
    assert np.array_equal(t_src[b], work_from[b])
    # lags are the physical constants of their kinds, never fitted to this trace
    from daydream.graphstore.latency import LATENCY
    for k in np.unique(g.ekind):
        name = EDGE_KINDS[k]
        lags = set(g.lag_ns[g.ekind == k].tolist())
        if name == "origin":  # a thread's first task keeps its offset; GPU work has slack
            continue
        assert lags == {LATENCY[name].ns}, name


def test_cycle_is_reported_as_a_path():
    # Hand-made: 0 -> 1 -> 2 -> 1 (end_start edges), plus a start_start edge 2 -> 3.
    src = np.array([0, 1, 2, 2])
    dst = np.array([1, 2, 1, 3])
    anchor = np.array([0, 0, 0, 1])
    with pytest.raises(DaydreamError, match=r"cycle: (1:b -> 2:c -> 1:b|2:c -> 1:b -> 2:c)"):
        check_acyclic(4, src, dst, anchor, ["a", "b", "c", "d"])
    # the anchors matter: a call launching a copy and waiting for it is not a cycle
    check_acyclic(2, np.array([0, 1]), np.array([1, 0]), np.array([1, 2]), ["call", "copy"])


def test_cycle_found_whatever_the_task_times():
    # Hand-made: with task times, edges that all go forward in time prove the graph acyclic
    # without the topological sort; the cycle above is still found with any times (one of its
    # edges must go back), and an acyclic graph with an edge back in time still passes.
    src, dst, anchor = np.array([0, 1, 2, 2]), np.array([1, 2, 1, 3]), np.array([0, 0, 0, 1])
    for start in ([0, 10, 20, 30], [0, 0, 0, 0], [30, 20, 10, 0]):
        with pytest.raises(DaydreamError, match="cycle"):
            check_acyclic(4, src, dst, anchor, ["a", "b", "c", "d"], np.array(start),
                          np.array([5, 5, 5, 5]))
    # the copy's end observed after the call's end: the end_end edge goes back in time
    check_acyclic(2, np.array([0, 1]), np.array([1, 0]), np.array([1, 2]), ["call", "copy"],
                  np.array([0, 5]), np.array([10, 10]))
    check_acyclic(2, np.array([0, 1]), np.array([1, 0]), np.array([1, 2]), ["call", "copy"],
                  np.array([0, 5]), np.array([10, 2]))


def test_time_shortcut_agrees_with_the_full_sort():
    # Random graphs (seeded) whose times mostly follow their edges, with some edges, and some
    # negative durations, going back in time: check_acyclic with times (which sorts only the
    # nodes within backward spans) must find a cycle exactly where the full sort does.
    rng = np.random.default_rng(7)
    verdicts = {True: 0, False: 0}
    for _ in range(400):
        n = int(rng.integers(2, 40))
        start = np.sort(rng.integers(0, 60, n))
        dur = rng.integers(-3, 10, n)
        m = int(rng.integers(1, 3 * n))
        src = rng.integers(0, n, m)
        dst = rng.integers(0, n, m)
        forward = rng.random(m) < 0.9  # most edges from an earlier task to a later one
        src, dst = np.where(forward, np.minimum(src, dst), src), \
            np.where(forward, np.maximum(src, dst), dst)
        keep = src != dst
        src, dst = src[keep], dst[keep]
        anchor = rng.integers(0, 3, len(src))
        names = [str(i) for i in range(n)]
        try:
            check_acyclic(n, src, dst, anchor, names)
            full = True
        except DaydreamError:
            full = False
        try:
            check_acyclic(n, src, dst, anchor, names, start, dur)
            fast = True
        except DaydreamError:
            fast = False
        assert fast == full
        verdicts[full] += 1
    assert min(verdicts.values()) > 50  # both outcomes well represented


def test_wake_edges_between_threads(tmp_path):
    # Hand-made (us): the main thread calls backward() at 100 and waits until the autograd
    # thread's op ends at 300; the autograd thread is idle until woken at 150.
    #
    # main (tid 1):     |fwd 0-100|  backward wait 100----------------------- 310|
    # autograd (tid 2): |idle 0 ---------- 150|bwd op 150 ---- 300|idle 300-400|
    ev = [
        X("cpu_op", "fwd", 0, 100),
        X("user_annotation", "backward", 100, 210),
        X("cpu_op", "bwd op", 150, 150, tid=2),
        X("cpu_op", "tail", 300, 100, tid=2),
        X("cpu_op", "head", 0, 1, tid=2),
    ]
    g = build(read_trace(write(tmp_path, ev)).tables, LAT)
    wake = edges(g, {"wake"})
    # the autograd thread's idle stretch ends 50 us after the main thread's forward ended (and
    # its backward wait began); the main thread's wait ends 10 us after the autograd thread's
    # op ended. Host time inside an operator ("tail") is work, never a wait. Each wait is
    # an END edge at the wake-up latency (1 us here); what the thread ran after it is its own.
    assert wake == sorted([
        ("wake", "end_end", 1000, 0, True, "fwd", "<host>"),
        ("wake", "end_end", 1000, 0, True, "bwd op", "backward"),
    ])
    assert inferred(g, "wake") == sorted([("fwd", "<host>"), ("bwd op", "backward")])
    assert g.dur_ns[task_of(g, "backward")] == 9000  # 310 - (300 + 1) us
    idle = [i for i in range(g.n_tasks) if g.name[i] == "<host>" and g.unit[i] ==
            g.unit[task_of(g, "bwd op")]]
    assert [int(g.dur_ns[i]) for i in idle] == [49000]  # 150 - (100 + 1) us


def _launch_storm(n: int, call_us: float, kernel_us: float, lag_us: float = 5.0) -> list[dict]:
    """Hand-made trace: one thread launches ``n`` kernels back to back onto one stream; each
    kernel starts when its call has been running ``lag_us`` and the stream is free."""
    ev, free = [], 0.0
    for i in range(n):
        t = i * call_us
        ev.append(X("cuda_runtime", f"launch{i}", t, call_us, correlation=i + 1))
        s = max(t + lag_us, free)
        free = s + kernel_us
        ev.append(X("kernel", f"k{i}", s, kernel_us, pid=0, tid=7, stream=7,
                    correlation=i + 1, device=0))
    return ev


def test_launch_queue_edges(tmp_path):
    from daydream.graphstore.latency import LAUNCH_QUEUE_DEPTH as Q

    # 2000 launches 10 us apart of 15 us kernels: the GPU falls behind by one kernel every
    # 30 us, so at most 666 kernels are ever outstanding: the trace never fills the queue.
    # Every launch from the Q-th on waits (END edge) for the kernel Q places before it; none
    # had to in the trace: kernel j - Q ended at 15 j - 15340 us, before call j began (10 j).
    n = 2000
    g = build(read_trace(write(tmp_path, _launch_storm(n, 10, 15))).tables, LAT)
    got = edges(g, {"queue"})
    want = sorted(("queue", "end_end", 1000, 0, False, f"k{j - Q}", f"launch{j}")
                  for j in range(Q, n))
    assert got == want
    assert g.stats.get("launch_queue_full") == 0
    check_acyclic(g.n_tasks, g.src, g.dst, g.anchor, g.name)


def test_launch_queue_deeper_in_the_trace(tmp_path):
    # Calls 5 us apart, kernels 15 us: up to ~1333 kernels outstanding, more than the model's
    # 1024. The queue is at least as deep as the trace shows, so the edges use that depth and
    # none contradicts the trace; no call ran long, so none counts as blocked.
    from daydream.graphstore.latency import LAUNCH_QUEUE_DEPTH as Q

    n, ev = 2000, _launch_storm(2000, 5, 15)
    g = build(read_trace(write(tmp_path, ev)).tables, LAT)
    calls = [e for e in ev if e["cat"] == "cuda_runtime"]
    kends = [e["ts"] + e["dur"] for e in ev if e["cat"] == "kernel"]
    open_at = [sum(1 for i in range(j) if kends[i] > calls[j]["ts"]) for j in range(n)]
    depth = max(open_at) + 1
    assert depth > Q
    assert g.stats.get("launch_queue_full") == 0
    got = edges(g, {"queue"})
    # (a kernel that ended less than the 1 us latency before its call began binds it)
    assert got == sorted(("queue", "end_end", 1000, 0, kends[j - depth] + 1 > calls[j]["ts"],
                          f"k{j - depth}", f"launch{j}") for j in range(depth, n))


def test_launch_queue_full_in_the_trace(tmp_path):
    # Hand-made: a thread that launches 1300 kernels of 50 us with calls of 2 us as fast as
    # it can, each call blocking while its stream holds 1022 unfinished kernels (as the HTA
    # V100 ResNet-50 trace does): call j (j >= 1022) runs until kernel j - 1022 ends, then 2
    # us more. Those calls blocked: each waits, by a queue edge read from the trace, for the
    # kernel whose end released it, and keeps its 2 us (less the 1 us latency) as its own.
    ev, t, kend = [], 0.0, []
    for j in range(1300):
        start = t
        if j >= 1022:
            t = max(t, kend[j - 1022])
        t += 2.0
        ev.append(X("cuda_runtime", f"launch{j}", start, t - start, correlation=j + 1))
        ks = max(t, kend[-1] if kend else 0.0)
        kend.append(ks + 50.0)
        ev.append(X("kernel", f"k{j}", ks, 50.0, pid=0, tid=7, stream=7, correlation=j + 1,
                    device=0))
    g = build(read_trace(write(tmp_path, ev)).tables, LAT)
    blocked = [j for j in range(1022, 1300) if kend[j - 1022] > ev[2 * j]["ts"]]
    assert g.stats.get("launch_queue_full") == len(blocked) > 50
    q = {e[6]: e for e in edges(g, {"queue"})}
    for j in blocked:
        assert q[f"launch{j}"] == ("queue", "end_end", 1000, 0, True, f"k{j - 1022}",
                                   f"launch{j}")
        assert g.dur_ns[task_of(g, f"launch{j}")] == 1000
    assert set(inferred(g, "queue")) == {(f"k{j - 1022}", f"launch{j}") for j in blocked}


@pytest.mark.parametrize("per_node", [False, True])
def test_launch_queue_full_behind_a_graph_launch(tmp_path, per_node):
    # Hand-made: one cudaGraphLaunch puts 400 nodes of 10 us on stream 7 (one call, one
    # correlation id), then the thread launches 1300 kernels of 50 us with calls of 2 us as fast
    # as it can, each call blocking while the stream's queue holds 1022 unfinished slots. How
    # many slots a graph launch takes is the driver's (the trace does not say), so both ends:
    # the graph's nodes one slot each (per_node), or the whole launch one slot. A call blocks
    # until the slot 1022 places before its own is done, then runs 2 us more; it waits, by a
    # queue edge read from the trace, for that slot's last task (the graph's last node, or a
    # kernel). Counted the other way the stream would seem to hold 399 slots more (fewer),
    # and no call near the limit would count as blocked.
    ev = [X("cuda_runtime", "cudaGraphLaunch", 0.0, 20.0, correlation=1)]
    slots = []  # (end, last task) of each queue slot, in stream order
    t_node = 25.0
    for i in range(400):
        ev.append(X("kernel", f"n{i}", t_node, 10.0, pid=0, tid=7, stream=7, correlation=1,
                    device=0))
        t_node += 10.0
        if per_node or i == 399:
            slots.append((t_node, f"n{i}"))
    t, released_by = 20.0, {}
    for j in range(1300):
        start = t
        mine = len(slots)  # the slot this call's kernel takes
        if mine >= 1022:
            done, task = slots[mine - 1022]
            if done > t:
                released_by[j] = task
            t = max(t, done)
        t += 2.0
        ev.append(X("cuda_runtime", f"launch{j}", start, t - start, correlation=j + 2))
        ks = max(t, slots[-1][0])
        slots.append((ks + 50.0, f"k{j}"))
        ev.append(X("kernel", f"k{j}", ks, 50.0, pid=0, tid=7, stream=7, correlation=j + 2,
                    device=0))
    g = build(read_trace(write(tmp_path, ev)).tables, LAT)
    # per node: call 622 + i waits for node i, which ends (35 + 10 i us) after the call began
    # (20 + 2 (622 + i) us) from i = 154 on; once: every call from 1021 on waits, the first
    # for the graph's last node
    nodes = {v for v in released_by.values() if v.startswith("n")}
    assert nodes == ({f"n{i}" for i in range(154, 400)} if per_node else {"n399"})
    assert len(released_by) > 200
    assert g.stats.get("launch_queue_full") == len(released_by)
    q = {e[6]: e for e in edges(g, {"queue"})}
    for j, src in released_by.items():
        assert q[f"launch{j}"] == ("queue", "end_end", 1000, 0, True, src, f"launch{j}")
        assert g.dur_ns[task_of(g, f"launch{j}")] == 1000


def test_launch_queue_bounds_a_cpu_freed_of_launch_cost(tmp_path):
    # The storm of test_launch_queue_edges with its calls made free (what cuda_graphs does to
    # a region): without the queue the CPU would finish all 2000 launches at once; with it,
    # launch j waits for kernel j - 1024, so launch 1999 starts only after launch 1998 could
    # finish: 1 latency after kernel 974 ended.
    import pyarrow as pa
    import pyarrow.compute as pc

    from daydream.graphstore.latency import LATENCY
    from daydream.graphstore.load import graph_tables
    from daydream.simulate.engine import simulate
    from daydream.simulate.replay import to_simgraph

    n = 2000
    _, t = graph_tables(read_trace(write(tmp_path, _launch_storm(n, 10, 15))).tables)
    task = t["task"]
    calls = pc.equal(task["kind"], "api")
    task = task.set_column(task.schema.get_field_index("dur_ns"), "dur_ns",
                           pc.if_else(calls, pa.scalar(0, pa.int64()), task["dur_ns"]))
    sched = simulate(to_simgraph({**t, "task": task}))
    names = task["name"].to_pylist()
    last_call = names.index(f"launch{n - 1}")
    assert sched.start_ns[last_call] == \
        sched.end_ns[names.index(f"k{n - 2 - 1024}")] + LATENCY["queue"].ns
    # and the GPU still runs back to back: 2000 kernels of 15 us
    k_last = names.index(f"k{n - 1}")
    k_first = names.index("k0")
    assert sched.end_ns[k_last] - sched.start_ns[k_first] == n * 15_000


def test_host_gap_between_two_tasks_of_a_phase_takes_that_phase(tmp_path):
    # Hand-made trace (us), one thread inside ProfilerStep#1 (phase "other"):
    #   |## forward ## 0-10|gap 10-12|## forward ## 12-20|gap 20-25|## backward ## 25-40|
    # The gap between two forward annotations is forward overhead; the one between forward
    # and backward belongs to neither and stays "other".
    from daydream.graphstore.load import graph_tables

    ev = [X("user_annotation", "ProfilerStep#1", 0, 40),
          X("user_annotation", "## forward ##", 0, 10),
          X("user_annotation", "## forward ##", 12, 8),
          X("user_annotation", "## backward ##", 25, 15)]
    _, t = graph_tables(read_trace(write(tmp_path, ev)).tables)
    task = t["task"]
    rows = sorted((s, s + d, p) for s, d, p in zip(
        task["start_ns"].to_pylist(), task["obs_dur_ns"].to_pylist(),
        task["phase"].to_pylist(), strict=True) if d > 0)
    assert rows == [(0, 10_000, "forward"), (10_000, 12_000, "forward"),
                    (12_000, 20_000, "forward"), (20_000, 25_000, "other"),
                    (25_000, 40_000, "backward")]


def test_thread_first_task_follows_the_event_that_woke_it(tmp_path):
    # Hand-made trace (us): the main thread (tid 1) computes 0-100, then waits in backward()
    # 100-1000 (a long host stretch in "## backward ##"); the autograd thread (tid 2) appears at
    # 400 (woken 300 us after the wait began). A third thread (tid 3) first appears at 5000,
    # more than FIRST_WAKE_TOL_NS after anything: it stays tied to the trace start.
    ev = [X("cpu_op", "fwd op", 0, 100),
          X("user_annotation", "## backward ##", 100, 900),
          X("cpu_op", "bwd op", 400, 500, tid=2),
          X("cpu_op", "late op", 5000, 10, tid=3)]
    g = build(read_trace(write(tmp_path, ev)).tables, LAT)
    got = [e for e in edges(g, {"wake", "origin"}) if e[6] in ("bwd op", "late op")]
    # woken at the wake-up latency (1 us): the rest of the 300 us is wake slack
    assert got == sorted([("wake", "start_start", 1000, 299_000, True, "## backward ##",
                           "bwd op"),
                          ("origin", "end_start", 5_000_000, 0, True, "<trace start>",
                           "late op")])


def test_lower_bound_matches_searchsorted():
    """The galloping search the wake-edge pass uses, on hand-made sorted arrays with runs of
    equal values, against numpy for every query and every starting hint (far left, far right,
    exact, past the end)."""
    from daydream.graphstore.build import _lower_bound

    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 7, 64):
        a = np.sort(rng.integers(0, 20, n)).astype(np.int64)
        for v in range(-1, 22):
            want = int(np.searchsorted(a, v))
            for hint in (-3, 0, 1, n // 2, n - 1, n, n + 5, want):
                assert _lower_bound(a, np.int64(v), hint) == want, (a, v, hint)


def test_launch_of_unseen_work_waits_on_its_stream(tmp_path):
    # Hand-made (times in us): a thread launches k0..k4 (calls of 2 us; kernels back to back
    # on stream 7, k_j ending at 1000 (j + 1)), then three launches whose kernels ran after the
    # window (no kernel in the trace, as in the nsys FSDP slice, whose first such call runs
    # 110 ms): u1 (12-2003) ends 3 us after k1 ended: a full queue freed a slot, so it waits
    # for k1 by an inferred queue edge and keeps 3 - 1 (latency) = 2 us of its own; u2
    # (2005-2500) ends 500 us after k1 and 500 us before k2: nothing ended just before it, so
    # it keeps its duration; u3 (6000-6300) ends with the stream idle since 5000: none either.
    ev = []
    for j in range(5):
        ev.append(X("cuda_runtime", "cudaLaunchKernel", 2 * j, 2, correlation=j + 1))
        ks = 1000 * j if j else 10
        ev.append(X("kernel", f"k{j}", ks, 1000 * (j + 1) - ks, pid=0, tid=7, stream=7,
                    correlation=j + 1, device=0))
    ev += [X("cuda_runtime", "cudaLaunchKernel", 12, 1991, correlation=91),
           X("cuda_runtime", "cudaLaunchKernel", 2005, 495, correlation=92),
           X("cuda_runtime", "cudaLaunchKernel", 6000, 300, correlation=93)]
    g = build(read_trace(write(tmp_path, ev)).tables, LAT)
    assert g.stats.get("launch_queue_full_unseen") == 1
    assert edges(g, {"queue"}) == [("queue", "end_end", 1000, 0, True, "k1",
                                    "cudaLaunchKernel")]
    assert inferred(g, "queue") == [("k1", "cudaLaunchKernel")]
    own = {int(g.start_ns[i] - g.start_ns[0]) // 1000: int(g.dur_ns[i])
           for i, n in enumerate(g.name) if n == "cudaLaunchKernel"}
    assert own == {0: 2000, 2: 2000, 4: 2000, 6: 2000, 8: 2000, 12: 2000, 2005: 495_000,
                   6000: 300_000}


def test_a_graph_labelled_on_threads_is_the_graph_labelled_inline(monkeypatch):
    """A large graph's labels are found on a thread while it is built, and its task names
    decoded on another while its tasks are labelled (base.runner.later): its tables are
    the same, row by row, as when both are made inline (every graph below THREADED_TASKS)."""
    from daydream.graphstore import load as gload
    from tests.conftest import DATA

    conv = read_trace(DATA / "kineto" / "event_sync_single_stream.json.gz")
    tables = {t: gload._for_graph(t, conv.tables[t]) for t in gload.ACTIVITY}
    inline = gload.graph_tables(tables)[1]
    monkeypatch.setattr(gload, "THREADED_TASKS", 1)
    threaded = gload.graph_tables(tables)[1]
    assert threaded.keys() == inline.keys()
    for name, t in threaded.items():
        assert t.equals(inline[name]), name
    names = threaded["task"]["name"].to_pylist()
    assert names[0] == "<trace start>" and len(set(names)) > 10 and None not in names


@pytest.mark.parametrize("threaded", [False, True])
def test_a_cycle_is_reported_first_when_the_check_runs_beside_the_labels(monkeypatch, threaded):
    """graph_tables runs the cycle check on a thread beside the labelling of a large graph;
    a graph with a cycle is still reported as such, before any error found after the check
    (here a launch-edge check that fails too)."""
    from daydream.graphstore import load as gload
    from tests.conftest import DATA

    conv = read_trace(DATA / "kineto" / "event_sync_single_stream.json.gz")
    tables = {t: gload._for_graph(t, conv.tables[t]) for t in gload.ACTIVITY}
    real = gload.build

    def cyclic(*a, **k):
        g = real(*a, **k)
        last = g.n_tasks - 1  # an edge from the last task back to the first closes a cycle
        g.src, g.dst = np.append(g.src, last), np.append(g.dst, 1)
        g.anchor = np.append(g.anchor, g.anchor[:1])
        return g

    def launch_fails(*a):
        raise DaydreamError("launch check failed")

    monkeypatch.setattr(gload, "build", cyclic)
    monkeypatch.setattr(gload, "check_launch_edges", launch_fails)
    if threaded:
        monkeypatch.setattr(gload, "THREADED_TASKS", 1)
    with pytest.raises(DaydreamError, match="dependency graph has a cycle"):
        gload.graph_tables(tables)


def test_thread_edges_from_the_sweeps_rows_are_those_of_a_sort_by_unit():
    """graphstore.build._thread_order takes a thread's edges from the sweep's rows where task
    ids rise along them, and from a sort of all tasks by unit where they do not (a
    hand-made case: the sweep never gives one): both are the edges between consecutive
    tasks of each thread in id order, as a plain sort by unit gives them."""
    from daydream.graphstore.build import _thread_order, order_by_unit

    rng = np.random.default_rng(7)
    nthr, per = 3, 6
    c_thr = np.repeat(np.arange(nthr, dtype=np.int32), per)  # the sweep: threads in turn
    c_start = np.concatenate([np.sort(rng.integers(0, 1000, per)) for _ in range(nthr)])
    c_end = c_start + rng.integers(0, 50, len(c_start))
    for rising in (True, False):
        if rising:  # ids by start, as build numbers tasks: they rise along each thread
            cpu_id = 1 + np.argsort(np.argsort(c_start, kind="stable"), kind="stable")
        else:
            cpu_id = 1 + rng.permutation(len(c_start))
        n = 1 + len(c_start)
        unit = np.full(n, nthr, np.int32)  # task 0: the origin, on a unit of its own
        unit[cpu_id] = c_thr
        start, end = np.zeros(n, np.int64), np.zeros(n, np.int64)
        start[cpu_id], end[cpu_id] = c_start, c_end
        by_unit = order_by_unit(unit)
        u = unit[by_unit]
        same = (u[1:] == u[:-1]) & (u[1:] < nthr)
        want_prev, want_next = by_unit[:-1][same], by_unit[1:][same]
        prev, nxt, gap = _thread_order(c_thr, c_start, c_end, cpu_id, unit, nthr)
        got = sorted(zip(prev.tolist(), nxt.tolist(), gap.tolist(), strict=True))
        want = sorted(zip(want_prev.tolist(), want_next.tolist(),
                          (start[want_next] - end[want_prev]).tolist(), strict=True))
        assert got == want and len(got) == nthr * (per - 1), rising


@pytest.mark.parametrize("name, comm", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float", True),
    ("ncclDevKernel_AllGather_RING_LL", True),
    ("rcclKernel_AllReduce", True),                       # AMD's library
    ("void NCCL_something_kernel<float>()", True),         # any case
    ("ampere_sgemm_128x64_nn", False),
    ("void at::native::vectorized_elementwise_kernel<4>", False),
    ("", False),                                           # a kernel without a name
])
def test_collective_kernels_by_name(name, comm):
    assert is_comm_name(name) is comm
