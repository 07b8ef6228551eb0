"""A different batch size: the same job at batch N, from a trace at batch b."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from daydream.base import occupancy
from daydream.base.errors import DaydreamError
from daydream.transforms import memory
from daydream.transforms import roofline as rf
from daydream.transforms import work as wk
from daydream.transforms.hardware import Device, device_from_properties
from daydream.transforms.kernel_class import classify
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register

# The number of ops with recorded shapes that the traced batch is read from when the trace
# has no host-to-device copy of its inputs: the first ops of the first iteration.
FIRST_OPS = 8
SCALED_PHASES = ("forward", "backward", "other", "data_loading")
# The optimizer's phase: every tensor it touches is a parameter, a gradient or optimizer
# state, each parameter-sized whatever the batch, so its tasks keep their time even where
# their shapes are not recognised as parameters (graphstore.params knows the weights of
# convolutions, linear layers, normalizations and embeddings, not an LSTM's or a raw
# ``x @ W``'s).
FIXED_PHASES = ("weight_update",)
# Collectives that move activations (all-to-all of embeddings, point-to-point sends of a
# pipeline) grow with the batch; the others (all-reduce, reduce-scatter, all-gather,
# broadcast) move parameters or gradients under data parallelism and keep their time.
PER_SAMPLE_COMM = ("alltoall", "all_to_all", "sendrecv", "send", "recv")


def traced_batch(g: Graph, ranges: pa.Table | None) -> tuple[int | None, str]:
    """The batch the trace ran at: the most common leading dimension of the first tensor
    input of the ops that copy the model's inputs to the device (the ops enclosing the
    launches of its host-to-device copies), else of the first FIRST_OPS ops with recorded
    shapes of the first iteration; and how it was found."""
    if ranges is None or "input_dims" not in ranges.column_names or \
            pc.all(pc.is_null(ranges["input_dims"])).as_py():
        return None, "the trace records no input shapes (profile with record_shapes=True)"
    t = g.task
    la = g.launches()
    kind = t["kind"].to_numpy()
    name = t["name"].fill_null("").to_list()
    rid = t["range_id"].fill_null(-1).to_numpy()
    api, gpu = la["api"].to_numpy(), la["gpu"].to_numpy()
    h2d = np.asarray([kind[x] == "memcpy" and "htod" in name[x].lower().replace(" ", "")
                      for x in gpu], bool) if len(gpu) else np.zeros(0, bool)
    ops = wk.op_of_task(rid[api[h2d]], ranges) if h2d.any() else np.zeros(0, np.int64)
    ops = [int(o) for o in ops if o >= 0]
    how = "host-to-device copies of the inputs"
    if not ops:
        it = t["iteration"].fill_null(-1).to_numpy()
        first_it = it[it >= 0].min() if (it >= 0).any() else -1
        sel = (rid >= 0) & (it == first_it) & np.isin(kind, ["api", "host"])
        cand = wk.op_of_task(np.unique(rid[sel]), ranges)
        ops = [int(o) for o in dict.fromkeys(cand.tolist()) if o >= 0][:FIRST_OPS]
        how = f"the first {FIRST_OPS} ops with recorded shapes"
    b, found = wk.batch_of(ranges, ops)
    return b, f"{how}: {found}"


@dataclass
class BatchModel:
    """What ``predict`` found: per task the new duration (``new_dur_ns``; CPU tasks keep
    theirs unless they load data), and what a report needs."""

    traced: int
    size: int
    how: str
    new_dur_ns: np.ndarray
    new_bytes: np.ndarray
    gpu: np.ndarray                  # mask of the GPU tasks the model changed
    math: list[str]                  # per task, the kernel class (GPU tasks)
    with_shapes: np.ndarray          # per task: its op recorded shapes
    fixed_ns: float
    fixed_how: str
    fraction: dict[str, float]
    roofline_b_ns: np.ndarray           # per task: roofline time at b, ns (NaN: no shapes)
    roofline_n_ns: np.ndarray           # per task: roofline time at N, ns
    notes: list[str] = field(default_factory=list)


def launch_grid(g: Graph, ctx: Context, ids: np.ndarray) -> dict[str, np.ndarray] | None:
    """Blocks, threads per block, registers per thread and shared memory per block of the
    kernels IDS (task ids), from the kernel activity table by correlation id; 0 where not
    recorded; None without a store."""
    if ctx.activity is None or not len(ids):
        return None
    try:
        k = ctx.activity("kernel")
    except DaydreamError:
        return None
    cols = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
            "registers_per_thread", "shared_memory_bytes"]
    if any(c not in k.column_names for c in cols):
        return None
    corr = k["correlation"].to_pylist()
    vals = {c: pc.fill_null(k[c], 0).to_numpy() for c in cols}
    pos = {c: i for i, c in enumerate(corr) if c is not None}
    tc = g.task["correlation"].to_list()
    at = np.asarray([pos.get(tc[int(i)], -1) for i in ids], np.int64)
    ok = at >= 0
    pick = {c: np.where(ok, v[np.maximum(at, 0)], 0).astype(np.float64)
            for c, v in vals.items()}
    blocks, threads = occupancy.launch_size(*(pick[c] for c in cols[:6]))
    return {"blocks": np.where(ok, blocks, 0.0), "threads": threads,
            "regs": pick["registers_per_thread"], "smem": pick["shared_memory_bytes"]}


def _device(ctx: Context) -> Device | None:
    return device_from_properties(ctx.device) if ctx.device else None


def predict(g: Graph, ctx: Context, size: int, traced: int = 0,
            work_n: dict[int, tuple[float, float]] | None = None,
            carry_fraction: bool = False, seq: int = 0, traced_seq: int = 0) -> BatchModel:
    """The per-task durations of the job at batch SIZE (see ``batch``). ``work_n``: (FLOPs,
    bytes) at the new batch of some ops (range ids), instead of the batch scaling's; the
    accuracy harness gives the ops' real work in a trace at that batch, to judge the
    roofline apart from the shapes. ``carry_fraction``: the rule the model does not use, for
    the harness to compare: each kernel's fraction of its roofline carried into the regime
    of its new working set (a spill out of the L2 slows it by the L2/DRAM ratio)."""
    if size < 1:
        raise DaydreamError(f"batch: size must be >= 1, got {size}")
    if traced < 0:
        raise DaydreamError(f"batch: traced must be >= 0 (0: read it from the trace), got "
                            f"{traced}")
    if seq < 0 or traced_seq < 0:
        raise DaydreamError(f"batch: seq and traced_seq must be >= 0, got seq={seq}, "
                            f"traced_seq={traced_seq}")
    if bool(seq) != bool(traced_seq):
        raise DaydreamError("batch: a new sequence length needs the traced one: give both "
                            f"seq and traced_seq (got seq={seq}, traced_seq={traced_seq}); "
                            "the trace cannot tell its length from its other dims")
    ranges = wk.ranges_of(ctx)
    b, how = (traced, "given") if traced else traced_batch(g, ranges)
    if not b:
        raise DaydreamError(f"batch: cannot tell the batch this trace ran at: {how}; give it "
                            f"as batch(size={size}, traced=B)")
    s = size / b
    r = seq / traced_seq if seq else 1.0
    seq_arg = (traced_seq, r) if seq and seq != traced_seq else None
    t = g.task
    n = g.n_tasks
    kind = t["kind"].to_numpy()
    names = t["name"].fill_null("").to_list()
    phase = t["phase"].fill_null("other").to_numpy()
    dur = t["dur_ns"].to_numpy().astype(np.float64)
    nbytes = t["bytes"].fill_null(0).to_numpy().astype(np.float64)
    la = g.launches()
    ops = wk.task_ops(kind, t["range_id"].fill_null(-1).to_numpy(), la["api"].to_numpy(),
                      la["gpu"].to_numpy(), ranges)
    local = np.isin(kind, ["kernel", "memcpy", "memset"])
    if n:
        local[0] = False
    notes: list[str] = []
    dev = _device(ctx)
    if dev is None:
        notes.append("batch: the trace's GPU is not in the GPU table (transforms/hardware.py): "
                      "no roofline, each kernel's work scales with its op's bytes")
    # -- the work of every op at b and at N
    params = wk.param_shapes(ranges) if ranges is not None else frozenset()
    if seq_arg is not None:
        plain = not any(traced_seq in shape for shape in params)
        seq_arg = (traced_seq, r, plain)
        if not plain:
            notes.append(f"batch: a parameter has a dim of {traced_seq}, the traced length: "
                         f"a dim of {traced_seq} may be a hidden size, so only batch x length "
                         "and the sequence's pairs are taken to grow with the length")
    works = wk.op_works(ranges, ops.op[local], params, s, b, seq_arg)
    if work_n:
        works = {r: (wk.Work(w.flops_b, w.bytes_b, float(work_n[r][0]), float(work_n[r][1]),
                             w.ambiguous) if r in work_n else w) for r, w in works.items()}
    has = local & np.asarray([int(o) in works for o in ops.op], bool)
    math = ["" for _ in range(n)]
    for i in np.flatnonzero(local):
        math[i] = "memory" if kind[i] != "kernel" else \
            classify(names[i], ops.name[i], ops.types[i]).math
    # the fixed cost: kernels whose op is tiny, else a percentile of all kernels
    kern = local & (kind == "kernel")
    tiny = np.asarray([has[i] and works[int(ops.op[i])].bytes_b < rf.TINY_BYTES
                       for i in range(n)], bool)
    t0, t0_how = rf.fixed_cost_ns(dur[kern], tiny[kern])
    # -- per kernel with an op: its share of the op's work, its rooflines
    idx = np.flatnonzero(has)
    op_of = ops.op[idx]
    excess = np.maximum(dur[idx] - t0, 0.0)
    tot: dict[int, float] = {}
    cnt: dict[int, int] = {}
    for o, e in zip(op_of, excess, strict=True):
        tot[int(o)] = tot.get(int(o), 0.0) + e
        cnt[int(o)] = cnt.get(int(o), 0) + 1
    share = np.asarray([e / tot[int(o)] if tot[int(o)] > 0 else 1.0 / cnt[int(o)]
                        for o, e in zip(op_of, excess, strict=True)], np.float64)
    W = [works[int(o)] for o in op_of]
    fl_b = np.asarray([w.flops_b for w in W]) * share
    by_b = np.asarray([w.bytes_b for w in W]) * share
    fl_n = np.asarray([w.flops_n for w in W]) * share
    by_n = np.asarray([w.bytes_n for w in W]) * share
    ws_b = np.asarray([w.bytes_b for w in W])
    ws_n = np.asarray([w.bytes_n for w in W])
    m_idx = [math[i] for i in idx]
    copy = kind[idx] != "kernel"
    if dev is not None:
        bw_b = rf.bandwidth_gbps(dev, ws_b)
        bw_n = np.where(copy, bw_b, rf.bandwidth_gbps(dev, ws_n))
        r_b = rf.roofline_ns(dev, m_idx, fl_b, by_b, bw_b)
        r_same = rf.roofline_ns(dev, m_idx, fl_n, by_n, bw_b)
        r_n = rf.roofline_ns(dev, m_idx, fl_n, by_n, bw_n)
        l2, l2_src = rf.l2_gbps(dev)
        if l2 is None:
            notes.append(f"batch: {l2_src}")
    else:
        # no device: the op's bytes (FLOPs for matrix math) in arbitrary units
        mm = np.asarray([m not in ("memory", "comm") for m in m_idx], bool)
        r_b = np.where(mm, fl_b, by_b)
        r_same = r_n = np.where(mm, fl_n, by_n)
    if carry_fraction:
        r_same = r_n
    frac = rf.class_fraction(dur[idx], r_b, t0, m_idx)
    f_c = np.asarray([frac.get(m, 1.0) for m in m_idx])
    sp = rf.split(dur[idx], r_b, t0, f_c)
    wave = np.ones(len(idx))
    tiled = np.asarray([m not in ("memory", "comm") for m in m_idx], bool) & ~copy
    grid = launch_grid(g, ctx, idx[tiled])
    if grid is not None and dev is not None and dev.sm_count:
        cap = dev.sm_count * occupancy.resident_blocks(ctx.device, grid["threads"],
                                                       grid["regs"], grid["smem"])
        with np.errstate(divide="ignore", invalid="ignore"):
            growth = np.where(r_b[tiled] > 0, r_same[tiled] / r_b[tiled], 1.0)
        wave[tiled] = rf.wave_factor(grid["blocks"], cap, growth)
    new = dur.copy()
    new[idx] = rf.kernel_ns(sp, r_same, r_n, wave)
    new_bytes = nbytes.copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(ws_b > 0, ws_n / ws_b, 1.0)
    new_bytes[idx] = np.where(copy, nbytes[idx] * ratio, nbytes[idx])
    # -- GPU tasks without shapes: by class and phase
    rest = local & ~has
    dtoh = kind == "memcpy"  # a copy to the host keeps its time (the names of copies alone)
    cp = np.flatnonzero(dtoh)
    dtoh[cp] = ["dtoh" in names[i].lower().replace(" ", "") for i in cp.tolist()]
    scaled = rest & np.isin(phase, SCALED_PHASES) & ~dtoh
    fixed = np.minimum(dur, t0)
    new[scaled] = fixed[scaled] + (dur[scaled] - fixed[scaled]) * s * r
    new_bytes[scaled & (kind != "kernel")] *= s * r
    # the optimizer's tasks keep their time and bytes (FIXED_PHASES), whatever their shapes
    # said (the roofline's calibration above still reads them)
    keep = local & np.isin(phase, FIXED_PHASES)
    new[keep] = dur[keep]
    new_bytes[keep] = nbytes[keep]
    # collectives of activations grow with the batch (PER_SAMPLE_COMM), the rest keep
    a2a = (kind == "comm") & ~np.isin(phase, FIXED_PHASES)
    comm = np.flatnonzero(a2a)  # the names of the collectives alone are searched
    a2a[comm] = [any(k in names[i].lower() for k in PER_SAMPLE_COMM) for i in comm.tolist()]
    new[a2a] = fixed[a2a] + (dur[a2a] - fixed[a2a]) * s * r
    new_bytes[a2a] *= s * r
    if a2a.any():
        notes.append(f"batch: {int(a2a.sum())} collectives that move activations (all-to-all, "
                     "send/recv) scale their time above the fixed cost with the batch; "
                     "all-reduce and the other parameter-sized collectives keep theirs")
    # -- the CPU side: data loading scales, every other op keeps its host cost
    dl = np.isin(kind, ["api", "host"]) & (phase == "data_loading")
    new[dl] = dur[dl] * s
    for c in sorted({m for m in m_idx} - set(frac)):
        notes.append(f"batch: no {c} kernel of this trace is mostly work; its kernels are "
                     "taken to reach their roofline")
    rb_all = np.full(n, np.nan)
    rn_all = np.full(n, np.nan)
    rb_all[idx], rn_all[idx] = r_b, r_n
    if seq_arg is not None:
        which = (f"every non-parameter dim of {traced_seq}, or {b * traced_seq} (batch and "
                 "length flattened)" if seq_arg[2] else
                 f"every non-parameter dim of {b * traced_seq} (batch and length flattened)")
        notes.append(f"batch: sequence length {traced_seq} -> {seq} ({r:g}x): {which} grows "
                     "with it, the sequence's pairs (attention scores, pair features) twice")
    return BatchModel(b, size, how, np.rint(new).astype(np.int64),
                      np.rint(new_bytes).astype(np.int64), (local & (has | scaled) & ~keep) | a2a,
                      math,
                      has, t0, t0_how, frac, rb_all, rn_all, notes)


@register("batch", example="batch(size=64)")
def batch(g: Graph, ctx: Context, *, size: int, traced: int = 0, seq: int = 0,
          traced_seq: int = 0) -> Graph:
    """The same job at batch SIZE, from a trace at another batch (TRACED; 0: read from the
    leading dimension of the inputs the trace recorded shapes for); for a sequence model
    whose length changes too, at length SEQ from the traced length TRACED_SEQ (both or
    neither).

    Every GPU kernel keeps its place; its time follows its own op's work (FLOPs and bytes
    from the recorded input shapes: every non-parameter tensor scales with the batch, and
    with the length once per dim along the sequence) on a roofline per kernel calibrated on
    the trace itself (transforms/roofline.py): a fixed launch-to-finish cost, then the op's
    work at the fraction of its roofline the kernel reached in the trace, bounded by the
    device memory's bandwidth where the op's working set outgrows the L2 at the new batch.
    Kernels without shapes scale their work above the fixed cost with the batch. What does
    not grow with the batch keeps its time: the weight update (optimizer kernels work on
    parameters, gradients and optimizer state), weight casts, and the parameter-sized
    collectives (all-reduce, reduce-scatter, all-gather); all-to-all and send/recv move
    activations and grow. Copies scale with their op's bytes. The number of ops and the host
    cost of each stay; data-loading CPU time scales with the batch. A note gives the
    predicted peak device memory and says when it would not fit the GPU."""
    m = predict(g, ctx, size, traced, seq=seq, traced_seq=traced_seq)
    g2 = g.set_duration(m.gpu, m.new_dur_ns)
    dl = np.isin(g.task["kind"].to_numpy(), ["api", "host"]) & (
        g.task["phase"].fill_null("other").to_numpy() == "data_loading")
    if dl.any():
        g2 = g2.set_duration(dl, m.new_dur_ns)
    copies = m.gpu & (g.task["kind"].to_numpy() != "kernel")
    if copies.any():
        g2 = g2.set_bytes(copies, m.new_bytes)
    old = float(g.task["dur_ns"].to_numpy()[m.gpu].sum())
    newt = float(m.new_dur_ns[m.gpu].sum())
    fr = ", ".join(f"{c} {v:.2f}" for c, v in sorted(m.fraction.items()))
    ctx.notes.append(
        f"batch: traced at {m.traced} ({m.how}), predicted at {m.size} ({m.size / m.traced:g}x); "
        f"{int(m.with_shapes.sum())} of {int(m.gpu.sum())} GPU tasks sized from their op's "
        f"shapes; fixed cost {m.fixed_ns / 1e3:.2f} us ({m.fixed_how}); typical fraction of "
        f"the roofline by class: {fr or 'none'}; GPU work {old / 1e6:.2f} -> "
        f"{newt / 1e6:.2f} ms over the trace"
        + ("; the traced batch: unchanged" if m.size == m.traced else ""))
    ctx.notes.extend(m.notes)
    ctx.notes.extend(memory.notes(g, ctx, "batch", batch_scale=m.size / m.traced,
                                  batch=(m.traced, m.size), ranges=wk.ranges_of(ctx)))
    return g2
