"""The compiled core of the simulator: Daydream's Algorithm 1 over CSR arrays.

How it runs, in O(tasks + edges) (plus a log factor only for tasks on FCFS/PRIORITY units):

- A FIXED unit is a chain: each task waits for the one before it in (order_key, index) order,
  like a START edge with zero lag. ``prepare`` links the chain (``nxt``) in one pass when
  order_key is already sorted within every unit, the usual case; ``relink`` does it from a sort
  otherwise. ``count_in`` counts each task's START and START_START predecessors (plus the
  FIXED link) and its END predecessors.
- A task is runnable when its START predecessors have ended and its START_START predecessors
  started: it starts, and its START_START edges fire. It is runnable again when its END
  predecessors have ended: it finishes, and its START and END edges fire. Every time is final
  when it is computed (a max over predecessors), so no event queue is needed: a sweep takes
  runnable tasks in index order, which in a trace is observed start order, so the arrays are
  read nearly sequentially; a task made runnable behind the sweep goes on a stack.
- Tasks on FCFS/PRIORITY units go, when their START predecessors are done, into their unit's
  queue instead. Only when nothing is runnable is a queued task dispatched: the one whose start
  would be earliest over all such units (a heap of units keyed by that time). Everything that
  could run without a dispatch has run by then, so every task not yet queued will be ready no
  earlier than that time: the choice is the one a time-ordered simulation makes (up to ties at
  exactly that time through chains of zero-duration tasks). After the first dispatch the sweep
  has passed every index, and runnable tasks go into a hierarchical bitmap popped lowest index
  first, which keeps access near index order.

The result does not depend on the order runnable tasks are processed in: every time is a max
over predecessors, and ties in ``bound_by`` go to the smallest task index.

Task state (``start_cnt`` after the run): >= 0 not started (count of missing predecessors),
-3 queued on its FCFS/PRIORITY unit, -1 started but waiting on END predecessors, -2 finished.
"""

from __future__ import annotations

import numpy as np

from daydream.base.compiled import helper, kernel

# The unit policies and edge kinds by their codes (declared in simulate.codes): module globals,
# which numba compiles in as constants.
from daydream.simulate.codes import END as _END
from daydream.simulate.codes import FCFS as _FCFS
from daydream.simulate.codes import FIXED as _FIXED
from daydream.simulate.codes import HELD as _HELD
from daydream.simulate.codes import START as _START
from daydream.simulate.codes import START_START as _START_START

_QUEUED = -3  # state of a task waiting in its FCFS/PRIORITY unit's queue
# Lags may be negative (a kernel may start shortly before its launching call returns, as the
# profiler records that return): down to this bound, far beyond any latency, so that no time
# arithmetic can overflow.
MIN_LAG_NS = -(1 << 40)


@helper(inline="always")
def _U(i):
    """An index known to be >= 0, as unsigned: numba then indexes without the wraparound
    arithmetic (a select on the sign and a load of the array's length) it adds for a signed
    index. Every index into a task, edge, queue or bitmap array below goes through it: in the
    hot loop that arithmetic, and the registers it takes, cost a third of the time
    (bench/bench_simulate.py)."""
    return np.uint64(i)


# --- heaps over task indices, keys read through arrays --------------------------------------


@helper()
def _pend_less(a, b, ready):
    # FCFS / pending order: (ready time, task index)
    return ready[_U(a)] < ready[_U(b)] or (ready[_U(a)] == ready[_U(b)] and a < b)


@helper()
def _prio_less(a, b, ready, priority):
    # PRIORITY order among ready tasks: (priority, ready time, task index)
    if priority[_U(a)] != priority[_U(b)]:
        return priority[_U(a)] < priority[_U(b)]
    return _pend_less(a, b, ready)


@helper()
def _pend_push(h, base, size, t, ready):
    i = size
    while i > 0:
        p = (i - 1) >> 1
        if _pend_less(t, h[_U(base + p)], ready):
            h[_U(base + i)] = h[_U(base + p)]
            i = p
        else:
            break
    h[_U(base + i)] = t


@helper()
def _pend_pop(h, base, size, ready):
    top = h[_U(base)]
    size -= 1
    if size > 0:
        t = h[_U(base + size)]
        i = 0
        while True:
            c = 2 * i + 1
            if c >= size:
                break
            if c + 1 < size and _pend_less(h[_U(base + c + 1)], h[_U(base + c)], ready):
                c += 1
            if _pend_less(h[_U(base + c)], t, ready):
                h[_U(base + i)] = h[_U(base + c)]
                i = c
            else:
                break
        h[_U(base + i)] = t
    return top


@helper()
def _prio_push(h, base, size, t, ready, priority):
    i = size
    while i > 0:
        p = (i - 1) >> 1
        if _prio_less(t, h[_U(base + p)], ready, priority):
            h[_U(base + i)] = h[_U(base + p)]
            i = p
        else:
            break
    h[_U(base + i)] = t


@helper()
def _prio_pop(h, base, size, ready, priority):
    top = h[_U(base)]
    size -= 1
    if size > 0:
        t = h[_U(base + size)]
        i = 0
        while True:
            c = 2 * i + 1
            if c >= size:
                break
            if c + 1 < size and _prio_less(h[_U(base + c + 1)], h[_U(base + c)], ready, priority):
                c += 1
            if _prio_less(h[_U(base + c)], t, ready, priority):
                h[_U(base + i)] = h[_U(base + c)]
                i = c
            else:
                break
        h[_U(base + i)] = t
    return top


@helper()
def _unit_push(hk, hu, size, key, u):
    # heap of (candidate start time, unit id)
    i = size
    while i > 0:
        p = (i - 1) >> 1
        if key < hk[_U(p)] or (key == hk[_U(p)] and u < hu[_U(p)]):
            hk[_U(i)] = hk[_U(p)]
            hu[_U(i)] = hu[_U(p)]
            i = p
        else:
            break
    hk[_U(i)] = key
    hu[_U(i)] = u


@helper()
def _unit_pop(hk, hu, size):
    size -= 1
    if size > 0:
        key = hk[_U(size)]
        u = hu[_U(size)]
        i = 0
        while True:
            c = 2 * i + 1
            if c >= size:
                break
            c0 = _U(c)
            c1 = _U(c + 1)
            if c + 1 < size and (hk[c1] < hk[c0] or (hk[c1] == hk[c0] and hu[c1] < hu[c0])):
                c += 1
            if hk[_U(c)] < key or (hk[_U(c)] == key and hu[_U(c)] < u):
                hk[_U(i)] = hk[_U(c)]
                hu[_U(i)] = hu[_U(c)]
                i = c
            else:
                break
        hk[_U(i)] = key
        hu[_U(i)] = u


@helper()
def _candidate(u, free, pend, psize, prio, qsize, qbase, ready):
    """Earliest start of the next task on non-FIXED unit u (which is idle and has a queue)."""
    if qsize[_U(u)] > 0:
        return free[_U(u)]
    r = ready[pend[qbase[_U(u)]]]
    return r if r > free[_U(u)] else free[_U(u)]


# --- a hierarchical bitmap of runnable tasks, popped lowest index first --------------------
#
# Level 0 has one bit per task, each higher level one bit per word of the level below, up to a
# single word: insert and pop-lowest cost a few word operations each.


# Count trailing zeros of a nonzero word by a de Bruijn sequence: the lowest set bit times
# the sequence puts a distinct 6-bit pattern in the top bits, which a table maps back to the
# bit's index (a multiply, a shift and a load). No intrinsic: the module then needs no numba
# where its kernels are compiled ahead of time (daydream.base.compiled).
_DE_BRUIJN = 0x022FDD63CC95386D
_CTTZ_TABLE = np.zeros(64, np.int64)
for _bit in range(64):
    _CTTZ_TABLE[((_DE_BRUIJN << _bit) & 0xFFFFFFFFFFFFFFFF) >> 58] = _bit
del _bit


@helper(inline="always")
def _cttz(x):
    low = np.uint64(x) & (np.uint64(0) - np.uint64(x))
    return _CTTZ_TABLE[(low * np.uint64(_DE_BRUIJN)) >> np.uint64(58)]


def bitmap_offsets(n: int) -> np.ndarray:
    """Word offsets of each level in the flat bitmap, plus the total (int64[levels+1])."""
    offs = [0]
    words = max(1, (n + 63) >> 6)
    while True:
        offs.append(offs[-1] + words)
        if words == 1:
            break
        words = (words + 63) >> 6
    return np.array(offs, np.int64)


@helper()
def _bm_insert(bits, loff, x):
    i = x
    for lv in range(loff.shape[0] - 1):
        at = loff[_U(lv)] + (i >> 6)
        old = bits[_U(at)]
        bits[_U(at)] = old | (np.int64(1) << (i & 63))
        if old != 0:
            break
        i >>= 6


@helper()
def _bm_pop(bits, loff, minw):
    """Remove and return the lowest set index; ``minw`` is a level-0 word index below which
    every word is zero. Returns (index, new minw), or (-1, minw) when empty."""
    top = loff.shape[0] - 2
    w = bits[_U(minw)]
    if w == 0:
        if bits[loff[_U(top)]] == 0:
            return -1, minw
        i = 0
        for lv in range(top, 0, -1):
            i = (i << 6) + _cttz(bits[loff[_U(lv)] + i])
        minw = i
        w = bits[_U(minw)]
    x = (minw << 6) + _cttz(w)
    w &= w - 1
    bits[_U(minw)] = w
    if w == 0:
        i = minw
        for lv in range(1, top + 1):
            at = loff[_U(lv)] + (i >> 6)
            word = bits[_U(at)] & ~(np.int64(1) << (i & 63))
            bits[_U(at)] = word
            if word != 0:
                break
            i >>= 6
    return x, minw


# --- the simulation -------------------------------------------------------------------------



@kernel("boolean", "readonly int64[::1]", "readonly int64[::1]", "readonly int64[::1]",
        "readonly int8[::1]")
def csr_ok(indptr, dst, lag, kind):
    """One pass over the CSR values ``check.check_graph`` checks: indptr from 0 to the edge
    count and never decreasing, destinations in range, lags >= MIN_LAG_NS, known edge kinds.
    No early exit, and range checks as one unsigned compare, so that the loops vectorize."""
    n = indptr.shape[0] - 1
    m = dst.shape[0]
    if indptr[0] != 0 or indptr[n] != m:
        return False
    bad = False
    for i in range(n):
        bad |= indptr[i + 1] < indptr[i]
    un = np.uint64(n)
    for k in range(m):
        bad |= (np.uint64(dst[k]) >= un) | (lag[k] < MIN_LAG_NS) | (np.uint8(kind[k]) > np.uint8(2))
    return not bad


@kernel("UniTuple(boolean, 2)", "int64", "readonly int64[::1]", "readonly int64[::1]",
        "readonly int64[::1]", "readonly int8[::1]")
def edge_list_ok(n, src, dst, lag, kind):
    """One pass over an edge list (``SimGraph.from_edges``): (every value valid, sources
    already non-decreasing). Invalid: ``check.check_edge_list`` names the problem."""
    ok = True
    is_sorted = True
    for k in range(src.shape[0]):
        s = src[k]
        if s < 0 or s >= n or dst[k] < 0 or dst[k] >= n or lag[k] < MIN_LAG_NS or kind[k] < 0 \
                or kind[k] > 2:
            ok = False
            break
        if k > 0 and s < src[k - 1]:
            is_sorted = False
    return ok, is_sorted


@kernel("boolean", "readonly int64[::1]", "readonly int32[::1]", "readonly int8[::1]")
def tasks_ok(dur, unit, unit_policy):
    """One pass over the per-task values ``check.check_tasks`` checks (vectorizable, as
    ``csr_ok``)."""
    n_units = unit_policy.shape[0]
    bad = False
    for u in range(n_units):
        bad |= np.uint8(unit_policy[u]) > np.uint8(2)
    nu = np.uint32(n_units)
    for i in range(dur.shape[0]):
        bad |= (dur[i] < 0) | (np.uint32(unit[i]) >= nu)
    return not bad


@kernel("boolean", "readonly int32[::1]", "readonly int8[::1]", "readonly int64[::1]",
        "int32[::1]", "int32[::1]")
def prepare(unit, unit_policy, order_key, nxt, start_cnt):
    """Link FIXED units in index order, into zeroed arrays: ``nxt[p] = i + 1`` when task i
    follows task p on its unit, and ``start_cnt[i] = 1`` for the link. Returns False, having
    stopped, when order_key decreases within some FIXED unit; ``relink`` must then redo it."""
    n = unit.shape[0]
    n_units = unit_policy.shape[0]
    last = np.full(n_units, -1, np.int64)
    sorted_ = True
    for i in range(n):
        u = _U(unit[_U(i)])
        if unit_policy[u] == _FIXED:
            p = last[u]
            if p >= 0:
                if order_key[_U(i)] < order_key[_U(p)]:
                    sorted_ = False
                    break
                nxt[_U(p)] = i + 1
                start_cnt[_U(i)] = 1
            last[u] = i
    return sorted_


@kernel("UniTuple(boolean, 2)", "readonly int64[::1]", "readonly int64[::1]",
        "readonly int64[::1]", "readonly int8[::1]", "int32[::1]", "int32[::1]")
def count_in(indptr, dst, lag, kind, start_cnt, end_cnt):
    """Count START, HELD and START_START predecessors into ``start_cnt``, END ones into
    ``end_cnt``, checking in the same pass what ``csr_ok`` checks (an edge that fails is not
    counted), so
    that ``simulate`` reads the edges once before the run instead of twice. Returns (every
    value valid, any START_START edge). (A loop of its own: fused into a loop over tasks and
    their edges it ran half as fast.)"""
    n = indptr.shape[0] - 1
    m = dst.shape[0]
    if indptr[0] != 0 or indptr[n] != m:
        return False, False
    bad = False
    for i in range(n):
        bad |= indptr[i + 1] < indptr[i]
    has_ss = False
    un = np.uint64(n)
    for k in range(m):
        kd = kind[_U(k)]
        d = np.uint64(dst[_U(k)])
        if (d >= un) | (lag[_U(k)] < MIN_LAG_NS) | (np.uint8(kd) > np.uint8(3)):
            bad = True
        elif kd != _END:
            start_cnt[d] += 1
            has_ss |= kd == _START_START
        else:
            end_cnt[d] += 1
    return not bad, has_ss


@kernel("none", "readonly int32[::1]", "readonly int8[::1]", "readonly int64[::1]", "int32[::1]",
        "int32[::1]")
def relink(unit, unit_policy, perm, nxt, start_cnt):
    """Undo the links ``prepare`` made, then link FIXED units visiting tasks in ``perm`` order
    (by (order_key, index))."""
    for i in range(nxt.shape[0]):
        j = nxt[i] - 1
        if j >= 0:
            start_cnt[j] -= 1
            nxt[i] = 0
    n_units = unit_policy.shape[0]
    last = np.full(n_units, -1, np.int64)
    for k in range(perm.shape[0]):
        i = perm[k]
        u = unit[i]
        if unit_policy[u] != _FIXED:
            continue
        p = last[u]
        if p >= 0:
            nxt[p] = i + 1
            start_cnt[i] += 1
        last[u] = i


# Indices into the small int64 state array shared by ``run`` and the drain functions (which
# already take 30 arguments, as many as numba inlines), then the HELD edges (``_drain_body``).
_CUR, _MINW, _BEHIND, _DONE, _HSIZE, _ALL_FIXED, _HAS_SS, _HAS_HELD, _N_HELD = range(9)
_HELD_AT = 9


@helper()
def _release(d, unit, start, pend, qbase, psize, qsize, prio, free, busy, hk, hu, st):
    """Task ``d`` on a FCFS/PRIORITY unit has its START predecessors done: queue it."""
    u = unit[_U(d)]
    _pend_push(pend, qbase[_U(u)], psize[_U(u)], d, start)
    psize[_U(u)] += 1
    if not busy[_U(u)]:
        _unit_push(hk, hu, st[_HSIZE], _candidate(u, free, pend, psize, prio, qsize, qbase,
                                                  start), u)
        st[_HSIZE] += 1


@helper()
def _unit_freed(t, e, u, start, pend, qbase, psize, qsize, prio, free, busy, last, hk, hu, st):
    """Task ``t`` on FCFS/PRIORITY unit ``u`` ended at ``e``: the unit can take its next."""
    busy[_U(u)] = False
    free[_U(u)] = e
    last[_U(u)] = t
    if psize[_U(u)] + qsize[_U(u)] > 0:
        _unit_push(hk, hu, st[_HSIZE], _candidate(u, free, pend, psize, prio, qsize, qbase,
                                                  start), u)
        st[_HSIZE] += 1


@helper(inline="always")
def _push(d, cur, minw, behind, stack, bits, loff, use_bitmap):
    """Task ``d`` became runnable: behind the sweep cursor it goes on the stack (or, once the
    sweep is over, into the bitmap); at or past it the sweep finds it. Returns (minw, behind).
    The stack write is unconditional, so that the sweep's push is a store and an add."""
    if use_bitmap:
        if d < cur:
            _bm_insert(bits, loff, d)
            if (d >> 6) < minw:
                minw = d >> 6
            behind += 1
    else:
        stack[_U(behind)] = d
        behind += d < cur
    return minw, behind


@helper(inline="always")
def _drain_body(dur, unit, unit_policy, indptr, dst, lag, kind, nxt, start_cnt, end_cnt, start,
                end, bound, via, end_bound, stack, bits, loff, pend, qbase, psize, qsize, prio,
                free, busy, last, hk, hu, st, use_bitmap):
    """Run every task that can run without a FCFS/PRIORITY dispatch (the hot loop).

    Runnable tasks at or above the sweep cursor are found by the sweep, in index order, so the
    arrays are read nearly sequentially. A task made runnable behind the cursor (an edge
    pointing backwards in index order) goes on ``stack`` while the sweep runs (``use_bitmap``
    False); once the sweep has passed every index, FCFS/PRIORITY dispatches drive the rest and
    every runnable task goes into the bitmap (``use_bitmap`` True), popped lowest index first
    so that access stays near index order. Compiled as two functions, so that neither carries
    the other's code in its loop.

    A HELD edge into a task of a FIXED unit only counts as it fires; when the task starts,
    each HELD predecessor that had begun by then (by the time its other bounds let it start)
    holds it to its end + lag. ``st`` holds them after its state (from ``_HELD_AT``): each
    task's list of HELD predecessors that have fired (n heads, 1-based, 0: none), then per
    entry its next, its source and its lag (filled as they fire, counted in ``_N_HELD``).

    A task's first pop starts it: its start binder is decoded. Most tasks also finish on that
    pop, and one pass over their out-edges fires them all: START_START ones (only looked at
    when the graph has any, ``has_ss``) from the start, START and END ones from the end. A
    task with END predecessors still to finish fires its START_START edges when it starts and
    the rest on a second pop, once those are done. A destination's (time, binder key) is
    raised with selects rather than branches: which bound wins is data, not a pattern."""
    n = dur.shape[0]
    all_fixed = st[_ALL_FIXED] != 0
    has_ss = st[_HAS_SS] != 0
    has_held = st[_HAS_HELD] != 0
    cur = st[_CUR]
    minw = st[_MINW]
    behind = st[_BEHIND]
    done = st[_DONE]
    while True:
        if behind > 0:
            behind -= 1
            if use_bitmap:
                t, minw = _bm_pop(bits, loff, minw)
            else:
                t = stack[_U(behind)]
        else:
            while cur < n:
                c = start_cnt[_U(cur)]
                if c == 0 or (c == -1 and end_cnt[_U(cur)] == 0):
                    break
                cur += 1
            if cur == n:
                break
            t = cur
            cur += 1
        fire_ss = False
        if start_cnt[_U(t)] == 0:
            # start t
            start_cnt[_U(t)] = -1
            if has_held and (all_fixed or unit_policy[unit[_U(t)]] == _FIXED):
                ready = start[_U(t)]
                j = st[_U(_HELD_AT + t)]
                while j > 0:
                    x = _HELD_AT + n + 3 * (j - 1)  # the entry: next, source, lag
                    j = st[_U(x)]
                    s = st[_U(x + 1)]
                    if start[_U(s)] <= ready:
                        v = end[_U(s)] + st[_U(x + 2)]
                        ks = (n - s) << 1
                        cv = start[_U(t)]
                        bd = bound[_U(t)]
                        up = (v > cv) | ((v == cv) & (ks > bd))
                        start[_U(t)] = v if up else cv
                        bound[_U(t)] = ks if up else bd
            b = bound[_U(t)]
            if b != 0:
                bound[_U(t)] = n - (b >> 1)
                via[_U(t)] = b & 1
            else:
                bound[_U(t)] = -1
            fire_ss = has_ss
            if end_cnt[_U(t)] > 0:
                # started; finishes when its END predecessors are done
                if has_ss:
                    kss = ((n - t) << 1) | 1  # t's binder key through its start
                    st_t = start[_U(t)]
                    for k in range(indptr[_U(t)], indptr[_U(t + 1)]):
                        if kind[_U(k)] != _START_START:
                            continue
                        d = dst[_U(k)]
                        v = st_t + lag[_U(k)]
                        cv = start[_U(d)]
                        bd = bound[_U(d)]
                        up = (v > cv) | ((v == cv) & (kss > bd))
                        start[_U(d)] = v if up else cv
                        bound[_U(d)] = kss if up else bd
                        c = start_cnt[_U(d)] - 1
                        start_cnt[_U(d)] = c
                        if not (all_fixed or unit_policy[unit[_U(d)]] == _FIXED):
                            if c == 0:
                                start_cnt[_U(d)] = _QUEUED
                                _release(d, unit, start, pend, qbase, psize, qsize, prio,
                                         free, busy, hk, hu, st)
                        elif c == 0:
                            minw, behind = _push(d, cur, minw, behind, stack, bits, loff,
                                                 use_bitmap)
                continue
        # finish t: its own work runs from its start, or from when its END predecessors
        # let it go on if that is later (a call that waited, then returns)
        e = start[_U(t)]
        ce = end[_U(t)]
        if ce > e:
            e = ce
            end_bound[_U(t)] = n - end_bound[_U(t)]
        else:
            end_bound[_U(t)] = -1
        e += dur[_U(t)]
        end[_U(t)] = e
        start_cnt[_U(t)] = -2
        done += 1
        kt = (n - t) << 1  # t's binder key through its end: larger for smaller indices
        if all_fixed or unit_policy[unit[_U(t)]] == _FIXED:
            j = nxt[_U(t)] - 1
            if j >= 0:
                cv = start[_U(j)]
                bj = bound[_U(j)]
                up = (e > cv) | ((e == cv) & (kt > bj))
                start[_U(j)] = e if up else cv
                bound[_U(j)] = kt if up else bj
                c = start_cnt[_U(j)] - 1
                start_cnt[_U(j)] = c
                if c == 0:
                    minw, behind = _push(j, cur, minw, behind, stack, bits, loff, use_bitmap)
        else:
            _unit_freed(t, e, unit[_U(t)], start, pend, qbase, psize, qsize, prio, free, busy, last,
                        hk, hu, st)
        st_t = start[_U(t)]
        for k in range(indptr[_U(t)], indptr[_U(t + 1)]):
            kd = kind[_U(k)]
            d = dst[_U(k)]
            if kd == _END:
                v = e + lag[_U(k)]
                ke = kt >> 1
                cv = end[_U(d)]
                bd = end_bound[_U(d)]
                up = (v > cv) | ((v == cv) & (ke > bd))
                end[_U(d)] = v if up else cv
                end_bound[_U(d)] = ke if up else bd
                c = end_cnt[_U(d)] - 1
                end_cnt[_U(d)] = c
                if c == 0 and start_cnt[_U(d)] == -1:
                    minw, behind = _push(d, cur, minw, behind, stack, bits, loff, use_bitmap)
                continue
            if kd == _START:
                v = e + lag[_U(k)]
                key = kt
            elif kd == _HELD:
                if all_fixed or unit_policy[unit[_U(d)]] == _FIXED:
                    # decided when d starts: onto d's list, and no bound now
                    c = st[_N_HELD]
                    st[_N_HELD] = c + 1
                    x = _HELD_AT + n + 3 * c
                    st[_U(x)] = st[_U(_HELD_AT + d)]
                    st[_U(x + 1)] = t
                    st[_U(x + 2)] = lag[_U(k)]
                    st[_U(_HELD_AT + d)] = c + 1
                    v = np.int64(MIN_LAG_NS)
                    key = 0
                else:  # into a FCFS/PRIORITY unit's task: a START edge
                    v = e + lag[_U(k)]
                    key = kt
            elif fire_ss:
                v = st_t + lag[_U(k)]
                key = kt | 1  # t's binder key through its start
            else:
                continue  # a START_START edge, fired when t started
            cv = start[_U(d)]
            bd = bound[_U(d)]
            up = (v > cv) | ((v == cv) & (key > bd))
            start[_U(d)] = v if up else cv
            bound[_U(d)] = key if up else bd
            c = start_cnt[_U(d)] - 1
            start_cnt[_U(d)] = c
            if not (all_fixed or unit_policy[unit[_U(d)]] == _FIXED):
                if c == 0:
                    start_cnt[_U(d)] = _QUEUED
                    _release(d, unit, start, pend, qbase, psize, qsize, prio, free, busy,
                             hk, hu, st)
            elif c == 0:
                minw, behind = _push(d, cur, minw, behind, stack, bits, loff, use_bitmap)
    st[_CUR] = cur
    st[_MINW] = minw
    st[_BEHIND] = behind
    st[_DONE] = done


@helper()
def _drain_sweep(dur, unit, unit_policy, indptr, dst, lag, kind, nxt, start_cnt, end_cnt, start,
                 end, bound, via, end_bound, stack, bits, loff, pend, qbase, psize, qsize, prio,
                 free, busy, last, hk, hu, st):
    _drain_body(dur, unit, unit_policy, indptr, dst, lag, kind, nxt, start_cnt, end_cnt, start,
                end, bound, via, end_bound, stack, bits, loff, pend, qbase, psize, qsize, prio,
                free, busy, last, hk, hu, st, False)


@helper()
def _drain_bitmap(dur, unit, unit_policy, indptr, dst, lag, kind, nxt, start_cnt, end_cnt, start,
                  end, bound, via, end_bound, stack, bits, loff, pend, qbase, psize, qsize, prio,
                  free, busy, last, hk, hu, st):
    _drain_body(dur, unit, unit_policy, indptr, dst, lag, kind, nxt, start_cnt, end_cnt, start,
                end, bound, via, end_bound, stack, bits, loff, pend, qbase, psize, qsize, prio,
                free, busy, last, hk, hu, st, True)


@kernel("int64", "readonly int64[::1]", "readonly int32[::1]", "readonly int8[::1]",
        "readonly int64[::1]", "bool", "readonly int64[::1]", "readonly int64[::1]",
        "readonly int64[::1]", "readonly int8[::1]", "int32[::1]", "int32[::1]", "int32[::1]",
        "int64[::1]", "int64[::1]", "int64[::1]", "int8[::1]", "int64[::1]", "int64[::1]",
        "readonly int64[::1]", "int64")
def run(dur, unit, unit_policy, priority, has_ss, indptr, dst, lag, kind, nxt, start_cnt,
        end_cnt, start, end, bound, via, end_bound, bits, loff, n_held):
    """Simulate. On entry (see ``prepare``/``count_in``) ``start_cnt``/``end_cnt`` hold
    predecessor counts and ``nxt`` the FIXED links; ``start``, ``end``, ``bound``, ``via``,
    ``end_bound`` and ``bits`` are zero; ``n_held``: how many edges are HELD. Returns the
    number of finished tasks; on exit ``start_cnt`` holds the task states and, for finished
    tasks:

    - ``start``/``end``: the schedule;
    - ``bound``: the predecessor that decided the start (-1: none), ``via``: 1 when through
      that predecessor's start (a START_START edge), 0 through its end;
    - ``end_bound``: the END predecessor that pushed the end past start + dur, else -1.

    Every array starts zeroed, so that allocation (calloc) is the only initialization. While a
    task waits, ``start``/``end`` accumulate the latest bound from its START(-like)/END
    predecessors, and ``bound``/``end_bound`` which predecessor set it, as a key that grows as
    the index shrinks (``(n - index) << 1 | via`` and ``n - index``; 0: none), so that on equal
    times the smallest index wins.

    Alternates a drain (everything runnable without a dispatch) with one dispatch on the
    FCFS/PRIORITY unit whose next task would start earliest, until neither has work."""
    n = dur.shape[0]
    n_units = unit_policy.shape[0]

    # Queues of non-FIXED units: one segment per unit in ``pend`` and ``prio``.
    all_fixed = True
    for u in range(n_units):
        if unit_policy[u] != _FIXED:
            all_fixed = False
    qcount = np.zeros(n_units, np.int64)
    if not all_fixed:
        for i in range(n):
            if unit_policy[unit[i]] != _FIXED:
                qcount[unit[i]] += 1
    qbase = np.zeros(n_units, np.int64)
    total_q = 0
    for u in range(n_units):
        qbase[u] = total_q
        total_q += qcount[u]
    pend = np.empty(total_q, np.int64)
    prio = np.empty(total_q, np.int64)
    psize = np.zeros(n_units, np.int64)   # queued, by ready time
    qsize = np.zeros(n_units, np.int64)   # PRIORITY only: ready by the last dispatch, by priority
    free = np.zeros(n_units, np.int64)    # when the unit frees
    busy = np.zeros(n_units, np.bool_)
    last = np.full(n_units, -1, np.int64)  # task that last ran on the unit
    hk = np.empty(2 * total_q + 1, np.int64)  # heap of (candidate start, unit)
    hu = np.empty(2 * total_q + 1, np.int64)
    st = np.zeros(_HELD_AT + (n + 3 * n_held if n_held > 0 else 0), np.int64)
    st[_ALL_FIXED] = all_fixed
    st[_HAS_SS] = has_ss
    st[_HAS_HELD] = n_held > 0

    # Seed the queues of non-FIXED units; runnable FIXED tasks are found by the sweep.
    if not all_fixed:
        for i in range(n):
            if start_cnt[i] == 0 and unit_policy[unit[i]] != _FIXED:
                start_cnt[i] = _QUEUED
                _release(i, unit, start, pend, qbase, psize, qsize, prio, free, busy, hk, hu, st)

    stack = np.empty(n, np.int32)
    _drain_sweep(dur, unit, unit_policy, indptr, dst, lag, kind, nxt, start_cnt, end_cnt, start,
                 end, bound, via, end_bound, stack, bits, loff, pend, qbase, psize, qsize, prio,
                 free, busy, last, hk, hu, st)
    while True:
        # Nothing runnable: dispatch the queued task that starts earliest over all units.
        dispatched = False
        while st[_HSIZE] > 0:
            key = hk[0]
            u = hu[0]
            _unit_pop(hk, hu, st[_HSIZE])
            st[_HSIZE] -= 1
            if busy[_U(u)] or psize[_U(u)] + qsize[_U(u)] == 0:
                continue
            tnow = _candidate(u, free, pend, psize, prio, qsize, qbase, start)
            if tnow != key:
                continue  # stale entry; the current one is in the heap too
            base = qbase[_U(u)]
            if unit_policy[_U(u)] == _FCFS:
                t = _pend_pop(pend, base, psize[_U(u)], start)
                psize[_U(u)] -= 1
            else:
                while psize[_U(u)] > 0 and start[pend[_U(base)]] <= tnow:
                    x = _pend_pop(pend, base, psize[_U(u)], start)
                    psize[_U(u)] -= 1
                    _prio_push(prio, base, qsize[_U(u)], x, start, priority)
                    qsize[_U(u)] += 1
                t = _prio_pop(prio, base, qsize[_U(u)], start, priority)
                qsize[_U(u)] -= 1
            # start = max(unit free, ready); the unit's previous task binds when it frees later
            # (or at the same time with a smaller index).
            p = last[_U(u)]
            kp = (n - p) << 1
            fu = free[_U(u)]
            rt = start[_U(t)]
            if p >= 0 and (fu > rt or (fu == rt and kp > bound[_U(t)])):
                bound[_U(t)] = kp
            start[_U(t)] = tnow
            busy[_U(u)] = True
            start_cnt[_U(t)] = 0
            # The sweep has passed every index by now: from here on the bitmap holds the
            # runnable tasks.
            _bm_insert(bits, loff, t)
            st[_BEHIND] += 1
            if (t >> 6) < st[_MINW]:
                st[_MINW] = t >> 6
            dispatched = True
            break
        if not dispatched:
            break
        _drain_bitmap(dur, unit, unit_policy, indptr, dst, lag, kind, nxt, start_cnt, end_cnt,
                      start, end, bound, via, end_bound, stack, bits, loff, pend, qbase, psize,
                      qsize, prio, free, busy, last, hk, hu, st)
    return st[_DONE]


@helper()
def _walk(bound, via, end_bound, t, out):
    """Follow binders back from the end of task ``t``: a task's end is bound by its END
    predecessor when one extended it, else by its start; a start is bound by ``bound`` through
    that task's end, or through its start when ``via`` (a START_START edge). Writes the tasks
    met into ``out`` last first (when ``out`` is long enough) and returns their number."""
    k = 0
    x = t
    at_end = True
    while True:
        if k < out.shape[0]:
            out[out.shape[0] - 1 - k] = x
        k += 1
        if at_end and end_bound[x] >= 0:
            x = end_bound[x]
            continue
        b = bound[x]
        if b < 0:
            return k
        at_end = via[x] == 0
        x = b


@kernel("int64[::1]", "readonly int64[::1]", "readonly int64[::1]", "readonly int8[::1]",
        "readonly int64[::1]")
def critical_path(end, bound, via, end_bound):
    """Task indices in time order, from a task with nothing binding it to the last-ending task
    (the lowest index among ties), following the binders as in ``_walk``."""
    n = end.shape[0]
    if n == 0:
        return np.empty(0, np.int64)
    t = 0
    for i in range(1, n):
        if end[i] > end[t]:
            t = i
    length = _walk(bound, via, end_bound, t, np.empty(0, np.int64))
    path = np.empty(length, np.int64)
    _walk(bound, via, end_bound, t, path)
    return path
