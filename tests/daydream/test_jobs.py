"""Jobs through daydream: the 8 ranks of the real DLRM run (facebookresearch/param,
tests/data/kineto/dlrm_8ranks) predicted as one job by ``daydream.api.predict`` (what
``daydream predict JOB`` runs), their collectives kept for SQL; the FSDP Nsight slice (two
processes, two GPUs in one export) as a job by itself."""

from __future__ import annotations

import gzip
import json

import pytest

from daydream import api
from daydream.base.errors import DaydreamError
from tests.conftest import DATA, DLRM, dlrm_nccl

FSDP = DATA / "nsys" / "fsdp_t5_2xh100_1s.sqlite"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    st = tmp_path_factory.mktemp("job") / "store"
    api.ingest([DLRM], st, jobs=1, strict=True)
    return st


def test_dlrm_ranks_form_one_job(store):
    js = api.jobs(store)
    assert list(js) == ["dlrm_8ranks"]
    assert [m["rank"] for m in js["dlrm_8ranks"]] == list(range(8))
    assert all(m["file"].endswith(f"rank{m['rank']}.kineto.json.gz")
               for m in js["dlrm_8ranks"])


def test_job_replays_within_2pct_per_rank(store):
    d = api.predict(str(DLRM), store)
    assert d.job.name == "dlrm_8ranks" and d.job.world_size == 8
    assert [r.rank for r in d.job.ranks] == list(range(8))
    # per-rank step times of the shared README: 12.5-19.9 ms
    meas = [r.measured_ms for r in d.job.ranks]
    assert min(meas) == pytest.approx(12.509) and max(meas) == pytest.approx(19.901)
    for r in d.job.ranks:
        assert abs(r.baseline_ms - r.measured_ms) <= 0.02 * r.measured_ms
    assert d.measured_ms == pytest.approx(max(meas))  # a job step ends with its last rank
    assert d.job.collectives["matched"] == 8 and d.job.collectives["kernels_unmatched"] == 0


def test_straggler_is_the_rank_that_arrives_last(store):
    d = api.predict("dlrm_8ranks", store)
    raw = {r: dlrm_nccl(r) for r in range(8)}
    lasts = [max(range(8), key=lambda r: raw[r][k]["ts"]) for k in range(8)]
    most = max(set(lasts), key=lasts.count)
    s = d.job.straggler
    assert s["rank"] == most == 7
    assert s["last_at"] == lasts.count(7)
    assert s["cause"] and s["wait_caused_ms"] > 0
    # rank 7's profiler step began last: 1694128201428718 us against rank 1's 421205
    assert s["started_late_ms"] == pytest.approx(7.513, abs=0.01)


def test_predict_json_on_a_job_has_ranks_with_predictions(store):
    d = api.predict("dlrm_8ranks", store, opts=["scale(select=\"kind = 'kernel'\", "
                                                 "factor=1.0)"])
    assert d.predicted_ms == pytest.approx(d.baseline_ms)
    assert {"rank", "measured_ms", "baseline_ms", "predicted_ms"} <= \
        set(d.as_dict()["ranks"][0])  # what --json prints of each rank
    for r in d.job.ranks:
        assert r.predicted_ms == pytest.approx(r.baseline_ms)
    # the phase breakdown, per rank and iteration: unchanged by an identity rewrite
    ph = d.phases
    assert {"forward", "backward", "weight_update"} <= set(ph.baseline)
    assert ph.predicted.keys() == ph.baseline.keys()
    for k, v in ph.baseline.items():
        assert ph.predicted[k].gpu_ms == pytest.approx(v.gpu_ms)
        assert ph.predicted[k].cpu_ms == pytest.approx(v.cpu_ms)
    busy = sum(v.gpu_ms + v.cpu_ms for v in ph.baseline.values())
    assert 0 < ph.baseline["forward"].gpu_ms and busy < 3 * d.baseline_ms


def test_replayed_job_keeps_its_collectives_in_sql(store):
    """`collective` rows point at each rank's own NCCL kernel (the i-th in its JSON), with the
    wait the JSON implies; a second replay replaces them."""
    from daydream.graphstore import sql_query
    api.predict("dlrm_8ranks", store)
    api.predict("dlrm_8ranks", store)
    rows = sql_query.run_sql(store, "SELECT c.rank, c.seq, c.type, c.wait_ns, c.arrival_ns, t.name "
                      "FROM collective c JOIN task t USING (trace_id, task_id) "
                      "WHERE c.job = 'dlrm_8ranks' ORDER BY seq, rank").to_pylist()
    assert len(rows) == 64
    raw = {r: dlrm_nccl(r) for r in range(8)}
    for row in rows:
        assert row["name"] == raw[row["rank"]][row["seq"]]["name"]
    for k in range(8):
        part = rows[8 * k: 8 * k + 8]
        last = max(p["arrival_ns"] for p in part)
        assert [p["wait_ns"] for p in part] == [last - p["arrival_ns"] for p in part]
        assert len({p["type"] for p in part}) == 1
    # collective 0: rank 7 arrived last (see test_join_semantics_on_the_first_collective)
    assert rows[7]["wait_ns"] == 0 and min(p["wait_ns"] for p in rows[:7]) > 0


def test_multi_device_nsys_export_is_a_job(tmp_path):
    d = api.predict(str(FSDP), tmp_path / "s")
    assert d.job.world_size == 2 and [r.rank for r in d.job.ranks] == [0, 1]
    for r in d.job.ranks:
        assert r.measured_ms > 900  # the 1 s slice is one whole-trace iteration per rank
        assert abs(r.baseline_ms - r.measured_ms) <= 0.02 * r.measured_ms
    assert d.job.collectives["matched"] == 0  # this slice holds no NCCL kernel


# ---- jobs behave like traces everywhere (info, --plot, --timeline, every job optimization),
# ---- say which ranks they lack, and carry readable names

# ranks 0 and 1 of a 128-rank job (HTA's sampled ads traces)
ADS = [DATA / "kineto" / f"ads_sampled_rank{r}_of128.json.gz" for r in (0, 1)]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    st = tmp_path_factory.mktemp("jobs2") / "store"
    api.ingest([DLRM, *ADS, FSDP], st, jobs=1, strict=True)
    return st


def _cli(*args):
    from typer.testing import CliRunner

    from daydream.cli import app
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": ""},
                              catch_exceptions=False)


def test_jobs_are_named_after_their_traces_and_say_what_they_lack(mixed):
    js = api.jobs(mixed)
    # graphstore names a folder's jobs FOLDER_ofN ('kineto_of128'): the traces' own name wins
    assert sorted(js) == ["ads_sampled", "dlrm_8ranks"]
    r = _cli("jobs", "--store", mixed)
    assert r.exit_code == 0
    line = next(x for x in r.stdout.splitlines() if x.startswith("ads_sampled"))
    assert "2 of 128" in line and "126: 2-127" in line


def test_one_rank_alone_is_a_trace_not_a_job(tmp_path):
    api.ingest([ADS[0]], tmp_path / "s", jobs=1, strict=True)
    assert api.jobs(tmp_path / "s") == {}
    d = api.predict(str(ADS[0]), tmp_path / "s")
    assert d.job is None and "job" not in d.as_dict() and d.measured_ms > 0


def test_readable_names_stay_unique():
    from daydream.graphstore.job import Member
    from daydream.jobs import named
    jobs = {"a_of8": [Member(0, "t1", "runs/a/bert_rank0_of8.json")],
            "a_of16": [Member(0, "t2", "runs/a/bert_rank0_of16.json")],
            "b": [Member(0, "t3", "runs/b/rank0.json"), Member(1, "t4", "runs/b/rank1.json")],
            "mine": [Member(0, "t5", "x/gpt_rank0.json")]}
    # two jobs would both be 'bert': they keep graphstore's names; a folder of rankN files
    # keeps its folder's name; a name given at ingest is kept
    assert sorted(named(jobs)) == ["a_of16", "a_of8", "b", "mine"]
    jobs["a_of16"] = [Member(0, "t2", "runs/a/gpt2_rank0_of16.json")]
    assert sorted(named(jobs)) == ["b", "bert", "gpt2", "mine"]


def test_a_job_missing_ranks_says_which_and_how_many(mixed):
    d = api.predict("ads_sampled", mixed)
    assert d.job.world_size == 2 and [r.rank for r in d.job.ranks] == [0, 1]
    assert d.job.traced_world_size == 128 and d.job.missing_ranks == tuple(range(2, 128))
    assert d.notes[0].startswith("126 of the job's 128 ranks have no trace (ranks 2-127)")
    out = " ".join(_cli("predict", "ads_sampled", "--store", mixed).stdout.split())
    assert "Job ads_sampled: 2 ranks of 128 (126 missing)" in out
    assert "126 of the job's 128 ranks have no trace" in out
    assert "(only 2 of the job's 128 ranks are traced)" in out  # beside the straggler
    full = api.predict(str(DLRM), mixed)
    assert full.job.missing_ranks == () and full.job.traced_world_size == 8


def test_info_on_a_job_and_its_ranks(mixed):
    d = api.info("dlrm_8ranks", mixed)
    assert d["job"] == "dlrm_8ranks" and d["world_size"] == 8 and d["missing_ranks"] == []
    assert [r["rank"] for r in d["ranks"]] == list(range(8))
    r0 = d["ranks"][0]
    # rank 0's trace lists the machine's 8 GPUs; its streams ran on one
    assert r0["devices_listed"] == 8 and [x["id"] for x in r0["devices"]] == [0]
    assert r0["span_ms"] > 0 and r0["iterations"] == 1
    r = _cli("info", "dlrm_8ranks", "--store", mixed)
    assert r.exit_code == 0, r.stderr
    assert "job dlrm_8ranks: 8 ranks of 8" in r.stdout
    assert r.stdout.count("Tesla V100-SXM2-32GB") == 8  # one device per rank, not 64
    a = api.info("ads_sampled", mixed)
    assert a["ranks_present"] == 2 and a["missing_ranks"] == list(range(2, 128))


def test_info_on_an_nsys_export_has_span_iterations_and_devices(mixed):
    d = api.info(str(FSDP), mixed)
    assert 900 < d["span_ms"] < 1100  # a 1 s slice
    assert d["iterations"] == 1 and d["iterations_from"] == "whole_trace"
    assert [x["id"] for x in d["devices"]] == [0, 1]
    out = _cli("info", FSDP, "--store", mixed).stdout
    assert "span" in out and "iterations" in out and "devices" in out


def test_plot_and_timeline_of_a_job(mixed, tmp_path):
    png, tl = tmp_path / "job.png", tmp_path / "job.json"
    r = _cli("predict", "dlrm_8ranks", "--store", mixed, "--opt", "no_straggler",
             "--plot", png, "--timeline", tl)
    assert r.exit_code == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ev = json.loads(tl.read_text())["traceEvents"]
    procs = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {"measured", "replayed (baseline)", "predicted: no_straggler"}
    tracks = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {f"rank {k} gpu {k} stream 7" for k in range(8)} <= tracks
    assert "plot of iteration 0 written to" in r.stdout


@pytest.mark.parametrize("spec", ["no_straggler", "bandwidth(bw=\"2x\")", "world(n=4)"])
def test_job_optimizations_apply_to_a_multi_device_nsys_export(mixed, spec):
    """The two-GPU Nsight slice replays as a 2-rank job: a job optimization sees the job (no
    "needs a job", no "not distributed"); one that needs collectives says the slice has none."""
    try:
        d = api.predict(str(FSDP), mixed, opts=[spec])
    except DaydreamError as e:
        assert "needs a job" not in str(e) and "not distributed" not in str(e)
        assert "no collective" in str(e)
        return
    assert d.job.world_size == 2 and d.predicted_ms > 0
    assert [r.rank for r in d.job.ranks] == [0, 1]
    assert d.trace.critical_path  # the trace's own critical path is kept beside the job's ranks


@pytest.fixture(scope="module")
def job_report(store, tmp_path_factory):
    from daydream.html import write_report
    out = write_report("dlrm_8ranks", tmp_path_factory.mktemp("report") / "r.html", [], store)
    return out.read_text()


def test_the_report_of_a_job_gives_its_verdict(job_report):
    """A job's replay holds no phases of its own: the report's overview takes its ranks'
    busy time per phase, as advise does, and reaches a verdict."""
    import re

    page = job_report
    verdict = re.search(r'<p id="verdict"><b>(.*?)</b>', page).group(1)
    assert verdict in ("GPU-bound", "CPU-bound", "data-bound", "communication-bound")
    where = page[page.index('<table id="where">'):]
    where = where[:where.index("</table>")]
    # the ranks' GPU and CPU work, not only their waits in collectives
    assert "<td>GPU work</td>" in where and "<td>CPU work</td>" in where
    assert "Give --opt" in page


def gpu_of_rank(rank: int) -> dict[str, float]:
    """How rank RANK's GPU spent its one profiler step, in ms, from its JSON alone: the step
    runs from ProfilerStep#10's start to the later of its end and the end of the GPU work
    launched inside it (a kernel's correlation id to its runtime call); busy is the union of
    the kernels and copies over that span, communication the union of the NCCL kernels."""
    with gzip.open(DLRM / f"rank{rank}.kineto.json.gz") as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    step = next(e for e in ev if e["name"].startswith("ProfilerStep#"))
    lo, hi = step["ts"], step["ts"] + step["dur"]
    calls = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"}
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    for k in gpu:
        c = calls.get(k["args"]["correlation"])
        if c is not None and lo <= c["ts"] < hi:
            hi = max(hi, k["ts"] + k["dur"])

    def union(spans):
        total, reach = 0, None
        for a, b in sorted(spans):
            if reach is None or a > reach:
                total, reach = total + b - a, b
            elif b > reach:
                total, reach = total + b - reach, b
        return total

    spans = [(max(k["ts"], lo), min(k["ts"] + k["dur"], hi), "nccl" in k["name"].lower())
             for k in gpu]
    spans = [x for x in spans if x[1] > x[0]]
    busy = union([x[:2] for x in spans])
    comm = union([x[:2] for x in spans if x[2]])
    return {"measured": (hi - lo) / 1e3, "compute": (busy - comm) / 1e3,
            "communication": comm / 1e3, "idle": (hi - lo - busy) / 1e3}


def test_the_report_sets_the_ranks_gpu_time_side_by_side(store, job_report):
    """Issue 37: per rank, its GPU's compute, communication and idle time per iteration, each
    from the rank's raw JSON (rank 1, the slowest, spends 11.3 ms of its 19.9 in collectives
    waiting for rank 7), and the straggler marked on its row."""
    from tests.daydream.test_html import Tables
    p = Tables()
    p.feed(job_report)
    t = p.tables["ranks"]
    assert t["head"][:5] == ["rank", "measured ms", "compute ms", "communication ms",
                             "GPU idle ms"]
    rows = {int(r[0]): r for r in t["rows"]}
    assert sorted(rows) == list(range(8))
    for rank, r in rows.items():
        want = gpu_of_rank(rank)
        assert [float(x) for x in r[1:5]] == pytest.approx(
            [want[k] for k in ("measured", "compute", "communication", "idle")], abs=6e-4)
    assert gpu_of_rank(1)["communication"] == pytest.approx(11.336, abs=1e-3)
    marked = [rank for rank, r in rows.items() if r[-1].startswith("yes")]
    assert marked == [api.predict("dlrm_8ranks", store).job.straggler["rank"]] == [7]
