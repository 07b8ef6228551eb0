"""`predict --timeline`: a real gzip under a .gz name, flow arrows from launch calls to their
GPU work, an iterations track per schedule, one iteration or a window on request, and at most
3x the input's size (issue 37)."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from daydream import api
from daydream.base.errors import DaydreamError
from tests.conftest import DATA

TOY = DATA / "kineto" / "mi250_toy_train_rocm.json.gz"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("timeline") / "s"
    api.ingest([TOY], root, jobs=1, strict=True)
    return root


def _events(path) -> list[dict]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)["traceEvents"]


def _sql(store, q: str) -> list[tuple]:
    return [tuple(r.values()) for r in json.loads(api.sql(q, store, fmt="json"))]


def test_a_gz_name_is_gzip_and_a_plain_one_is_not(store, tmp_path):
    api.predictions(str(TOY), store, ["fused_sgd"], timeline=tmp_path / "t.json.gz")
    api.predictions(str(TOY), store, ["fused_sgd"], timeline=tmp_path / "t.json")
    assert (tmp_path / "t.json.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert (tmp_path / "t.json").read_bytes()[:1] == b"{"
    assert _events(tmp_path / "t.json.gz") == _events(tmp_path / "t.json")
    # at most 3x the input's size
    assert (tmp_path / "t.json.gz").stat().st_size <= 3 * TOY.stat().st_size


def test_flows_join_each_launch_to_its_gpu_work(store, tmp_path):
    path = tmp_path / "t.json.gz"
    api.predictions(str(TOY), store, [], timeline=path)
    ev = _events(path)
    (launches,), = _sql(store, "SELECT count(*) FROM edge WHERE kind = 'launch'")
    assert launches > 0
    starts = [e for e in ev if e["ph"] == "s"]
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    # the measured schedule and its replay: every launch edge once in each
    assert len(starts) == len(ends) == 2 * launches
    names = {(e["pid"], e["tid"]): n for e in ev if e["ph"] == "M" and e["name"] ==
             "thread_name" for n in [e["args"]["name"]]}
    for s in starts:
        f = ends[s["id"]]
        assert names[(s["pid"], s["tid"])].startswith("thread")
        assert names[(f["pid"], f["tid"])].startswith("gpu")
        assert f["ts"] >= s["ts"]


def test_each_schedule_has_an_iterations_track(store, tmp_path):
    path = tmp_path / "t.json"
    api.predictions(str(TOY), store, ["fused_sgd"], timeline=path)
    ev = _events(path)
    marks = [e for e in ev if e.get("cat") == "iteration"]
    assert Counter(e["pid"] for e in marks) == {1: 2, 2: 2, 3: 2}
    # the measured process's marks span each iteration's measured tasks
    want = _sql(store, "SELECT iteration, min(start_ns) - (SELECT min(start_ns) FROM task), "
                "max(start_ns + obs_dur_ns) - (SELECT min(start_ns) FROM task) FROM task "
                "WHERE iteration IS NOT NULL GROUP BY 1 ORDER BY 1")
    got = sorted((e["args"]["iteration"], e["ts"], e["ts"] + e["dur"]) for e in marks
                 if e["pid"] == 1)
    for (i, a, b), (j, ts, te) in zip(want, got, strict=True):
        assert i == j and ts == pytest.approx(a / 1000) and te == pytest.approx(b / 1000)


def test_one_iteration_or_a_window_on_request(store, tmp_path):
    full, one, win = (tmp_path / f"{k}.json" for k in ("full", "one", "win"))
    api.predictions(str(TOY), store, [], timeline=full)
    api.predictions(str(TOY), store, [], timeline=one, timeline_iterations="1")
    api.predictions(str(TOY), store, [], timeline=win, timeline_window="0-0.001")
    n = {p.name: sum(e["ph"] == "X" for e in _events(p)) for p in (full, one, win)}
    assert n["one.json"] < n["full.json"] and n["win.json"] < n["full.json"]
    measured = [e for e in _events(one) if e["ph"] == "X" and e["pid"] == 1]
    mark = next(e for e in measured if e.get("cat") == "iteration")
    assert mark["args"]["iteration"] == 1
    for e in measured:  # every task written overlaps iteration 1's extent
        assert e["ts"] < mark["ts"] + mark["dur"] + 1e-9 and e["ts"] + e["dur"] > mark["ts"] - 1e-9
    with pytest.raises(DaydreamError, match="--timeline-iterations 'x': give N or A-B"):
        api.predictions(str(TOY), store, [], timeline=one, timeline_iterations="x")


def test_the_measured_operators_keep_their_nesting(store, tmp_path):
    """The trace's CPU operators (cpu_op and user_annotation ranges) are drawn on an ops
    track beside their thread in the measured process, at their recorded times, so a viewer
    nests them as the profiler recorded them (issue 37: nesting was flattened)."""
    path = tmp_path / "t.json"
    api.predictions(str(TOY), store, [], timeline=path)
    ev = _events(path)
    ops = [e for e in ev if e.get("cat") == "op"]
    want = _sql(store, "SELECT name, start_ns - (SELECT min(start_ns) FROM task), dur_ns, "
                "pid, tid FROM \"range\" WHERE kind IN ('cpu_op', 'user_annotation') "
                "ORDER BY start_ns, dur_ns DESC")
    assert len(ops) == len(want) > 0
    assert all(e["pid"] == 1 for e in ops)  # the measured schedule only
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev
              if e["ph"] == "M" and e["name"] == "thread_name"}
    got = sorted((e["name"], e["ts"], e["dur"], tracks[(e["pid"], e["tid"])]) for e in ops)
    exp = sorted((n, s / 1000, d / 1000, f"thread {p}:{t} ops") for n, s, d, p, t in want)
    for a, b in zip(got, exp, strict=True):
        assert a[0] == b[0] and a[3] == b[3]
        assert a[1] == pytest.approx(b[1]) and a[2] == pytest.approx(b[2])
