"""Bounds on a training step, read from the raw trace alone (ACCURACY.md, section 2).

The response check asks whether Daydream's prediction moves the way the hardware would when all
GPU (or all CPU) work is scaled by f. What the hardware would do is bounded by two figures per
step that this script reads from the trace file itself, never from Daydream's activity tables or
graph (it imports no project package), so that a bug in ingest or in the graph cannot move the
ruler it is measured with:

G  the time per step in which some GPU task (kernel, copy, set) runs: the union of their
   intervals inside the step's window, per device; G is the busiest device's (the lower edge:
   one device runs its work in no less time), G_all the union over all devices (the upper
   edge; equal to G on one GPU). G_stream, the busiest single stream, is shown beside.
C  the CPU's own work per step, per thread: the time inside an operator or a runtime call,
   with every call counted at its unblocked cost (below) instead of its duration. C_max is the
   busiest thread's (a thread runs one thing at a time, so no step is shorter: the lower edge);
   C_sum adds every thread's own work plus its short gaps (work the threads could have to do
   one after another: the upper edge).

W  the time per step in which neither a GPU task runs nor any thread does its own work (nor
   has a short gap): launch latencies, and waits on what the trace does not show (another
   process, a peer rank, GPU work the profiler did not record), and GPU idle that nothing in
   the trace ended even where a thread works under it. It scales with neither side.

With GPU work scaled by f a step lies in [max(f G, C_max), f G_all + C_sum + W]; with CPU work
scaled, in [max(G, f C_max), G_all + f C_sum + W]. ACCURACY.md's [max(fG, C), fG + C] is the
case W = 0; where a trace holds time that nothing in it explains (TorchRec: ~129 ms of a 216
ms step, the GPU idle between a CUDA graph's nodes while the CPU waits in a blocking copy or
works), the upper edge without W would fail the measured trace itself at f = 1. Per thread
C_max is a lower bound (no waits, no gaps, calls at the cheaper of median and tail) and C_sum
an upper one (every thread, one after another, with its short gaps), which is why the edges
use one each.

The rules, exactly (times in ns; Kineto's ``ts``/``dur`` are microseconds):

- Work marks on a thread: operators (Kineto ``cpu_op``/``Operator``; Nsight NVTX ranges) and
  runtime/driver calls (``cuda_runtime``/``Runtime``/``cuda_driver``/``Driver``; Nsight
  CUPTI_ACTIVITY_KIND_RUNTIME). Step markers (``ProfilerStep#N``), user annotations and Python
  frames are labels, not work: a Python frame or ``## backward ##`` spans the time its thread
  waits for another.
- A call's unblocked cost = min(its duration, the median duration of calls of its name on its
  thread over the whole trace, its tail). Its tail is the part after the last GPU task (of its
  process) that ended inside it: a launch blocked by a full queue, a sync, a blocking copy all
  end a few microseconds after the GPU task they waited for; a call inside which no GPU task
  ended keeps its duration. The median catches blocked calls whose wait did not end on a GPU
  task (most launches are not blocked, so their median is the unblocked cost).
- A thread's own work in a window = |union of its work marks, clipped to the window| minus,
  for each call not nested in another call, max(0, |call clipped to the window| - its cost).
- A call's own part is its end [end - cost, end): the wait comes first. W is the window minus
  the union of all GPU tasks, every thread's own parts and its short gaps.
- Gaps: stretches of the window outside every work mark of the thread. A gap of at most
  GAP_NS (100 us) is host work between operators (Python, the dispatcher) and counts in C_sum
  only; a longer gap is a wait (for the GPU, for another thread, for data) and counts nowhere.
  C_max leaves all gaps out, so it stays a lower bound.
- Untraced waits: a long gap between a thread's first and last work mark that ends more than
  WOKEN_NS (1 ms) after every GPU drain (a stream going idle) and every start or end of
  another thread's work mark waited on what the trace does not show (a DataLoader's worker
  processes on the ResNet-18 trace: 100s of ms per step with the previous step's GPU work
  under them). Where no other thread has a mark under way, GPU time under such a wait cannot
  shorten the step, so W counts it too (W = the window minus the union of GPU tasks outside
  untraced waits, own parts and short gaps).
- Untraced GPU idle: a stretch longer than WOKEN_NS in which no GPU task runs anywhere, ended
  by GPU work whose launch calls (matched by correlation id) had all returned before it began,
  was ended by nothing the trace shows: no GPU task ended inside it and the CPU had already
  handed the work over (TorchRec: a CUDA graph's nodes 6-64 ms apart on an idle GPU, ~19 ms
  of such idle per step under the CPU's own work). W counts it whole, own work under it
  included (that time is then in C_sum too: the upper edge may only grow). GPU work without
  a launch in the trace decides nothing: its idle stretch is left to the rules above.
- Steps: ``ProfilerStep#N`` ranges on a CPU thread where present, each window from its start
  to the next step's start (the last to its own end); else the stretches between the ends of
  consecutive top-level ``Optimizer.step`` ranges (the part before the first is incomplete,
  the part after the last is the drain); else the whole trace, one window.
- Steady steps: the last ``ProfilerStep`` is the drain (its successor is not in the trace and
  the GPU work it queued runs past it): left out. Leading steps whose length differs from the
  median of all steps by more than WARMUP_TOL (10%) are the warm-up: left out, up to the first
  that does not. A trace left with none keeps its steps as they are (flagged).

The dependency floor (``sync_floor``, ``--sync-floor F``): max(f G, C_max) lets the host's
work and the GPU's overlap wholly, which a host that blocks on GPU results cannot do. The
threads that launch GPU work (by correlation id), taken one after another where their own
work never overlaps (the main thread and the autograd thread hand work to each other), else
each alone, are cut at their blocking calls: a copy into pageable memory (it returns when the
copy is done: it waits for its stream), a device sync (every stream), a stream or event sync
(a stream old traces do not name: it cuts the host's work, bounds no GPU work). The stretch
before a blocking call holds at least the threads' own work in it, and, for each launch k in
it onto what the call waits for, the own work before k plus f times the GPU work launched
from k on (it cannot start before its launch and must be done when the call returns). A
step's floor is the sum over its stretches; the blocking calls' own time and the GPU work
launched in earlier stretches are left out, so it stays a floor (no schedule of the same work
is shorter, the host's own work fixed). Own work is C_max's (sound), or with the short gaps
as work (``--short-gaps``), and with each call at the lesser of its duration and its name's
median only, not also its tail (``--median-calls``; with ``--short-gaps`` the judge's rule
for C exactly). Kineto traces only.

    python bench/bounds.py TRACE [TRACE ...] [--json]
    python bench/bounds.py --sync-floor F [--short-gaps] [--median-calls] TRACE ... [--json]
"""

from __future__ import annotations

import argparse
import re
import sqlite3
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

GAP_NS = 100_000
# A thread's long gap ends on what it waited for: the GPU (a stream draining: a sync returns a
# few microseconds after the last task it waited for) or another thread (one of its work marks
# starting or ending: a hand-over). A gap that ends more than WOKEN_NS after every such event
# waited on what the trace does not show (a DataLoader's worker processes, another process).
WOKEN_NS = 1_000_000
WARMUP_TOL = 0.10

_GPU_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
# Collective kernels (NCCL, RCCL): on a rank's trace each lasts until its slowest peer arrives
_COMM_RE = re.compile(r"nccl|rccl", re.IGNORECASE)
_CALL_CATS = {"cuda_runtime", "Runtime", "cuda_driver", "Driver"}
_OP_CATS = {"cpu_op", "Operator"}
_MARK_CATS = _OP_CATS | {"user_annotation"}  # where step markers live on the CPU side
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)")
# a copy into pageable host memory: Kineto's "Memcpy DtoH (Device -> Pageable)"
_TO_PAGEABLE_RE = re.compile(r"-> Pageable")
# calls that return only when the GPU work they name is done
_SYNC_RE = re.compile(r"^(cuda|hip)(Stream|Device|Event)Synchronize")


@dataclass
class Raw:
    """One trace's raw events as arrays (ns). GPU tasks: device, stream, process, start, end.
    CPU: work marks per thread (ops and calls), calls with their names."""

    gpu_dev: np.ndarray
    gpu_stream: np.ndarray
    gpu_proc: np.ndarray
    gpu_start: np.ndarray
    gpu_end: np.ndarray
    gpu_comm: np.ndarray  # bool: a collective kernel
    # the end of the call that launched each GPU task (ns), -1 where the trace has none
    gpu_launch_end: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # each GPU task's correlation id (-1: none), and whether it is a copy into pageable host
    # memory (its call returns only when it is done); Kineto only, empty for Nsight
    gpu_corr: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gpu_to_pageable: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    # per CPU thread key: the correlation id of each of its calls (in ``calls`` order), -1: none
    call_corr: dict = field(default_factory=dict)
    # per CPU thread key: (starts, ends) of operators
    ops: dict = field(default_factory=dict)
    # per CPU thread key: (starts, ends, names) of runtime/driver calls
    calls: dict = field(default_factory=dict)
    thread_proc: dict = field(default_factory=dict)
    profiler_steps: list = field(default_factory=list)  # (start, end, number)
    optimizer_steps: list = field(default_factory=list)  # (thread, start, end)
    span: tuple = (0, 0)
    source: str = ""


def _us(x) -> int:
    """Microseconds (Kineto's unit) to integer ns. Epoch timestamps are ~1.7e15 us: times
    1000 they pass 2**53, so the whole and the fractional microseconds are converted apart."""
    if isinstance(x, int):
        return x * 1000
    x = float(x)
    whole = int(x)
    return whole * 1000 + int(round((x - whole) * 1000.0))


def _open_bytes(path: Path) -> bytes:
    if path.suffix == ".gz":
        try:
            from isal import igzip as gz
        except ImportError:  # isal is a project dependency; gzip is the same format, slower
            import gzip as gz
        with gz.open(path, "rb") as f:
            return f.read()
    return path.read_bytes()


def _corr(e: dict) -> int:
    """A Kineto event's correlation id (launch call <-> GPU task), -1 where it has none."""
    c = (e.get("args") or {}).get("correlation")
    return c if isinstance(c, int) else -1


def read_kineto(path: Path) -> Raw:
    """Parse a Kineto / PyTorch-profiler JSON trace (plain or gzipped)."""
    doc = orjson.loads(_open_bytes(path))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    g_dev, g_str, g_s, g_e, g_c, g_corr, g_page = [], [], [], [], [], [], []
    launch_end: dict = {}  # correlation id -> end of the call that carries it
    ops: dict = {}
    calls: dict = {}
    psteps: dict = {}
    osteps = []
    lo, hi = None, None
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat == "Trace":
            continue
        try:
            s = _us(e["ts"])
            d = _us(e["dur"])
        except (KeyError, TypeError, ValueError):
            continue
        if d < 0:
            continue
        lo = s if lo is None or s < lo else lo
        hi = s + d if hi is None or s + d > hi else hi
        if cat in _GPU_CATS:
            g_dev.append(str(e.get("pid")))
            g_str.append(str(e.get("tid")))
            g_s.append(s)
            g_e.append(s + d)
            g_c.append(bool(_COMM_RE.search(str(e.get("name", "")))))
            g_corr.append(_corr(e))
            g_page.append(bool(_TO_PAGEABLE_RE.search(str(e.get("name", "")))))
            continue
        key = (str(e.get("pid")), str(e.get("tid")))
        name = str(e.get("name", ""))
        if cat in _MARK_CATS:
            m = _STEP_RE.match(name)
            if m:
                # a step may be marked twice (an annotation and an op of the same name)
                psteps.setdefault(name, (s, s + d, int(m.group(1))))
                continue
            if name.startswith("Optimizer.step"):
                osteps.append((key, s, s + d))
        if cat in _OP_CATS:
            ops.setdefault(key, ([], []))
            ops[key][0].append(s)
            ops[key][1].append(s + d)
        elif cat in _CALL_CATS:
            calls.setdefault(key, ([], [], [], []))
            calls[key][0].append(s)
            calls[key][1].append(s + d)
            calls[key][2].append(name)
            c = _corr(e)
            calls[key][3].append(c)
            if c >= 0:
                launch_end[c] = s + d
    return Raw(gpu_dev=np.array(g_dev, dtype=object), gpu_stream=np.array(g_str, dtype=object),
               gpu_proc=np.zeros(len(g_s), np.int64), gpu_start=np.array(g_s, np.int64),
               gpu_end=np.array(g_e, np.int64), gpu_comm=np.array(g_c, bool),
               gpu_launch_end=np.array([launch_end.get(c, -1) if c >= 0 else -1
                                        for c in g_corr], np.int64),
               ops={k: (np.array(v[0], np.int64), np.array(v[1], np.int64))
                    for k, v in ops.items()},
               calls={k: (np.array(v[0], np.int64), np.array(v[1], np.int64), v[2])
                      for k, v in calls.items()},
               gpu_corr=np.array(g_corr, np.int64), gpu_to_pageable=np.array(g_page, bool),
               call_corr={k: np.array(v[3], np.int64) for k, v in calls.items()},
               thread_proc={k: 0 for k in set(ops) | set(calls)},
               profiler_steps=sorted(psteps.values()),
               optimizer_steps=osteps, span=(lo or 0, hi or 0), source="kineto")


def read_nsys(path: Path) -> Raw:
    """Parse an Nsight Systems SQLite export (CUPTI activity tables, NVTX ranges)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        strings = dict(con.execute("SELECT id, value FROM StringIds")) \
            if "StringIds" in tables else {}
        g, comm, corr = [], [], []
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                  "CUPTI_ACTIVITY_KIND_MEMSET"):
            if t in tables:
                rows = con.execute(f"SELECT deviceId, streamId, globalPid, start, end, "
                                   f"correlationId FROM {t}").fetchall()
                g += [r[:5] for r in rows]
                corr += [(r[2], r[5]) for r in rows]
                cols = {r[1] for r in con.execute(f"PRAGMA table_info({t})")}
                if t.endswith("KERNEL") and "shortName" in cols:
                    comm += [bool(_COMM_RE.search(strings.get(n, "") or "")) for (n,) in
                             con.execute(f"SELECT shortName FROM {t}")]
                else:
                    comm += [False] * len(rows)
        calls: dict = {}
        launch_end: dict = {}  # (process, correlation id) -> end of the call
        if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
            for tid, nid, s, e, cid in con.execute(
                    "SELECT globalTid, nameId, start, end, correlationId "
                    "FROM CUPTI_ACTIVITY_KIND_RUNTIME"):
                c = calls.setdefault(str(tid), ([], [], []))
                c[0].append(s)
                c[1].append(e)
                c[2].append(strings.get(nid, str(nid)))
                launch_end[(tid & ~0xFFFFFF, cid)] = e
        ops: dict = {}
        psteps: dict = {}
        osteps = []
        if "NVTX_EVENTS" in tables:
            # 59 push/pop range, 60 start/end range
            for tid, s, e, text, tidx in con.execute(
                    "SELECT globalTid, start, end, text, textId FROM NVTX_EVENTS "
                    "WHERE eventType IN (59, 60) AND end IS NOT NULL"):
                name = text if text is not None else strings.get(tidx, "")
                m = _STEP_RE.match(name or "")
                if m:
                    psteps.setdefault(name, (s, e, int(m.group(1))))
                    continue
                if (name or "").startswith("Optimizer.step"):
                    osteps.append((str(tid), s, e))
                o = ops.setdefault(str(tid), ([], []))
                o[0].append(s)
                o[1].append(e)
    finally:
        con.close()
    ga = np.array(g, dtype=np.int64).reshape(-1, 5)
    all_s = [ga[:, 3].min()] if len(ga) else []
    all_e = [ga[:, 4].max()] if len(ga) else []
    for v in list(ops.values()) + list(calls.values()):
        if v[0]:
            all_s.append(min(v[0]))
            all_e.append(max(v[1]))
    # Nsight's globalTid holds the process in its upper bits: globalPid = tid with the low 24
    # bits cleared
    proc = {k: int(k) & ~0xFFFFFF for k in set(ops) | set(calls)}
    return Raw(gpu_dev=ga[:, 0].astype(str).astype(object),
               gpu_stream=ga[:, 1].astype(str).astype(object),
               gpu_proc=ga[:, 2], gpu_start=ga[:, 3], gpu_end=ga[:, 4],
               gpu_comm=np.array(comm, bool),
               gpu_launch_end=np.array([launch_end.get(k, -1) for k in corr], np.int64),
               ops={k: (np.array(v[0], np.int64), np.array(v[1], np.int64))
                    for k, v in ops.items()},
               calls={k: (np.array(v[0], np.int64), np.array(v[1], np.int64), v[2])
                      for k, v in calls.items()},
               thread_proc=proc, profiler_steps=sorted(psteps.values()),
               optimizer_steps=osteps,
               span=(int(min(all_s)) if all_s else 0, int(max(all_e)) if all_e else 0),
               source="nsys")


def read(path: str | Path) -> Raw:
    p = Path(path)
    if p.suffix in (".sqlite", ".db"):
        return read_nsys(p)
    return read_kineto(p)


# ---- interval arithmetic -------------------------------------------------------------------

def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted, disjoint [s, e) pairs."""
    if len(starts) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    o = np.argsort(starts, kind="stable")
    s, e = starts[o], ends[o]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    ms = s[idx]
    me = np.append(run_end[idx[1:] - 1], run_end[-1])
    return ms, me


def union(ivs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """``merge`` of several (starts, ends) interval lists."""
    if not ivs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return merge(np.concatenate([v[0] for v in ivs]), np.concatenate([v[1] for v in ivs]))


def covered(ms: np.ndarray, me: np.ndarray, w0: int, w1: int) -> int:
    """Length of the merged intervals inside [w0, w1)."""
    if len(ms) == 0 or w1 <= w0:
        return 0
    return int(np.clip(np.minimum(me, w1) - np.maximum(ms, w0), 0, None).sum())


def gaps(ms: np.ndarray, me: np.ndarray, w0: int, w1: int) -> tuple[np.ndarray, np.ndarray]:
    """The stretches of [w0, w1) outside the merged intervals, as (starts, ends)."""
    s = np.clip(ms, w0, w1)
    e = np.clip(me, w0, w1)
    keep = e > s
    s, e = s[keep], e[keep]
    gs = np.concatenate(([w0], e)).astype(np.int64)
    ge = np.concatenate((s, [w1])).astype(np.int64)
    keep = ge > gs
    return gs[keep], ge[keep]


def subtract(ms: np.ndarray, me: np.ndarray, ws: np.ndarray,
             we: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merged intervals minus merged intervals, merged."""
    if len(ms) == 0 or len(ws) == 0:
        return ms, me
    p = np.unique(np.concatenate((ms, me, ws, we)))
    left, right = p[:-1], p[1:]

    def inside(s, e, x):
        i = np.searchsorted(s, x, side="right") - 1
        return (i >= 0) & (x < e[np.clip(i, 0, None)])

    keep = inside(ms, me, left) & ~inside(ws, we, left)
    return merge(left[keep], right[keep])


# ---- steps ----------------------------------------------------------------------------------

@dataclass
class Step:
    label: str
    start_ns: int
    end_ns: int
    steady: bool = True
    why: str = ""

    @property
    def length_ns(self) -> int:
        return self.end_ns - self.start_ns


def steps(raw: Raw) -> tuple[list[Step], str]:
    """The step windows and the rule that found them, with the steady ones marked."""
    out: list[Step] = []
    if raw.profiler_steps:
        ps = raw.profiler_steps
        for i, (s, e, n) in enumerate(ps):
            end = ps[i + 1][0] if i + 1 < len(ps) else e
            out.append(Step(f"ProfilerStep#{n}", s, end))
        out[-1].steady, out[-1].why = False, "drain (last step)"
        rule = "ProfilerStep"
    elif raw.optimizer_steps:
        by_thread: dict = {}
        for k, s, e in raw.optimizer_steps:
            by_thread.setdefault(k, []).append((s, e))
        # the thread that steps the optimizer most often; nested ranges merged
        iv = max(by_thread.values(), key=len)
        ms, me = merge(np.array([s for s, _ in iv], np.int64),
                       np.array([e for _, e in iv], np.int64))
        for k in range(1, len(me)):
            out.append(Step(f"Optimizer.step #{k}", int(me[k - 1]), int(me[k])))
        rule = "Optimizer.step"
        if not out:
            out = [Step("whole trace", *raw.span)]
            rule = "whole trace (one Optimizer.step)"
    else:
        out = [Step("whole trace", *raw.span)]
        rule = "whole trace"
    if len(out) > 1:
        ref = statistics.median(s.length_ns for s in out)
        for s in out:
            if s.steady and abs(s.length_ns - ref) > WARMUP_TOL * ref:
                s.steady, s.why = False, "warm-up"
            else:
                break
    if not any(s.steady for s in out):
        for s in out:
            s.steady = True
            s.why = (s.why + "; " if s.why else "") + "kept: no steady step left"
    return out, rule


# ---- the figures --------------------------------------------------------------------------

def call_costs(raw: Raw, with_tail: bool = True) -> dict:
    """Per CPU thread: (starts, ends, cost) of its top-level calls (calls nested in another
    call of the same thread are left out: the outer one holds their time). ``with_tail`` False:
    the cost is min(duration, median) only (the judge's rule), not also the tail."""
    out = {}
    order = np.argsort(raw.gpu_end, kind="stable")
    g_end = raw.gpu_end[order]
    g_proc = raw.gpu_proc[order]
    for key, (s, e, names) in raw.calls.items():
        o = np.argsort(s, kind="stable")
        s, e = s[o], e[o]
        names = [names[i] for i in o]
        run_end = np.maximum.accumulate(e)
        top = np.ones(len(s), bool)
        top[1:] = e[1:] > run_end[:-1]  # not inside an earlier call
        dur = e - s
        med: dict = {}
        for n, d in zip(names, dur.tolist(), strict=True):
            med.setdefault(n, []).append(d)
        med = {n: statistics.median(v) for n, v in med.items()}
        cost = np.minimum(dur, np.array([med[n] for n in names], np.int64))
        # the tail after the last GPU task (of this process) that ended inside the call
        proc = raw.thread_proc.get(key, 0)
        ge = g_end if raw.source != "nsys" else g_end[g_proc == proc]
        if with_tail and len(ge):
            j = np.searchsorted(ge, e, side="right") - 1
            last = np.where(j >= 0, ge[np.clip(j, 0, None)], np.iinfo(np.int64).min)
            inside = last >= s
            tail = np.where(inside, e - last, dur)
            cost = np.minimum(cost, tail)
        out[key] = (s[top], e[top], cost[top])
    return out


def thread_work(raw: Raw, costs: dict, key, w0: int, w1: int) -> dict:
    """One thread in [w0, w1): its own work (ms) and the intervals that hold it, and its
    short gaps (host work between operators)."""
    os_, oe = raw.ops.get(key, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
    cs, ce, cc = costs.get(key, (np.zeros(0, np.int64),) * 3)
    ms, me = merge(np.concatenate((os_, cs)), np.concatenate((oe, ce)))
    # a call's own cost is its end: the wait comes first, the work after what it waited for
    ws, we = merge(cs, ce - cc)
    ws, we = ws[we > ws], we[we > ws]
    own_s, own_e = subtract(ms, me, ws, we)
    gs, ge = gaps(ms, me, w0, w1)
    short = (ge - gs) <= GAP_NS
    return {"own_ns": covered(own_s, own_e, w0, w1),
            "short_gap_ns": int((ge - gs)[short].sum()),
            "own": (own_s, own_e), "short": (gs[short], ge[short])}


def _soon_after(times: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per time of t: some time of the sorted ``times`` at most WOKEN_NS before it."""
    if not len(times):
        return np.zeros(len(t), bool)
    i = np.searchsorted(times, t, side="right") - 1
    return (i >= 0) & (t - times[np.clip(i, 0, None)] <= WOKEN_NS)


def stream_intervals(raw: Raw) -> dict:
    """{(device, stream): its GPU tasks' merged intervals}."""
    out = {}
    for k in sorted(set(zip(raw.gpu_dev.tolist(), raw.gpu_stream.tolist(), strict=True))):
        m = (raw.gpu_dev == k[0]) & (raw.gpu_stream == k[1])
        out[k] = merge(raw.gpu_start[m], raw.gpu_end[m])
    return out


def untraced_waits(raw: Raw, streams: dict) -> tuple[np.ndarray, np.ndarray]:
    """The long gaps of every thread, between its first and last work mark, that no GPU drain
    and no other thread's event ended (WOKEN_NS), while no other thread had work or a call
    under way, merged: waits on what the trace does not show. A faster GPU cannot end them
    sooner even where GPU work ran under them, so W counts them whole. ``streams``: each
    stream's merged GPU intervals."""
    drains = [me[np.r_[ms[1:] - me[:-1] > GAP_NS, True]]  # the stream idles after these ends
              for ms, me in streams.values()]
    drain = np.sort(np.concatenate(drains)) if drains else np.zeros(0, np.int64)
    marks = {}
    for key in set(raw.ops) | set(raw.calls):
        os_, oe = raw.ops.get(key, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
        cs, ce, _ = raw.calls.get(key, (np.zeros(0, np.int64),) * 3)
        marks[key] = merge(np.concatenate((os_, cs)), np.concatenate((oe, ce)))
    out = []
    for key, (ms, me) in marks.items():
        if len(ms) < 2:
            continue
        others = [v for k, v in marks.items() if k != key]
        ev = np.sort(np.concatenate([np.concatenate(v) for v in others])) if others \
            else np.zeros(0, np.int64)
        # between the thread's first and last work: before and after them it was not waiting
        gs, ge = gaps(ms, me, int(ms[0]), int(me[-1]))
        long = (ge - gs) > GAP_NS
        gs, ge = gs[long], ge[long]
        lone = ~_soon_after(drain, ge) & ~_soon_after(ev, ge)
        # only while no other thread works or waits in a call: a poller thread sleeping
        # while the main thread is blocked on the GPU holds nothing up
        out.append(subtract(*merge(gs[lone], ge[lone]), *union(others)))
    return union(out)


def untraced_idle(raw: Raw, all_iv: tuple[np.ndarray, np.ndarray]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Stretches longer than WOKEN_NS in which no GPU task runs anywhere and that end on GPU
    work whose launch calls had all returned before the stretch began: nothing the trace shows
    ended them (no GPU task ended inside, and the CPU had already handed the work over), so
    they waited on what it does not show (a peer, another process, an untraced dependency).
    Neither a faster CPU nor a faster GPU ends them sooner, even where a thread works under
    them. Work the trace shows no launch for decides nothing: such a stretch is left out.
    ``all_iv``: the merged intervals of every GPU task."""
    ms, me = all_iv
    if len(ms) < 2 or not len(raw.gpu_launch_end):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    gs, ge = me[:-1], ms[1:]
    long = np.flatnonzero(ge - gs > WOKEN_NS)
    order = np.argsort(raw.gpu_start, kind="stable")
    st, le = raw.gpu_start[order], raw.gpu_launch_end[order]
    keep = []
    for i in long.tolist():
        # the tasks that end the stretch: those starting within GAP_NS of its end
        lo, hi = np.searchsorted(st, [ge[i], ge[i] + GAP_NS], side="left")
        first = le[lo:hi]
        keep.append(bool(len(first)) and bool(((first >= 0) & (first <= gs[i])).all()))
    k = long[np.array(keep, bool)] if keep else long[:0]
    return gs[k].astype(np.int64), ge[k].astype(np.int64)


def bounds(path: str | Path) -> dict:
    """G and C per step and their medians over the steady steps (ms). See the module doc."""
    raw = read(path)
    stp, rule = steps(raw)
    dev_iv = {}
    for d in sorted(set(raw.gpu_dev.tolist())):
        m = raw.gpu_dev == d
        dev_iv[d] = merge(raw.gpu_start[m], raw.gpu_end[m])
    all_iv = merge(raw.gpu_start, raw.gpu_end)
    nc = ~raw.gpu_comm
    dev_nc = {d: merge(raw.gpu_start[nc & (raw.gpu_dev == d)], raw.gpu_end[nc & (raw.gpu_dev == d)])
              for d in dev_iv}
    all_nc = merge(raw.gpu_start[nc], raw.gpu_end[nc])
    str_iv = stream_intervals(raw)
    costs = call_costs(raw)
    threads = sorted(set(raw.ops) | set(raw.calls), key=str)
    # GPU time under a wait on what the trace does not show cannot shorten the step
    gpu_cover = subtract(*all_iv, *untraced_waits(raw, str_iv))
    idle_s, idle_e = untraced_idle(raw, all_iv)
    rows = []
    for s in stp:
        w0, w1 = s.start_ns, s.end_ns
        per_dev = {d: covered(*iv, w0, w1) for d, iv in dev_iv.items()}
        per_thread = {k: thread_work(raw, costs, k, w0, w1) for k in threads}
        # W: neither a GPU task nor any thread's own work (or short gap) in the window
        cover = [gpu_cover] + [v["own"] for v in per_thread.values()] + \
            [v["short"] for v in per_thread.values()]
        # C_union: time in which some thread does its own work; where threads hand work to
        # each other (forward on the main thread, backward on the autograd thread) it is the
        # CPU's serial share of the step
        owns = [v["own"] for v in per_thread.values()]
        cu_s, cu_e = union(owns)
        # C_serial: the same with every thread's short gaps (the Python and dispatcher work
        # between its operators): the CPU's serial work when it sets the pace
        cs_s, cs_e = union(owns + [v["short"] for v in per_thread.values()])
        # GPU idle that nothing traced ended counts in W even where a thread works under it
        us, ue = subtract(*union(cover), idle_s, idle_e)
        rows.append({
            "label": s.label, "steady": s.steady, "why": s.why,
            "start_ns": w0, "end_ns": w1,
            "T_ms": (w1 - w0) / 1e6,
            "G_ms": max(per_dev.values(), default=0) / 1e6,
            "G_all_ms": covered(*all_iv, w0, w1) / 1e6,
            "G_nc_ms": max((covered(*iv, w0, w1) for iv in dev_nc.values()), default=0) / 1e6,
            "G_all_nc_ms": covered(*all_nc, w0, w1) / 1e6,
            "G_stream_ms": max((covered(*iv, w0, w1) for iv in str_iv.values()),
                               default=0) / 1e6,
            "C_max_ms": max((v["own_ns"] for v in per_thread.values()), default=0) / 1e6,
            "C_sum_ms": sum(v["own_ns"] + v["short_gap_ns"] for v in per_thread.values())
            / 1e6,
            "C_union_ms": covered(cu_s, cu_e, w0, w1) / 1e6,
            "C_serial_ms": covered(cs_s, cs_e, w0, w1) / 1e6,
            "W_ms": (w1 - w0 - covered(us, ue, w0, w1)) / 1e6,
            "C_thread_ms": {"/".join(k) if isinstance(k, tuple) else k: v["own_ns"] / 1e6
                            for k, v in per_thread.items()},
        })
    steady = [r for r in rows if r["steady"]]
    keys = ("T_ms", "G_ms", "G_all_ms", "G_nc_ms", "G_all_nc_ms", "G_stream_ms", "C_max_ms",
            "C_sum_ms", "C_union_ms", "C_serial_ms", "W_ms")
    med = {k: statistics.median(r[k] for r in steady) for k in keys}
    mean = {k: statistics.fmean(r[k] for r in steady) for k in keys}
    return {"file": str(path), "rule": rule, "steps": rows, "steady": len(steady),
            "median": med, "mean": mean,
            "gpu_bound": gpu_floor(med) >= 0.9 * med["T_ms"],
            "cpu_bound": med["C_max_ms"] >= 0.9 * med["T_ms"]}


def gpu_floor(m: dict, peers_in_trace: bool = False) -> float:
    """The GPU's floor (ms) from a step's figures: its busiest stream, and the busiest
    device's work without the collectives, which run beside it on their own stream and may
    overlap it more than they did (a collective's time is transfer and waiting for the slowest
    peer). With every rank's trace (``peers_in_trace``) a change to all ranks alike can end
    the waiting, so the busiest stream (a collective's, waiting) is no floor there."""
    g = m.get("G_nc_ms", m["G_ms"])
    return g if peers_in_trace else max(g, m.get("G_stream_ms", g))


def edges(b: dict, which: str, f: float) -> tuple[float, float]:
    """[lower, upper] edge (ms) of a step with the GPU (which='gpu') or the CPU work scaled by
    f, from the medians of ``bounds`` (``peers_in_trace``: the figures are a whole job's)."""
    m = b["median"]
    # the upper edge keeps collectives whole: their waiting need not scale
    g_all, g_nc = m["G_all_ms"], m.get("G_all_nc_ms", m["G_all_ms"])
    g_lo = gpu_floor(m, bool(b.get("peers_in_trace")))
    if which == "gpu":
        return (max(f * g_lo, m["C_max_ms"]),
                f * g_nc + (g_all - g_nc) + m["C_sum_ms"] + m["W_ms"])
    if which == "cpu":
        return (max(g_lo, f * m["C_max_ms"]),
                g_all + f * m["C_sum_ms"] + m["W_ms"])
    raise ValueError(f"which must be 'gpu' or 'cpu', not {which!r}")


# ---- the dependency floor: what the host's blocking calls leave of the overlap --------------

def _prefix(own_s: np.ndarray, own_e: np.ndarray):
    """F(t), the length of the sorted disjoint intervals before each t, vectorized."""
    lens = own_e - own_s
    cum = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)

    def before(t) -> np.ndarray:
        t = np.asarray(t, np.int64)
        if not len(own_s):
            return np.zeros(t.shape, np.int64)
        i = np.searchsorted(own_s, t, side="right")
        j = np.clip(i - 1, 0, None)
        part = np.clip(t - own_s[j], 0, lens[j])
        return np.where(i > 0, cum[j] + part, 0)
    return before


def _blocks(raw: Raw, key, pageable: dict) -> list[tuple[int, int, object, list[int]]]:
    """A thread's blocking calls in time order: (start, end, streams it waits for, its own GPU
    tasks). A copy into pageable memory (``pageable``: correlation id -> its GPU tasks) waits
    for its stream (and is itself GPU work); a device sync for every stream (streams None); a
    stream or event sync for a stream the trace does not name (an empty set: it cuts the
    host's work but bounds no GPU work)."""
    cs, ce, names = raw.calls.get(key, (np.zeros(0, np.int64),) * 2 + ([],))
    corr = raw.call_corr.get(key, np.full(len(cs), -1, np.int64))
    out = []
    for i, n in enumerate(names):
        c = int(corr[i])
        if c in pageable:
            tasks = pageable[c]
            out.append((int(cs[i]), int(ce[i]), {raw.gpu_stream[t] for t in tasks}, tasks))
        elif _SYNC_RE.match(n):
            out.append((int(cs[i]), int(ce[i]), None if "Device" in n else set(), []))
    return sorted(out, key=lambda b: b[0])


def _floor(raw: Raw, keys: list, own, w0: int, w1: int, f: float, by_corr: dict,
           blocks_of: dict) -> int:
    """The least time (ns) of [w0, w1) with every GPU task x f, for the host threads ``keys``
    run one after another (their own work ``own``: F(t) summed over them). Cut at their
    blocking calls (``blocks_of``: ``_blocks`` per thread): the stretch before a call holds
    at least the threads' own work in it, and for each call k in it that launched work onto
    what the blocking call waits for, the own work before k plus f x the work launched from k
    on (it can start no earlier than its launch and must end before the blocking call
    returns)."""
    blocks = sorted((b for k in keys for b in blocks_of[k] if w0 <= b[0] < w1),
                    key=lambda b: b[0])
    launches = []  # (start, correlation id) of the threads' calls in the window, in time order
    for k in keys:
        cs = raw.calls.get(k, (np.zeros(0, np.int64),))[0]
        corr = raw.call_corr.get(k, np.full(len(cs), -1, np.int64))
        m = (cs >= w0) & (cs < w1) & (corr >= 0)
        launches += list(zip(cs[m].tolist(), corr[m].tolist(), strict=True))
    launches.sort()
    l_start = np.array([t for t, _ in launches], np.int64)
    total, s0 = 0, w0
    for b_start, b_end, streams, own_tasks in blocks + [(w1, w1, set(), [])]:
        s1 = max(s0, b_start)
        floor = int(own(s1) - own(s0))
        if streams is None or streams:
            lo, hi = np.searchsorted(l_start, [s0, s1])
            times, work = [], []
            for t, c in launches[lo:hi]:
                d = sum(int(raw.gpu_end[g] - raw.gpu_start[g]) for g in by_corr.get(c, ())
                        if streams is None or raw.gpu_stream[g] in streams)
                if d:
                    times.append(t)
                    work.append(d)
            own_copy = sum(int(raw.gpu_end[g] - raw.gpu_start[g]) for g in own_tasks)
            if own_copy:
                times.append(s1)
                work.append(own_copy)
            if work:
                tail = np.cumsum(np.array(work[::-1], np.float64))[::-1] * f
                floor = max(floor, int((own(np.array(times)) - own(s0) + tail).max()))
        total += floor
        s0 = max(s0, min(b_end, w1))
    return total


def sync_floor(trace: str | Path | Raw, f: float, short_gaps: bool = False,
               median_calls: bool = False) -> dict:
    """Per step, the least time it can take with every GPU task x f, from the host threads
    that launch GPU work and their blocking calls (``_floor``): the threads taken one after
    another where their own work never overlaps in the trace (the main thread and the autograd
    thread hand work to each other), else each alone (the floor is the largest). A sound floor
    (no schedule of the same work is shorter, the host's own work fixed), unlike max(f G, C),
    which assumes the host's work and the GPU's could overlap wholly. ``short_gaps``: the
    threads' short gaps count as their work too (C_sum's rule, and the judge's: Python and the
    dispatcher between operators), a floor on the premise that they are work; without them
    it is C_max's rule, sound whatever they are. ``median_calls``: each call costs the lesser
    of its duration and its name's median, not also its tail after the last GPU task that
    ended inside it (``call_costs``): with ``short_gaps``, the judge's rule for C exactly. On
    a GPU that ends a task every few microseconds nearly every call holds such an end, and
    the tail rule counts less host work. TRACE: a file, or one ``read`` already (every floor
    of one trace reads it once). Kineto traces only."""
    raw = trace if isinstance(trace, Raw) else read(trace)
    if raw.source != "kineto":
        raise ValueError("sync_floor reads Kineto traces (it needs correlation ids)")
    stp, rule = steps(raw)
    by_corr: dict = {}
    for i, c in enumerate(raw.gpu_corr.tolist()):
        if c >= 0:
            by_corr.setdefault(c, []).append(i)
    launched = set(by_corr)
    pageable = {c: [g for g in gs if raw.gpu_to_pageable[g]] for c, gs in by_corr.items()}
    pageable = {c: gs for c, gs in pageable.items() if gs}
    keys = [k for k in sorted(raw.calls, key=str)
            if launched.intersection(raw.call_corr.get(k, np.zeros(0, np.int64)).tolist())]
    costs = call_costs(raw, with_tail=not median_calls)
    lo, hi = raw.span
    work = {k: thread_work(raw, costs, k, lo, hi + 1) for k in keys}
    owns = {k: union([v["own"], v["short"]]) if short_gaps else v["own"]
            for k, v in work.items()}
    own_sum = sum(covered(*v, lo, hi + 1) for v in owns.values())
    overlap = own_sum - covered(*union(list(owns.values())), lo, hi + 1)
    chained = len(keys) > 1 and overlap <= 0.01 * own_sum
    prefix = {k: _prefix(*owns[k]) for k in keys}
    blocks_of = {k: _blocks(raw, k, pageable) for k in keys}
    rows = []
    for st in stp:
        if chained:
            fl = _floor(raw, keys, lambda t: sum(prefix[k](t) for k in keys), st.start_ns,
                        st.end_ns, f, by_corr, blocks_of)
        else:
            fl = max((_floor(raw, [k], prefix[k], st.start_ns, st.end_ns, f, by_corr,
                             blocks_of) for k in keys), default=0)
        rows.append({"label": st.label, "steady": st.steady, "T_ms": st.length_ns / 1e6,
                     "floor_ms": fl / 1e6,
                     "speedup_max": st.length_ns / fl if fl else float("inf")})
    steady = [r for r in rows if r["steady"]]
    t_ms, fl_ms = sum(r["T_ms"] for r in steady), sum(r["floor_ms"] for r in steady)
    return {"file": "" if isinstance(trace, Raw) else str(trace), "f": f,
            "short_gaps": short_gaps, "median_calls": median_calls, "rule": rule,
            "threads": ["/".join(k) for k in keys],
            "chained": chained, "overlap_ms": overlap / 1e6, "steps": rows,
            "steady": {"steps": len(steady), "T_ms": t_ms, "floor_ms": fl_ms,
                       "speedup_max": t_ms / fl_ms if fl_ms else float("inf")}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="G and C per steady step from a raw trace.")
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--json", action="store_true", help="print the full result as JSON")
    ap.add_argument("--sync-floor", type=float, metavar="F",
                    help="the dependency floor of each step with every GPU task x F instead")
    ap.add_argument("--short-gaps", action="store_true",
                    help="with --sync-floor: the threads' short gaps count as their work")
    ap.add_argument("--median-calls", action="store_true",
                    help="with --sync-floor: a call costs the lesser of its duration and its "
                         "name's median only (the judge's rule)")
    a = ap.parse_args(argv)
    for t in a.traces:
        floor = a.sync_floor is not None
        b = (sync_floor(t, a.sync_floor, a.short_gaps, a.median_calls) if floor
             else bounds(t))
        if a.json:
            sys.stdout.write(orjson.dumps(b, option=orjson.OPT_INDENT_2).decode() + "\n")
        elif floor:
            print(f"{t}: GPU x{a.sync_floor}, threads {', '.join(b['threads'])} "
                  f"({'one after another' if b['chained'] else 'each alone'}); "
                  + "; ".join(f"{r['label']} {r['T_ms']:.2f} ms >= {r['floor_ms']:.2f} ms "
                              f"(at most {r['speedup_max']:.2f}x)" for r in b["steps"])
                  + f"; steady steps together at most {b['steady']['speedup_max']:.2f}x")
        else:
            m = b["median"]
            print(f"{t}: {b['rule']}, {b['steady']} steady of {len(b['steps'])} steps; "
                  f"median T {m['T_ms']:.2f} G {m['G_ms']:.2f} "
                  f"({100 * m['G_ms'] / m['T_ms']:.1f}%) G_all {m['G_all_ms']:.2f} "
                  f"G_stream {m['G_stream_ms']:.2f} C_max {m['C_max_ms']:.2f} "
                  f"C_sum {m['C_sum_ms']:.2f} W {m['W_ms']:.2f} ms")


if __name__ == "__main__":
    main()
