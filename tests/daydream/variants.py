"""Distinct copies of real Kineto traces, for fleet tests and the fleet benchmark.

Copy ``k`` of a trace has every event shifted by ``k`` ms and every GPU kernel renamed with a
``__v<k>`` suffix (class patterns such as 'gemm' still match), so each copy has its own content
hash and its own kernel names, while its structure (and so its graph) is the real one.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson


def variant(doc: dict, k: int) -> bytes:
    events = []
    for e in doc.get("traceEvents", []):
        e2 = dict(e)
        if isinstance(e2.get("ts"), int | float):
            e2["ts"] = round(e2["ts"] + 1000.0 * k, 3)
        if e2.get("cat") == "kernel" and isinstance(e2.get("name"), str):
            e2["name"] = f"{e2['name']}__v{k}"
        events.append(e2)
    out = {key: v for key, v in doc.items() if key != "traceEvents"}
    out["traceEvents"] = events
    return orjson.dumps(out)


def make_variants(sources: list[Path], n: int, out_dir: Path, gz: bool = True) -> list[Path]:
    """``n`` distinct trace files in ``out_dir``, cycling over ``sources``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    docs = []
    for s in sources:
        op = gzip.open if s.name.endswith(".gz") else open
        with op(s, "rb") as f:
            docs.append((s.name.split(".")[0], orjson.loads(f.read())))
    files = []
    for i in range(n):
        name, doc = docs[i % len(docs)]
        data = variant(doc, i // len(docs) + 1)
        p = out_dir / f"{name}_{i:05d}.json{'.gz' if gz else ''}"
        p.write_bytes(gzip.compress(data, 1) if gz else data)
        files.append(p)
    return files
