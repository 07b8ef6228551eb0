"""The local worker pool ends with its driver, however the driver ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DATA

# Real traces big enough that converting them keeps both workers busy for a while; the
# fleet is made of distinct copies of them (tests/daydream/variants.py), many enough that a
# fast machine is still converting when the driver is killed.
SOURCES = [DATA / "kineto" / n for n in (
    "resnet50_jan21_nw0.json.gz", "resnet50_v100_rank0.json.gz",
    "resnet_actckpt_mi300x_rank0_of8.json.gz", "resnet50_ddp_a100_rank0.json.gz")]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Path:
    from tests.daydream.variants import make_variants
    d = tmp_path_factory.mktemp("fleet")
    make_variants(SOURCES, 16, d)
    return d


def _procs() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, start time) of every process."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2:].split()
        out[int(d.name)] = (int(f[1]), f[0], f[19])
    return out


def _descendants(root: int) -> dict[int, str]:
    """Every process under ``root``: pid -> start time (to tell a reused pid)."""
    procs = _procs()
    found, todo = {}, [root]
    while todo:
        p = todo.pop()
        for c, (pp, _, st) in procs.items():
            if pp == p and c not in found:
                found[c] = st
                todo.append(c)
    return found


def _alive(pids: dict[int, str]) -> list[int]:
    procs = _procs()
    return [p for p, st in pids.items()
            if p in procs and procs[p][2] == st and procs[p][1] not in "ZX"]


def _kill_and_wait(driver: subprocess.Popen, pids: dict[int, str]) -> list[int]:
    """SIGKILL the driver, then give PIDS 5 s to end; those still alive are returned (and
    killed, to leave the machine clean whatever the outcome)."""
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 5
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _alive(pids)
    for p in left:
        os.kill(p, signal.SIGKILL)
    return left


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkilled_driver_leaves_no_worker(tmp_path, fleet):
    driver = subprocess.Popen(
        [sys.executable, "-m", "daydream", "ingest", str(fleet), "--store",
         str(tmp_path / "store"), "--jobs", "3"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and driver.poll() is None:
            kids = _descendants(driver.pid)
            # the resource tracker and the two workers (three jobs: the driver converts too,
            # base.runner.SharedRunner), the workers started on their traces
            if len(kids) >= 3:
                time.sleep(0.5)
                break
            time.sleep(0.05)
        assert driver.poll() is None, "the ingest ended before its workers could be seen"
        kids = _descendants(driver.pid)
        assert len(kids) >= 3
        left = _kill_and_wait(driver, kids)
        assert not left, f"{len(left)} of the killed driver's processes still run after 5 s"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkilled_driver_leaves_no_ray_task_worker(tmp_path, fleet):
    """Under a local Ray cluster (started by the driver) the workers running its tasks end with
    it too: Ray's doing (its raylet dies with the driver, its workers with the raylet), which
    daydream relies on, held here. Ray's own agents (dashboard, runtime env) are not counted:
    they outlive a SIGKILLed driver by tens of seconds, Ray's to stop."""
    pytest.importorskip("ray")
    driver = subprocess.Popen(
        [sys.executable, "-m", "daydream", "ingest", str(fleet), "--store",
         str(tmp_path / "store"), "--ray", "auto"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "RAY_ADDRESS": ""})
    try:
        deadline = time.monotonic() + 120
        tasks: dict[int, str] = {}
        everything: dict[int, str] = {}
        while time.monotonic() < deadline and driver.poll() is None and not tasks:
            tasks = {p: st for p, st in _descendants(driver.pid).items()
                     if _cmdline(p).startswith("ray::") and "Agent" not in _cmdline(p)
                     and "IDLE" not in _cmdline(p)}
            time.sleep(0.1)
        assert tasks, "no Ray task worker was seen running the ingest"
        time.sleep(0.5)
        everything = _descendants(driver.pid)
        left = _kill_and_wait(driver, tasks)
        assert not left, f"{len(left)} Ray task workers of the killed driver still run after 5 s"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for p in _alive(everything):  # the local cluster's own processes
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


def _pid_after(s: float) -> int:
    time.sleep(s)
    return os.getpid()


def _mark_warm(path: str) -> None:
    Path(path).write_text(str(os.getpid()))


def test_shared_runner_runs_tasks_here_and_in_its_worker(tmp_path):
    """SharedRunner: ``workers`` in all, this process one of them; every task's result comes
    back once, some computed here (the pool held two queued) and some by the spawned worker,
    which ran the warm-up first."""
    import functools

    from daydream.base.runner import SharedRunner, make_runner

    warm_file = tmp_path / "warm"
    runner = make_runner(2, None, tasks=40, share=functools.partial(_mark_warm, str(warm_file)))
    assert isinstance(runner, SharedRunner) and runner.workers == 2
    got: dict[int, int] = {}
    with runner:
        todo = iter(range(40))
        while True:
            while runner.pending() < runner.in_flight:
                k = next(todo, None)
                if k is None:
                    break
                runner.submit(k, _pid_after, 0.02)
            if not runner.pending():
                break
            for tag, pid in runner.next_done():
                assert tag not in got
                got[tag] = pid
    assert sorted(got) == list(range(40))
    here = sum(p == os.getpid() for p in got.values())
    assert 0 < here < 40, f"{here} of 40 tasks ran in this process"
    worker = {p for p in got.values() if p != os.getpid()}
    assert len(worker) == 1
    assert int(warm_file.read_text()) in worker  # the warm-up ran in that worker


def _counting_runner():
    """A SharedRunner of two workers that records how many tasks ran in this process
    between two collections of finished ones (``next_done``)."""
    from daydream.base.runner import SharedRunner

    class Counting(SharedRunner):
        def __init__(self) -> None:
            super().__init__(2)
            self.here_between: list[int] = []
            self._here_now = 0

        def submit(self, tag, fn, *args) -> None:
            self._here_now += self.next_inline()
            super().submit(tag, fn, *args)

        def next_done(self):
            self.here_between.append(self._here_now)
            self._here_now = 0
            yield from super().next_done()

    return Counting()


def test_drivers_collect_after_each_task_they_run_themselves(tmp_path):
    """Batch ingest and predict --all, given a SharedRunner, run one task in this process
    between two collections (``Runner.in_flight``), so that the spawned worker's queue (two
    tasks) is refilled before it runs dry; two here at a time left it idle for a quarter of
    a fleet's run."""
    from daydream import api, fleet
    from daydream.ingest.batch_ingest import ingest
    from daydream.ingest.store import Store
    from tests.daydream.variants import make_variants

    files = make_variants([DATA / "kineto" / "mi250_toy_train_rocm.json.gz"], 12, tmp_path / "in")
    r = _counting_runner()
    rep = ingest(files, Store(tmp_path / "a"), runner=r)
    assert rep.count("ingested") == 12
    assert max(r.here_between) == 1 and sum(r.here_between) > 0, r.here_between
    root = tmp_path / "b"
    api.ingest(files, root, jobs=1, strict=True)
    r = _counting_runner()
    rep = fleet.predict_all(root, ["amp"], runner=r)
    assert rep.count("predicted") == 12
    assert max(r.here_between) == 1 and sum(r.here_between) > 0, r.here_between


def test_shared_runner_is_not_used_for_isolated_work():
    from daydream.base.runner import InlineRunner, PoolRunner, SharedRunner, make_runner
    assert type(make_runner(2, None, tasks=4, isolate=True, share=print)) is PoolRunner
    assert isinstance(make_runner(1, None, tasks=4, share=print), InlineRunner)
    assert not isinstance(make_runner(2, None, tasks=4), SharedRunner)


def mark_preloaded() -> None:
    """A warm-up named by string (``started_early``): writes this worker's pid where the
    test's environment says."""
    Path(os.environ["DAYDREAM_TEST_PRELOAD"]).write_text(str(os.getpid()))


def test_started_early_runs_what_it_names_in_its_worker_before_any_task(tmp_path,
                                                                         monkeypatch):
    from daydream.base.runner import SharedRunner, started_early
    assert started_early(1, None, "x:y") is None  # inline work: no worker to start
    assert started_early(4, "auto", "x:y") is None  # Ray starts its own
    mark = tmp_path / "preloaded"
    monkeypatch.setenv("DAYDREAM_TEST_PRELOAD", str(mark))
    runner = started_early(2, None, "tests.base.test_runner:mark_preloaded")
    assert isinstance(runner, SharedRunner) and runner.workers == 2
    with runner:
        runner.submit("a", _pid_after, 0.0)
        runner.submit("b", _pid_after, 0.0)  # both to the worker (two may queue there)
        got = dict(x for _ in range(2) if runner.pending() for x in runner.next_done())
        while runner.pending():
            got.update(runner.next_done())
    assert set(got) == {"a", "b"}
    assert int(mark.read_text()) == got["a"] != os.getpid()


def test_started_early_has_the_workers_asked_for():
    """``--workers 3`` is three processes (this one and two spawned), not two: the runner is
    made before the tasks are counted."""
    from daydream.base.runner import started_early
    r = started_early(3, None)
    try:
        assert r.workers == 3
        assert r._pool._max_workers == 2
    finally:
        r.close()
    assert started_early(1, None) is None


class _SaysWhenFreed:
    """Writes its path when it is freed: at the interpreter's teardown, for one held by a
    module of a process that ends the usual way."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __del__(self) -> None:
        Path(self.path).write_text("freed")


_held: list[_SaysWhenFreed] = []


def _hold_until_exit(path: str) -> int:
    """A task: an object held by this module, which only a teardown frees."""
    _held.append(_SaysWhenFreed(path))
    return os.getpid()


def test_a_pool_worker_ends_without_the_interpreters_teardown(tmp_path):
    """A local pool worker let go by ``close`` ends at once (base.ending.end_without_teardown,
    run as its exit handler), not through the interpreter's teardown, which the driver's
    close would wait for (0.1 s for a worker that had predicted a fleet): what only that
    teardown does (free what modules hold) is never done, and the worker has ended, with
    status 0, by the time close returns."""
    from daydream.base.runner import PoolRunner

    runner = PoolRunner(1)
    with runner:
        runner.submit("a", _hold_until_exit, str(tmp_path / "freed"))
        [(tag, pid)] = list(runner.next_done())
        procs = list(runner._pool._processes.values())
    assert tag == "a" and pid != os.getpid()
    assert [p.exitcode for p in procs] == [0]
    assert not (tmp_path / "freed").exists()
