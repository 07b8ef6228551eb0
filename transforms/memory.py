"""The peak device memory of a training step, from the trace's recorded shapes: what
``batch``, ``checkpointing``, ``offload``, ``amp`` and ``gpu`` say about memory in their notes.

The profiler's memory events (``[memory]`` instant events, ``profile_memory=True``) would give
the measured peak, but ingest does not keep them (they are counted as skipped instant
events), so the step is sized from the shapes (``step_memory``):

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
    """The step's memory from the range table's shapes (None: the trace records none)."""
    if ranges is None or "input_dims" not in ranges.column_names or \
            pc.all(pc.is_null(ranges["input_dims"])).as_py():
        return None
    it = g.iteration  # in iteration order (a small table: no Polars sort)
    iters = sorted(zip(it["iteration"].to_list(), it["start_ns"].to_list(),
                       it["end_ns"].to_list(), strict=True))
    iters = [(s, e) for _, s, e in iters]
    first = _first_iteration(ranges, iters)
    names = ranges["name"].to_pylist()
    dims = ranges["input_dims"].to_pylist()
    types = ranges["input_types"].to_pylist() if "input_types" in ranges.column_names \
        else [None] * len(names)
    ids = ranges["range_id"].to_numpy()
    parent = pc.fill_null(ranges["parent"], -1).to_numpy()
    seq = ranges["sequence_number"].to_pylist() if "sequence_number" in \
        ranges.column_names else [None] * len(names)
    fwd_tid = ranges["fwd_thread_id"].to_pylist() if "fwd_thread_id" in \
        ranges.column_names else [None] * len(names)
    params = wk.param_shapes(ranges)
    pos = {int(r): i for i, r in enumerate(ids)}
    # parameters: outermost parameter-owning ops of the first iteration
    p_bytes = 0
    for i in np.flatnonzero(first):
        pi = PARAM_INPUTS.get(names[i])
        if pi is None:
            continue
        j = pos.get(int(parent[i]))
        if j is not None and names[j] in PARAM_INPUTS:
            continue
        ins = wk.tensors(dims[i], types[i])
        p_bytes += sum(t.nbytes for k in pi if k < len(ins) and ins[k] for t in ins[k])
    # activations: outermost differentiable forward ops (a sequence number, no forward
    # thread id: Kineto writes one on backward ops)
    diff = np.asarray([s is not None and (f is None or f == 0)
                       for s, f in zip(seq, fwd_tid, strict=True)], bool)
    saves = np.asarray([n not in SAVES_NOTHING for n in names], bool)
    task_layer = _range_layers(g)
    acts = 0
    per_layer: dict[str, int] = {}
    layer_in: dict[str, int] = {}
    for i in np.flatnonzero(first & diff):
        j = pos.get(int(parent[i]))
        if j is not None and diff[j]:
            continue
        if not saves[i]:
            continue
        b = sum(t.nbytes for ts in wk.tensors(dims[i], types[i]) if ts for t in ts
                if t.key() not in params and t.dims)
        acts += b
        layer = task_layer.get(int(ids[i]))
        if layer is not None:
            per_layer[layer] = per_layer.get(layer, 0) + b
            if layer not in layer_in:
                first_in = next((ts[0] for ts in wk.tensors(dims[i], types[i]) if ts), None)
                layer_in[layer] = first_in.nbytes if first_in is not None else 0
    training = bool((g.array("phase") == "backward").any())
    opt = _optimizer(names)
    states = OPTIMIZER_STATES.get(opt, 0) if training else 0
    how = (f"parameters from {'the trace' if p_bytes else 'no'} weight shapes; "
           f"{'training' if training else 'no backward pass'}; optimizer "
           f"{opt or 'none seen'} ({states} state tensors per parameter)")
    return StepMemory(p_bytes, p_bytes if training else 0, states * p_bytes, acts,
                      per_layer, layer_in, how)


def _optimizer(names: list[str]) -> str | None:
    for n in dict.fromkeys(names):
        m = _OPT_RE.match(n or "")
        if m:
            return m.group(1).lower()
    return None


def _range_layers(g) -> dict[int, str]:
    """Range id -> layer, from the CPU tasks labelled with both."""
    return {r: la for r, la in zip(g.task["range_id"].to_list(), g.task["layer"].to_list(),
                                   strict=True) if r is not None and la is not None}


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
          offloaded_bytes: int = 0, amp: bool = False) -> list[str]:
    """One note: the predicted peak device memory of a step after WHAT and the optimizations
    before it in the chain (``ctx.memory`` keeps what they did), and whether it fits the
    device (``ctx.device``); where the trace records no shapes, a note saying so."""
    state = ctx.memory
    state["batch_scale"] = state.get("batch_scale", 1.0) * batch_scale
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
