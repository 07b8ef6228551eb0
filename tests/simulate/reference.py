"""A slow, literal simulator to check the compiled one against: a global clock that always takes
the earliest possible action next (Daydream's Algorithm 1 as written), in plain Python.

Actions: a started task finishing (once its END predecessors are done, its own work runs
after the latest of them and after its start), or an idle unit
starting a task (FIXED: its next task in (order_key, index) order once that task's START
predecessors have ended and its START_START predecessors started; FCFS/PRIORITY: at the
earliest time one of its released tasks is ready, the best of those ready by then). At one
time, finishes go first, then FIXED starts, then FCFS/PRIORITY starts by unit. With positive
durations this is the schedule the compiled core computes.

A ``held_if_running`` edge into a FIXED unit's task: the task starts only once that source
has ended, and is held to its end + lag only where the source had begun by the time the
task's other bounds (its START and START_START predecessors, its unit freeing) let it start.
Into any other unit's task it is a START edge.
"""

from __future__ import annotations

import numpy as np

from daydream.simulate import FCFS, FIXED, SimGraph

NONE = -1


class Stuck(Exception):
    pass


def reference_simulate(g: SimGraph):
    n = g.n_tasks
    src = g.edge_src()
    start_preds = [[] for _ in range(n)]   # (pred, lag, through its start?)
    end_preds = [[] for _ in range(n)]
    held_preds = [[] for _ in range(n)]    # (pred, lag): into FIXED units' tasks
    held = g.held_if_running
    for k in range(g.n_edges):
        kind, d, lag = int(g.edge_kind[k]), int(g.dst[k]), int(g.lag_ns[k])
        if kind == 1:
            end_preds[d].append((int(src[k]), lag))
        elif held is not None and held[k] and int(g.unit_policy[g.unit[d]]) == FIXED:
            held_preds[d].append((int(src[k]), lag))
        else:
            start_preds[d].append((int(src[k]), lag, kind == 2))
    order = {}
    for t in sorted(range(n), key=lambda t: (int(g.order_key[t]), t)):
        order.setdefault(int(g.unit[t]), []).append(t)
    start = [None] * n
    end = [None] * n
    bound = [NONE] * n
    via = [0] * n
    end_bound = [NONE] * n
    pos = {u: 0 for u in order}            # FIXED: next position in order
    holder = {u: None for u in order}      # task holding the unit
    free = {u: 0 for u in order}
    last = {u: None for u in order}

    def best(cands):
        # latest time; ties to the smallest index, then through its start
        top = max(c[0] for c in cands)
        return min((c[1], -c[2]) for c in cands if c[0] == top)

    def at(s, through_start):
        return start[s] if through_start else end[s]

    def ready(t):
        if any(at(s, ss) is None for s, _, ss in start_preds[t]):
            return None
        return max([0] + [at(s, ss) + lag for s, lag, ss in start_preds[t]])

    done = 0
    while done < n:
        actions = []   # (time, 0 finish / 1 FIXED start / 2 queued start, unit, task)
        for u, tasks in order.items():
            h = holder[u]
            if h is not None:
                if all(end[s] is not None for s, _ in end_preds[h]):
                    e = max([start[h]] + [end[s] + lag for s, lag in end_preds[h]]) \
                        + int(g.dur_ns[h])
                    actions.append((e, 0, u, h))
                continue
            policy = int(g.unit_policy[u])
            if policy == FIXED:
                if pos[u] < len(tasks):
                    t = tasks[pos[u]]
                    r = ready(t)
                    if r is not None and all(end[s] is not None for s, _ in held_preds[t]):
                        r = max(r, free[u])
                        r = max([r] + [end[s] + lag for s, lag in held_preds[t]
                                       if start[s] <= r])
                        actions.append((r, 1, u, t))
                continue
            released = [(ready(t), t) for t in tasks if start[t] is None]
            released = [(r, t) for r, t in released if r is not None]
            if not released:
                continue
            now = max(free[u], min(r for r, _ in released))
            eligible = [(r, t) for r, t in released if r <= now]
            if policy == FCFS:
                _, t = min(eligible)
            else:
                _, _, t = min((int(g.priority[t]), r, t) for r, t in eligible)
            actions.append((now, 2, u, t))
        if not actions:
            raise Stuck(f"{n - done} tasks stuck")
        time, what, u, t = min(actions)
        if what >= 1:
            cands = [(at(s, ss) + lag, s, int(ss)) for s, lag, ss in start_preds[t]]
            if last[u] is not None:
                cands.append((free[u], last[u], 0))
            if held_preds[t]:
                r = max([0] + [c[0] for c in cands])
                cands += [(end[s] + lag, s, 0) for s, lag in held_preds[t] if start[s] <= r]
            start[t] = time
            if cands:
                b, v = best(cands)
                bound[t], via[t] = b, -v
            holder[u] = t
            if int(g.unit_policy[u]) == FIXED:
                pos[u] += 1
        else:
            end[t] = time
            if end_preds[t]:
                cands = [(end[s] + lag, s, 0) for s, lag in end_preds[t]]
                if max(c[0] for c in cands) > start[t]:
                    end_bound[t] = best(cands)[0]
            holder[u] = None
            free[u] = time
            last[u] = t
            done += 1
    return tuple(np.array(a, np.int64) for a in (start, end, bound, via, end_bound))
