"""`make accuracy`: run the registered sections into docs/accuracy.md and docs/accuracy.json.

    python -m bench.accuracy [--store DIR] [--only NAME ...] [--list]

``--only NAME`` (repeatable) reruns those sections and merges them into the files as written,
the other sections kept as they were; the store (.daydream-accuracy/) is kept between runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

import orjson

from bench.accuracy import OUT_JSON, OUT_MD, ROOT, STORE, Context, discover, reason
from bench.accuracy import _doc as doc


def head() -> str:
    return "\n".join([
        "# Accuracy", "",
        f"Written by `make accuracy` (`python -m bench.accuracy`) on {dt.date.today()}; the "
        "judge's scorecard (../shared/judge/score.py) first, then the roles of the traces "
        "(bench/manifest.py) and one section per measure of ACCURACY.md, each rerun alone by "
        "`--only NAME` and merged back. Traces from ../shared/traces (see its README), the "
        "judged ones only; the store is kept in `.daydream-accuracy/` between runs; the "
        "numbers are also in docs/accuracy.json.", ""])


def main(argv: list[str] | None = None, ctx: Context | None = None) -> int:
    """``ctx``: a prepared context (tests pass one whose predict is a stand-in)."""
    sections = discover()
    ap = argparse.ArgumentParser(prog="python -m bench.accuracy", description=__doc__)
    ap.add_argument("--store", type=Path, default=STORE)
    ap.add_argument("--only", action="append", choices=sorted(sections), default=None,
                    help="rerun this section and merge it into the written files")
    ap.add_argument("--list", action="store_true", help="list the sections and exit")
    ap.add_argument("--out", type=Path, default=OUT_MD)
    a = ap.parse_args(argv)
    if a.list:
        for s in sections.values():
            print(f"{s.name:12s} {s.title}")
        return 0
    out_json = a.out.with_suffix(".json") if a.out != OUT_MD else OUT_JSON
    ctx = ctx or Context(a.store)
    todo = [sections[n] for n in a.only] if a.only else list(sections.values())
    blocks, data = {}, {}
    for s in todo:
        t0 = time.perf_counter()
        try:
            r = s.run(ctx)
            lines, d = r.lines, r.data
        except Exception as e:  # one broken section must not lose the others
            lines, d = [f"## {s.title}", "", f"The section failed: {reason(e)}", ""], \
                {"error": reason(e)}
        blocks[s.name] = doc.block(s.name, lines)
        data[s.name] = d
        print(f"accuracy: {s.name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    old = a.out.read_text() if a.only and a.out.exists() else None
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(doc.merge(old, head(), blocks, list(sections)))
    old_json = orjson.loads(out_json.read_bytes()) if a.only and out_json.exists() else None
    out_json.write_bytes(orjson.dumps(
        doc.merge_json(old_json, data, {"written": str(dt.date.today())}),
        option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))
    rel = a.out.relative_to(ROOT) if a.out.is_relative_to(ROOT) else a.out
    print(f"accuracy: wrote {rel} ({', '.join(s.name for s in todo)})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
