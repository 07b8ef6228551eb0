"""CUPTI buffers -> collector -> raw record file -> ingest -> activity tables.

The buffers (tests/collect/helpers.py) hold records laid out as CUPTI lays them out; every
expected row below is written by hand from those records.
"""

from __future__ import annotations

import gzip
import shutil
import zlib

import pyarrow as pa
import pytest

from daydream.base.errors import TraceFormatError
from daydream.collect.recorder import Recorder
from daydream.collect.writer import RawWriter
from daydream.ingest import cupti_format as fmt
from daydream.ingest.convert import read_trace
from daydream.ingest.cupti_raw import read_cupti_raw
from daydream.ingest.schema import TABLES
from daydream.ingest.source import sniff
from tests.collect import helpers as h

T0 = h.T0


def write(path, buffers, *, spacing=0, codec=fmt.ZLIB, dropped=None, markers=True,
          close=True, order=None):
    strings = h.Strings()
    writer = RawWriter(path, {"pid": h.PID, "external_correlation_kind": h.CUSTOM2,
                              "rank": 3, "world_size": 8}, codec=codec)
    rec = Recorder(writer, api_name=h.api_name, dropped=dropped)
    bufs = buffers(strings)
    for i in order or range(len(bufs)):
        rec.handle_buffer(h.Buffer(bufs[i], spacing=spacing).activities)
    if markers:
        rec.add_markers(h.markers(rec.names))
    if close:
        rec.close()
    return rec


def rows(table: pa.Table, cols: list[str]) -> list[tuple]:
    return [tuple(r[c] for c in cols) for r in table.select(cols).to_pylist()]


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "job.cupti"
    write(path, h.scenario)
    return path


def test_kernels(trace):
    conv = read_cupti_raw(trace)
    cols = ["name", "start_ns", "dur_ns", "device", "context", "stream", "correlation",
            "external_id", "grid_x", "grid_y", "block_x", "registers_per_thread",
            "shared_memory_bytes"]
    # delivered relu, gemm, gemm: read back in start order
    assert rows(conv.tables["kernel"], cols) == [
        ("gemm_kernel", T0 + 1100, 50, 0, 1, 7, 1, 11, 4, 2, 128, 32, 1536),
        ("relu_kernel", T0 + 1150, 10, 0, 1, 7, 2, 11, 4, 2, 128, 32, 1536),
        ("gemm_kernel", T0 + 1160, 10, 0, 1, 7, 3, 12, 4, 2, 128, 32, 1536),
    ]
    assert conv.tables["kernel"]["name"].type == pa.dictionary(pa.int32(), pa.string())


def test_calls(trace):
    conv = read_cupti_raw(trace)
    cols = ["pid", "tid", "name", "kind", "cbid", "correlation", "external_id", "start_ns",
            "dur_ns"]
    assert rows(conv.tables["api"], cols) == [
        (h.PID, h.TID, "cudaLaunchKernel", "runtime", 211, 1, 11, T0 + 1000, 10),
        (h.PID, h.TID, "cudaLaunchKernel", "runtime", 211, 2, 11, T0 + 1020, 10),
        (h.PID, h.TID, "cuLaunchKernel", "driver", 307, 3, 12, T0 + 1040, 5),
        # correlation 4's external record is of another kind (CUSTOM0): not a marker's
        (h.PID, h.TID, "cudaMemcpyAsync", "runtime", 41, 4, None, T0 + 1050, 10),
        (h.PID, h.TID, "cudaMemsetAsync", "runtime", 51, 5, None, T0 + 1070, 5),
        (h.PID, h.TID, "cudaStreamSynchronize", "runtime", 131, 6, None, T0 + 1080, 120),
    ]
    assert conv.stats.get("external_correlation_other_kind") == 1


def test_copies_sets_syncs(trace):
    t = read_cupti_raw(trace).tables
    assert rows(t["memcpy"], ["name", "bytes", "copy_kind", "src_kind", "dst_kind", "start_ns",
                              "dur_ns", "correlation", "stream"]) == [
        ("Memcpy HtoD (Pageable -> Device)", 4096, "HtoD", "Pageable", "Device", T0 + 1061, 9,
         4, 7)]
    assert rows(t["memset"], ["name", "bytes", "start_ns", "dur_ns", "correlation"]) == [
        ("Memset (Device)", 256, T0 + 1076, 2, 5)]
    # the sync record has no thread: it comes from the call with its correlation id; no event
    assert rows(t["sync"], ["pid", "tid", "device", "stream", "sync_kind", "event_id",
                            "correlation", "start_ns", "dur_ns"]) == [
        (h.PID, h.TID, 0, 7, "stream_sync", None, 6, T0 + 1085, 110)]


def test_ranges_markers_and_nvtx(trace):
    conv = read_cupti_raw(trace)
    cols = ["range_id", "kind", "name", "start_ns", "dur_ns", "depth", "parent", "external_id",
            "pid", "tid"]
    assert rows(conv.tables["range"], cols) == [
        (0, "user_annotation", "ProfilerStep#0", T0 + 980, 420, 0, None, 10, h.PID, h.TID),
        (1, "nvtx", "nvtx_range", T0 + 985, 315, 1, 0, None, h.PID, h.TID),
        (2, "module", "model (Net) [forward]", T0 + 990, 45, 2, 1, 11, h.PID, h.TID),
        (3, "module", "model.fc (Linear) [forward]", T0 + 1036, 10, 2, 1, 12, h.PID, h.TID),
    ]
    assert conv.stats.get("nvtx_mark_skipped") == 1


def test_trace_facts(trace):
    conv = read_cupti_raw(trace)
    assert conv.source_format == "cupti_raw" and conv.source_version == "1"
    assert conv.rank == 3 and conv.world_size == 8
    # 2 + 2 + 6 + 4 records in the first buffer, 7 in the second, 3 markers
    assert conv.events == 24
    assert conv.start_ns == T0 + 980 and conv.end_ns == T0 + 1400
    (dev,) = conv.devices
    assert dev["name"] == "NVIDIA H200" and (dev["computeMajor"], dev["computeMinor"]) == (9, 0)
    assert dev["numSms"] == 132 and dev["clockRateHz"] == 1_980_000_000
    assert dev["memoryBandwidthBytesPerS"] == 4_800_000_000_000
    assert conv.metadata["pid"] == h.PID
    assert not conv.stats.get("collection_not_closed")
    for name, table in conv.tables.items():
        assert table.schema == TABLES[name].schema


def test_every_reader_path_gives_the_same_tables(tmp_path, trace):
    """Records copied one by one (not one buffer), stored raw instead of zlib, the file gzipped,
    and read through the format dispatch: the same tables."""
    base = read_cupti_raw(trace).tables
    spaced = tmp_path / "spaced.cupti"
    write(spaced, h.scenario, spacing=4096, codec=fmt.RAW)
    gz = tmp_path / "job.cupti.gz"
    with open(trace, "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert sniff(gz) == "cupti_raw"
    for other in (read_cupti_raw(spaced).tables, read_trace(gz).tables,
                  read_trace(trace).tables):
        for name in base:
            assert other[name].equals(base[name]), name


def test_out_of_order_buffers(tmp_path, trace):
    """CUPTI delivers buffers per thread and stream, not in time order: kernels and their
    correlation records before the calls, NVTX end before its start. Same tables."""
    late = tmp_path / "late.cupti"
    write(late, h.scenario, order=[1, 0])
    base = read_cupti_raw(trace).tables
    other = read_cupti_raw(late).tables
    for name in base:
        assert other[name].equals(base[name]), name


def test_dropped_records_are_reported(tmp_path):
    path = tmp_path / "dropped.cupti"
    counts = iter([5, 0])
    write(path, h.scenario, dropped=lambda: next(counts))
    conv = read_cupti_raw(path)
    assert conv.stats.get("cupti_dropped_records") == 5
    stat = next(s for s in conv.stats.rows() if s["name"] == "cupti_dropped_records")
    assert stat["severity"] == "warning"


def test_crash_mid_write_keeps_complete_chunks(tmp_path):
    """A job killed while a chunk was being written: everything before it reads, the cut chunk
    is counted, and the missing END is noted."""
    path = tmp_path / "crash.cupti"
    write(path, h.scenario, close=False, markers=False)
    whole = path.read_bytes()
    full = read_cupti_raw(path)
    assert full.stats.get("collection_not_closed") == 1
    assert not full.stats.get("truncated_chunk")
    # cut the last chunk (records of the second buffer) in half
    last = whole.rindex(fmt.CHUNK_MAGIC)
    lost = int.from_bytes(whole[last + 8:last + 12], "little")  # its record count
    assert whole[last + 4] == fmt.RECORDS and lost > 0
    path.write_bytes(whole[:last + 40])
    cut = read_cupti_raw(path)
    assert cut.stats.get("truncated_chunk") == 1
    assert cut.events == full.events - lost
    assert sum(t.num_rows for t in cut.tables.values()) < \
        sum(t.num_rows for t in full.tables.values())
    for name in ("kernel", "api", "memcpy"):  # chunks before the cut are all there
        assert cut.tables[name].equals(full.tables[name]), name
    # cut inside a chunk header
    path.write_bytes(whole[:last + 10])
    assert read_cupti_raw(path).stats.get("truncated_chunk") == 1


def test_damaged_chunk_is_skipped(tmp_path, trace):
    data = bytearray(trace.read_bytes())
    # flip a byte in the payload of the first RECORDS chunk
    pos = 0
    while True:
        pos = data.index(fmt.CHUNK_MAGIC, pos)
        if data[pos + 4] == fmt.RECORDS:
            break
        pos += 4
    data[pos + fmt.CHUNK_HEADER_BYTES + 3] ^= 0xFF
    trace.write_bytes(bytes(data))
    conv = read_cupti_raw(trace)
    assert conv.stats.get("chunk_crc_mismatch") == 1


def test_header_errors(tmp_path, trace):
    whole = trace.read_bytes()
    bad = tmp_path / "bad.cupti"
    bad.write_bytes(whole[:12])
    with pytest.raises(TraceFormatError, match="inside the header"):
        read_cupti_raw(bad)
    header = fmt.encode_header({"format": fmt.FORMAT_NAME, "version": 99})
    bad.write_bytes(header)
    with pytest.raises(TraceFormatError, match=r"version 99; supported: .* versions 1"):
        read_cupti_raw(bad)
    bad.write_bytes(b"DDCUPTI1" + b"\x05\x00\x00\x00" + b"nope!")
    with pytest.raises(TraceFormatError, match="not valid JSON"):
        read_cupti_raw(bad)


def test_layout_missing_a_field_is_an_error(tmp_path):
    path = tmp_path / "odd.cupti"
    spec = fmt.layout_spec(1, "CUpti_ActivityAPI", h.record("ActivityAPI").dtype)
    spec["fields"] = [f for f in spec["fields"] if f[0] != "cbid"]
    path.write_bytes(fmt.encode_header({"format": fmt.FORMAT_NAME, "version": 1})
                     + fmt.encode_json_chunk(fmt.LAYOUT, spec))
    with pytest.raises(TraceFormatError, match="CUpti_ActivityAPI.*has no field cbid") as e:
        read_cupti_raw(path)
    assert e.value.field == "CUpti_ActivityAPI.cbid"


def test_unknown_record_class_is_counted(tmp_path):
    """A record class neither we nor cupti-python know is skipped and reported."""
    path = tmp_path / "unknown.cupti"

    def buffers(strings):
        odd = h.record("ActivityAPI", kind=fmt.KIND_RUNTIME, cbid=211, start=T0 + 1,
                       end=T0 + 2, process_id=1, thread_id=1, correlation_id=1)
        return [[("ActivityAPI", odd), ("ActivityFromTheFuture99", odd)]]

    write(path, buffers, markers=False)
    conv = read_cupti_raw(path)
    assert conv.tables["api"].num_rows == 1
    assert conv.metadata["records_skipped"] == 1
    assert conv.metadata["records_skipped_classes"] == ["ActivityFromTheFuture99"]
    assert conv.stats.get("records_skipped") == 1


def test_collector_errors_are_reported(tmp_path):
    path = tmp_path / "err.cupti"
    writer = RawWriter(path, {})
    rec = Recorder(writer)
    rec.handle_buffer([object()])  # not a record wrapper: the callback must not raise
    rec.handle_buffer(h.Buffer([("ActivityContext4", h.record(
        "ActivityContext4", kind=fmt.KIND_CONTEXT, context_id=1, device_id=0))]).activities)
    rec.close()
    conv = read_cupti_raw(path)
    assert conv.stats.get("collector_errors") == 1
    assert "AttributeError" in next(s["detail"] for s in conv.stats.rows()
                                    if s["name"] == "collector_errors")


def test_zlib_payloads_are_framed(trace):
    """Spot-check the framing against the documented layout with plain struct/zlib."""
    import struct
    data = trace.read_bytes()
    assert data[:8] == b"DDCUPTI1"
    (n,) = struct.unpack_from("<I", data, 8)
    pos = 12 + n + (-(12 + n)) % 8
    magic, ctype, codec, layout, count, stored, raw, crc = struct.unpack_from("<4sBBHIQQI",
                                                                              data, pos)
    assert magic == b"DDCK" and ctype == fmt.LAYOUT and codec == fmt.RAW
    payload = data[pos + 32:pos + 32 + stored]
    assert zlib.crc32(payload) == crc and b"CUpti_" in payload
