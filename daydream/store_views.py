"""What ``daydream info`` and ``daydream jobs`` print: presentation of ``api.info`` and
``api.jobs`` dicts, nothing computed here."""

from __future__ import annotations

from daydream.report import ITERATIONS_FROM, emit, ms, plural, print_tables, rank_ranges, say
from daydream.text_table import Column, Table


def missing(members: list[dict]) -> tuple[int, list[int]]:
    """(the job's world size, the ranks of it no member holds)."""
    world = max([m.get("world_size") or 0 for m in members] + [len(members)])
    have = {m["rank"] for m in members}
    return world, [r for r in range(world) if r not in have]


def jobs_table(d: dict[str, list[dict]]) -> Table:
    t = Table("Jobs (predict JOB replays its ranks together)",
              [Column("job"), Column("ranks"), Column("missing"), Column("traces")])
    recs = []
    for name, ms_ in d.items():
        world, miss = missing(ms_)
        t.add(name, f"{len(ms_)} of {world}",
              f"{len(miss)}: {rank_ranges(miss)}" if miss else "none",
              " ".join(m["trace_id"] for m in ms_))
        recs.append({"job": name, "ranks": len(ms_), "world_size": world,
                     "missing_ranks": " ".join(map(str, miss)),
                     "trace_ids": " ".join(m["trace_id"] for m in ms_)})
    t.records = recs
    return t


def device_text(devices: list[dict] | None, listed: int) -> str:
    if not devices:
        return "none recorded"
    names = ", ".join(f"{d.get('id', '?')}: {d.get('name') or '(name not recorded)'}"
                      for d in devices)
    more = listed - len(devices)
    return names + (f" (the trace lists {plural(listed, 'GPU')} of the machine; the others "
                    "ran none of its streams)" if more > 0 else "")


def trace_table(d: dict) -> Table:
    t = Table("", [Column("field"), Column("value")])
    t.add("trace", d["trace_id"])
    t.add("file", d["file"])
    t.add("format", f"{d['source_format']} (version {d['source_version']})")
    t.add("events", d["events"])
    if d.get("span_ms") is not None:
        t.add("span", f"{ms(d['span_ms'])} ms")
    if d.get("iterations") is not None:
        how = ITERATIONS_FROM.get(d.get("iterations_from") or "", "")
        t.add("iterations", f"{d['iterations']}" + (f", {how}" if how else ""))
    if d["rank"] is not None:
        t.add("rank", f"{d['rank']} of {d['world_size']}" if d["world_size"] is not None
              else f"{d['rank']} (the trace records no world size)")
    if d["job"]:
        t.add("job", d["job"])
    t.add("device" if len(d.get("devices") or []) <= 1 else "devices",
          device_text(d.get("devices"), d.get("devices_listed") or 0))
    t.add("tables", ", ".join(f"{k} {v}" for k, v in d["tables"].items()))
    if d.get("slack"):
        # what the graph does not explain, per kind, over all iterations (positive slack
        # beyond each edge's physical latency; see docs/graph.md)
        by: dict[str, list[float]] = {}
        for r in d["slack"]:
            by.setdefault(r["kind"], [0, 0.0])
            by[r["kind"]][0] += r["edges"]
            by[r["kind"]][1] += r["slack_ns"] / 1e6
        t.add("slack", f"over {plural(d['iterations'] or 0, 'iteration')}, ms summed over "
              "edges: " + ", ".join(f"{k} {ms(v[1])} ms ({plural(v[0], 'edge')})" for k, v in
                                   sorted(by.items(), key=lambda kv: -kv[1][1])))
    return t


def stats_table(d: dict) -> Table | None:
    if not d["stats"]:
        return None
    t = Table("What ingest repaired or skipped", [Column("severity"), Column("counter"),
                                                  Column("count", "right"), Column("detail")])
    for s in d["stats"]:
        t.add(s["severity"], s["name"], s["count"], s["detail"] or "")
    return t


def print_info(d: dict) -> None:
    if "job" in d and "ranks" in d and isinstance(d["ranks"], list):
        say(f"job {d['job']}: {plural(d['ranks_present'], 'rank')} of {d['world_size']}" +
            (f"; {len(d['missing_ranks'])} missing (ranks {rank_ranges(d['missing_ranks'])})"
             if d["missing_ranks"] else ""))
        emit()
        for r in d["ranks"]:
            say(f"rank {r['rank']}")
            print_tables([trace_table(r), stats_table(r)])
        return
    print_tables([trace_table(d), stats_table(d)])
