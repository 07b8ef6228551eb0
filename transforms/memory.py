"""The peak device memory of a training step: measured from the allocator's records where the
trace has them (the report's memory view), and estimated from the trace's recorded shapes
(what ``batch``, ``checkpointing``, ``offload``, ``amp`` and ``gpu`` say about memory in their
notes).

Measured (``measured``): the profiler's ``[memory]`` records (``profile_memory=True``), the
``memory`` activity table, give per device the peak allocated and reserved bytes, per
iteration and over the trace. A prediction's peak (``predicted_peak``) follows only from a
stated rule: under ``batch`` what a step builds up above its start (the activations forward
keeps for backward, and the step's temporaries) scales with the batch (``BATCH_RULE``); every
other optimization is said not to be modelled, with why (``NOT_MODELED``), rather than given
a number.

Estimated (``step_memory``), for traces without those records: the step is sized from the
shapes:

- parameters: the weight and bias inputs of the parameter-owning ops of the first iteration
  (``graphstore.params``); gradients as many bytes where the trace has a backward pass;
  optimizer state by the optimizer the trace steps (``Optimizer.step#Adam.step``: Adam and
  AdamW keep two moments, SGD with momentum and Adagrad one: ``OPTIMIZER_STATES``);
- activations: what autograd keeps for the backward pass, taken as the non-parameter tensor
  inputs of the outermost differentiable ops of the first iteration's forward (ops with a
  sequence number that are not inside another one), each op once, less the ops whose
  gradient needs none of their inputs (``SAVES_NOTHING``);
- the peak is their sum: the activations are all alive when the backward pass starts.

Under a what-if the activations change (``notes``): ``batch`` scales them with the batch;
``checkpointing`` keeps, of each checkpointed layer, only its input (plus one layer's
activations recomputed at a time); ``offload`` drops the offloaded inputs; ``amp`` halves the
floating-point activations and adds an FP16 copy of the weights. A note says when the peak
would not fit the device's memory (``totalGlobalMem`` of its deviceProperties, else the GPU
table's figure). Allocator caching, workspaces and fragmentation are not modelled: the
figure is a lower bound of what the caching allocator reserves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from daydream.base.columns import is_in, matching, numpy_filled
from daydream.graphstore.params import PARAM_INPUTS
from daydream.transforms import hardware as hw
from daydream.transforms import work as wk

GIB = 1 << 30
# optimizer -> state tensors kept per parameter (torch.optim docs: Adam/AdamW exp_avg and
# exp_avg_sq; SGD momentum_buffer when momentum > 0; Adagrad sum; RMSprop square_avg)
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "lamb": 2, "sgd": 1, "adagrad": 1, "rmsprop": 1}
_OPT_RE = re.compile(r"^Optimizer\.step#(\w+?)\.step", re.IGNORECASE)
# Differentiable ops whose backward needs none of their input tensors (only sizes, or
# nothing): PyTorch's tools/autograd/derivatives.yaml gives their gradients from the
# incoming gradient alone (additions, copies and casts, views and reshapes, concatenation,
# sums and means, fills). Their inputs are not counted as kept activations.
SAVES_NOTHING = frozenset(
    f"aten::{n}" for n in (
        "add", "add_", "sub", "sub_", "copy_", "to", "_to_copy", "clone", "contiguous",
        "cat", "stack", "view", "reshape", "_reshape_alias", "permute", "transpose",
        "transpose_", "t", "expand", "expand_as", "slice", "select", "unsqueeze", "squeeze",
        "flatten", "unflatten", "neg", "fill_", "zero_", "detach", "alias", "split",
        "split_with_sizes", "chunk", "narrow", "unbind", "sum", "mean", "repeat",
        "as_strided", "_unsafe_view", "lift_fresh", "masked_fill", "masked_fill_",
        "index_select", "flip", "roll", "pad", "constant_pad_nd"))


@dataclass
class StepMemory:
    """Bytes of one step's parameters, gradients, optimizer state and activations."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    layer_activations: dict[str, int] = field(default_factory=dict)
    layer_inputs: dict[str, int] = field(default_factory=dict)
    how: str = ""

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + \
            self.activations_bytes


def _first_iteration(ranges: pa.Table, iterations: list[tuple[int, int]]) -> np.ndarray:
    start = ranges["start_ns"].to_numpy()
    if not iterations:
        return np.ones(len(start), bool)
    s, e = iterations[0]
    return (start >= s) & (start < e)


def step_memory(g, ranges: pa.Table | None) -> StepMemory | None:
    """The step's memory from the range table's shapes (None: the trace records none).

    The rows the model counts are picked by Arrow masks over the whole table (the first
    iteration's, outermost of their kind); only those leave Arrow: a Python loop over every
    range (some 1,700 on a DLRM rank) cost as much as the rest of an ``amp`` rewrite's notes."""
    if ranges is None or "input_dims" not in ranges.column_names or \
            pc.all(pc.is_null(ranges["input_dims"])).as_py():
        return None
    it = g.arrow("iteration")  # a small table: no Polars sort
    iters = sorted(zip(it["iteration"].to_pylist(), it["start_ns"].to_pylist(),
                       it["end_ns"].to_pylist(), strict=True))
    iters = [(s, e) for _, s, e in iters]
    first = _first_iteration(ranges, iters)
    name = ranges["name"]
    is_param = is_in(name, PARAM_INPUTS)
    # differentiable forward ops: a sequence number, no forward thread id (Kineto writes one
    # on backward ops)
    diff = np.zeros(ranges.num_rows, bool)
    if "sequence_number" in ranges.column_names:
        fwd = (pc.or_kleene(pc.is_null(ranges["fwd_thread_id"]),
                            pc.equal(ranges["fwd_thread_id"], 0))
               if "fwd_thread_id" in ranges.column_names else True)
        diff = numpy_filled(pc.and_kleene(pc.is_valid(ranges["sequence_number"]), fwd), False)
    saves = ~is_in(name, SAVES_NOTHING)
    up = _parent_rows(ranges)
    has_up = up >= 0
    up = np.maximum(up, 0)
    # parameters: outermost parameter-owning ops of the first iteration
    p_rows = np.flatnonzero(first & is_param & ~(has_up & is_param[up]))
    # activations: outermost differentiable forward ops of the first iteration, less those
    # whose gradient keeps none of their inputs
    a_rows = np.flatnonzero(first & diff & ~(has_up & diff[up]) & saves)
    p_bytes = 0
    for n, d, t in _rows(ranges, p_rows, ("name", "input_dims", "input_types")):
        ins = wk.tensors(d, t)
        p_bytes += sum(x.nbytes for k in PARAM_INPUTS[n] if k < len(ins) and ins[k]
                       for x in ins[k])
    params = wk.param_shapes(ranges)
    a_ids = ranges["range_id"].take(pa.array(a_rows, pa.int64())).to_pylist()
    task_layer = _range_layers(g, a_ids)
    acts = 0
    per_layer: dict[str, int] = {}
    layer_in: dict[str, int] = {}
    for rid, (d, t) in zip(a_ids, _rows(ranges, a_rows, ("input_dims", "input_types")),
                           strict=True):
        ins = wk.tensors(d, t)
        b = sum(x.nbytes for ts in ins if ts for x in ts if x.key() not in params and x.dims)
        acts += b
        layer = task_layer.get(rid)
        if layer is not None:
            per_layer[layer] = per_layer.get(layer, 0) + b
            if layer not in layer_in:
                first_in = next((ts[0] for ts in ins if ts), None)
                layer_in[layer] = first_in.nbytes if first_in is not None else 0
    training = bool((g.array("phase") == "backward").any())
    opt = _optimizer(name)
    states = OPTIMIZER_STATES.get(opt, 0) if training else 0
    how = (f"parameters from {'the trace' if p_bytes else 'no'} weight shapes; "
           f"{'training' if training else 'no backward pass'}; optimizer "
           f"{opt or 'none seen'} ({states} state tensors per parameter)")
    return StepMemory(p_bytes, p_bytes if training else 0, states * p_bytes, acts,
                      per_layer, layer_in, how)


def _parent_rows(ranges: pa.Table) -> np.ndarray:
    """Per range, the row of its parent range in RANGES (-1: none, or not among them)."""
    n = ranges.num_rows
    ids = ranges["range_id"].to_numpy()
    parent = numpy_filled(ranges["parent"], -1)
    if n and ids[0] == 0 and (np.diff(ids) == 1).all():  # ids are row numbers (ingest's)
        return np.where((parent >= 0) & (parent < n), parent, -1)
    pos = wk.range_rows(ranges)
    return np.fromiter((pos.get(p, -1) for p in parent.tolist()), np.int64, n)


def _rows(ranges: pa.Table, rows: np.ndarray, columns: tuple[str, ...]):
    """The values of COLUMNS (a missing one as None) at ROWS, as tuples."""
    take = pa.array(rows, pa.int64())
    cols = [wk.pylist(ranges[c].take(take)) if c in ranges.column_names else [None] * len(rows)
            for c in columns]
    return zip(*cols, strict=True)


def _optimizer(name: pa.ChunkedArray) -> str | None:
    """The optimizer of the first range named ``Optimizer.step#X.step`` (_OPT_RE), each
    distinct name matched once (``base.columns.matching``)."""
    rows = np.flatnonzero(matching(name, _OPT_RE.match))
    if not len(rows):
        return None
    return _OPT_RE.match(name[int(rows[0])].as_py()).group(1).lower()


def _range_layers(g, range_ids: list[int]) -> dict[int, str]:
    """Range id -> layer for RANGE_IDS, from the CPU tasks labelled with both (the last such
    task's layer where several share a range)."""
    rid = g.array("range_id", -1)
    layer = g.array("layer")
    rows = np.flatnonzero(np.isin(rid, np.asarray(range_ids, np.int64)) & (layer != None))  # noqa: E711
    return dict(zip(rid[rows].tolist(), layer[rows].tolist(), strict=True))


def device_bytes(ctx_device: dict | None) -> int | None:
    """The device's memory: the trace's totalGlobalMem, else the GPU table's."""
    if not ctx_device:
        return None
    v = ctx_device.get("totalGlobalMem")
    if isinstance(v, (int, float)) and v > 0:
        return int(v)
    d = hw.device_from_properties(ctx_device)
    return d.memory_bytes if d is not None else None


def predicted(m: StepMemory, *, batch_scale: float = 1.0,
              checkpointed: list[str] | None = None, offloaded_bytes: int = 0,
              amp: bool = False) -> int:
    """The step's peak under a what-if (module doc)."""
    acts = m.activations_bytes * batch_scale
    params = m.params_bytes
    if checkpointed:
        kept = sum(m.layer_inputs.get(x, 0) for x in checkpointed)
        dropped = sum(m.layer_activations.get(x, 0) for x in checkpointed)
        biggest = max((m.layer_activations.get(x, 0) for x in checkpointed), default=0)
        acts = acts - (dropped - kept) * batch_scale + biggest * batch_scale
    acts -= offloaded_bytes
    extra = 0
    if amp:
        acts = acts / 2
        extra = params // 2
    return int(max(acts, 0) + params + m.grads_bytes + m.optimizer_bytes + extra)


def notes(g, ctx, what: str, *, ranges: pa.Table | None = None, batch_scale: float = 1.0,
          checkpointed: list[str] | None = None,
          offloaded_bytes: int = 0, amp: bool = False,
          batch: tuple[int, int] | None = None) -> list[str]:
    """One note: the predicted peak device memory of a step after WHAT and the optimizations
    before it in the chain (``ctx.memory`` keeps what they did: BATCH, the traced and the new
    batch size, for ``predicted_peak``), and whether it fits the device (``ctx.device``); where
    the trace records no shapes, a note saying so."""
    state = ctx.memory
    state["batch_scale"] = state.get("batch_scale", 1.0) * batch_scale
    if batch is not None:
        state["batches"] = [*state.get("batches", []), batch]
    state["checkpointed"] = sorted(set(state.get("checkpointed", [])) |
                                   set(checkpointed or []))
    state["offloaded_bytes"] = state.get("offloaded_bytes", 0) + offloaded_bytes
    state["amp"] = state.get("amp", False) or amp
    m = step_memory(g, ranges)
    if m is None:
        return [f"memory after {what}: not predicted (the trace records no input shapes)"]
    peak = predicted(m, batch_scale=state["batch_scale"],
                     checkpointed=state["checkpointed"],
                     offloaded_bytes=int(state["offloaded_bytes"] * state["batch_scale"]),
                     amp=state["amp"])
    base = m.total_bytes
    cap = device_bytes(ctx.device)
    fit = "" if cap is None else (
        f" of {cap / GIB:.1f} GiB" + ("" if peak <= cap else
                                       ": would likely NOT fit the device's memory"))
    return [f"memory after {what}: predicted peak {peak / GIB:.2f} GiB{fit} (traced step "
            f"{base / GIB:.2f} GiB: parameters {m.params_bytes / GIB:.2f}, gradients "
            f"{m.grads_bytes / GIB:.2f}, optimizer state {m.optimizer_bytes / GIB:.2f}, "
            f"activations {m.activations_bytes / GIB:.2f}; {m.how})"]


# ---- measured: the allocator's records --------------------------------------------------------

@dataclass(frozen=True)
class StepPeak:
    """One iteration of one device, from the allocator's records. ``growth_bytes`` is what
    the step allocated above its start at its peak (the activations forward keeps for
    backward, and the step's temporaries): from the records' totals, or where the trace has
    none from the sum of their sizes, which gives the growth exactly but not the level."""

    iteration: int
    label: str | None
    start_ns: int
    end_ns: int
    records: int                      # records inside the step
    start_allocated_bytes: int | None  # allocated when the step starts (None: no totals)
    peak_allocated_bytes: int | None   # the step's peak (None: no totals)
    peak_reserved_bytes: int | None
    growth_bytes: int                 # peak allocated minus allocated at the start, >= 0
    peak_offset_ns: int | None        # from the step's start to its peak (None: no growth)


@dataclass(frozen=True)
class DeviceMemory:
    """The allocator's records of one device (-1: the host) of one trace (or rank of a job):
    the peak over the whole trace, and per iteration of the graph."""

    device: int
    rank: int | None
    records: int
    totals: bool                      # the records carry Total Allocated (PyTorch >= 1.10)
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    peak_ns: int | None               # when the allocated peak was reached (trace clock)
    steps: tuple[StepPeak, ...] = ()

    @property
    def name(self) -> str:
        d = "CPU" if self.device < 0 else f"GPU {self.device}"
        return d if self.rank is None else f"rank {self.rank} {d}"


def measured(records: pa.Table | None, iterations: pa.Table | None = None
             ) -> list[DeviceMemory]:
    """Per device (and rank, where RECORDS, a ``memory`` activity table, has a ``rank``
    column: a job's), the peak allocated and reserved bytes the allocator's records show,
    over the trace and in each iteration of ITERATIONS (the graph's ``iteration`` table), with
    the bytes allocated at the step's start and when in the step its peak came. Empty where
    the trace has no records. The peak is of what the caching allocator handed out
    (allocated) and held from the device (reserved); memory outside it (the CUDA context,
    NCCL's buffers, cuDNN's workspace where not allocated through PyTorch) is not in the
    records."""
    if records is None or not records.num_rows:
        return []
    ts = records["ts_ns"].to_numpy()
    dev = records["device"].to_numpy().astype(np.int64)
    rank = (numpy_filled(records["rank"], -1).astype(np.int64)
            if "rank" in records.column_names else np.full(len(ts), -1, np.int64))
    nbytes = records["bytes"].to_numpy()
    alloc_ok = records["allocated_bytes"].is_valid().to_numpy(zero_copy_only=False)
    res_ok = records["reserved_bytes"].is_valid().to_numpy(zero_copy_only=False)
    alloc = numpy_filled(records["allocated_bytes"], 0)
    res = numpy_filled(records["reserved_bytes"], 0)
    out = []
    for r, d in sorted(set(zip(rank.tolist(), dev.tolist(), strict=True))):
        sel = np.flatnonzero((rank == r) & (dev == d))
        sel = sel[np.argsort(ts[sel], kind="stable")]  # the file's order within one time
        its = _iterations_of(iterations, None if r < 0 else r)
        out.append(_device_memory(d, None if r < 0 else r, ts[sel], nbytes[sel],
                                  alloc[sel], alloc_ok[sel], res[sel], res_ok[sel], its))
    return out


def _iterations_of(iterations: pa.Table | None, rank: int | None) -> list[tuple]:
    """(iteration, label, start_ns, end_ns) of a trace's steps, in order (a job's table
    holds each rank's; a multi-device trace's, one copy per device: one is taken)."""
    if iterations is None or not iterations.num_rows:
        return []
    rows = iterations.to_pylist()
    if rank is not None and "rank" in iterations.column_names:
        rows = [x for x in rows if x["rank"] == rank]
    seen: dict[int, tuple] = {}
    for x in rows:
        seen.setdefault(x["iteration"], (x["iteration"], x.get("label"), x["start_ns"],
                                         x["end_ns"]))
    return [seen[k] for k in sorted(seen)]


def _device_memory(device: int, rank: int | None, ts: np.ndarray, nbytes: np.ndarray,
                   alloc: np.ndarray, alloc_ok: np.ndarray, res: np.ndarray,
                   res_ok: np.ndarray, its: list[tuple]) -> DeviceMemory:
    totals = bool(alloc_ok.all())
    # the level after each record, and before the first: the totals where the trace has
    # them (each record's total includes its own size), else the running sum of the sizes
    if totals:
        level = alloc.astype(np.int64)
        before_first = int(level[0] - nbytes[0])
    else:
        level = np.cumsum(nbytes.astype(np.int64))
        before_first = 0
    peak_alloc = peak_ns = None
    if totals:
        k = int(np.argmax(level))
        peak_alloc, peak_ns = int(level[k]), int(ts[k])
    peak_res = int(res[res_ok].max()) if res_ok.any() else None
    steps = []
    for it, label, start, end in its:
        lo = int(np.searchsorted(ts, start, "left"))
        hi = int(np.searchsorted(ts, end, "left"))
        before = int(level[lo - 1]) if lo > 0 else before_first
        peak, offset = before, None
        if hi > lo:
            k = lo + int(np.argmax(level[lo:hi]))
            if level[k] > before:
                peak, offset = int(level[k]), int(ts[k] - start)
        # reserved: what the allocator held when the step started, and within it
        held = int(res[lo:hi][res_ok[lo:hi]].max(initial=-1))
        if lo > 0 and res_ok[lo - 1]:
            held = max(held, int(res[lo - 1]))
        held_res = held if held >= 0 else None
        steps.append(StepPeak(int(it), label, int(start), int(end), hi - lo,
                              before if totals else None, peak if totals else None,
                              held_res, peak - before, offset))
    return DeviceMemory(device, rank, len(ts), totals, peak_alloc, peak_res, peak_ns,
                        tuple(steps))


# ---- predicted: a rule, or why there is none ------------------------------------------------

# Why the allocator's records give no predicted peak under each optimization other than
# ``batch``: no number is made up where no rule was stated. (The shape-based estimate of
# ``notes`` is a different thing: a lower bound from the recorded shapes, in the notes.)
NOT_MODELED = {
    "amp": "the records do not say which allocations are FP32 activations (which FP16 "
           "halves), nor size the FP16 weight copies it adds",
    "checkpointing": "the records do not say which allocations each layer keeps for the "
                     "backward pass",
    "offload": "the records do not say which allocations are the offloaded layers' inputs",
    "cuda_graphs": "a captured graph allocates from a private pool that the records of an "
                   "uncaptured run do not size",
    "gpu": "another GPU's libraries choose other workspaces, and its allocator other blocks",
    "fusion": "the records do not say which allocations were the fused kernels' "
              "intermediates",
    "bn_restructure": "the records do not say which allocations were the intermediates the "
                      "fused passes drop",
    "fused_optimizer": "a fused optimizer drops per-parameter temporaries that the records "
                       "do not tell apart",
    "ddp": "gradient buckets and communication buffers are not in a single-GPU trace's "
           "records",
    "dataloader": "no rule states that the device's allocations stay as measured when the "
                  "loading moves to worker processes",
    "no_profiler": "no rule states that the device's allocations stay as measured without "
                   "the profiler",
}
for _n in ("fused_adam", "fused_adamw", "fused_sgd", "fused_adagrad"):
    NOT_MODELED[_n] = NOT_MODELED["fused_optimizer"]
for _n in ("world", "bandwidth", "blueconnect", "p3", "dgc", "qsgd", "local_sgd"):
    NOT_MODELED[_n] = "communication buffers (buckets, slices, compressed gradients) are not " \
                      "sized from the records"
NOT_MODELED_ELSE = "no rule relates it to the allocator's records"
BATCH_RULE = ("batch(size=N) from a trace at batch b: each step's peak allocated = the bytes "
              "allocated at the step's start (parameters, gradients, optimizer state: kept) + "
              "its growth above that start (what forward builds up: activations and "
              "temporaries) x N/b; the predicted peak is the largest over the steps the "
              "replay uses. Reserved bytes (the caching allocator's segments and "
              "fragmentation) are not predicted.")


@dataclass(frozen=True)
class PredictedPeak:
    """One device's peak under one optimization spec: ``peak_allocated_bytes`` and
    ``growth_bytes`` where a rule applies (the peak None where the records carry no totals:
    only the growth is known), else both None; ``rule`` says which rule, or "not modeled:
    <why>"."""

    spec: str
    device: DeviceMemory
    peak_allocated_bytes: int | None
    growth_bytes: int | None
    rule: str
    step: StepPeak | None = None  # the measured step the prediction is of

    @property
    def modeled(self) -> bool:
        return self.growth_bytes is not None


def predicted_peak(dev: DeviceMemory, spec: str, state: dict | None = None,
              used: set[int] | None = None) -> PredictedPeak:
    """The peak allocated bytes of DEV under SPEC, by the one stated rule (``BATCH_RULE``):
    under ``batch(size=N)``, whose transform found the traced batch b (``state``: the
    chain's ``Context.memory``, where ``notes`` kept (b, N)), each step's growth above its
    start scales by N/b and its start stays, and the peak is the largest over the steps
    USED (iteration indices; None: every step). A chain of batches scales by the product.
    Any other optimization in the chain, host memory, a trace whose steps hold no records,
    or a batch whose traced size is unknown: "not modeled", with why, and no number."""
    from daydream.transforms.spec import parse

    names = list(dict.fromkeys(t.name for t in parse(spec)))
    others = [n for n in names if n != "batch"]
    if others:
        why = "; ".join(f"{n}: {NOT_MODELED.get(n, NOT_MODELED_ELSE)}" for n in others)
        return PredictedPeak(spec, dev, None, None, f"not modeled: {why}")
    if dev.device < 0:
        return PredictedPeak(spec, dev, None, None, "not modeled: host memory (the rule is "
                             "stated for a device's activations)")
    batches = (state or {}).get("batches") or []
    if not batches:
        return PredictedPeak(spec, dev, None, None, "not modeled: the batch transform did "
                             "not say the batch the trace ran at")
    scale = 1.0
    for traced, size in batches:
        scale *= size / traced
    steps = [s for s in dev.steps if s.records and (used is None or s.iteration in used)]
    if not steps:
        return PredictedPeak(spec, dev, None, None, "not modeled: no step the replay uses "
                             "holds allocator records of this device")
    sizes = ", then ".join(f"{b} -> {n}" for b, n in batches)
    if not dev.totals:
        s = max(steps, key=lambda s: s.growth_bytes)
        return PredictedPeak(spec, dev, None, int(round(s.growth_bytes * scale)),
                             f"batch {sizes} (x{scale:g}): the step's growth above its "
                             "start scales; the records carry no totals, so the level "
                             "(and the peak) is not known", s)
    s = max(steps, key=lambda s: s.start_allocated_bytes + s.growth_bytes * scale)
    growth = int(round(s.growth_bytes * scale))
    return PredictedPeak(spec, dev, s.start_allocated_bytes + growth, growth,
                         f"batch {sizes} (x{scale:g}): the allocated bytes at the start of "
                         f"{s.label or f'iteration {s.iteration}'} kept, its growth above "
                         f"them x{scale:g}", s)
