"""One end-to-end collection on a GPU machine, in about a minute: a small transformer trained with
AMP and fused Adam under ``daydream collect`` (the injected start-up path: global hooks, steps
ending iterations), read back and checked.

    python -m daydream.collect.gpu_smoke [--out DIR] [--iterations 3] [--warmup 2]

Exits 1 with one ``error: ...`` line when something it needs is missing (torch with CUDA, a
GPU, cupti-python and a libcupti that matches it, the reader's packages), and 1 with the
problems listed when the file lacks what a collection must hold; 0 and one JSON line otherwise.
``bench/gpu_pairs.py`` records the real pairs; this only says that collection works here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


class Missing(Exception):
    """A prerequisite is absent: said in one line, exit 1."""


def transformer(vocab: int = 32000, d: int = 512, layers: int = 4):
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


def train(steps: int) -> None:
    """The job `daydream collect` runs: an unmodified AMP loop with fused Adam."""
    import torch

    model = transformer().cuda()
    x = torch.randint(0, 32000, (16, 257), device="cuda")
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.float16):
            logits = model(x[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     x[:, 1:].reshape(-1))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def prerequisites() -> dict:
    """What the run needs, checked before anything runs; raises Missing."""
    try:
        import torch
    except ImportError as e:
        raise Missing(f"torch is not installed ({e})") from None
    if not torch.cuda.is_available():
        why = "a CPU build" if torch.version.cuda is None else "no GPU is visible"
        raise Missing(f"torch {torch.__version__} cannot reach a GPU ({why})")
    from daydream.base.errors import DaydreamError
    from daydream.collect import cupti_backend
    try:
        cupti_backend.probe()
    except DaydreamError as e:
        raise Missing(str(e)) from None
    try:  # the reader and its packages (pyarrow, numba, ISA-L), which check() runs
        from daydream.ingest.cupti_raw import read_cupti_raw  # noqa: F401
    except ImportError as e:
        raise Missing(f"the trace reader's packages are missing ({e}); pip install daydream "
                      "on this machine, or copy the file and check it elsewhere") from None
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(0)}


def check(path: Path, iterations: int) -> dict:
    """Read a raw file back and list what a collection must hold but this one lacks."""
    from daydream.ingest.cupti_raw import read_cupti_raw

    t0 = time.perf_counter()
    conv = read_cupti_raw(path)
    t = conv.tables
    ranges = t["range"].to_pylist()
    modules = [r for r in ranges if r["kind"] == "module"]
    steps = [r for r in ranges if r["name"].startswith("ProfilerStep#")]
    marker_ids = {r["external_id"] for r in modules}
    kernel_ext = t["kernel"]["external_id"].to_pylist()
    names = t["kernel"]["name"].to_pylist()
    stats = {s["name"]: s["count"] for s in conv.stats.rows()}
    lib = conv.metadata.get("libcupti") or {}
    out = {
        "file": str(path), "bytes": path.stat().st_size,
        "read_s": round(time.perf_counter() - t0, 3), "kernels": t["kernel"].num_rows,
        "api": t["api"].num_rows, "memcpy": t["memcpy"].num_rows, "sync": t["sync"].num_rows,
        "forward_markers": sum(r["name"].endswith("[forward]") for r in modules),
        "backward_markers": sum(r["name"].endswith("[backward]") for r in modules),
        "iterations": len(steps),
        "kernels_linked_to_a_layer": round(sum(e in marker_ids for e in kernel_ext)
                                           / max(1, len(kernel_ext)), 3),
        "devices": [d.get("name") for d in conv.devices or []], "libcupti": lib,
        "stats": stats,
    }
    problems = []
    for what, bad in (("no kernels", not out["kernels"]),
                      ("no runtime/driver calls", not out["api"]),
                      ("layer markers missing",
                       not out["forward_markers"] or not out["backward_markers"]),
                      (f"{out['iterations']} iterations, not {iterations}",
                       out["iterations"] != iterations),
                      ("under half the kernels are linked to a layer marker",
                       out["kernels_linked_to_a_layer"] < 0.5),
                      ("no device records or properties", not out["devices"]),
                      ("libcupti not recorded", not lib.get("path")),
                      (f"libcupti mismatch: {lib.get('mismatch')}", bool(lib.get("mismatch"))),
                      ("mangled kernel names left", any(n.startswith("_Z") and len(n) <= 1024
                                                        for n in names))):
        if bad:
            problems.append(what)
    for key in ("untimed_record", "negative_duration", "collector_errors", "truncated_chunk",
                "collection_not_closed", "cupti_dropped_records", "hook_errors"):
        if stats.get(key):
            problems.append(f"{key}: {stats[key]}")
    api_names = set(t["api"]["name"].to_pylist())
    if not any(n.startswith(("cudaLaunchKernel", "cuLaunchKernel")) for n in api_names):
        problems.append("no launch calls named")
    out["problems"] = problems
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("daydream-traces/gpu-smoke"))
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        train(args.warmup + args.iterations + 2)
        return 0
    try:
        env = prerequisites()
    except Missing as e:
        print(f"error: gpu_smoke: {e}", file=sys.stderr)
        return 1
    from daydream.collect.cli import collect_command
    t0 = time.perf_counter()
    res = collect_command([sys.executable, "-m", "daydream.collect.gpu_smoke", "--child",
                           "--iterations", str(args.iterations), "--warmup", str(args.warmup)],
                          args.out, args.iterations, args.warmup)
    if res.returncode or len(res.files) != 1:
        print(f"error: gpu_smoke: the job exited {res.returncode} and left "
              f"{len(res.files)} files (one expected) in {args.out}", file=sys.stderr)
        return 1
    out = dict(env, run_s=round(time.perf_counter() - t0, 1), **check(res.files[0],
                                                                       args.iterations))
    print(json.dumps(out))
    if out["problems"]:
        print(f"error: gpu_smoke: {'; '.join(out['problems'])}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
