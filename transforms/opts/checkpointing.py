"""Activation checkpointing (recomputation): selected layers keep no activations in the forward
pass and run their forward again in the backward pass, right before their own backward."""

from __future__ import annotations

import polars as pl

from daydream.transforms import layers as L
from daydream.transforms import memory
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register
from daydream.transforms.work import ranges_of

# Constants of the model, each with where it comes from ("estimate" = a modelling choice).
CHECKPOINTING = {
    "segment_cpu_ns": {
        "value": 20000,
        "source": "estimate: per checkpointed segment, torch.utils.checkpoint's backward "
                  "(CheckpointFunction.backward, or the saved-tensor hooks of the non-reentrant "
                  "form) detaches the saved inputs, restores the CPU and CUDA RNG states "
                  "(torch.random.fork_rng, get/set_rng_state) and enters enable_grad before it "
                  "reruns the forward: a few Python calls and two RNG-state copies, 10-30 us "
                  "in eager PyTorch",
    },
    "recompute_cost": {
        "value": 1.0,
        "source": "Chen et al., 'Training Deep Nets with Sublinear Memory Cost' (2016), and "
                  "the torch.utils.checkpoint docs: the recomputation is the same forward "
                  "computation (same kernels, same host dispatch) run again, so each copied "
                  "task lasts what the original lasted",
    },
}


@register("checkpointing")
def checkpointing(g: Graph, ctx: Context, *, layers: str = "", every: int = 1) -> Graph:
    """Activation checkpointing: the selected layers' forward runs again in the backward pass.

    Layers (the task table's layer column) are taken in forward order; LAYERS is a regular
    expression over their names (case-insensitive; empty: all) and of the matching layers
    every EVERY-th is checkpointed, starting with the first. In each iteration, a checkpointed
    layer's forward GPU tasks (kernels, copies, sets) are copied, in order and with their
    durations, onto the stream of the layer's first backward GPU task and placed right before
    it; its forward CPU tasks (calls and host time) are copied onto the thread that launches
    its backward, before the layer's first backward CPU task there, after one set-up task per
    segment (CHECKPOINTING segment_cpu_ns: RNG state and input detaching); each copied kernel
    is launched by the copy of its launch call with the original launch lag. Forward and
    everything else keep their time. A note gives the predicted peak device memory (only each
    checkpointed layer's input kept, one layer's activations recomputed at a time)."""
    chosen = L.pick(g, layers, every, "checkpointing")
    st = L.sites(g, chosen)
    if not st:
        ctx.notes.append("checkpointing: no layer with forward and backward GPU work matches; "
                         "unchanged")
        return g
    t = g.task
    kind = t["kind"].to_list()
    name = t["name"].to_list()
    unit = t["unit_id"].to_numpy()
    dur = t["dur_ns"].to_numpy()
    nbytes = t["bytes"].to_list()
    f = CHECKPOINTING["recompute_cost"]["value"]
    lag = L.launch_lag(g)
    rows: list[dict] = []
    edges: list[tuple] = []
    for s in st:
        layer = s["layer"]
        setup = len(rows)
        rows.append({"at": s["bwd_cpu"], "kind": "host", "unit_id": s["bwd_thread"],
                     "name": "checkpoint: recompute set-up (inserted)",
                     "dur_ns": CHECKPOINTING["segment_cpu_ns"]["value"], "phase": "backward",
                     "layer": layer})
        copy_of = {}
        for c in s["fwd_cpu"]:
            copy_of[c] = len(rows)
            rows.append({"at": s["bwd_cpu"], "kind": kind[c], "unit_id": s["bwd_thread"],
                         "name": name[c], "dur_ns": int(round(dur[c] * f)),
                         "phase": "backward", "layer": layer})
        stream = int(unit[s["bwd_gpu"]])
        for k in s["fwd_gpu"]:
            j = len(rows)
            rows.append({"at": s["bwd_gpu"], "kind": kind[k], "unit_id": stream,
                         "name": f"{name[k]} (recompute)", "dur_ns": int(round(dur[k] * f)),
                         "phase": "backward", "layer": layer, "bytes": nbytes[k]})
            api, lg = lag.get(k, (-1, 0))
            edges.append((-1 - copy_of.get(api, setup), -1 - j, "launch", "start_start", lg))
    ins = pl.DataFrame(rows, schema_overrides={"bytes": pl.Int64})
    ed = pl.DataFrame(edges, schema=["src", "dst", "kind", "anchor", "lag_ns"], orient="row")
    g2, _ = g.insert(ins, ed)
    gpu_ns = int(sum(dur[s["fwd_gpu"]].sum() for s in st))
    ctx.notes.extend(memory.notes(g, ctx, "checkpointing", ranges=ranges_of(ctx),
                                  checkpointed=sorted({s["layer"] for s in st})))
    ctx.notes.append(f"checkpointing: {len({s['layer'] for s in st})} layers, {len(st)} "
                     f"layer-iterations recomputed ({sum(len(s['fwd_gpu']) for s in st)} GPU "
                     f"tasks, {gpu_ns / 1e6:.2f} ms GPU time added to backward)")
    return g2

