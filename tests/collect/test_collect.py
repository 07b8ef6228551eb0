"""collect() and `daydream collect` on a machine without a GPU: the clear error, before the job
runs (or, inside the job's processes, said and survived); the launcher's environment. Needs
neither torch nor cupti-python (test_collect_torch.py runs the whole path with a fake CUPTI)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from daydream.base.errors import DaydreamError
from daydream.collect import cupti_backend
from daydream.collect.api import collect
from daydream.collect.cli import ENV, child_env, collect_command

ROOT = Path(__file__).resolve().parents[2]
NEEDS_GPU = r"^daydream collect needs an NVIDIA GPU with CUPTI: "


def test_collect_without_gpu_is_a_clear_error(tmp_path):
    c = collect(tmp_path)
    with pytest.raises(DaydreamError, match=NEEDS_GPU):
        c.start()
    assert not list(tmp_path.iterdir())
    with pytest.raises(DaydreamError, match=NEEDS_GPU), collect(tmp_path):
        pass


def test_collect_without_cupti_python_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupti", None)
    with pytest.raises(DaydreamError, match=NEEDS_GPU + r"cupti-python is not installed"):
        collect(tmp_path).start()


def test_bad_arguments(tmp_path):
    with pytest.raises(DaydreamError, match="iterations must be at least 1"):
        collect(tmp_path, 0)
    with pytest.raises(DaydreamError, match="nothing to run"):
        collect_command([], tmp_path)


def test_command_without_gpu_fails_before_running(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(DaydreamError, match=NEEDS_GPU):
        collect_command([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], tmp_path)
    assert not marker.exists()


def test_command_injects_collection_into_the_job(tmp_path, capfd):
    """Without the up-front check, the job's own interpreter tries to start collection (through
    the injected sitecustomize), says why it cannot, and runs on."""
    res = collect_command([sys.executable, "-c", "import os; print('job ran', os.getpid())"],
                          tmp_path / "out", iterations=2, check=False)
    out, err = capfd.readouterr()
    assert res.returncode == 0 and res.files == []
    assert "job ran" in out
    assert "daydream collect: error: daydream collect needs an NVIDIA GPU with CUPTI" in err
    env = child_env(tmp_path, 3, 1, base={"PYTHONPATH": "/x"})
    assert env["PYTHONPATH"].split(os.pathsep)[-1] == "/x"
    assert '"iterations": 3' in env[ENV] and '"warmup": 1' in env[ENV]


def test_probe_uses_the_backend():
    with pytest.raises(DaydreamError, match=NEEDS_GPU):
        cupti_backend.probe()
