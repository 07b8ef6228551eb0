"""Compiled passes behind ``replay``: the simulator's input built and checked, and the task
columns the reports read, each in one pass over the Arrow buffers of a record batch.

Why compiled: a replay of a 224k-task trace simulates in ~7 ms, and the numpy/pyarrow passes
around it (concatenating chunks, filling nulls, decoding dictionaries, masks for every
question asked of the tasks) took three times that; every temporary array is fresh memory,
and its page faults cost more than the arithmetic. Here each question is answered in the one
pass over the tasks, straight from the buffers of each batch (no column is concatenated that
the simulator does not need contiguous).
"""

from __future__ import annotations

import numpy as np

from daydream.base.compiled import helper, kernel
from daydream.simulate._core import MIN_LAG_NS

_FNV_OFFSET = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)

# ``task_scan``'s accumulators (``acc``): the CPU task with the largest (start, index), the
# last iteration's task that ended last at or before its end, and the extent of the
# iterations up to the last.
FB_START, FB_TASK, MINE_TASK, MINE_END, DONE_OBS_END, DONE_SIM_END, DONE_N = range(7)
N_ACC = 7


@kernel("Tuple((boolean, int64))", "int64", "readonly int64[::1]", "int64", "int64[::1]", "int64")
def csr_offsets(n, src, at, indptr, nxt):
    """``indptr`` of a CSR from a batch of edge sources that starts at edge ``at``: sources
    in order, each task's first edge is where its source first appears (``nxt``: the first
    task whose offset is not written yet). Returns (every source in 0..n-1 and in order,
    ``nxt``). One sequential write, no counting pass and no prefix sum."""
    for k in range(src.shape[0]):
        s = src[k]
        if s < 0 or s >= n or s < nxt - 1:  # out of range, or before the last source
            return False, nxt
        while nxt <= s:
            indptr[nxt] = at + k
            nxt += 1
    return True, nxt


@kernel("none", "int64[::1]", "int64", "int64")
def csr_close(indptr, nxt, m):
    """The tasks after the last source have no edges."""
    for t in range(nxt, indptr.shape[0]):
        indptr[t] = m


@kernel("boolean", "readonly int64[::1]", "readonly int32[::1]", "int64", "int64[::1]",
        "int32[::1]", "int64", "bool")
def tasks_into(dur_in, unit_in, n_units, dur, unit, at, copy):
    """Check a batch of task durations (>= 0) and units (in 0..n_units-1), copying them to
    ``dur``/``unit`` from ``at`` when ``copy``: one pass for both."""
    for i in range(dur_in.shape[0]):
        d, u = dur_in[i], unit_in[i]
        if d < 0 or u < 0 or u >= n_units:
            return False
        if copy:
            dur[at + i] = d
            unit[at + i] = u
    return True


@kernel("boolean", "int64", "readonly int64[::1]", "readonly int64[::1]", "int64[::1]",
        "int64[::1]", "int64", "bool")
def edges_into(n, dst_in, lag_in, dst, lag, at, copy):
    """Check a batch of edge destinations (in 0..n-1) and lags (>= MIN_LAG_NS), copying them
    to ``dst``/``lag`` from ``at`` when ``copy``."""
    for k in range(dst_in.shape[0]):
        d, w = dst_in[k], lag_in[k]
        if d < 0 or d >= n or w < MIN_LAG_NS:
            return False
        if copy:
            dst[at + k] = d
            lag[at + k] = w
    return True


@kernel("UniTuple(int64[::1], 2)", "readonly int64[::1]", "readonly int64[::1]", "int64")
def group_sums(idx, ns, k):
    """Per group 0..k-1: ``ns`` summed (as integers: what float64 sums exactly below 2**53)
    and the number of members."""
    sums = np.zeros(k, np.int64)
    count = np.zeros(k, np.int64)
    for p in range(idx.shape[0]):
        sums[idx[p]] += ns[p]
        count[idx[p]] += 1
    return sums, count


@helper()
def _valid(valid, i):
    return (valid[i >> 3] >> (i & 7)) & 1


@kernel("none", "int64", "readonly int64[::1]", "readonly int64[::1]", "readonly int32[::1]",
        "readonly bool[::1]", "readonly int32[::1]", "readonly uint8[::1]", "int64", "bool",
        "readonly int64[::1]", "readonly int64[::1]", "readonly int32[::1]", "readonly int64[::1]",
        "int64[::1]", "readonly int64[::1]", "int64[::1]", "int64[::1]", "int64[::1]", "int64",
        "int64")
def task_scan(lo, start, obs_dur, kind_idx, cpu_lut, it_val, it_valid, it_voff, it_nulls,
              sim_start, sim_end, unit, work, busy, t_sorted, b_start, b_task, acc, last_it,
              last_end):
    """One batch of tasks (global indices ``lo``..): what ``replay`` asks of every task.

    - ``busy[u]`` (when ``busy`` is not empty): each unit's work in the simulation, ns: the
      simulated durations ``work`` of its tasks summed, never the time a task held its unit
      while it waited (a sync, an idle thread); as integers;
    - per iteration start ``t_sorted[j]`` (ascending): the CPU task (``cpu_lut`` of its kind;
      task 0, the origin marker, excluded) with the smallest (start, index) among those
      starting in [t_sorted[j], t_sorted[j+1]) (``b_start``/``b_task``, -1: none); ``finish``
      turns them into the first CPU task at or after each start;
    - ``acc``: see FB_START..DONE_N, for iteration ``last_it`` ending at ``last_end``; a task
      with a null iteration belongs to iteration -1.
    ``start``, ``sim_*`` and ``unit`` are whole columns; the others hold this batch only.
    Accumulators live in locals inside the loop (through memory, each was a dependency chain
    that cost as much as the rest of the pass)."""
    k = t_sorted.shape[0]
    use_busy = busy.shape[0] > 0
    fb_s, fb_t = acc[FB_START], acc[FB_TASK]
    mine_t, mine_e = acc[MINE_TASK], acc[MINE_END]
    done_obs, done_sim, done_n = acc[DONE_OBS_END], acc[DONE_SIM_END], acc[DONE_N]
    # the bucket of the last CPU task: tasks come nearly in start order, so most fall in it
    j = -1
    j_lo, j_hi = np.int64(1), np.int64(0)  # an empty range: the first task searches
    for i in range(obs_dur.shape[0]):
        g = lo + i
        s = start[g]
        if use_busy:
            busy[unit[g]] += work[g]
        if g > 0 and cpu_lut[kind_idx[i]]:
            if fb_t < 0 or s >= fb_s:
                fb_s, fb_t = s, g
            if not (j_lo <= s < j_hi):
                a, b = 0, k  # how many iteration starts are <= s
                while a < b:
                    m = (a + b) >> 1
                    if t_sorted[m] <= s:
                        a = m + 1
                    else:
                        b = m
                j = a - 1
                j_lo = t_sorted[j] if j >= 0 else np.iinfo(np.int64).min
                j_hi = t_sorted[a] if a < k else np.iinfo(np.int64).max
            if j >= 0 and (b_task[j] < 0 or s < b_start[j]):
                b_start[j] = s
                b_task[j] = g
        v = np.int64(it_val[i])
        if it_nulls and not _valid(it_valid, it_voff + i):
            v = -1
        e = s + obs_dur[i]
        if v == last_it and e <= last_end and (mine_t < 0 or e > mine_e):
            mine_t, mine_e = g, e
        if 0 <= v <= last_it:
            if done_n == 0 or e > done_obs:
                done_obs = e
            if done_n == 0 or sim_end[g] > done_sim:
                done_sim = sim_end[g]
            done_n += 1
    acc[FB_START], acc[FB_TASK] = fb_s, fb_t
    acc[MINE_TASK], acc[MINE_END] = mine_t, mine_e
    acc[DONE_OBS_END], acc[DONE_SIM_END], acc[DONE_N] = done_obs, done_sim, done_n


@kernel("none", "int64", "readonly int32[::1]", "readonly uint8[::1]", "int64", "bool",
        "readonly int64[::1]", "int64[::1]")
def iteration_of(lo, it_val, it_valid, it_voff, it_nulls, tasks, out):
    """``out[p]``: the iteration of task ``tasks[p]`` (-1 for null), for the tasks in this
    batch (global indices ``lo``..)."""
    hi = lo + it_val.shape[0]
    for p in range(tasks.shape[0]):
        t = tasks[p]
        if lo <= t < hi:
            r = t - lo
            out[p] = -1 if it_nulls and not _valid(it_valid, it_voff + r) else it_val[r]


@kernel("int64", "int64", "readonly int32[::1]", "readonly uint8[::1]", "int64", "bool", "int64",
        "readonly int64[::1]", "int64")
def last_in(lo, it_val, it_valid, it_voff, it_nulls, iteration, end, best):
    """The task of ``iteration`` in this batch that ends last, if later than ``best`` (the
    lowest index among ties; -1: none yet)."""
    for i in range(it_val.shape[0]):
        v = -1 if it_nulls and not _valid(it_valid, it_voff + i) else np.int64(it_val[i])
        g = lo + i
        if v == iteration and (best < 0 or end[g] > end[best]):
            best = g
    return best


@kernel("int64[::1]", "readonly int64[::1]", "readonly int64[::1]", "int64")
def finish_anchors(b_start, b_task, fallback):
    """From ``task_scan``'s buckets: per sorted iteration start, the CPU task with the
    smallest (start, index) at or after it (``fallback``, the largest, when there is none)."""
    k = b_task.shape[0]
    out = np.empty(k, np.int64)
    best = -1
    best_s = 0
    for j in range(k - 1, -1, -1):
        if b_task[j] >= 0 and (best < 0 or b_start[j] < best_s
                               or (b_start[j] == best_s and b_task[j] < best)):
            best = b_task[j]
            best_s = b_start[j]
        out[j] = best if best >= 0 else fallback
    return out


@helper()
def _same(data, a0, a1, b0, b1):
    if a1 - a0 != b1 - b0:
        return False
    for q in range(a1 - a0):
        if data[a0 + q] != data[b0 + q]:
            return False
    return True


@kernel("UniTuple(int64[::1], 2)", "readonly int64[::1]", "int64", "int64", "readonly int32[::1]",
        "int64", "readonly uint8[::1]", "readonly uint8[::1]", "bool", "int64[::1]", "int64")
def group_strings(path, lo, hi, offsets, off0, data, valid, nulls, gid, base):
    """Group the values of one string column chunk (rows ``lo``..``hi`` of the table) at the
    path's tasks in that range: ``gid[p] = base + local group`` (-1 for null), groups numbered
    in order of first appearance along the path. Exact: a hash finds the candidate group, the
    bytes decide. Returns (representative row in the chunk, first path position) per group."""
    size = 16
    table = np.full(size, -1, np.int64)
    rep = np.empty(16, np.int64)
    first = np.empty(16, np.int64)
    hashes = np.empty(16, np.uint64)
    ng = 0
    prev_row = -1
    prev_g = -1
    for p in range(path.shape[0]):
        t = path[p]
        if t < lo or t >= hi:
            continue
        r = t - lo
        if nulls and not _valid(valid, off0 + r):
            gid[p] = -1
            continue
        a0, a1 = offsets[off0 + r], offsets[off0 + r + 1]
        if prev_row >= 0 and _same(data, a0, a1, offsets[off0 + prev_row],
                                   offsets[off0 + prev_row + 1]):
            gid[p] = base + prev_g
            prev_row = r
            continue
        h = _FNV_OFFSET
        for q in range(a0, a1):
            h = (h ^ np.uint64(data[q])) * _FNV_PRIME
        slot = np.int64(h & np.uint64(size - 1))
        found = -1
        while table[slot] >= 0:
            c = table[slot]
            if hashes[c] == h and _same(data, a0, a1, offsets[off0 + rep[c]],
                                        offsets[off0 + rep[c] + 1]):
                found = c
                break
            slot = (slot + 1) & (size - 1)
        if found < 0:
            found = ng
            if ng == rep.shape[0]:
                rep = np.concatenate((rep, np.empty(ng, np.int64)))
                first = np.concatenate((first, np.empty(ng, np.int64)))
                hashes = np.concatenate((hashes, np.empty(ng, np.uint64)))
            rep[ng] = r
            first[ng] = p
            hashes[ng] = h
            table[slot] = ng
            ng += 1
            if 2 * ng > size:  # grow and rehash
                size *= 4
                table = np.full(size, -1, np.int64)
                for c in range(ng):
                    sl = np.int64(hashes[c] & np.uint64(size - 1))
                    while table[sl] >= 0:
                        sl = (sl + 1) & (size - 1)
                    table[sl] = c
        gid[p] = base + found
        prev_row = r
        prev_g = found
    return rep[:ng], first[:ng]


@kernel("none", "readonly int64[::1]", "int64", "int64", "readonly int32[::1]", "int64[::1]")
def gather_codes(path, lo, hi, indices, out):
    """``out[p] = indices[path[p] - lo]`` for the path's tasks in rows lo..hi."""
    for p in range(path.shape[0]):
        t = path[p]
        if lo <= t < hi:
            out[p] = indices[t - lo]


@kernel("UniTuple(int64, 2)", "readonly int64[::1]", "readonly int8[::1]", "readonly int64[::1]",
        "readonly int64[::1]", "readonly int64[::1]", "readonly int64[::1]", "int64", "bool",
        "int64", "int64[::1]", "int64[::1]", "int64[::1]")
def path_parts(bound, via, end_bound, start, end, dur, x, at_end, t_stop, seg_task, seg_src,
               seg_ns):
    """The critical path back from task ``x`` (from its end when ``at_end``, else from its
    start) to time ``t_stop``, as parts that add up to the time walked: a task's own work
    (``seg_src`` -1: from its start, or from when its END predecessor let it go on, to its
    end) or a delay into task ``seg_task`` from its binder ``seg_src`` (the edge's latency and
    slack, or the wait for its unit). A task whose end an END predecessor decided is left
    through that predecessor's end, not its own start. The part that crosses ``t_stop`` counts
    only after it. Returns (parts written, time reached): the walk stops early at a task with
    no binder, or when the buffers are full (the caller grows them and walks again)."""
    k = 0
    t = end[x] if at_end else start[x]
    while t > t_stop and k < seg_task.shape[0]:
        if at_end:
            e = end_bound[x]
            begin = end[x] - dur[x] if e >= 0 else start[x]
            seg_task[k], seg_src[k], seg_ns[k] = x, -1, end[x] - max(begin, t_stop)
            k += 1
            t = begin
            if e >= 0 and t > t_stop and k < seg_task.shape[0]:
                seg_task[k], seg_src[k], seg_ns[k] = x, e, begin - max(end[e], t_stop)
                k += 1
                t = end[e]
                x = e
            else:
                at_end = False
        else:
            b = bound[x]
            if b < 0:
                break
            frm = start[b] if via[x] else end[b]
            seg_task[k], seg_src[k], seg_ns[k] = x, b, t - max(frm, t_stop)
            k += 1
            t = frm
            at_end = via[x] == 0
            x = b
    return k, t


@kernel("none", "readonly int64[::1]", "readonly int64[::1]", "readonly int64[::1]",
        "readonly int64[::1]", "int64[::1]")
def edge_of(indptr, dst, src_q, dst_q, out):
    """For each (src_q[i], dst_q[i]), the position in CSR order of the first edge from the one
    to the other, or -1 (out-edges of a task are few: a scan of them)."""
    for i in range(src_q.shape[0]):
        s, d = src_q[i], dst_q[i]
        out[i] = -1
        if s < 0:
            continue
        for k in range(indptr[s], indptr[s + 1]):
            if dst[k] == d:
                out[i] = k
                break


@kernel("Tuple((int64[::1], int64[::1], int64))", "readonly int64[::1]", "readonly int64[::1]",
        "readonly bool[::1]", "readonly bool[::1]", "int64")
def ends_by_label(lab, end, is_gpu, orphan, n_labels):
    """One pass for ``steady_step``: per iteration label 0..n_labels-1, the latest end of its
    tasks and of its GPU tasks; and the latest end of the GPU backlog (``orphan``)."""
    task = np.full(n_labels, np.iinfo(np.int64).min, np.int64)
    gpu = np.full(n_labels, np.iinfo(np.int64).min, np.int64)
    backlog = np.iinfo(np.int64).min
    for i in range(lab.shape[0]):
        x = lab[i]
        e = end[i]
        if is_gpu[i] and orphan[i] and e > backlog:
            backlog = e
        if x < 0 or x >= n_labels:
            continue
        if e > task[x]:
            task[x] = e
        if is_gpu[i] and e > gpu[x]:
            gpu[x] = e
    return task, gpu, backlog
