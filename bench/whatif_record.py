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


def job_adam(variant: str):
    torch.manual_seed(0)
    model = mlp(ADAM["depth"], ADAM["width"], ADAM["d_in"], 10)
    kw = {"foreach_false": dict(foreach=False), "fused": dict(fused=True)}[variant]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, **kw)
    step = _loop(model, opt, _synthetic(ADAM["batch"], ADAM["d_in"]))
    n_params = sum(1 for _ in model.parameters())
    desc = (f"MLP {ADAM['depth'] + 2} Linear layers (width {ADAM['width']}, {n_params} parameter "
            f"tensors), batch {ADAM['batch']}, synthetic inputs, torch.optim.Adam({kw})")
    return step, desc, lambda: None


DL = dict(depth=2, width=256, d_in=1024, batch=8, work=160, n=100_000)


def job_dataloader(variant: str):
    torch.manual_seed(0)
    model = mlp(DL["depth"], DL["width"], DL["d_in"], 10)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    workers = {"w0": 0, "w2": 2}[variant]
    ds = CostlyDataset(DL["n"], DL["d_in"], DL["work"])
    kw = dict(num_workers=workers, persistent_workers=True, prefetch_factor=2) if workers else {}
    loader = torch.utils.data.DataLoader(ds, batch_size=DL["batch"], shuffle=False, **kw)
    it = iter(loader)
    step = _loop(model, opt, it)
    desc = (f"MLP {DL['depth'] + 2} Linear layers (width {DL['width']}), batch {DL['batch']}, "
            f"DataLoader(num_workers={workers}{', persistent_workers=True' if workers else ''}) "
            f"over a synthetic dataset whose __getitem__ does 3 blur+tanh passes over a "
            f"{DL['work']}x{DL['work']} numpy array")

    def cleanup():
        if workers:
            it._shutdown_workers()
    return step, desc, cleanup


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
    "adam": [("adam_foreach_false", job_adam, "foreach_false"),
             ("adam_fused", job_adam, "fused")],
    "dataloader": [("dataloader_w0", job_dataloader, "w0"),
                   ("dataloader_w2", job_dataloader, "w2")],
    "zero_grad": [("zero_grad_keep", job_zero_grad, "set_to_none_false"),
                  ("zero_grad_none", job_zero_grad, "set_to_none_true")],
}


# --------------------------------------------------------------------------------------------
# recording and timing

def _trace_once(job, variant: str, dst: Path) -> tuple[list[float], str]:
    """Profile one fresh run of the job into dst (gzipped); wall ms of each active step."""
    step, desc, cleanup = job(variant)
    tmp = Path(tempfile.mkdtemp(prefix="whatif-"))
    step_times: list[float] = []

    def ready(prof):
        prof.export_chrome_trace(str(tmp / "trace.json"))

    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE),
                 on_trace_ready=ready) as prof:
        for _ in range(WAIT + WARMUP + ACTIVE):
            t0 = time.perf_counter()
            step()
            step_times.append(1e3 * (time.perf_counter() - t0))
            prof.step()  # not timed: after the last active step it stops and exports
    cleanup()
    # the profiler writes the export path into the trace: keep the recording machine's
    # temporary folder out of the committed file
    data = (tmp / "trace.json").read_bytes()
    data = re.sub(rb'"traceName": "[^"]*"', b'"traceName": "trace.json"', data)
    with gzip.open(dst, "wb", compresslevel=9, mtime=0) as g:
        g.write(data)
    shutil.rmtree(tmp, ignore_errors=True)
    return step_times[WAIT + WARMUP:], desc


def record(name: str, job, variant: str, out: Path, takes: int) -> dict:
    """Record ``takes`` traces of fresh runs and keep the one whose mean active step is the
    median (the machine may be shared: one take can land on a busy moment)."""
    runs = []
    for k in range(takes):
        dst = out / f".{name}.take{k}.json.gz"
        active, desc = _trace_once(job, variant, dst)
        runs.append((sum(active) / len(active), active, dst))
    runs.sort(key=lambda r: r[0])
    mean, active, keep = runs[len(runs) // 2]
    dst = out / f"{name}.json.gz"
    keep.replace(dst)
    for _, _, p in runs:
        p.unlink(missing_ok=True)
    return {"variant": variant, "description": desc,
            "profiled_active_ms": [round(t, 4) for t in active],
            "profiled_mean_ms": round(mean, 4),
            "profiled_take_means_ms": sorted(round(r[0], 4) for r in runs),
            "trace_bytes": dst.stat().st_size}


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
                   "unprofiled_round_means_ms": [round(x, 4) for x in v],
                   "unprofiled_steps_per_round": UNPROFILED_STEPS} for name, v in per.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "whatif")
    ap.add_argument("--pairs", nargs="+", default=["adam", "dataloader"], choices=list(PAIRS),
                    help="zero_grad (set_to_none False vs True) is opt-in: no measurable effect "
                         "here and no Daydream optimization models it")
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument("--takes", type=int, default=5, help="recordings per variant (median kept)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating unprofiled timing rounds")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    a.out.mkdir(parents=True, exist_ok=True)
    mpath = a.out / "measured.json"
    measured = json.loads(mpath.read_text()) if mpath.exists() else {}
    measured["_meta"] = {"torch": torch.__version__, "threads": a.threads,
                         "cpus": os.cpu_count(), "loadavg_before": list(os.getloadavg()),
                         "schedule": {"wait": WAIT, "warmup": WARMUP,
                                                             "active": ACTIVE},
                         "command": f"python bench/whatif_record.py --threads {a.threads} --takes "
                                    f"{a.takes} --rounds {a.rounds} --pairs {' '.join(a.pairs)}"}
    for pair in a.pairs:
        unprof = time_unprofiled(PAIRS[pair], a.rounds)
        for name, job, variant in PAIRS[pair]:
            m = record(name, job, variant, a.out, a.takes) | unprof[name]
            measured[name] = m
            print(f"{name}: profiled {m['profiled_mean_ms']:.2f} ms/step (takes "
                  f"{m['profiled_take_means_ms']}), unprofiled {m['unprofiled_mean_ms']:.2f} "
                  f"ms/step, {m['trace_bytes'] / 1e3:.0f} kB  ({m['description']})")
    measured["_meta"]["loadavg_after"] = list(os.getloadavg())
    mpath.write_text(json.dumps(measured, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
