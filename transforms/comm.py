"""The communication model: collective times from a link's latency and bandwidth, bandwidth
specs, and a fit of latency and bandwidth from a graph's own collectives.

Alpha-beta model (constants.COLLECTIVE, with sources): a collective of type c over n ranks on a
link of step latency a and bandwidth B takes ``steps_c(n) * a + wire_c(n) * bytes / B``. Link
numbers are in constants.COMM_LINK.

A trace's comm task is split into three parts: latency (``steps * a``), transfer
(``wire * bytes / B``, capped by what the task took) and the rest (time the kernel spent waiting
for other ranks, on a single-rank trace; ~0 in a job graph, whose joins took the waiting out).
What-ifs change the first two and keep the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import polars as pl

from daydream.base.errors import DaydreamError
from daydream.transforms.constants import COLLECTIVE, COMM_LINK

_TYPE_RE = re.compile(r"(?:nccl|rccl)\w*?Kernel_([A-Za-z]+)", re.IGNORECASE)
_TYPES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
          "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "send_recv",
          "send": "send_recv", "recv": "send_recv", "alltoall": "all_to_all"}


def collective_type(name: str | None) -> str:
    """all_reduce, all_gather, ... or 'other' from an NCCL/RCCL kernel name (or a join's)."""
    if not name:
        return "other"
    if name.startswith("join "):
        return name.split()[1]
    m = _TYPE_RE.search(name)
    if m and m.group(1).lower() in _TYPES:
        return _TYPES[m.group(1).lower()]
    # tasks the distributed what-ifs insert name their type ("ddp: all_reduce bucket 3")
    return next((t for t in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all",
                             "send_recv", "broadcast") if t in name), "other")


def cost_terms(ctype: str, n: int, algo: str = "ring") -> tuple[float, float]:
    """(latency steps, wire factor) of a collective over n ranks; all_reduce-like for 'other'."""
    if n < 1:
        raise DaydreamError(f"world size must be >= 1, got {n}")
    table = COLLECTIVE[algo]["value"] if algo in COLLECTIVE else None
    if table is None:
        raise DaydreamError(f"unknown collective algorithm {algo!r}; known: "
                            f"{', '.join(COLLECTIVE)}")
    f = table.get(ctype) or COLLECTIVE["ring"]["value"].get(ctype) or \
        COLLECTIVE["ring"]["value"]["all_reduce"]
    if n == 1:
        return 0.0, 0.0
    return float(f[0](n)), float(f[1](n))


@dataclass
class Link:
    """A link: step latency (ns) and bandwidth (bytes per ns = GB/s); where they came from."""

    latency_ns: float
    gbps: float
    source: str

    def collective_ns(self, ctype: str, nbytes: float, n: int, algo: str = "ring") -> float:
        s, w = cost_terms(ctype, n, algo)
        return s * self.latency_ns + w * nbytes / self.gbps


def link(name: str) -> Link:
    """A link of constants.COMM_LINK, at NCCL's achieved efficiency."""
    e = COMM_LINK.get(name)
    if e is None or not isinstance(e["value"], dict):
        known = [k for k, v in COMM_LINK.items() if isinstance(v["value"], dict)]
        raise DaydreamError(f"unknown link {name!r}; known: {', '.join(known)}")
    eff = COMM_LINK["efficiency"]["value"]
    return Link(float(e["value"]["latency_ns"]), e["value"]["gbps"] * eff,
                f"{name} ({e['value']['gbps']:g} GB/s peak x {eff:g} efficiency)")


def parse_bandwidth(text: str, current: Link | None = None) -> Link:
    """'100Gbps' (bits), '25GB/s' or '25GBps' (bytes), a link name ('nvlink3', 'ib_hdr'), or
    '2x' (a multiple of ``current``, the trace's fitted or assumed link). The latency is the
    named link's, else ``current``'s, else InfiniBand's."""
    t = str(text).strip()
    base_lat = current.latency_ns if current else COMM_LINK["ib_hdr"]["value"]["latency_ns"]
    if t.lower() in COMM_LINK:
        return link(t.lower())
    m = re.fullmatch(r"([0-9.]+)\s*x", t, re.IGNORECASE)
    if m:
        if current is None:
            raise DaydreamError(f"bandwidth {t!r} is relative, but the trace's bandwidth is "
                                "unknown; give it in Gbps or GB/s")
        return Link(current.latency_ns, current.gbps * float(m.group(1)),
                    f"{m.group(1)} x {current.gbps:.3g} GB/s ({current.source})")
    m = re.fullmatch(r"([0-9.]+(?:e[+-]?\d+)?)\s*([kmgt]?)\s*(bps|b/s|bit/s|gbit|Bps|B/s)?", t,
                     re.IGNORECASE)
    if not m:
        raise DaydreamError(f"bad bandwidth {text!r}: give e.g. 100Gbps, 25GB/s, 2x or a link "
                            f"name ({', '.join(k for k in COMM_LINK if k[0] in 'nipe')})")
    v = float(m.group(1))
    scale = {"": 1e9, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
    unit = m.group(3) or "bps"
    is_bytes = unit in ("Bps", "B/s") or (unit == "b/s" and "B" in t)
    bytes_per_s = v * scale / (1 if is_bytes else 8)
    return Link(base_lat, bytes_per_s / 1e9, f"{t} as given")


# ---- the graph's collectives --------------------------------------------------------------------

def comm_table(task: pl.DataFrame) -> pl.DataFrame:
    """The comm kernels of a graph (joins left out): task_id, type, bytes (null where the trace
    has no size), dur_ns."""
    c = task.filter((pl.col("kind") == "comm") & ~pl.col("name").str.starts_with("join "))
    return c.select("task_id", pl.col("name").map_elements(collective_type, pl.Utf8)
                    .alias("type"), pl.when(pl.col("bytes") > 0).then(pl.col("bytes"))
                    .alias("bytes"), "dur_ns")


@dataclass
class Fit:
    """Latency and bandwidth fitted from a graph's collectives (None fields: not possible)."""

    link: Link | None
    points: int
    note: str
    fixed_ns: float = 0.0

    def as_dict(self) -> dict:
        return {"latency_us": self.link.latency_ns / 1e3 if self.link else None,
                "bandwidth_gbps": self.link.gbps if self.link else None,
                "fixed_us": self.fixed_ns / 1e3, "points": self.points, "note": self.note}


def fit(task: pl.DataFrame, n: int, latency_ns: float, algo: str = "ring") -> Fit:
    """Bandwidth from ``t = fixed + wire * bytes / B`` fitted to the fastest instance of each
    message size (a kernel that waited for a late rank took longer than its transfer: the
    fastest one waited least). The per-step latency is ``latency_ns`` (the link's): on a
    single-rank trace the fixed part also holds waiting, so it cannot be taken for latency.
    Needs collectives of at least two sizes for the slope; with one, fixed = 0."""
    # only the trace's own collectives: a chain's inserted ones (ddp's buckets) carry the
    # model's times, and a fit to them would only return the model's bandwidth
    recorded = task.filter(~pl.col("name").fill_null("").str.ends_with("(inserted)"))
    c = comm_table(recorded).filter(pl.col("bytes").is_not_null())
    if n < 2 or not c.height:
        return Fit(None, 0, "no collective with a message size in the trace" if n >= 2 else
                   "one rank: nothing to fit")
    pts = c.group_by("type", "bytes").agg(pl.col("dur_ns").min()).sort("bytes")
    w = np.array([cost_terms(t, n, algo)[1] for t in pts["type"].to_list()])
    x = w * pts["bytes"].to_numpy()
    y = pts["dur_ns"].to_numpy().astype(np.float64)
    fixed, slope = 0.0, 0.0
    if len(y) >= 2 and np.ptp(x) > 0:
        slope, fixed = np.polyfit(x, y, 1)
    if fixed < 0 or slope <= 0:
        fixed, slope = 0.0, float(np.dot(x, y) / max(np.dot(x, x), 1))
    if slope <= 0:
        return Fit(None, len(y), "collective times do not grow with message size")
    return Fit(Link(float(latency_ns), float(1.0 / slope),
                    f"bandwidth fitted to {len(y)} message sizes of the trace"), len(y),
               f"fastest instance of each message size; fixed part {fixed / 1e3:.1f} us per "
               "collective (on a single-rank trace it includes waiting for the other ranks)",
               float(fixed))


def split(comm: pl.DataFrame, n: int, cur: Link, algo: str = "ring") -> pl.DataFrame:
    """Each comm task's latency, transfer and rest (ns) under link ``cur`` with n ranks."""
    st = [cost_terms(t, n, algo) for t in comm["type"].to_list()]
    steps = np.array([a for a, _ in st], np.float64)
    wire = np.array([b for _, b in st], np.float64)
    dur = comm["dur_ns"].to_numpy().astype(np.float64)
    lat = np.minimum(steps * cur.latency_ns, dur)
    nb = comm["bytes"].to_numpy() if comm["bytes"].null_count() < comm.height else None
    if nb is None:
        xfer = dur - lat
    else:
        nbf = comm["bytes"].fill_null(-1).to_numpy().astype(np.float64)
        model = wire * np.maximum(nbf, 0) / cur.gbps
        xfer = np.where(nbf >= 0, np.minimum(model, dur - lat), dur - lat)
    rest = dur - lat - xfer
    return comm.with_columns(pl.Series("steps", steps), pl.Series("wire", wire),
                             pl.Series("lat_ns", lat), pl.Series("xfer_ns", xfer),
                             pl.Series("rest_ns", rest))


def as_all_gather(parts: pl.DataFrame, n: int, fraction: float) -> np.ndarray:
    """New durations (ns) of split all-reduces (``split``) whose messages are exchanged
    instead by an all-gather of FRACTION of their bytes per rank (compressed gradients cannot
    be summed in flight): the rest kept, the latency part over the all-gather's steps, the
    transfer (n-1) x FRACTION x bytes / B where it was 2(n-1)/n x bytes / B (ring)."""
    s_ag, w_ag = cost_terms("all_gather", n)
    s_ar, w_ar = cost_terms("all_reduce", n)
    return (parts["rest_ns"].to_numpy() + parts["lat_ns"].to_numpy() * (s_ag / s_ar) +
            parts["xfer_ns"].to_numpy() * (fraction * n * w_ag) / w_ar)


def message_bytes(parts: pl.DataFrame, n: int, cur: Link) -> np.ndarray:
    """Bytes of each split all-reduce's message: as recorded, else, where the trace records
    no sizes, what its transfer time moves over link CUR."""
    nbytes = parts["bytes"].fill_null(0).to_numpy().astype(np.float64)
    if not nbytes.any():
        _, w_ar = cost_terms("all_reduce", n)
        nbytes = parts["xfer_ns"].to_numpy() * cur.gbps / max(w_ar, 1e-9)
    return nbytes


def rescale(parts: pl.DataFrame, n_old: int, n_new: int, old: Link, new: Link,
            algo: str = "ring") -> np.ndarray:
    """New durations (ns) of split comm tasks with n_new ranks on link ``new``: the rest kept;
    the latency part scaled by steps(n_new)/steps(n_old) and the latency ratio of the links;
    the transfer by wire(n_new)/wire(n_old) * old/new bandwidth (linear in bytes, so the same
    with or without a known message size)."""
    st = [cost_terms(t, n_new, algo) for t in parts["type"].to_list()]
    s2 = np.array([a for a, _ in st], np.float64)
    w2 = np.array([b for _, b in st], np.float64)
    w1 = parts["wire"].to_numpy()
    xfer = parts["xfer_ns"].to_numpy()
    ratio = np.where(w1 > 0, w2 / np.where(w1 > 0, w1, 1), 0.0) * (old.gbps / new.gbps)
    new_x = xfer * ratio
    # the latency part as the trace showed it (never more than the task took), per step
    s1 = parts["steps"].to_numpy()
    per_step = np.where(s1 > 0, parts["lat_ns"].to_numpy() / np.where(s1 > 0, s1, 1),
                        old.latency_ns) * (new.latency_ns / old.latency_ns
                                           if old.latency_ns > 0 else 1.0)
    return np.rint(parts["rest_ns"].to_numpy() + s2 * per_step + new_x).astype(np.int64)
