"""The batch loader of an ingest (graphstore.load.Loader): batches written behind, on a thread,
while the next one fills; ``flush`` leaves every graph added in the database.

The graphs are the hand-made traces A and B of tests/graphstore/test_db.py, written under
several trace ids.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from daydream.base.errors import DaydreamError
from daydream.base.store import shared_between_threads
from daydream.graphstore import db
from daydream.graphstore.load import Loader
from daydream.ingest.store import Store
from tests.graphstore.test_db import trace_a, trace_b

IDS = [f"{k:020x}" for k in range(1, 6)]


def graph(which) -> dict:
    """A hand-made graph's tables without their trace_id column (written under any id)."""
    return {name: t.drop_columns(["trace_id"]) if "trace_id" in t.column_names else t
            for name, t in which().items()}


def test_first_batch_is_half_the_expected_graphs_and_at_most_the_batch() -> None:
    st = Store(Path("unused"))
    assert Loader(st, expected=5).batch == 3  # ceil(5 / 2)
    assert Loader(st, expected=100).batch == 50
    assert Loader(st, expected=10_000).batch == 256
    assert Loader(st, batch=64, expected=10_000).batch == 64
    assert Loader(st).batch == 256


def test_a_batch_is_written_behind_and_flush_writes_the_rest(tmp_path: Path) -> None:
    st = Store(tmp_path / "s")
    loader = Loader(st, expected=5)  # batches of 3
    graphs = [graph(w) for w in (trace_a, trace_b, trace_a, trace_b, trace_a)]
    for tid, g in zip(IDS[:3], graphs[:3], strict=True):
        loader.add(tid, g)
    # the third add handed the batch to the writer; the queue is empty again
    assert loader._writing is not None and not loader._queue
    loader.wait()
    assert db.trace_ids(st.root) == IDS[:3]
    assert loader.loaded == set(IDS[:3])
    for tid, g in zip(IDS[3:], graphs[3:], strict=True):
        loader.add(tid, g)
    assert db.trace_ids(st.root) == IDS[:3]  # a batch of 2 waits for flush
    assert sorted(loader.flush()) == IDS[3:]
    assert db.trace_ids(st.root) == IDS
    with db.connect(st.root) as con:
        n = dict(con.execute("SELECT trace_id, count(*) FROM task GROUP BY 1").fetchall())
    assert n == {IDS[0]: 14, IDS[1]: 3, IDS[2]: 14, IDS[3]: 3, IDS[4]: 14}


def test_batches_halve_so_that_few_graphs_wait_for_flush(tmp_path: Path) -> None:
    """With 100 graphs expected: batches of 50, then half of those still to come (25, 13),
    never under MIN_BATCH (8), and the 4 left written by flush; every graph written once."""
    st = Store(tmp_path / "s")
    loader = Loader(st, expected=100)
    sizes: list[int] = []
    commit = loader._commit

    def counted(batch):
        sizes.append(len(batch))
        return commit(batch)

    loader._commit = counted
    ids = [f"{k:020x}" for k in range(1, 101)]
    g = graph(trace_b)
    with shared_between_threads(st.root):
        for tid in ids:
            loader.add(tid, g)
        loader.flush()
    assert sizes == [50, 25, 13, 8, 4]
    assert db.trace_ids(st.root) == ids


def test_a_writer_adds_row_groups_of_row_group_rows(tmp_path: Path) -> None:
    """A graph of 40,000 tasks (hand-made: trace B's tasks repeated) is inserted in row groups
    of ROW_GROUP_ROWS (16,384): three, where DuckDB's default (122,880) makes one."""
    import pyarrow as pa
    st = Store(tmp_path / "s")
    g = graph(trace_b)
    task = g["task"]
    reps = -(-40_000 // task.num_rows)
    big = pa.concat_tables([task] * reps).slice(0, 40_000)
    big = big.set_column(big.schema.get_field_index("task_id"), "task_id",
                         pa.array(range(40_000), pa.int64()))
    g = {**g, "task": big, "edge": g["edge"].slice(0, 0)}
    db.write_traces(st.root, {IDS[0]: g})
    with db.connect(st.root) as con:
        groups = con.execute("SELECT count(DISTINCT row_group_id) FROM pragma_storage_info('task')"
                             ).fetchone()[0]
    assert groups == 3
    assert db.ROW_GROUP_ROWS == 16_384


def test_an_error_of_a_batch_written_behind_is_raised_by_the_next_call(tmp_path: Path
                                                                        ) -> None:
    st = Store(tmp_path / "s")
    loader = Loader(st, expected=2)  # batches of 1
    loader.add(IDS[0], graph(trace_a))
    loader.wait()
    loader.add(IDS[1], {"tasks": trace_a()["task"]})  # no such table: the write fails
    with pytest.raises(DaydreamError, match="unknown graph table.s. tasks"):
        loader.flush()
    assert db.trace_ids(st.root) == IDS[:1]  # nothing of the failed batch written
    assert loader.loaded == {IDS[0]}


def test_threads_share_the_lock_only_inside_shared_between_threads(tmp_path: Path) -> None:
    """Inside, a second thread takes the store's lock while the first holds it; the lock is
    still held against another writer until both have let go. Outside, threads exclude each
    other (tests/graphstore/test_db.py: the writer takes the store lock)."""
    st = Store(tmp_path / "s")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with st.lock():
            held.set()
            release.wait(10)

    with shared_between_threads(st.root):
        th = threading.Thread(target=hold)
        th.start()
        assert held.wait(10)
        got = threading.Event()

        def second() -> None:
            with st.lock():
                got.set()

        t2 = threading.Thread(target=second)
        t2.start()
        assert got.wait(5), "a thread of the same writer waited for the other's lock"
        t2.join(5)
        # the first thread still holds it: another writer (a process) is refused
        assert _busy(st)
        release.set()
        th.join(10)
        assert not _busy(st)
    # outside, a second thread waits for the first again
    held.clear()
    release.clear()
    th = threading.Thread(target=hold)
    th.start()
    assert held.wait(10)
    got = threading.Event()
    t2 = threading.Thread(target=lambda: (st.lock().__enter__(), got.set()))
    t2.daemon = True
    t2.start()
    assert not got.wait(0.3)
    release.set()
    th.join(10)


def _busy(st: Store) -> bool:
    """Whether another process finds the store's writer lock taken."""
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-c",
                        "from daydream.ingest.store import Store; from pathlib import Path\n"
                        f"s = Store(Path({str(st.root)!r}))\n"
                        "try:\n"
                        "    s.lock(wait=False).__enter__()\n"
                        "    print('free')\n"
                        "except Exception:\n"
                        "    print('busy')\n"], capture_output=True, text=True, check=True)
    return p.stdout.strip() == "busy"


def test_load_many_builds_every_graph_it_can_and_names_the_others(tmp_path: Path) -> None:
    """Graphs rebuilt in batches (``load_many``): a trace whose activity tables cannot be
    read (its kernel table's file deleted by hand) is named with its error, and the others
    are built and written all the same."""
    from daydream import api
    from daydream.graphstore.load import load_many
    from tests.conftest import DATA
    root = tmp_path / "s"
    files = [DATA / "kineto" / n for n in ("triton_example.json.gz", "simple_add_a100.json.gz")]
    assert not api.ingest(files, root, jobs=1).failed
    st = Store(root)
    a, b = (api.resolve_trace(str(f), st) for f in files)
    with db.connect(root) as con:
        want = con.execute("SELECT trace_id, count(*) FROM task GROUP BY 1 ORDER BY 1").fetchall()
    for t in (a, b):
        db.delete_trace(root, t)
    assert db.trace_ids(root) == []
    (root / "activity" / f"trace_id={b}" / "kernel.parquet").unlink()
    built, failed = load_many(root, [a, b])
    assert built == [a] and list(failed) == [b] and "kernel" in failed[b]
    with db.connect(root) as con:
        got = con.execute("SELECT trace_id, count(*) FROM task GROUP BY 1 ORDER BY 1").fetchall()
    assert got == [r for r in want if r[0] == a]
    assert db.stale_ids(root) == set()
