"""How `daydream collect` gets into the job's processes: which ones it collects (workers of
torch.multiprocessing.spawn yes; data-loader workers, multiprocessing's resource tracker and
torch.compile's compile workers no), the sitecustomize it shadows (run first), and what it puts
on PYTHONPATH (its own folder only, never a whole site-packages ahead of the standard library).
CUPTI is the fake of tests/collect/helpers.py."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from daydream.collect import cli
from daydream.collect.cli import ENV, child_env, collect_command
from daydream.ingest.cupti_raw import read_cupti_raw

ROOT = Path(__file__).resolve().parents[2]
FAKE = "tests.collect.helpers:FakeBackend"


def _site(monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "daydream_site", ROOT / "collect" / "_site" / "sitecustomize.py")
    monkeypatch.delenv(ENV, raising=False)
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)
    return site


def test_helper_processes_by_command_line(monkeypatch):
    site = _site(monkeypatch)
    inductor = str(Path(sys.prefix) / "lib" / "site-packages" / "torch" / "_inductor")
    cases = {
        ("python", "train.py"): False,
        ("python", "-m", "mypkg.train"): False,
        ("python", "/venv/bin/torchrun", "--nproc-per-node", "8", "train.py"): True,
        ("python", "-m", "torch.distributed.run", "train.py"): True,
        ("python", "-c", "from multiprocessing.resource_tracker import main;main(5)"): True,
        ("python", "-c", "from multiprocessing.forkserver import main; main(4, 5, ['__main__'])"):
            True,
        ("python", f"{inductor}/compile_worker/__main__.py", "--pickler=x", "--kind=fork",
         "--workers=4", "--parent=1", "--read-fd=3", "--write-fd=4"): True,
        ("python", f"{inductor}/autotune_process_entry.py", "--parent=1"): True,
        ("python", "-m", "torch._inductor.compile_worker", "--workers=2"): True,
    }
    for argv, helper in cases.items():
        monkeypatch.setattr(sys, "orig_argv", list(argv))
        assert site._helper_process() is helper, argv


def test_spawn_children_decided_by_their_target(monkeypatch):
    """A spawn child's command line is the same for a data-loader worker and a training worker
    (``spawn_main ... --multiprocessing-fork``): what it runs tells them apart."""
    pytest.importorskip("torch")
    import torch.multiprocessing  # noqa: F401
    from torch.utils.data._utils import worker
    tspawn = sys.modules["torch.multiprocessing.spawn"]  # the package's `spawn` is a function

    site = _site(monkeypatch)
    monkeypatch.setattr(sys, "orig_argv", ["python", "-c", "from multiprocessing.spawn import "
                                           "spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
                                           "--multiprocessing-fork"])
    assert site._helper_process() is None  # undecided until the target is known
    assert site._helper_target(worker._worker_loop) is True
    assert site._helper_target(tspawn._wrap) is False
    assert site._helper_target(_model_worker) is False
    import concurrent.futures.process as cfp
    assert site._helper_target(cfp._process_worker) is True


def _model_worker():
    pass


SPAWN_JOB = textwrap.dedent("""
    import torch
    import torch.multiprocessing as mp

    class Costly(torch.nn.Module):          # a transform that is a module (as torchvision's are)
        def forward(self, x):
            return x * 2

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 8
        def __getitem__(self, i):
            return Costly()(torch.full((8,), float(i)))

    def work(rank, steps):
        torch.manual_seed(rank)
        model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(Data(), batch_size=4, num_workers=1,
                                             multiprocessing_context="spawn")
        for _ in range(steps):
            for x in loader:
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
        print("worker", rank, "done", flush=True)

    if __name__ == "__main__":
        mp.spawn(work, args=(1,), nprocs=2)
        print("parent done")
""")


def test_spawn_workers_are_collected(tmp_path, capfd):
    """`daydream collect -- python job.py` where job.py starts its trainers with
    torch.multiprocessing.spawn(nprocs=2): one file per trainer, none from the parent (it never
    trains) nor from the data-loader workers the trainers spawn (their transform is a module
    and would otherwise leave records)."""
    pytest.importorskip("torch")
    job = tmp_path / "job.py"
    job.write_text(SPAWN_JOB)
    res = collect_command([sys.executable, str(job)], tmp_path / "out", iterations=2,
                          check=False, backend=FAKE)
    out, err = capfd.readouterr()
    assert res.returncode == 0, err
    assert "parent done" in out
    assert len(res.files) == 2, (res.files, err)
    for path in res.files:
        conv = read_cupti_raw(path)
        assert conv.metadata["iterations_collected"] == 2
        names = conv.tables["range"]["name"].to_pylist()
        assert names.count("model (Sequential) [forward]") == 2
        assert not any(n.startswith("Costly") or "(Costly)" in n for n in names)
    assert len({read_cupti_raw(p).metadata["pid"] for p in res.files}) == 2


SHADOWED = textwrap.dedent("""
    import json, os, sys
    with open(os.environ["SHADOW_OUT"], "w") as f:
        json.dump({"collect_started": "daydream.collect.api" in sys.modules,
                   "site_dir_on_path": any(p.endswith("_site") for p in sys.path)}, f)
""")

PATH_JOB = textwrap.dedent("""
    import json, os, sys, sysconfig
    with open(os.environ["PATH_OUT"], "w") as f:
        json.dump({"path": sys.path, "stdlib": sysconfig.get_paths()["stdlib"],
                   "collect": "daydream.collect.api" in sys.modules}, f)
""")


def test_shadowed_sitecustomize_runs_first(tmp_path):
    """An environment's own sitecustomize (a cluster's, conda's) sets the job up: it runs before
    collection starts, and collection still starts."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(SHADOWED)
    job = tmp_path / "job.py"
    job.write_text(PATH_JOB)
    env = dict(os.environ, PYTHONPATH=str(other), SHADOW_OUT=str(tmp_path / "shadow.json"),
               PATH_OUT=str(tmp_path / "path.json"))
    import subprocess
    proc = subprocess.run([sys.executable, str(job)],
                          env=child_env(tmp_path / "out", 1, 0, base=env, backend=FAKE),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    shadow = json.loads((tmp_path / "shadow.json").read_text())
    assert shadow == {"collect_started": False, "site_dir_on_path": False}
    assert json.loads((tmp_path / "path.json").read_text())["collect"] is True


def test_pythonpath_holds_the_site_folder_only(tmp_path, monkeypatch):
    """Installed (not editable), Daydream's packages live in site-packages: putting that folder
    on PYTHONPATH would put every package of the environment ahead of the standard library in
    the job (and another environment's packages ahead of the job's own)."""
    fake_site = tmp_path / "lib" / "python3.11" / "site-packages"
    monkeypatch.setattr(cli, "PACKAGE_ROOT", fake_site)
    env = child_env(tmp_path / "out", 1, 0, base={"PYTHONPATH": "/job/src"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(cli.SITE_DIR), "/job/src"]
    assert str(fake_site) not in env["PYTHONPATH"]


def test_job_sees_the_standard_library_first(tmp_path):
    """From a source checkout the package root still reaches the job, behind the standard
    library and the job's own paths."""
    job = tmp_path / "job.py"
    job.write_text(PATH_JOB)
    env = dict(os.environ, PATH_OUT=str(tmp_path / "path.json"))
    env.pop("PYTHONPATH", None)
    import subprocess
    proc = subprocess.run([sys.executable, str(job)],
                          env=child_env(tmp_path / "out", 1, 0, base=env, backend=FAKE),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = json.loads((tmp_path / "path.json").read_text())
    assert got["collect"] is True
    path = [os.path.realpath(p) for p in got["path"]]
    stdlib = path.index(os.path.realpath(got["stdlib"]))
    root = os.path.realpath(str(ROOT))
    assert root not in path[:stdlib]
