"""Graph lanes (graphstore.build._graph_lanes): the nodes of one CUDA graph launch that ran
side by side on their stream run on lane units, and the replay keeps the trace's times."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from daydream.graphstore.build import build
from daydream.graphstore.load import graph_tables
from daydream.ingest.convert import read_trace
from daydream.simulate.replay import replay
from daydream.transforms import Context, rewrite
from tests.conftest import DATA
from tests.graphstore.test_build import LAT, X, edges

RECSYS = DATA / "kineto" / "recsys_v100_rank1_of2.json.gz"
GPU = "scale(select=\"kind IN ('kernel','memcpy','memset','comm')\",factor={f})"


def _graph_launch(tmp_path: Path, mixed: bool = False) -> Path:
    """Hand-made trace (times in us), not a real capture:

    thread 1: |ProfilerStep#1 0-60 [launchP 0-2] [cudaGraphLaunch 4-8] [launchQ 50-52]|
    stream 7:  |kP 3-9|gA 10-----------------30|gD 31-40|     |kQ 53-55|
                         |gB 12-18| |gC 20-26|

    gA..gD are the nodes of the one graph launch (correlation 2); gB and gC ran beside gA on
    stream 7, as a graph's parallel branch shows in a profile. ``mixed``: gB carries another
    call's correlation id instead (two launches overlapping: no graph lane)."""
    ev = [X("user_annotation", "ProfilerStep#1", 0, 60),
          X("cuda_runtime", "launchP", 0, 2, correlation=1),
          X("cuda_runtime", "cudaGraphLaunch", 4, 4, correlation=2),
          X("cuda_runtime", "launchQ", 50, 2, correlation=3)]
    k = dict(pid=0, tid=7, stream=7, device=0)
    ev += [X("kernel", "kP", 3, 6, correlation=1, **k),
           X("kernel", "gA", 10, 20, correlation=2, **k),
           X("kernel", "gB", 12, 6, correlation=9 if mixed else 2, **k),
           X("kernel", "gC", 20, 6, correlation=2, **k),
           X("kernel", "gD", 31, 9, correlation=2, **k),
           X("kernel", "kQ", 53, 2, correlation=3, **k)]
    f = tmp_path / "graph_launch.json"
    f.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    return f


def _observed(t: dict) -> np.ndarray:
    """Observed task starts on the simulator's clock (the trace start at 0)."""
    start = t["task"]["start_ns"].to_numpy()
    return start - start[0]


def test_overlapping_nodes_of_one_graph_launch_run_on_a_lane(tmp_path):
    g = build(read_trace(_graph_launch(tmp_path)).tables, LAT)
    unit = {g.name[i]: g.unit_name[g.unit[i]] for i in range(g.n_tasks)}
    # gB overlaps gA: lane 1; gC starts after gB ended, still beside gA: lane 1 after gB;
    # gD starts after every node ended: back on the stream's own unit
    assert [unit[n] for n in ("kP", "gA", "gB", "gC", "gD", "kQ")] == [
        "gpu 0 stream 7", "gpu 0 stream 7", "gpu 0 stream 7 lane 1",
        "gpu 0 stream 7 lane 1", "gpu 0 stream 7", "gpu 0 stream 7"]
    assert g.unit_kind[-1] == "stream" and g.unit_stream[-1] == 7 and g.unit_device[-1] == 0
    assert g.stats.get("graph_lanes") == 2 and g.stats.get("stream_overlap") == 1
    # each node follows the task before it on its lane and, on the other lane, the last task
    # that ended by its start (unless the task before it on its lane already follows that
    # one): gB after kP (not after gA, which was still running); gC after gB only (kP is
    # gB's already); gD after gA and gC (the join), gC's edge not binding (gA ended later);
    # kQ after gD only. LAT's stream latency is 1 us: gB's 12 - 9 - 1 = 2 us is slack.
    assert edges(g, {"stream"}) == sorted([
        ("stream", "end_start", 1000, 0, True, "kP", "gA"),
        ("stream", "end_start", 1000, 2000, True, "kP", "gB"),
        ("stream", "end_start", 1000, 1000, True, "gB", "gC"),
        ("stream", "end_start", 1000, 0, True, "gA", "gD"),
        ("stream", "end_start", 1000, 0, False, "gC", "gD"),
        ("stream", "end_start", 1000, 0, False, "gD", "kQ"),
    ])


def test_graph_lanes_replay_the_trace_exactly_and_keep_its_order_under_a_what_if(tmp_path):
    _, t = graph_tables(read_trace(_graph_launch(tmp_path)).tables, latency=LAT)
    name = t["task"]["name"].to_pylist()
    at = {n: name.index(n) for n in ("kP", "gA", "gB", "gC", "gD", "kQ")}
    r = replay(t)
    # every task where the trace has it (a stream unit running one task at a time would
    # have started gB at gA's end, 30 us, and gD at 43)
    assert np.array_equal(r.schedule.start_ns, _observed(t))
    assert [i.simulated_ns for i in r.iterations] == [i.measured_ns for i in r.iterations]
    # the GPU twice as slow: the branch still runs beside gA, and gD still waits for both
    s = replay(rewrite(t, GPU.format(f=2), Context())).schedule
    start, end = s.start_ns, s.end_ns
    assert start[at["gB"]] < end[at["gA"]] and start[at["gC"]] < end[at["gA"]]
    assert start[at["gB"]] >= end[at["kP"]] and start[at["gC"]] >= end[at["gB"]]
    assert start[at["gD"]] >= max(end[at["gA"]], end[at["gC"]])


def test_overlap_of_two_launches_stays_serialized(tmp_path):
    # gB with another call's correlation id: gA, gB and gC overlap as one cluster of two
    # launches, which is no graph's parallel branch; they stay on the stream, in order (gB
    # bound by gA's end, 12 - 30 - 1 us: what a serializing unit replays late)
    g = build(read_trace(_graph_launch(tmp_path, mixed=True)).tables, LAT)
    assert set(g.unit_name) == {"thread 1:1", "gpu 0 stream 7", "origin"}
    assert g.stats.get("graph_lanes") == 0
    assert ("stream", "end_start", 1000, -19000, True, "gA", "gB") in edges(g, {"stream"})


def test_recsys_v100_replays_every_iteration_exactly():
    # HTA's recsys V100 trace: its 31 overlaps on one stream are all nodes of one
    # cudaGraphLaunch each; on one serializing stream unit iterations 1, 2 and 5 replayed
    # +0.03%, +0.02% and +0.01% long
    _, t = graph_tables(read_trace(RECSYS).tables)
    r = replay(t)
    assert len(r.iterations) == 6
    assert [i.simulated_ns for i in r.iterations] == [i.measured_ns for i in r.iterations]
    assert np.array_equal(r.schedule.start_ns, _observed(t))
    lanes = [n for n in t["unit"]["name"].to_pylist() if "lane" in n]
    assert lanes == ["gpu 1 stream 7 lane 1", "gpu 1 stream 7 lane 2"]
