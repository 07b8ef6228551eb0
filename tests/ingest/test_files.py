"""Which files an ingest reads (ingest.files), and the worker processes `daydream ingest`
starts for them: none where they would convert nothing (a folder of one trace spent a core
on a worker's imports beside the one conversion, 12% of the 1M-event trace's ingest)."""

from __future__ import annotations

import shutil
from pathlib import Path

from daydream.ingest import files

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto"
SMALL = [DATA / "event_sync_single_stream.json.gz", DATA / "event_sync_multi_stream.json.gz"]


def _cli(*args):
    from typer.testing import CliRunner

    from daydream.cli import app
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": ""},
                              catch_exceptions=False)


def _fake_gzip(path: Path, inflated: int) -> Path:
    """Hand-made: gzip's magic and a trailer that says INFLATED bytes, all ``json_bytes``
    reads of a file (not a readable gzip stream)."""
    path.write_bytes(b"\x1f\x8b" + bytes(20) + (inflated % 2**32).to_bytes(4, "little"))
    return path


def test_a_gzipped_traces_size_is_its_trailers_and_a_plain_ones_its_own(tmp_path):
    assert files.json_bytes(DATA / "backward_thread.json") == \
        (DATA / "backward_thread.json").stat().st_size
    big = _fake_gzip(tmp_path / "big.json.gz", files.BIG_BYTES + 1)
    assert files.json_bytes(big) == files.BIG_BYTES + 1 and files.is_big(big)
    assert not files.is_big(_fake_gzip(tmp_path / "small.json.gz", 1000))
    assert not files.is_big(tmp_path / "missing.json.gz")  # its ingest reports it


def test_workers_convert_beside_this_process_only_two_files_or_more_none_big(tmp_path):
    assert files.converted_beside(SMALL)
    assert not files.converted_beside(SMALL[:1])
    assert not files.converted_beside([])
    big = _fake_gzip(tmp_path / "big.json.gz", files.BIG_BYTES + 1)
    assert not files.converted_beside([*SMALL, big])


def test_ingest_of_a_folder_starts_workers_only_where_they_convert(tmp_path, monkeypatch):
    from daydream.base import runner

    started: list[int | None] = []

    def recorded(workers, ray, *warm):
        started.append(workers)
        return None  # the batch makes its own runner, as where none was started early

    monkeypatch.setattr(runner, "started_early", recorded)
    one = tmp_path / "one"
    one.mkdir()
    shutil.copy(SMALL[0], one)
    res = _cli("ingest", one, "--store", tmp_path / "s1", "--workers", "2")
    assert res.exit_code == 0, res.output
    assert started == []  # a folder of one trace: no worker started
    two = tmp_path / "two"
    two.mkdir()
    for f in SMALL:
        shutil.copy(f, two)
    res = _cli("ingest", two, "--store", tmp_path / "s2", "--workers", "2")
    assert res.exit_code == 0, res.output
    assert started == [2]
