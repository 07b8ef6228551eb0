"""Fuzzing the three readers: mutated real traces either convert or raise DaydreamError.

Anything else escaping a reader (IndexError, KeyError, a numba error, sqlite3.Error, ...) is a
bug: the user would get a traceback instead of one line naming the file. The mutations start
from real small traces (tests/data) and from a raw CUPTI record file written by our collector
from the CUPTI-layout buffers of tests/collect/helpers.py: bytes flipped, the file cut short,
fields of events removed or retyped, SQLite columns retyped or dropped.

Bounded for CI: a fixed number of examples per reader, derandomized (the same examples every
run, so CI never fails by chance). For a longer hunt: DAYDREAM_FUZZ_EXAMPLES=5000
DAYDREAM_FUZZ_RANDOM=1 pytest tests/ingest/test_fuzz.py
"""

from __future__ import annotations

import atexit
import gzip
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daydream.base.errors import DaydreamError
from daydream.ingest.convert import read_trace
from tests.conftest import DATA

EXAMPLES = int(os.environ.get("DAYDREAM_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                derandomize=not os.environ.get("DAYDREAM_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                database=None)

KINETO = [DATA / "kineto" / "event_sync_multi_stream.json.gz",
          DATA / "kineto" / "triton_example.json.gz",
          DATA / "kineto" / "backward_thread.json"]
NSYS = DATA / "nsys" / "mock_rtx3080.sqlite"


def _load(p: Path) -> bytes:
    return gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()


KINETO_BYTES = [_load(p) for p in KINETO]
KINETO_DOCS = [orjson.loads(b) for b in KINETO_BYTES]
_TMP = Path(tempfile.mkdtemp(prefix="daydream-fuzz-"))
atexit.register(shutil.rmtree, _TMP, True)


def _read(data: bytes, name: str) -> None:
    """Write ``data`` to a file and read it: converting, or DaydreamError, are both fine."""
    path = _TMP / name
    path.write_bytes(data)
    try:
        read_trace(path)
    except DaydreamError as e:
        assert str(e)  # one line a user can act on
    finally:
        path.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------
# byte-level mutations, shared by the three formats

flips = st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
                 min_size=1, max_size=8)


def _flip(data: bytes, edits: list[tuple[float, int]]) -> bytes:
    b = bytearray(data)
    for pos, val in edits:
        b[int(pos * len(b))] = val
    return bytes(b)


@FUZZ
@given(which=st.integers(0, len(KINETO) - 1), edits=flips, gz=st.booleans())
def test_kineto_bytes_flipped(which, edits, gz):
    data = _flip(KINETO_BYTES[which], edits)
    _read(gzip.compress(data, 1) if gz else data, "t.json.gz" if gz else "t.json")


@FUZZ
@given(which=st.integers(0, len(KINETO) - 1), cut=st.floats(0, 1), gz=st.booleans())
def test_kineto_truncated(which, cut, gz):
    raw = KINETO_BYTES[which]
    if gz:  # a gzip stream cut short, as a copy interrupted mid-file leaves it
        z = gzip.compress(raw, 1)
        _read(z[: int(cut * len(z))], "t.json.gz")
    else:
        _read(raw[: int(cut * len(raw))], "t.json")


# --------------------------------------------------------------------------------------------
# structural mutations of Kineto events: a field removed or given a value of another type

# orjson writes 64-bit integers only: larger ones go in as sentinels replaced in the bytes
BIG = {'"__BIG__"': b"123456789012345678901234567890", '"__NEG_BIG__"': b"-98765432109876543210"}
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                   st.sampled_from([k.strip('"') for k in BIG]),
                   st.floats(allow_nan=False, allow_infinity=False),
                   st.text(max_size=8), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3),
                   st.dictionaries(st.text(max_size=3), st.integers(-(2**63), 2**63 - 1),
                                   max_size=2),
                   st.sampled_from(["kernel", "cuda_runtime", "cpu_op", "ac2g", "X", "s", "f",
                                    "ProfilerStep#1", "-1", "1e400", ""]))
FIELDS = ["ph", "cat", "name", "ts", "dur", "pid", "tid", "id", "args", "bp",
          "args.correlation", "args.External id", "args.device", "args.stream",
          "args.grid", "args.block", "args.bytes", "args.Input Dims", "args.Sequence number",
          "args.Fwd thread id", "args.context", "args.registers per thread",
          "args.wait_on_stream", "args.wait_on_cuda_event_record_corr_id"]
TOP = ["traceEvents", "deviceProperties", "distributedInfo", "schemaVersion", "baseTimeNanoseconds"]

mutation = st.tuples(st.floats(0, 1, exclude_max=True), st.sampled_from(FIELDS),
                     st.one_of(st.just("remove"), VALUES))


def _mutate_event(ev: dict, field: str, value) -> None:
    if field.startswith("args."):
        args = ev.get("args")
        if not isinstance(args, dict):
            if value == "remove":
                return
            args = ev["args"] = {}
        key = field[5:]
        if value == "remove":
            args.pop(key, None)
        else:
            args[key] = value
    elif value == "remove":
        ev.pop(field, None)
    else:
        ev[field] = value


@FUZZ
@given(which=st.integers(0, len(KINETO) - 1), muts=st.lists(mutation, min_size=1, max_size=6),
       top=st.one_of(st.none(), st.tuples(st.sampled_from(TOP),
                                           st.one_of(st.just("remove"), VALUES))))
def test_kineto_fields_removed_or_retyped(which, muts, top):
    doc = orjson.loads(KINETO_BYTES[which])
    events = doc["traceEvents"]
    for pos, field, value in muts:
        if events:
            _mutate_event(events[int(pos * len(events))], field, value)
    if top is not None:
        key, value = top
        if value == "remove":
            doc.pop(key, None)
        else:
            doc[key] = value
    data = orjson.dumps(doc)
    for k, v in BIG.items():
        data = data.replace(k.encode(), v)
    _read(data, "t.json")


# --------------------------------------------------------------------------------------------
# Nsight Systems SQLite


def _nsys_columns() -> list[tuple[str, str]]:
    con = sqlite3.connect(NSYS)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return [(t, c[1]) for t in tables for c in con.execute(f'PRAGMA table_info("{t}")')]
    finally:
        con.close()


NSYS_COLUMNS = _nsys_columns()
SQL_VALUES = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False),
                       st.text(max_size=6), st.binary(max_size=6))


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(NSYS_COLUMNS), st.integers(1, 5),
                                st.one_of(st.just("drop"), SQL_VALUES)),
                      min_size=1, max_size=4))
def test_nsys_columns_retyped_or_dropped(edits):
    path = _TMP / "t.sqlite"
    shutil.copyfile(NSYS, path)
    try:
        con = sqlite3.connect(path)
        for (table, col), every, value in edits:
            try:
                if value == "drop":
                    con.execute(f'ALTER TABLE "{table}" DROP COLUMN "{col}"')
                else:
                    con.execute(f'UPDATE "{table}" SET "{col}" = ? WHERE rowid % ? = 0',
                                [value, every])
            except sqlite3.Error:
                pass  # a column SQLite will not drop (key, indexed): another mutation
        con.commit()
        con.close()
        try:
            read_trace(path)
        except DaydreamError as e:
            assert str(e)
    finally:
        path.unlink(missing_ok=True)


@FUZZ
@given(edits=flips, cut=st.one_of(st.none(), st.floats(0, 1)))
def test_nsys_bytes_flipped_or_truncated(edits, cut):
    data = _flip(NSYS.read_bytes(), edits)
    if cut is not None:
        data = data[: int(cut * len(data))]
    _read(data, "t.sqlite")


# --------------------------------------------------------------------------------------------
# raw CUPTI records


@pytest.fixture(scope="module")
def cupti_bytes(tmp_path_factory) -> bytes:
    from tests.collect import helpers as h
    from tests.collect.test_roundtrip import write

    path = tmp_path_factory.mktemp("cupti") / "job.cupti"
    write(path, h.scenario)
    return path.read_bytes()


def test_cupti_bytes_flipped_or_truncated(cupti_bytes):
    @FUZZ
    @given(edits=flips, cut=st.one_of(st.none(), st.floats(0, 1)))
    def run(edits, cut):
        data = _flip(cupti_bytes, edits)
        if cut is not None:
            data = data[: int(cut * len(data))]
        _read(data, "t.cupti")

    read_trace_ok = read_trace  # the unmutated file converts (the mutations start from sense)
    path = _TMP / "ok.cupti"
    path.write_bytes(cupti_bytes)
    assert read_trace_ok(path).tables["kernel"].num_rows > 0
    run()
