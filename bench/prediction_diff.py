"""Every registered optimization on every shared trace, through every entry point: a record of
baseline_ms and predicted_ms to compare before and after a change to the prediction path.

    python bench/prediction_diff.py record OUT.json [--traces DIR] [--workers N]
    python bench/prediction_diff.py compare BEFORE.json AFTER.json [--rel 1e-9]

``record`` ingests every trace under DIR (default ../shared/traces beside the repository;
execution traces ``*.et.json*`` left out) into a temporary store, then predicts each trace with
each spec of SPECS through ``api.predict`` (what ``daydream predict TRACE`` runs) and through
``fleet.predict_all`` (``daydream predict --all``, local processes), and each job of the store
through ``api.predict`` (``daydream predict JOB``). ``compare`` prints every value that moved
(or a spec that failed on one side only), and says when none did. Each prediction through
``api.predict`` is kept whole, as ``--json`` prints it, so a field that moved anywhere shows.

It uses only the public API, so the same file records the code before a change and after it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from daydream import api, fleet  # noqa: E402
from daydream.base.errors import DaydreamError  # noqa: E402

# Every registered optimization, with the parameters it needs; those that rewrite an existing
# all-reduce also chained after ddp, so that single-GPU traces exercise them.
SPECS = [
    "amp", "amp(casts=false, loss_scaling=false)", "bn_restructure",
    "bn_restructure(conv_fusion=true)", "checkpointing", "cuda_graphs", "dataloader(workers=4)",
    "ddp(world=8)", "ddp(world=8)+p3", "ddp(world=8)+dgc", "ddp(world=8)+blueconnect",
    "ddp(world=8)+qsgd(bits=8)", "ddp(world=8)+local_sgd(every=4)",
    "p3", "dgc", "blueconnect", "qsgd", "local_sgd", "bandwidth(bw=\"2x\")", "world(n=16)",
    "no_straggler",
    "fused_adam", "fused_adamw", "fused_sgd", "fused_adagrad", "fused_optimizer(kind=sgd)",
    "fusion", "fusion(optimizer=true)", "offload", "offload(layer_mb=4)",
    "scale(select=\"kind = 'kernel' AND name LIKE '%gemm%'\", factor=0.5)",
    "batch(size=64)", "gpu(name=H100)", "gpu(name=MI300X)", "no_profiler", "no_profiler+amp",
]


def _covered() -> list[str]:
    """Registered optimizations that SPECS does not name (printed, so none is forgotten)."""
    from daydream.transforms import list_opts
    named = {s.split("(")[0] for spec in SPECS for s in spec.split("+")}
    return [o["name"] for o in list_opts() if o["name"] not in named]


def _full(d: dict) -> str:
    """The whole prediction (its ``as_dict``) as ``daydream predict --json`` prints it, keys
    sorted: every field, not only the two times, so that ``compare`` can say whether a change
    left the output byte-identical."""
    import orjson
    return orjson.dumps(d, option=orjson.OPT_SORT_KEYS, default=str).decode()


def _one(fn) -> dict:
    try:
        d = fn()
    except DaydreamError as e:
        return {"error": str(e).splitlines()[0]}
    if hasattr(d, "as_dict"):
        d = d.as_dict()
    return {"baseline_ms": d.get("baseline_ms"), "predicted_ms": d.get("predicted_ms"),
            "json": _full(d)}


def record(out: Path, traces: Path, workers: int) -> None:
    missing = _covered()
    if missing:
        print(f"note: not in SPECS: {', '.join(missing)}", file=sys.stderr)
    files = sorted(p for p in traces.rglob("*") if p.is_file() and ".et." not in p.name
                   and p.suffix in (".gz", ".json", ".sqlite"))
    store = Path(tempfile.mkdtemp(prefix="prediction-diff-"))
    t0 = time.monotonic()
    rep = api.ingest(files, store, jobs=workers)
    for r in rep.failed:
        print(f"ingest failed: {r.error}", file=sys.stderr)
    name = {r.trace_id: str(Path(r.path).relative_to(traces)) for r in rep.results
            if r.trace_id}
    res: dict = {"traces": {}, "fleet": {}, "jobs": {}}
    for tid, rel in sorted(name.items(), key=lambda x: x[1]):
        row = res["traces"][rel] = {"": _one(lambda tid=tid: api.predict(tid, store))}
        for s in SPECS:
            row[s] = _one(lambda tid=tid, s=s: api.predict(tid, store, opts=[s]))
        print(f"{time.monotonic() - t0:7.1f} s  {rel}", file=sys.stderr)
    fr = fleet.predict_all(store, SPECS, workers=workers)
    for r in fr.results:
        rel = name[r.trace_id]
        d = ({"error": (r.error or "").splitlines()[0]} if r.status == "failed" else
             {"baseline_ms": r.row["baseline_ms"], "predicted_ms": r.row["predicted_ms"]})
        res["fleet"].setdefault(rel, {})[r.spec] = d
    for job in api.jobs(store):
        row = res["jobs"][job] = {"": _one(lambda job=job: api.predict(job, store))}
        for s in SPECS:
            row[s] = _one(lambda job=job, s=s: api.predict(job, store, opts=[s]))
    print(f"{time.monotonic() - t0:7.1f} s  done", file=sys.stderr)
    out.write_text(json.dumps(res, indent=1, sort_keys=True))


def _moved(a: dict | None, b: dict | None, rel: float) -> str | None:
    if a is None or b is None:
        return f"{'missing' if a is None else 'present'} before, " \
               f"{'missing' if b is None else 'present'} after"
    if ("error" in a) != ("error" in b):
        sa = a.get("error") or f"{a['predicted_ms']}"
        sb = b.get("error") or f"{b['predicted_ms']}"
        return f"{sa} -> {sb}"
    if "error" in a:
        return None
    parts = []
    for k in ("baseline_ms", "predicted_ms"):
        x, y = a.get(k), b.get(k)
        if x is None or y is None:
            if x != y:
                parts.append(f"{k} {x} -> {y}")
        elif abs(x - y) > rel * max(abs(x), abs(y), 1e-12):
            parts.append(f"{k} {x:.4f} -> {y:.4f} ({100 * (y - x) / x:+.2f}%)")
    if not parts and "json" in a and "json" in b and a["json"] != b["json"]:
        parts.append(f"the JSON differs: {_first_difference(a['json'], b['json'])}")
    return "; ".join(parts) or None


def _first_difference(a: str, b: str) -> str:
    """Where two JSON texts first differ, with some context either side."""
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"at {i}: ...{a[max(0, i - 60):i + 40]!r} -> ...{b[max(0, i - 60):i + 40]!r}"


def compare(before: Path, after: Path, rel: float) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    n = moved = 0
    for path in ("traces", "fleet", "jobs"):
        for subject in sorted(set(a[path]) | set(b[path])):
            sa, sb = a[path].get(subject, {}), b[path].get(subject, {})
            for spec in sorted(set(sa) | set(sb)):
                n += 1
                m = _moved(sa.get(spec), sb.get(spec), rel)
                if m:
                    moved += 1
                    print(f"{path:6s} {subject}  {spec or '(baseline)'}: {m}")
    print(f"{moved} of {n} values moved")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out", type=Path)
    r.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    r.add_argument("--workers", type=int, default=2)
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--rel", type=float, default=1e-9)
    args = p.parse_args()
    if args.cmd == "record":
        record(args.out, args.traces, args.workers)
        return 0
    return compare(args.before, args.after, args.rel)


if __name__ == "__main__":
    sys.exit(main())
