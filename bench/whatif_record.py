"""Record real what-if pairs on the CPU: one small training job, with and without an optimization.

Each pair is the same job twice, differing only in the optimization, so Daydream's prediction
from the base trace can be checked against the optimized trace and against wall-clock time.

    .venv/bin/pip install torch==2.13.0        # CPU build
    .venv/bin/python bench/whatif_record.py [--out tests/data/whatif] [--pairs adam dataloader]

Writes <out>/<pair>_<variant>.json.gz (torch.profiler, CPU activity, ProfilerStep#N markers,
schedule wait=1 warmup=1 active=3) and <out>/measured.json (mean wall-clock ms per step, over
the profiler's active steps and over a separate unprofiled run).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule

ROOT = Path(__file__).resolve().parent.parent
THREADS = 1
WAIT, WARMUP, ACTIVE = 1, 1, 3
# the data-loader jobs are short steps with a noisy pipeline (worker processes on a shared
# machine): more active steps per trace, still small traces (~8 kB a step)
ACTIVE_OF = {"dataloader": 10}
UNPROFILED_WARMUP, UNPROFILED_STEPS = 5, 20


# --------------------------------------------------------------------------------------------
# the jobs

def mlp(depth: int, width: int, d_in: int, d_out: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(d_in, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, d_out))
    return nn.Sequential(*layers)


class CostlyDataset(torch.utils.data.Dataset):
    """Synthetic samples whose __getitem__ spends a few ms of single-threaded numpy work (a
    stand-in for JPEG decode and augmentation)."""

    def __init__(self, n: int, d_in: int, work: int):
        self.n, self.d_in, self.work = n, d_in, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        rng = np.random.default_rng(i)
        img = rng.standard_normal((self.work, self.work)).astype(np.float32)
        for _ in range(3):  # blur-like passes: a few ms on one core
            img = 0.25 * (np.roll(img, 1, 0) + np.roll(img, -1, 0)
                          + np.roll(img, 1, 1) + np.roll(img, -1, 1))
            img = np.tanh(img)
        x = np.resize(img, self.d_in).astype(np.float32)
        return torch.from_numpy(x), int(i % 10)


def _loop(model, opt, batches, zero_grad_none: bool = True):
    """One training step per call: the step annotated the way Daydream's labels read it."""
    loss_fn = nn.CrossEntropyLoss()

    def step():
        x, y = next(batches)
        with record_function("## forward ##"):
            loss = loss_fn(model(x), y)
        with record_function("## backward ##"):
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=zero_grad_none)
    return step


def _synthetic(batch: int, d_in: int):
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(batch, d_in, generator=g) for _ in range(4)]
    ys = [torch.randint(0, 10, (batch,), generator=g) for _ in range(4)]
    i = 0
    while True:
        yield xs[i % 4], ys[i % 4]
        i += 1


# Each job builder returns (step function, description, cleanup).
ADAM = dict(depth=24, width=64, d_in=64, batch=32)
# torch.optim class and keyword arguments of each optimizer pair (base: the per-parameter
# for-loop; optimized: the fused multi-tensor kernel, which torch 2.13 has on the CPU)
OPTIMIZERS = {
    "adam": (torch.optim.Adam, dict(lr=1e-3)),
    "adamw": (torch.optim.AdamW, dict(lr=1e-3, weight_decay=1e-2)),
    "sgd": (torch.optim.SGD, dict(lr=1e-3, momentum=0.9)),
    "adagrad": (torch.optim.Adagrad, dict(lr=1e-2)),
}


def job_optimizer(kind: str):
    cls, base = OPTIMIZERS[kind]

    def job(variant: str):
        torch.manual_seed(0)
        model = mlp(ADAM["depth"], ADAM["width"], ADAM["d_in"], 10)
        kw = base | {"foreach_false": dict(foreach=False), "fused": dict(fused=True)}[variant]
        opt = cls(model.parameters(), **kw)
        step = _loop(model, opt, _synthetic(ADAM["batch"], ADAM["d_in"]))
        n_params = sum(1 for _ in model.parameters())
        desc = (f"MLP {ADAM['depth'] + 2} Linear layers (width {ADAM['width']}, {n_params} "
                f"parameter tensors), batch {ADAM['batch']}, synthetic inputs, "
                f"torch.optim.{cls.__name__}({kw})")
        return step, desc, lambda: None
    return job


job_adam = job_optimizer("adam")


DL = dict(depth=2, width=256, d_in=1024, batch=8, work=160, n=100_000)


# variant -> (num_workers, per-sample work): w0/w1/w2 differ in workers; "light" is w0 with a
# cheaper __getitem__ (113x113 instead of 160x160 pixels: half the pixels), the real
# counterpart of scale(select=data loading, factor=k)
DL_VARIANTS = {"w0": (0, 160), "w1": (1, 160), "w2": (2, 160), "light": (0, 113)}


def _loader(workers: int, work: int):
    ds = CostlyDataset(DL["n"], DL["d_in"], work)
    kw = dict(num_workers=workers, persistent_workers=True, prefetch_factor=2) if workers else {}
    return torch.utils.data.DataLoader(ds, batch_size=DL["batch"], shuffle=False, **kw)


def job_dataloader(variant: str):
    torch.manual_seed(0)
    model = mlp(DL["depth"], DL["width"], DL["d_in"], 10)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    workers, work = DL_VARIANTS[variant]
    it = iter(_loader(workers, work))
    step = _loop(model, opt, it)
    desc = (f"MLP {DL['depth'] + 2} Linear layers (width {DL['width']}), batch {DL['batch']}, "
            f"DataLoader(num_workers={workers}{', persistent_workers=True' if workers else ''}) "
            f"over a synthetic dataset whose __getitem__ does 3 blur+tanh passes over a "
            f"{work}x{work} numpy array")

    def cleanup():
        if workers:
            it._shutdown_workers()
    return step, desc, cleanup


def _sample_ms(n: int, q) -> None:
    ds = CostlyDataset(DL["n"], DL["d_in"], DL["work"])
    t0 = time.perf_counter()
    for i in range(n):
        ds[i]
    q.put(1e3 * (time.perf_counter() - t0) / n)


def sample_ms(samples: int = 60) -> tuple[float, float]:
    """ms per sample of the dataset's __getitem__ in one process alone and in each of
    os.cpu_count() processes running at once: how many cores' worth of the data-loading work
    the machine runs at once is cpu_count x solo / concurrent (``effective_cores``). On a
    shared VM this is below the vCPU count: there, two busy vCPUs each ran ~1.4x slower than
    one."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    out = []
    for n in (1, os.cpu_count() or 1):
        q = ctx.Queue()
        ps = [ctx.Process(target=_sample_ms, args=(samples, q)) for _ in range(n)]
        for p in ps:
            p.start()
        out.append(float(np.mean([q.get() for _ in ps])))
        for p in ps:
            p.join()
    return out[0], out[1]


def load_factor(rounds: int, batches: int = 20, keep: str = "min") -> dict:
    """Per-batch loading time of the light dataset over the default one, both with
    num_workers=0 and no profiler, timed in alternating rounds (the fastest or the median round
    of each, as ``keep`` picks the takes): the factor a user would measure for a faster
    transform and hand to scale(...)."""
    per: dict[int, list[float]] = {160: [], 113: []}
    its = {w: iter(_loader(0, w)) for w in per}
    for _ in range(rounds):
        for w, it in its.items():
            t0 = time.perf_counter()
            for _ in range(batches):
                next(it)
            per[w].append(1e3 * (time.perf_counter() - t0) / batches)
    stat = np.min if keep == "min" else np.median
    base, light = (float(stat(per[w])) for w in (160, 113))
    return {"load_ms_per_batch": round(base, 4), "light_load_ms_per_batch": round(light, 4),
            "load_factor": round(light / base, 4),
            "round_ms": {str(w): [round(x, 4) for x in v] for w, v in per.items()}}


ZG = dict(depth=8, width=256, d_in=256, batch=16)


def job_zero_grad(variant: str):
    torch.manual_seed(0)
    model = mlp(ZG["depth"], ZG["width"], ZG["d_in"], 10)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    none = {"set_to_none_false": False, "set_to_none_true": True}[variant]
    step = _loop(model, opt, _synthetic(ZG["batch"], ZG["d_in"]), zero_grad_none=none)
    desc = (f"MLP {ZG['depth'] + 2} Linear layers (width {ZG['width']}), batch {ZG['batch']}, "
            f"SGD(momentum=0.9), optimizer.zero_grad(set_to_none={none})")
    return step, desc, lambda: None


PAIRS = {
    **{k: [(f"{k}_foreach_false", job_optimizer(k), "foreach_false"),
           (f"{k}_fused", job_optimizer(k), "fused")] for k in OPTIMIZERS},
    # one base (w0) and three variants: 1 worker (fits the 2 cores with the main thread), 2
    # workers (contended on 2 cores), a cheaper __getitem__ (the scale pair)
    "dataloader": [(f"dataloader_{v}", job_dataloader, v) for v in DL_VARIANTS],
    "zero_grad": [("zero_grad_keep", job_zero_grad, "set_to_none_false"),
                  ("zero_grad_none", job_zero_grad, "set_to_none_true")],
}


# --------------------------------------------------------------------------------------------
# recording and timing

def _trace_once(job, variant: str, dst: Path, active: int = ACTIVE) -> tuple[list[float], str]:
    """Profile one fresh run of the job into dst (gzipped); wall ms of each active step."""
    step, desc, cleanup = job(variant)
    tmp = Path(tempfile.mkdtemp(prefix="whatif-"))
    step_times: list[float] = []

    def ready(prof):
        prof.export_chrome_trace(str(tmp / "trace.json"))

    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=WAIT, warmup=WARMUP, active=active),
                 on_trace_ready=ready) as prof:
        for _ in range(WAIT + WARMUP + active):
            t0 = time.perf_counter()
            step()
            step_times.append(1e3 * (time.perf_counter() - t0))
            prof.step()  # not timed: after the last active step it stops and exports
    cleanup()
    # the profiler writes the export path into the trace: keep the recording machine's
    # temporary folder out of the committed file
    data = (tmp / "trace.json").read_bytes()
    data = re.sub(rb'"traceName": "[^"]*"', b'"traceName": "trace.json"', data)
    with open(dst, "wb") as f, gzip.GzipFile(filename="", mode="wb", compresslevel=9,
                                             fileobj=f, mtime=0) as g:
        g.write(data)
    shutil.rmtree(tmp, ignore_errors=True)
    return step_times[WAIT + WARMUP:], desc


def record(pair: list, out: Path, takes: int, active: int = ACTIVE,
           keep: str = "min", each_round=None) -> dict[str, dict]:
    """Record ``takes`` traces of fresh runs of every variant of a pair, interleaved (take k of
    each variant before take k+1 of any, so that load from other jobs on a shared machine hits
    all variants alike), and keep per variant the take whose mean active step is the smallest
    (``keep="min"``: the take least disturbed by other jobs; on a shared 2-vCPU VM the takes
    fall into a fast and a ~2x slower regime, and the median lands in either) or the median."""
    runs: dict[str, list] = {name: [] for name, _, _ in pair}
    descs = {}
    for k in range(takes):
        if each_round is not None:
            each_round()
        for name, job, variant in pair:
            dst = out / f".{name}.take{k}.json.gz"
            load = os.getloadavg()[0]
            steps, descs[name] = _trace_once(job, variant, dst, active)
            runs[name].append((sum(steps) / len(steps), steps, dst, load))
    res = {}
    for (name, _, variant) in pair:
        rs = sorted(runs[name], key=lambda r: r[0])
        mean, steps, kept, _ = rs[0 if keep == "min" else len(rs) // 2]
        dst = out / f"{name}.json.gz"
        kept.replace(dst)
        for r in rs:
            r[2].unlink(missing_ok=True)
        res[name] = {"variant": variant, "description": descs[name],
                     "profiled_active_ms": [round(t, 4) for t in steps],
                     "profiled_mean_ms": round(mean, 4), "kept_take": keep,
                     "profiled_take_means_ms": [round(r[0], 4) for r in runs[name]],
                     "loadavg_1min_at_takes": [round(r[3], 2) for r in runs[name]],
                     "trace_bytes": dst.stat().st_size}
    return res


def time_unprofiled(pair: list, rounds: int) -> dict[str, dict]:
    """Mean wall ms per step without the profiler, both variants built once and timed in
    alternating rounds (base, optimized, base, ...) so that load on a shared machine hits both
    alike; the median round mean is the result."""
    jobs = [(name, *job(variant)) for name, job, variant in pair]
    for _, step, _, _ in jobs:
        for _ in range(UNPROFILED_WARMUP):
            step()
    per: dict[str, list[float]] = {name: [] for name, *_ in jobs}
    for _ in range(rounds):
        for name, step, _, _ in jobs:
            t0 = time.perf_counter()
            for _ in range(UNPROFILED_STEPS):
                step()
            per[name].append(1e3 * (time.perf_counter() - t0) / UNPROFILED_STEPS)
    for _, _, _, cleanup in jobs:
        cleanup()
    return {name: {"unprofiled_mean_ms": round(float(np.median(v)), 4),
                   "unprofiled_min_ms": round(float(np.min(v)), 4),
                   "unprofiled_round_means_ms": [round(x, 4) for x in v],
                   "unprofiled_steps_per_round": UNPROFILED_STEPS} for name, v in per.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "whatif")
    ap.add_argument("--pairs", nargs="+",
                    default=["adam", "adamw", "sgd", "adagrad", "dataloader"],
                    choices=list(PAIRS),
                    help="zero_grad (set_to_none False vs True) is opt-in: no measurable effect "
                         "here and no Daydream optimization models it")
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument("--takes", type=int, default=7, help="recordings per variant")
    ap.add_argument("--keep", choices=["min", "median"], default="min",
                    help="which take of each variant to keep (by mean active step)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating unprofiled timing rounds")
    ap.add_argument("--autogroup-nice", type=int, default=None,
                    help="Linux: write this nice value to /proc/self/autogroup for the "
                         "recording (plain nice does not reach across the scheduler's "
                         "per-session groups, so other sessions' jobs would still take half of "
                         "a 2-core machine); restored to 0 at the end")
    a = ap.parse_args()
    if a.autogroup_nice is not None:
        Path("/proc/self/autogroup").write_text(str(a.autogroup_nice))
    torch.set_num_threads(a.threads)
    a.out.mkdir(parents=True, exist_ok=True)
    mpath = a.out / "measured.json"
    measured = json.loads(mpath.read_text()) if mpath.exists() else {}
    # merged, not replaced: a run of some pairs keeps what earlier runs measured (each
    # variant also records its own command and load)
    measured["_meta"] = measured.get("_meta", {}) | {"torch": torch.__version__,
                         "threads": a.threads,
                         "cpus": os.cpu_count(), "autogroup_nice": a.autogroup_nice,
                         "loadavg_before": list(os.getloadavg()),
                         "schedule": {"wait": WAIT, "warmup": WARMUP, "active": ACTIVE,
                                      "active_of_pair": ACTIVE_OF},
                         "command": f"python bench/whatif_record.py --threads {a.threads} --takes "
                                    f"{a.takes} --keep {a.keep} --rounds {a.rounds} "
                                    f"--autogroup-nice {a.autogroup_nice} "
                                    f"--pairs {' '.join(a.pairs)}"}
    for pair in a.pairs:
        unprof = time_unprofiled(PAIRS[pair], a.rounds)
        cores: list[tuple[float, float]] = []
        hook = ((lambda cs=cores: cs.append(sample_ms())) if pair == "dataloader"
                else None)
        for name, m in record(PAIRS[pair], a.out, a.takes,
                              ACTIVE_OF.get(pair, ACTIVE), a.keep, hook).items():
            measured[name] = m = m | unprof[name] | {"command": measured["_meta"]["command"]}
            print(f"{name}: profiled {m['profiled_mean_ms']:.2f} ms/step (takes "
                  f"{m['profiled_take_means_ms']}), unprofiled {m['unprofiled_mean_ms']:.2f} "
                  f"ms/step, {m['trace_bytes'] / 1e3:.0f} kB  ({m['description']})")
        if pair == "dataloader":
            # the fastest (or median) solo and concurrent rounds, as the takes
            stat = min if a.keep == "min" else np.median
            solo, conc = (float(stat([c[i] for c in cores])) for i in (0, 1))
            measured["_meta"]["sample_ms_solo_concurrent_per_round"] = [
                [round(x, 4) for x in c] for c in cores]
            measured["_meta"]["effective_cores"] = round((os.cpu_count() or 1) * solo / conc, 3)
            print(f"effective cores: {measured['_meta']['effective_cores']} ({cores})")
            measured["dataloader_light"] |= load_factor(a.rounds, keep=a.keep)
            print(f"dataloader_light: load factor {measured['dataloader_light']['load_factor']}")
    measured["_meta"]["loadavg_after"] = list(os.getloadavg())
    if a.autogroup_nice is not None:
        Path("/proc/self/autogroup").write_text("0")
    mpath.write_text(json.dumps(measured, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
