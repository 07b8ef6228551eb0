"""Graphs of small real traces, stored once per test session in a temporary store (by ingest
and graphstore themselves: the transforms tests do not go through daydream)."""

from __future__ import annotations

import pytest

from tests.conftest import DATA, stored_graphs

V100 = {"name": "Tesla V100-DGXS-32GB", "computeMajor": 7, "computeMinor": 0}
A100 = {"name": "NVIDIA A100-PG509-200", "computeMajor": 8, "computeMinor": 0}


@pytest.fixture(scope="session")
def stored(tmp_path_factory):
    """The store the graphs were built in and each graph's trace id."""
    store = tmp_path_factory.mktemp("transforms_store")
    files = {key: DATA / "kineto" / f"{f}.json.gz" for key, f in (
        ("v100", "resnet50_v100_nw0_run1"), ("a100", "resnet50_ddp_a100_rank0"),
        ("alexnet", "alexnet_fwd_a100"), ("v100_hta", "resnet50_v100_rank0"),
        ("mi300x", "resnet_actckpt_mi300x_rank0_of8"))}
    ids = stored_graphs(list(files.values()), store)
    return store, {key: ids[f] for key, f in files.items()}


@pytest.fixture(scope="session")
def graphs(stored):
    from daydream.graphstore.read import read_graph
    store, ids = stored
    return {key: read_graph(store, tid) for key, tid in ids.items()}


@pytest.fixture(scope="session")
def activity(stored):
    """Per graph, a reader of its activity tables (what daydream.pipeline puts in the rewrite
    Context)."""
    from daydream.ingest.store import Store
    store, ids = stored
    st = Store(store)
    return {key: (lambda name, tid=tid: st.read(name, tid)) for key, tid in ids.items()}


@pytest.fixture(scope="session")
def baselines(graphs):
    from daydream.simulate.replay import replay
    return {k: replay(g) for k, g in graphs.items() if k in ("v100", "a100")}
