"""bench/manifest.py: each shared trace calibrates or is judged, never both; the fitting scripts
read calibration traces only, the accuracy sections judged ones only."""

from __future__ import annotations

import ast
import json
import re

import pytest

from bench import manifest as m
from tests.conftest import ROOT

JUDGE_CASES = ROOT.parent / "shared" / "judge" / "cases.json"
FITTING = ("bench/calibrate_latency.py", "bench/amp_calibration.py", "bench/edge_evidence.py",
           "bench/calibrate_gpu_fixed.py", "bench/calibrate_drain.py")
TRACE_RE = re.compile(r"^(hta|param|particle|tracelens|kineto-tb-plugin|nsys)/[\w./-]+"
                      r"(\.json\.gz|\.json|\.sqlite|dlrm_8ranks)$")


def test_every_fit_reads_calibration_traces_only():
    for name, fit in m.FITS.items():
        for rel in fit["traces"]:
            assert m.role(rel) == m.CALIBRATE, (name, rel)
        # a tolerance set from a judged trace names it, and is checked on calibration traces
        for rel in fit.get("set_from", []):
            assert m.role(rel) == m.JUDGED, (name, rel)
        assert all(m.role(r) == m.CALIBRATE for r in fit.get("check_on", [])), name
    assert m.calibration("latency") and m.calibration("amp.conv") and m.calibration("amp.gemm")


def test_the_judges_cases_are_judged():
    if not JUDGE_CASES.exists():
        pytest.skip("../shared/judge is not here")
    cases = json.loads(JUDGE_CASES.read_text())["cases"]
    paths = {c[k] for c in cases for k in ("before", "after", "trace") if k in c}
    assert paths
    for p in paths:
        assert m.role(p) == m.JUDGED, p
        assert "judge" in m.entry(p).uses, p


def test_every_shared_trace_has_a_role():
    if not m.SHARED.exists():
        pytest.skip("../shared/traces is not here")
    files = [p.relative_to(m.SHARED).as_posix() for p in m.SHARED.rglob("*")
             if p.is_file() and p.name.endswith((".json", ".json.gz", ".sqlite"))
             and ".et." not in p.name and "LICENSES" not in p.parts]
    assert files
    for rel in files:
        assert m.role(rel) is not None or rel in m.UNUSED, rel
    for rel in m.TRACES:
        assert (m.SHARED / rel).exists(), f"{rel}: declared, not in ../shared/traces"


def test_a_fitting_script_refuses_a_judged_trace(tmp_path, monkeypatch):
    from bench import amp_calibration, calibrate_latency
    judged = "particle/particle_transformer_a100_fwd_bs64.json.gz"
    with pytest.raises(m.RoleError):
        calibrate_latency.trace_stats(tmp_path, judged)
    monkeypatch.setattr(amp_calibration, "CALIBRATION", {"conv": [judged]})
    with pytest.raises(m.RoleError):
        amp_calibration.main(["--store", str(tmp_path)])
    from bench import edge_evidence
    monkeypatch.setitem(m.FITS["edges"], "traces", [judged])
    with pytest.raises(m.RoleError):
        edge_evidence.evidence(tmp_path)
    # and neither script opens a shared trace by any other route than the manifest's
    for f in FITTING:
        src = (ROOT / f).read_text()
        assert "SHARED /" not in src, f
        lits = [n.value for n in ast.walk(ast.parse(src))
                if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        assert not [s for s in lits if TRACE_RE.match(s) and m.role(s) != m.CALIBRATE], f


def test_the_accuracy_sections_refuse_a_calibration_trace(tmp_path):
    from bench.accuracy import Context
    from bench.accuracy import traces as tr
    cal = "kineto-tb-plugin/resnet50_v100_nw0_run1.json.gz"
    with pytest.raises(m.RoleError):
        tr.resolve(cal, None)
    ctx = Context(tmp_path, predict=lambda *a, **k: {"measured_ms": 1.0})
    for path in (m.SHARED / cal, ROOT / "tests" / "data" / "kineto" / "alexnet_fwd_a100.json.gz"):
        with pytest.raises(m.RoleError):
            ctx.predict(path)
        with pytest.raises(m.RoleError):
            ctx.bounds(path)
    # a file outside ../shared (the CPU pairs of tests/data/whatif) is the harness's own
    assert ctx.predict(tmp_path / "own.json.gz") == {"measured_ms": 1.0}
    # every training trace the sections run on is judged
    for label, rel, _ in tr.TRAINING:
        assert m.role(rel) == m.JUDGED, label


def test_every_trace_the_sections_name_is_judged():
    """Every shared trace path written in the harness's modules is judged in the manifest."""
    named = []
    for f in sorted((ROOT / "bench" / "accuracy").glob("*.py")):
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) \
                    and TRACE_RE.match(n.value):
                named.append((f.name, n.value))
    assert named
    for f, rel in named:
        assert m.role(rel) == m.JUDGED, (f, rel)


def test_relative_maps_copies_to_the_shared_trace_they_stand_in_for():
    data = ROOT / "tests" / "data"
    assert m.relative(m.SHARED / "hta" / "small" / "simple_add_a100.json.gz") == \
        "hta/small/simple_add_a100.json.gz"
    assert m.relative(data / "kineto" / "resnet50_v100_rank0.json.gz") == \
        "hta/resnet50_v100_rank0.json.gz"
    assert m.relative(data / "kineto" / "dlrm_8ranks" / "rank3.kineto.json.gz") == \
        "param/dlrm_8ranks/rank3.kineto.json.gz"
    assert m.role("param/dlrm_8ranks/rank3.kineto.json.gz") == m.JUDGED
    assert m.relative(ROOT / "README.md") is None
    # the project's own recordings (the CPU pairs) are no shared trace: the harness's own
    assert m.relative(data / "whatif" / "sgd_foreach.json.gz") is None
    m.check_judged(data / "whatif" / "sgd_foreach.json.gz")
