"""The graph tables: every table and column declared once, with type, unit and doc.

They live in ``DIR/graph.duckdb``. Ids are per trace: (trace_id, task_id) is the key of a task,
task ids are dense 0..n-1 in start order so they double as array indices for the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass

# 2: task.kind, edge.anchor and unit.policy are ENUMs; 3: lags are physical latencies, the
# rest of each observed delay is edge.slack_ns; edge.inferred; the slack table; 4: GPU work
# launched before the window is bound by its stream predecessor (its gap is slack), not pinned
# to the trace start; 5: launches whose work ran after the window wait on queue edges, and GPU
# work without a launch takes the iteration of the launched task before it on its stream; 6: large
# graphs stored as Parquet in DIR/graph (graphstore.db; a version-5 store is migrated as it is);
# 7: task.name, layer and phase stored as dictionaries (version-6 Parquet task files rewritten);
# 8: prediction rows carry what a single prediction reports beside its speedup: the reference
# step, the interval and the failed gates (an older prediction table rebuilt with them NULL)
GRAPH_SCHEMA_VERSION = 8


@dataclass(frozen=True)
class Col:
    name: str
    sql: str
    doc: str


@dataclass(frozen=True)
class GTable:
    name: str
    doc: str
    columns: tuple[Col, ...]

    def ddl(self) -> str:
        cols = ",\n  ".join(f"{c.name} {c.sql}" for c in self.columns)
        return f"CREATE TABLE IF NOT EXISTS {self.name} (\n  {cols}\n)"

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def arrow_schema(self):
        """The Arrow schema of rows to insert (the scalar SQL types the result tables use)."""
        import pyarrow as pa
        types = {"VARCHAR": pa.string(), "DOUBLE": pa.float64(), "INTEGER": pa.int32(),
                 "BIGINT": pa.int64(), "TIMESTAMP": pa.timestamp("us", tz="UTC"),
                 "VARCHAR[]": pa.list_(pa.string())}
        return pa.schema([pa.field(c.name, types[c.sql.split()[0]]) for c in self.columns])


# Task kinds. CPU kinds come first: the simulator's reports tell CPU from GPU by code order.
CPU_KINDS = ("api", "host")
LOCAL_GPU_KINDS = ("kernel", "memcpy", "memset")  # GPU work of one rank alone (no collective)
GPU_KINDS = LOCAL_GPU_KINDS + ("comm",)
TASK_KINDS = CPU_KINDS + GPU_KINDS
EDGE_KINDS = ("thread", "stream", "launch", "sync", "wait", "wake", "origin", "queue", "rank",
              "inserted", "contention")
# How an edge constrains its destination (the simulator's three anchors):
#   end_start   dst starts no earlier than src end + lag     (order, waits)
#   start_start dst starts no earlier than src start + lag   (launch: the GPU work is enqueued
#               during the call, so it may start before the call returns)
#   end_end     dst's own work (dur_ns) begins no earlier than src end + lag, so it ends
#               no earlier than that plus dur_ns (a call that waited for GPU work, or a
#               thread woken by another, then does its own remaining work)
EDGE_ANCHORS = ("end_start", "start_start", "end_end")
PHASES = ("forward", "backward", "weight_update", "data_loading", "other")
# The slack table's kinds (SLACK.kind): the kind of each edge a trace's graph is built with
# (graphstore.build; rank edges join the ranks of a job graph and inserted ones are a
# transform's, so neither is in a trace's slack), then gpu_idle (a GPU task that started later
# than every constraint allows) and peer_wait (a collective waiting for the other ranks).
SLACK_KINDS = tuple(k for k in EDGE_KINDS if k not in ("rank", "inserted")) + ("gpu_idle",
                                                                               "peer_wait",
                                                                               "untraced")
UNIT_KINDS = ("thread", "stream", "channel")
POLICIES = ("fixed", "fcfs", "priority")


def enum(values: tuple[str, ...]) -> str:
    """A DuckDB ENUM over ``values``: stored as one byte a row, read back as an Arrow
    dictionary, so the simulator maps a handful of strings instead of one per row."""
    return "ENUM(" + ", ".join(f"'{v}'" for v in values) + ")"


def one_of(values: tuple[str, ...]) -> str:
    """``a, b or c``: a vocabulary as a column's doc names it."""
    return ", ".join(values[:-1]) + f" or {values[-1]}"

TASK = GTable("task", "One node of the dependency graph.", (
    Col("trace_id", "VARCHAR NOT NULL", "Trace (content hash of the source file)."),
    Col("task_id", "BIGINT NOT NULL", "Dense id within the trace, in start order."),
    Col("kind", f"{enum(TASK_KINDS)} NOT NULL", one_of(TASK_KINDS) + "."),
    Col("unit_id", "INTEGER NOT NULL", "Unit (thread, stream, channel) that runs the task."),
    Col("name", "VARCHAR", "Call / kernel name; for host tasks the innermost enclosing range."),
    Col("layer", "VARCHAR", "DNN layer (module path or annotation), where mapped."),
    Col("phase", "VARCHAR", "forward, backward, weight_update, data_loading or other."),
    Col("iteration", "INTEGER", "Training iteration (0-based), null outside all iterations."),
    Col("start_ns", "BIGINT NOT NULL", "Observed start, ns."),
    Col("dur_ns", "BIGINT NOT NULL", "Duration used by the simulator, ns: the task's own cost. "
        "For a task that waited (a sync, a blocking copy, an enqueue into a full queue, a "
        "thread waiting for another) only the part after the wait; the wait is its edges'."),
    Col("slack_ns", "BIGINT NOT NULL", "Waiting inside the task that no edge models, ns: a "
        "collective kernel on one rank's trace waiting for its peers (peer-wait slack). The "
        "simulator runs dur_ns + slack_ns; the explained replay dur_ns alone."),
    Col("obs_dur_ns", "BIGINT NOT NULL", "Observed duration, ns."),
    Col("bytes", "BIGINT", "Bytes moved (copies, sets, collectives)."),
    Col("correlation", "BIGINT", "CUPTI correlation id (api and GPU tasks)."),
    Col("range_id", "BIGINT", "Innermost enclosing activity range (CPU tasks), else null."),
    Col("blocking", "BOOLEAN NOT NULL", "A call that waits for GPU work by its semantics (a "
        "sync, a blocking copy, an implicit sync such as cudaFree); see graphstore.calls."),
    Col("priority", "BIGINT", "Scheduling priority on priority units (lower first)."),
))

EDGE = GTable("edge", "A dependency between two tasks of one trace.", (
    Col("trace_id", "VARCHAR NOT NULL", "Trace."),
    Col("src", "BIGINT NOT NULL", "Source task_id."),
    Col("dst", "BIGINT NOT NULL", "Destination task_id."),
    Col("kind", "VARCHAR NOT NULL", one_of(EDGE_KINDS) + "."),
    Col("anchor", f"{enum(EDGE_ANCHORS)} NOT NULL",
        "end_start, start_start or end_end (see EDGE_ANCHORS)."),
    Col("lag_ns", "BIGINT NOT NULL", "Delay after the anchor, ns: the physical latency of "
        "the edge's kind (graphstore.latency), never fitted to this trace."),
    Col("slack_ns", "BIGINT NOT NULL", "What the trace shows beyond lag_ns, ns (signed): on the "
        "edge that bound the destination, observed delay - lag; on the others at most 0, so "
        "that lag + slack replays the trace exactly. Dropped by the explained replay."),
    Col("binding", "BOOLEAN NOT NULL", "This edge bound the destination in the trace."),
    Col("inferred", "BOOLEAN NOT NULL", "Inferred from a coincidence of times (wake-ups, "
        "unrecorded cross-stream waits, the stream of a sync without a record, the task that "
        "released a blocked enqueue), not read from the trace."),
))

UNIT = GTable("unit", "Who runs tasks one at a time: CPU threads, GPU streams, channels.", (
    Col("trace_id", "VARCHAR NOT NULL", "Trace."),
    Col("unit_id", "INTEGER NOT NULL", "Dense id within the trace."),
    Col("kind", "VARCHAR NOT NULL", one_of(UNIT_KINDS) + "."),
    Col("pid", "BIGINT", "Process (threads)."),
    Col("tid", "BIGINT", "Thread id (threads)."),
    Col("device", "INTEGER", "GPU index (streams)."),
    Col("stream", "BIGINT", "Stream id (streams)."),
    Col("name", "VARCHAR", "Readable name, e.g. 'thread 4037', 'gpu 0 stream 7' or 'gpu 0 "
        "stream 7 lane 1' (a graph lane: nodes of one CUDA graph launch that ran beside others "
        "of it on stream 7; docs/graph.md)."),
    Col("policy", f"{enum(POLICIES)} NOT NULL", "fixed (trace order kept), fcfs or priority."),
))

ITERATION = GTable("iteration", "Training iterations found in a trace.", (
    Col("trace_id", "VARCHAR NOT NULL", "Trace."),
    Col("iteration", "INTEGER NOT NULL", "0-based index in the trace."),
    Col("label", "VARCHAR", "Marker it came from, e.g. 'ProfilerStep#12'."),
    Col("source", "VARCHAR NOT NULL", "ProfilerStep, Optimizer.step or whole_trace."),
    Col("start_ns", "BIGINT NOT NULL", "Start, ns."),
    Col("end_ns", "BIGINT NOT NULL", "End, ns: where the next iteration starts, or the end of "
        "the last GPU work of this one."),
))

LAYER = GTable("layer", "DNN layers found in a trace.", (
    Col("trace_id", "VARCHAR NOT NULL", "Trace."),
    Col("layer", "VARCHAR NOT NULL", "Layer name (module path or annotation)."),
    Col("source", "VARCHAR NOT NULL", "python_function, annotation, nvtx or cpu_op."),
    Col("module_type", "VARCHAR", "Module class, where known."),
    Col("first_start_ns", "BIGINT", "First time the layer was entered, ns."),
    Col("param_bytes", "BIGINT", "Parameter bytes, where the trace tells."),
))

SLACK = GTable("slack", "What the graph does not explain, per iteration and kind: the slack "
               "of the edges that bound their destination (edge.slack_ns), summed.", (
    Col("trace_id", "VARCHAR NOT NULL", "Trace."),
    Col("iteration", "INTEGER", "Iteration of the destination tasks (null outside all)."),
    Col("kind", "VARCHAR NOT NULL", one_of(SLACK_KINDS) + " (SLACK_KINDS): an edge kind "
        "(origin: GPU work launched before the window, or by an untraced thread), gpu_idle (a "
        "GPU task that started later than every constraint allows), peer_wait (a collective "
        "waiting for other ranks) or untraced (a thread's stretch with nothing traced in it "
        "while its GPU work ran: CPU work or a wait the trace does not show)."),
    Col("edges", "BIGINT NOT NULL", "Binding edges with slack of this kind."),
    Col("slack_ns", "BIGINT NOT NULL", "Their positive slack, summed, ns (delays beyond the "
        "physical latency)."),
    Col("early_ns", "BIGINT NOT NULL", "Their negative slack, summed, ns (tasks that began "
        "sooner after their binding predecessor than its latency: the constant is high "
        "there)."),
))

GRAPH_TABLES = {t.name: t for t in (TASK, EDGE, UNIT, ITERATION, LAYER, SLACK)}

# Results the later stages keep beside the graph (in the same database, so one SQL query joins
# them with the traces). A trace's rows are dropped whenever its graph is replaced: a
# prediction is only valid for the graph it was simulated on. What one prediction reports
# whole (the row below is a part of it) is declared in graphstore/prediction.py
# (PredictionResult; PredictionResult.row gives this table's row).
PREDICTION = GTable("prediction", "One what-if prediction: a stored trace simulated with one "
                    "optimization spec (`daydream predict --all`).", (
    Col("trace_id", "VARCHAR NOT NULL", "Trace."),
    Col("spec", "VARCHAR NOT NULL", "Optimization spec as given, e.g. 'amp' or "
        "'amp+fused_adam'."),
    Col("measured_ms", "DOUBLE", "Mean measured iteration time (used iterations), ms."),
    Col("baseline_ms", "DOUBLE", "Mean simulated time of the unmodified graph, ms."),
    Col("predicted_ms", "DOUBLE", "Mean simulated time with the optimization, ms."),
    Col("speedup", "DOUBLE", "reference_ms / predicted_ms (the predicted gain; > 1 is faster)."),
    Col("reference_ms", "DOUBLE", "The step the speedup is against: baseline_ms, or for a chain "
        "that removes CPU work the replay of the job without the profiler's own cost, ms."),
    Col("predicted_low_ms", "DOUBLE", "Lower end of the prediction's interval: the lesser of "
        "the rewritten graph's replays with the trace's slack kept and at zero, ms."),
    Col("predicted_high_ms", "DOUBLE", "Upper end of the prediction's interval, ms."),
    Col("speedup_low", "DOUBLE", "Lower end of the speedup's interval (the same two replays)."),
    Col("speedup_high", "DOUBLE", "Upper end of the speedup's interval."),
    Col("gates_failed", "VARCHAR[]", "Plausibility gates the prediction failed (no_slowdown, "
        "slowdown_named, floor, applies; see notes for why); empty when all passed, NULL for "
        "a row made before gates were stored."),
    Col("iterations", "INTEGER", "Iterations the means are over."),
    Col("notes", "VARCHAR", "Modelling choices the optimization made, one per line (a failed "
        "gate's among them)."),
    Col("created", "TIMESTAMP WITH TIME ZONE NOT NULL", "When the prediction was made (UTC)."),
))

COLLECTIVE = GTable("collective", "One rank's part in one collective of a job: the i-th "
                    "collective of a communicator joined across ranks (written when the job is "
                    "replayed, `daydream predict JOB`).", (
    Col("job", "VARCHAR NOT NULL", "Job name."),
    Col("comm", "VARCHAR NOT NULL", "Communicator (process group, or 'default')."),
    Col("seq", "INTEGER NOT NULL", "0-based index of the collective on its communicator."),
    Col("type", "VARCHAR NOT NULL", "all_reduce, all_gather, reduce_scatter, send_recv, ..."),
    Col("rank", "INTEGER NOT NULL", "Rank."),
    Col("trace_id", "VARCHAR NOT NULL", "The rank's trace."),
    Col("task_id", "BIGINT NOT NULL", "The rank's NCCL kernel: task_id in its trace's graph."),
    Col("bytes", "BIGINT", "Message bytes from the kernel's arguments, where the trace has them."),
    Col("arrival_ns", "BIGINT NOT NULL", "Kernel start on the job's clock (rank offsets "
        "removed), ns."),
    Col("wait_ns", "BIGINT NOT NULL", "Time the rank waited for the last rank to arrive, ns."),
    Col("transfer_ns", "BIGINT NOT NULL", "What the kernel ran after the last arrival, ns."),
    Col("created", "TIMESTAMP WITH TIME ZONE NOT NULL", "When the job was replayed (UTC)."),
))

RESULT_TABLES = {t.name: t for t in (PREDICTION, COLLECTIVE)}
