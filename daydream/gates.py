"""Plausibility gates on every prediction (../shared/ACCURACY.md, section 5).

``pipeline.result`` calls ``check`` for every prediction, so ``daydream predict``, the Python
API and every ``predict --all`` worker report the same gates: ``check`` gives a list of
``{"name", "ok", "note"}`` dicts, which the result holds as ``gates``
(``graphstore.prediction.Gate``), and a note for each failed gate in its ``notes``.

- ``no_slowdown``: a chain whose optimizations only remove or shrink work (each registered with
  ``shrinks=True``: ``transforms.registry.register``) does not predict a slower step (by more
  than ``SLOWDOWN_TOL``); where it does, the gate fails and its note names the tasks whose work
  grew most per iteration (inserted tasks included).
- ``slowdown_named``: any other chain (one that inserts work or changes the machine) that
  predicts a slower step names the tasks whose time grew most per iteration, in the gate and
  in a note; it fails where no task's time grew (a slowdown nothing explains).
- ``floor``: no prediction beats the work left in the rewritten graph: its step is at least
  the busiest CPU thread's own work per used iteration (the floor when only the GPU got
  faster) and the busiest GPU stream's busy time per used iteration (the floor when only the
  CPU got faster), less ``FLOOR_TOL``. Both floors are reported, and beside them the threads
  that never work at once (``chained_threads``: the main thread waiting in backward() while
  the autograd thread works), whose work adds up: information on what a faster GPU cannot
  shorten, not a gate, since two threads may also have missed each other by chance.
- ``applies``: an optimization that says it does not apply (a note with "does not apply")
  changes nothing (the prediction equals the baseline); and a chain that changed nothing says
  why (one of its notes says "unchanged" or "does not apply").
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from daydream.base.columns import is_in, numpy_filled
from daydream.graphstore.schema import CPU_KINDS, GPU_KINDS

SLOWDOWN_TOL = 0.01  # a slower step by more than 1% of the baseline fails no_slowdown
FLOOR_TOL = 0.02     # a step more than 2% under the busiest unit's work fails floor
SAME_TOL = 0.001     # "changes nothing": within 0.1% of the baseline
RECOMPUTE = " (recompute)"  # the suffix checkpointing gives the tasks it runs again


def spec_names(spec: str | None) -> list[str]:
    from daydream.transforms.spec import parse
    return [t.name for t in parse(spec)] if spec else []


def _used(rep, tables: dict[str, pa.Table]) -> tuple[np.ndarray, int]:
    """Mask of the tasks of the replay's used iterations, and how many there are."""
    used = [i.index for i in rep.iterations if i.used]
    it = numpy_filled(tables["task"]["iteration"], -1)
    return np.isin(it, used), max(len(used), 1)


def floors(tables: dict[str, pa.Table], rep, recorded: tuple | None = None) -> dict:
    """The busiest CPU thread's own work and the busiest GPU stream's own work per used
    iteration of REP (ms): the tasks' own costs (``dur_ns``) in TABLES, without the waiting
    the graph keeps as slack (a collective waiting for its peers does no work). And the
    threads that never work at once (``chained_threads``) with their work added up: chosen
    where their times are the trace's, in RECORDED (the baseline's tables and replay; TABLES
    where not given: a rewrite places inserted tasks at their anchors' times, not on one
    timeline), their work taken from TABLES."""
    mask, n = _used(rep, tables)
    unit = tables["task"]["unit_id"].to_numpy(zero_copy_only=False)
    work = tables["task"]["dur_ns"].to_numpy(zero_copy_only=False).astype(np.float64)
    names = dict(zip(tables["unit"]["unit_id"].to_pylist(), tables["unit"]["name"].to_pylist(),
                     strict=False))
    out = {}
    for key, kinds in (("cpu", CPU_KINDS), ("gpu", GPU_KINDS)):
        sel = mask & is_in(tables["task"]["kind"], kinds)
        if not sel.any():
            continue
        per = np.bincount(unit[sel], weights=work[sel])
        u = int(np.argmax(per))
        out[f"{key}_ms"] = float(per[u]) / n / 1e6
        out[f"{key}_unit"] = names.get(u, str(u))
        if key == "cpu":
            chain = _chain_names(*(recorded or (tables, rep)))
            picked = [u for u in range(len(per)) if names.get(u) in chain]
            if len(picked) > 1:
                out["chain_ms"] = float(per[picked].sum()) / n / 1e6
                out["chain_units"] = [names[u] for u in
                                      sorted(picked, key=lambda u: (-per[u], u))]
    return out


def _chain_names(tables: dict[str, pa.Table], rep) -> frozenset[str]:
    """The names of the threads that never work at once in TABLES' used iterations of REP;
    once per task table and used iterations (``base.memo``): every spec of a trace has the
    same baseline."""
    from daydream.base.memo import per_tables
    used = ",".join(str(i.index) for i in rep.iterations if i.used)
    return per_tables(f"chained_threads:{used}", (tables["task"], tables["unit"]),
                      lambda *_: _chain_of(tables, rep))


def _chain_of(tables: dict[str, pa.Table], rep) -> frozenset[str]:
    """``_chain_names``, computed."""
    mask, _ = _used(rep, tables)
    sel = mask & is_in(tables["task"]["kind"], CPU_KINDS)
    t = tables["task"]
    unit = t["unit_id"].to_numpy(zero_copy_only=False)[sel]
    work = t["dur_ns"].to_numpy(zero_copy_only=False)[sel].astype(np.int64)
    start = t["start_ns"].to_numpy(zero_copy_only=False)[sel]
    if not len(unit):
        return frozenset()
    names = dict(zip(tables["unit"]["unit_id"].to_pylist(), tables["unit"]["name"].to_pylist(),
                     strict=False))
    chain = chained_threads(unit, start, work, np.bincount(unit, weights=work))
    return frozenset(names[u] for u in chain if u in names) if len(chain) > 1 else frozenset()


# A thread joins the chain when at most this share of its own work overlaps the chain's: the
# share bench/bounds.py allows the threads it takes one after another
CHAIN_OVERLAP = 0.01


def chained_threads(unit: np.ndarray, start: np.ndarray, work: np.ndarray,
                    per: np.ndarray) -> list[int]:
    """The threads whose own work (each task's [start, start + work), ns) never overlaps:
    from the busiest (PER: work per unit), each next busiest thread whose work overlaps the
    chain's by at most CHAIN_OVERLAP of its own. The main thread and the autograd thread
    hand work to each other (one waits in backward() while the other works), so no schedule
    of their work is shorter than its sum."""
    from daydream.breakdown import union_ns
    keep = work > 0
    unit, start, work = unit[keep], start[keep], work[keep]
    chain: list[int] = []
    cs = ce = np.zeros(0, np.int64)
    chain_ns = 0
    for u in np.argsort(-per, kind="stable"):
        if per[u] <= 0:
            break
        m = unit == u
        s, e = np.concatenate((cs, start[m])), np.concatenate((ce, start[m] + work[m]))
        both_ns = union_ns(s, e)
        own_ns = int(work[m].sum())
        if own_ns - (both_ns - chain_ns) <= CHAIN_OVERLAP * own_ns:  # the overlap is small
            chain.append(int(u))
            cs, ce, chain_ns = s, e, both_ns
    return chain


def grown(base_tables: dict[str, pa.Table], base, tables: dict[str, pa.Table], pred,
          top: int = 3) -> list[tuple[str, float]]:
    """The task names whose time per used iteration grew most, ms: a GPU task's simulated
    work, a CPU task's held time (its work and its waits: a sync that now waits longer)."""
    def per_name(t, rep):
        # by the names' dictionary, never a string per task: as fixed-width numpy strings
        # (as wide as the longest kernel name) the transformer trace's 224k names took 3 GB,
        # the peak of a whole advise
        mask, n = _used(rep, t)
        name = t["task"]["name"]
        if isinstance(name, pa.ChunkedArray):
            name = (name.unify_dictionaries() if pa.types.is_dictionary(name.type)
                    else name).combine_chunks()
        if not pa.types.is_dictionary(name.type):
            name = pc.dictionary_encode(name)
        idx = name.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        words = name.dictionary.to_pylist()
        # the tasks a rewrite repeats (checkpointing's recomputed forward) count as one
        keys = ["?" if w is None else "every recomputed task" + RECOMPUTE
                if w.endswith(RECOMPUTE) else w for w in words] + ["?"]
        idx[idx < 0] = len(words)
        uniq, key_of = np.unique(np.array(keys, dtype=object), return_inverse=True)
        cpu = is_in(t["task"]["kind"], CPU_KINDS)
        held = (rep.schedule.end_ns - rep.schedule.start_ns).astype(np.float64)
        work = (np.asarray(rep.work_ns, np.float64) if rep.work_ns is not None else held)
        w = np.where(cpu, held, work)
        k = key_of[idx[mask]]
        s = np.bincount(k, weights=w[mask], minlength=len(uniq)) / n / 1e6
        seen = np.bincount(k, minlength=len(uniq)) > 0
        return dict(zip(uniq[seen].tolist(), s[seen].tolist(), strict=True))
    a, b = per_name(base_tables, base), per_name(tables, pred)
    d = sorted(((k, v - a.get(k, 0.0)) for k, v in b.items()), key=lambda kv: -kv[1])
    return [(k, v) for k, v in d[:top] if v > 0]


def check(spec: str | None, notes: list[str], baseline_ms: float | None,
          predicted_ms: float | None, base_tables: dict[str, pa.Table], base,
          tables: dict[str, pa.Table] | None, pred) -> list[dict]:
    """The gates of one prediction (see the module doc)."""
    out: list[dict] = []
    if not spec or pred is None or tables is None:
        return out
    names = spec_names(spec)
    text = " ".join(notes)
    slower = bool(baseline_ms and predicted_ms
                  and predicted_ms > baseline_ms * (1 + SLOWDOWN_TOL))
    why = ""
    if slower:
        g = grown(base_tables, base, tables, pred)
        why = ("; tasks whose time grew per iteration: " + ", ".join(
            f"{k[:70]} +{v:.2f} ms" for k, v in g) if g else "; no task's time grew")
    from daydream.transforms.registry import shrinking
    if baseline_ms and predicted_ms and shrinking(names):
        note = (f"{spec} only removes or shrinks work, yet predicts "
                f"{baseline_ms:.2f} -> {predicted_ms:.2f} ms")
        out.append({"name": "no_slowdown", "ok": not slower,
                    "note": note + why if slower else f"{spec}: no slowdown"})
    elif slower:
        # a chain that inserts work (recomputation, copies, collectives) may be slower; the
        # gate names the tasks that made it so, and fails where none did
        out.append({"name": "slowdown_named", "ok": why.startswith("; tasks"),
                    "note": f"{spec} predicts {baseline_ms:.2f} -> {predicted_ms:.2f} ms"
                    + why})
    f = floors(tables, pred, (base_tables, base))
    if predicted_ms and f:
        floor = max(f.get("cpu_ms", 0.0), f.get("gpu_ms", 0.0))
        ok = predicted_ms >= floor * (1 - FLOOR_TOL)
        out.append({"name": "floor", "ok": ok, "floor": f,
                    "note": (f"predicted {predicted_ms:.2f} ms vs the work left per iteration: "
                             f"CPU {f.get('cpu_ms', 0):.2f} ms ({f.get('cpu_unit')}), GPU "
                             f"{f.get('gpu_ms', 0):.2f} ms ({f.get('gpu_unit')})"
                             + ("" if ok else ": the prediction beats the floor")
                             + (f"; threads that never work at once, one after another: "
                                f"{f['chain_ms']:.2f} ms ({' + '.join(f['chain_units'])})"
                                if "chain_ms" in f else ""))})
    if baseline_ms and predicted_ms:
        same = abs(predicted_ms - baseline_ms) <= SAME_TOL * baseline_ms
        said = "does not apply" in text
        unchanged_said = said or "unchanged" in text
        if said:
            out.append({"name": "applies", "ok": same,
                        "note": (f"{spec} does not apply to this trace (a note says why) "
                                 "and predicts no change, as it should" if same else
                                 f"says it does not apply, yet predicts {baseline_ms:.2f} -> "
                                 f"{predicted_ms:.2f} ms")})
        elif same and not unchanged_said and _identical(base_tables, tables):
            out.append({"name": "applies", "ok": False,
                        "note": f"{spec} changed nothing in the graph and no note says why"})
        else:
            out.append({"name": "applies", "ok": True, "note": f"{spec} applies"})
    return out


def _identical(a: dict[str, pa.Table], b: dict[str, pa.Table]) -> bool:
    ta, tb = a["task"], b["task"]
    if ta.num_rows != tb.num_rows or a["edge"].num_rows != b["edge"].num_rows:
        return False
    return bool(np.array_equal(ta["dur_ns"].to_numpy(), tb["dur_ns"].to_numpy()))


def failed(gates: list[dict]) -> list[str]:
    """The names of the gates that failed, in the order they were checked."""
    return [g["name"] for g in gates if not g.get("ok")]


def failed_notes(gates: list[dict]) -> list[str]:
    """One note per failed gate, for the result's notes; and the note of a slower
    prediction's ``slowdown_named`` gate, which names the tasks that made it slower."""
    return [f"gate {g['name']} failed: {g['note']}" if not g["ok"] else f"slower: {g['note']}"
            for g in gates if not g["ok"] or g["name"] == "slowdown_named"]
