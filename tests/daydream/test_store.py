"""The whole tool's store: re-ingesting is a no-op and --force replaces a trace and its graph;
ingest processes killed at any moment leave no partial trace, and a rerun finishes the work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from daydream import api
from daydream.graphstore import db
from daydream.ingest import schema
from daydream.ingest.store import Store, table_file
from tests.conftest import DATA

SMALL = [DATA / "kineto" / n for n in ("simple_add_a100.json.gz", "alexnet_fwd_a100.json.gz",
                                        "event_sync_multi_stream.json.gz")]


def files_and_mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")
            if p.is_file() and p.name != ".lock"}


def test_reingest_is_a_noop_and_force_replaces(tmp_path):
    st = tmp_path / "s"
    rep = api.ingest(SMALL, st, jobs=2)
    assert rep.count("ingested") == 3
    before = files_and_mtimes(st)
    rep = api.ingest(SMALL, st, jobs=2)
    assert rep.count("exists") == 3 and rep.count("ingested") == 0
    assert files_and_mtimes(st) == before
    rep = api.ingest(SMALL[:1], st, jobs=1, force=True)
    assert rep.results[0].status == "ingested"
    after = files_and_mtimes(st)
    assert set(after) == set(before)
    tid = rep.results[0].trace_id
    changed = {k for k in after if after[k] != before[k] and k.startswith("activity")}
    assert changed and all(f"trace_id={tid}" in k for k in changed)
    # the graph of the replaced trace was rebuilt; the others are still there
    assert sorted(db.trace_ids(st)) == sorted(Store(st).trace_ids())


def _complete(st: Store, tid: str) -> bool:
    return all(os.path.exists(table_file(st.trace_dir(tid), t)) for t in schema.COMMIT_ORDER)


def test_killed_ingest_leaves_no_partial_trace(tmp_path):
    """Kill real ingest processes at several moments; every visible trace is complete and a
    rerun finishes the work."""
    folder = tmp_path / "in"
    folder.mkdir()
    srcs = sorted((DATA / "kineto").glob("*.json.gz")) + sorted(
        (DATA / "kineto" / "dlrm_8ranks").glob("*.json.gz"))
    for s in srcs:
        (folder / s.name).write_bytes(s.read_bytes())
    st_path = tmp_path / "s"
    st = Store(st_path)
    env = dict(os.environ)
    for delay in (0.3, 1.0, 2.0, 3.0):
        p = subprocess.Popen([sys.executable, "-m", "daydream", "ingest", str(folder),
                              "--store", str(st_path), "-j", "2"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        time.sleep(delay)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        for tid in st.trace_ids():
            assert _complete(st, tid)
            assert st.read("kernel", tid).schema == schema.KERNEL.schema
    rep = api.ingest([folder], st_path, jobs=2)
    assert not rep.failed
    assert len(st.trace_ids()) == len(srcs)
    # nothing left behind: no staging, no folder but the stored traces'
    assert not any((st_path / ".staging").iterdir()) if (st_path / ".staging").exists() else True
    folders = {p.name for p in (st_path / "activity").iterdir()}
    assert folders == {f"trace_id={t}" for t in st.trace_ids()}


def test_predicting_a_new_file_hashes_it_once(tmp_path, monkeypatch):
    """`daydream predict FILE` hashes FILE to find its id and, when the store lacks it,
    ingests it with that id: a 200 MB trace's hash costs some 0.4 s, which was paid twice."""
    from daydream.ingest import batch_ingest, ids
    from daydream.traces import resolve_trace

    hashed: list[Path] = []
    real = ids.content_id

    def counting(path):
        hashed.append(Path(path))
        return real(path)
    monkeypatch.setattr(ids, "content_id", counting)
    monkeypatch.setattr(batch_ingest, "content_id", counting)
    st = Store(tmp_path / "s")
    tid = resolve_trace(str(SMALL[0]), st, ingest_missing=True)
    assert st.has_trace(tid) and tid == real(SMALL[0])
    assert hashed == [SMALL[0]]
