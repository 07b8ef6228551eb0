"""End-to-end check of collection on a GPU machine: ResNet-50 and a small transformer, fp32 and
AMP, Adam and fused Adam; each configuration collected in its own process, read back with the
raw-file reader, and checked.

    python -m collect.gpu_smoke --out DIR            # all 8 configurations + the CLI path
    python -m collect.gpu_smoke --one resnet50 amp fused --out DIR
    python -m collect.gpu_smoke --dry                # CPU: build and step the models only

Needs torch with CUDA and cupti-python on the machine; no torchvision (ResNet-50 is defined
here). Prints one JSON line per configuration and exits non-zero if any check fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

MODELS = ("resnet50", "transformer")
PRECISIONS = ("fp32", "amp")
OPTIMIZERS = ("adam", "fused")


def resnet50(num_classes: int = 1000):
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
            out += identity  # in place on a module output: what full backward hooks reject
            return self.relu(out)

    class ResNet50(nn.Module):
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

    return ResNet50()


def transformer(vocab: int = 32000, d: int = 512, layers: int = 6):
    import torch.nn as nn

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            layer = nn.TransformerEncoderLayer(d, 8, 4 * d, batch_first=True, norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(d, vocab)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens)))

    return LM()


def make_step(model_name: str, precision: str, opt_name: str, device: str, small: bool = False):
    import torch

    if model_name == "resnet50":
        model = resnet50().to(device).to(memory_format=torch.channels_last)
        batch = 2 if small else 64
        x = torch.randn(batch, 3, 224 if not small else 64, 224 if not small else 64,
                        device=device).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device=device)

        def loss_of():
            return torch.nn.functional.cross_entropy(model(x), y)
    else:
        model = transformer(layers=2 if small else 6).to(device)
        batch, seq = (2, 16) if small else (16, 256)
        x = torch.randint(0, 32000, (batch, seq), device=device)

        def loss_of():
            logits = model(x[:, :-1])
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     x[:, 1:].reshape(-1))

    fused = opt_name == "fused" and device == "cuda"
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=fused or None)
    amp = precision == "amp" and device == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=amp)

    def step():
        with torch.autocast(device, dtype=torch.float16, enabled=amp):
            loss = loss_of()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    return model, opt, step


def check(path: Path) -> dict:
    """Read a raw file back and check what a collection must hold (only its size where the
    reader's own dependencies are missing: the file can be read on another machine)."""
    from ingest.cupti_raw import read_cupti_raw

    t0 = time.perf_counter()
    try:
        conv = read_cupti_raw(path)
    except ImportError as e:
        return {"file": str(path), "bytes": path.stat().st_size, "read": f"skipped: {e}",
                "problems": []}
    read_s = time.perf_counter() - t0
    t = conv.tables
    ranges = t["range"].to_pylist()
    modules = [r for r in ranges if r["kind"] == "module"]
    steps = [r for r in ranges if r["name"].startswith("ProfilerStep#")]
    marker_ids = {r["external_id"] for r in modules}
    kernel_ext = t["kernel"]["external_id"].to_pylist()
    linked = sum(1 for e in kernel_ext if e in marker_ids)
    fwd = [r for r in modules if r["name"].endswith("[forward]")]
    bwd = [r for r in modules if r["name"].endswith("[backward]")]
    out = {
        "file": str(path), "bytes": path.stat().st_size, "read_s": round(read_s, 3),
        "events": conv.events, "kernels": t["kernel"].num_rows, "api": t["api"].num_rows,
        "memcpy": t["memcpy"].num_rows, "memset": t["memset"].num_rows,
        "sync": t["sync"].num_rows, "ranges": len(ranges), "forward_markers": len(fwd),
        "backward_markers": len(bwd), "iterations": len(steps),
        "kernels_linked_to_a_layer": round(linked / max(1, len(kernel_ext)), 3),
        "devices": [d.get("name") for d in conv.devices or []],
        "stats": {s["name"]: s["count"] for s in conv.stats.rows()},
        "hook_errors": conv.metadata.get("hook_errors"),
        "hook_first_error": conv.metadata.get("hook_first_error"),
    }
    problems = []
    if not out["kernels"]:
        problems.append("no kernels")
    if not out["api"]:
        problems.append("no runtime/driver calls")
    if not out["forward_markers"] or not out["backward_markers"]:
        problems.append("layer markers missing")
    if out["kernels_linked_to_a_layer"] < 0.5:
        problems.append("under half the kernels are linked to a marker")
    if out["hook_errors"]:
        problems.append(f"hook errors: {out['hook_first_error']}")
    if "collector_errors" in out["stats"] or "truncated_chunk" in out["stats"]:
        problems.append("collector errors or a cut file")
    api_names = set(t["api"]["name"].to_pylist())
    if not any(n.startswith("cudaLaunchKernel") or n.startswith("cuLaunchKernel")
               for n in api_names):
        problems.append("no launch calls named")
    out["problems"] = problems
    return out


def run_one(model_name: str, precision: str, opt_name: str, out: Path, iterations: int,
            warmup: int) -> dict:
    import torch

    from collect.api import collect_steps

    model, opt, step = make_step(model_name, precision, opt_name, "cuda")
    prefix = f"{model_name}-{precision}-{opt_name}"
    path = collect_steps(step, out, iterations, warmup=warmup, model=model, optimizer=opt,
                         prefix=prefix)
    torch.cuda.synchronize()
    res = check(path)
    res["config"] = prefix
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("daydream-traces/gpu-smoke"))
    ap.add_argument("--one", nargs=3, metavar=("MODEL", "PRECISION", "OPTIMIZER"))
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dry", action="store_true", help="CPU: build and step the models only")
    ap.add_argument("--no-cli", action="store_true", help="skip the `daydream collect` check")
    ap.add_argument("--cli-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.dry:
        for m in MODELS:
            _, _, step = make_step(m, "fp32", "adam", "cpu", small=True)
            step()
            step()
            print(json.dumps({"dry": m, "ok": True}))
        return 0
    if args.cli_child:  # the job `daydream collect` runs: an unmodified training loop
        _, _, step = make_step("transformer", "amp", "fused", "cuda")
        for _ in range(args.warmup + args.iterations + 2):
            step()
        return 0
    if args.one:
        res = run_one(*args.one, args.out, args.iterations, args.warmup)
        print(json.dumps(res))
        return 1 if res["problems"] else 0

    failed = 0
    for m in MODELS:
        for p in PRECISIONS:
            for o in OPTIMIZERS:
                proc = subprocess.run([sys.executable, "-m", "collect.gpu_smoke", "--one", m, p, o,
                                       "--out", str(args.out), "--iterations",
                                       str(args.iterations), "--warmup", str(args.warmup)],
                                      capture_output=True, text=True, timeout=600)
                line = (proc.stdout.strip().splitlines() or [""])[-1]
                if proc.returncode:
                    failed += 1
                    print(json.dumps({"config": f"{m}-{p}-{o}", "rc": proc.returncode,
                                      "last_line": line, "stderr": proc.stderr[-3000:]}))
                else:
                    print(line)
    if not args.no_cli:
        from collect.cli import collect_command
        cli_out = args.out / "cli"
        res = collect_command([sys.executable, "-m", "collect.gpu_smoke", "--cli-child",
                               "--iterations", str(args.iterations), "--warmup",
                               str(args.warmup)], cli_out, args.iterations, args.warmup)
        checks = [check(f) for f in res.files]
        ok = res.returncode == 0 and len(checks) == 1 and not checks[0]["problems"]
        failed += not ok
        print(json.dumps({"config": "cli transformer-amp-fused (global hooks)",
                          "rc": res.returncode, "files": [str(f) for f in res.files],
                          "checks": checks}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
