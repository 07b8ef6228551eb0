"""Jobs: the 8 ranks of the real DLRM run (facebookresearch/param, tests/data/kineto/dlrm_8ranks)
ingested as one job, every collective matched across ranks, the job replayed per rank; the FSDP
Nsight slice (two processes, two GPUs in one export) as a job by itself."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from daydream import api
from tests.conftest import DATA

DLRM = DATA / "kineto" / "dlrm_8ranks"
FSDP = DATA / "nsys" / "fsdp_t5_2xh100_1s.sqlite"


def _nccl(rank: int) -> list[dict]:
    """The rank's NCCL kernels straight from its JSON, in start order (independent of ingest)."""
    with gzip.open(DLRM / f"rank{rank}.kineto.json.gz") as f:
        ev = json.load(f)["traceEvents"]
    ks = [e for e in ev if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
    return sorted(ks, key=lambda e: e["ts"])


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    st = tmp_path_factory.mktemp("job") / "store"
    api.ingest([DLRM], st, jobs=1, strict=True)
    return st


@pytest.fixture(scope="module")
def job(store):
    from daydream import jobs
    st = api.open_store(store)
    (name, members), = jobs.find(st).items()
    return jobs.build(st, name, members)


def test_dlrm_ranks_form_one_job(store):
    js = api.jobs(store)
    assert list(js) == ["dlrm_8ranks"]
    assert [m["rank"] for m in js["dlrm_8ranks"]] == list(range(8))
    assert all(m["file"].endswith(f"rank{m['rank']}.kineto.json.gz")
               for m in js["dlrm_8ranks"])


def test_every_collective_matched_exactly(job):
    c = job.collective
    raw = {r: _nccl(r) for r in range(8)}
    assert all(len(v) == 8 for v in raw.values())  # 8 NCCL kernels per rank in the trace
    assert job.unmatched == 0
    assert c["coll"].n_unique() == 8 and c.height == 64
    # each collective: one kernel of every rank, the i-th NCCL kernel of that rank
    task = job.tables["task"]
    names = task["name"].to_numpy(zero_copy_only=False)
    for k in range(8):
        part = c.filter(c["seq"] == k).sort("rank")
        assert part["rank"].to_list() == list(range(8))
        for r, tid in zip(part["rank"].to_list(), part["task_id"].to_list(), strict=True):
            assert names[tid] == raw[r][k]["name"]
    # the kernel types, in order, as the trace names them
    first = [e["name"].split("_")[1] for e in raw[0]]
    assert first == ["SendRecv"] * 4 + ["AllReduce", "SendRecv", "AllReduce", "AllReduce"]
    types = c.filter(c["rank"] == 0).sort("seq")["type"].to_list()
    assert types == ["send_recv"] * 4 + ["all_reduce", "send_recv", "all_reduce", "all_reduce"]


def test_join_semantics_on_the_first_collective(job):
    """Collective 0: rank 7 arrives last (ts 1694128201431930 us, 10 us kernel); every rank's
    own transfer is what its kernel ran after that arrival."""
    c = job.collective.filter(job.collective["seq"] == 0).sort("rank")
    raw = [_nccl(r)[0] for r in range(8)]
    last = max(range(8), key=lambda r: raw[r]["ts"])
    assert last == 7
    off = job.clock_offset_ns
    arrive = [round(raw[r]["ts"] * 1000) - off.get(r, 0) for r in range(8)]
    end = [round((raw[r]["ts"] + raw[r]["dur"]) * 1000) - off.get(r, 0) for r in range(8)]
    assert c["transfer_ns"].to_list() == [e - max(arrive) for e in end]
    assert c["wait_ns"].to_list() == [max(arrive) - a for a in arrive]
    assert c["transfer_ns"][7] == 10_000
    # the join task: bound by every kernel's start, bounding every kernel's end
    e = job.tables["edge"].to_pylist()
    j = int(c["join_id"][0])
    into = sorted(x["src"] for x in e if x["dst"] == j and x["kind"] == "rank")
    outof = {x["dst"]: x for x in e if x["src"] == j and x["kind"] == "rank"}
    assert into == sorted(c["task_id"].to_list())
    assert {x["anchor"] for x in e if x["dst"] == j and x["kind"] == "rank"} == {"start_start"}
    assert sorted(outof) == sorted(c["task_id"].to_list())
    # the join holds back each kernel's own work, its transfer, which runs after it (END
    # edges let a task's work begin: lag 0, no slack)
    for tid in c["task_id"].to_list():
        assert outof[tid]["anchor"] == "end_end" and outof[tid]["lag_ns"] == 0
        assert outof[tid]["slack_ns"] == 0
    dur = job.tables["task"]["dur_ns"].to_numpy()
    slack = job.tables["task"]["slack_ns"].to_numpy()
    assert [int(dur[t]) for t in c["task_id"].to_list()] == c["transfer_ns"].to_list()
    assert [int(slack[t]) for t in c["task_id"].to_list()] == [0] * 8


def test_clock_offsets_are_small_on_one_node(job):
    # the 8 ranks ran on one machine: their clocks agree within a few microseconds
    assert max(abs(v) for v in job.clock_offset_ns.values()) < 5_000


def test_job_replays_within_2pct_per_rank(store):
    d = api.predict(str(DLRM), store)
    assert d["job"] == "dlrm_8ranks" and d["world_size"] == 8
    assert [r["rank"] for r in d["ranks"]] == list(range(8))
    # per-rank step times of the shared README: 12.5-19.9 ms
    meas = [r["measured_ms"] for r in d["ranks"]]
    assert min(meas) == pytest.approx(12.509) and max(meas) == pytest.approx(19.901)
    for r in d["ranks"]:
        assert abs(r["baseline_ms"] - r["measured_ms"]) <= 0.02 * r["measured_ms"]
    assert d["measured_ms"] == pytest.approx(max(meas))  # a job step ends with its last rank
    assert d["collectives"]["matched"] == 8 and d["collectives"]["kernels_unmatched"] == 0


def test_straggler_is_the_rank_that_arrives_last(store):
    d = api.predict("dlrm_8ranks", store)
    raw = {r: _nccl(r) for r in range(8)}
    lasts = [max(range(8), key=lambda r: raw[r][k]["ts"]) for k in range(8)]
    most = max(set(lasts), key=lasts.count)
    s = d["straggler"]
    assert s["rank"] == most == 7
    assert s["last_at"] == lasts.count(7)
    assert s["cause"] and s["wait_caused_ms"] > 0
    # rank 7's profiler step began last: 1694128201428718 us against rank 1's 421205
    assert s["started_late_ms"] == pytest.approx(7.513, abs=0.01)


def test_predict_json_on_a_job_has_ranks_with_predictions(store):
    d = api.predict("dlrm_8ranks", store, opts=["scale(select=\"kind = 'kernel'\", "
                                                 "factor=1.0)"])
    assert d["predicted_ms"] == pytest.approx(d["baseline_ms"])
    assert {"rank", "measured_ms", "baseline_ms", "predicted_ms"} <= set(d["ranks"][0])
    for r in d["ranks"]:
        assert r["predicted_ms"] == pytest.approx(r["baseline_ms"])
    # the phase breakdown, per rank and iteration: unchanged by an identity rewrite
    ph = d["phases"]
    assert {"forward", "backward", "weight_update"} <= set(ph["baseline"])
    assert ph["predicted"].keys() == ph["baseline"].keys()
    for k, v in ph["baseline"].items():
        assert ph["predicted"][k] == pytest.approx(v)
    busy = sum(v["gpu_ms"] + v["cpu_ms"] for v in ph["baseline"].values())
    assert 0 < ph["baseline"]["forward"]["gpu_ms"] and busy < 3 * d["baseline_ms"]


def test_replayed_job_keeps_its_collectives_in_sql(store):
    """`collective` rows point at each rank's own NCCL kernel (the i-th in its JSON), with the
    wait the JSON implies; a second replay replaces them."""
    from graphstore import db
    api.predict("dlrm_8ranks", store)
    api.predict("dlrm_8ranks", store)
    rows = db.run_sql(store, "SELECT c.rank, c.seq, c.type, c.wait_ns, c.arrival_ns, t.name "
                      "FROM collective c JOIN task t USING (trace_id, task_id) "
                      "WHERE c.job = 'dlrm_8ranks' ORDER BY seq, rank").to_pylist()
    assert len(rows) == 64
    raw = {r: _nccl(r) for r in range(8)}
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
    assert d["world_size"] == 2 and [r["rank"] for r in d["ranks"]] == [0, 1]
    for r in d["ranks"]:
        assert r["measured_ms"] > 900  # the 1 s slice is one whole-trace iteration per rank
        assert abs(r["baseline_ms"] - r["measured_ms"]) <= 0.02 * r["measured_ms"]
    assert d["collectives"]["matched"] == 0  # this slice holds no NCCL kernel


def test_find_jobs_by_name_and_by_folder():
    """Hand-made trace rows: the job name given at ingest wins; ranks repeated in one folder
    (two runs) are not a job."""
    from graphstore.job import find_jobs
    rows = [{"trace_id": f"t{i}", "file": f"runs/a/r{i}.json", "rank": i, "world_size": 2,
             "job": None, "start_ns": 100 * i, "end_ns": 1000 + i} for i in range(2)]
    # two ranks of another run in one folder: they do not overlap in time
    rows += [{"trace_id": f"w{i}", "file": f"runs/c/r{i}.json", "rank": i, "world_size": 2,
              "job": None, "start_ns": 5000 * i, "end_ns": 5000 * i + 10} for i in range(2)]
    rows += [{"trace_id": f"u{i}", "file": f"x/{i}.json", "rank": None, "world_size": None,
              "job": "mine"} for i in range(3)]
    rows += [{"trace_id": f"v{i}", "file": f"runs/b/{i}.json", "rank": 0, "world_size": 2,
              "job": None} for i in range(2)]
    js = find_jobs(rows)
    assert sorted(js) == ["a", "mine"]
    assert [(m.rank, m.trace_id) for m in js["a"]] == [(0, "t0"), (1, "t1")]
    assert [(m.rank, m.trace_id) for m in js["mine"]] == [(0, "u0"), (1, "u1"), (2, "u2")]


def test_collective_type_names():
    from graphstore.job import collective_type
    assert collective_type("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, ...)") == \
        "all_reduce"
    assert collective_type("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(x)") == \
        "reduce_scatter"
    assert collective_type("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(x)") == "send_recv"
    assert collective_type("x", "allgather") == "all_gather"
    assert collective_type("void foo()") == "other"


def test_bandwidth_on_a_job_shortens_each_kernel_after_its_join(job):
    """In a job graph a kernel's transfer is its duration, run after its join (an end_end
    edge at lag 0): bandwidth(2x) shortens the transfers and leaves the joins' edges alone,
    so the job's collectives end sooner after the same last arrival."""
    import polars as pl

    from simulate.job import replay_job
    from transforms import rewrite
    t2 = rewrite(job.tables, "bandwidth(2x)")
    dur = t2["task"]["dur_ns"].to_numpy()
    e = pl.from_arrow(t2["edge"]).filter(pl.col("kind") == "rank",
                                         pl.col("anchor") == "end_end")
    assert e.height == 64
    assert set(e["lag_ns"].to_list()) == {0} and set(e["slack_ns"].to_list()) == {0}
    old = job.tables["task"]["dur_ns"].to_numpy()
    ids = job.collective["task_id"].to_numpy()
    assert (dur[ids] <= old[ids]).all() and dur[ids].sum() < old[ids].sum()
    base, fast = replay_job(job.tables), replay_job(t2)
    assert fast.mean("simulated_ns") < base.mean("simulated_ns")


def test_no_straggler_scales_slow_ranks_to_the_median(job):
    import polars as pl

    from simulate.job import replay_job
    from transforms import rewrite
    t0 = pl.from_arrow(job.tables["task"])
    t2 = pl.from_arrow(rewrite(job.tables, "no_straggler")["task"])

    def busy(t):
        own = t.filter(pl.col("rank") >= 0, pl.col("kind") != "comm",
                       ~pl.col("name").is_in(["<trace start>", "<job start>"]))
        return dict(own.group_by("rank").agg(pl.col("dur_ns").sum()).iter_rows())
    b0, b2 = busy(t0), busy(t2)
    med = float(np.median(list(b0.values())))
    for r in range(8):
        want = min(b0[r], med)
        assert abs(b2[r] - want) <= 4000  # rounding: at most 1 ns per task
    base = replay_job(job.tables)
    pred = replay_job(rewrite(job.tables, "no_straggler"))
    assert pred.mean("simulated_ns") < base.mean("simulated_ns")


def test_collective_channel_keeps_issue_order(job):
    """NCCL has every rank issue a communicator's collectives in one order: the channel of
    the DLRM communicator is FIXED, its joins in sequence order."""
    unit = job.tables["unit"].to_pylist()
    chans = [u for u in unit if u["kind"] == "channel"]
    assert [u["policy"] for u in chans] == ["fixed"]
    import polars as pl
    c = job.collective.group_by("seq").agg(pl.col("join_id").first()).sort("seq")
    assert c["join_id"].to_list() == sorted(c["join_id"].to_list())
    assert not any("issue order" in n for n in job.notes)


def test_collectives_arriving_out_of_issue_order_get_a_fcfs_channel(store):
    """Hand-edited arrivals: collective 1's last rank arrives before collective 0's, which no
    FIXED order by arrival could keep; that communicator's channel is FCFS and a note says so,
    and the job still simulates."""
    import polars as pl

    from daydream import jobs
    from graphstore.job import _concat, _join, match_collectives
    from graphstore.read import read_graph
    from simulate.job import replay_job
    st = api.open_store(store)
    (_, members), = jobs.find(st).items()
    graphs = [read_graph(st.root, m.trace_id) for m in members]
    tables, comm = _concat(members, graphs, [st.read("kernel", m.trace_id) for m in members])
    coll, _, _ = match_collectives(comm)
    t0 = coll.filter(pl.col("seq") == 0)["start_ns"].min()
    coll = coll.with_columns(pl.when(pl.col("seq") == 1).then(t0 - 1_000)
                             .otherwise(pl.col("start_ns")).alias("start_ns"))
    notes: list[str] = []
    out, _ = _join(tables, coll, notes)
    chans = [u for u in out["unit"].to_pylist() if u["kind"] == "channel"]
    assert [u["policy"] for u in chans] == ["fcfs"]
    assert len(notes) == 1 and "out of issue order" in notes[0]
    from graphstore.job import _sort
    sorted_tables, _ = _sort(out)
    assert replay_job(sorted_tables).mean("simulated_ns") > 0  # no deadlock, all ran
