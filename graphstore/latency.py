"""The physical latencies the graph's edges carry, and the tolerances that decide whether an
inferred edge exists; each with its source.

An edge's ``lag_ns`` is one of these constants, never a figure fitted to the trace it belongs
to (../shared/ACCURACY.md, section 1): what a trace shows beyond it is the edge's ``slack_ns``,
named and counted per trace (the ``slack`` table). The values are medians over the calibration
traces of bench/manifest.py (none of them judged), measured by ``bench/calibrate_latency.py``;
rerun it when traces are added.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Latency:
    ns: int
    source: str


_CAL = ("bench/calibrate_latency.py on the calibration traces of bench/manifest.py (../shared/"
        "traces hta/small/*, hta/ads_sampled_*, kineto-tb-plugin/resnet50_v100_nw0_run1; none "
        "is judged), 2026-12-04")

# Edge latencies, by the edge kind that carries them (graphstore.schema.EDGE_KINDS).
LATENCY = {
    # GPU task end -> the next task's start on the same stream, when it was queued already
    "stream": Latency(1_000, "median of the per-trace medians of tasks launched >= 20 us "
                      "before their stream predecessor ended (AlexNet 1.00, simple add 1.00, "
                      "ResNet-50 nw0 run 1 1.00 us; the ads traces are sampled and left out); "
                      + _CAL),
    # launching call end -> its kernel's start, on a stream that was idle (end_start: the
    # command is submitted as the call returns; profilers record the call's end after their
    # exit callback, so kernels often start up to ~1 us before it)
    "launch": Latency(500, "median of the per-trace medians of kernels whose stream was "
                      "idle when the launch began (simple add 1.00, ads rank 0 0.00, ads rank 1 "
                      "-1.00, ResNet-50 nw0 run 1 3.00 us; traces with 20 such kernels); "
                      "0 before 2026-12-04, when particle/* calibrated it; " + _CAL),
    # recorded work on one stream ends -> a waiting stream's task starts (cudaStreamWaitEvent):
    # resolved by the GPU's front end like stream order; no calibration trace records enough
    # waits to measure it apart
    "wait": Latency(1_000, "assumed equal to the stream latency (no calibration trace "
                    "records 20 stream waits: one in all, 1.00 us)"),
    # the GPU work a blocking call waits for ends -> the call resumes (sync, blocking copy,
    # implicit syncs); its own cost after the wait is the task's duration
    "sync": Latency(3_600, "10th percentile of the 67 tails of blocking calls that waited "
                    "(call end - end of the GPU task it waited for) over the calibration "
                    "traces; 2_000 before 2026-12-04, when particle/* calibrated it; " + _CAL),
    # a full launch queue frees a slot -> the blocked enqueue call resumes: the host waiting
    # on a GPU completion, as a sync does
    "queue": Latency(3_600, "assumed equal to the sync latency (no calibration trace fills "
                     "its launch queue)"),
    # a thread woken by another thread's event (autograd engine hand-offs, backward()
    # returning): the same floor as the host waking on a GPU completion
    "wake": Latency(3_600, "assumed equal to the sync latency (futex wake-up; no calibration "
                    "trace has enough cross-thread hand-offs)"),
    # another stream's kernel that held the SMs ends -> a kernel waiting for room starts
    "contention": Latency(0, "estimate: the block scheduler places a waiting kernel's blocks "
                          "as the SMs free, before the occupant's last block has finished"),
    "origin": Latency(0, "the trace start: no latency"),
    "thread": Latency(0, "program order on a thread: host tasks fill the time between calls"),
}

# A stream holds at most this many launched but unfinished commands; a call that enqueues
# into a full stream blocks until the oldest one finishes (NVIDIA forums thread 68937 and
# stackoverflow.com/questions/53970187: "about 1000 kernels" per stream; the HTA V100
# ResNet-50 trace blocks at 1,022 outstanding GPU tasks, the rest being event records).
LAUNCH_QUEUE_DEPTH = 1024
