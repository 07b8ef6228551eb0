"""Batch ingest and batch predict as Ray tasks, on one local Ray cluster for the module."""

from __future__ import annotations

import pytest
import ray

from daydream import api, fleet
from daydream.graphstore import db, sql_query
from tests.daydream.test_predict_all import SMALL


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ingest_and_predict_on_ray_match_local(cluster, tmp_path):
    # one corrupt file among the real ones: reported, the rest stored
    bad = tmp_path / "in" / "broken.json"
    bad.parent.mkdir()
    bad.write_bytes(SMALL[0].read_bytes()[:5000])  # gzip cut short
    rep = api.ingest([*SMALL, bad], tmp_path / "ray", ray="auto")
    assert [r.path for r in rep.failed] == [str(bad)]
    assert str(bad) in rep.failed[0].error
    assert rep.count("ingested") == len(SMALL)
    assert sorted(db.trace_ids(tmp_path / "ray")) == sorted(
        api.open_store(tmp_path / "ray").trace_ids())

    api.ingest(SMALL, tmp_path / "local", jobs=1)
    for root, kw in ((tmp_path / "ray", {"ray": "auto"}), (tmp_path / "local", {"workers": 1})):
        r = fleet.predict_all(root, ["amp", "cuda_graphs"], **kw)
        assert r.count("predicted") == 2 * len(SMALL) and not r.failed
    q = ("SELECT trace_id, spec, measured_ms, baseline_ms, predicted_ms FROM prediction "
         "ORDER BY ALL")
    assert sql_query.run_sql(tmp_path / "ray", q).to_pylist() == sql_query.run_sql(
        tmp_path / "local", q).to_pylist()
    # the graphs written by the Ray workers' loader are the graphs built locally
    g = "SELECT trace_id, count(*) AS n, sum(dur_ns) AS d FROM task GROUP BY 1 ORDER BY 1"
    assert sql_query.run_sql(tmp_path / "ray", g).to_pylist() == sql_query.run_sql(
        tmp_path / "local", g).to_pylist()
