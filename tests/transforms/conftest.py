"""Graphs of small real traces, ingested once per test session into a temporary store."""

from __future__ import annotations

import pytest

from tests.conftest import DATA

V100 = {"name": "Tesla V100-DGXS-32GB", "computeMajor": 7, "computeMinor": 0}
A100 = {"name": "NVIDIA A100-PG509-200", "computeMajor": 8, "computeMinor": 0}


@pytest.fixture(scope="session")
def graphs(tmp_path_factory):
    from daydream import api
    from graphstore.read import read_graph
    store = tmp_path_factory.mktemp("transforms_store")
    out = {}
    for key, f in (("v100", "resnet50_v100_nw0_run1"), ("a100", "resnet50_ddp_a100_rank0"),
                   ("alexnet", "alexnet_fwd_a100")):
        d = api.predict(DATA / "kineto" / f"{f}.json.gz", store)
        out[key] = read_graph(store, d["trace_id"])
    return out


@pytest.fixture(scope="session")
def baselines(graphs):
    from simulate.replay import replay
    return {k: replay(g) for k, g in graphs.items() if k != "alexnet"}
