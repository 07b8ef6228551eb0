"""HTA side of the side-by-side benchmarks. Runs INSIDE .venv-hta (see bench/hta_env.sh).

    python bench/hta_worker.py parse TRACE.json.gz
        Loads the trace exactly as ``hta.trace_analysis.TraceAnalysis(trace_dir=...)`` does
        (Trace(trace_dir) -> rank discovery from distributedInfo -> Trace.load_traces():
        parse_trace_file with the default parser config/backend, symbol re-encoding,
        alignment, GPU-kernel filtering, re-indexing). The trace is exposed to HTA through
        a temporary directory holding a symlink to it, since TraceAnalysis wants a
        directory of rank traces.
        Prints one JSON line:
          {"seconds", "parse_trace_file_seconds", "events", "rows", "rank",
           "peak_rss_mb", ...}
        seconds: wall clock of the TraceAnalysis(...) constructor (= what a user waits for
        before any analysis can run); parse_trace_file_seconds: the part of it spent in
        hta.common.trace.parse_trace_file (JSON load + DataFrame build + compression +
        fwd/bwd links + correlation + iteration column). events: number of entries in the
        file's traceEvents array; rows: rows of the DataFrame HTA keeps for the rank.

    python bench/hta_worker.py critical_path TRACE RANK ITER
        TRACE is a trace file or a directory of rank traces. Loads it as above (timed,
        reported as parse_seconds), then times
        TraceAnalysis.critical_path_analysis(rank=RANK, annotation="ProfilerStep",
        instance_id=K) alone, where K is the instance index (HTA's instance_id is the
        position among the annotation events, not the step number) of the CPU event
        "ProfilerStep#ITER". Prints one JSON line:
          {"seconds", "nodes", "edges", "critical_path_nodes", "success",
           "parse_seconds", "instance_id", "peak_rss_mb", ...}

Timing is time.perf_counter() wall clock around the HTA calls only (imports excluded);
cpu_seconds is time.process_time() over the same span (less sensitive to a busy machine).
peak_rss_mb is the process's peak resident set size (ru_maxrss), imports included.
Everything HTA prints (its logger, plotly) goes to stderr so stdout has only the JSON line.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import tempfile
import time


def _peak_rss_mb() -> float:
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@contextlib.contextmanager
def _trace_dir(trace: str):
    """A directory HTA can treat as a trace dir: the given one, or a temp dir with a symlink."""
    trace = os.path.abspath(trace)
    if os.path.isdir(trace):
        yield trace
        return
    if not (trace.endswith(".json") or trace.endswith(".gz")):
        raise SystemExit(f"hta_worker: {trace}: HTA only reads *.json / *.json.gz traces")
    with tempfile.TemporaryDirectory(prefix="hta-bench-") as tmp:
        os.symlink(trace, os.path.join(tmp, os.path.basename(trace)))
        yield tmp


class _ParseProbe:
    """Instruments (without changing) HTA's parse path to count events and time the parser."""

    def __init__(self) -> None:
        import hta.common.trace as trace_mod
        import hta.common.trace_parser as parser_mod

        self.events = 0
        self.cpu_seconds = 0.0
        self.parse_trace_file_seconds = 0.0
        self.backend = str(parser_mod.get_default_trace_parsing_backend())
        orig_dict = parser_mod.parse_trace_dict
        orig_file = trace_mod.parse_trace_file

        def parse_trace_dict(path):
            record = orig_dict(path)
            self.events += len(record.get("traceEvents", ()))
            return record

        def parse_trace_file(path, cfg=None):
            t0 = time.perf_counter()
            try:
                return orig_file(path, cfg)
            finally:
                self.parse_trace_file_seconds += time.perf_counter() - t0

        # Both are looked up as module globals at call time by HTA's callers.
        parser_mod.parse_trace_dict = parse_trace_dict
        trace_mod.parse_trace_file = parse_trace_file


def _load(trace_dir: str):
    """Construct TraceAnalysis exactly as a user would; return (analyzer, seconds, probe)."""
    from hta.trace_analysis import TraceAnalysis

    probe = _ParseProbe()
    c0 = time.process_time()
    t0 = time.perf_counter()
    analyzer = TraceAnalysis(trace_dir=trace_dir)
    seconds = time.perf_counter() - t0
    probe.cpu_seconds = time.process_time() - c0
    return analyzer, seconds, probe


def cmd_parse(trace: str) -> dict:
    import hta

    with _trace_dir(trace) as d, contextlib.redirect_stdout(sys.stderr):
        analyzer, seconds, probe = _load(d)
        ranks = analyzer.t.get_ranks()
        rows = sum(len(analyzer.t.get_trace(r)) for r in ranks)
    return {
        "tool": "hta",
        "hta_version": hta.__version__,
        "op": "parse",
        "trace": os.path.abspath(trace),
        "entry_point": "hta.trace_analysis.TraceAnalysis(trace_dir=...)",
        "parser_backend": probe.backend,
        "seconds": seconds,
        "cpu_seconds": probe.cpu_seconds,
        "parse_trace_file_seconds": probe.parse_trace_file_seconds,
        "events": probe.events,
        "rows": rows,
        "ranks": ranks,
        "peak_rss_mb": _peak_rss_mb(),
    }


def _instance_id_for_step(analyzer, rank: int, step: int) -> int:
    """Position of the CPU event 'ProfilerStep#<step>' among the events that HTA's
    critical_path_analysis(annotation='ProfilerStep') selects, in the same order."""
    t = analyzer.t
    trace_df = t.get_trace(rank)
    sym_index = t.symbol_table.get_sym_id_map()
    annotation_ids = [v for k, v in sym_index.items() if "ProfilerStep" in k]
    annotations = trace_df[trace_df.name.isin(annotation_ids)]
    target = sym_index.get(f"ProfilerStep#{step}")
    steps = sorted(
        int(k.split("#", 1)[1])
        for k in sym_index
        if k.startswith("ProfilerStep#") and k.split("#", 1)[1].isdigit()
    )
    if target is None:
        raise SystemExit(f"hta_worker: no ProfilerStep#{step} in rank {rank}; steps: {steps}")
    names = annotations["name"].to_numpy()
    streams = annotations["stream"].to_numpy()
    for pos in range(len(names)):
        if names[pos] == target and streams[pos] == -1:
            return pos
    raise SystemExit(
        f"hta_worker: ProfilerStep#{step} has no CPU event left after HTA's filtering "
        f"(the last step is dropped by default); steps in trace: {steps}"
    )


def cmd_critical_path(trace: str, rank: int, step: int) -> dict:
    import hta

    with _trace_dir(trace) as d, contextlib.redirect_stdout(sys.stderr):
        analyzer, parse_seconds, probe = _load(d)
        if rank not in analyzer.t.get_ranks():
            raise SystemExit(
                f"hta_worker: rank {rank} not in trace (ranks: {analyzer.t.get_ranks()})"
            )
        instance_id = _instance_id_for_step(analyzer, rank, step)
        c0 = time.process_time()
        t0 = time.perf_counter()
        result = analyzer.critical_path_analysis(
            rank=rank, annotation="ProfilerStep", instance_id=instance_id
        )
        seconds = time.perf_counter() - t0
        cpu_seconds = time.process_time() - c0
    if result is None:
        raise SystemExit("hta_worker: critical_path_analysis returned None (see stderr)")
    cp_graph, success = result
    return {
        "tool": "hta",
        "hta_version": hta.__version__,
        "op": "critical_path",
        "trace": os.path.abspath(trace),
        "entry_point": "hta.trace_analysis.TraceAnalysis.critical_path_analysis",
        "rank": rank,
        "iteration": step,
        "annotation": "ProfilerStep",
        "instance_id": instance_id,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "nodes": cp_graph.number_of_nodes(),
        "edges": cp_graph.number_of_edges(),
        "critical_path_nodes": len(getattr(cp_graph, "critical_path_nodes", []) or []),
        "success": bool(success),
        "parse_seconds": parse_seconds,
        "events": probe.events,
        "peak_rss_mb": _peak_rss_mb(),
    }


USAGE = (
    "usage: hta_worker.py parse TRACE.json.gz\n"
    "       hta_worker.py critical_path TRACE_OR_DIR RANK ITER"
)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "parse":
        out = cmd_parse(argv[1])
    elif len(argv) == 4 and argv[0] == "critical_path":
        out = cmd_critical_path(argv[1], int(argv[2]), int(argv[3]))
    else:
        print(USAGE, file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
