"""Every prediction's whole JSON, single and fleet, to compare two code trees byte for byte.

    PYTHONPATH=TREE python bench/prediction_json.py OUT.json STORE[:N]...
    python bench/prediction_json.py --compare BEFORE.json AFTER.json

For the first N traces (sorted ids; all without N) of each STORE and each spec of SPECS,
``record`` keeps what ``daydream predict TRACE --opt SPEC --json`` prints (a fresh subject per
spec, ``api.predictions``) and the row ``daydream predict --all`` writes (two local workers,
into a copy of the store; ``created`` left out), or the error. Unlike
``bench/prediction_diff.py`` (two numbers per prediction, every optimization) it keeps every
key of the result: the interval, gates, phases, notes. Run it with the code before a change
and after (PYTHONPATH names the tree whose code runs); ``--compare`` names every record that
differs.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

SPECS = ["amp", "cuda_graphs", "no_profiler", "fused_adam", "fusion", "dataloader(workers=4)",
         "bn_restructure", "amp+fused_adam"]


def record(out_path: str, stores: list[str]) -> int:
    import orjson

    from daydream import api, fleet
    from daydream.base.errors import DaydreamError
    from daydream.graphstore import db
    out: dict[str, str] = {}
    for arg in stores:
        store, _, n = arg.partition(":")
        tids = sorted(db.trace_ids(Path(store)))[:int(n) if n else None]
        for tid in tids:
            for spec in SPECS:
                try:
                    d = api.predictions(tid, store, [spec])[0]
                    s = orjson.dumps(d.as_dict(), option=orjson.OPT_INDENT_2,
                                     default=str).decode()
                except DaydreamError as e:
                    s = f"error: {e}"
                out[f"single {tid} {spec}"] = s
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(store, f"{tmp}/s")
            where = "trace_id IN (" + ", ".join(f"'{t}'" for t in tids) + ")"
            rep = fleet.predict_all(f"{tmp}/s", SPECS, workers=2, force=True, where=where)
        for r in rep.results:
            row = {k: v for k, v in (r.row or {}).items() if k != "created"}
            out[f"fleet {r.trace_id} {r.spec}"] = json.dumps([r.status, r.error, row],
                                                            default=str)
    Path(out_path).write_text(json.dumps(out, indent=0, sort_keys=True))
    print(f"{len(out)} records -> {out_path}")
    return 0


def compare(before: str, after: str) -> int:
    a, b = (json.loads(Path(p).read_text()) for p in (before, after))
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    for k in differ:
        print(f"differs: {k}")
    print(f"{len(a)} and {len(b)} records, {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(compare(*args[1:]) if args[:1] == ["--compare"] else record(args[0], args[1:]))
