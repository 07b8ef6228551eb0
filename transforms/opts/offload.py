"""vDNN-style activation offloading: each selected layer's input is copied to host memory
during its forward and prefetched back during the backward pass, on a copy stream of its own
(Rhu et al., 'vDNN: Virtualized Deep Neural Networks for Scalable, Memory-Efficient Neural
Network Design', MICRO 2016)."""

from __future__ import annotations

import numpy as np
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from daydream.base.errors import DaydreamError
from daydream.graphstore.params import DTYPE_BYTES
from daydream.transforms import layers as L
from daydream.transforms import memory
from daydream.transforms.devices import family, gpu
from daydream.transforms.primitives import Graph
from daydream.transforms.registry import Context, register

_PCIE = "PCI-SIG base specifications: {gen} x16 moves {peak} GB/s per direction"
# Constants of the model, each with where it comes from ("estimate" = a modelling choice).
OFFLOAD = {
    # Host <-> device bandwidth achieved per PCIe generation of the GPU's host link (GB/s, one
    # direction, pinned memory; the generation is the GPU's own: transforms.hardware, pcie_gen).
    # GPUs reach the host over PCIe even in SXM boards (NVLink joins GPUs, not the x86 host).
    "pcie_gbps": {
        3: {"value": 12.0, "source": _PCIE.format(gen="PCIe 3.0", peak=15.75) + "; "
            "~12 GB/s achieved pinned (CUDA bandwidthTest on V100 systems; vDNN, Rhu et al. "
            "2016, measured 12.8 GB/s on PCIe 3.0)"},
        4: {"value": 24.0, "source": _PCIE.format(gen="PCIe 4.0", peak=31.5) + "; "
            "estimate 24 GB/s achieved (~77%, as on PCIe 3.0)"},
        5: {"value": 50.0, "source": _PCIE.format(gen="PCIe 5.0", peak=63.0) + "; "
            "estimate 50 GB/s achieved"},
    },
    "copy_latency_ns": {"value": 10000, "source": "estimate: a cudaMemcpyAsync of pinned "
                        "memory pays ~5-10 us of DMA set-up and completion before bytes flow "
                        "(CUDA bandwidthTest, small transfers)"},
    "copy_api_ns": {"value": 5000, "source": "estimate: host time of one cudaMemcpyAsync call "
                    "(~3-6 us, the same order as cudaLaunchKernel)"},
    "elem_bytes": {"value": 4, "source": "bytes per element where the trace records the "
                   "input's shape but not its dtype (Input type): FP32; where it records the "
                   "dtype, graphstore.params.DTYPE_BYTES"},
}


def copy_ns(nbytes: int, gbps: float) -> int:
    """Time of one host<->device copy of NBYTES at GBPS (GB/s = bytes per ns)."""
    return int(round(nbytes / gbps)) + OFFLOAD["copy_latency_ns"]["value"]


def _first_input_bytes(dims: str | None, types: str | None = None) -> int | None:
    """Bytes of an op's first input: its recorded shape times its recorded dtype's size."""
    try:
        shapes = orjson.loads(dims) if dims else None
        dtypes = orjson.loads(types) if types else None
    except orjson.JSONDecodeError:
        return None
    if not shapes or not isinstance(shapes, list) or not isinstance(shapes[0], list) \
            or not shapes[0]:
        return None
    dt = dtypes[0] if isinstance(dtypes, list) and dtypes else None
    size = DTYPE_BYTES.get(dt, OFFLOAD["elem_bytes"]["value"]) if isinstance(dt, str) \
        else OFFLOAD["elem_bytes"]["value"]
    return int(np.prod(shapes[0])) * size


def activation_bytes(g: Graph, sites: list[dict], ranges: pa.Table | None) -> list[int | None]:
    """Bytes of each site's layer input: the first input tensor of the outermost op (earliest
    start, then longest) among the ranges that enclose the layer's forward CPU tasks and
    record input shapes, times its recorded dtype's size (OFFLOAD elem_bytes where none);
    None where no such range exists."""
    if ranges is None or "input_dims" not in ranges.column_names:
        return [None] * len(sites)
    rid = g.task["range_id"].fill_null(-1).to_numpy()
    want = sorted({int(r) for s in sites for r in rid[s["fwd_cpu"]] if r >= 0})
    cols = ["range_id", "start_ns", "dur_ns", "input_dims"]
    has_types = "input_types" in ranges.column_names
    r = ranges.select(cols + (["input_types"] if has_types else [])).filter(
        pc.is_in(ranges["range_id"], pa.array(want, pa.int64())))
    types = r["input_types"].to_pylist() if has_types else [None] * r.num_rows
    info = {i: (st, -d, dims, ty) for i, st, d, dims, ty in zip(
        r["range_id"].to_pylist(), r["start_ns"].to_pylist(), r["dur_ns"].to_pylist(),
        r["input_dims"].to_pylist(), types, strict=True)}
    out = []
    for s in sites:
        cand = sorted((v for v in (info.get(int(x)) for x in rid[s["fwd_cpu"]])
                       if v is not None and _first_input_bytes(v[2], v[3])),
                      key=lambda v: v[:3])
        out.append(_first_input_bytes(cand[0][2], cand[0][3]) if cand else None)
    return out


@register("offload")
def offload(g: Graph, ctx: Context, *, layers: str = "conv", every: int = 1,
            layer_mb: float = 0.0) -> Graph:
    """vDNN activation offloading: layer inputs go to host memory in forward, back for backward.

    Layers are chosen as in checkpointing (LAYERS a case-insensitive regular expression, every
    EVERY-th; the default 'conv' is vDNN's vDNN_conv policy, '' its vDNN_all). For each chosen
    layer in each iteration, on one new copy stream of the GPU: a device-to-host copy of the
    layer's input starts when the layer's first forward GPU task starts, and the next GPU task
    on the compute stream after the layer's forward waits for it (vDNN frees the input at the
    end of the layer); a host-to-device prefetch starts when the backward of the layer before
    it in backward order starts, and the layer's first backward GPU task waits for it. Each
    copy has a cudaMemcpyAsync call (OFFLOAD copy_api_ns) on the thread that launches the
    kernel it is issued beside. Bytes: the first input tensor of the layer's outermost op from
    the trace's recorded input shapes and dtypes (FP32 where no dtype); where the trace records
    none, LAYER_MB megabytes (0: such layers are not offloaded). Copy time = bytes / PCIe bandwidth
    achieved on the GPU's PCIe generation (OFFLOAD pcie_gbps) + copy_latency_ns."""
    if every < 1:
        raise DaydreamError(f"offload: every must be >= 1, got {every}")
    if layer_mb < 0:
        raise DaydreamError(f"offload: layer_mb must be >= 0, got {layer_mb}")
    fam = family(ctx.device)
    gbps = OFFLOAD["pcie_gbps"][gpu(ctx.device, "pcie_gen").pcie_gen]["value"]
    st = L.sites(g, L.pick(g, layers, every, "offload"))
    ranges = None
    if st and ctx.activity is not None:
        try:
            ranges = ctx.activity("range")
        except DaydreamError:
            ranges = None
    nb = activation_bytes(g, st, ranges)
    fallback = int(round(layer_mb * 1e6))
    keep = [(s, b if b is not None else fallback) for s, b in zip(st, nb, strict=False)]
    keep = [(s, b) for s, b in keep if b > 0]
    if not keep:
        ctx.notes.append("offload: no layer with forward and backward GPU work and known "
                         "input bytes (set layer_mb for traces without input shapes); "
                         "unchanged")
        return g
    t = g.task
    unit = t["unit_id"].to_numpy()
    lag = L.launch_lag(g)
    all_sites = L.sites(g, L.forward_order(g))
    # first backward GPU task of every layer, per iteration, in backward order
    bwd_first: dict[int, list[int]] = {}
    for s in all_sites:
        bwd_first.setdefault(s["iteration"], []).append(s["bwd_gpu"])
    last_fwd = {}
    for s in all_sites:
        last_fwd[s["iteration"]] = max(last_fwd.get(s["iteration"], -1), max(s["fwd_gpu"]))
    nxt = L.next_on_unit(g, [max(s["fwd_gpu"]) for s, _ in keep])
    stream = int(unit[keep[0][0]["fwd_gpu"][0]])
    dev = g.unit.filter(pl.col("unit_id") == stream)["device"].to_list()
    dev = dev[0] if dev else None
    g, cu = g.add_unit(f"gpu {dev if dev is not None else '?'} offload copy stream",
                       kind="stream", policy="fixed", device=dev)
    rows: list[dict] = []
    edges: list[tuple] = []
    api_ns = OFFLOAD["copy_api_ns"]["value"]
    total = 0
    for s, b in keep:
        f0 = s["fwd_gpu"][0]
        d = copy_ns(b, gbps)
        total += b
        # offload
        a0, lg0 = lag.get(f0, (None, 0))
        i_d2h = len(rows)
        rows.append({"at": f0, "kind": "memcpy", "unit_id": cu, "bytes": b, "dur_ns": d,
                     "name": "offload: activation to host (Memcpy DtoH, inserted)",
                     "phase": "forward", "layer": s["layer"]})
        edges.append((f0, -1 - i_d2h, "wait", "start_start", 0))
        if a0 is not None:
            rows.append({"at": a0, "kind": "api", "unit_id": int(unit[a0]), "bytes": None,
                         "name": "cudaMemcpyAsync", "dur_ns": api_ns, "phase": "forward",
                         "layer": s["layer"]})
            edges.append((-len(rows), -1 - i_d2h, "launch", "start_start", lg0))
        n = nxt.get(max(s["fwd_gpu"]))
        if n is not None:
            edges.append((-1 - i_d2h, n, "wait", "end_start", 0))
        # prefetch, issued when the backward of the layer before it (backward order) starts
        earlier = [x for x in bwd_first[s["iteration"]] if x < s["bwd_gpu"]]
        issue_at = max(earlier) if earlier else last_fwd[s["iteration"]]
        i_h2d = len(rows)
        rows.append({"at": issue_at, "kind": "memcpy", "unit_id": cu, "bytes": b, "dur_ns": d,
                     "name": "offload: prefetch activation (Memcpy HtoD, inserted)",
                     "phase": "backward", "layer": s["layer"]})
        edges.append((issue_at, -1 - i_h2d, "wait", "start_start", 0))
        edges.append((-1 - i_h2d, s["bwd_gpu"], "wait", "end_start", 0))
        a1, lg1 = lag.get(issue_at, (None, 0))
        if a1 is not None:
            rows.append({"at": a1, "kind": "api", "unit_id": int(unit[a1]), "bytes": None,
                         "name": "cudaMemcpyAsync", "dur_ns": api_ns, "phase": "backward",
                         "layer": s["layer"]})
            edges.append((-len(rows), -1 - i_h2d, "launch", "start_start", lg1))
    ins = pl.DataFrame(rows, schema_overrides={"bytes": pl.Int64, "layer": pl.String})
    ed = pl.DataFrame(edges, schema=["src", "dst", "kind", "anchor", "lag_ns"], orient="row")
    g, _ = g.insert(ins, ed)
    known = sum(x is not None for x in nb)
    first_it = min(s["iteration"] for s, _ in keep)
    ctx.notes.extend(memory.notes(g, ctx, "offload", ranges=ranges,
                                  offloaded_bytes=sum(b for s, b in keep
                                                      if s["iteration"] == first_it)))
    ctx.notes.append(f"offload: GPU family {fam}, {gbps:g} GB/s; {len(keep)} layer-iterations "
                     f"offloaded ({known} of {len(st)} sized from input shapes), "
                     f"{total / len({s['iteration'] for s, _ in keep}) / 1e6:.1f} MB each way "
                     "per iteration")
    return g
