"""Hand-made traces for the bounds script, written by the tests into temporary folders, each in
Kineto JSON and (the first) in Nsight SQLite, with the figures worked out by hand beside them.

Toy A, one step (times in us from the step's start; every step the same, 1000 us long; three
ProfilerStep#N ranges, the third the drain):

    main thread   aten::mm [50,300) > cudaLaunchKernel [150,160)
                  aten::add [300,350) > cudaLaunchKernel [310,320)
                  aten::item [400,700) > cudaStreamSynchronize [420,690)
                  aten::relu [720,800) > cudaLaunchKernel [730,790)   (blocked: 60 us)
    bwd thread    autograd::engine [150,250) > cudaLaunchKernel [170,180)
    stream 7      kernel [200,500), kernel [700,795)
    stream 8      kernel [450,680)

By hand, per step:
- launches on main: 10, 10, 60 us in each step, median 10; the blocked one has no GPU task
  ending inside it (the kernel on stream 7 ends at 795), so its cost is the median: 10; its
  waste 50 us ([730,780)).
- the sync: median 270; the last GPU end inside it is 680, tail 10: cost 10, waste 260
  ([420,680)).
- main's marks: [50,350) + [400,700) + [720,800) = 680; own = 680 - 260 - 50 = 370 us.
  Gaps: [0,50) 50, [350,400) 50, [700,720) 20 (short, 120 in all); [800,1000) 200 (a wait).
- bwd: own 100 ([150,250), its launch unblocked); gaps 150 and 750, both waits.
- GPU union: [200,680) + [700,795) = 575 us; stream 7 alone 300 + 95 = 395.
- C_max = 370, C_sum = (370 + 120) + 100 = 590.
- W: the union of GPU, own work and short gaps is [0,800), so W = 200 us.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

STEP_US = 1000
BASE_US = 1_000_000  # the trace's clock does not start at zero

# (thread, category, name, start, end) in us from a step's start
TOY_A_CPU = [
    (1, "cpu_op", "aten::mm", 50, 300),
    (1, "cuda_runtime", "cudaLaunchKernel", 150, 160),
    (1, "cpu_op", "aten::add", 300, 350),
    (1, "cuda_runtime", "cudaLaunchKernel", 310, 320),
    (1, "cpu_op", "aten::item", 400, 700),
    (1, "cuda_runtime", "cudaStreamSynchronize", 420, 690),
    (1, "cpu_op", "aten::relu", 720, 800),
    (1, "cuda_runtime", "cudaLaunchKernel", 730, 790),
    (2, "cpu_op", "autograd::engine::evaluate_function", 150, 250),
    (2, "cuda_runtime", "cudaLaunchKernel", 170, 180),
]
# (stream, start, end)
TOY_A_GPU = [(7, 200, 500), (7, 700, 795), (8, 450, 680)]
TOY_A_EXPECTED_MS = {"T_ms": 1.0, "G_ms": 0.575, "G_all_ms": 0.575, "G_stream_ms": 0.395,
                     "C_max_ms": 0.370, "C_sum_ms": 0.590, "W_ms": 0.200}


def toy_a_events(steps: int = 3) -> list[dict]:
    ev = []
    for k in range(steps):
        t0 = BASE_US + k * STEP_US
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k + 1}",
                   "pid": 1, "tid": 1, "ts": t0, "dur": STEP_US})
        for tid, cat, name, s, e in TOY_A_CPU:
            ev.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid,
                       "ts": t0 + s, "dur": e - s})
        for stream, s, e in TOY_A_GPU:
            ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": stream,
                       "ts": t0 + s, "dur": e - s})
    return ev


def write_kineto(path: Path, events: list[dict]) -> Path:
    data = json.dumps({"schemaVersion": 1, "traceEvents": events}).encode()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def write_toy_a_nsys(path: Path, steps: int = 3) -> Path:
    """Toy A as an Nsight Systems export: the same events in ns, operators and step markers
    as NVTX push/pop ranges, two threads of one process (globalTid = pid << 24 | tid)."""
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT,
            streamId INT, globalPid INT, correlationId INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, globalTid INT,
            nameId INT, correlationId INT);
        CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, text TEXT,
            globalTid INT, textId INT);
    """)
    names = {"cudaLaunchKernel": 1, "cudaStreamSynchronize": 2}
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(v, k) for k, v in names.items()])
    pid = 77 << 24
    for k in range(steps):
        t0 = (BASE_US + k * STEP_US) * 1000
        con.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, ?, ?, NULL)",
                    (t0, t0 + STEP_US * 1000, f"ProfilerStep#{k + 1}", pid | 1))
        for tid, cat, name, s, e in TOY_A_CPU:
            if cat == "cpu_op":
                con.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, ?, ?, NULL)",
                            (t0 + s * 1000, t0 + e * 1000, name, pid | tid))
            else:
                con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, 0)",
                            (t0 + s * 1000, t0 + e * 1000, pid | tid, names[name]))
        for stream, s, e in TOY_A_GPU:
            con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, ?, ?, 0)",
                        (t0 + s * 1000, t0 + e * 1000, stream, pid))
    con.commit()
    con.close()
    return path


def toy_b_events() -> list[dict]:
    """Toy B: no ProfilerStep; Optimizer.step ranges (50 us, marked twice: an annotation and
    an op of the same name) ending at 100, 500, 1500, 2500, 3500 us. Windows between their
    ends: 400 (the warm-up: 60% off the median 1000), then three of 1000 us. In each of
    those, aten::mm [100, 400) after the window's start and the step's own 50 us at its end:
    own work 350 us; gaps of 100 (short: at most 100 us) and 550 (a wait): C_sum 450,
    W 550 us; no GPU work."""
    ends = [100, 500, 1500, 2500, 3500]
    ev = []
    for e in ends:
        for cat in ("user_annotation", "cpu_op"):
            ev.append({"ph": "X", "cat": cat, "name": "Optimizer.step#SGD.step", "pid": 1,
                       "tid": 1, "ts": BASE_US + e - 50, "dur": 50})
    for a in ends[1:-1]:
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                   "ts": BASE_US + a + 100, "dur": 300})
    return ev


def toy_c_events(steps: int = 3) -> list[dict]:
    """Toy C, a step of 4000 us waiting on a DataLoader's worker processes (times in us from
    the step's start): the main thread runs aten::mm [0,100) > cudaLaunchKernel [10,20), whose
    kernel runs [100,600) on stream 7 while the thread waits, outside any work mark, until
    3900 for its next batch (nothing in the trace ends within WOKEN_NS = 1 ms before: the GPU
    drained 3.3 ms earlier, and there is no other thread), then aten::copy_ [3900,4000).

    By hand, per step: G = 500; C_max = C_sum = 200 (no short gaps); the gap [100,3900) is a
    wait on what the trace does not show, and the kernel under it cannot shorten it: W = 4000
    - 200 = 3800 us (without that rule 3800 - 500 = 3300)."""
    ev = []
    for k in range(steps):
        t0 = BASE_US + k * 4000
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k + 1}",
                   "pid": 1, "tid": 1, "ts": t0, "dur": 4000})
        for cat, name, s, e in (("cpu_op", "aten::mm", 0, 100),
                                ("cuda_runtime", "cudaLaunchKernel", 10, 20),
                                ("cpu_op", "aten::copy_", 3900, 4000)):
            ev.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1,
                       "ts": t0 + s, "dur": e - s})
        ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7,
                   "ts": t0 + 100, "dur": 500})
    return ev


# Toy F, the dependency floor (bounds.sync_floor), three steps of 1000 us, the third the drain
# (times in us from a step's start; correlation ids tie each call to its GPU task):
#
#     main thread   aten::a [0,100) > cudaLaunchKernel [50,60)        -> kernel [60,560) stream 7
#                   aten::b [100,200) > cudaLaunchKernel [150,160)    -> kernel [560,760) stream 7
#                   aten::item [200,800) > cudaMemcpyAsync [210,790)  -> Memcpy DtoH (Device ->
#                                                                     Pageable) [760,780) stream 7
#                   aten::c [850,1000)                                (a short gap [800,850))
#     bwd thread    autograd::engine [300,400) > cudaLaunchKernel [310,320) -> kernel [320,420)
#                                                                              stream 8
#
# By hand: the copy's call waits [210,780) (cost: its tail after the copy ended, 10 us), so
# main's own work is [0,210) + [780,800) + [850,1000) and bwd's [300,400): they never overlap,
# so the threads run one after another. The blocking copy cuts a step in two:
# - before it, [0,210): own work 210; the launch at 50 has 50 of own work before it and the
#   work from it on, 500 + 200 + 20 (the copy) on stream 7, after it: 50 + f x 720; the launch
#   at 150: 150 + f x 220; the copy itself at 210: 210 + f x 20.
#   At f = 0.5: max(210, 410, 260, 220) = 410; at f = 1: 770.
# - after it, [790,1000): own work 10 + 150 = 160 (210 with the short gap as work).
# Floor at f = 0.5: 570 us (620 with short gaps); at f = 1: 930 us.
TOY_F_CPU = [  # (thread, category, name, start, end, correlation offset or None)
    (1, "cpu_op", "aten::a", 0, 100, None),
    (1, "cuda_runtime", "cudaLaunchKernel", 50, 60, 1),
    (1, "cpu_op", "aten::b", 100, 200, None),
    (1, "cuda_runtime", "cudaLaunchKernel", 150, 160, 2),
    (1, "cpu_op", "aten::item", 200, 800, None),
    (1, "cuda_runtime", "cudaMemcpyAsync", 210, 790, 3),
    (1, "cpu_op", "aten::c", 850, 1000, None),
    (2, "cpu_op", "autograd::engine::evaluate_function", 300, 400, None),
    (2, "cuda_runtime", "cudaLaunchKernel", 310, 320, 4),
]
TOY_F_GPU = [  # (category, name, stream, start, end, correlation offset)
    ("kernel", "k1", 7, 60, 560, 1),
    ("kernel", "k2", 7, 560, 760, 2),
    ("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 7, 760, 780, 3),
    ("kernel", "k4", 8, 320, 420, 4),
]
TOY_F_FLOOR_MS = {0.5: 0.570, 1.0: 0.930}
TOY_F_FLOOR_SHORT_GAPS_MS = {0.5: 0.620}


def toy_f_events(steps: int = 3) -> list[dict]:
    return _stepped(TOY_F_CPU, TOY_F_GPU, steps)


def _stepped(cpu: list, gpu: list, steps: int) -> list[dict]:
    """STEPS steps of STEP_US, each a ProfilerStep marker on thread 1 with the CPU rows
    (thread, category, name, start, end, correlation offset or None) and the GPU rows
    (category, name, stream, start, end, correlation offset) at its offsets; the correlation
    ids of step k are 100 (k + 1) + the offset."""
    ev = []
    for k in range(steps):
        t0, c0 = BASE_US + k * STEP_US, 100 * (k + 1)
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k + 1}",
                   "pid": 1, "tid": 1, "ts": t0, "dur": STEP_US})
        for tid, cat, name, st, e, c in cpu:
            ev.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid,
                       "ts": t0 + st, "dur": e - st,
                       "args": {} if c is None else {"correlation": c0 + c}})
        for cat, name, stream, st, e, c in gpu:
            ev.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream,
                       "ts": t0 + st, "dur": e - st, "args": {"correlation": c0 + c}})
    return ev


# Toy G, the two call rules of the dependency floor (bounds.sync_floor ``median_calls``): one
# thread, three steps of 1000 us, the third the drain (us from a step's start):
#
#     aten::a [0,50)    > cudaLaunchKernel [10,20)   -> kernel k1 [20,200) stream 7
#     aten::b [50,400)  > cudaLaunchKernel [60,300)  -> kernel k2 [300,500) stream 7
#     aten::item [400,900) > cudaMemcpyAsync [410,890) -> Memcpy DtoH (Device -> Pageable)
#                                                        [860,880) stream 7
#     aten::c [900,1000)
#
# By hand. The launch at 60 holds k1's end (200): its tail is 100 us; the thread's launches
# last 10 and 240 us, three of each, so their median is 125. The copy's call is cut out as the
# blocking call, [410,890).
# - Tail rule (the default): the launch costs min(240, 125, 100) = 100, so [60,200) is
#   waiting. Before the copy, own work is 410 - 140 = 270; the launch at 10 gives
#   10 + f x (180 + 200 + 20), the one at 60 gives 60 + f x 220, the copy itself
#   270 + f x 20. At f = 0.5: max(270, 210, 170, 280) = 280. After it, [890,1000): 110.
#   Floor 390 us.
# - Median rule: the launch costs min(240, 125) = 125, so [60,175) is waiting. Own work
#   before the copy is 295; the copy gives 295 + 10 = 305. After it: 110. Floor 415 us.
TOY_G_CPU = [  # (thread, category, name, start, end, correlation offset or None)
    (1, "cpu_op", "aten::a", 0, 50, None),
    (1, "cuda_runtime", "cudaLaunchKernel", 10, 20, 1),
    (1, "cpu_op", "aten::b", 50, 400, None),
    (1, "cuda_runtime", "cudaLaunchKernel", 60, 300, 2),
    (1, "cpu_op", "aten::item", 400, 900, None),
    (1, "cuda_runtime", "cudaMemcpyAsync", 410, 890, 3),
    (1, "cpu_op", "aten::c", 900, 1000, None),
]
TOY_G_GPU = [  # (category, name, stream, start, end, correlation offset)
    ("kernel", "k1", 7, 20, 200, 1),
    ("kernel", "k2", 7, 300, 500, 2),
    ("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 7, 860, 880, 3),
]
TOY_G_FLOOR_MS = {"tail": 0.390, "median": 0.415}


def toy_g_events(steps: int = 3) -> list[dict]:
    return _stepped(TOY_G_CPU, TOY_G_GPU, steps)
