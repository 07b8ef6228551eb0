"""Small graphs whose schedules were worked out by hand; each test draws the expected timeline
(one column per ns, see ``timeline.draw``) and checks the binding predecessors."""

from __future__ import annotations

import numpy as np

from daydream.simulate import FCFS, FIXED, PRIORITY, simulate
from tests.simulate.timeline import build, draw, expect


def path(sched, names):
    return "".join(names[t] for t in sched.critical_path())


def test_thread_launches_three_kernels_onto_a_stream():
    # Launch calls a, b, c (2 ns each) put kernels A (5 ns), B (1 ns), C (3 ns) on one stream,
    # each launch edge with 1 ns of launch latency. A is launch-bound (2 + 1 = 3); B and C are
    # stream-bound: they were launched long before the stream got to them.
    g, names = build(
        tasks=[("a", 0, 2), ("b", 0, 2), ("c", 0, 2), ("A", 1, 5), ("B", 1, 1), ("C", 1, 3)],
        edges=[("a", "A", 1, "start"), ("b", "B", 1, "start"), ("c", "C", 1, "start")],
        policies=[FIXED, FIXED])
    s = simulate(g)
    assert draw(s, g, names, ["thread", "stream"]) == expect("""
        #      0123456789012
        thread |aabbcc
        stream |...AAAAABCCC
    """)
    assert s.makespan_ns == 12
    assert path(s, names) == "aABC"
    assert s.unit_busy_ns(2).tolist() == [6, 9]


def test_blocking_sync_ends_when_the_gpu_work_it_waits_for_ends():
    # a launches K; s is cudaStreamSynchronize with 1 ns of its own (what it runs after the
    # wait): it starts when the thread is free (2), waits until K ends (9), holding the thread,
    # then runs its own 1 ns; the host work h after it starts only then.
    g, names = build(
        tasks=[("a", 0, 2), ("s", 0, 1), ("h", 0, 2), ("K", 1, 6)],
        edges=[("a", "K", 1, "start"), ("K", "s", 0, "end")],
        policies=[FIXED, FIXED])
    s = simulate(g)
    assert draw(s, g, names, ["thread", "stream"]) == expect("""
        #      0123456789012
        thread |aasssssssshh
        stream |...KKKKKK
    """)
    # a decided when s started, K (its END predecessor) when its own work could begin.
    assert names[s.bound_by[names.index("s")]] == "a"
    assert names[s.end_bound_by[names.index("s")]] == "K"
    assert path(s, names) == "aKsh"


def test_sync_whose_gpu_work_already_finished_takes_its_own_duration():
    # The END edge does not bind when the GPU work ended earlier: s runs its 3 ns.
    g, names = build(
        tasks=[("a", 0, 1), ("h", 0, 5), ("s", 0, 3), ("K", 1, 2)],
        edges=[("a", "K", 0, "start"), ("K", "s", 0, "end")],
        policies=[FIXED, FIXED])
    s = simulate(g)
    assert draw(s, g, names, ["thread", "stream"]) == expect("""
        #      012345678
        thread |ahhhhhsss
        stream |.KK
    """)
    assert names[s.bound_by[names.index("s")]] == "h"
    assert s.end_bound_by[names.index("s")] == -1


def test_launch_lets_gpu_work_start_before_the_call_returns():
    # START_START launch edges: the kernel may start 2 ns after its launch call a starts, while
    # a itself runs 5 ns; the second kernel B is launched by b and runs when the stream frees.
    g, names = build(
        tasks=[("a", 0, 5), ("b", 0, 3), ("A", 1, 4), ("B", 1, 2)],
        edges=[("a", "A", 2, "start_start"), ("b", "B", 2, "start_start")],
        policies=[FIXED, FIXED])
    s = simulate(g)
    assert draw(s, g, names, ["thread", "stream"]) == expect("""
        #      012345678901
        thread |aaaaabbb
        stream |..AAAA.BB
    """)
    i = names.index
    assert s.bound_by[i("A")] == i("a") and s.bound_via_start[i("A")] == 1
    assert s.bound_by[i("B")] == i("b") and s.bound_via_start[i("B")] == 1
    assert s.bound_via_start[i("b")] == 0
    assert path(s, names) == "abB"


def test_blocking_copy_waits_for_the_copy_it_launched():
    # cudaMemcpy c launches its copy C (START_START, 1 ns), waits for C (END) and then runs its
    # own 1 ns: the critical path enters c at its start and leaves at its end, so c appears
    # twice.
    g, names = build(
        tasks=[("h", 0, 2), ("c", 0, 1), ("x", 0, 1), ("C", 1, 5)],
        edges=[("c", "C", 1, "start_start"), ("C", "c", 0, "end")],
        policies=[FIXED, FIXED])
    s = simulate(g)
    assert draw(s, g, names, ["thread", "copy"]) == expect("""
        #      0123456789
        thread |hhcccccccx
        copy   |...CCCCC
    """)
    i = names.index
    assert s.bound_by[i("C")] == i("c") and s.end_bound_by[i("c")] == i("C")
    assert path(s, names) == "hcCcx"


def test_two_streams_joined_by_an_event_wait():
    # X on stream 1 and Y on stream 2; Y waits for X (cudaStreamWaitEvent), so it starts at X's
    # end (7) though it was launched at 2 + 1. Z, launched after, follows X on stream 1.
    g, names = build(
        tasks=[("a", 0, 1), ("b", 0, 1), ("c", 0, 1), ("X", 1, 5), ("Z", 1, 1), ("Y", 2, 2)],
        edges=[("a", "X", 1, "start"), ("b", "Y", 1, "start"), ("c", "Z", 1, "start"),
               ("X", "Y", 0, "start")],
        policies=[FIXED, FIXED, FIXED])
    s = simulate(g)
    assert draw(s, g, names, ["thread", "s1", "s2"]) == expect("""
        #      0123456789
        thread |abc
        s1     |..XXXXXZ
        s2     |.......YY
    """)
    assert path(s, names) == "aXY"


def test_a_held_edge_binds_only_while_its_source_runs():
    # Contention: kernel X (stream 1, after P) is held by Y (stream 2) only where Y is running
    # when P's end lets X start (at 6). Thread task y launches Y as it ends.
    def graph(y_ns, kind="held"):
        return build(tasks=[("y", 0, y_ns), ("P", 1, 6), ("X", 1, 2), ("Y", 2, 5)],
                     edges=[("y", "Y", 0, "start"), ("Y", "X", 0, kind)],
                     policies=[FIXED, FIXED, FIXED])

    # y of 3 ns: Y runs 3-8, so X waits for it and starts at 8, bound by Y.
    g, names = graph(3)
    s = simulate(g)
    assert draw(s, g, names, ["thread", "stream1", "stream2"]) == expect("""
        #       0123456789012
        thread  |yyy
        stream1 |PPPPPP..XX
        stream2 |...YYYYY
    """)
    assert names[s.bound_by[names.index("X")]] == "Y"
    # y of 7 ns: Y begins at 7, after X could start: it held nothing, X starts at 6 (bound by
    # P, the task before it on its stream); as a plain START edge it would have waited to 12.
    g, names = graph(7)
    s = simulate(g)
    assert draw(s, g, names, ["thread", "stream1", "stream2"]) == expect("""
        #       0123456789012
        thread  |yyyyyyy
        stream1 |PPPPPPXX
        stream2 |.......YYYYY
    """)
    assert names[s.bound_by[names.index("X")]] == "P"
    g, names = graph(7, "start")
    assert simulate(g).start_ns[names.index("X")] == 12


def test_held_edges_in_a_chain_are_decided_on_the_final_times():
    # Stream 1 runs P (0-4), W, X; Y and Z both begin at 7 (launched by y and z), each held
    # edge into a task of stream 1. W is ready at 4, before Y begins: not held, W runs 4-6.
    # X is then ready at 6, before Z begins: not held either, X runs 6-7. (Had W been held to
    # 12-14 by Y, X would be ready at 14 and Z, ended at 9, would not bind it: the answer
    # depends on deciding W's edge before X's, which the core does as it starts each task.)
    g, names = build(
        tasks=[("y", 0, 7), ("z", 3, 7), ("P", 1, 4), ("W", 1, 2), ("X", 1, 1), ("Y", 2, 5),
               ("Z", 4, 2)],
        edges=[("y", "Y", 0, "start"), ("z", "Z", 0, "start"), ("Y", "W", 0, "held"),
               ("Z", "X", 0, "held")],
        policies=[FIXED] * 5)
    s = simulate(g)
    assert [int(s.start_ns[names.index(t)]) for t in "WXYZ"] == [4, 6, 7, 7]


def test_fcfs_channel_runs_ready_tasks_in_order_of_ready_time():
    # Channel tasks P, Q, R (in index order). Q and R become ready at 1 (after b), P at 3
    # (after a). Q runs first (ready first; ties with R broken by index); when the channel frees
    # at 3, R (ready since 1) goes before P (ready at 3).
    tasks = [("a", 0, 3), ("b", 1, 1), ("P", 2, 3), ("Q", 2, 2), ("R", 2, 2)]
    edges = [("a", "P", 0, "start"), ("b", "Q", 0, "start"), ("b", "R", 0, "start")]
    g, names = build(tasks, edges, policies=[FIXED, FIXED, FCFS])
    s = simulate(g)
    assert draw(s, g, names, ["u0", "u1", "chan"]) == expect("""
        #    012345678
        u0   |aaa
        u1   |b
        chan |.QQRRPPP
    """)
    # The channel's previous task binds a task that waited for the channel.
    assert names[s.bound_by[names.index("R")]] == "Q"
    assert names[s.bound_by[names.index("P")]] == "R"
    # The same channel FIXED keeps index order and waits for P.
    g, names = build(tasks, edges, policies=[FIXED, FIXED, FIXED])
    assert draw(simulate(g), g, names, ["u0", "u1", "chan"]) == expect("""
        #    0123456789
        u0   |aaa
        u1   |b
        chan |...PPPQQRR
    """)


def test_priority_channel_lets_a_later_ready_urgent_task_jump_the_queue():
    # M holds the channel 0-4. L (priority 5) is ready at 1, H (priority 0) at 3. When the
    # channel frees at 4 both are ready and H goes first; FCFS would have run L first.
    tasks = [("x", 0, 1), ("y", 1, 3), ("M", 2, 4), ("L", 2, 2), ("H", 2, 2)]
    edges = [("x", "L", 0, "start"), ("y", "H", 0, "start")]
    prio = [0, 0, 0, 5, 0]
    g, names = build(tasks, edges, policies=[FIXED, FIXED, PRIORITY], priority=prio)
    assert draw(simulate(g), g, names, ["u0", "u1", "chan"]) == expect("""
        #    012345678
        u0   |x
        u1   |yyy
        chan |MMMMHHLL
    """)
    g, names = build(tasks, edges, policies=[FIXED, FIXED, FCFS], priority=prio)
    assert draw(simulate(g), g, names, ["u0", "u1", "chan"]) == expect("""
        #    012345678
        u0   |x
        u1   |yyy
        chan |MMMMLLHH
    """)


def test_priority_channel_does_not_wait_for_an_urgent_task_that_is_not_ready():
    # Non-preemptive: the idle channel starts L at 1; H, ready at 2, waits until 3.
    g, names = build(
        tasks=[("x", 0, 1), ("y", 1, 2), ("L", 2, 2), ("H", 2, 2)],
        edges=[("x", "L", 0, "start"), ("y", "H", 0, "start")],
        policies=[FIXED, FIXED, PRIORITY], priority=[0, 0, 9, 0])
    assert draw(simulate(g), g, names, ["u0", "u1", "chan"]) == expect("""
        #    012345
        u0   |x
        u1   |yy
        chan |.LLHH
    """)


def test_fixed_unit_follows_order_key_not_index():
    # order_key says the stream ran C, then B, then A; the stream keeps that order.
    g, names = build(
        tasks=[("A", 0, 1), ("B", 0, 2), ("C", 0, 3)], edges=[], policies=[FIXED],
        order_key=[30, 20, 10])
    assert draw(simulate(g), g, names, ["stream"]) == expect("""
        #      012345
        stream |CCCBBA
    """)


def test_end_edge_pointing_backwards_in_index_order():
    # The sync s (index 1) waits on kernel K (index 3), as when the sync call began before the
    # kernel did; K ends at 5 and the END edge's 2 ns lag lets s's own 1 ns begin at 7; after
    # it, host work h launches a second kernel J.
    g, names = build(
        tasks=[("a", 0, 1), ("s", 0, 1), ("h", 0, 1), ("K", 1, 4), ("J", 1, 1)],
        edges=[("a", "K", 0, "start"), ("K", "s", 2, "end"), ("h", "J", 0, "start")],
        policies=[FIXED, FIXED])
    s = simulate(g)
    assert draw(s, g, names, ["thread", "stream"]) == expect("""
        #      0123456789
        thread |asssssssh
        stream |.KKKK....J
    """)


def test_zero_duration_tasks_and_empty_graph():
    g, names = build(tasks=[("a", 0, 0), ("b", 0, 0), ("c", 1, 0)],
                     edges=[("a", "c", 0, "start")], policies=[FIXED, FIXED])
    s = simulate(g)
    assert s.makespan_ns == 0
    assert s.start_ns.tolist() == [0, 0, 0] and s.end_ns.tolist() == [0, 0, 0]
    g, _ = build(tasks=[], edges=[], policies=[])
    s = simulate(g)
    assert s.makespan_ns == 0 and s.critical_path().size == 0
    assert s.unit_busy_ns(0).tolist() == []


def test_duplicate_edges_and_lags():
    # Two edges a->b; the larger lag binds.
    g, _ = build(tasks=[("a", 0, 2), ("b", 1, 1)],
                 edges=[("a", "b", 1, "start"), ("a", "b", 4, "start")], policies=[FIXED, FIXED])
    s = simulate(g)
    assert s.start_ns.tolist() == [0, 6]
    assert s.bound_by.tolist() == [-1, 0]
    assert s.start_ns.dtype == np.int64 and s.bound_by.dtype == np.int64


def test_critical_path_parts_across_threads_streams_and_an_iteration_boundary():
    # Hand-drawn: the main thread (unit 0) launches K (launch latency 1 ns) and then waits in
    # w for the other thread (unit 1), whose task x ends at 9 (END edge, 2 ns wake-up; w's own
    # work after it: 1 ns). Thread 1's x waits for K (a sync: END edge, 0 ns; x's own work 2 ns).
    # n is the next iteration's first task on the main thread.
    #
    #      0123456789012
    # t0   |aawwwwwwwwwwn        a 0-2, w waits 2-11 then runs 11-12, n 12-13
    # t1   |hhhhxxxxxxx          h 0-4, x waits for K until 7, runs 7-9
    # str  |...KKKK              K 3-7
    #
    # Walking back from n's start (12) to the iteration's start (0): w's own work (11-12), the
    # wake delay x -> w (9-11), x's own work (7-9), the sync delay K -> x (7-7, 0 ns), K (3-7),
    # the launch delay a -> K (2-3), a (0-2): 1 + 2 + 2 + 0 + 4 + 1 + 2 = 12 ns = the span.
    from daydream.simulate import _passes

    g, names = build(
        tasks=[("a", 0, 2), ("w", 0, 1), ("n", 0, 1), ("h", 1, 4), ("x", 1, 2), ("K", 2, 4)],
        edges=[("a", "K", 1, "start"), ("x", "w", 2, "end"), ("K", "x", 0, "end")],
        policies=[FIXED, FIXED, FIXED])
    s = simulate(g)
    i = names.index
    assert s.start_ns[i("n")] == 12 and s.end_ns[i("x")] == 9
    seg_t = np.empty(16, np.int64)
    seg_s = np.empty(16, np.int64)
    seg_ns = np.empty(16, np.int64)
    n, reached = _passes.path_parts(s.bound_by, s.bound_via_start, s.end_bound_by, s.start_ns,
                                    s.end_ns, g.dur_ns, i("n"), False, 0, seg_t, seg_s, seg_ns)
    parts = [(names[t], names[b] if b >= 0 else "", int(v))
             for t, b, v in zip(seg_t[:n], seg_s[:n], seg_ns[:n], strict=True)]
    assert parts == [("n", "w", 0), ("w", "", 1), ("w", "x", 2), ("x", "", 2), ("x", "K", 0),
                     ("K", "", 4), ("K", "a", 1), ("a", "", 2)]
    assert sum(v for _, _, v in parts) == 12 and reached == 0
    # cut at an iteration boundary at 5 ns: the path stops there, its last part clipped
    n, reached = _passes.path_parts(s.bound_by, s.bound_via_start, s.end_bound_by, s.start_ns,
                                    s.end_ns, g.dur_ns, i("n"), False, 5, seg_t, seg_s, seg_ns)
    assert [(names[t], int(v)) for t, v in zip(seg_t[:n], seg_ns[:n], strict=True)] == \
        [("n", 0), ("w", 1), ("w", 2), ("x", 2), ("x", 0), ("K", 2)]
    assert sum(seg_ns[:n]) == 12 - 5
