"""Real what-if pairs recorded on one GPU, in priority order, within a time budget.

    python bench/gpu_pairs.py --out "$OUT"                # on the GPU machine, ~5 minutes
    python bench/gpu_pairs.py --prepare-wheels bench/out/gpu-wheels   # here, before: see below
    python bench/gpu_pairs.py --smoke --out DIR           # CPU, tiny sizes (the test runs this)

What it does, in order (each result is written under --out as soon as it is done, so a run cut
short still returns what it finished; at most 8 files, each under 16 MiB):

1. ``preflight.json``: the machine (GPU, driver, torch, CUDA, cuDNN, torchvision or its
   absence), which libcupti torch loaded and which one cupti-python loaded, whether they match
   (``collect.cupti_backend.check_library``), and whether activity records arrive: a tiny
   ``collect_steps`` run counts the records CUPTI delivered, a tiny ``torch.profiler`` run the
   kernels Kineto saw. The collector needs ``orjson`` and ``isal`` in the job's environment;
   when they are missing they are installed from ``--wheels`` (made beforehand by
   ``--prepare-wheels``, carried to the machine with the working tree), never from an index.
2. The pair groups below, each in a worker process, each run: warm-up steps, steps timed
   without the profiler (CUDA events, and CPU wall time), then ``torch.profiler`` (wait 1,
   warm-up 1, active 3, with shapes and stacks, so that layers are named). The FP32 and AMP
   (FP16) runs of both models are also recorded with ``daydream collect`` (the injected path,
   in a process of their own: one CUPTI client per process). After each run ``results.json`` is
   rewritten; after each group its traces go to ``<group>.tar`` (Kineto JSON gzipped, raw
   ``.cupti`` files), leaving out a trace that would take the archive over 15 MiB (said in
   ``results.json``).

   a. ``resnet50``: ResNet-50 (torchvision; a local definition with the same module names when
      torchvision is missing, said in the results) with the settings of
      ``hta/resnet50_v100_rank0`` (batch 32, 3x224x224, FP32, SGD, NCHW): FP32, AMP FP16, AMP
      BF16; also the V100 -> H200 pair against that trace;
   b. ``gpt_precision``: a GPT-style transformer with random weights (d 512, 6 blocks, 8 heads,
      sequence 256, batch 16, Adam): FP32, AMP FP16, AMP BF16;
   c. ``gpt_adam``: Adam foreach=False, default (the FP32 run of b), fused=True;
   d. ``resnet50_data``: batch 32 (run a) vs 64; DataLoader workers 0 vs 4 with a costly CPU
      transform per sample;
   e. ``gpt_ckpt_graphs``: activation checkpointing per block off (b) vs on; a small GPT (d 256,
      4 blocks, batch 8, sequence 128) eager vs whole-step CUDA graph (Adam capturable in both);
   f. ``gpt_compile``: eager (b) vs ``torch.compile`` (inductor; compiling takes most of it).

A group is skipped, and said so, when the time left is under its estimate. ``--smoke`` runs
every group on the CPU with tiny models (a small conv net instead of ResNet-50, needing no
torchvision), the profiler's CPU activity only, ``torch.compile`` with the eager backend, CUDA
graphs reported as needing CUDA, and ``daydream collect`` through ``--collect-backend``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MAX_FILES = 8
FILE_LIMIT = 15 << 20           # each returned file stays under 16 MiB, with a margin
COLLECTOR_WHEELS = ("orjson==3.13.0", "isal==1.9.1")   # the pins of pyproject.toml
WHEEL_PYTHONS = ("3.10", "3.11", "3.12", "3.13")

# hta/resnet50_v100_rank0.json.gz (Tesla V100-SXM2-32GB, 5 steps of 35-96 ms) records no input
# shapes; its kernels give them. The ReLU after conv1 runs 50176 blocks x 128 threads x 4
# elements = 25,690,112 = N x 64 x 112 x 112 and the stem max-pool 25088 x 256 = 6,422,528 =
# N x 64 x 56 x 56, so N = 32 at 224x224 (conv1 halves 224 to 112); the fc weight copy is
# 8,192,000 bytes = 2048 x 1000 x 4 (FP32, 1000 classes); cuDNN's kernels are NCHW
# (bn_fw_tr_1C11_kernel_NCHW), the optimizer Optimizer.step#SGD.step. It ran under DDP with
# world size 1, which this single-process run leaves out.
V100_RESNET = {"model": "resnet50", "batch": 32, "image": 224, "classes": 1000,
               "optimizer": "sgd", "precision": "fp32", "channels_last": False}
V100_TRACE = "hta/resnet50_v100_rank0.json.gz"

GPT = {"model": "gpt", "batch": 16, "seq": 256, "d": 512, "layers": 6, "heads": 8,
       "vocab": 8192, "optimizer": "adam", "precision": "fp32"}
SMALL_GPT = dict(GPT, batch=8, seq=128, d=256, layers=4, heads=4, vocab=4096, capturable=True)

SMOKE_SIZES = {"resnet50": {"model": "tinyconv", "batch": 4, "image": 32, "classes": 10},
               "gpt": {"batch": 2, "seq": 16, "d": 32, "layers": 2, "heads": 2, "vocab": 64}}


def run(name: str, base: dict, collect: bool = False, **changes) -> dict:
    return {"name": name, "collect": collect, **base, **changes}


def groups() -> list[dict]:
    """Pair groups in priority order: runs, the pairs they make, a time estimate (s, H200)."""
    r50 = V100_RESNET
    return [
        {"name": "resnet50", "estimate_s": 60, "runs": [
            run("resnet50-fp32", r50, collect=True),
            run("resnet50-fp16", r50, collect=True, precision="fp16"),
            run("resnet50-bf16", r50, precision="bf16")],
         "pairs": [("FP32 vs AMP FP16 (ResNet-50)", "resnet50-fp32", "resnet50-fp16"),
                   ("FP32 vs AMP BF16 (ResNet-50)", "resnet50-fp32", "resnet50-bf16"),
                   ("V100 vs H200 (ResNet-50, batch 32, FP32)", f"shared:{V100_TRACE}",
                    "resnet50-fp32")]},
        {"name": "gpt_precision", "estimate_s": 50, "runs": [
            run("gpt-fp32", GPT, collect=True),
            run("gpt-fp16", GPT, collect=True, precision="fp16"),
            run("gpt-bf16", GPT, precision="bf16")],
         "pairs": [("FP32 vs AMP FP16 (GPT)", "gpt-fp32", "gpt-fp16"),
                   ("FP32 vs AMP BF16 (GPT)", "gpt-fp32", "gpt-bf16")]},
        {"name": "gpt_adam", "estimate_s": 25, "runs": [
            run("gpt-adam-foreach-false", GPT, adam="foreach_false"),
            run("gpt-adam-fused", GPT, adam="fused")],
         "pairs": [("Adam foreach=False vs fused (GPT)", "gpt-adam-foreach-false",
                    "gpt-adam-fused"),
                   ("Adam default (foreach) vs fused (GPT)", "gpt-fp32", "gpt-adam-fused")]},
        {"name": "resnet50_data", "estimate_s": 45, "runs": [
            run("resnet50-b64", r50, batch=64),
            run("resnet50-loader-w0", r50, workers=0, costly_transform=True),
            run("resnet50-loader-w4", r50, workers=4, costly_transform=True)],
         "pairs": [("batch 32 vs 64 (ResNet-50)", "resnet50-fp32", "resnet50-b64"),
                   ("DataLoader workers 0 vs 4, costly transform (ResNet-50)",
                    "resnet50-loader-w0", "resnet50-loader-w4")]},
        {"name": "gpt_ckpt_graphs", "estimate_s": 30, "runs": [
            run("gpt-ckpt", GPT, checkpoint=True),
            run("small-gpt-eager", SMALL_GPT),
            run("small-gpt-cuda-graphs", SMALL_GPT, cuda_graphs=True)],
         "pairs": [("activation checkpointing off vs on (GPT)", "gpt-fp32", "gpt-ckpt"),
                   ("eager vs CUDA graphs (small GPT)", "small-gpt-eager",
                    "small-gpt-cuda-graphs")]},
        {"name": "gpt_compile", "estimate_s": 90, "runs": [
            run("gpt-compile", GPT, compile=True)],
         "pairs": [("eager vs torch.compile (GPT)", "gpt-fp32", "gpt-compile")]},
    ]


def smoke_spec(spec: dict) -> dict:
    """The same run at tiny sizes for the CPU."""
    out = dict(spec)
    out.update(SMOKE_SIZES["resnet50" if spec["model"] == "resnet50" else "gpt"])
    if out.get("workers"):
        out["workers"] = 2
    return out


# ---- models ------------------------------------------------------------------------------

def resnet50_local(num_classes: int = 1000):
    """torchvision's ResNet-50 v1.5 (stride on the 3x3 conv) with its module names, for a
    machine without torchvision."""
    import torch.nn as nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride, down):
            super().__init__()
            cout = width * 4
            self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout)) if down else None

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            out += identity
            return self.relu(out)

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            layers, cin = [], 64
            for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
                mods = []
                for i in range(blocks):
                    mods.append(Bottleneck(cin, width, stride if i == 0 else 1, i == 0))
                    cin = width * 4
                layers.append(nn.Sequential(*mods))
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(2048, num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet()


def tinyconv(num_classes: int = 10):
    """The smoke mode's stand-in for ResNet-50: stem, one residual block, pool, fc."""
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(c)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            out = self.bn1(self.conv1(x))
            out += x
            return self.relu(out)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, 2, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.relu = nn.ReLU(inplace=True)
            self.layer1 = nn.Sequential(Block(8))
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(8, num_classes)

        def forward(self, x):
            x = self.layer1(self.relu(self.bn1(self.conv1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return Net()


def gpt(vocab: int, d: int, layers: int, heads: int, seq: int, checkpoint: bool = False):
    """A GPT-style decoder: learned positions, pre-norm blocks of causal self-attention and a
    4x GELU MLP, tied nothing, random weights."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint as ckpt

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(b, t, d))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.attn = Attention()
            self.ln2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(seq, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = ckpt(block, x, use_reentrant=False) if checkpoint else block(x)
            return self.head(self.ln_f(x))

    return GPT()


class CostlyImages:
    """Synthetic images with a CPU transform of a few milliseconds per sample (a blur and a
    normalization in one thread), as a data-loading-bound job has."""

    def __init__(self, n: int, image: int, classes: int):
        self.n, self.image, self.classes = n, image, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        import torch.nn.functional as F
        g = torch.Generator().manual_seed(i)
        img = torch.randint(0, 256, (1, 3, self.image, self.image), generator=g,
                            dtype=torch.uint8).float() / 255
        kernel = torch.full((3, 1, 5, 5), 1 / 25)
        for _ in range(4):
            img = F.conv2d(img, kernel, padding=2, groups=3)
        img = (img - 0.45) / 0.225
        if i % 2:
            img = img.flip(-1)
        return img[0], i % self.classes


# ---- one run -----------------------------------------------------------------------------

def build(spec: dict, device: str):
    """A training step for ``spec``: returns (step, facts)."""
    import torch

    cuda = device == "cuda"
    facts: dict = {}
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    if spec["model"] == "resnet50":
        try:
            import torchvision
            model = torchvision.models.resnet50(weights=None, num_classes=spec["classes"])
            facts["model_source"] = f"torchvision {torchvision.__version__}"
        except ImportError:
            model = resnet50_local(spec["classes"])
            facts["model_source"] = "local ResNet-50 (torchvision is missing)"
            print("gpu_pairs: torchvision is missing: ResNet-50 is the local definition",
                  file=sys.stderr)
    elif spec["model"] == "tinyconv":
        model = tinyconv(spec["classes"])
        facts["model_source"] = "tinyconv (smoke)"
    else:
        model = gpt(spec["vocab"], spec["d"], spec["layers"], spec["heads"], spec["seq"],
                    checkpoint=spec.get("checkpoint", False))
    model = model.to(device)
    if spec.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
    if spec["optimizer"] == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        kind = spec.get("adam", "default")
        kw = {"foreach": False} if kind == "foreach_false" else \
            {"fused": True} if kind == "fused" else {}
        if spec.get("capturable") and cuda:  # CUDA graphs' optimizer, and its eager pair's
            kw["capturable"] = True
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, **kw)
    precision = spec.get("precision", "fp32")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler(device, init_scale=1024.0,
                                  enabled=(precision == "fp16" and cuda))
    if spec.get("compile"):
        model = torch.compile(model, backend=spec.get("compile_backend", "inductor"))

    if spec["model"] in ("resnet50", "tinyconv"):
        def loss_of(x, y):
            return torch.nn.functional.cross_entropy(model(x), y)
        shape = (spec["batch"], 3, spec["image"], spec["image"])
        if spec.get("costly_transform"):
            # one CPU thread for the transform in the main process too: workers 0 vs 4 then
            # differ by the workers alone (data-loader workers run one thread each)
            torch.set_num_threads(1)
            facts["cpu_threads"] = 1
            data = CostlyImages(spec["batch"] * 64, spec["image"], spec["classes"])
            loader = torch.utils.data.DataLoader(
                data, batch_size=spec["batch"], num_workers=spec.get("workers", 0),
                pin_memory=cuda, drop_last=True, persistent_workers=spec.get("workers", 0) > 0)
            facts["loader"] = {"workers": spec.get("workers", 0), "transform": "CostlyImages"}

            def batches():
                while True:
                    for x, y in loader:
                        yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            it = batches()
        else:
            x0 = torch.randn(shape, device=device)
            if spec.get("channels_last"):
                x0 = x0.to(memory_format=torch.channels_last)
            y0 = torch.randint(0, spec["classes"], (spec["batch"],), device=device)

            def batches():
                while True:
                    yield x0, y0
            it = batches()
    else:
        tokens = torch.randint(0, spec["vocab"], (spec["batch"], spec["seq"] + 1),
                               device=device)

        def loss_of(x, y):
            logits = model(x)
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     y.reshape(-1))

        def batches():
            while True:
                yield tokens[:, :-1], tokens[:, 1:]
        it = batches()

    cast = {"dtype": dtype} if dtype is not None else {}

    def step():
        x, y = next(it)
        with torch.autocast(device, enabled=dtype is not None, **cast):
            loss = loss_of(x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    if spec.get("cuda_graphs"):
        if not cuda:
            raise NeedsCuda("CUDA graphs need CUDA")
        step = graphed(loss_of, opt, it)
        facts["cuda_graphs"] = "whole step (forward, backward, Adam capturable) captured once"
    facts["params"] = sum(p.numel() for p in model.parameters())
    return step, facts


class NeedsCuda(Exception):
    pass


def graphed(loss_of, opt, it):
    """Whole-step capture, as in PyTorch's CUDA graphs notes: warm up on a side stream,
    capture forward, backward and the optimizer step into one graph, replay it per step with
    the batch copied into the captured inputs."""
    import torch

    x0, y0 = next(it)
    sx, sy = x0.clone(), y0.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss_of(sx, sy).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss_of(sx, sy).backward()
        opt.step()

    def step():
        x, y = next(it)
        sx.copy_(x, non_blocking=True)
        sy.copy_(y, non_blocking=True)
        graph.replay()
    return step


def time_steps(step, n: int, cuda: bool) -> dict:
    """Step times without the profiler: CUDA events on the stream (the GPU timeline) and the
    CPU's wall time between step starts, one synchronize at the end."""
    import torch

    walls = [time.perf_counter()]
    events = []
    for _ in range(n):
        if cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            events.append(ev)
        step()
        walls.append(time.perf_counter())
    if cuda:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        events.append(end)
        torch.cuda.synchronize()
    wall_ms = [1e3 * (b - a) for a, b in zip(walls, walls[1:], strict=False)]
    out = {"steps": n, "cpu_ms": _summary(wall_ms)}
    if cuda:
        gpu_ms = [a.elapsed_time(b) for a, b in zip(events, events[1:], strict=False)]
        out["gpu_ms"] = _summary(gpu_ms)
        out["max_memory_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def _summary(xs: list[float]) -> dict:
    s = sorted(xs)
    return {"median": round(s[len(s) // 2], 3), "mean": round(sum(s) / len(s), 3),
            "min": round(s[0], 3), "max": round(s[-1], 3), "all": [round(x, 3) for x in xs]}


def profile_run(spec: dict, device: str, work: Path, warmup: int, timed: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    cuda = device == "cuda"
    t0 = time.perf_counter()
    step, facts = build(spec, device)
    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    res = {"name": spec["name"], "settings": spec, **facts,
           "warmup_s": round(time.perf_counter() - t0, 2)}
    res["no_profiler"] = time_steps(step, timed, cuda)
    raw = work / f"{spec['name']}.pt.trace.json"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    active = 3
    with profile(activities=acts, schedule=schedule(wait=1, warmup=1, active=active),
                 record_shapes=True, with_stack=True,
                 on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        p0 = time.perf_counter()
        for _ in range(2 + active):
            step()
            prof.step()
        if cuda:
            torch.cuda.synchronize()
    res["profiled_wall_ms_per_step"] = round(1e3 * (time.perf_counter() - p0) / (2 + active), 3)
    res["profiled_steps"] = active
    gz = raw.with_suffix(".json.gz")
    with open(raw, "rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    res["trace"] = gz.name
    res["seconds"] = round(time.perf_counter() - t0, 2)
    return res


# ---- workers (child processes) -----------------------------------------------------------

def _emit(obj: dict) -> None:
    print("RESULT " + json.dumps(obj), flush=True)


def worker_profile(specs: list[dict], device: str, work: Path, warmup: int, timed: int) -> None:
    for spec in specs:
        try:
            _emit(profile_run(spec, device, work, warmup, timed))
        except NeedsCuda as e:
            _emit({"name": spec["name"], "status": "skipped", "why": str(e)})
        except Exception as e:  # noqa: BLE001 - the next run may still work
            _emit({"name": spec["name"], "status": "error",
                   "error": f"{type(e).__name__}: {e}"[:2000]})
        finally:
            if device == "cuda":
                import torch
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()


def worker_train(spec: dict, device: str, steps: int, timed: int, result: Path | None) -> None:
    """The job `daydream collect` runs: an unmodified loop (collection stops by itself after
    its iterations), then steps timed with collection off."""
    step, facts = build(spec, device)
    for _ in range(steps):
        step()
    res = {"name": spec["name"], **facts,
           "after_collection": time_steps(step, timed, device == "cuda")}
    if result is not None:
        result.write_text(json.dumps(res))


def worker_preflight(device: str, work: Path, backend: str | None) -> None:
    import torch

    from daydream.collect import cupti_backend as cb
    out: dict = {"device": device}
    if device == "cuda":
        torch.zeros(1, device="cuda")
        out["libcupti_after_torch"] = cb.loaded_libcupti()
    step = None
    try:
        from daydream.collect.api import collect
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 8)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(32, 64, device=device)

        def step():
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        kw = {}
        if backend:
            import importlib
            module, _, attr = backend.partition(":")
            kw["backend"] = getattr(importlib.import_module(module), attr)
        with collect(work, 2, warmup=1, model=model, optimizer=opt, prefix="preflight",
                     **kw) as c:
            for _ in range(4):
                step()
        rec = c.recorder
        out["collector"] = {
            "records": rec.records, "gpu_records": rec.gpu_records, "buffers": rec.buffers,
            "errors": rec.errors, "libcupti": rec.writer.header.get("libcupti"),
            "devices": rec.writer.header.get("devices"),
            "file_bytes": c.path.stat().st_size if c.path.exists() else 0,
            "records_arrive": rec.gpu_records > 0}
        try:  # the reader's packages may be missing here: the file is read after the fetch
            from daydream.ingest.cupti_raw import read_cupti_raw
            conv = read_cupti_raw(c.path)
            out["collector"]["read_back"] = {
                "kernels": conv.tables["kernel"].num_rows, "api": conv.tables["api"].num_rows,
                "devices": [d.get("name") for d in conv.devices or []],
                "kernel_names": sorted(set(conv.tables["kernel"]["name"].to_pylist()))[:5]}
        except ImportError as e:
            out["collector"]["read_back"] = f"skipped: {e}"
    except Exception as e:  # noqa: BLE001 - said in the file; the profiler runs go on
        out["collector"] = {"error": f"{type(e).__name__}: {e}"[:2000], "records_arrive": False}
    out["libcupti_loaded"] = cb.loaded_libcupti()
    try:
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=acts) as prof:
            for _ in range(2):
                (step or (lambda: torch.ones(8, device=device).sum()))()
            if device == "cuda":
                torch.cuda.synchronize()
        kernels = sum(1 for e in prof.events() if str(e.device_type).endswith("CUDA"))
        out["profiler"] = {"events": len(prof.events()), "cuda_events": kernels}
    except Exception as e:  # noqa: BLE001
        out["profiler"] = {"error": f"{type(e).__name__}: {e}"[:2000]}
    out["libcupti_loaded_at_end"] = cb.loaded_libcupti()
    _emit(out)


# ---- the orchestrator --------------------------------------------------------------------

class Results:
    """results.json, rewritten after every run."""

    def __init__(self, path: Path, meta: dict):
        self.path = path
        self.doc = dict(meta, runs=[], pairs=[], groups=[])

    def add_run(self, res: dict) -> None:
        self.doc["runs"].append(res)
        self.write()

    def write(self) -> None:
        self.path.write_text(json.dumps(self.doc, indent=1))


def machine_facts(smoke: bool) -> dict:
    import importlib.metadata as md

    def ver(d):
        try:
            return md.version(d)
        except md.PackageNotFoundError:
            return None
    facts = {"python": platform.python_version(), "platform": platform.platform(),
             "smoke": smoke, "torch": ver("torch"), "torchvision": ver("torchvision"),
             "cupti_python": ver("cupti-python"),
             "nvidia_cuda_cupti": sorted(f"{d.metadata['Name']} {d.version}"
                                         for d in md.distributions()
                                         if (d.metadata["Name"] or "").lower().startswith(
                                             "nvidia-cuda-cupti"))}
    if shutil.which("nvidia-smi"):
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                "--format=csv,noheader"], capture_output=True, text=True,
                               timeout=30)
            facts["nvidia_smi"] = q.stdout.strip().splitlines()
        except (OSError, subprocess.SubprocessError) as e:
            facts["nvidia_smi"] = f"failed: {e}"
    return facts


def ensure_collector_packages(wheels: Path | None) -> dict:
    """The collector's own imports beyond torch and numpy, from carried wheels when missing."""
    missing = []
    for req in COLLECTOR_WHEELS:
        name = req.split("==")[0]
        try:
            __import__(name)
        except ImportError:
            missing.append(req)
    if not missing:
        return {"installed": [], "missing": []}
    if wheels is None or not wheels.is_dir():
        return {"installed": [], "missing": missing,
                "why": "no --wheels folder (make one with --prepare-wheels)"}
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index",
                           "--find-links", str(wheels), *missing], capture_output=True,
                          text=True, timeout=120)
    return {"installed": missing if proc.returncode == 0 else [],
            "missing": [] if proc.returncode == 0 else missing,
            "pip": proc.stdout[-1000:] + proc.stderr[-1000:]}


def prepare_wheels(dest: Path) -> int:
    """Download the collector's wheels for the Pythons a GPU machine may have (run where an
    index is reachable; the folder is then carried with the working tree)."""
    dest.mkdir(parents=True, exist_ok=True)
    rc = 0
    for py in WHEEL_PYTHONS:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                               "--only-binary=:all:", "--python-version", py,
                               "--platform", "manylinux_2_17_x86_64", "--dest", str(dest),
                               *COLLECTOR_WHEELS], capture_output=True, text=True)
        if proc.returncode:
            print(f"gpu_pairs: pip download for Python {py} failed: {proc.stderr[-500:]}",
                  file=sys.stderr)
            rc = 1
    print(f"gpu_pairs: {len(list(dest.glob('*.whl')))} wheels in {dest}")
    return rc


def _child(args: list[str], env: dict, timeout_s: float) -> tuple[list[dict], str, int | None]:
    """Run a worker, reading its RESULT lines as they come; kill it at the deadline."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)
    results = []
    deadline = time.monotonic() + timeout_s
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    err_chunks: list[str] = []
    sel.register(proc.stderr, selectors.EVENT_READ)
    open_streams = 2
    while open_streams and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=max(0.1, min(5, deadline - time.monotonic()))):
            line = key.fileobj.readline()
            if not line:
                sel.unregister(key.fileobj)
                open_streams -= 1
                continue
            if key.fileobj is proc.stdout and line.startswith("RESULT "):
                results.append(json.loads(line[7:]))
            elif key.fileobj is proc.stderr:
                err_chunks.append(line)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
        err_chunks.append(f"[killed at the deadline after {timeout_s:.0f} s]\n")
    return results, "".join(err_chunks)[-3000:], proc.returncode


def _pack(tar_path: Path, files: list[Path], results: Results) -> list[str]:
    left_out = []
    with tarfile.open(tar_path, "w") as tar:
        for f in files:
            if not f.exists():
                continue
            if tar_path.stat().st_size + f.stat().st_size + 4096 > FILE_LIMIT:
                left_out.append(f"{f.name} ({f.stat().st_size} bytes: over the file limit)")
                continue
            tar.add(f, arcname=f.name)
    return left_out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench/out/gpu")))
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes")
    ap.add_argument("--budget-s", type=float, default=None, help="default 285 (smoke: 600)")
    ap.add_argument("--only", nargs="*", help="group names to run (default: all, in order)")
    ap.add_argument("--wheels", type=Path, default=ROOT / "bench" / "out" / "gpu-wheels")
    ap.add_argument("--prepare-wheels", type=Path, metavar="DIR")
    ap.add_argument("--collect-backend", help=argparse.SUPPRESS)  # module:Class (smoke tests)
    ap.add_argument("--worker", choices=["profile", "train", "preflight"],
                    help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    warmup, timed = (1, 3) if args.smoke else (3, 10)
    device = "cpu" if args.smoke else "cuda"
    if args.prepare_wheels:
        return prepare_wheels(args.prepare_wheels)
    if args.worker == "profile":
        worker_profile(json.loads(args.spec), device, args.work, warmup, timed)
        return 0
    if args.worker == "train":
        worker_train(json.loads(args.spec), device, args.steps, timed, args.result)
        return 0
    if args.worker == "preflight":
        worker_preflight(device, args.work, args.collect_backend)
        return 0
    return orchestrate(args, device, warmup)


def orchestrate(args, device: str, warmup: int) -> int:
    t_start = time.monotonic()
    budget = args.budget_s or (600.0 if args.smoke else 285.0)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        print(f"error: gpu_pairs: {out} is not empty", file=sys.stderr)
        return 1
    if not args.smoke:
        try:
            import torch
        except ImportError:
            print("error: gpu_pairs: torch is not installed", file=sys.stderr)
            return 1
        if not torch.cuda.is_available():
            print(f"error: gpu_pairs: torch {torch.__version__} sees no GPU "
                  "(use --smoke on a CPU)", file=sys.stderr)
            return 1
    work = Path(tempfile.mkdtemp(prefix="gpu-pairs-"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    env.pop("OUT", None)

    def left() -> float:
        return budget - (time.monotonic() - t_start)

    # 1. preflight
    pre = {"machine": machine_facts(args.smoke),
           "collector_packages": ensure_collector_packages(args.wheels)}
    extra = ["--collect-backend", args.collect_backend] if args.collect_backend else []
    res, err, rc = _child(["--worker", "preflight", "--work", str(work)]
                          + (["--smoke"] if args.smoke else []) + extra, env, min(90, left()))
    pre.update(res[0] if res else {"error": err or f"preflight exited {rc}"})
    refusal = str(pre.get("collector", {}).get("error", ""))
    if "older than" in refusal and "two libcupti" not in refusal:
        # a libcupti older than the bindings: record what collecting past the check gives,
        # said as such, rather than nothing
        from daydream.collect.cupti_backend import ANY_CUPTI_ENV
        env[ANY_CUPTI_ENV] = os.environ[ANY_CUPTI_ENV] = "1"  # the jobs' and probe()'s
        res, err, rc = _child(["--worker", "preflight", "--work", str(work)] + extra, env,
                              min(90, left()))
        pre["collector_refused"] = refusal
        pre["collector_forced"] = (res[0] if res else {"error": err})
        pre["collector"] = pre["collector_forced"].get("collector", {})
    (out / "preflight.json").write_text(json.dumps(pre, indent=1))
    collector_ok = bool(pre.get("collector", {}).get("records_arrive"))
    if not collector_ok:
        print("gpu_pairs: the collector does not work here; `daydream collect` runs are "
              f"skipped: {pre.get('collector')}", file=sys.stderr)
    results = Results(out / "results.json", {"machine": pre["machine"], "smoke": args.smoke,
                                             "budget_s": budget})
    files = 2

    # 2. the groups
    for group in groups():
        if args.only and group["name"] not in args.only:
            continue
        g = {"name": group["name"], "status": "ok"}
        results.doc["groups"].append(g)
        est = group["estimate_s"] * (0.5 if args.smoke else 1)
        if left() < min(est, 20) or files >= MAX_FILES:
            g["status"] = f"skipped: {left():.0f} s left, estimate {est:.0f} s"
            results.write()
            continue
        specs = [smoke_spec(r) if args.smoke else r for r in group["runs"]]
        if args.smoke:
            for s in specs:
                s["compile_backend"] = "eager"
        gdir = work / group["name"]
        gdir.mkdir()
        runs, err, rc = _child(["--worker", "profile", "--spec", json.dumps(specs), "--work",
                                str(gdir)] + (["--smoke"] if args.smoke else []), env,
                               max(10, left()))
        for r in runs:
            r.setdefault("status", "ok")
            r["group"] = group["name"]
            results.add_run(r)
        done = {r["name"] for r in runs}
        for s in specs:
            if s["name"] not in done:
                results.add_run({"name": s["name"], "group": group["name"], "status": "error",
                                 "error": f"worker exited {rc}: {err[-1500:]}"})
        for s in specs:
            if not s["collect"] or left() < 15:
                continue
            if not collector_ok:
                results.add_run({"name": s["name"] + "+collect", "group": group["name"],
                                 "status": "skipped", "why": "preflight: collector not working"})
                continue
            r = collect_run(s, gdir, env, args, warmup, min(120, left()))
            r["group"] = group["name"]
            results.add_run(r)
        for name, base, changed in group["pairs"]:
            results.doc["pairs"].append({"pair": name, "base": base, "changed": changed,
                                         "group": group["name"]})
        traces = sorted(gdir.glob("*.json.gz")) + sorted(gdir.glob("*.cupti"))
        tar = out / f"{group['name']}.tar"
        g["left_out"] = _pack(tar, traces, results)
        g["file"] = tar.name
        g["seconds_left"] = round(left(), 1)
        files += 1
        results.write()
    results.doc["seconds"] = round(time.monotonic() - t_start, 1)
    results.write()
    shutil.rmtree(work, ignore_errors=True)
    bad = [r["name"] for r in results.doc["runs"] if r.get("status") == "error"]
    print(f"gpu_pairs: {len(results.doc['runs'])} runs, {len(bad)} failed "
          f"({', '.join(bad) or 'none'}), {results.doc['seconds']} s; results in {out}")
    return 0


def collect_run(spec: dict, gdir: Path, env: dict, args, warmup: int, timeout_s: float) -> dict:
    """The run under `daydream collect` (the injected path, in the job's own process)."""
    from daydream.base.errors import DaydreamError
    from daydream.collect import cupti_backend
    from daydream.collect.cli import SUFFIX, child_env

    iterations = 3
    name = spec["name"] + "+collect"
    out = gdir / f"collect-{spec['name']}"
    result = gdir / f"collect-{spec['name']}.json"
    job = [sys.executable, str(Path(__file__).resolve()), "--worker", "train", "--spec",
           json.dumps(spec), "--steps", str(warmup + iterations + 1), "--result", str(result)]
    job += ["--smoke"] if args.smoke else []
    t0 = time.perf_counter()
    try:
        if not args.smoke:
            cupti_backend.probe()
        out.mkdir(parents=True)
        proc = subprocess.run(job, env=child_env(out, iterations, warmup, base=env,
                                                 backend=args.collect_backend),
                              capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except (DaydreamError, subprocess.TimeoutExpired) as e:
        return {"name": name, "status": "error", "error": str(e)[:2000]}
    files = sorted(out.glob(f"*{SUFFIX}"))
    r = {"name": name, "settings": spec, "returncode": proc.returncode,
         "status": "ok" if proc.returncode == 0 and len(files) == 1 else "error",
         "files": [f.name for f in files], "seconds": round(time.perf_counter() - t0, 2),
         "iterations": iterations, "warmup": warmup}
    if r["status"] == "error":
        r["error"] = proc.stderr[-2000:]
    if result.exists():
        r.update({k: v for k, v in json.loads(result.read_text()).items() if k != "name"})
    if len(files) == 1:
        dest = gdir / f"{spec['name']}.cupti"
        shutil.move(str(files[0]), dest)
        r["trace"] = dest.name
    return r


if __name__ == "__main__":
    sys.exit(main())
