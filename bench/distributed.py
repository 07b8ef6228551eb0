"""Writes docs/distributed.md: the DLRM job replay, fitted bandwidths, the worked example
(a single-GPU trace scaled to 8 and 64 GPUs at two bandwidths) and the 64-rank job simulation.

    python bench/distributed.py [--store DIR]

Every number in the generated page comes from this run; the page says which traces it used.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from daydream import api, jobs  # noqa: E402

SHARED = ROOT.parent / "shared" / "traces"
DATA = ROOT / "tests" / "data"
OUT = ROOT / "docs" / "distributed.md"
# torchvision ResNet50_Weights.IMAGENET1K_V1 meta: num_params 25,557,032; FP32 gradients
RESNET50_PARAM_BYTES = 25_557_032 * 4


def _path(shared_rel: str, data_rel: str | None) -> Path | None:
    p = SHARED / shared_rel
    if p.exists():
        return p
    return DATA / data_rel if data_rel and (DATA / data_rel).exists() else None


def _ms(x) -> str:
    return "" if x is None else f"{x:.2f}"


def dlrm(store: Path) -> list[str]:
    p = _path("param/dlrm_8ranks", "kineto/dlrm_8ranks")
    d = api.predict(str(p), store)
    j = d.job
    c, s = j.collectives, j.straggler
    out = ["## The DLRM job (8 ranks, one run)", "",
           f"`daydream predict {p.relative_to(p.parents[2])}`: the eight Kineto traces "
           f"ingested as job `{j.name}` (rank and world size from `distributedInfo`). "
           f"{c['matched']} collectives matched ({c['kernels_joined']} NCCL kernels, "
           f"{c['kernels_unmatched']} unmatched; types {c['by_type']}); clock offsets removed "
           f"(ns): {j.clock_offsets_ns}.", "",
           "| rank | measured ms | replayed ms | error |", "|---|---|---|---|"]
    for r in j.ranks:
        out.append(f"| {r.rank} | {r.measured_ms:.3f} | {r.baseline_ms:.3f} | "
                   f"{r.error_pct:+.3f}% |")
    out += [f"| job (slowest rank) | {d.measured_ms:.3f} | {d.baseline_ms:.3f} | "
            f"{d.baseline_error_pct:+.3f}% |", "",
            f"Straggler: rank {s['rank']}, last to arrive at {s['last_at']} of "
            f"{s['collectives']} collectives; the others waited {s['wait_caused_ms']:.2f} ms "
            f"for it in all. Its trace (profiler step) started {s['started_late_ms']:.2f} ms "
            f"after the first rank's; before {s['worst_collective']} its critical path held: "
            + ", ".join(f"{x['name']} ({x['phase']}) {x['ms']:.2f} ms" for x in s["cause"][:3])
            + ".", ""]
    rows = ["| what-if | job ms | per rank ms |", "|---|---|---|"]
    for o in ("no_straggler", "bandwidth(2x)", "world(64)"):
        q = api.predict(j.name, store, opts=[o])
        rows.append(f"| `{o}` | {q.baseline_ms:.3f} -> {q.predicted_ms:.3f} | " +
                    ", ".join(f"{r.predicted_ms:.2f}" for r in q.job.ranks) + " |")
    return out + rows + [""]


def fitted(store: Path) -> list[str]:
    out = ["## Bandwidth fitted from a trace's own collectives", "",
           "Per message size (NCCL kernel args: elements x dtype), the fastest all-reduce; a "
           "least-squares line `time = fixed + wire x bytes / B`. On a single rank's trace the "
           "fixed part holds the wait for the other ranks, so B is a lower bound on the link.",
           "", "| trace | fitted | `bandwidth(2x)` | `world(8)` | `world(64)` |",
           "|---|---|---|---|---|"]
    for label, rel, fb in (
            ("ResNet-50 DDP, A100, rank 0 of 2 (HTA)", "hta/resnet50_ddp_a100_rank0.json.gz",
             "kineto/resnet50_ddp_a100_rank0.json.gz"),
            ("Transformer DDP, V100, rank 1 of 2 (HTA)",
             "hta/transformer_ddp_v100_rank1.json.gz", None)):
        p = _path(rel, fb)
        if p is None:
            out.append(f"| {label} | (trace absent) | | | |")
            continue
        cells = []
        fit_note = ""
        for o in ("bandwidth(2x)", "world(8)", "world(64)"):
            q = api.predict(str(p), store, opts=[o])
            fit_note = next((n for n in q.notes if n.startswith("comm:")), "")
            cells.append(f"{q.baseline_ms:.1f} -> {q.predicted_ms:.1f} ms")
        import re
        m = re.search(r"fitted bandwidth ([\d.]+) GB/s from (\d+) message sizes", fit_note)
        fb_txt = (f"{m.group(1)} GB/s ({m.group(2)} message sizes)" if m else
                  "no message sizes in the trace: " + fit_note.split(";")[-1].strip())
        out.append(f"| {label} | {fb_txt} | " + " | ".join(cells) + " |")
    out += ["", "The ResNet-50 DDP trace is CPU-bound between its iteration markers (the host "
            "never waits for the GPU inside the trace), so its iteration times do not move "
            "even where its collectives grow; the transformer's host synchronizes with the "
            "GPU every step, so they do.", ""]
    return out


def worked(store: Path) -> list[str]:
    p = _path("kineto-tb-plugin/resnet50_v100_nw0_run1.json.gz",
              "kineto/resnet50_v100_nw0_run1.json.gz")
    pb = RESNET50_PARAM_BYTES
    out = ["## Worked example: a single-GPU trace scaled out", "",
           f"ResNet-50 on one V100 (`{p.name}`, kineto tb-plugin sample, batch 32 per GPU), "
           f"`ddp(world=N, bandwidth=B, param_bytes={pb})` (25,557,032 FP32 parameters, "
           "torchvision): gradient buckets of 25 MiB in backward order, all-reduced on a "
           "channel that overlaps backward, the optimizer waiting for them. Weak scaling (the "
           "same batch per GPU): an iteration can only get slower than on one GPU; the table "
           "says by how much, and what P3, BlueConnect (8 GPUs per node, NVLink inside) and "
           "DGC (0.1% of the gradients) win back.", "",
           "| GPUs | bandwidth | `ddp` ms | `+p3` | `+blueconnect` | `+dgc(ratio=0.001)` |",
           "|---|---|---|---|---|---|"]
    base = api.predict(str(p), store).baseline_ms
    for n in (8, 64):
        for bw in ("10Gbps", "100Gbps"):
            spec = f"ddp(world={n},bandwidth={bw},param_bytes={pb})"
            cells = []
            for extra in ("", "+p3", "+blueconnect(gpus_per_node=8)", "+dgc(ratio=0.001)"):
                q = api.predict(str(p), store, opts=[spec + extra])
                cells.append(_ms(q.predicted_ms))
            out.append(f"| {n} | {bw} | " + " | ".join(cells) + " |")
    return out + ["", f"One GPU, replayed: {base:.2f} ms per iteration. P3's 200 KB slices "
                  "(its paper's 50,000 parameters) pay the ring's latency steps once per slice: "
                  "2(N-1) steps of a few microseconds each, which at 64 ranks costs more than "
                  "the priority order wins; P3 was designed for parameter servers, where a "
                  "slice costs one round trip. Larger slices (`p3(slice_kb=4000)`) recover "
                  "it.", ""]


def job_scale(store: Path, replicas: int = 8, repeats: int = 5) -> dict:
    """The DLRM ranks repeated REPLICAS times as one job (every collective joining all of
    them): its size, build time and the best simulate time of REPEATS (in ``store``, where
    the DLRM job is ingested)."""
    from daydream.graphstore.job import build_job
    from daydream.graphstore.read import read_graph
    from daydream.simulate.engine import simulate
    from daydream.simulate.replay import to_simgraph
    st = api.open_store(store)
    if not any("dlrm" in k for k in jobs.find(st)):
        api.ingest([_path("param/dlrm_8ranks", "kineto/dlrm_8ranks")], store, jobs=1)
    (name, mem), = [(k, v) for k, v in jobs.find(st).items() if "dlrm" in k]
    graphs = [read_graph(st.root, m.trace_id) for m in mem]
    ks = [st.read("kernel", m.trace_id) for m in mem]
    t = time.perf_counter()
    jg = build_job(name, mem, graphs, ks, replicas=replicas)
    build_s = time.perf_counter() - t
    sg = to_simgraph(jg.tables)
    simulate(sg)  # warm-up
    best = min(_timed(simulate, sg) for _ in range(repeats))
    return {"ranks": len(mem) * replicas, "tasks": sg.n_tasks, "edges": sg.n_edges,
            "participants": jg.collective.height, "build_s": build_s, "simulate_s": best,
            "tasks_per_s": sg.n_tasks / best}


def scale(store: Path) -> list[str]:
    r = job_scale(store)
    return ["## A 64-rank job from the real ranks", "",
            "The 8 DLRM ranks repeated 8 times (rank r of copy k is rank r + 8k), every "
            "collective joining all 64.", "",
            "| ranks | tasks | edges | collectives x ranks | build s | simulate s (best of 5) "
            "| tasks/s |", "|---|---|---|---|---|---|---|",
            f"| {r['ranks']} | {r['tasks']:,} | {r['edges']:,} | {r['participants']:,} | "
            f"{r['build_s']:.2f} | {r['simulate_s']:.3f} | {r['tasks_per_s']:,.0f} |", "",
            "The simulator's target is 20,000,000 tasks/s (docs/benchmarks.md, measured there "
            "on a 10M-task graph, and on this job as well); the machine running this is "
            "shared, so repeat runs vary.", ""]


def _timed(fn, *a) -> float:
    t = time.perf_counter()
    fn(*a)
    return time.perf_counter() - t


HEADER = """# Distributed training

Written by `python bench/distributed.py` on {date}. Traces from ../shared/traces where present,
else the copies in tests/data.

## What a job is

The traces of all ranks of one run form one *job* (`daydream jobs`): the name given with
`daydream ingest --job NAME`, else the folder of traces that carry a rank and world size
(Kineto `distributedInfo`). An Nsight Systems export that holds several GPUs is a job by itself
(one rank per device). `daydream predict JOB` (a job name or a folder of rank traces) replays
all ranks in one graph and adds `ranks: [{{rank, measured_ms, baseline_ms, predicted_ms}}]`,
the matched collectives and the straggler to `--json`.

**Collectives across ranks.** The i-th NCCL kernel of a communicator (the process group where
the trace names it) on every rank is one collective; the kernel types must agree. Each gets a
zero-length *join* task on a channel of its communicator: every participant's kernel *start*
bounds it (`start_start`), and it bounds every participant's *end* (`end_end`, lag = the rank's
own transfer time, what its kernel ran after the last rank arrived). The kernel's own duration
becomes that transfer time. So a collective cannot finish before the last rank has arrived; a
rank that arrives early holds its stream while it waits, as in the trace; a faster straggler
shortens everyone's wait and a faster network only the transfer. The ranks' clocks are aligned
by the collectives' ends (all ranks leave a collective together). A communicator's collectives
keep their issue order (NCCL requires every rank to issue them in one order): its channel runs
them in that order. Each replay of a job keeps its collectives, one row per rank with its
arrival, wait and transfer, in the `collective` table of graph.duckdb (docs/sql.md).

**Straggler.** At every collective the last rank to arrive made the others wait; the rank that
made them wait longest in total is named, with its critical path between its previous collective
and its late arrival.

## Communication model

`transforms/constants.py` `COMM_LINK` (NVLink 1-5, PCIe 3-5, InfiniBand EDR/HDR/NDR, Ethernet
10/25/100 GbE: per-direction bandwidth, step latency, sources) and `COLLECTIVE` (ring and tree
costs, Thakur et al. 2005 and nccl-tests: all-reduce `2(n-1)` steps and `2(n-1)/n` of the
message on the wire, reduce-scatter and all-gather `(n-1)`, `(n-1)/n`, all-to-all, broadcast,
send/recv). A trace's collective is split into latency, transfer and the rest (waiting, on a
single rank's trace); what-ifs change the first two. Transforms: `bandwidth(X)`, `world(N)`,
`no_straggler` (jobs), `ddp(world, bandwidth, bucket_mb, param_bytes)`, `p3(slice_kb)`,
`blueconnect(gpus_per_node, intra, inter)`, `dgc(ratio)`; see `daydream opts`.
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", type=Path, default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = a.store or Path(tmp) / "store"
        out = [HEADER.format(date=dt.date.today())]
        for part in (dlrm, fitted, worked, scale):
            out += part(store)
            print(f"distributed: {part.__name__} done", file=sys.stderr)
    OUT.write_text("\n".join(out))
    print(f"distributed: wrote {OUT.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
