"""Jobs through daydream: the 8 ranks of the real DLRM run (facebookresearch/param,
tests/data/kineto/dlrm_8ranks) predicted as one job by ``daydream.api.predict`` (what
``daydream predict JOB`` runs), their collectives kept for SQL; the FSDP Nsight slice (two
processes, two GPUs in one export) as a job by itself."""

from __future__ import annotations

import pytest

from daydream import api
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
    raw = {r: dlrm_nccl(r) for r in range(8)}
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
    assert d["world_size"] == 2 and [r["rank"] for r in d["ranks"]] == [0, 1]
    for r in d["ranks"]:
        assert r["measured_ms"] > 900  # the 1 s slice is one whole-trace iteration per rank
        assert abs(r["baseline_ms"] - r["measured_ms"]) <= 0.02 * r["measured_ms"]
    assert d["collectives"]["matched"] == 0  # this slice holds no NCCL kernel
