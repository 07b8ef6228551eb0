"""Polling threads and polled waits, and GPU timestamps rounded to a tick: time that the trace
shows a thread or stream waiting for the GPU is a wait on the GPU, not work.

Hand-made traces for the exact rules (they say so, with their times worked out by hand), and
two real GPU-bound V100 traces with a polling thread each (tests/data/kineto/SOURCE.md)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from daydream.graphstore.build import build, timestamp_tick_ns
from daydream.graphstore.schema import EDGE_KINDS, TASK_KINDS
from daydream.ingest.convert import read_trace
from tests.conftest import DATA
from tests.graphstore.test_build import LAT, X, write

RESNET = DATA / "kineto" / "resnet50_v100_rank0.json.gz"
RECSYS = DATA / "kineto" / "recsys_v100_rank1_of2.json.gz"


def _edges_into(g, dst: int, kind: str) -> list[tuple[int, int, int, bool, bool]]:
    """(src, lag_ns, slack_ns, binding, inferred) of the edges of KIND into task DST."""
    k = EDGE_KINDS.index(kind)
    return [(int(s), int(lg), int(sl), bool(b), bool(i)) for s, d, ek, lg, sl, b, i in
            zip(g.src, g.dst, g.ekind, g.lag_ns, g.slack_ns, g.binding, g.inferred,
                strict=True) if d == dst and ek == k]


def _task(g, unit: int, kind: str, start_ns: int) -> int:
    hit = np.flatnonzero((g.unit == unit) & (g.kind == TASK_KINDS.index(kind))
                         & (g.start_ns == start_ns))
    assert len(hit) == 1, (unit, kind, start_ns, hit)
    return int(hit[0])


def _poller_trace(tmp_path: Path) -> Path:
    """Hand-made (times in us): thread 1 launches kernel k (stream 7) at 0-2; k runs 5-50.
    Thread 2 only polls: cudaEventQuery at 10-11, 30-31 and 60-61, with its stretches
    between them untraced. k ends inside the stretch 31-60, so that stretch waits for k:
    it resumes at 50 + the sync latency (1 us) and keeps 60 - 51 = 9 us of its own; the
    stretch 11-30, in which no GPU task ended, is left as it is."""
    ev = [X("cpu_op", "aten::mm", 0, 3, tid=1),
          X("cuda_runtime", "cudaLaunchKernel", 0, 2, tid=1, correlation=1),
          X("kernel", "k", 5, 45, pid=0, tid=7, correlation=1, stream=7, device=0)]
    ev += [X("cuda_runtime", "cudaEventQuery", t, 1, tid=2, correlation=100 + t)
           for t in (10, 30, 60)]
    return write(tmp_path, ev)


def test_a_polling_threads_stretch_waits_for_the_gpu_task_that_ended_in_it(tmp_path):
    g = build(read_trace(_poller_trace(tmp_path)).tables, LAT)
    counts = {r["name"]: r["count"] for r in g.stats.rows()}
    assert counts["polling_threads"] == 1 and counts["poll_waits"] == 1
    k = int(np.flatnonzero(g.kind == TASK_KINDS.index("kernel"))[0])
    thr2 = int(g.unit[np.flatnonzero(g.start_ns == 10_000)[0]])
    waited = _task(g, thr2, "host", 31_000)
    assert _edges_into(g, waited, "sync") == [(k, 1_000, 0, True, True)]
    assert int(g.dur_ns[waited]) == 9_000 and int(g.obs_dur_ns[waited]) == 29_000
    idle = _task(g, thr2, "host", 11_000)  # nothing ended in it: as the trace shows it
    assert _edges_into(g, idle, "sync") == [] and int(g.dur_ns[idle]) == 19_000


def test_a_thread_that_launches_is_no_poller(tmp_path):
    """The same trace with one launch on the querying thread: its stretches are not waits
    (it is a working thread; its queries are not two in a row outside an operator)."""
    ev = json.loads(_poller_trace(tmp_path).read_text())["traceEvents"]
    ev += [X("cuda_runtime", "cudaLaunchKernel", 70, 2, tid=2, correlation=2),
           X("kernel", "k2", 75, 5, pid=0, tid=7, correlation=2, stream=7, device=0)]
    g = build(read_trace(write(tmp_path, ev)).tables, LAT)
    counts = {r["name"]: r["count"] for r in g.stats.rows()}
    assert counts.get("polling_threads", 0) == 0
    # the queries at 30 and 60 are two in a row, outside any operator: still a polled wait
    assert counts["poll_waits"] == 1


def test_a_gpu_start_one_tick_before_another_streams_end_is_a_wait(tmp_path):
    """Hand-made (us): kernel a (stream 7), launched at 0-2, runs 10-50; kernel b (stream 8)
    was launched after it, at 3-5, and starts at 49, one microsecond before a ends (launched
    before a, b could not have waited for it: graphstore.build._in_launch_order): with
    whole-microsecond timestamps
    the two times were rounded apart, and b waited for a (an inferred wait, its slack the
    -2 us the trace shows beyond the 1 us latency). With a start 2 us before a's end, or
    with nanosecond timestamps (b at 49.5), there is no wait."""
    def trace(b_start):
        return [X("cuda_runtime", "cudaLaunchKernel", 0, 2, correlation=1),
                X("cuda_runtime", "cudaLaunchKernel", 3, 2, correlation=2),
                X("kernel", "a", 10, 40, pid=0, tid=7, correlation=1, stream=7, device=0),
                X("kernel", "b", b_start, 5, pid=0, tid=8, correlation=2, stream=8,
                  device=0)]
    g = build(read_trace(write(tmp_path, trace(49))).tables, LAT)
    names = [g.name[i] for i in range(g.n_tasks)]
    a, b = names.index("a"), names.index("b")
    assert _edges_into(g, b, "wait") == [(a, 1_000, -2_000, True, True)]
    g = build(read_trace(write(tmp_path, trace(48))).tables, LAT)
    names = [g.name[i] for i in range(g.n_tasks)]
    assert _edges_into(g, names.index("b"), "wait") == []
    g = build(read_trace(write(tmp_path, trace(49.5))).tables, LAT)
    names = [g.name[i] for i in range(g.n_tasks)]
    assert _edges_into(g, names.index("b"), "wait") == []


def test_the_tick_is_a_microsecond_only_where_every_time_is_whole():
    assert timestamp_tick_ns(np.array([1_000, 5_000]), np.array([2_000, 9_000])) == 1_000
    assert timestamp_tick_ns(np.array([1_000, 5_001]), np.array([2_000, 9_000])) == 0
    assert timestamp_tick_ns(np.zeros(0, np.int64), np.zeros(0, np.int64)) == 0


def _queries_by_thread(path: Path) -> dict[tuple, int]:
    with gzip.open(path) as f:
        ev = json.load(f)["traceEvents"]
    out: dict[tuple, int] = {}
    for e in ev:
        if e.get("cat") == "cuda_runtime" and e.get("name") == "cudaEventQuery":
            out[(e["pid"], e["tid"])] = out.get((e["pid"], e["tid"]), 0) + 1
    return out


def test_the_real_polling_thread_is_waiting_not_working():
    """hta/resnet50_v100_rank0: thread -247463936 makes 58 cudaEventQuery calls and nothing
    else (read from the JSON here); it was 40.6% busy in the replay when its untraced stretches
    counted as host work. Its own time is now at most 5% of the trace."""
    q = _queries_by_thread(RESNET)
    assert q[(1102, -247463936)] == 58
    g = build(read_trace(RESNET).tables)
    counts = {r["name"]: r["count"] for r in g.stats.rows()}
    assert counts["polling_threads"] == 1
    unit = g.unit_tid.index(-247463936)
    mine = g.unit == unit
    span = int((g.start_ns + g.obs_dur_ns).max() - g.start_ns[1:].min())
    assert g.obs_dur_ns[mine].sum() > 0.3 * span  # what the trace shows it in: mostly idle
    assert g.dur_ns[mine].sum() <= 0.05 * span


def _gap_trace(tmp_path: Path, kernel_us: float) -> Path:
    """Hand-made (us): thread 1 launches k at 0-2 (inside an op, 0-20); k runs 5 to
    5 + KERNEL_US; the thread's next call is at 600, with nothing traced between 20 and 600.
    While k runs past 20 the 580 us stretch may be untraced CPU work or a wait: untraced
    slack. With k over before the stretch began, nothing of the thread's is running: work."""
    return write(tmp_path, [
        X("cpu_op", "aten::mm", 0, 20),
        X("cuda_runtime", "cudaLaunchKernel", 0, 2, correlation=1),
        X("kernel", "k", 5, kernel_us, pid=0, tid=7, correlation=1, stream=7, device=0),
        X("cpu_op", "aten::add", 600, 10),
        X("cuda_runtime", "cudaLaunchKernel", 601, 2, correlation=2),
        X("kernel", "k2", 700, 5, pid=0, tid=7, correlation=2, stream=7, device=0)])


def test_an_untraced_stretch_while_the_gpu_runs_is_untraced_slack(tmp_path):
    from daydream.graphstore.load import slack_table
    g = build(read_trace(_gap_trace(tmp_path, 800)).tables, LAT)
    gap = _task(g, 0, "host", 20_000)
    assert int(g.obs_dur_ns[gap]) == 580_000
    assert int(g.dur_ns[gap]) == 0 and int(g.task_slack_ns[gap]) == 580_000
    t = slack_table(g, np.zeros(g.n_tasks, np.int64)).to_pylist()
    assert {r["kind"]: r["slack_ns"] for r in t}.get("untraced") == 580_000
    g = build(read_trace(_gap_trace(tmp_path, 1)).tables, LAT)  # k ran 5-6: nothing in flight
    gap = _task(g, 0, "host", 20_000)
    assert int(g.dur_ns[gap]) == 580_000 and int(g.task_slack_ns[gap]) == 0


def test_the_graph_and_the_bounds_draw_one_line_between_work_and_waiting():
    from bench import bounds
    from daydream.graphstore.build import UNTRACED_GAP_NS
    assert bounds.GAP_NS == UNTRACED_GAP_NS


def test_the_replay_keeps_or_drops_untraced_slack_by_its_kind():
    """simulate.replay.task_durations: a host task's task slack is untraced, a collective's is
    a peer wait; the headline (all slack) keeps both, the interval's low end (none) drops both,
    and a set keeps only its kinds. Hand-made columns."""
    import pyarrow as pa

    from daydream.simulate.replay import task_durations
    t = pa.table({"kind": pa.array(["host", "comm", "kernel"]).dictionary_encode(),
                  "dur_ns": [0, 10, 5], "slack_ns": [580, 7, 0]})
    assert task_durations(t, True).to_pylist() == [580, 17, 5]
    assert task_durations(t, False).to_pylist() == [0, 10, 5]
    assert task_durations(t, frozenset({"untraced"})).to_pylist() == [580, 10, 5]
    assert task_durations(t, frozenset({"peer_wait"})).to_pylist() == [0, 17, 5]
    assert task_durations(t, frozenset({"stream"})).to_pylist() == [0, 10, 5]
