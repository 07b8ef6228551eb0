"""Graphs built by other graph rules (an older daydream's) are rebuilt before they are used.

Each stored graph carries the rules that built it (``graphstore.db.graph_rules``, in ``meta``).
Here an older graph is made by hand from a real one: some of its edges deleted (what an older
build would have drawn differently) and its stamp set to another value, or removed (a store
written before the stamp). Whatever reads it for a prediction must first rebuild it, which
brings the deleted edges back.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from daydream import api, fleet
from daydream.graphstore import db, load
from tests.conftest import DATA, ROOT

A = DATA / "kineto" / "triton_example.json.gz"
B = DATA / "kineto" / "simple_add_a100.json.gz"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    """A store of A and B, and each trace's edge count as this daydream builds it."""
    root = tmp_path_factory.mktemp("stale") / "s"
    rep = api.ingest([A, B], root, jobs=1)
    assert not rep.failed
    with db.connect(root) as con:
        edges = dict(con.execute("SELECT trace_id, count(*) FROM edge GROUP BY 1").fetchall())
    return root, edges


@pytest.fixture
def store(built, tmp_path) -> Path:
    dst = tmp_path / "s"
    shutil.copytree(built[0], dst)
    return dst


def age(root: Path, trace_id: str, stamp: str | None) -> int:
    """Make ``trace_id``'s graph one of other rules: half its edges gone, its stamp STAMP
    (None: none). Returns the edges left."""
    con = duckdb.connect(str(db.db_path(root)))
    try:
        con.execute("DELETE FROM edge WHERE trace_id = ? AND src % 2 = 0", [trace_id])
        if stamp is None:
            con.execute("DELETE FROM meta WHERE key = ?", [db.RULES_KEY + trace_id])
        else:
            con.execute("UPDATE meta SET value = ? WHERE key = ?", [stamp, db.RULES_KEY + trace_id])
        return con.execute("SELECT count(*) FROM edge WHERE trace_id = ?",
                           [trace_id]).fetchall()[0][0]
    finally:
        con.close()


def edges(root: Path, trace_id: str) -> int:
    with db.connect(root) as con:
        return con.execute("SELECT count(*) FROM edge WHERE trace_id = ?",
                           [trace_id]).fetchall()[0][0]


def test_graphs_carry_the_rules_that_built_them(built) -> None:
    root, _ = built
    ids = api.open_store(root).trace_ids()
    assert len(ids) == 2
    assert db.stale_ids(root) == set() and db.current_ids(root, ids) == set(ids)
    with db.connect(root) as con:
        stamps = dict(con.execute("SELECT key, value FROM meta WHERE key LIKE 'graph_rules:%'")
                      .fetchall())
    assert stamps == {db.RULES_KEY + t: db.graph_rules() for t in ids}


@pytest.mark.parametrize("stamp", ["0123456789abcdef", None], ids=["older", "unstamped"])
def test_a_prediction_rebuilds_a_graph_of_other_rules_first(built, store, stamp) -> None:
    _, want = built
    tid = api.resolve_trace(str(A), api.open_store(store))
    other = next(t for t in want if t != tid)
    left = age(store, tid, stamp)
    assert 0 < left < want[tid]
    assert db.stale_ids(store) == {tid} and load.missing(store) == [tid]
    p = api.predict(str(A), store, opts=["amp"])
    assert p.predicted_ms > 0
    assert edges(store, tid) == want[tid]  # rebuilt: the deleted edges are back
    assert db.stale_ids(store) == set()
    assert edges(store, other) == want[other]


def test_predict_all_rebuilds_stale_graphs_first_and_says_so(built, store) -> None:
    _, want = built
    fleet.predict_all(store, ["amp"], workers=1)
    tid = api.resolve_trace(str(A), api.open_store(store))
    age(store, tid, "0123456789abcdef")
    p = subprocess.run([sys.executable, "-m", "daydream", "predict", "--all", "--store",
                        str(store), "--opt", "amp", "--workers", "1", "--format", "csv"],
                       cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "1 graph was rebuilt first" in p.stderr
    # its prediction was made again from the rebuilt graph; the other one's was kept
    assert "1 predicted, 1 already stored" in p.stderr
    assert edges(store, tid) == want[tid] and db.stale_ids(store) == set()


def test_ingest_rebuilds_the_stores_stale_graphs(built, tmp_path) -> None:
    _, want = built
    root = tmp_path / "s"
    assert not api.ingest([A], root, jobs=1).failed
    tid = api.resolve_trace(str(A), api.open_store(root))
    age(root, tid, None)
    p = subprocess.run([sys.executable, "-m", "daydream", "ingest", str(B), "--store",
                        str(root)], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr  # another file: A's graph rebuilt too, and said so
    assert "note: 1 stored graph was rebuilt" in p.stderr
    assert edges(root, tid) == want[tid] and db.stale_ids(root) == set()



def test_a_stale_graph_these_rules_reject_does_not_fail_ingest(built, tmp_path,
                                                                monkeypatch) -> None:
    """A stored trace whose graph an older daydream built and whose rebuild fails (here made to
    fail by hand) is named in a warning; the ingest of another file succeeds all the same, and
    a prediction of that trace gives the error."""
    from typer.testing import CliRunner

    from daydream.base.errors import DaydreamError
    from daydream.cli import app
    from daydream.ingest.ids import content_id

    root = tmp_path / "s"
    assert not api.ingest([A], root, jobs=1).failed
    tid = api.resolve_trace(str(A), api.open_store(root))
    age(root, tid, None)
    real = load._build_stored

    def rejects_a(st, trace_id):
        if trace_id == tid:
            raise DaydreamError("the graph fails its checks (made to, by the test)")
        return real(st, trace_id)

    monkeypatch.setattr(load, "_build_stored", rejects_a)
    r = CliRunner().invoke(app, ["ingest", str(B), "--store", str(root), "--workers", "1"])
    assert r.exit_code == 0, r.output
    assert (f"warning: stored trace {tid}: graph: the graph fails its checks (made to, by the "
            "test)") in r.output
    assert "1 trace ingested, 0 already stored, 0 failed" in r.output
    assert api.open_store(root).has_trace(content_id(B)) and db.stale_ids(root) == {tid}
    with pytest.raises(DaydreamError, match="made to, by the test"):
        api.predict(str(A), root)


def test_the_rules_are_the_code_that_builds_graphs(tmp_path) -> None:
    """A change to a module that builds graphs changes the rules; a change elsewhere (the
    database code) does not."""
    here = Path(db.__file__).resolve().parent
    copy = tmp_path / "pkg" / "graphstore"
    shutil.copytree(here, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for m in ("../ingest/nesting.py", "../base/occupancy.py"):  # the rules outside graphstore
        (copy / m).resolve().parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(here / m, copy / m)
    assert db.rules_fingerprint(copy) == db.graph_rules()
    with open(copy / "db.py", "a") as f:
        f.write("\n# a change outside the rules\n")
    assert db.rules_fingerprint(copy) == db.graph_rules()
    for m in ("labels.py", "../ingest/nesting.py", "../base/occupancy.py"):
        before = db.rules_fingerprint(copy)
        with open(copy / m, "a") as f:
            f.write("\n# a change to the rules\n")
        assert db.rules_fingerprint(copy) != before
