"""The ``daydream`` command: its commands, each declared once, and nothing else; the work is in
daydream.api and the modules it names.

Each command is a function registered with ``@command``; its parameters, annotated
``Argument`` or ``Option`` with their help and defaults, are what the command takes
(daydream/commandline.py reads them into both the parser of plain command lines and the
typer app). This module imports only what every command needs; a command imports the rest
when it runs. Library code raises ``DaydreamError``; ``commandline.run`` prints
``error: ...`` and exits 1, never a traceback.
"""

import sys
from pathlib import Path
from typing import Annotated

from daydream.base.errors import DaydreamError
from daydream.base.store import DEFAULT_STORE
from daydream.commandline import Argument, Option, command, error

HELP = ("Predict how much faster a training iteration would be with an optimization, from "
        "one profile of the unmodified job.")

StoreOpt = Annotated[Path, Option("--store", help="The store folder.",
                                         show_default=True)]
RayOpt = Annotated[str | None, Option("--ray", help="Run the work as Ray tasks: 'auto' "
                                      "(the running cluster, else a local one) or the "
                                      "cluster's address. See docs/fleets.md.")]
JsonOpt = Annotated[bool, Option("--json", help="Print JSON (the same as --format "
                                 "json).")]
FormatOpt = Annotated[str, Option("--format", "-f", help="Output format: table (for "
                                  "people), json or csv (for programs).")]
ParamBytesOpt = Annotated[int | None, Option(help="The model's parameter bytes, for "
                                                 "ddp(...) where the trace does not tell.")]
TargetArg = Annotated[str, Argument(help="A trace file, stored trace id, job name or "
                                    "folder of rank traces.")]
WorkersOpt = Annotated[int | None, Option(
    "--workers", help="With --all: processes predicting, this one among them.",
    show_default="every core")]


def _fmt(json: bool, fmt: str, allowed: tuple[str, ...] = ("table", "json", "csv")) -> str:
    fmt = "json" if json else fmt
    if fmt not in allowed:
        raise DaydreamError(f"--format {fmt!r}: one of {', '.join(allowed)}")
    return fmt


def _json(d: object) -> None:
    """D as indented JSON on stdout (what ``--json`` and ``--format json`` print)."""
    import orjson
    print(orjson.dumps(d, option=orjson.OPT_INDENT_2, default=str).decode(), flush=True)


def _emit(fmt: str, d: object, csv_text, show) -> None:
    """A command's result in the asked format: JSON, CSV (``csv_text(d)``) or tables
    (``show(d)``)."""
    if fmt == "json":
        _json(d)
    elif fmt == "csv":
        sys.stdout.write(csv_text(d))
        sys.stdout.flush()
    else:
        show(d)


@command
def ingest(
    paths: Annotated[list[str], Argument(help="Trace files, folders (searched "
                                         "recursively) or globs.")],
    store: StoreOpt = DEFAULT_STORE,
    jobs: Annotated[int | None, Option("--workers", "--jobs", "-j",
                                       help="Processes converting files, this one among them.",
                                       show_default="every core")] = None,
    force: Annotated[bool, Option(help="Replace traces already in the store.")] = False,
    strict: Annotated[bool, Option(help="Stop at the first file that fails.")] = False,
    job: Annotated[str | None, Option(help="The name of the job these traces belong "
                                      "to (the ranks of one run).")] = None,
    ray: RayOpt = None,
) -> None:
    """Convert traces into the store and build their dependency graphs.

    Reads Kineto (PyTorch profiler) JSON, Nsight Systems SQLite exports and the raw CUPTI
    records of `daydream collect`. A folder is searched for trace files; the files it skips
    are listed, and a folder without any trace is an error."""
    import os

    from daydream.base.runner import started_early
    from daydream.ingest.files import converted_beside, expand
    # where workers will convert some of the files, they start first, so that their imports
    # run beside this process's (the converters, the graph stage); where they would not (one
    # file, a folder of one, a big trace), none is started: its imports took a core from the
    # conversion (the 1M-event trace in a folder: 2.07-2.24 s against 1.79-1.88 s named)
    files = expand(paths)
    runner = (started_early(jobs or os.cpu_count(), ray, "daydream.traces:warm_worker")
              if converted_beside(files) else None)
    try:
        _ingest(paths, files, store, jobs, force, strict, job, ray, runner)
    finally:
        if runner is not None:
            runner.close()


def _ingest(paths: list[str], files: list[Path], store: Path, jobs: int | None, force: bool,
            strict: bool, job: str | None, ray: str | None, runner) -> None:
    import os

    from daydream import api
    from daydream.report import plural
    from daydream.traces import skipped
    left_out = skipped(paths)
    for path, why in left_out:
        print(f"skipped: {path}: {why}", file=sys.stderr)
    if not files:
        raise DaydreamError(f"no trace files in {', '.join(paths)} ({plural(len(left_out), 'file')}"
                            " skipped, listed above)" if left_out else
                            f"no trace files in {', '.join(paths)}")
    progress = None
    if sys.stderr.isatty() and len(files) > 1:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
        progress = Progress("[progress.description]{task.description}", BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), transient=True)
        progress.start()
        task = progress.add_task("ingesting", total=len(files))

    def tick(r) -> None:
        if progress is not None:
            progress.advance(task)
        if r.status == "failed":
            print(f"error: {r.error or r.path}", file=sys.stderr, flush=True)

    try:
        rep = api.ingest(files, store, jobs=jobs or os.cpu_count(), force=force,
                         strict=strict, job=job, on_progress=tick, ray=ray, runner=runner)
    finally:
        if progress is not None:
            progress.stop()
    for r in rep.results:
        if r.status != "failed":
            print(f"{r.trace_id}  {r.status:8s}  {r.path}")
    sys.stdout.flush()
    print(f"{plural(rep.count('ingested'), 'trace')} ingested, "
          f"{rep.count('exists')} already stored, {rep.count('failed')} failed -> {store}",
          file=sys.stderr, flush=True)
    if rep.rebuilt:
        print(f"note: {plural(rep.rebuilt, 'stored graph was', 'stored graphs were')} rebuilt: "
              "built by another version of daydream's graph rules", file=sys.stderr, flush=True)
    for msg in rep.unrebuilt.values():
        print(f"warning: stored trace {msg} (its graph was built by another version of "
              "daydream's graph rules, and these cannot build it: the trace stays stored, and "
              "predicting it gives this error)", file=sys.stderr, flush=True)
    if rep.failed:
        sys.exit(1)


@command(context_settings={"allow_extra_args": False})
def collect(
    command: Annotated[list[str], Argument(help="The job's command line, after --.",
                                           show_default=False)],
    out: Annotated[Path, Option("--out", "-o", help="The folder for the raw record "
                                "files (one per process).")] = Path("daydream-traces"),
    iterations: Annotated[int | None, Option(help="Iterations (optimizer steps) to "
                                             "collect.",
                                             show_default="until the job ends")]
    = None,
    warmup: Annotated[int, Option(help="Iterations to run uncollected first.")] = 0,
) -> None:
    """Run a training job under CUPTI collection (needs an NVIDIA GPU).

    The job's command line follows --, for example `daydream collect --out traces
    --iterations 20 -- python train.py`."""
    from daydream import api
    res = api.collect_command(command, out, iterations, warmup)
    from daydream.report import plural
    for f in res.files:
        print(f, flush=True)
    print(f"{plural(len(res.files), 'trace file')} -> {out}; then: daydream ingest {out}",
          file=sys.stderr, flush=True)
    if res.returncode:
        sys.exit(res.returncode)


@command
def info(
    trace: Annotated[str, Argument(help="A trace id (or unique prefix), trace file, job "
                                   "name or folder of rank traces.")],
    store: StoreOpt = DEFAULT_STORE,
    json: JsonOpt = False,
) -> None:
    """Print what a stored trace or job holds and what ingest had to repair or skip."""
    from daydream import api
    d = api.info(trace, store)
    if json:
        _json(d)
        return
    from daydream.store_views import print_info
    print_info(d)


@command
def sql(
    query: Annotated[str, Argument(help="SQL (DuckDB dialect) over the graph tables, "
                                   "views and activity tables; '-' reads it from stdin. "
                                   "See docs/sql.md.")],
    store: StoreOpt = DEFAULT_STORE,
    fmt: Annotated[str, Option("--format", "-f",
                               help="Output format: table, csv, json or parquet.")]
    = "table",
    out: Annotated[Path | None, Option("--out", "-o", help="Write the result to this "
                                       "file (needed for parquet).")] = None,
) -> None:
    """Query the store with SQL, read-only (kernel_timeline, layer_time, iteration_time...)."""
    if query == "-":
        query = sys.stdin.read()
    from daydream.graphstore import sql_query
    from daydream.text_table import fit_rows, width
    w = width()  # a terminal's or COLUMNS: fitted as every other table; a pipe: whole
    text = sql_query.query(store, query, fmt, out, fit=None if w is None or out is not None
                           else lambda h, n, rows: fit_rows(h, n, rows, w))
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        print(text, file=sys.stderr, flush=True)


OptOpt = Annotated[list[str] | None, Option(
    "--opt", help="An optimization to predict, e.g. amp, fused_adam, dataloader(workers=4) or "
    "scale(select=\"...\", factor=0.5). Chain optimizations with + (amp+fused_adam) for one "
    "prediction of them together; repeat --opt for separate predictions. See `daydream "
    "opts`.")]


@command
def predict(
    trace: Annotated[str | None, Argument(help="A trace file (ingested if new), stored "
                                          "trace id, job name or folder of rank traces "
                                          "(a job); or --all.")] = None,
    store: StoreOpt = DEFAULT_STORE,
    opt: OptOpt = None,
    json: JsonOpt = False,
    fmt: FormatOpt = "table",
    timeline: Annotated[Path | None, Option(help="Write the measured, replayed and "
                                            "predicted schedules into one Chrome trace "
                                            "for Perfetto.")] = None,
    timeline_iterations: Annotated[str | None, Option(
        help="With --timeline: only these iterations, N or A-B (each schedule's own "
        "extent of them).")] = None,
    timeline_window: Annotated[str | None, Option(
        help="With --timeline: only the tasks overlapping START-END, in ms from the trace's "
        "start, e.g. 100-250.")] = None,
    plot: Annotated[Path | None, Option(help="Draw the phase breakdown and one "
                                        "iteration's timeline, before and after, as a "
                                        "PNG.")] = None,
    param_bytes: ParamBytesOpt = None,
    all_: Annotated[bool, Option("--all", help="Predict every stored trace (see "
                                 "--where) with every --opt, into the store's "
                                 "prediction table.")] = False,
    where: Annotated[str | None, Option(help="With --all: an SQL condition on the "
                                        "trace table, e.g. \"job = 'nightly'\".")]
    = None,
    workers: WorkersOpt = None,
    ray: RayOpt = None,
    force: Annotated[bool, Option(help="With --all: recompute the pairs already "
                                  "predicted.")] = False,
    top: Annotated[int, Option(help="With --all: the rows to print, best gain first "
                               "(0 for all).")] = 30,
) -> None:
    """Predict the iteration time with each --opt, or replay the trace without one.

    Prints the measured, replayed and predicted time per iteration, what the replay rests
    on, the phases before and after, the critical path and the unit load. With --all, every
    stored trace is predicted with every --opt, printed by gain and kept for `daydream
    sql`."""
    fmt = _fmt(json, fmt)
    if all_ or trace is None:
        if not all_:
            raise DaydreamError("give a TRACE, or --all for every stored trace")
        if trace is not None:
            raise DaydreamError("give either a TRACE or --all, not both")
        _predict_all(store, opt or [], where, workers, ray, force, top, fmt, param_bytes)
        return
    if where is not None:
        raise DaydreamError("--where selects traces for --all")
    from daydream import api
    if timeline is None and (timeline_iterations or timeline_window):
        raise DaydreamError("--timeline-iterations and --timeline-window go with "
                            "--timeline FILE")
    from daydream.report import busy
    with busy(f"predicting {', '.join(opt)}" if opt else "replaying"):
        results = api.predictions(trace, store, opt or [], timeline=timeline, plot=plot,
                                  param_bytes=param_bytes,
                                  timeline_iterations=timeline_iterations,
                                  timeline_window=timeline_window)
    from daydream import report
    if fmt == "json":
        _json(results[0].as_dict() if len(results) == 1 else [r.as_dict() for r in results])
    else:
        _emit(fmt, results, report.prediction_csv, report.print_prediction)


def _predict_all(store: Path, opts: list[str], where: str | None, workers: int | None,
                 ray: str | None, force: bool, top: int, fmt: str,
                 param_bytes: int | None) -> None:
    from daydream.base.runner import started_early
    # the workers start first, so that their imports run beside this process's
    runner = started_early(workers, ray, "daydream.fleet:warm_worker")
    try:
        from daydream import fleet
        from daydream.report import fleet_progress

        with fleet_progress(enabled=sys.stderr.isatty() and fmt == "table") as (plan, tick):
            def on_pair(r) -> None:
                tick()
                if r.status == "failed":
                    error(r.error or f"{r.trace_id} {r.spec}")

            rep = fleet.predict_all(store, opts, where=where, workers=workers, ray=ray,
                                    force=force, param_bytes=param_bytes, on_progress=on_pair,
                                    on_plan=plan, runner=runner)
    finally:
        if runner is not None:
            runner.close()
    from daydream.report import fleet_table, plural, print_fleet
    from daydream.text_table import to_csv

    if fmt == "json":
        _json(rep.table.to_pylist())
    elif fmt == "csv":
        sys.stdout.write(to_csv([fleet_table(rep.table, 0)[0]]))
        sys.stdout.flush()
    else:
        print_fleet(rep.table, top)
    print(f"{plural(len(rep.traces), 'trace')} x {plural(len(rep.specs), 'spec')}: "
          f"{rep.count('predicted')} predicted, {rep.count('stored')} already stored, "
          f"{rep.count('failed')} failed -> table prediction in {store}", file=sys.stderr,
          flush=True)
    if rep.rebuilt:
        print(f"note: {plural(rep.rebuilt, 'graph was', 'graphs were')} rebuilt first: built "
              "by another version of daydream's graph rules", file=sys.stderr, flush=True)
    if rep.without_graph:
        print(f"note: {plural(rep.without_graph, 'stored trace has', 'stored traces have')}"
              " no graph (an interrupted ingest?) and were left out; `daydream ingest` "
              "over any file builds them", file=sys.stderr, flush=True)
    if rep.failed:
        sys.exit(1)


@command
def advise(
    trace: TargetArg,
    store: StoreOpt = DEFAULT_STORE,
    json: JsonOpt = False,
    fmt: FormatOpt = "table",
    param_bytes: ParamBytesOpt = None,
) -> None:
    """Say what to try first: where the time goes, and every optimization ranked by gain.

    The iteration's time is split into GPU work, CPU work, data loading, launch overhead and
    waiting on communication (from the critical path, the phases and the slack). Then every
    registered optimization that applies is predicted with its default parameters and ranked
    by its speedup, with its interval; those that do not apply are listed with the reason."""
    from daydream import advise as adv
    from daydream.report import fleet_progress
    fmt = _fmt(json, fmt)
    with fleet_progress(enabled=sys.stderr.isatty(), description="advising") as (plan, tick):
        d = adv.advise(trace, store, param_bytes=param_bytes, on_plan=plan, on_step=tick)
    _emit(fmt, d, adv.to_csv_text, adv.print_advice)


@command
def compare(
    trace: Annotated[str, Argument(help="The trace of the unmodified job.")],
    after: Annotated[str, Argument(help="A trace of the job recorded after making the "
                                   "change.")],
    opt: Annotated[str, Option("--opt", help="The optimization that was made (chain "
                               "several with +).")],
    store: StoreOpt = DEFAULT_STORE,
    json: JsonOpt = False,
    fmt: FormatOpt = "table",
    param_bytes: ParamBytesOpt = None,
    force: Annotated[bool, Option(help="Compare two traces that do not look like one job "
                                  "(marked so in the output).")] = False,
) -> None:
    """Check a prediction against the run recorded after making the change.

    Predicts TRACE with --opt and sets it beside the measured AFTER trace: the steady-state
    step, each iteration, each phase, layer and kernel class, predicted against measured,
    so that you see where the prediction missed. Two traces that do not look like one job
    (too few of the names of their host work shared, or of their host tasks per iteration
    alike) are not compared: the error gives the figures, their floors and the names that
    differ most; --force compares them anyway, with a warning."""
    from daydream import compare as cmp
    fmt = _fmt(json, fmt)
    from daydream.report import busy
    with busy(f"predicting {opt} and replaying the trace after"):
        d = cmp.compare(trace, opt, after, store, param_bytes=param_bytes, force=force)
    if not d["same_job"]["ok"]:  # forced: on stderr, whatever the format
        cmp.warn(f"{d['same_job']['why']}; compared anyway (--force): the figures are "
                 "probably meaningless")
    _emit(fmt, d, cmp.to_csv_text, cmp.print_comparison)


@command
def report(
    trace: TargetArg,
    out: Annotated[Path, Option("--out", "-o", help="The HTML file to write.")]
    = Path("report.html"),
    opt: OptOpt = None,
    store: StoreOpt = DEFAULT_STORE,
    param_bytes: ParamBytesOpt = None,
) -> None:
    """Write one self-contained HTML report of a replay and its predictions.

    The file needs no network: the prediction table, the phase breakdown, one iteration's
    timeline before and after, the critical path, the top kernels, the top operators by GPU
    and by CPU time, the top layers, the notes and the gates, with styles and pictures inside
    it."""
    from daydream import html
    from daydream.report import fleet_progress
    with fleet_progress(enabled=sys.stderr.isatty(), description="reporting") as (plan, tick):
        path = html.write_report(trace, out, opt or [], store, param_bytes=param_bytes,
                                 on_plan=plan, on_step=tick)
    print(f"report written to {path}", file=sys.stderr, flush=True)


@command
def jobs(store: StoreOpt = DEFAULT_STORE, json: JsonOpt = False,
         fmt: FormatOpt = "table") -> None:
    """List the jobs in the store: the traces of the ranks of one run.

    `daydream predict JOB` replays a job's ranks together; a job that lacks ranks of its
    world size says which."""
    fmt = _fmt(json, fmt)
    from daydream import api
    d = api.jobs(store)
    if fmt == "json":
        _json(d)
        return
    from daydream.store_views import jobs_table
    from daydream.text_table import render, to_csv, width
    t = jobs_table(d)
    sys.stdout.write(to_csv([t]) if fmt == "csv" else render(t, width()))
    sys.stdout.flush()


@command
def opts(json: JsonOpt = False) -> None:
    """List the optimizations a prediction can apply (--opt NAME(params), chained with +)."""
    from daydream.transforms.catalog import listing
    items = listing()
    if json:
        _json(items)
        return
    from daydream.text_table import paragraph, width
    w = width()
    for o in items:
        print(o["signature"])
        print("    " + paragraph(o["summary"], w and w - 4, "    "))
    sys.stdout.flush()


def __getattr__(name: str):
    """``daydream.cli.app``: the typer app of these commands (for tests and typer's tools)."""
    if name == "app":
        from daydream.commandline import typer_app
        return typer_app()
    raise AttributeError(f"module 'daydream.cli' has no attribute {name!r}")
