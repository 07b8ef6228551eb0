"""The accuracy harness's own logic, without Daydream's pipeline: section registry and merging,
the response check's pass/fail counting against bounds worked out by hand (toy A in
toytraces.py: T 1.0, G 0.575, C_max 0.370, C_sum 0.590, W 0.200 ms), step matching, and the
gates' counting. Predictions come from stand-ins whose answers are written here."""

from __future__ import annotations

import json
import re

import pytest

from bench import accuracy as acc
from bench.accuracy import __main__ as cli
from bench.accuracy import _doc as doc
from bench.accuracy import gates, response
from bench.accuracy import traces as tr
from tests.bench import toytraces as toy

SCALE = re.compile(r"factor=([0-9.]+)")


def fake_result(predicted_ms: float | None, steps: int = 3) -> dict:
    """A predict result for toy A: every step measured 1.0 ms, predicted as given."""
    its = [{"index": k, "label": f"ProfilerStep#{k + 1}", "measured_ms": 1.0,
            "baseline_ms": 1.0, "used": True} for k in range(steps)]
    if predicted_ms is not None:
        for i in its:
            i["predicted_ms"] = predicted_ms
    return {"trace_id": "toy", "measured_ms": 1.0, "baseline_ms": 1.0, "iterations": its,
            **({"predicted_ms": predicted_ms} if predicted_ms is not None else {})}


def stuck(trace, store, opts=None):
    """A model that never moves: every prediction is the measured step."""
    return fake_result(1.0 if opts else None)


def test_registry_discovers_every_measure():
    names = list(acc.discover())
    assert names[:7] == ["judge", "roles", "replay", "response", "pairs", "components", "gates"]
    with pytest.raises(ValueError):
        acc.section("replay", "again")(lambda ctx: None)


def test_merge_replaces_one_block_and_keeps_the_others():
    old = doc.merge(None, "# Head", {"a": doc.block("a", ["## A", "old a"]),
                                     "b": doc.block("b", ["## B", "old b"])}, ["a", "b"])
    new = doc.merge(old, "# New head", {"b": doc.block("b", ["## B", "new b"])}, ["a", "b"])
    assert new.startswith("# New head\n")
    assert "old a" in new and "new b" in new and "old b" not in new
    assert new.index("## A") < new.index("## B")
    # a section no longer registered stays, after the registered ones
    third = doc.merge(new, "# H", {"a": doc.block("a", ["## A2"])}, ["a"])
    assert third.index("## A2") < third.index("## B")
    # a file written before the harness (no blocks) is replaced whole
    legacy = doc.merge("# Accuracy\n\n## Baseline replay\nrows\n", "# H",
                       {"a": doc.block("a", ["## A"])}, ["a", "b"])
    assert "Baseline replay" not in legacy and "## A" in legacy
    j = doc.merge_json({"sections": {"a": {"x": 1}, "b": {"y": 2}}}, {"b": {"y": 3}},
                       {"written": "today"})
    assert j == {"sections": {"a": {"x": 1}, "b": {"y": 3}}, "written": "today"}


def test_judge_counts_by_hand(tmp_path):
    ctx = acc.Context(tmp_path / "store")
    b = ctx.bounds(toy.write_kineto(tmp_path / "a.json", toy.toy_a_events()))
    d = fake_result(1.0)
    m = response.match(b, d)
    assert [r["label"] for r, _ in m] == ["ProfilerStep#1", "ProfilerStep#2"]
    # GPU x 0.25: upper edge 0.25 * 0.575 + 0.590 + 0.200 = 0.93375 < 1.0: the headline is
    # out, and so is each of the two steps timed alone (read for information)
    p = response.judge(b, m, d, "gpu", 0.25)
    assert p["hi_ms"] == pytest.approx(0.93375) and p["lo_ms"] == pytest.approx(0.370)
    assert (p["ok"], p["steps_out"], p["by"]) == (False, 1, "headline")
    assert (p["single_steps"], p["single_steps_out"]) == (2, 2)
    # GPU x 0.5: upper 1.0775 >= 1.0: in
    assert response.judge(b, m, d, "gpu", 0.5)["ok"]
    # CPU x 0.25: upper 0.575 + 0.1475 + 0.200 = 0.9225: out
    p = response.judge(b, m, d, "cpu", 0.25)
    assert p["hi_ms"] == pytest.approx(0.9225) and not p["ok"]
    # below the lower edge (CPU x 0.5: max(0.575, 0.185)) by more than the tolerance
    low = fake_result(0.5)
    assert not response.judge(b, response.match(b, low), low, "cpu", 0.5)["ok"]
    # within the 0.5% tolerance of an edge: in
    edge = fake_result(0.575 * 0.996)
    assert response.judge(b, response.match(b, edge), edge, "cpu", 0.5)["ok"]


def test_judge_loose_on_a_gpu_bound_trace():
    row = {"T_ms": 100.0, "G_ms": 95.0, "G_all_ms": 95.0, "G_stream_ms": 95.0,
           "C_max_ms": 20.0, "C_sum_ms": 30.0, "W_ms": 1.0}
    b = {"rule": "whole trace", "steps": [dict(row, label="whole trace", steady=True)],
         "median": row, "gpu_bound": True, "cpu_bound": False}
    b["mean"] = row
    d = {"iterations": [{"index": 0, "measured_ms": 100.0, "predicted_ms": 60.0}],
         "predicted_ms": 60.0}
    m = response.match(b, d)
    # GPU x 0.5: [max(47.5, 20), 47.5 + 30 + 1] = [47.5, 78.5]; 60 > 1.1 * 47.5 = 52.25
    p = response.judge(b, m, d, "gpu", 0.5)
    assert p["ok"] and not p["tight"] and p["steps_loose"] == 1
    d["predicted_ms"] = 50.0
    assert response.judge(b, m, d, "gpu", 0.5)["tight"]
    # GPU x 0.2: 19 < C_max 20: the CPU sets the lower edge, the 10% rule does not apply
    d["predicted_ms"] = 45.0
    p = response.judge(b, m, d, "gpu", 0.2)
    assert p["ok"] and p["tight"]
    # the CPU's serial work C_union decides instead of C_max where the bounds have it:
    # f G = 47.5 < C_union 50: the GPU no longer sets the step alone
    b["mean"] = dict(row, C_union_ms=50.0)
    d["predicted_ms"] = 60.0
    p = response.judge(b, m, d, "gpu", 0.5)
    assert p["ok"] and p["tight"]


def test_match_needs_equal_lengths_and_falls_back_to_the_headline(tmp_path):
    ctx = acc.Context(tmp_path / "store")
    b = ctx.bounds(toy.write_kineto(tmp_path / "a.json", toy.toy_a_events()))
    d = fake_result(1.0)
    for i in d["iterations"]:
        i["measured_ms"] = 1.05  # 5% off: not the same windows
    assert response.match(b, d) == []
    d = {"predicted_ms": 1.0}  # no iterations: the headline alone, against the mean step
    p = response.judge(b, [], d, "gpu", 0.25)
    assert p["by"] == "headline" and not p["ok"] and p["single_steps"] == 0
    d = {"predicted_ms": 2.0, "predicted_steady_ms": 1.0}
    assert response.headline(d) == 1.0


def test_response_section_end_to_end_with_a_stuck_model(tmp_path, monkeypatch):
    """The stuck model fails exactly GPU x 0.25 and CPU x 0.25 on toy A (above); the section
    is merged into a file that already has another, which stays."""
    path = toy.write_kineto(tmp_path / "a.json", toy.toy_a_events())
    monkeypatch.setattr(tr, "training", lambda: [("toy A", path)])
    monkeypatch.setattr(acc, "PLOTS", tmp_path / "plots")
    monkeypatch.setattr(response, "PLOTS", tmp_path / "plots")
    out = tmp_path / "accuracy.md"
    out.write_text(doc.merge(None, "# x", {"gates": doc.block("gates", ["## Gates", "kept"])},
                             ["gates"]))
    ctx = acc.Context(tmp_path / "store", predict=stuck)
    assert cli.main(["--only", "response", "--out", str(out)], ctx=ctx) == 0
    text = out.read_text()
    assert "kept" in text and "Points out of bounds: **2**" in text
    data = json.loads(out.with_suffix(".json").read_text())["sections"]["response"]
    assert data["failures"] == 2 and data["loose"] == 0
    # the stuck model is "no change": the naive column scores it the same
    assert data["naive"]["no_change"] == {"failures": 2, "loose": 0}
    assert "| clipped Amdahl |" in text
    pts = data["traces"]["toy A"]["points"]
    assert sorted((p["which"], p["f"]) for p in pts if not p["ok"]) == [("cpu", 0.25),
                                                                       ("gpu", 0.25)]
    assert (tmp_path / "plots" / "response_toy_a.png").stat().st_size > 0


def test_replay_section_says_not_available(tmp_path, monkeypatch):
    from bench import edge_evidence
    path = toy.write_kineto(tmp_path / "a.json", toy.toy_a_events())
    monkeypatch.setattr(tr, "training", lambda: [("toy A", path)])
    monkeypatch.setattr(edge_evidence, "evidence", lambda store: {
        "total": {k: {"instances": 4, "confirmed": 1, "contradicted": 0, "no_record": 3}
                  for k in edge_evidence.KINDS},
        "evidence": {k: {"rule": "r", "confirmed_by": "c"} for k in edge_evidence.KINDS}})
    ctx = acc.Context(tmp_path / "store", predict=stuck)
    r = acc.discover()["replay"].run(ctx)
    row = next(line for line in r.lines if line.startswith("| toy A"))
    assert row.count(acc.NA) == 4 and "0.00%" in row
    assert r.data["traces"]["toy A"]["explained_mean_pct"] is None
    assert "| wake | r | c | 4 | 1 | 0 | 3 | 25% |" in r.lines

    def explained(trace, store, opts=None):
        d = fake_result(None)
        for i, v in zip(d["iterations"], (1.01, 0.97, 1.0), strict=True):
            i["explained_ms"] = v
        return d
    r = acc.discover()["replay"].run(acc.Context(tmp_path / "s2", predict=explained))
    t = r.data["traces"]["toy A"]
    assert t["explained_mean_pct"] == pytest.approx((1 + 3 + 0) / 3)
    assert t["explained_worst_pct"] == pytest.approx(3.0)


def test_gates_count_formats():
    assert gates.count([{"name": "a", "ok": True}, {"name": "b", "ok": False}]) == \
        (2, 1, ["b"])
    assert gates.count({"floor": True, "slowdown": False}) == (2, 1, ["slowdown"])
    assert gates.count([{"name": "x", "status": "pass"}, {"name": "y", "status": "FAIL"}]) == \
        (2, 1, ["y"])
    assert gates.count(None) == (0, 0, [])


def test_gates_section_without_gates(tmp_path, monkeypatch):
    path = toy.write_kineto(tmp_path / "a.json", toy.toy_a_events())
    monkeypatch.setattr(tr, "training", lambda: [("toy A", path)])
    r = acc.discover()["gates"].run(acc.Context(tmp_path / "store", predict=stuck))
    assert r.data["available"] is False and acc.NA in "\n".join(r.lines)


def test_judge_without_steps_reads_the_key_asked_for():
    """A job's bounds have no steps: its baseline point reads ``baseline_ms`` itself."""
    row = {"T_ms": 10.0, "G_ms": 5.0, "G_all_ms": 5.0, "G_stream_ms": 5.0, "C_max_ms": 4.0,
           "C_sum_ms": 6.0, "W_ms": 1.0}
    b = {"rule": "job", "steps": [], "median": row, "mean": row, "gpu_bound": False,
         "cpu_bound": False}
    p = response.judge(b, [], {"baseline_ms": 10.0}, "gpu", 1.0, key="baseline_ms")
    # [max(5, 4), 5 + 6 + 1] = [5, 12]
    assert (p["predicted_ms"], p["lo_ms"], p["hi_ms"], p["ok"]) == (10.0, 5.0, 12.0, True)
    assert response.judge(b, [], {}, "gpu", 1.0)["predicted_ms"] is None


def test_traces_are_shown_by_relative_paths(tmp_path):
    """Docs name traces relative to the repository or to ../shared, never by this machine's
    path; the committed docs hold no absolute path of a trace file."""
    assert acc.shown(acc.ROOT / "tests" / "data" / "x.json.gz") == "tests/data/x.json.gz"
    assert acc.shown(acc.ROOT.parent / "shared" / "traces" / "a.json") == "../shared/traces/a.json"
    assert acc.shown(tmp_path / "elsewhere" / "b.json.gz") == "b.json.gz"
    absolute = re.compile(r"(?<![\w.])/(?:[\w.-]+/){2,}[\w.-]+\.(?:json|gz|sqlite)")
    for name in ("accuracy.md", "accuracy.json"):
        text = (acc.ROOT / "docs" / name).read_text()
        assert not absolute.search(text), absolute.search(text).group(0)


def test_shared_traces_are_shown_by_relative_paths_through_a_link(tmp_path, monkeypatch):
    # a checkout whose ../shared is a link to a folder outside the checkout's parent: the
    # traces resolve there, and are still written as ../shared/traces/...
    from bench import manifest

    (tmp_path / "real" / "shared" / "traces" / "hta").mkdir(parents=True)
    (tmp_path / "work" / "repo").mkdir(parents=True)
    (tmp_path / "work" / "shared").symlink_to(tmp_path / "real" / "shared")
    monkeypatch.setattr(acc, "ROOT", tmp_path / "work" / "repo")
    monkeypatch.setattr(manifest, "SHARED", tmp_path / "work" / "shared" / "traces")
    linked = tmp_path / "work" / "repo" / ".." / "shared" / "traces" / "hta" / "a.json.gz"
    assert acc.shown(linked) == "../shared/traces/hta/a.json.gz"


def test_gates_matrix_marks_failures_refusals_and_unnamed_slowdowns(tmp_path, monkeypatch):
    """Every optimization on every trace: a failed gate is marked in its cell, a refusal
    (DaydreamError) is ``n/a`` with its reason listed once for the columns it holds, any
    other exception is a crash, and a slowdown whose gates name no tasks is counted."""
    from daydream.base.errors import DaydreamError
    a = toy.write_kineto(tmp_path / "a.json", toy.toy_a_events())
    b = toy.write_kineto(tmp_path / "b.json", toy.toy_a_events())
    monkeypatch.setattr(tr, "training", lambda: [("toy A", a), ("toy B", b)])
    monkeypatch.setattr(gates, "specs", lambda: [("fast", "fast"), ("slow", "slow"),
                                                 ("named", "named"), ("nope", "nope"),
                                                 ("boom", "boom")])

    def model(trace, store, opts=None):
        spec = (opts or [None])[0]
        if spec == "nope":
            raise DaydreamError("nope: the trace runs SGD, not adam")
        if spec == "boom" and trace == str(b):
            raise KeyError("x")
        d = fake_result({"fast": 0.5, "slow": 1.25, "named": 2.0}.get(spec, 1.0))
        d["speedup"] = 1.0 / d["predicted_ms"]
        ok = {"name": "floor", "ok": True, "note": ""}
        d["gates"] = {"fast": [ok, {"name": "applies", "ok": False, "note": "x"}],
                      "slow": [{"name": "no_slowdown", "ok": False,
                                "note": "slow: no task's time grew"}],
                      "named": [{"name": "slowdown_named", "ok": True,
                                 "note": "named predicts 1 -> 2 ms; tasks whose time grew "
                                         "per iteration: recompute +1.00 ms"}]}.get(spec, [ok])
        return d
    r = acc.discover()["gates"].run(acc.Context(tmp_path / "store", predict=model))
    text = "\n".join(r.lines)
    assert "| `fast` | 2.00x ✗applies | 2.00x ✗applies |" in text
    assert "| `slow` | 0.80x ✗no_slowdown | 0.80x ✗no_slowdown |" in text
    assert "| `nope` | n/a | n/a |" in text and "| `boom` | 1.00x | **crash** |" in text
    assert "- `nope`: 1, 2: the trace runs SGD, not adam" in text
    assert "- 1. `named` 0.50x: tasks whose time grew per iteration: recompute +1.00 ms" in text
    # two traces x (slow, named) slower; the two `slow` ones name no task
    assert (r.data["slowdowns"], r.data["slowdowns_unnamed"], r.data["crashes"],
            r.data["refused"]) == (4, 2, 1, 3)
    cells = {(c["trace"], c["opt"]): c for c in r.data["matrix"]}
    assert cells[(acc.shown(a), "fast")]["failed"] == ["applies"]
    assert cells[(acc.shown(b), "boom")]["refused"].startswith("CRASH KeyError")


def test_amp_factors_reproduce_the_published_peak_ratios():
    """The model's compute-bound FP32 -> FP16 factor on each GPU of the AMP table is the
    vendor's peak ratio, written in bench/accuracy/amp_factors.py from the whitepapers and
    datasheets, not read from the GPU table: V100 125/15.7, A100 312/19.5 (TF32 312/156),
    RTX 2080 Ti 56.9/14.2 (GeForce's FP32-accumulate rate); bandwidth-bound kernels 2x."""
    from bench.accuracy import amp_factors
    lines, rows = amp_factors.factors()
    by = {r["key"]: r for r in rows}
    for r in rows:
        assert r["compute_fp32"] == pytest.approx(r["published_fp32"], rel=0.01), r["gpu"]
        if r["published_tf32"] is not None:
            assert r["compute_tf32"] == pytest.approx(r["published_tf32"], rel=0.01)
        # without shapes a class's factor lies between the bandwidth-bound 2x and the peak
        assert 2.0 <= r["conv_fp32"] <= r["compute_fp32"] and r["bandwidth_bound"] == 2.0
    assert by["v100-sxm2-32gb"]["published_fp32"] == pytest.approx(125 / 15.7)
    assert by["a100-sxm4-80gb"]["compute_tf32"] == pytest.approx(2.0, rel=1e-3)
    assert by["rtx-2080-ti"]["compute_fp32"] == pytest.approx(56.9 / 14.2, rel=0.01)
    assert any("| NVIDIA Tesla V100 SXM2 32GB | 7.96x | 7.96x |" in x for x in lines)


FAKE_JUDGE = """import json, sys
assert "--json" in sys.argv and "--daydream" in sys.argv
print(json.dumps({"passed": 1, "cases": 2, "rows": [
    {"case": "a pair", "ok": True, "result": "step ms predicted 1.0, measured 1.0: +0.0%"},
    {"case": "a bound", "ok": False, "result": "GPU x0.5: speedup 1.10x | physical 1.98x"}]}))
print("judge: 1/2 cases pass")
sys.exit(1)
"""


def test_judge_scorecard_heads_the_document(tmp_path, monkeypatch):
    """The judge's JSON is read as it prints it (its exit status 1 on a failing case is a
    result), its rows written down unchanged, first in the file."""
    from bench.accuracy import __main__ as cli
    from bench.accuracy import judge
    fake = tmp_path / "score.py"
    fake.write_text(FAKE_JUDGE)
    monkeypatch.setattr(judge, "JUDGE", fake)
    out = tmp_path / "acc.md"
    ctx = acc.Context(tmp_path / "store", predict=stuck)
    assert cli.main(["--only", "judge", "--only", "pairs", "--out", str(out)], ctx=ctx) == 0
    text = out.read_text()
    assert text.index("The judge's scorecard") < text.index("Real pairs")
    assert "**judge: 1/2 cases pass**" in text
    assert "| a bound | **FAIL** | GPU x0.5: speedup 1.10x \\| physical 1.98x |" in text
    data = json.loads(out.with_suffix(".json").read_text())["sections"]["judge"]
    assert data["passed"] == 1 and [r["ok"] for r in data["rows"]] == [True, False]
    # a judge that prints no JSON is an error in the section, never a pass
    fake.write_text("print('judge: 0/0 cases pass')")
    r = acc.discover()["judge"].run(ctx)
    assert r.data.get("error") and "could not run" in "\n".join(r.lines)


def test_naive_predictors_by_hand():
    """The clipped-Amdahl formula and "no change", judged by the same edges and rules."""
    row = {"T_ms": 100.0, "G_ms": 95.0, "G_all_ms": 95.0, "G_stream_ms": 95.0,
           "C_max_ms": 20.0, "C_sum_ms": 30.0, "W_ms": 1.0}
    b = {"mean": row, "median": row, "gpu_bound": True, "cpu_bound": False}
    # GPU x 0.5: max(100 - 47.5, 20, 47.5) = 52.5 in [47.5, 78.5], above 1.1 x 47.5 = 52.25
    n = response.naive(b, "gpu", 0.5)
    assert n["amdahl_ms"] == pytest.approx(52.5)
    assert (n["amdahl_out"], n["amdahl_loose"]) == (0, 1)
    assert (n["no_change_ms"], n["no_change_out"], n["no_change_loose"]) == (100.0, 1, 0)
    # GPU x 0.9: max(90.5, 20, 85.5) = 90.5 in [85.5, 116.5], within 10% of 85.5
    n = response.naive(b, "gpu", 0.9)
    assert n["amdahl_ms"] == pytest.approx(90.5) and not n["amdahl_out"] \
        and not n["amdahl_loose"]
    # CPU x 0.5: max(100 - 10, 95, 10) = 95; bounds [95, 95 + 15 + 1]: in, and not CPU-bound
    n = response.naive(b, "cpu", 0.5)
    assert n["amdahl_ms"] == pytest.approx(95.0) and not n["amdahl_out"]
    assert response.amdahl(row, "cpu", 1.2) == pytest.approx(104.0)
