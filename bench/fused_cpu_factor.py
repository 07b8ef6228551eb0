"""Per-element cost of torch's fused CPU optimizer kernels against the for-loop ops they
replace (transforms.constants FUSED_OPTIMIZER_CPU element_factor cites this).

Each is timed on one tensor of --small and of --large elements (no profiler, one thread, the
median of interleaved rounds); the per-element cost is the slope between the two sizes, so the
per-op dispatch cost (the same at both sizes) drops out. The default sizes are cache-resident
(16 KB and 256 KB per tensor), like the parameters of the small jobs in tests/data/whatif.

    python bench/fused_cpu_factor.py [--small 4096] [--large 65536] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def loop_adam(p, g, m, v, step, wd=0.0):
    """The element-wise ops of torch.optim.Adam/AdamW's for-loop (_single_tensor_adam), one
    parameter, default hyper-parameters (the scalar step bookkeeping left out)."""
    if wd:
        p.mul_(1 - 1e-3 * wd)
    m.lerp_(g, 0.1)
    v.mul_(0.999).addcmul_(g, g, value=0.001)
    denom = (v.sqrt() / 0.5).add_(1e-8)
    p.addcdiv_(m, denom, value=-1e-3)


def loop_sgd(p, g, buf):
    buf.mul_(0.9).add_(g)
    p.add_(buf, alpha=-1e-3)


def cases(n: int):
    p, g, m, v, buf = (torch.randn(n) for _ in range(5))
    v.abs_()
    step = torch.tensor(5.0)
    lr = 1e-3
    return {
        "adam": (lambda: loop_adam(p, g, m, v, step),
                 lambda: torch._fused_adam_([p], [g], [m], [v], [], [step], lr=lr, beta1=0.9,
                                            beta2=0.999, weight_decay=0.0, eps=1e-8,
                                            amsgrad=False, maximize=False)),
        "adamw": (lambda: loop_adam(p, g, m, v, step, wd=1e-2),
                  lambda: torch._fused_adamw_([p], [g], [m], [v], [], [step], lr=lr,
                                              beta1=0.9, beta2=0.999, weight_decay=1e-2,
                                              eps=1e-8, amsgrad=False, maximize=False)),
        "sgd": (lambda: loop_sgd(p, g, buf),
                lambda: torch._fused_sgd_([p], [g], [buf], weight_decay=0.0, momentum=0.9,
                                          lr=lr, dampening=0.0, nesterov=False,
                                          maximize=False, is_first_step=False)),
    }


def median_us(fn, rounds: int, reps: int) -> float:
    out = []
    for _ in range(rounds):
        fn()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        out.append((time.perf_counter() - t0) / reps * 1e6)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=4096)
    ap.add_argument("--large", type=int, default=65536)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(1)
    small, large = cases(a.small), cases(a.large)
    for kind in small:
        t = {}
        for size, cs in (("small", small), ("large", large)):
            for j, name in enumerate(("loop", "fused")):
                t[size, name] = median_us(cs[kind][j], a.rounds, a.reps)
        n = a.large - a.small
        lo = (t["large", "loop"] - t["small", "loop"]) / n * 1e3
        fu = (t["large", "fused"] - t["small", "fused"]) / n * 1e3
        print(f"{kind}: for-loop ops {t['small', 'loop']:.1f} / {t['large', 'loop']:.1f} us, "
              f"fused {t['small', 'fused']:.1f} / {t['large', 'fused']:.1f} us at {a.small} / "
              f"{a.large} elements; per element {lo:.3f} vs {fu:.3f} ns: fused/loop "
              f"{fu / lo:.3f} (torch {torch.__version__}, 1 thread)")


if __name__ == "__main__":
    main()
