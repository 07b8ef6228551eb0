"""The evidence of each kind of inferred edge, checked against the raw trace on calibration traces.

    python bench/edge_evidence.py [--store DIR] [--json]

The graph infers some edges from a coincidence of times rather than reading them from the trace
(``edge.inferred``: docs/graph.md). For each kind this script states the rule's evidence and,
on the calibration traces of bench/manifest.py (read through ``manifest.calibration_path``,
never a judged trace), counts the inferred instances the raw trace confirms by a record of its
own (flows, correlation ids, ``cuda_sync`` records), those it contradicts, and those it has no
record to decide. The graph is read for the edges only; every confirmation comes from the raw
JSON events.
"""

from __future__ import annotations

import argparse
import gzip
import sys
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import manifest  # noqa: E402

KINDS = ("sync", "wait", "queue", "wake", "contention")
# what the graph infers each kind from, and what in a raw trace can confirm it
EVIDENCE = {
    "sync": ("a blocking call without a record of what it waited for is tied to the GPU task "
             "that ended last inside it", "a cuda_sync record of the call (its correlation id) "
             "naming the task's stream, or a device-wide sync"),
    "wait": ("a GPU task is tied to another stream's task: by the order of a wait call and "
             "the launches around it on its thread, or, starting later than its stream and "
             "launch allow, to a task that ended within WAIT_TOL_NS before it", "a cuda_sync "
             "'Stream Wait Event' record on the waiting stream naming the other stream "
             "(wait_on_stream), issued between the two tasks' launches"),
    "queue": ("a launch that ran long near its stream's queue depth is tied to the task whose "
              "end released it", "the releasing task is on the stream the call launches to "
              "(correlation ids) and ended inside the call"),
    "wake": ("a thread's long idle stretch ending within WAKE_TOL_NS after a task on another "
             "thread of its process ended is tied to that task", "a flow (fwdbwd and the like) "
             "from the waking thread to the woken one (it links the threads, not the "
             "instant)"),
    "contention": ("a kernel that waited for room is tied to another stream's kernel running "
                   "when it became ready", "none: a trace records no SM occupancy"),
}


def raw_events(path: Path) -> list[dict]:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    d = orjson.loads(data)
    return d["traceEvents"] if isinstance(d, dict) else d


def raw_index(ev: list[dict]) -> dict:
    """What the confirmations read: GPU tasks' streams and calls' names by correlation id,
    cuda_sync records by correlation id and by stream, flows as (start thread, end thread)."""
    stream_of, sync_by_corr, waits, flows = {}, {}, {}, {}
    for e in ev:
        cat = str(e.get("cat", "")).lower()
        a = e.get("args") or {}
        if e.get("ph") == "X" and cat in ("kernel", "gpu_memcpy", "gpu_memset", "memcpy",
                                          "memset") and "correlation" in a:
            stream_of[int(a["correlation"])] = a.get("stream", e.get("tid"))
        elif e.get("ph") == "X" and cat == "cuda_sync":
            if "correlation" in a:
                sync_by_corr.setdefault(int(a["correlation"]), []).append(a)
            if str(a.get("cuda_sync_kind", e.get("name"))).startswith("Stream Wait"):
                waits.setdefault(a.get("stream"), []).append(
                    (round(float(e["ts"]) * 1000), a.get("wait_on_stream")))
        elif e.get("ph") in ("s", "f") and cat != "ac2g" and "id" in e:
            f = flows.setdefault((cat, e["id"]), [None, None])
            f[0 if e["ph"] == "s" else 1] = (e.get("pid"), e.get("tid"))
    pairs = {(tuple(map(str, s)), tuple(map(str, t))) for s, t in flows.values() if s and t}
    return {"stream_of": stream_of, "sync": sync_by_corr, "waits": waits, "flows": pairs}


def classify(g: dict, ix: dict) -> dict[str, dict[str, int]]:
    """Per inferred kind: instances, confirmed, contradicted, no record."""
    t, e, u = g["task"], g["edge"], g["unit"]
    inf = e["inferred"].to_numpy()
    ek = np.asarray(e["kind"].to_pylist(), object)
    src, dst = e["src"].to_numpy(), e["dst"].to_numpy()
    corr = t["correlation"].to_numpy()
    unit = t["unit_id"].to_numpy()
    start = t["start_ns"].to_numpy()
    end = start + t["obs_dur_ns"].to_numpy()
    names = t["name"].to_pylist()
    upid, utid = u["pid"].to_pylist(), u["tid"].to_pylist()
    ustream = u["stream"].to_pylist()
    uidx = {int(x): k for k, x in enumerate(u["unit_id"].to_pylist())}
    read_launch = (ek == "launch") & ~inf
    call = np.full(len(start), -1)
    call[dst[read_launch]] = src[read_launch]

    def stream(i):
        return ustream[uidx[int(unit[i])]]

    def thread(i):
        k = uidx[int(unit[i])]
        return (str(upid[k]), str(utid[k]))

    out = {k: {"instances": 0, "confirmed": 0, "contradicted": 0, "no_record": 0}
           for k in KINDS}
    for j in np.flatnonzero(inf):
        k = ek[j]
        if k not in out:
            continue
        s, d = int(src[j]), int(dst[j])
        verdict = "no_record"
        if k == "sync":
            name = str(names[d] or "")
            recs = ix["sync"].get(int(corr[d]), [])
            if "DeviceSynchronize" in name or any(
                    str(r.get("cuda_sync_kind", "")).startswith("Context") for r in recs):
                verdict = "confirmed"
            elif recs:
                st = {r.get("stream") for r in recs} - {None, -1}
                if st:
                    verdict = "confirmed" if stream(s) in st else "contradicted"
        elif k == "wait":
            # the records on the waiting stream issued after the awaited task's launch (or
            # its start, without one) and before the waiting task's launch (or start)
            lo = start[call[s]] if call[s] >= 0 else start[s]
            hi = start[call[d]] if call[d] >= 0 else start[d]
            named = {w for ts, w in ix["waits"].get(stream(d), []) if lo <= ts <= hi}
            if named:
                verdict = "confirmed" if stream(s) in named else "contradicted"
        elif k == "queue":
            target = ix["stream_of"].get(int(corr[d]))
            if target is not None:
                ok = target == stream(s) and start[d] < end[s] <= end[d]
                verdict = "confirmed" if ok else "contradicted"
        elif k == "wake":
            if ix["flows"]:
                verdict = "confirmed" if (thread(s), thread(d)) in ix["flows"] else "no_record"
        out[k]["instances"] += 1
        out[k][verdict] += 1
    return out


def evidence(store: Path) -> dict:
    """Per calibration trace and in all: the counts of ``classify``."""
    from daydream import api
    from daydream.graphstore.read import read_graph
    per, total = {}, {k: {"instances": 0, "confirmed": 0, "contradicted": 0, "no_record": 0}
                      for k in KINDS}
    for rel in manifest.calibration("edges"):
        p = manifest.calibration_path(rel)
        if not p.exists():
            continue
        tid = api.resolve_trace(str(p), api.open_store(store), ingest_missing=True)
        api.build_graphs(api.open_store(store), strict=True)
        c = classify(read_graph(store, tid), raw_index(raw_events(p)))
        per[rel] = c
        for k in KINDS:
            for x, v in c[k].items():
                total[k][x] += v
    return {"traces": per, "total": total,
            "evidence": {k: {"rule": r, "confirmed_by": c} for k, (r, c) in EVIDENCE.items()}}


def lines(d: dict) -> list[str]:
    out = ["| inferred kind | inferred from | the raw trace confirms it by | instances | "
           "confirmed | contradicted | no record | share confirmed |",
           "|---|---|---|---|---|---|---|---|"]
    for k in KINDS:
        c, ev = d["total"][k], d["evidence"][k]
        share = "n/a" if not c["instances"] else f"{100 * c['confirmed'] / c['instances']:.0f}%"
        out.append(f"| {k} | {ev['rule']} | {ev['confirmed_by']} | {c['instances']} | "
                   f"{c['confirmed']} | {c['contradicted']} | {c['no_record']} | {share} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=ROOT / ".daydream-calibration")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    d = evidence(a.store)
    if a.json:
        print(orjson.dumps(d, option=orjson.OPT_INDENT_2).decode())
        return 0
    print("\n".join(lines(d)))
    for rel, c in d["traces"].items():
        got = ", ".join(f"{k} {v['confirmed']}/{v['instances']}" for k, v in c.items()
                        if v["instances"])
        print(f"{rel}: {got or 'no inferred edges'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
