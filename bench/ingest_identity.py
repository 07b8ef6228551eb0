"""Byte-identity check of ingest's output: convert every trace, fingerprint every Parquet table.

    python bench/ingest_identity.py OUT.json [--traces DIR ...] [--mutants N] [--big FILE ...]
    python bench/ingest_identity.py --compare BEFORE.json AFTER.json

Run it once with the code before a change and once after, then ``--compare``. Each file is
converted with ``ingest.convert.read_trace`` and written with ``ingest.store.write_staged`` as
``daydream ingest`` writes it; the fingerprint of a table is the SHA-256 of its Parquet file's
bytes, except for ``trace``, whose ``ingested_at`` is the clock: its other columns are hashed as
Arrow IPC instead. A file that fails keeps its error message, so errors are compared too.

``--mutants N`` adds N damaged copies of each small trace (cut at a byte, a byte replaced, a value
swapped for one of another type), written to a temporary folder; their errors or tables must
not change either. The mutants are derived from a fixed seed, so both runs see the same ones.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHARED = ROOT.parent / "shared" / "traces"
PATTERNS = ("*.json", "*.json.gz", "*.sqlite", "*.cupti", "*.cupti.gz")
MUTANT_MAX_BYTES = 4 << 20  # mutate only traces whose JSON is at most this big


def _files(dirs: list[Path]) -> list[tuple[str, Path]]:
    """(label, path) of every trace: labels are paths below the folder named, so that runs
    from different checkouts compare."""
    out = set()
    for d in dirs:
        if d.is_file():
            out.add((d.name, d))
            continue
        for pat in PATTERNS:
            out.update((f"{d.name}/{p.relative_to(d)}", p) for p in d.rglob(pat) if p.is_file())
    return sorted(out)


def fingerprint(path: Path, label: str) -> dict:
    from daydream.base.errors import DaydreamError
    from daydream.ingest.convert import read_trace
    from daydream.ingest.store import write_staged

    with tempfile.TemporaryDirectory() as tmp:
        try:
            conv = read_trace(path)
            write_staged(conv, Path(tmp), label, path.stat().st_size, None)
        except DaydreamError as e:
            return {"error": str(e).replace(str(path), label)}
        except Exception as e:  # a bug, as `daydream ingest` reports it: compared all the same
            return {"error": f"internal error: {type(e).__name__}: {e}".replace(str(path),
                                                                                label)}
        return _hashes(Path(tmp), conv.events)


def _ipc_hash(t, extra: str = "") -> str:
    import pyarrow as pa

    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    h = hashlib.sha256(sink.getvalue())
    h.update(extra.encode())
    return h.hexdigest()


def _hashes(staged: Path, events: int) -> dict:
    """Per table: ``content``, the values as read back with every dictionary decoded, and the
    schema; ``.layout``, the same with the dictionaries as stored (their order and unused
    entries) and the column statistics; ``.bytes``, the file itself."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = {"events": events}
    for f in sorted(staged.iterdir()):  # the tables' files (ingest.store.table_file)
        name = f.name.removesuffix(".parquet")
        t = pq.read_table(f)
        if name == "trace":
            t = t.drop_columns(["ingested_at"])
        meta = pq.ParquetFile(f).metadata
        stats = []  # per column: what a reader may skip row groups by
        for i in range(meta.num_row_groups):
            for c in meta.row_group(i).to_dict()["columns"]:
                if c["path_in_schema"] != "ingested_at":
                    stats.append([c["path_in_schema"], c["num_values"], c.get("statistics")])
        schema = json.dumps([str(t.schema), sorted((k.decode(), v.decode()) for k, v in
                                                   (t.schema.metadata or {}).items()),
                             meta.num_rows, meta.num_row_groups])
        decoded = pa.table({c: (t[c].cast(t[c].type.value_type)
                                if pa.types.is_dictionary(t[c].type) else t[c])
                            for c in t.column_names})
        out[name] = _ipc_hash(decoded, schema)
        out[name + ".layout"] = _ipc_hash(t, schema + json.dumps(stats, default=str))
        if name != "trace":  # its bytes hold the clock
            out[name + ".bytes"] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def _json_bytes(path: Path) -> bytes | None:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if raw.lstrip()[:1] not in (b"{", b"["):
        return None
    return raw


def mutants(path: Path, n: int, seed: int) -> list[tuple[str, bytes]]:
    """Damaged copies of a JSON trace: cut short, a byte replaced, a value of the wrong type."""
    raw = _json_bytes(path)
    if raw is None or len(raw) > MUTANT_MAX_BYTES or n <= 0:
        return []
    rng = random.Random(f"{seed}:{path.name}")
    out = []
    swaps = [(b'"ts": ', b'"ts": "x'), (b'"dur": ', b'"dur": ['), (b'"name": "', b'"name": 7'),
             (b'"args": {', b'"args": ['), (b'"pid": ', b'"pid": {'), (b'"ph": "', b'"ph": 1'),
             (b'"correlation": ', b'"correlation": "'), (b'"grid": [', b'"grid": ["'),
             (b'"cat": "', b'"cat": tru'), (b"}, {", b"} {"), (b"\\", b"\\q")]
    for i in range(n):
        kind = i % 4
        if kind == 0:
            cut = rng.randrange(1, len(raw))
            out.append((f"cut{cut}", raw[:cut]))
        elif kind == 1:
            at = rng.randrange(len(raw))
            b = bytearray(raw)
            b[at] = rng.choice(b'{}[]",:0-.e\\ nx\x00\xff')
            out.append((f"byte{at}", bytes(b)))
        else:
            old, new = swaps[rng.randrange(len(swaps))]
            hits = []
            start = 0
            while len(hits) < 64:
                j = raw.find(old, start)
                if j < 0:
                    break
                hits.append(j)
                start = j + 1
            if not hits:
                continue
            j = rng.choice(hits)
            out.append((f"swap{j}", raw[:j] + new + raw[j + len(old):]))
    return out


def run(out: Path, dirs: list[Path], n_mut: int, big: list[Path]) -> None:
    res = {}
    for label, f in _files(dirs + big):
        res[label] = fingerprint(f, label)
        print(f"{label}: {'error' if 'error' in res[label] else 'ok'}", file=sys.stderr)
        with tempfile.TemporaryDirectory() as tmp:
            for tag, data in mutants(f, n_mut, seed=18):
                m = Path(tmp) / "m.json"
                m.write_bytes(data)
                res[f"{label}#{tag}"] = fingerprint(m, f"{label}#{tag}")
    out.write_text(json.dumps(res, indent=1, sort_keys=True))
    n_err = sum("error" in v for v in res.values())
    print(f"{len(res)} files ({n_err} errors) -> {out}", file=sys.stderr)


def _content(v: dict) -> dict:
    return {k: h for k, h in v.items() if "." not in k}


def compare(a: Path, b: Path) -> int:
    """Tables must hold the same values and schema, errors the same message. Counted apart:
    tables whose dictionaries are laid out differently (order, unused entries; the column
    statistics go with them) and files whose bytes differ. The reader before this change laid
    out dictionaries by batches that, in a gzipped file inflated by a thread, ended wherever the
    thread was; and pyarrow writes a few uninitialized bytes with some dictionary columns
    holding empty strings, so the bytes (and read-back statistics) of one table can differ
    between two runs of the same code, depending on what the process allocated before."""
    x, y = json.loads(a.read_text()), json.loads(b.read_text())
    bad = raw = layout = 0
    for k in sorted(set(x) | set(y)):
        u, v = x.get(k) or {}, y.get(k) or {}
        if _content(u) != _content(v):
            bad += 1
            print(f"DIFFERS {k}\n  before: {_content(u)}\n  after:  {_content(v)}")
        for t in u:
            if t.endswith(".layout") and u.get(t) != v.get(t):
                layout += 1
                print(f"layout {k} {t}")
        raw += sum(u.get(t) != v.get(t) for t in u if t.endswith(".bytes"))
    tables = sum(len(_content(v)) - 1 for v in x.values() if "error" not in v)
    errs = sum("error" in v for v in x.values())
    for name, d in (("before", x), ("after", y)):
        bugs = sorted(k for k, v in d.items() if v.get("error", "").startswith("internal"))
        if bugs:
            print(f"{name}: {len(bugs)} files raised something other than DaydreamError, "
                  f"e.g. {bugs[0]}: {d[bugs[0]]['error'][:160]}")
    print(f"{len(x)} files: {tables} tables and {errs} error messages compared; "
          f"{bad} differ; dictionary layout differs in {layout} tables, raw Parquet bytes in "
          f"{raw}")
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--traces", nargs="*", type=Path,
                    default=[SHARED, ROOT / "tests" / "data"])
    ap.add_argument("--mutants", type=int, default=0)
    ap.add_argument("--big", nargs="*", type=Path, default=[])
    ap.add_argument("--compare", nargs=2, type=Path)
    a = ap.parse_args()
    if a.compare:
        sys.exit(compare(*a.compare))
    run(a.out, a.traces, a.mutants, a.big)


if __name__ == "__main__":
    main()
