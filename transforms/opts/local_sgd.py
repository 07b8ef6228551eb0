"""Local SGD (Lin et al., ICLR 2020, 'Don't Use Large Mini-Batches, Use Local SGD'; Stich,
ICLR 2019): each rank takes K local steps between two gradient all-reduces."""

from __future__ import annotations

import numpy as np

from daydream.base.errors import DaydreamError
from daydream.transforms.opts.distributed import gradient_allreduces, set_comm
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register


@register("local_sgd", example="local_sgd(every=4)", shrinks=True)
def local_sgd(g: Graph, ctx: Context, *, every: int = 4) -> Graph:
    """Local-update SGD: gradients (or models) all-reduced every EVERY steps instead of every
    step; the step reported is the mean over EVERY steps.

    Of EVERY steps one communicates and EVERY-1 do not, so each gradient all-reduce costs
    1/EVERY of its time per step on average: its duration is divided by EVERY, the rest of
    the step unchanged. Exact where the collectives are exposed (the step waits for them
    whole); where one overlapped the backward pass, the mean step lies between this
    prediction and the step with that collective's exposed part divided by EVERY (the
    averaged collective can hide wholly), so the speedup is an upper bound there (a note
    says so). Chain after ddp(...) for a single-GPU trace, or use on a DDP trace."""
    if every < 1:
        raise DaydreamError(f"local_sgd: every must be >= 1, got {every}")
    if every == 1:
        ctx.notes.append("local_sgd: every=1 all-reduces every step: does not apply, unchanged")
        return g
    n, c = gradient_allreduces(g, ctx, "local_sgd")
    dur = c["dur_ns"].to_numpy().astype(np.float64)
    new = np.rint(dur / every).astype(np.int64)
    ctx.notes.append(f"local_sgd: {c.height} gradient all-reduces ({n} ranks) once every "
                     f"{every} steps, averaged: {dur.sum() / 1e6:.3f} -> "
                     f"{new.sum() / 1e6:.3f} ms of collectives; exact where they are "
                     "exposed, an upper bound on the speedup where they overlap compute")
    return set_comm(g, c["task_id"].to_numpy(), new)
