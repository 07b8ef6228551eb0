"""daydream.ingest.nsys against two real Nsight Systems exports and hand-made edge cases.

Every expected number is counted independently here with plain sqlite3 SQL on the same file, so
the tests check the reader against the export rather than against itself.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sqlite3
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from daydream.base.errors import TraceFormatError
from daydream.ingest.nsys import read_nsys
from daydream.ingest.schema import TABLES

DATA = Path(__file__).resolve().parents[1] / "data" / "nsys"
MOCK = DATA / "mock_rtx3080.sqlite"      # 1 process, 1 GPU, 2 kernels, one driver call
FSDP = DATA / "fsdp_t5_2xh100_1s.sqlite"  # 2 processes, 2 GPUs, a 1 s slice of a capture
FILES = [MOCK, FSDP]

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
# NVTX range event types by name (ENUM_NSYS_EVENT_TYPE)
NVTX_RANGES = ("'NvtxPushPopRange', 'NvtxStartEndRange', 'NvtxtPushPopRange', "
               "'NvtxtStartEndRange'")

_cache: dict[Path, object] = {}


def converted(path: Path):
    if path not in _cache:
        _cache[path] = read_nsys(path)
    return _cache[path]


def sql(path: Path, query: str) -> list[tuple]:
    con = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def has_table(path: Path, table: str) -> bool:
    return bool(sql(path, f"SELECT 1 FROM sqlite_master WHERE type='table' AND name='{table}'"))


def count(path: Path, table: str, where: str = "1") -> int:
    if not has_table(path, table):
        return 0
    return sql(path, f'SELECT COUNT(*) FROM "{table}" WHERE {where}')[0][0]


# ---- real files --------------------------------------------------------------------------------

@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_row_counts_match_sqlite(path):
    c = converted(path)
    nvtx_ranges = 0
    if has_table(path, "NVTX_EVENTS"):
        nvtx_ranges = sql(path, f"""SELECT COUNT(*) FROM NVTX_EVENTS n
            JOIN ENUM_NSYS_EVENT_TYPE e ON e.id = n.eventType
            WHERE e.name IN ({NVTX_RANGES}) AND n."end" IS NOT NULL""")[0][0]
    expected = {
        "kernel": count(path, KERNEL),
        "memcpy": count(path, "CUPTI_ACTIVITY_KIND_MEMCPY"),
        "memset": count(path, "CUPTI_ACTIVITY_KIND_MEMSET"),
        "api": count(path, RUNTIME),  # runtime and driver calls
        "sync": count(path, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"),
        "range": nvtx_ranges,
        "flow": 0,
    }
    assert {t: c.tables[t].num_rows for t in expected} == expected
    assert c.events == sum(count(path, t) for t in (
        KERNEL, "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", RUNTIME,
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS"))


def test_known_counts():
    """The counts written in the shared traces README and found when the reader was built."""
    rows = {t: converted(FSDP).tables[t].num_rows for t in converted(FSDP).tables}
    assert rows == {"kernel": 3442, "memcpy": 904, "memset": 22, "api": 5796, "sync": 244,
                    "range": 16782, "flow": 0, "memory": 0}
    rows = {t: converted(MOCK).tables[t].num_rows for t in converted(MOCK).tables}
    assert rows == {"kernel": 2, "memcpy": 1, "memset": 0, "api": 9, "sync": 1, "range": 0,
                    "flow": 0, "memory": 0}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_tables_conform_to_schema(path):
    c = converted(path)
    assert c.source_format == "nsys_sqlite"
    assert c.source_version == sql(path, "SELECT value FROM META_DATA_EXPORT "
                                         "WHERE name = 'EXPORT_SCHEMA_VERSION'")[0][0]
    assert set(c.tables) == set(TABLES) - {"trace"}
    for name, table in c.tables.items():
        assert table.schema == TABLES[name].schema, name
        if "start_ns" in table.column_names:
            assert table.schema.field("start_ns").type == pa.int64()
            assert table.schema.field("dur_ns").type == pa.int64()
            assert pc.min(table["dur_ns"]).as_py() is None or pc.min(table["dur_ns"]).as_py() >= 0


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize(("table", "source"), [
    ("kernel", KERNEL), ("memcpy", "CUPTI_ACTIVITY_KIND_MEMCPY"),
    ("memset", "CUPTI_ACTIVITY_KIND_MEMSET"), ("api", RUNTIME),
    ("sync", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")])
def test_timestamps_equal_sqlite(path, table, source):
    """Rows come out in (start, rowid) order; start and duration are the export's ns values."""
    if not has_table(path, source):
        assert converted(path).tables[table].num_rows == 0
        return
    rows = sql(path, f'SELECT start, "end" - start FROM "{source}" ORDER BY start, rowid')
    out = converted(path).tables[table]
    assert out["start_ns"].to_pylist() == [r[0] for r in rows]
    assert out["dur_ns"].to_pylist() == [r[1] for r in rows]


def test_nvtx_timestamps_and_names_equal_sqlite():
    rows = sql(FSDP, f"""SELECT n.start, n."end" - n.start, COALESCE(n.text, s.value)
        FROM NVTX_EVENTS n JOIN ENUM_NSYS_EVENT_TYPE e ON e.id = n.eventType
        LEFT JOIN StringIds s ON s.id = n.textId
        WHERE e.name IN ({NVTX_RANGES}) AND n."end" IS NOT NULL ORDER BY n.start, n.rowid""")
    out = converted(FSDP).tables["range"]
    sample = range(0, len(rows), 97)
    assert [out["start_ns"][i].as_py() for i in sample] == [rows[i][0] for i in sample]
    assert [out["dur_ns"][i].as_py() for i in sample] == [rows[i][1] for i in sample]
    assert [out["name"][i].as_py() for i in sample] == [rows[i][2] for i in sample]
    assert out["range_id"].to_pylist() == list(range(len(rows)))
    assert set(out["kind"].to_pylist()) == {"nvtx"}


def test_nvtx_nesting():
    """Each parent encloses its child on the same thread, one level up."""
    r = converted(FSDP).tables["range"].to_pydict()
    parents = [(i, p) for i, p in enumerate(r["parent"]) if p is not None]
    assert parents, "the FSDP file nests aten ops"
    for i, p in parents:
        assert (r["pid"][p], r["tid"][p]) == (r["pid"][i], r["tid"][i])
        assert r["start_ns"][p] <= r["start_ns"][i]
        assert r["start_ns"][i] + r["dur_ns"][i] <= r["start_ns"][p] + r["dur_ns"][p]
        assert r["depth"][i] == r["depth"][p] + 1
    assert all(d == 0 for d, p in zip(r["depth"], r["parent"], strict=True) if p is None)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_api_names_lose_version_suffix(path):
    names = set(converted(path).tables["api"]["name"].to_pylist())
    raw = {r[0] for r in sql(path, f"SELECT DISTINCT s.value FROM {RUNTIME} r "
                                   "JOIN StringIds s ON s.id = r.nameId")}
    assert "cudaLaunchKernel_v7000" in raw
    assert "cudaLaunchKernel" in names
    assert not any(re.search(r"_v\d+$", n) for n in names)
    assert names == {re.sub(r"_v\d+$", "", n) for n in raw}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_driver_calls_get_kind_driver(path):
    api = converted(path).tables["api"]
    kind = api["kind"].to_pylist()
    driver_names = {n for n, k in zip(api["name"].to_pylist(), kind, strict=True)
                    if k == "driver"}
    expected = sql(path, f"""SELECT COUNT(*) FROM {RUNTIME} r JOIN StringIds s ON s.id = r.nameId
        WHERE s.value GLOB 'cu*' AND NOT s.value GLOB 'cuda*'""")[0][0]
    assert kind.count("driver") == expected
    assert kind.count("runtime") == api.num_rows - expected
    assert all(n.startswith("cu") and not n.startswith("cuda") for n in driver_names)
    # nsys agrees: eventClass 1 is TRACE_PROCESS_EVENT_CUDA_DRIVER
    assert expected == count(path, RUNTIME, "eventClass = 1")


def test_mock_has_one_driver_call():
    api = converted(MOCK).tables["api"].to_pydict()
    assert [n for n, k in zip(api["name"], api["kind"], strict=True) if k == "driver"] == \
        ["cuModuleGetLoadingMode"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_kernel_without_launch_counted(path):
    # correlation ids are unique only within a process: match on the process too
    expected = sql(path, f"""SELECT COUNT(*) FROM {KERNEL} k WHERE NOT EXISTS (
        SELECT 1 FROM {RUNTIME} r WHERE r.correlationId = k.correlationId
        AND r.globalTid >> 24 = k.globalPid >> 24)""")[0][0]
    c = converted(path)
    assert c.stats.get("kernel_without_launch") == expected
    if expected:
        st = c.stats.items["kernel_without_launch"]
        assert st.severity == "warning" and "before the capture window" in st.detail
    # and the output tables link exactly the others, on correlation alone
    launched = pc.is_in(c.tables["kernel"]["correlation"], c.tables["api"]["correlation"])
    assert pc.sum(launched).as_py() == c.tables["kernel"].num_rows - expected


def test_fsdp_launches_before_slice():
    assert converted(FSDP).stats.get("kernel_without_launch") == 1810
    assert converted(MOCK).stats.get("kernel_without_launch") == 0


def test_correlation_ids_collide_across_processes_and_are_rebased():
    """In the raw export 11 kernels of one rank share a correlation id with a call of the other
    rank; after reading, every kernel links only to a call of its own process."""
    cross = sql(FSDP, f"""SELECT COUNT(*) FROM {KERNEL} k JOIN {RUNTIME} r
        ON r.correlationId = k.correlationId AND r.globalTid >> 24 <> k.globalPid >> 24""")[0][0]
    assert cross == 11
    c = converted(FSDP)
    api = c.tables["api"]
    assert len(pc.unique(api["correlation"])) == api.num_rows
    # rank of each device from the kernels' own process, via the raw file
    device_pid = dict(sql(FSDP, f"SELECT DISTINCT deviceId, (globalPid >> 24) & 16777215 "
                                f"FROM {KERNEL}"))
    launches = dict(zip(api["correlation"].to_pylist(), api["pid"].to_pylist(), strict=True))
    k = c.tables["kernel"].to_pydict()
    for dev, corr in zip(k["device"], k["correlation"], strict=True):
        if corr in launches:
            assert launches[corr] == device_pid[dev]
    assert c.metadata["correlation_offset_by_pid"] == {"111": 0, "112": 1 << 32}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_global_tid_decoding_matches_processes_table(path):
    """pid = (globalTid >> 24) & 0xFFFFFF must be the pid nsys lists in PROCESSES."""
    expected = sorted(sql(path, f"""SELECT p.pid, r.globalTid & 16777215, COUNT(*)
        FROM {RUNTIME} r JOIN PROCESSES p ON p.globalPid = (r.globalTid >> 24) << 24
        GROUP BY 1, 2"""))
    api = converted(path).tables["api"].to_pydict()
    got: dict[tuple[int, int], int] = {}
    for pid, tid in zip(api["pid"], api["tid"], strict=True):
        got[(pid, tid)] = got.get((pid, tid), 0) + 1
    assert sorted((p, t, n) for (p, t), n in got.items()) == expected


def test_several_processes_and_devices_kept():
    c = converted(FSDP)
    assert set(c.tables["kernel"]["device"].to_pylist()) == {0, 1}
    assert set(c.tables["api"]["pid"].to_pylist()) == {111, 112}
    assert set(c.tables["range"]["pid"].to_pylist()) == {111, 112}
    assert c.metadata["processes"] == {"111": "python3", "112": "python3"}


def test_sync_thread_kind_and_device():
    s = converted(FSDP).tables["sync"].to_pydict()
    # thread and kind from the synchronizing call of the same process
    calls = sql(FSDP, f"""SELECT (r.globalTid >> 24) & 16777215, r.globalTid & 16777215,
        st.value FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION s
        JOIN {RUNTIME} r ON r.correlationId = s.correlationId
        AND r.globalTid >> 24 = s.globalPid >> 24 JOIN StringIds st ON st.id = r.nameId
        ORDER BY s.start, s.rowid""")
    assert len(calls) == len(s["pid"])
    kind_of = {"cudaStreamWaitEvent_v3020": "stream_wait_event",
               "cudaStreamSynchronize_v3020": "stream_sync"}
    assert list(zip(s["pid"], s["tid"], s["sync_kind"], strict=True)) == \
        [(p, t, kind_of[n]) for p, t, n in calls]
    # the export writes deviceId 0 for both ranks; the device comes from the context
    kernel_device = dict(sql(FSDP, f"SELECT DISTINCT (globalPid >> 24) & 16777215, deviceId "
                                   f"FROM {KERNEL}"))
    assert [kernel_device[p] for p in s["pid"]] == s["device"]
    assert converted(FSDP).stats.get("sync_device_from_context") == 122
    # stream syncs have no event
    assert all(e is None for e, k in zip(s["event_id"], s["sync_kind"], strict=True)
               if k == "stream_sync")


def test_mock_sync_type_disagrees_with_call():
    """The mock's only sync is a cudaStreamSynchronize whose syncType says 'stream wait'."""
    assert sql(MOCK, "SELECT syncType FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION") == [(2,)]
    s = converted(MOCK).tables["sync"].to_pydict()
    assert s["sync_kind"] == ["stream_sync"] and s["event_id"] == [None]
    assert converted(MOCK).stats.get("sync_kind_from_call") == 1


def test_memcpy_and_memset_names():
    m = converted(FSDP).tables["memcpy"]
    names = m["name"].to_pylist()
    pinned_htod = count(FSDP, "CUPTI_ACTIVITY_KIND_MEMCPY",
                        "copyKind = 1 AND srcKind = 1 AND dstKind = 2")
    assert names.count("Memcpy HtoD (Pinned -> Device)") == pinned_htod == 446
    assert set(m["copy_kind"].to_pylist()) == {"HtoD", "DtoH", "DtoD"}
    assert m["bytes"].to_pylist() == [r[0] for r in sql(
        FSDP, "SELECT bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY ORDER BY start, rowid")]
    assert set(converted(FSDP).tables["memset"]["name"].to_pylist()) == {"Memset (Device)"}
    assert converted(MOCK).tables["memcpy"]["name"].to_pylist() == \
        ["Memcpy DtoH (Device -> Pinned)"]


def test_kernel_columns():
    k = converted(MOCK).tables["kernel"].to_pydict()
    rows = sql(MOCK, f"""SELECT s.value, gridX, blockX, registersPerThread,
        staticSharedMemory + dynamicSharedMemory, correlationId, streamId, deviceId
        FROM {KERNEL} JOIN StringIds s ON s.id = demangledName ORDER BY start""")
    assert list(zip(k["name"], k["grid_x"], k["block_x"], k["registers_per_thread"],
                    k["shared_memory_bytes"], k["correlation"], k["stream"], k["device"],
                    strict=True)) == rows


def test_devices_and_metadata():
    mock = converted(MOCK)
    assert mock.devices is not None and len(mock.devices) == 1
    gpu = mock.devices[0]
    assert gpu["name"] == "NVIDIA GeForce RTX 3080" and gpu["numSms"] == 68
    assert (gpu["computeMajor"], gpu["computeMinor"]) == (8, 6)
    assert mock.metadata["session_start_utc"] == "2026-04-21T14:20:26"
    assert converted(FSDP).devices is None  # the slice kept no TARGET_INFO_GPU
    assert converted(FSDP).metadata["derived_window_ns"] == "155330248986-156330248986"


def test_file_is_not_modified(tmp_path):
    copy = tmp_path / "ro.sqlite"
    shutil.copyfile(MOCK, copy)
    copy.chmod(0o444)
    before = hashlib.sha256(copy.read_bytes()).hexdigest()
    assert read_nsys(copy).tables["kernel"].num_rows == 2
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ro.sqlite"]  # no journal left


# ---- hand-made edge cases ----------------------------------------------------------------------
# The files below are made up in the test, with table definitions copied from the real export,
# to reach paths the real files do not: partial exports, broken durations, bad input.

def make_export(path: Path, tables: list[str], rows: dict[str, list[tuple]]) -> Path:
    """A SQLite file with ``tables`` created as in the FSDP export (ENUM_* tables with their
    contents), then ``rows`` inserted."""
    src = sqlite3.connect(f"{FSDP.as_uri()}?mode=ro", uri=True)
    dst = sqlite3.connect(path)
    for t in tables:
        dst.execute(src.execute("SELECT sql FROM sqlite_master WHERE name = ?", (t,)).fetchone()[0])
        if t.startswith("ENUM_") or t == "META_DATA_EXPORT":
            data = src.execute(f'SELECT * FROM "{t}"').fetchall()
            dst.executemany(f'INSERT INTO "{t}" VALUES ({",".join("?" * len(data[0]))})', data)
    for t, values in rows.items():
        cols = [r[1] for r in dst.execute(f'PRAGMA table_info("{t}")')]
        for row in values:
            named = dict(row) if isinstance(row, dict) else dict(zip(cols, row, strict=False))
            dst.execute(f'INSERT INTO "{t}" ({",".join(named)}) VALUES '
                        f'({",".join("?" * len(named))})', list(named.values()))
    dst.commit()
    dst.close()
    src.close()
    return path


GTID = (1 << 48) | (4242 << 24) | 4243  # VM 1, pid 4242, tid 4243
GPID = (1 << 48) | (4242 << 24)


def kernel_row(start, end, corr, name_id=1):
    return {"start": start, "end": end, "deviceId": 0, "contextId": 1, "streamId": 7,
            "correlationId": corr, "globalPid": GPID, "demangledName": name_id,
            "shortName": name_id, "registersPerThread": 32, "gridX": 1, "gridY": 1, "gridZ": 1,
            "blockX": 128, "blockY": 1, "blockZ": 1, "staticSharedMemory": 0,
            "dynamicSharedMemory": 16, "localMemoryPerThread": 0, "localMemoryTotal": 0,
            "gridId": 1, "tensorSizeMinusOneElements": ""}


def test_partial_export_and_repairs(tmp_path):
    """Kernels, calls, one sync and NVTX only: the absent tables are empty, oddities counted."""
    path = make_export(tmp_path / "partial.sqlite", [
        "StringIds", KERNEL, RUNTIME, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS",
        "ENUM_CUPTI_SYNC_TYPE", "ENUM_NSYS_EVENT_TYPE"], {
        "StringIds": [(1, "my_kernel"), (2, "cudaLaunchKernel_v7000"), (3, "cuLaunchKernel")],
        KERNEL: [kernel_row(100, 200, 5), kernel_row(300, 250, 6),  # negative duration
                 kernel_row(400, 500, 7, name_id=99)],               # unknown name id
        RUNTIME: [{"start": 90, "end": 95, "eventClass": 0, "globalTid": GTID,
                   "correlationId": 5, "nameId": 2, "returnValue": 0},
                  {"start": 290, "end": 295, "eventClass": 1, "globalTid": GTID,
                   "correlationId": 6, "nameId": 3, "returnValue": 0}],
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": [
            {"start": 600, "end": 700, "deviceId": 0, "contextId": 1, "streamId": 7,
             "correlationId": 77, "globalPid": GPID, "syncType": 42, "eventId": 0xFFFFFFFF}],
        "NVTX_EVENTS": [
            {"start": 10, "end": 1000, "eventType": 59, "text": "step", "globalTid": GTID},
            {"start": 20, "end": 900, "eventType": 59, "textId": 1, "globalTid": GTID},
            {"start": 30, "end": None, "eventType": 59, "text": "open", "globalTid": GTID},
            {"start": 40, "end": None, "eventType": 34, "text": "mark", "globalTid": GTID}],
    })
    c = read_nsys(path)
    rows = {t: c.tables[t].num_rows for t in c.tables}
    assert rows == {"kernel": 3, "memcpy": 0, "memset": 0, "api": 2, "sync": 1, "range": 2,
                    "flow": 0, "memory": 0}
    k = c.tables["kernel"].to_pydict()
    assert k["dur_ns"] == [100, 0, 100] and k["name"] == ["my_kernel", "my_kernel", None]
    assert k["shared_memory_bytes"] == [16, 16, 16]
    api = c.tables["api"].to_pydict()
    assert api["name"] == ["cudaLaunchKernel", "cuLaunchKernel"]
    assert api["kind"] == ["runtime", "driver"]
    assert (api["pid"], api["tid"]) == ([4242, 4242], [4243, 4243])
    s = c.tables["sync"].to_pydict()
    assert s["sync_kind"] == ["unknown"] and s["pid"] == [4242] and s["tid"] == [None]
    r = c.tables["range"].to_pydict()
    assert r["name"] == ["step", "my_kernel"] and r["depth"] == [0, 1] and r["parent"] == [None, 0]
    assert c.stats.get("negative_duration") == 1
    assert c.stats.get("unknown_string_id") == 1
    assert c.stats.get("kernel_without_launch") == 1
    assert c.stats.get("unknown_enum_value") == 1
    assert c.stats.get("sync_without_call") == 1
    assert c.stats.get("nvtx_range_unclosed") == 1
    assert c.stats.get("nvtx_mark_skipped") == 1
    assert c.source_version is None and c.devices is None
    assert c.metadata["tables_absent"] == ["CUPTI_ACTIVITY_KIND_MEMCPY",
                                           "CUPTI_ACTIVITY_KIND_MEMSET"]


def test_kernels_without_any_calls(tmp_path):
    """No RUNTIME table at all: every kernel is counted as without launch."""
    path = make_export(tmp_path / "kernels.sqlite", ["StringIds", KERNEL], {
        "StringIds": [(1, "k")], KERNEL: [kernel_row(0, 10, 1), kernel_row(20, 30, 2)]})
    c = read_nsys(path)
    assert c.tables["kernel"]["name"].to_pylist() == ["k", "k"]
    assert c.tables["api"].num_rows == 0
    assert c.stats.get("kernel_without_launch") == 2


def test_export_with_empty_tables(tmp_path):
    path = make_export(tmp_path / "idle.sqlite", [
        "StringIds", KERNEL, RUNTIME, "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS", "ENUM_CUDA_MEMCPY_OPER",
        "ENUM_CUDA_MEM_KIND", "ENUM_CUPTI_SYNC_TYPE", "ENUM_NSYS_EVENT_TYPE",
        "META_DATA_EXPORT"], {})
    c = read_nsys(path)
    assert c.events == 0 and c.source_version == "3.25.0"
    for name, table in c.tables.items():
        assert table.num_rows == 0 and table.schema == TABLES[name].schema
    assert c.stats.rows() == []


def test_not_an_nsys_export(tmp_path):
    path = tmp_path / "other.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (id INTEGER, body TEXT)")
    con.commit()
    con.close()
    with pytest.raises(TraceFormatError, match="not an Nsight Systems export") as e:
        read_nsys(path)
    assert "other.sqlite" in str(e.value) and e.value.file == str(path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.sqlite"
    path.write_bytes(b"")
    with pytest.raises(TraceFormatError, match="empty file") as e:
        read_nsys(path)
    assert "empty.sqlite" in str(e.value)


def test_not_sqlite(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text('{"traceEvents": []}')
    with pytest.raises(TraceFormatError, match="not a SQLite database") as e:
        read_nsys(path)
    assert "trace.json" in str(e.value)


def test_damaged_sqlite(tmp_path):
    path = tmp_path / "cut.sqlite"
    path.write_bytes(MOCK.read_bytes()[:5000])  # valid header, pages missing
    with pytest.raises(TraceFormatError) as e:
        read_nsys(path)
    assert "cut.sqlite" in str(e.value)


def test_missing_column(tmp_path):
    path = tmp_path / "nocol.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.execute(f'CREATE TABLE {KERNEL} (start INTEGER, "end" INTEGER, deviceId INTEGER)')
    con.commit()
    con.close()
    with pytest.raises(TraceFormatError, match="has no column") as e:
        read_nsys(path)
    assert "nocol.sqlite" in str(e.value)
    assert e.value.field == f"{KERNEL}.contextId"
