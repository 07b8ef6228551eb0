"""Fit the graph's physical latencies (graphstore/latency.py) on calibration traces.

    python bench/calibrate_latency.py [--store DIR]

A lag in the graph is a physical latency, never a figure fitted to the trace being replayed
(../shared/ACCURACY.md, section 1). This script measures each latency where a trace shows it
unobstructed and takes the median over the calibration traces: those bench/manifest.py gives
the role "calibrate" for "latency" (it reads them through ``manifest.calibration_path``, which
refuses a judged trace: a fitting script never reads one). It also prints the checks of the
graph's tolerances on the same traces (manifest.FITS: WAIT_TOL_NS against the recorded waits,
UNSEEN_RELEASE_TOL_NS against the queue edges the traces show).

What is measured, per trace (only launch and stream order are read from the graph: they come
from correlation ids and stream order, not from any lag):

- stream: GPU task start - end of its stream predecessor, for tasks launched at least 20 us
  before that predecessor ended (so neither the launch nor anything else held them);
- launch: kernel start - end of its launching call, for kernels whose stream was idle when the
  call began (the call alone decided the start);
- sync: end of a blocking call - end of the GPU task it waited for, for calls that began
  before that task ended: the floor (10th percentile) is the wake-up latency, the rest is the
  call's own cost after its wait.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import manifest  # noqa: E402
from daydream import api  # noqa: E402
from daydream.graphstore.read import read_graph  # noqa: E402

SHARED = manifest.SHARED
CALIBRATION = manifest.calibration("latency")
MIN_SAMPLES = 20  # a trace's median counts only when it rests on this many samples
# The ads traces keep a sample of the events (HTA's trace_filter test data): gaps between the
# kernels left in them are not kernel-to-kernel gaps, so they calibrate no stream latency.
SAMPLED = {"hta/ads_sampled_rank0_of128.json.gz", "hta/ads_sampled_rank1_of128.json.gz"}
# the tolerances of graphstore/build.py checked here (read from the source, not imported: the
# check must say what the file holds today)
TOLERANCES = ("WAIT_TOL_NS", "UNSEEN_RELEASE_TOL_NS")
GPU = ("kernel", "memcpy", "memset", "comm")


def samples(g: dict) -> dict[str, np.ndarray]:
    """Observed latencies of one graph, ns, by class (see the module doc)."""
    t, e = g["task"], g["edge"]
    start = t["start_ns"].to_numpy()
    end = start + t["obs_dur_ns"].to_numpy()
    kind = np.asarray(t["kind"].to_pylist(), object)
    ek = np.asarray(e["kind"].to_pylist(), object)
    src, dst = e["src"].to_numpy(), e["dst"].to_numpy()
    n = len(start)
    inferred = (e["inferred"].to_numpy() if "inferred" in e.column_names
                else np.zeros(len(ek), bool))
    call = np.full(n, -1)
    call[dst[ek == "launch"]] = src[ek == "launch"]
    prev = np.full(n, -1)
    prev[dst[ek == "stream"]] = src[ek == "stream"]
    gpu = np.flatnonzero(np.isin(kind, GPU))
    waited = np.zeros(n, bool)
    waited[dst[ek == "wait"]] = True
    sb = gpu[(call[gpu] >= 0) & (prev[gpu] >= 0) & ~waited[gpu]]
    sb = sb[end[call[sb]] + 20_000 < end[prev[sb]]]
    lb = gpu[(call[gpu] >= 0) & (kind[gpu] == "kernel") & ~waited[gpu]]
    lb = lb[(prev[lb] < 0) | (end[np.maximum(prev[lb], 0)] < start[call[lb]])]
    sy = ek == "sync"
    s_src, s_dst = src[sy], dst[sy]
    blocked = end[s_src] > start[s_dst]
    # recorded cross-stream waits that decided their task's start (its launch and stream
    # predecessor were done before the recorded work was)
    rw = (ek == "wait") & ~inferred
    w_src, w_dst = src[rw], dst[rw]
    decided = (((call[w_dst] < 0) | (end[np.maximum(call[w_dst], 0)] < end[w_src]))
               & ((prev[w_dst] < 0) | (end[np.maximum(prev[w_dst], 0)] < end[w_src])))
    # queue edges read from a blocked call (inferred: the call ran long until one of its
    # stream's tasks ended) whose own GPU task is in the trace (so not decided by
    # UNSEEN_RELEASE_TOL_NS itself): the call's end - the end of the task that freed its slot
    launched = np.zeros(n, bool)
    launched[src[ek == "launch"]] = True
    qe = (ek == "queue") & inferred & launched[dst]
    return {"stream": start[sb] - end[prev[sb]],
            "launch": start[lb] - end[call[lb]],
            "wait": start[w_dst[decided]] - end[w_src[decided]],
            "sync": end[s_dst[blocked]] - end[s_src[blocked]],
            "queue": end[dst[qe]] - end[src[qe]]}


def tolerance(name: str) -> int:
    """A tolerance's value as graphstore/build.py writes it today."""
    import re
    m = re.search(rf"^{name} = ([\d_]+)", (ROOT / "graphstore" / "build.py").read_text(), re.M)
    return int(m.group(1).replace("_", ""))


def trace_stats(store: Path, rel: str) -> dict | None:
    p = manifest.calibration_path(rel)
    if not p.exists():
        return None
    tid = api.resolve_trace(str(p), api.open_store(store), ingest_missing=True)
    api.build_graphs(api.open_store(store), strict=True)
    s = samples(read_graph(store, tid))
    out = {k: (len(v), float(np.median(v)) if len(v) else None,
               float(np.percentile(v, 10)) if len(v) else None) for k, v in s.items()}
    out["sync_samples"] = s["sync"].tolist()
    out["wait_samples"] = s["wait"].tolist()
    out["queue_samples"] = s["queue"].tolist()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", type=Path, default=ROOT / ".daydream-calibration")
    a = ap.parse_args(argv)
    per: dict[str, list[float]] = {"stream": [], "launch": [], "wait": [], "sync": []}
    waits: list[int] = []
    floors: list[int] = []
    queues: list[int] = []
    print("| trace | stream n / median us | launch n / median us | wait n / median us | "
          "sync n / median / p10 us | queue n |")
    print("|---|---|---|---|---|---|")
    for rel in CALIBRATION:
        st = trace_stats(a.store, rel)
        if st is None:
            print(f"| {rel} | not here | | | | |")
            continue
        cells = []
        for k in ("stream", "launch", "wait", "sync"):
            cnt, med, p10 = st[k]
            cells.append("-" if not cnt else f"{cnt} / {med / 1e3:.2f}" +
                         (f" / {p10 / 1e3:.2f}" if k == "sync" else ""))
            if cnt >= MIN_SAMPLES and not (k == "stream" and rel in SAMPLED):
                per[k].append(med)
        floors.extend(st["sync_samples"])
        waits.extend(st["wait_samples"])
        queues.extend(st["queue_samples"])
        print(f"| {rel} | " + " | ".join(cells) + f" | {len(st['queue_samples'])} |")
    print()
    for k, v in per.items():
        if v:
            print(f"{k}: median of {len(v)} calibration-trace medians = "
                  f"{np.median(v) / 1e3:.2f} us ({', '.join(f'{x / 1e3:.2f}' for x in v)})")
        else:
            print(f"{k}: no calibration trace has {MIN_SAMPLES} samples")
    if floors:
        print(f"sync floor: 10th percentile of {len(floors)} blocked-call tails of the "
              f"calibration traces = {np.percentile(floors, 10) / 1e3:.2f} us")
    # the tolerances, checked on the calibration traces alone
    wt = tolerance("WAIT_TOL_NS")
    if waits:
        w = np.asarray(waits)
        print(f"WAIT_TOL_NS ({wt / 1e3:.0f} us): {len(w)} recorded waits that decided their "
              f"task's start: median {np.median(w) / 1e3:.2f} us, 90th percentile "
              f"{np.percentile(w, 90) / 1e3:.2f} us, max {w.max() / 1e3:.2f} us; "
              f"{int((w <= wt).sum())} within it, {int((w <= 3_000).sum())} within 3 us")
    else:
        print(f"WAIT_TOL_NS ({wt / 1e3:.0f} us): no calibration trace records a wait that "
              "decided its task's start: not checked")
    ut = tolerance("UNSEEN_RELEASE_TOL_NS")
    if queues:
        q = np.asarray(queues)
        print(f"UNSEEN_RELEASE_TOL_NS ({ut / 1e3:.0f} us): {len(q)} blocked calls of the "
              f"calibration traces, released by a task the trace shows: median "
              f"{np.median(q) / 1e3:.2f} us, max "
              f"{q.max() / 1e3:.2f} us; {int((q <= ut).sum())} within it")
    else:
        print(f"UNSEEN_RELEASE_TOL_NS ({ut / 1e3:.0f} us): no calibration trace fills its "
              "launch queue: not checked")


if __name__ == "__main__":
    main()
