"""The simulator's integer codes: unit policies and edge kinds (what ``SimGraph`` holds in
``unit_policy`` and ``edge_kind``; ``simulate.replay`` maps the graph schema's names to them)."""

from __future__ import annotations

# Unit policies (``unit_policy``).
FIXED = 0      # the trace fixes the order: tasks run by (order_key, task index)
FCFS = 1       # ready tasks run in order of ready time, ties by task index
PRIORITY = 2   # when the unit frees, the ready task with the smallest priority runs;
#                ties by ready time, then task index

# Edge kinds (``edge_kind``).
START = 0  # dst cannot start before src ends + lag
END = 1    # dst cannot end before src ends + lag (a blocking call waiting for GPU work)
START_START = 2  # dst cannot start before src STARTS + lag (a launch: the GPU work is
#                  enqueued during the call and may start before the call returns)
HELD = 3   # internal to the core (``SimGraph.held_if_running`` marks them): a START edge that
#            binds only where src had begun when dst's other bounds let it start

POLICY_NAMES = {FIXED: "FIXED", FCFS: "FCFS", PRIORITY: "PRIORITY"}
EDGE_KIND_NAMES = {START: "START", END: "END", START_START: "START_START"}
