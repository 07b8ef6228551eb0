"""Job graphs: the 8 ranks of the real DLRM run (facebookresearch/param,
tests/data/kineto/dlrm_8ranks) stored with ingest and graphstore and joined into one job graph,
every collective matched across ranks. The job predicted through daydream:
tests/daydream/test_jobs.py."""

from __future__ import annotations

import numpy as np
import pytest

from daydream.graphstore.job import build_job, find_jobs, job_activity
from daydream.graphstore.read import read_graph
from daydream.ingest.store import Store
from tests.conftest import DLRM, dlrm_nccl, stored_graphs


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    st = tmp_path_factory.mktemp("job") / "store"
    stored_graphs(sorted(DLRM.glob("*.kineto.json.gz")), st)
    return st


def _members(root):
    st = Store(root)
    (_, members), = find_jobs([{**st.trace_row(t), "trace_id": t}
                               for t in st.trace_ids()]).items()
    return members


@pytest.fixture(scope="module")
def job(store):
    members = _members(store)
    st = Store(store)
    return build_job("dlrm_8ranks", members, [read_graph(store, m.trace_id) for m in members],
                     [st.read("kernel", m.trace_id) for m in members])


def test_every_collective_matched_exactly(job):
    c = job.collective
    raw = {r: dlrm_nccl(r) for r in range(8)}
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
    raw = [dlrm_nccl(r)[0] for r in range(8)]
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


def test_find_jobs_by_name_and_by_folder():
    """Hand-made trace rows: the job name given at ingest wins; ranks repeated in one folder
    (two runs) are not a job."""
    from daydream.graphstore.job import find_jobs
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
    from daydream.graphstore.job import collective_type
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

    from daydream.simulate.job import replay_job
    from daydream.transforms import rewrite
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

    from daydream.simulate.job import replay_job
    from daydream.transforms import rewrite
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

    from daydream.graphstore.job import _concat, _join, match_collectives
    from daydream.simulate.job import replay_job
    st = Store(store)
    members = _members(store)
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
    from daydream.graphstore.job import _sort
    sorted_tables, _ = _sort(out)
    assert replay_job(sorted_tables).mean("simulated_ns") > 0  # no deadlock, all ran



def test_job_activity_names_the_ranges_of_the_job_graph(store, job):
    """A job's activity reader: the ranks' range tables one after the other, range ids shifted
    as the job graph's tasks are, so that each task's range_id finds the range its own rank's
    trace recorded around it (same name, and the task inside it in time)."""
    import polars as pl
    st = Store(store)
    ranges = pl.from_arrow(job_activity(job.members, st.read)("range").select(
        ["range_id", "parent", "name", "start_ns", "dur_ns", "rank"]))
    assert ranges.height == sum(st.read("range", m.trace_id).num_rows for m in job.members)
    assert ranges["range_id"].n_unique() == ranges.height
    task = pl.from_arrow(job.tables["task"].select(["range_id", "start_ns", "rank", "name"]))
    hit = task.filter(pl.col("range_id").is_not_null()).join(
        ranges.rename({"start_ns": "r_start", "rank": "r_rank", "name": "r_name"}),
        on="range_id", how="left")
    assert hit["r_rank"].null_count() == 0 and (hit["rank"] == hit["r_rank"]).all()
    # clock offsets moved the tasks, not the ranges: compare within the offset
    off = max(abs(v) for v in job.clock_offset_ns.values())
    assert ((hit["start_ns"] >= hit["r_start"] - off) &
            (hit["start_ns"] <= hit["r_start"] + hit["dur_ns"] + off)).all()
    # rank 3's first range, as its own trace numbers it
    own = pl.from_arrow(st.read("range", job.members[3].trace_id).select(["range_id", "name"]))
    mine = ranges.filter(pl.col("rank") == 3).sort("range_id").head(1)
    assert mine["name"][0] == own.sort("range_id")["name"][0]
