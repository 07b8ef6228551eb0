"""Trace ids (ingest.ids): a file's id is the BLAKE2b hash of its bytes whichever way it is
read, and files hashed ahead by ``daydream ingest`` are not hashed twice."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from daydream.ingest import ids

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto"
GOOD = DATA / "event_sync_single_stream.json.gz"


def _blake(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=10).hexdigest()


def test_a_files_id_is_the_hash_of_its_bytes(tmp_path):
    # the id stores hold for this file: it must never change, or every stored trace would
    # be ingested again as a new one
    assert ids.content_id(GOOD) == "b26b7370b04a4a47752d" == _blake(GOOD.read_bytes())
    plain = DATA / "backward_thread.json"
    assert ids.content_id(plain) == _blake(plain.read_bytes())
    empty = tmp_path / "empty.json"  # no memory map of an empty file: read instead
    empty.write_bytes(b"")
    assert ids.content_id(empty) == _blake(b"")
    with pytest.raises(OSError):
        ids.content_id(tmp_path / "missing.json")


def test_files_hashed_ahead_are_hashed_once(tmp_path, monkeypatch):
    calls: list[Path] = []
    real = ids.content_id

    def counted(p: Path) -> str:
        calls.append(p)
        return real(p)

    monkeypatch.setattr(ids, "content_id", counted)
    other = tmp_path / "other.json"
    other.write_bytes(b'{"traceEvents": []}')
    unasked = tmp_path / "unasked.json"
    unasked.write_bytes(b"{}")
    missing = tmp_path / "missing.json"
    # a folder's trace files are hashed ahead (ingest.files.expand: `daydream ingest DIR`),
    # each once however often named; what names nothing (an option's value, a missing
    # name) is not, and does not stop the rest
    ids.hash_ahead([str(GOOD), str(unasked), str(tmp_path), "--store", str(missing)])
    ids._AHEAD[other].result(timeout=60)  # found in the folder, hashed before it is asked for
    assert sorted(calls) == sorted([GOOD, unasked, other])
    got = ids.content_ids_in_background([GOOD, other, missing]).result(timeout=60)
    assert set(got) == {GOOD, other, missing}  # only what was asked for
    assert got[GOOD] == _blake(GOOD.read_bytes()) and got[other] == _blake(other.read_bytes())
    assert isinstance(got[missing], OSError)
    assert sorted(calls) == sorted([GOOD, unasked, other, missing])  # each once
    # asked again, a file is hashed again (nothing is kept once taken up)
    assert ids.content_ids_in_background([GOOD]).result(timeout=60)[GOOD] == got[GOOD]
    assert calls.count(GOOD) == 2
