"""How the Kineto reader cuts a document into batches must not show in its tables.

Which events share a batch decides the order of the names in the tables' dictionaries (and
which unused names they carry), so the cut has to depend on the document alone: not on how
large the scanner's buffers happened to start, nor on how far the inflating thread had got
when the scanner caught up with it. Each case reads one real trace with many small batches
and compares every table, dictionaries included, with a reading that cuts it the same way by
other means.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from daydream.ingest import kineto, source
from daydream.ingest import kineto_scan as ks
from daydream.ingest.kineto import read_kineto
from tests.conftest import DATA

TRACE = DATA / "kineto" / "resnet50_ddp_a100_rank0.json.gz"  # 40,573 events, 9.8 MB of JSON


def _tables(conv) -> dict:
    return {name: t for name, t in conv.tables.items()}


def _same(a, b) -> None:
    assert a.events == b.events
    assert a.stats.rows() == b.stats.rows()
    for name, t in _tables(a).items():
        u = b.tables[name]
        assert t.schema == u.schema, name
        for col in t.column_names:
            x, y = t[col].combine_chunks(), u[col].combine_chunks()
            assert x.equals(y), f"{name}.{col}"
            if hasattr(x, "dictionary"):
                assert x.dictionary.equals(y.dictionary), f"{name}.{col} dictionary"


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(kineto, "BATCH_EVENTS", 4096)  # about ten batches


def test_buffers_that_grow_cut_where_full_ones_do(small_batches, monkeypatch):
    monkeypatch.setattr(kineto, "FIRST_ROWS", 4096)
    full = read_kineto(TRACE)
    monkeypatch.setattr(kineto, "FIRST_ROWS", 16)  # grows 16 -> 64 -> ... -> 4096 rows
    _same(full, read_kineto(TRACE))


def test_batches_do_not_follow_the_inflating_thread(small_batches, monkeypatch, tmp_path):
    plain = tmp_path / "trace.json"
    plain.write_bytes(gzip.decompress(TRACE.read_bytes()))
    whole = read_kineto(plain)  # one buffer, nothing to wait for
    # inflated by a thread, 64 KB at a time: the scanner keeps catching up with it
    monkeypatch.setattr(source.Inflating, "CHUNK", 64 << 10)
    monkeypatch.setattr(source.Inflating, "THREAD_BYTES", 0)
    threaded = read_kineto(TRACE)
    _same(whole, threaded)
    # and by the reader itself, chunk by chunk
    monkeypatch.setattr(source.Inflating, "THREAD_BYTES", 1 << 40)
    _same(whole, read_kineto(TRACE))


def test_keys_have_slots_of_their_own():
    for keys, tab, mul in ((ks.TOP_KEYS, ks.TOP_HASH, ks.TOP_MUL),
                           ([k for k, _, _ in ks.ARG_KEYS], ks.ARG_HASH, ks.ARG_MUL)):
        slots = [ks._hash(len(k), k.encode()[0], k.encode()[-1], mul) for k in keys]
        assert len(set(slots)) == len(keys)
        assert [int(tab[s]) for s in slots] == list(range(len(keys)))
        assert int((tab >= 0).sum()) == len(keys)


def test_every_key_is_read(tmp_path):
    """Each args key the scanner knows lands in its column (a key its hash slot missed would
    be skipped without a word)."""
    args = {}
    for i, (k, kind, _) in enumerate(ks.ARG_KEYS):
        args[k] = {0: 1000 + i, 1: f"s{i}", 2: [[i]], 3: [i, i + 1, i + 2], 4: 1000 + i}[kind]
    ev = {"ph": "X", "cat": "kernel", "name": "k", "pid": 1, "tid": 2, "ts": 1.5, "dur": 2,
          "args": args}
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"traceEvents": [ev]}))
    b = kineto._Batch(4, 1 << 12)
    b.scan(np.frombuffer(f.read_bytes(), np.uint8))
    assert int(b.res[ks.R_ERR]) == ks.E_OK and int(b.res[ks.R_N]) == 1
    for i, (k, kind, slot) in enumerate(ks.ARG_KEYS):
        if kind in (0, 4) and k != "External id":  # "external id" comes later: the last wins
            assert b.ipres[0, slot] == 1 and b.ints[slot, 0] == 1000 + i, k
        elif kind == 3:
            assert list(b.ints[slot:slot + 3, 0]) == [i, i + 1, i + 2], k
        elif kind in (1, 2):
            assert b.spres[0, slot] == 1, k
            text = bytes(b.sdata[slot, b.soffs[slot, 0]:b.soffs[slot, 1]]).decode()
            assert text == (f"s{i}" if kind == 1 else json.dumps([[i]])), k
    assert b.ints[ks.I_TS, 0] == 1500 and b.ints[ks.I_PID, 0] == 1


def test_lenient_keys_count_what_is_not_a_number(tmp_path):
    """The allocator's keys (kind 4) take a value that is not a number (true, an object, a
    word) as null and count it, where the other numeric keys fail the trace: a damaged
    memory record is skipped, not the trace. Hand-made event."""
    ev = {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1,
          "args": {"Bytes": True, "Total Allocated": {"a": 1}, "Total Reserved": "many",
                   "Device Id": "7", "Device Type": None}}
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"traceEvents": [ev]}))
    b = kineto._Batch(4, 1 << 12)
    b.scan(np.frombuffer(f.read_bytes(), np.uint8))
    assert int(b.res[ks.R_ERR]) == ks.E_OK and int(b.res[ks.R_N]) == 1
    assert b.ipres[0, ks.I_MEMBYTES] == 0 and b.ipres[0, ks.I_MEMALLOC] == 0
    assert b.ipres[0, ks.I_MEMRES] == 0 and b.ipres[0, ks.I_MEMDEVTYPE] == 0
    assert b.ipres[0, ks.I_MEMDEV] == 1 and b.ints[ks.I_MEMDEV, 0] == 7  # digits in a string
    counted = {s for s in range(ks.NC) if b.counters[s]}
    assert counted == {ks.I_MEMBYTES, ks.I_MEMALLOC, ks.I_MEMRES}  # null is no value at all
