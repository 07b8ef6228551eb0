"""Build a large Kineto trace by concatenating copies of a real one, for the memory benchmark.

Each copy is shifted in time past the previous one, and its correlation, external and flow ids
are offset so the copies stay distinct (launches still match their kernels).

    python bench/bigtrace.py SRC.json.gz OUT.json --target-mb 1024
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import orjson

ID_ARGS = ("correlation", "External id", "external id", "wait_on_cuda_event_record_corr_id")


def build(src: Path, out: Path, target_bytes: int = 0, n_copies: int | None = None) -> dict:
    """Write copies of ``src`` until ``target_bytes`` are written, or exactly ``n_copies``."""
    op = gzip.open if src.name.endswith(".gz") else open
    with op(src, "rb") as f:
        doc = orjson.loads(f.read())
    events = doc.pop("traceEvents")
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(ts) - min(ts) + 1000.0
    id_step = 10 ** (len(str(len(events) * 50)))
    written = 0
    copies = 0
    n_events = 0
    head = orjson.dumps(doc)[:-1] + b', "traceEvents": [\n'
    with open(out, "wb") as f:
        f.write(head)
        first = True
        while written < target_bytes if n_copies is None else copies < n_copies:
            shift = copies * span
            off = copies * id_step
            for e in events:
                e2 = dict(e)
                if isinstance(e2.get("ts"), (int, float)):
                    e2["ts"] = round(e2["ts"] + shift, 3)
                if "id" in e2 and isinstance(e2["id"], int):
                    e2["id"] += off
                args = e2.get("args")
                if isinstance(args, dict):
                    a2 = dict(args)
                    for k in ID_ARGS:
                        if isinstance(a2.get(k), int) and a2[k] >= 0:
                            a2[k] += off
                    e2["args"] = a2
                line = orjson.dumps(e2)
                if not first:
                    f.write(b",\n")
                first = False
                f.write(line)
                written += len(line) + 2
                n_events += 1
            copies += 1
        f.write(b"\n]}\n")
    return {"copies": copies, "events": n_events, "bytes": out.stat().st_size}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--target-mb", type=int, default=1024)
    ap.add_argument("--copies", type=int, help="exactly this many copies (not --target-mb)")
    a = ap.parse_args()
    print(build(a.src, a.out, a.target_mb << 20, a.copies))
