"""Simulator throughput on a synthetic graph shaped like a real trace.

    python bench/bench_simulate.py --tasks 10000000

The graph (``generate``): a few CPU threads issue CUDA API calls, each preceded by a stretch of
host work; most calls launch a kernel or copy onto one of several GPU streams (a START_START
launch edge: the GPU work may start a launch latency after the call starts), some are blocking
syncs that wait for the latest work on a stream or on every stream (END edges), and GPU tasks
wait on recent work of other streams (event waits, START edges). Program order on each thread
and stream order on each stream are stored as explicit edges too, as the graph store keeps
them, and the units are FIXED. Tasks are numbered by a pseudo observed start time in which GPU
work lags its launch by a queue depth. As in a real trace, a START edge's source started before
its destination (an event wait picks work observed to start before the waiting task), while an
END edge may point backwards in index order (a sync call begins before the GPU work it waits
for). Every edge goes forward in launch order, so the graph is acyclic.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rss import hwm_mib  # noqa: E402
from daydream.simulate import END, FIXED, START, START_START, SimGraph, simulate  # noqa: E402

N_THREADS = 4
N_STREAMS = 8
P_LAUNCH = 0.75      # share of API calls that launch GPU work
P_SYNC = 0.02        # share that block on a stream (or, 30% of them, on the device)


def _lognormal(rng, median_ns: float, sigma: float, size: int) -> np.ndarray:
    return np.maximum(1, rng.lognormal(np.log(median_ns), sigma, size)).astype(np.int64)


def _latest_before(launch_a: np.ndarray, gpu_key: np.ndarray, gpu_ids: np.ndarray,
                   stream_of_gpu: np.ndarray, stream: np.ndarray, before_a: np.ndarray,
                   before_key: np.ndarray | None = None, back: np.ndarray | int = 0):
    """For each query (stream, call position[, key]): the GPU task on that stream launched last
    before that position (and observed to start before ``before_key``), ``back`` launches
    further back; -1 where there is none. Launch position and key both grow along a stream."""
    out = np.full(stream.shape[0], -1, np.int64)
    for s in range(N_STREAMS):
        on_s = np.flatnonzero(stream_of_gpu == s)     # GPU positions, in launch order
        q = np.flatnonzero(stream == s)
        if not on_s.size or not q.size:
            continue
        pos = np.searchsorted(launch_a[on_s], before_a[q])
        if before_key is not None:
            pos = np.minimum(pos, np.searchsorted(gpu_key[on_s], before_key[q]))
        pos = pos - 1 - (back[q] if isinstance(back, np.ndarray) else back)
        ok = pos >= 0
        out[q[ok]] = gpu_ids[on_s[pos[ok]]]
    return out


def generate(n_tasks: int, seed: int = 0, edges_per_task: float = 2.0) -> SimGraph:
    """A trace-shaped graph of about ``n_tasks`` tasks and ``edges_per_task`` edges per task."""
    rng = np.random.default_rng(seed)
    n_calls = max(1, int(n_tasks / (2 + P_LAUNCH)))
    a = np.arange(n_calls, dtype=np.int64)
    thread = rng.choice(N_THREADS, size=n_calls, p=[0.55, 0.25, 0.1, 0.1]).astype(np.int32)
    r = rng.random(n_calls)
    is_launch = r < P_LAUNCH
    is_sync = (r >= P_LAUNCH) & (r < P_LAUNCH + P_SYNC)
    del r

    # Old numbering: gaps 0..A-1, calls A..2A-1, GPU tasks 2A..2A+G-1 (in launch order).
    launch_a = np.flatnonzero(is_launch).astype(np.int64)   # call position of each GPU task
    n_gpu = launch_a.shape[0]
    gpu_ids = 2 * n_calls + np.arange(n_gpu, dtype=np.int64)
    stream = rng.choice(N_STREAMS, size=n_gpu,
                        p=[0.5, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05]).astype(np.int32)
    n = 2 * n_calls + n_gpu

    dur = np.empty(n, np.int64)
    dur[:n_calls] = _lognormal(rng, 3_000, 1.0, n_calls)                  # host gaps
    dur[n_calls:2 * n_calls] = _lognormal(rng, 4_000, 0.5, n_calls)      # API calls
    dur[n_calls:2 * n_calls][is_sync] = _lognormal(rng, 1_000, 0.5, int(is_sync.sum()))
    dur[2 * n_calls:] = _lognormal(rng, 15_000, 1.2, n_gpu)              # kernels, copies
    unit = np.empty(n, np.int32)
    unit[:n_calls] = thread
    unit[n_calls:2 * n_calls] = thread
    unit[2 * n_calls:] = N_THREADS + stream

    # Pseudo observed start: 3a for the gap, 3a+1 for the call, and for GPU work 3x+2 where x is
    # the launch position plus a queue depth, made monotone per stream (stream order).
    key = np.empty(n, np.int64)
    key[:n_calls] = 3 * a
    key[n_calls:2 * n_calls] = 3 * a + 1
    depth = launch_a + rng.integers(0, 64, n_gpu)
    by_stream = np.argsort(stream, kind="stable")
    grouped = depth[by_stream] + stream[by_stream].astype(np.int64) * (4 * n_calls + 128)
    np.maximum.accumulate(grouped, out=grouped)
    depth[by_stream] = grouped - stream[by_stream].astype(np.int64) * (4 * n_calls + 128)
    key[2 * n_calls:] = 3 * depth + 2
    del depth, grouped

    srcs, dsts, lags, kinds = [], [], [], []

    def add(s, d, lag, kind):
        srcs.append(s)
        dsts.append(d)
        lags.append(lag)
        kinds.append(np.full(s.shape[0], kind, np.int8))

    # Program order per thread: gap_a -> call_a -> next gap on that thread.
    calls_by_thread = np.argsort(thread, kind="stable")
    seq = np.empty(2 * n_calls, np.int64)
    seq[0::2] = calls_by_thread
    seq[1::2] = n_calls + calls_by_thread
    same = np.repeat(thread[calls_by_thread], 2)
    same = same[1:] == same[:-1]
    add(seq[:-1][same], seq[1:][same], np.zeros(int(same.sum()), np.int64), START)
    del seq, same, calls_by_thread
    # Stream order per stream.
    on_stream = gpu_ids[by_stream]
    same = stream[by_stream]
    same = same[1:] == same[:-1]
    add(on_stream[:-1][same], on_stream[1:][same], np.zeros(int(same.sum()), np.int64), START)
    del on_stream, same, by_stream
    # Launch: the GPU task may start a launch latency after its call starts (START_START).
    add(n_calls + launch_a, gpu_ids, _lognormal(rng, 3_000, 0.4, n_gpu), START_START)
    # Blocking syncs: END edges from the latest work on one stream, or on every stream.
    sync_a = np.flatnonzero(is_sync).astype(np.int64)
    device_wide = rng.random(sync_a.shape[0]) < 0.3
    q_a = np.concatenate([sync_a[~device_wide], np.repeat(sync_a[device_wide], N_STREAMS)])
    q_s = np.concatenate([rng.integers(0, N_STREAMS, int((~device_wide).sum())),
                          np.tile(np.arange(N_STREAMS), int(device_wide.sum()))])
    gpu_key = key[2 * n_calls:]
    src = _latest_before(launch_a, gpu_key, gpu_ids, stream, q_s, q_a)
    ok = src >= 0
    add(src[ok], n_calls + q_a[ok], _lognormal(rng, 1_000, 0.3, int(ok.sum())), END)
    del sync_a, device_wide, q_a, q_s, src, ok
    # Cross-stream event waits fill the edge budget.
    m_so_far = sum(x.shape[0] for x in srcs)
    lam = max(0.0, (edges_per_task * n - m_so_far) / max(n_gpu, 1))
    k = rng.poisson(lam, n_gpu)
    waiter = np.repeat(np.arange(n_gpu, dtype=np.int64), k)
    del k
    other = (stream[waiter] + rng.integers(1, N_STREAMS, waiter.shape[0])) % N_STREAMS
    src = _latest_before(launch_a, gpu_key, gpu_ids, stream, other, launch_a[waiter],
                         gpu_key[waiter], rng.integers(0, 8, waiter.shape[0]))
    ok = src >= 0
    add(src[ok], gpu_ids[waiter[ok]], rng.integers(0, 1_000, int(ok.sum())), START)
    del waiter, other, src, ok

    src = np.concatenate(srcs)
    srcs.clear()
    dst = np.concatenate(dsts)
    dsts.clear()
    lag = np.concatenate(lags)
    lags.clear()
    kind = np.concatenate(kinds)
    kinds.clear()

    # Renumber tasks by pseudo observed start.
    order = np.argsort(key, kind="stable")
    new_of_old = np.empty(n, np.int64)
    new_of_old[order] = np.arange(n, dtype=np.int64)
    src = new_of_old[src]
    dst = new_of_old[dst]
    del new_of_old
    policy = np.full(N_THREADS + N_STREAMS, FIXED, np.int8)
    return SimGraph.from_edges(dur[order], unit[order], policy, src, dst, lag, kind,
                               order_key=key[order])


def _peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_hwm() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process, where Linux allows it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def run(n_tasks: int = 10_000_000, seed: int = 0, repeat: int = 3) -> dict:
    """Generate a graph of ``n_tasks`` and simulate it ``repeat`` times (after a warm-up that
    compiles or loads the numba cache); times and peak RSS of the whole process."""
    simulate(generate(1000, seed))
    t0 = time.perf_counter()
    g = generate(n_tasks, seed)
    t1 = time.perf_counter()
    rss_after_generate = _peak_rss_mb()
    # Peak of the simulate phase alone (graph + simulator arrays), where the kernel lets us
    # reset the mark; ru_maxrss below is the whole process, generation included.
    hwm_reset = _reset_hwm()
    times = []
    for _ in range(max(1, repeat)):
        t = time.perf_counter()
        sched = simulate(g)
        times.append(time.perf_counter() - t)
        makespan = sched.makespan_ns
        del sched
    first, best = times[0], min(times)
    return {
        "tasks": g.n_tasks,
        "edges": g.n_edges,
        "edges_per_task": round(g.n_edges / max(g.n_tasks, 1), 3),
        "end_edges": int(np.count_nonzero(g.edge_kind == 1)),
        "generate_s": round(t1 - t0, 3),
        "simulate_s_first": round(first, 3),
        "simulate_s_best": round(best, 3),
        "tasks_per_s_first": round(g.n_tasks / first),
        "tasks_per_s_best": round(g.n_tasks / best),
        "edges_per_s_best": round(g.n_edges / best),
        "makespan_ns": makespan,
        "peak_rss_mb_after_generate": round(rss_after_generate),
        "peak_rss_mb_simulate_phase": round(hwm_mib()) if hwm_reset and hwm_mib() else None,
        "peak_rss_mb": round(max(rss_after_generate, _peak_rss_mb())),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=10_000_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3, help="simulate this many times")
    args = p.parse_args(argv)
    print(json.dumps(run(args.tasks, args.seed, args.repeat), indent=2))


if __name__ == "__main__":
    main()
