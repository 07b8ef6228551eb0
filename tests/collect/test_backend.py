"""The CUPTI backend's calls, in order, against a stand-in for cupti-python's module (no GPU):
device and context kinds at open, the rest at start; call kinds off, then the device
synchronized, before the forced flush; default flushes never forced."""

from __future__ import annotations

import enum

import pytest

from daydream.collect import cupti_backend as cb


class StubCupti:
    ActivityKind = enum.IntEnum("ActivityKind", [(k, i) for i, k in enumerate(
        cb.EARLY_KINDS + cb.KINDS, 1)])
    ActivityThreadIdType = enum.IntEnum("ActivityThreadIdType", [("SYSTEM", 1)])

    def __init__(self, log):
        self.log = log

    def activity_register_callbacks(self, requested, completed):
        self.log.append(("register",))

    def set_thread_id_type(self, t):
        pass

    def activity_enable(self, kind):
        self.log.append(("enable", kind.name))

    def activity_disable(self, kind):
        self.log.append(("disable", kind.name))

    def activity_flush_all(self, flag):
        self.log.append(("flush", flag))

    def get_timestamp(self):
        return 1


class StubRecorder:
    def handle_buffer(self, activities):
        pass

    def meta_later(self, obj):
        self.later = obj


@pytest.fixture
def backend(monkeypatch):
    log: list = []
    b = cb.CuptiBackend(StubRecorder())
    b.cupti = StubCupti(log)
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/x/libcupti.so")
    monkeypatch.setattr(cb, "synchronize_devices", lambda: log.append(("synchronize",)))
    return b, log


def test_device_kinds_on_at_open_the_rest_at_start(backend):
    b, log = backend
    b.open()
    assert [e for e in log if e[0] == "enable"] == [("enable", "DEVICE"), ("enable", "CONTEXT")]
    log.clear()
    b.start()
    assert {e[1] for e in log if e[0] == "enable"} == set(cb.KINDS)
    assert b.recorder.later["activity_kinds"] == list(cb.EARLY_KINDS + cb.KINDS)


def test_synchronize_then_forced_flush_then_off(backend):
    b, log = backend
    b.open()
    b.start()
    log.clear()
    b.flush(forced=False)
    b.synchronize()
    b.stop()
    assert log[0] == ("flush", 0)  # the periodic, default flush
    sync = log.index(("synchronize",))
    # the calls our own synchronize makes are not recorded...
    assert {e[1] for e in log[1:sync]} == set(cb.CALL_KINDS)
    assert all(e[0] == "disable" for e in log[1:sync])
    # ...and the flush that follows is forced, kernels and copies still on until after it
    assert log[sync + 1] == ("flush", cb.FLUSH_FORCED)
    assert {e[1] for e in log[sync + 2:]} == set(cb.EARLY_KINDS + cb.KINDS) - set(cb.CALL_KINDS)


def test_check_refuses_a_mismatched_library(backend, monkeypatch):
    b, _ = backend
    monkeypatch.setattr(cb, "load", lambda: b.cupti)
    monkeypatch.delenv(cb.ANY_CUPTI_ENV, raising=False)
    monkeypatch.setattr(cb, "library_facts", lambda: {
        "path": "/t/libcupti.so.12", "major": 12, "version": None, "bindings": "13.4.0"})
    with pytest.raises(cb.DaydreamError, match=r"^daydream collect needs an NVIDIA GPU with "
                                               r"CUPTI: libcupti 12"):
        b.check()
    assert b.library["mismatch"].startswith("libcupti 12")
