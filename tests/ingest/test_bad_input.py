"""Bad input: one clear line naming file, record and field; exit 1; the store unchanged.

The damaged files are hand-made here from a real trace (truncated, retyped, nested) so each case
is exact; each test snapshots the store before and after.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from daydream import commandline
from tests.conftest import DATA

GOOD = DATA / "kineto" / "event_sync_single_stream.json.gz"


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    old = sys.argv
    sys.argv = ["daydream", *args]
    try:
        commandline.main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = old
    out, err = capsys.readouterr()
    return code, out, err


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"}


@pytest.fixture
def store(tmp_path, capsys) -> Path:
    st = tmp_path / "store"
    code, _, err = run_cli(["ingest", str(GOOD), "--store", str(st)], capsys)
    assert code == 0, err
    return st


def _good_text() -> str:
    return gzip.decompress(GOOD.read_bytes()).decode()


def _events_with(mutate) -> str:
    d = json.loads(_good_text())
    mutate(d["traceEvents"])
    return json.dumps(d)


def _kernel_index(events) -> int:
    return next(i for i, e in enumerate(events) if e.get("cat") == "kernel")


CASES = {
    "empty": (b"", "empty file"),
    "truncated_gzip": (None, "truncated gzip"),
    "truncated_json": (None, "unexpected end of file"),
    "not_a_trace_text": (b"hello, this is not a trace\n", "not a trace"),
    "not_a_trace_json": (b'{"nodes": [], "schema": "1.0"}', "not a trace: no traceEvents"),
    "ts_string": (None, "field ts: expected a number, found a string"),
    "args_list": (None, "field args: expected an object, found an array"),
    "correlation_object": (None, "field args.correlation: expected a number, found an object"),
    "deep_nesting": (None, "nested deeper than"),
    "call_without_name": (None, "field name: missing name"),
}


def _make(case: str, tmp_path: Path) -> tuple[Path, int | None]:
    data, _ = CASES[case]
    record = None
    if case == "truncated_gzip":
        raw = GOOD.read_bytes()
        data = raw[: len(raw) // 2]
        name = "t.json.gz"
    elif case == "truncated_json":
        text = _good_text()
        data = text[: len(text) * 2 // 3].encode()
        name = "t.json"
    elif case == "call_without_name":  # was an Arrow error from the Parquet writer
        holder = {}

        def mutate(ev):
            i = next(i for i, e in enumerate(ev) if e.get("cat") == "cuda_runtime")
            holder["i"] = i
            ev[i]["name"] = None
        data = _events_with(mutate).encode()
        record = holder["i"]
        name = "t.json"
    elif case in ("ts_string", "args_list", "correlation_object"):
        holder = {}

        def mutate(ev):
            i = _kernel_index(ev)
            holder["i"] = i
            if case == "ts_string":
                ev[i]["ts"] = str(ev[i]["ts"])
            elif case == "args_list":
                ev[i]["args"] = [1, 2]
            else:
                ev[i]["args"]["correlation"] = {"x": 1}
        data = _events_with(mutate).encode()
        record = holder["i"]
        name = "t.json"
    elif case == "deep_nesting":
        depth = 1_000_000
        ev = '{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, ' \
             '"dur": 1, "args": {"x": ' + "[" * depth + "]" * depth + "}}"
        data = ('{"traceEvents": [' + ev + "]}").encode()
        record = 0
        name = "t.json"
    else:
        name = "t.json"
    f = tmp_path / name
    f.write_bytes(data)
    return f, record


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_one_line_and_store_unchanged(case, store, tmp_path, capsys):
    f, record = _make(case, tmp_path)
    before = snapshot(store)
    code, out, err = run_cli(["ingest", str(f), "--store", str(store)], capsys)
    assert code == 1
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(f"error: {f}: "), line
    assert CASES[case][1] in line
    if record is not None:
        assert f": record {record}: " in line
    assert "Traceback" not in err
    assert snapshot(store) == before


def test_sqlite_not_nsys(store, tmp_path, capsys):
    f = tmp_path / "other.sqlite"
    con = sqlite3.connect(f)
    con.execute("create table customers (id integer, name text)")
    con.commit()
    con.close()
    before = snapshot(store)
    code, _, err = run_cli(["ingest", str(f), "--store", str(store)], capsys)
    assert code == 1
    assert err.startswith(f"error: {f}: ") and "Nsight" in err
    assert snapshot(store) == before


def test_one_bad_file_in_a_batch(tmp_path, capsys):
    folder = tmp_path / "batch"
    folder.mkdir()
    for name in ("simple_add_a100.json.gz", "alexnet_fwd_a100.json.gz",
                 "triton_example.json.gz"):
        (folder / name).write_bytes((DATA / "kineto" / name).read_bytes())
    (folder / "bad.json").write_text('{"traceEvents": [{"ph": "X", "ts": "x"}]}')
    st = tmp_path / "store"
    code, out, err = run_cli(["ingest", str(folder), "--store", str(st), "-j", "2"], capsys)
    assert code == 1
    assert err.count("error: ") == 1 and "bad.json: record 0: field ts" in err
    assert out.count(" ingested ") == 3
    # --strict stops at the first failure; what was committed before it stays
    st2 = tmp_path / "store2"
    code, out, err = run_cli(["ingest", str(folder / "bad.json"),
                              str(folder / "simple_add_a100.json.gz"),
                              "--store", str(st2), "--strict", "-j", "1"], capsys)
    assert code == 1 and "bad.json" in err
    assert "simple_add" not in out


def test_cli_subprocess_has_no_traceback(tmp_path):
    f = tmp_path / "t.json"
    f.write_text('{"traceEvents": [')
    p = subprocess.run([sys.executable, "-m", "daydream", "ingest", str(f), "--store",
                        str(tmp_path / "s")], capture_output=True, text=True)
    assert p.returncode == 1
    assert p.stderr.splitlines()[0] == \
        f"error: {f}: record 0: unexpected end of file (truncated JSON) (byte 17)"
    assert "Traceback" not in p.stderr
