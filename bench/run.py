"""`make bench`: time Daydream and the peer tool side by side, write docs/benchmarks.md.

Benchmarks, not tests: nothing here fails on a slow machine; the numbers and their ratios are
written down with the machine they were measured on.

    python bench/run.py [--quick]
        [--only ingest,graph,memory,simulate,replay,job,fleet,fleet_real,startup]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import peers  # noqa: E402

SHARED = ROOT.parent / "shared" / "traces"
TRANSFORMER = SHARED / "hta" / "transformer_ddp_v100_rank1.json.gz"
OUT = ROOT / "docs" / "benchmarks.md"


def best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


# Traces of every size for the scanner's MB/s, smallest first: real ones, then the 1M-event
# trace bigtrace.py makes of five copies of the transformer one.
SCAN_TRACES = ["hta/small/triton_example.json.gz", "param/dlrm_8ranks/rank0.kineto.json.gz",
               "particle/particle_transformer_a100_fwd_bs2.json.gz",
               "hta/resnet50_v100_rank0.json.gz",
               "kineto-tb-plugin/resnet50_v100_nw0_run1.json.gz",
               "hta/transformer_ddp_v100_rank1.json.gz"]
BIG_COPIES = 5


def _json_mb(path: Path) -> float:
    from daydream.ingest import source
    return len(source.load_bytes(path)) / 1e6


def _time_read(path: Path, repeats: int) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of ``read_trace`` in this process (warm: the first read is not
    timed). CPU counts every thread of the process."""
    from daydream.ingest.convert import read_trace

    read_trace(path)
    out = []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        read_trace(path)
        out.append((time.perf_counter() - t, time.process_time() - c))
    return out


def _time_cli(path: Path, repeats: int) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of the whole `daydream ingest` command, process start to exit, each
    run into a fresh store; CPU of all its threads (what other jobs on the machine do not
    inflate as they do the wall clock)."""
    import resource

    out = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-m", "daydream", "ingest", str(path),
                            "--store", str(Path(tmp) / "s"), "-j", "1"],
                           check=True, capture_output=True)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            out.append((time.perf_counter() - t, r1.ru_utime + r1.ru_stime
                        - r0.ru_utime - r0.ru_stime))
    return out


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def bench_ingest(repeats: int) -> list[str]:
    """Kineto JSON -> activity tables, per trace size: Daydream's reader beside HTA's load of
    the same files, and the whole `daydream ingest` command on a 1M-event trace (issue 18)."""
    import bigtrace

    from daydream.base import compiled as kernels

    hta = peers.hta_available()
    load0 = os.getloadavg()[0]
    rows = ["## Ingest (issues 2, 18)", "",
            "Kineto JSON -> activity tables. MB are megabytes (10^6 bytes) of JSON, inflated "
            "where the file is gzipped. Daydream: `ingest.convert.read_trace` (inflate, scan, "
            "route into tables) in one warm process, median (best) of "
            f"{max(5, repeats)} runs, {2 * max(5, repeats)} for files under 5 MB. HTA: "
            f"`TraceAnalysis(trace_dir)` (json load and DataFrame), best of {repeats} fresh "
            "processes, imports not timed. Seconds are wall clock; CPU seconds (all threads, "
            "Daydream's median, HTA's best run) show the work where other jobs slow the wall "
            "clock down. The 1M-event trace is "
            f"{BIG_COPIES} time-shifted copies of the transformer trace (`bench/bigtrace.py`), "
            "plain JSON.", "",
            "| trace | events | MB of JSON | Daydream s | Daydream CPU s | Daydream MB/s | "
            "HTA s | HTA CPU s | HTA MB/s | ratio (HTA / Daydream) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "transformer_x5.json"
        info = bigtrace.build(TRANSFORMER, big, n_copies=BIG_COPIES)
        traces = [(t, SHARED / t) for t in SCAN_TRACES] + \
            [(f"transformer x{BIG_COPIES} (bigtrace)", big)]
        from daydream.ingest.convert import read_trace
        for label, path in traces:
            mb = _json_mb(path)
            events = read_trace(path).events
            n = max(5, repeats) * (2 if mb < 5 else 1)
            ours = _time_read(path, n)
            med, best = _median([w for w, _ in ours]), min(w for w, _ in ours)
            cpu = _median([c for _, c in ours])
            cells = [f"`{label}`", f"{events:,}", f"{mb:,.1f}", f"{med:.3f} ({best:.3f})",
                     f"{cpu:.3f}", f"{mb / med:,.0f} ({mb / best:,.0f})"]
            if hta:
                try:
                    h = peers.hta_parse(path, repeats=repeats)
                    hs = h["seconds"]
                    cells += [f"{hs:.3f}", f"{h.get('cpu_seconds') or 0:.3f}", f"{mb / hs:,.1f}",
                              f"{hs / med:.1f}"]
                except RuntimeError as e:
                    cells += [f"failed: {str(e).splitlines()[-1][:60]}", "", "", ""]
            else:
                cells += ["n/a", "", "", ""]
            rows.append("| " + " | ".join(cells) + " |")
        # the whole command, as a user runs it: process start, imports, conversion, Parquet,
        # commit, and the graph build and DuckDB write that `daydream ingest` does too
        runs = _time_cli(big, repeats)
        hta_run = peers.hta_parse(big, repeats=repeats) if hta else None
    cli = [w for w, _ in runs]
    med = _median(cli)
    hta_big = hta_run["seconds"] if hta_run else None
    rows.insert(3, f"Load average (1 min) on this {os.cpu_count()}-core machine: {load0:.1f} when "
                f"the section started, {os.getloadavg()[0]:.1f} when it ended (other jobs "
                "share it; both tools ran under the same load).")
    rows.insert(4, "")
    rows += ["", f"The whole `daydream ingest` command on the 1M-event trace "
             f"({info['events']:,} events, {info['bytes'] / 1e6:,.0f} MB): process start to exit "
             "(imports, conversion, Parquet, the graph build and its write, as Parquet for a "
             "graph this large, included; CPU seconds of every run, all threads), "
             f"median of {repeats}, beside HTA's load of the same file (imports not timed); "
             f"target 12x (issue 38; 10x in issue 18). The kernels of ingest and graphstore: "
             f"{kernels.state()} (`base/compiled.py`).", "",
             "| what is timed | seconds | CPU seconds | ratio (HTA / Daydream) |",
             "|---|---|---|---|"]
    if hta_big:
        rows.append(f"| HTA 0.5.0 `TraceAnalysis(trace_dir)` load | {hta_big:.2f} | "
                    f"{hta_run.get('cpu_seconds') or 0:.2f} | 1.0 |")
    rows.append("| `daydream ingest` whole process (runs: "
                + ", ".join(f"{w:.2f}" for w in cli) + f") | {med:.2f} | "
                + ", ".join(f"{c:.2f}" for _, c in runs) + " | "
                + (f"{hta_big / med:.1f}" if hta_big else "n/a") + " |")
    return rows + [""]


def bench_memory(target_mb: int) -> list[str]:
    """Peak memory of `daydream ingest` on a ~1 GB trace made of copies of a real one."""
    import bigtrace

    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.json"
        info = bigtrace.build(TRANSFORMER, big, target_mb << 20)
        t = time.perf_counter()
        p = subprocess.run([sys.executable, "-c",
                            "import resource, sys\n"
                            "from daydream.commandline import main\n"
                            "sys.argv = ['daydream', 'ingest', sys.argv[1], '--store', "
                            "sys.argv[2], '-j', '1']\n"
                            "try:\n    main()\nexcept SystemExit:\n    pass\n"
                            "from bench.rss import hwm_mib\n"
                            "s, c = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,"
                            " resource.RUSAGE_CHILDREN))\n"
                            "print(max(hwm_mib() * 1024, c.ru_maxrss), s.ru_utime + s.ru_stime"
                            " + c.ru_utime + c.ru_stime)",
                            str(big), str(Path(tmp) / "s")],
                           capture_output=True, text=True, check=True, cwd=ROOT)
        secs = time.perf_counter() - t
        rss, cpu = p.stdout.strip().splitlines()[-1].split()
        peak_mb = float(rss) / 1024  # KiB
    return ["## Memory on a 1 GB trace (issue 2)", "",
            f"`bench/bigtrace.py` concatenates {info['copies']} time-shifted copies of the "
            f"transformer trace: {info['bytes'] / 2**20:,.0f} MiB of JSON, "
            f"{info['events']:,} events. `daydream ingest` of that file:", "",
            "Peak RSS is the largest of the command's process (which converts the file, gives "
            "the conversion's memory back and builds the graph: its own high-water mark, "
            "`bench/rss.py`) and any process it started. "
            f"Load average (1 min) when it ended: {os.getloadavg()[0]:.1f}.", "",
            "| seconds | CPU seconds (all threads) | events/s | peak RSS (MiB) | limits |",
            "|---|---|---|---|---|",
            f"| {secs:.1f} | {float(cpu):.1f} | {info['events'] / secs:,.0f} | {peak_mb:,.0f} "
            "| 20 s, 3072 MiB |", ""]


def bench_graph(repeats: int) -> list[str]:
    """Graph of the whole trace (all iterations) vs HTA's critical-path graph of one."""
    from daydream import api
    from daydream.graphstore.load import activity_tables, graph_tables, load

    with tempfile.TemporaryDirectory() as tmp:
        st = api.open_store(Path(tmp) / "s")
        api.ingest([TRANSFORMER], st.root, jobs=1)
        tid = st.trace_ids()[0]
        tables = activity_tables(st, tid)
        g, gt = graph_tables(tables)
        n_it = gt["iteration"].num_rows
        ours = best_of(lambda: graph_tables(tables), repeats)
        ours_db = best_of(lambda: load(st.root, tid), repeats)
    rows = ["## Graph building (issue 3)", "",
            f"Trace: `hta/transformer_ddp_v100_rank1.json.gz`. Daydream builds the graph of the "
            f"whole trace ({n_it} iterations, {g.n_tasks:,} tasks, {len(g.src):,} edges) from "
            "its activity tables; HTA builds its critical-path graph of one iteration "
            f"(ProfilerStep#3) from its parsed trace. Best of {repeats}.", "",
            "| tool | what is timed | seconds | ratio (HTA / Daydream) |", "|---|---|---|---|"]
    if peers.hta_available():
        hta = peers.hta_critical_path(TRANSFORMER, rank=1, iteration=3, repeats=repeats)
        hs = hta["seconds"]
        rows.append(f"| HTA 0.5.0 | `critical_path_analysis`, one iteration "
                    f"({hta.get('nodes', '?'):,} nodes) | {hs:.3f} | 1.0 |")
    else:
        hs = None
    fmt = (lambda x: f"{hs / x:.1f}") if hs else (lambda x: "n/a")
    rows.append(f"| Daydream | build + check + layers/phases/iterations, all {n_it} iterations "
                f"| {ours:.3f} | {fmt(ours)} |")
    rows.append(f"| Daydream | the same plus writing the five tables to DuckDB "
                f"| {ours_db:.3f} | {fmt(ours_db)} |")
    return rows + [""]


def bench_simulate(repeats: int, processes: int = 3) -> list[str]:
    """The compiled simulator on a generated 10M-task graph, in fresh processes (the spread
    between processes on this shared VM is larger than within one, so several are run)."""
    import json
    runs = []
    for _ in range(processes):
        p = subprocess.run([sys.executable, "-c",
                            "import json, sys; sys.path.insert(0, 'bench');"
                            "import bench_simulate as b;"
                            f"print(json.dumps(b.run(10_000_000, repeat={repeats})))"],
                           cwd=ROOT, capture_output=True, text=True, check=True)
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    r = min(runs, key=lambda x: x["simulate_s_best"])
    spread = ", ".join(f"{x['simulate_s_best']:.3f}" for x in runs)
    return ["## Simulator (issue 4)", "",
            f"`bench/bench_simulate.py`: a generated graph shaped like a trace ({r['tasks']:,} "
            f"tasks, {r['edges']:,} edges: CPU threads of calls and host gaps launching onto "
            f"GPU streams, {r['end_edges']:,} blocking syncs, cross-stream waits). After a "
            f"warm-up; best of {repeats} simulations in each of {processes} fresh processes "
            f"(each process's best, s: {spread}); the table is the best process.", "",
            "| simulate s (best) | tasks/s | edges/s | peak RSS, simulate phase (MiB) | "
            "peak RSS, process (MiB) | target |", "|---|---|---|---|---|---|",
            f"| {r['simulate_s_best']:.3f} | {r['tasks_per_s_best']:,} | "
            f"{r['edges_per_s_best']:,} | {r['peak_rss_mb_simulate_phase']} | "
            f"{max(x['peak_rss_mb'] for x in runs):,} | 20,000,000 tasks/s, < 3 GB |", ""]


def bench_replay(repeats: int) -> list[str]:
    """Replay of the whole transformer trace vs HTA's critical path of one iteration."""
    from daydream import api
    from daydream.graphstore.read import read_graph
    from daydream.simulate.replay import replay

    with tempfile.TemporaryDirectory() as tmp:
        st = Path(tmp) / "s"
        d = api.predict(str(TRANSFORMER), st)
        g = read_graph(st, d.trace_id)
        n_ours = max(10, repeats)
        times = []
        for _ in range(n_ours):
            t = time.perf_counter()
            replay(g)
            times.append(time.perf_counter() - t)
        ours = min(times)
    n = g["task"].num_rows
    rows = ["## Replay of a whole trace (issue 4)", "",
            f"Daydream simulates the whole transformer trace ({len(d.iterations)} "
            f"iterations, {n:,} tasks) and computes iteration times, critical path and unit "
            "load; HTA analyses the critical path of one iteration, same run. HTA: best of "
            f"{repeats} fresh processes. Daydream: best of {n_ours} replays of the graph in one "
            "process (a replay takes milliseconds, so more of them cost nothing and the best "
            "is steadier); all of them, in ms: "
            + ", ".join(f"{x * 1e3:.1f}" for x in times) + ".", "",
            "| tool | what is timed | seconds | ratio (HTA / Daydream) |", "|---|---|---|---|"]
    if peers.hta_available():
        hta = peers.hta_critical_path(TRANSFORMER, rank=1, iteration=3, repeats=repeats)
        hs = hta["seconds"]
        rows.append(f"| HTA 0.5.0 | `critical_path_analysis`, one iteration | {hs:.3f} | 1.0 |")
        rows.append(f"| Daydream | `simulate.replay.replay`, all iterations | {ours:.3f} | "
                    f"{hs / ours:.1f} |")
    else:
        rows.append(f"| Daydream | `simulate.replay.replay`, all iterations | {ours:.3f} | |")
    return rows + [""]


def bench_job(repeats: int) -> list[str]:
    """The simulator on a 64-rank job built from the 8 real DLRM ranks (issue 6)."""
    import distributed
    with tempfile.TemporaryDirectory() as tmp:
        r = distributed.job_scale(Path(tmp) / "s", repeats=max(5, repeats))
    return ["## A 64-rank job (issue 6)", "",
            "`bench/distributed.py` `job_scale`: the 8 DLRM ranks of "
            "`param/dlrm_8ranks` repeated 8 times (rank r of copy k is rank r + 8k), every "
            "collective joining all 64 ranks; `simulate.engine.simulate` (input checks "
            f"included) after a warm-up, best of {max(5, repeats)}.", "",
            "| ranks | tasks | edges | collectives x ranks | simulate s (best) | tasks/s | "
            "target |", "|---|---|---|---|---|---|---|",
            f"| {r['ranks']} | {r['tasks']:,} | {r['edges']:,} | {r['participants']:,} | "
            f"{r['simulate_s']:.4f} | {r['tasks_per_s']:,.0f} | 20,000,000 tasks/s |", ""]


# The commands that must start fast (issue 18), with their targets in seconds; TRACE is the id
# of the trace the section ingests first.
STARTUP = [(["--help"], 0.3), (["opts"], 0.3), (["info", "TRACE"], 0.3),
           (["sql", "SELECT count(*) FROM prediction"], 0.5)]


def bench_startup(repeats: int) -> list[str]:
    """Whole processes of the commands that must start fast, as the `daydream` script runs
    them (its two lines, with this checkout first on the path), over a store of one small
    real trace: wall and CPU seconds (user + system, from the kernel's accounting of the
    child), since other jobs on the machine slow the wall clock down."""
    import resource

    trace = ROOT / "tests" / "data" / "kineto" / "mi250_toy_train_rocm.json.gz"
    script = "import sys; from daydream.__main__ import main; sys.argv[0] = 'daydream'; main()"
    # bytecode caches written as an installed package has them (the first, untimed run
    # writes them here): compiling the checkout's modules is no part of a command's start-up
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT)
    n = max(9, 3 * repeats)
    load0 = os.getloadavg()[0]
    rows = ["## Start-up (issue 18)", "",
            "Whole processes, start to exit, of the commands that must start fast, as the "
            "`daydream` script runs them, over a store holding one small real trace "
            f"(`{trace.relative_to(ROOT)}`); median of {n} runs each, after one untimed run "
            "(which writes the bytecode caches an installed package has). "
            "CPU seconds are user + system of the process, which other jobs on the machine "
            "do not inflate as much as the wall clock.", ""]
    table = ["| command | wall s | CPU s | target s |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "s"
        out = subprocess.run([sys.executable, "-c", script, "ingest", str(trace), "--store",
                              str(store), "-j", "1"], check=True, capture_output=True,
                             text=True, env=env, cwd=tmp).stdout
        tid = out.split()[0]
        for args, target in STARTUP:
            argv = [tid if a == "TRACE" else a for a in args]
            if args[0] in ("info", "sql"):
                argv += ["--store", str(store)]
            walls, cpus = [], []
            for k in range(n + 1):
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t = time.perf_counter()
                subprocess.run([sys.executable, "-c", script, *argv], check=True,
                               capture_output=True, env=env, cwd=tmp)
                w = time.perf_counter() - t
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                if k:
                    walls.append(w)
                    cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
            shown = " ".join("TRACE" if a == "TRACE" else
                             (f'"{a}"' if " " in a else a) for a in args)
            table.append(f"| `daydream {shown}` | {_median(walls):.3f} | {_median(cpus):.3f} "
                         f"| {target} |")
    rows += [f"Load average (1 min) on this {os.cpu_count()}-core machine: {load0:.1f} when the "
             f"section started, {os.getloadavg()[0]:.1f} when it ended (other jobs share "
             "it).", ""]
    return rows + table + [""]


def bench_fleet(n: int) -> list[str]:
    """Batch ingest and batch predict over n distinct traces, 1 and 2 workers; results query."""
    import fleet
    return fleet.section(n)


def bench_fleet_real(quick: bool) -> list[str]:
    """Fleets of the real shared traces, 2.5k to 1M events, whole processes; a prediction's
    CPU by part (bench/fleet_real.py)."""
    import fleet_real
    return fleet_real.section("small" if quick else "full")


SECTIONS = {"ingest": bench_ingest, "graph": bench_graph, "replay": bench_replay,
            "simulate": bench_simulate, "job": bench_job, "memory": bench_memory,
            "fleet": bench_fleet, "fleet_real": bench_fleet_real, "startup": bench_startup}


def _sections(text: str) -> tuple[str, dict[str, str]]:
    parts = text.split("\n## ")
    return parts[0], {p.split("\n", 1)[0]: "## " + p for p in parts[1:]}


RENAMED = {"Ingest (issue 2)": "Ingest (issues 2, 18)"}  # old title -> the section now


def _merge(old: str, new: str) -> str:
    """With --only: the sections just measured replace theirs; the others stay as they were."""
    head, old_s = _sections(old)
    old_s = {RENAMED.get(k, k): v for k, v in old_s.items()}
    new_head, new_s = _sections(new)
    merged = {**old_s, **new_s}
    order = list(old_s) + [k for k in new_s if k not in old_s]
    return "\n".join([new_head.rstrip("\n"), ""] + [merged[k].rstrip("\n") + "\n"
                                                      for k in order])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repeats, smaller big trace")
    ap.add_argument("--only", default="", help="comma-separated sections")
    a = ap.parse_args()
    if not TRANSFORMER.exists():
        sys.exit(f"bench: {TRANSFORMER} not found; the benchmarks need ../shared/traces")
    repeats = 1 if a.quick else 3
    # the commands are timed as a user runs them after `make`: with the project's bytecode
    # written (daydream.warmup), not recompiled by every process since the last edit
    from daydream.warmup import compile_bytecode
    compile_bytecode()
    only = [s for s in a.only.split(",") if s] or list(SECTIONS)
    out = ["# Benchmarks", "",
           f"Written by `make bench` on {dt.date.today()}: {platform.machine()}, "
           f"{os.cpu_count()} cores, Python {platform.python_version()}. Wall-clock seconds; "
           "the peer tool runs in the same `make bench` run, on the same machine.", ""]
    for name in only:
        fn = SECTIONS[name]
        print(f"bench: {name} ...", file=sys.stderr)
        if name == "memory":
            out += fn(256 if a.quick else 1024)
        elif name == "fleet":
            out += fn(200 if a.quick else 1000)
        elif name == "fleet_real":
            out += fn(a.quick)
        elif name in ("ingest", "graph", "replay", "simulate", "job", "startup"):
            out += fn(repeats)
        else:
            out += fn()
    if a.only and OUT.exists():
        out = _merge(OUT.read_text(), "\n".join(out))
    else:
        out = "\n".join(out)
    OUT.write_text(out)
    print(f"bench: wrote {OUT.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
