"""The work of the operators a trace recorded shapes for (``record_shapes=True``): FLOPs and
bytes per op at the traced batch and at another one, and the op each GPU task ran for.

An op is a range of the activity table with ``input_dims`` / ``input_types`` (the profiler's
"Input Dims" and "Input type"). A GPU task belongs to the innermost op with recorded tensor
inputs that encloses the call that launched it: the call's own range (``task.range_id``),
else the nearest ancestor that has shapes (``aten::copy_`` inside ``aten::to``: the copy).

Work of one op (``op_work``), from its inputs and the output its kind implies:
- matrix products (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``matmul``, ``linear``): FLOPs
  ``2*M*N*K`` (times the batch of a batched product), output ``M x N``;
- convolutions (``convolution``, ``cudnn_convolution``, ``conv2d``, ...): FLOPs
  ``2 * N * C_out * prod(out spatial) * C_in/groups * prod(kernel)`` with the output size from
  the recorded stride, padding and dilation (``Concrete Inputs`` are not kept by ingest, so a
  stride-1 "same" output is assumed: exact for the 1x1 and padded 3x3 convolutions of the
  shared traces' transformers, an over-count for strided ones); ``convolution_backward``
  twice that (input and weight gradients), outputs the input's and the weight's sizes;
- reductions (``sum``, ``mean``, ``max``, ``norm``, ``_local_scalar_dense``, losses, ...):
  output negligible;
- in-place ops (``add_``, ``masked_fill_``): the output is input 0, read and written
  (``copy_``, ``fill_``, ``zero_`` only write it);
- every other op: an output the size of its largest input, one FLOP per output element.
Bytes are inputs plus output; an op's working set is its bytes (what a kernel touches).

Batch scaling (``scale``): every tensor that is not a parameter scales with the batch; the
parameters are the tensors whose shape (size-1 dims dropped, in either order) is the shape
of a weight or bias input of a parameter-owning op in the trace (``graphstore.params``
PARAM_INPUTS: convolutions, linear layers, normalizations, embeddings), which also catches
autocast's weight casts (``copy_`` of a weight) and broadcast biases (``[1, C, 1, 1]``).
An op's FLOPs scale when any of its inputs does (the batch is an outer or a contracted
dimension of a product, never both operands' own); its output scales unless it has a
parameter's shape (a weight gradient ``mm``). A batch size that equals a parameter
dimension can make a batch-sized activation look like a parameter (``[128, 128]`` at batch
128); the count of such ambiguous tensors is reported.

Sequence scaling (``seq``, for a sequence model whose length changes too): a non-parameter
tensor also grows by the length ratio once per dim equal to the traced length (or to batch x
length, a flattened ``[B*L, D]``): ``[B, L, D]`` once, attention scores ``[B, H, L, L]``
twice; an op's FLOPs grow with its tensor that has the most such dims (``QK^T``: its output;
``scores @ V``: its input); a dim holding the sequence's pairs flattened (``L*L``, or a
symmetric pair feature's triangle ``L(L+1)/2``) grows twice. A weight or hidden dim that equals
the length is taken for the length too (pass a length no dim of the model shares where it can
be chosen); where a parameter has a dim of the traced length, only the unambiguous forms
(batch x length, the pairs) count, and ``batch`` says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from daydream.base.columns import is_in
from daydream.base.errors import DaydreamError
from daydream.base.memo import per_table
from daydream.graphstore.params import DTYPE_BYTES, PARAM_INPUTS

# bytes per element of the dtype names Kineto records, beyond graphstore.params' float types
ELEM_BYTES = {**DTYPE_BYTES, "long int": 8, "long": 8, "int": 4, "unsigned int": 4,
              "short int": 2, "short": 2, "bool": 1, "unsigned char": 1, "signed char": 1,
              "c10::complex<float>": 8, "c10::complex<double>": 16}
DEFAULT_ELEM_BYTES = 4  # an unnamed dtype: FP32, as graphstore.params assumes

_MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
           "aten::linear", "aten::addbmm", "aten::_addmm_activation"}
_CONV = re.compile(r"^aten::(_?convolution|cudnn_convolution|miopen_convolution|conv[123]d|"
                   r"conv_transpose[123]d|mkldnn_convolution|cudnn_convolution_relu|"
                   r"cudnn_convolution_add_relu)$")
_CONV_BWD = re.compile(r"^aten::(convolution_backward|cudnn_convolution_backward\w*|"
                       r"miopen_convolution_backward\w*)$")
_REDUCTION = re.compile(r"^aten::(sum|mean|max|min|amax|amin|argmax|argmin|norm|"
                        r"linalg_vector_norm|var|std|var_mean|std_mean|any|all|prod|"
                        r"_local_scalar_dense|item|nll_loss\w*|cross_entropy\w*|"
                        r"mse_loss|l1_loss|count_nonzero|nonzero)$")
_WRITE_ONLY = {"aten::copy_", "aten::fill_", "aten::zero_", "aten::normal_", "aten::uniform_",
               "aten::bernoulli_", "aten::random_", "aten::index_put_", "aten::_index_put_impl_"}


@dataclass(frozen=True)
class Tensor:
    dims: tuple[int, ...]
    elem_bytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.dims)  # exact, and 1 for a scalar's ()

    @property
    def nbytes(self) -> int:
        return self.numel * self.elem_bytes

    def key(self) -> tuple[int, ...]:
        """The shape without size-1 dims: what a parameter's views share."""
        return tuple(d for d in self.dims if d != 1)


def pylist(col: pa.ChunkedArray | pa.Array) -> list:
    """A column's values as Python objects, a dictionary-encoded one (the range table's
    names) decoded first: pyarrow builds a scalar per value of a dictionary array, 25x
    slower (2 ms for the 1,673 ranges of a DLRM rank)."""
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    return col.to_pylist()


@lru_cache(maxsize=1 << 16)
def tensors(dims_json: str | None, types_json: str | None
            ) -> tuple[tuple[Tensor, ...] | None, ...]:
    """The recorded inputs of an op: per input, its tensors (one, or a TensorList's), or
    None for a scalar or an input without a shape. Parsed once per distinct pair of strings:
    the memory model, the parameter shapes and the matrix work read the same ops, and the
    traces of one fleet record the same shapes again and again."""
    if not dims_json:
        return ()
    try:
        dims = orjson.loads(dims_json)
        types = orjson.loads(types_json) if types_json else []
    except orjson.JSONDecodeError:
        return ()
    if not isinstance(dims, list):
        return ()
    out: list[tuple[Tensor, ...] | None] = []
    for i, d in enumerate(dims):
        t = types[i] if isinstance(types, list) and i < len(types) else ""
        size = ELEM_BYTES.get(t, DEFAULT_ELEM_BYTES) if isinstance(t, str) else \
            DEFAULT_ELEM_BYTES
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            out.append((Tensor(tuple(d), size),))
        elif isinstance(d, list) and d and all(isinstance(x, list) for x in d):
            # a TensorList: its elements' types are not recorded one by one
            out.append(tuple(Tensor(tuple(x), DEFAULT_ELEM_BYTES if t == "TensorList" else size)
                             for x in d if x and all(isinstance(v, int) for v in x)) or None)
        else:
            out.append(None)
    return tuple(out)


def has_tensors(dims_json: str | None) -> bool:
    """Whether an op recorded at least one tensor input with a shape."""
    return bool(dims_json) and any(ts for ts in tensors(dims_json, None))


def param_shapes(ranges: pa.Table) -> frozenset[tuple[int, ...]]:
    """Shapes (size-1 dims dropped) of the weight and bias inputs of the trace's
    parameter-owning ops, and their reverses (a transposed weight, ``addmm``'s ``mat2``).
    Made once per range table (``base.memo``): batch and the memory notes of every spec of a
    trace ask for them."""
    if ranges is None or "input_dims" not in ranges.column_names:
        return frozenset()
    return per_table("param_shapes", ranges, _param_shapes)


def _param_shapes(ranges: pa.Table) -> frozenset[tuple[int, ...]]:
    # only the parameter-owning ops' rows leave Arrow (to_pylist costs a microsecond a value)
    ranges = ranges.filter(is_in(ranges["name"], PARAM_INPUTS))
    names = pylist(ranges["name"])
    dims = ranges["input_dims"].to_pylist()
    types = ranges["input_types"].to_pylist() if "input_types" in ranges.column_names \
        else [None] * len(dims)
    out: set[tuple[int, ...]] = set()
    for n, d, t in zip(names, dims, types, strict=True):
        pos = PARAM_INPUTS.get(n)
        if pos is None or not d:
            continue
        ins = tensors(d, t)
        for k in pos:
            if k < len(ins) and ins[k]:
                for x in ins[k]:
                    key = x.key()
                    if key:
                        out.add(key)
                        out.add(key[::-1])
    return frozenset(out)


@dataclass(frozen=True)
class Work:
    """One op's work at the traced batch (``*_b``) and at the target batch (``*_n``)."""

    flops_b: float
    bytes_b: float
    flops_n: float
    bytes_n: float
    ambiguous: int = 0  # batch-sized tensors taken for parameters (see the module doc)


def _matmul(name: str, ins: list[Tensor | None]) -> tuple[float, list[int] | None]:
    """(FLOPs, output dims) of a matrix product from its first tensors."""
    ts = [t for t in ins if t is not None]
    if name in ("aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::_addmm_activation"):
        ts = [t for t in ins[1:3] if t is not None]
    if len(ts) < 2:
        return 0.0, None
    a, b = ts[0].dims, ts[1].dims
    if not a or not b:
        return 0.0, None
    if name == "aten::linear":  # weight [N, K]
        n = b[0]
        return 2.0 * ts[0].numel * n, list(a[:-1]) + [n]
    k = a[-1]
    n = b[-1] if len(b) >= 2 else 1
    lead = list(a[:-1])
    return 2.0 * math.prod(lead) * k * n, lead + [n]


def _conv_flops(x: Tensor, w: Tensor, groups: int = 1) -> tuple[float, list[int]]:
    """FLOPs and output dims of a stride-1 'same' convolution (see the module doc)."""
    n, spatial = x.dims[0], x.dims[2:]
    c_out = w.dims[0]
    per_out = math.prod(w.dims[1:])  # C_in/groups * kernel
    out = [n, c_out] + list(spatial)
    return 2.0 * n * c_out * math.prod(spatial) * per_out, out


def seq_dims(dims: Iterable[int], seq: int, batch: int | None, plain: bool = True) -> int:
    """How many times a tensor's size follows the sequence of length SEQ: once per dim equal
    to SEQ, or to BATCH x SEQ (batch and sequence flattened into one, ``view(-1, D)``); twice
    per dim that holds the pairs of the sequence flattened (SEQ^2, or the triangle SEQ(SEQ+1)/2
    or SEQ(SEQ-1)/2 of a symmetric pair feature). PLAIN false: a dim equal to SEQ itself does
    not count (the model has a parameter dim of that size, so it may be a hidden size)."""
    flat = batch * seq if batch else -1
    pairs = {seq * seq, seq * (seq + 1) // 2, seq * (seq - 1) // 2} - {seq, flat}
    return sum(1 if (d == seq and plain) or d == flat else 2 if d in pairs else 0
               for d in dims)


def op_work(name: str, dims_json: str | None, types_json: str | None,
            params: set[tuple[int, ...]], scale: float, batch: int | None = None,
            seq: tuple[int, float] | tuple[int, float, bool] | None = None) -> Work | None:
    """The work of one op at the traced batch (BATCH, where known) and at SCALE times it;
    None where the op recorded no tensor input. SEQ: (traced length, new length over it) of
    a sequence model: a non-parameter tensor grows by that ratio once per dim along the
    sequence (``seq_dims``: attention scores ``[B, H, L, L]`` twice), and the op's FLOPs by
    the largest growth of any of its tensors."""
    ins_all = tensors(dims_json, types_json)
    if not any(ins_all):
        return None
    firsts = [ts[0] if ts else None for ts in ins_all]
    size0 = next((t.elem_bytes for t in firsts if t is not None), DEFAULT_ELEM_BYTES)

    def is_param(t: Tensor) -> bool:
        return t.key() in params

    def along(dims: Iterable[int]) -> int:
        return 0 if seq is None else seq_dims(dims, seq[0], batch,
                                              bool(seq[2]) if len(seq) > 2 else True)

    def grows(dims: Iterable[int]) -> float:
        """How much a non-parameter tensor of DIMS grows: the batch, and the sequence."""
        return scale if seq is None else scale * seq[1] ** along(dims)

    in_b = in_n = 0.0
    any_scaled = False
    ambiguous = 0
    k_top = 0  # the most sequence dims of any scaled tensor of the op: its FLOPs grow so
    for ts in ins_all:
        for t in ts or ():
            p = is_param(t)
            if p and batch is not None and batch > 1 and batch in t.dims:
                ambiguous += 1
            g = 1.0 if p or not t.dims else grows(t.dims)
            in_b += t.nbytes
            in_n += t.nbytes * g
            if not p and t.dims:
                any_scaled = True
                k_top = max(k_top, along(t.dims))
    out_b = 0.0
    out_scales = any_scaled
    out_dims_k: Iterable[int] = ()
    flops = 0.0
    if name in _MATMUL:
        flops, out_dims = _matmul(name, firsts)
        if out_dims:
            out_b = float(math.prod(out_dims)) * size0
            out_scales = any_scaled and tuple(d for d in out_dims if d != 1) not in params
            out_dims_k = out_dims
    elif _CONV.match(name) and len(firsts) >= 2 and firsts[0] and firsts[1] and \
            len(firsts[0].dims) >= 3 and len(firsts[1].dims) >= 3:
        flops, out_dims = _conv_flops(firsts[0], firsts[1])
        out_b = float(math.prod(out_dims)) * size0
        out_dims_k = out_dims
    elif _CONV_BWD.match(name) and len(firsts) >= 3 and all(firsts[:3]) and \
            len(firsts[1].dims) >= 3 and len(firsts[2].dims) >= 3:
        grad_out, x, w = firsts[:3]
        flops = 2.0 * _conv_flops(x, w)[0]
        # the input gradient scales with the batch, the weight gradient does not
        out_b = x.nbytes
        w_b = w.nbytes
        in_b += w_b
        in_n += w_b
        out_scales = any_scaled
        out_dims_k = x.dims
    elif _REDUCTION.match(name):
        out_b, out_scales = 0.0, False
        flops = max((t.numel for t in firsts if t is not None), default=0)
    else:
        big = max((t for t in firsts if t is not None), key=lambda t: t.numel)
        flops = float(big.numel)
        if name.endswith("_") and not name.endswith("__"):
            out_b = 0.0 if name in _WRITE_ONLY else float(firsts[0].nbytes) if firsts[0] \
                else 0.0
            out_dims_k = firsts[0].dims if firsts[0] else ()
        else:
            out_b = float(big.numel) * size0
            out_scales = any_scaled and not is_param(big)
            out_dims_k = big.dims
    out_dims_k = list(out_dims_k)
    if out_scales:
        k_top = max(k_top, along(out_dims_k))
    seq_top = 1.0 if seq is None else seq[1] ** k_top
    flops_n = flops * (scale * seq_top if any_scaled else 1.0)
    bytes_n = in_n + out_b * (grows(out_dims_k) if out_scales else 1.0)
    return Work(flops, in_b + out_b, flops_n, bytes_n, ambiguous)


def op_of_task(task_range: np.ndarray, ranges: pa.Table) -> np.ndarray:
    """For each range id of TASK_RANGE (-1: none), the innermost enclosing range with
    recorded tensor inputs: the range itself or its nearest such ancestor (-1: none)."""
    parent, dims, pos, memo = _range_index(ranges)

    def find(r: int) -> int:
        path = []
        while r >= 0 and r not in memo:
            i = pos.get(r)
            if i is None:
                break
            if has_tensors(dims[i]):
                memo[r] = r
                break
            path.append(r)
            r = parent[i]
        res = memo.get(r, -1) if r >= 0 else -1
        for p in path:
            memo[p] = res
        return res

    return np.asarray([find(r) if r >= 0 else -1 for r in task_range.tolist()], np.int64)


def _range_index(ranges: pa.Table) -> tuple[list[int], list, dict[int, int], dict[int, int]]:
    """A range table's parents, input dims and row of each range id, and ``op_of_task``'s
    answers so far: made once per table (``base.memo``; its shapes leaving Arrow cost a DLRM
    rank some 3 ms), where batch() asks twice a prediction and the specs of one trace share
    its table."""
    def index(t: pa.Table) -> tuple:
        ids = t["range_id"].to_pylist()
        parent = pc.fill_null(t["parent"], -1).to_pylist() if "parent" in t.column_names \
            else [-1] * len(ids)
        dims = t["input_dims"].to_pylist() if "input_dims" in t.column_names else \
            [None] * len(ids)
        return parent, dims, {r: i for i, r in enumerate(ids)}, {}
    return per_table("range_index", ranges, index)


def range_rows(ranges: pa.Table) -> dict[int, int]:
    """Range id -> its row in RANGES, made once per table (``_range_index``)."""
    return _range_index(ranges)[2]


def batch_of(ranges: pa.Table, candidates: Iterable[int]) -> tuple[int | None, str]:
    """The traced batch: the leading dimension of the first tensor input of the ops
    CANDIDATES (range ids, in trace order), the most common one; and how it was found."""
    _, dims, pos, _ = _range_index(ranges)
    names = pylist(ranges["name"])
    seen: dict[int, int] = {}
    first: tuple[int, str] | None = None
    for r in candidates:
        i = pos.get(int(r))
        if i is None:
            continue
        ins = tensors(dims[i], None)
        t = next((ts[0] for ts in ins if ts), None)
        if t is None or not t.dims:
            continue
        lead = t.dims[0]
        seen[lead] = seen.get(lead, 0) + 1
        if first is None:
            first = (lead, f"{names[i]} {list(t.dims)}")
    if not seen:
        return None, "no op with a recorded input shape"
    b = max(seen, key=lambda k: (seen[k], -list(seen).index(k)))
    return b, f"{seen[b]} of {sum(seen.values())} ops (first: {first[1]})"


@dataclass(frozen=True)
class TaskOps:
    """For each task of a graph: the op (range id, -1: none) its GPU work ran for, that op's
    name and recorded input types (None where unknown). Where no enclosing range recorded
    shapes, ``name`` is still the innermost range of the launching call (what the kernel
    classes read to tell a convolution from a matmul)."""

    op: np.ndarray
    name: list[str | None]
    types: list[str | None]


def task_ops(task_kind: np.ndarray, task_range: np.ndarray, launch_api: np.ndarray,
             launch_gpu: np.ndarray, ranges: pa.Table | None) -> TaskOps:
    """The op of every GPU task: the one enclosing its launching call (``op_of_task``).
    ``launch_api``/``launch_gpu``: the task ids joined by launch edges."""
    n = len(task_kind)
    op = np.full(n, -1, np.int64)
    names: list[str | None] = [None] * n
    types: list[str | None] = [None] * n
    if ranges is None or not len(launch_gpu):
        return TaskOps(op, names, types)
    rid = np.asarray(task_range, np.int64)[np.asarray(launch_api, np.int64)]
    gpu = np.asarray(launch_gpu, np.int64)
    pos = range_rows(ranges)
    rn = pylist(ranges["name"])
    for t, r in zip(gpu, rid, strict=True):
        i = pos.get(int(r))
        if i is not None:
            names[t] = rn[i]
    if "input_dims" not in ranges.column_names:
        return TaskOps(op, names, types)
    op[gpu] = op_of_task(rid, ranges)
    rt = ranges["input_types"].to_pylist() if "input_types" in ranges.column_names else \
        [None] * ranges.num_rows
    for t in np.flatnonzero(op >= 0):
        i = pos[int(op[t])]
        names[t], types[t] = rn[i], rt[i]
    return TaskOps(op, names, types)


def op_works(ranges: pa.Table, op_ids: Iterable[int], params: set[tuple[int, ...]],
             scale: float = 1.0, batch: int | None = None,
             seq: tuple[int, float] | tuple[int, float, bool] | None = None
             ) -> dict[int, Work]:
    """``op_work`` of each op OP_IDS (range ids) that recorded tensor inputs."""
    want = sorted({int(o) for o in op_ids if o >= 0})
    if not want or ranges is None or "input_dims" not in ranges.column_names:
        return {}
    sub = ranges.filter(pc.is_in(ranges["range_id"], pa.array(want, pa.int64())))
    types = sub["input_types"].to_pylist() if "input_types" in sub.column_names else \
        [None] * sub.num_rows
    out = {}
    for r, nm, d, ty in zip(sub["range_id"].to_pylist(), pylist(sub["name"]),
                            sub["input_dims"].to_pylist(), types, strict=True):
        w = op_work(nm, d, ty, params, scale, batch, seq)
        if w is not None:
            out[int(r)] = w
    return out


def ranges_of(ctx) -> pa.Table | None:
    """The trace's range table, where the context can read it (None: no store)."""
    if ctx.activity is None:
        return None
    try:
        return ctx.activity("range")
    except DaydreamError:
        return None
