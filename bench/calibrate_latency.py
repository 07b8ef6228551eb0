"""Fit the graph's physical latencies (graphstore/latency.py) on calibration traces.

    python bench/calibrate_latency.py [--store DIR] [--all]

A lag in the graph is a physical latency, never a figure fitted to the trace being replayed
(../shared/ACCURACY.md, section 1). This script measures each latency where a trace shows it
unobstructed and takes the median over the calibration traces: real traces in
../shared/traces that no accuracy measure judges (particle/ forward passes, hta/small/ and
hta/ads_sampled_*; the training traces of bench/accuracy are left out). ``--all`` prints the
same statistics for every shared trace, judged ones included, to show how far the constants
are from each (for docs/accuracy.md; never written into graphstore/latency.py).

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

from daydream import api  # noqa: E402
from daydream.graphstore.read import read_graph  # noqa: E402

SHARED = ROOT.parent / "shared" / "traces"
CALIBRATION = ["particle/particle_transformer_a100_fwd_bs2.json.gz",
               "particle/particle_transformer_a100_fwd_bs16.json.gz",
               "particle/particle_transformer_a100_fwd_bs64.json.gz",
               "particle/particle_transformer_a100_fwd_bs256.json.gz",
               "hta/small/alexnet_fwd_a100.json.gz", "hta/small/simple_add_a100.json.gz",
               "hta/small/event_sync_single_stream.json.gz",
               "hta/small/event_sync_multi_stream.json.gz",
               "hta/small/mi250_toy_train_rocm.json.gz", "hta/small/backward_thread.json",
               "hta/small/triton_example.json.gz",
               "hta/ads_sampled_rank0_of128.json.gz", "hta/ads_sampled_rank1_of128.json.gz"]
MIN_SAMPLES = 20  # a trace's median counts only when it rests on this many samples
# The ads traces keep a sample of the events (HTA's trace_filter test data): gaps between the
# kernels left in them are not kernel-to-kernel gaps, so they calibrate no stream latency.
SAMPLED = {"hta/ads_sampled_rank0_of128.json.gz", "hta/ads_sampled_rank1_of128.json.gz"}
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
    inferred = e["inferred"].to_numpy() if "inferred" in e.column_names else np.zeros(len(ek),
                                                                                     bool)
    rw = (ek == "wait") & ~inferred
    w_src, w_dst = src[rw], dst[rw]
    decided = (((call[w_dst] < 0) | (end[np.maximum(call[w_dst], 0)] < end[w_src]))
               & ((prev[w_dst] < 0) | (end[np.maximum(prev[w_dst], 0)] < end[w_src])))
    return {"stream": start[sb] - end[prev[sb]],
            "launch": start[lb] - end[call[lb]],
            "wait": start[w_dst[decided]] - end[w_src[decided]],
            "sync": end[s_dst[blocked]] - end[s_src[blocked]]}


def trace_stats(store: Path, rel: str) -> dict | None:
    p = SHARED / rel
    if not p.exists():
        return None
    tid = api.resolve_trace(str(p), api.open_store(store), ingest_missing=True)
    api.build_graphs(api.open_store(store), strict=True)
    s = samples(read_graph(store, tid))
    out = {k: (len(v), float(np.median(v)) if len(v) else None,
               float(np.percentile(v, 10)) if len(v) else None) for k, v in s.items()}
    out["sync_samples"] = s["sync"].tolist()
    out["wait_samples"] = s["wait"].tolist()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", type=Path, default=ROOT / ".daydream-calibration")
    ap.add_argument("--all", action="store_true", help="also every shared trace")
    a = ap.parse_args()
    names = list(CALIBRATION)
    if a.all:
        names += sorted(str(p.relative_to(SHARED)) for p in SHARED.rglob("*")
                        if p.suffix in (".gz", ".sqlite", ".json") and ".et." not in p.name
                        and str(p.relative_to(SHARED)) not in CALIBRATION)
    per: dict[str, list[float]] = {"stream": [], "launch": [], "wait": [], "sync": []}
    waits: list[int] = []
    floors: list[int] = []
    print("| trace | stream n / median us | launch n / median us | wait n / median us | "
          "sync n / median / p10 us |")
    print("|---|---|---|---|---|")
    for rel in names:
        st = trace_stats(a.store, rel)
        if st is None:
            continue
        cells = []
        for k in ("stream", "launch", "wait", "sync"):
            cnt, med, p10 = st[k]
            cells.append("-" if not cnt else f"{cnt} / {med / 1e3:.2f}" +
                         (f" / {p10 / 1e3:.2f}" if k == "sync" else ""))
            if rel in CALIBRATION and cnt >= MIN_SAMPLES and not (k == "stream"
                                                                   and rel in SAMPLED):
                per[k].append(med)
            if rel in CALIBRATION and k == "sync":
                floors.extend(st["sync_samples"])
            if rel in CALIBRATION and k == "wait":
                waits.extend(st["wait_samples"])
        print(f"| {rel} | " + " | ".join(cells) + " |")
    print()
    for k, v in per.items():
        if v:
            print(f"{k}: median of {len(v)} calibration-trace medians = "
                  f"{np.median(v) / 1e3:.2f} us ({', '.join(f'{x / 1e3:.2f}' for x in v)})")
    if waits:
        print(f"wait: {len(waits)} recorded waits of the calibration traces: median "
              f"{np.median(waits) / 1e3:.2f} us, 90th percentile "
              f"{np.percentile(waits, 90) / 1e3:.2f} us, max {max(waits) / 1e3:.2f} us")
    if floors:
        print(f"sync floor: 10th percentile of {len(floors)} blocked-call tails of the "
              f"calibration traces = {np.percentile(floors, 10) / 1e3:.2f} us")


if __name__ == "__main__":
    main()
