"""The ``daydream`` command: only commands and their options; the work is in daydream.api.

Library code raises ``DaydreamError``; ``main`` prints ``error: ...`` and exits 1, never a
traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import orjson
import typer

from daydream import api
from ingest.errors import DaydreamError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Predict how much faster a training iteration would be with an "
                       "optimization, from one profile of the unmodified job.")

StoreOpt = Annotated[Path, typer.Option("--store", help="Store folder.", show_default=True)]
RayOpt = Annotated[str | None, typer.Option("--ray", help="Run the work as Ray tasks: 'auto' "
                                            "(the running cluster, else a local one) or the "
                                            "cluster's address. See docs/fleets.md.")]


def _err(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)


@app.command()
def ingest(
    paths: Annotated[list[str], typer.Argument(help="Trace files, folders (searched "
                                               "recursively) or globs.")],
    store: StoreOpt = api.DEFAULT_STORE,
    jobs: Annotated[int, typer.Option("--workers", "--jobs", "-j", help="Worker processes "
                                      "converting files (default: all cores).")] = 0,
    force: Annotated[bool, typer.Option(help="Replace traces already in the store.")] = False,
    strict: Annotated[bool, typer.Option(help="Stop at the first file that fails.")] = False,
    job: Annotated[str | None, typer.Option(help="Name of the job these traces belong "
                                            "to (one run's ranks).")] = None,
    ray: RayOpt = None,
) -> None:
    """Convert traces (Kineto/PyTorch profiler JSON, Nsight Systems SQLite, raw CUPTI records
    from `daydream collect`) into the store and build their dependency graphs."""
    files = api.expand(paths)
    show = sys.stderr.isatty() and len(files) > 1
    progress = None
    if show:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
        progress = Progress("[progress.description]{task.description}", BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), transient=True)
        progress.start()
        task = progress.add_task("ingesting", total=len(files))

    def tick(r) -> None:
        if progress is not None:
            progress.advance(task)
        if r.status == "failed":
            _err(r.error or r.path)

    try:
        rep = api.ingest(files, store, jobs=jobs or os.cpu_count(), force=force,
                         strict=strict, job=job, on_progress=tick, ray=ray)
    finally:
        if progress is not None:
            progress.stop()
    for r in rep.results:
        if r.status != "failed":
            typer.echo(f"{r.trace_id}  {r.status:8s}  {r.path}")
    typer.echo(f"{rep.count('ingested')} ingested, {rep.count('exists')} already stored, "
               f"{rep.count('failed')} failed -> {store}", err=True)
    if rep.failed:
        raise typer.Exit(1)


@app.command(context_settings={"allow_extra_args": False})
def collect(
    command: Annotated[list[str], typer.Argument(help="The job's command line, after --.",
                                                 show_default=False)],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the raw record files "
                                      "(one per process).")] = Path("daydream-traces"),
    iterations: Annotated[int | None, typer.Option(help="Iterations (optimizer steps) to "
                                                   "collect; default: until the job ends.")]
    = None,
    warmup: Annotated[int, typer.Option(help="Iterations to run uncollected first.")] = 0,
) -> None:
    """Run a training job under CUPTI collection (needs an NVIDIA GPU):
    daydream collect [--out DIR] [--iterations N] -- python train.py ..."""
    res = api.collect_command(command, out, iterations, warmup)
    for f in res.files:
        typer.echo(str(f))
    typer.echo(f"{len(res.files)} trace file(s) -> {out}; then: daydream ingest {out}", err=True)
    if res.returncode:
        raise typer.Exit(res.returncode)


@app.command()
def info(
    trace: Annotated[str, typer.Argument(help="Trace id (or unique prefix) or trace file.")],
    store: StoreOpt = api.DEFAULT_STORE,
    json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print what a stored trace holds and what ingest had to repair or skip."""
    d = api.info(trace, store)
    if json:
        typer.echo(orjson.dumps(d, option=orjson.OPT_INDENT_2).decode())
        return
    typer.echo(f"trace    {d['trace_id']}")
    typer.echo(f"file     {d['file']}")
    typer.echo(f"format   {d['source_format']} (version {d['source_version']})")
    typer.echo(f"events   {d['events']}")
    if d["start_ns"] is not None:
        typer.echo(f"span     {(d['end_ns'] - d['start_ns']) / 1e6:.3f} ms")
    if d["rank"] is not None:
        typer.echo(f"rank     {d['rank']} of {d['world_size']}")
    if d["job"]:
        typer.echo(f"job      {d['job']}")
    for dev in d["devices"] or []:
        typer.echo(f"device   {dev.get('id', '?')}: {dev.get('name', '?')}")
    typer.echo("tables   " + ", ".join(f"{k} {v}" for k, v in d["tables"].items()))
    if d.get("slack"):
        # what the graph does not explain, per kind, over all iterations (positive slack
        # beyond each edge's physical latency; see docs/graph.md)
        by: dict[str, list[float]] = {}
        for r in d["slack"]:
            by.setdefault(r["kind"], [0, 0.0])
            by[r["kind"]][0] += r["edges"]
            by[r["kind"]][1] += r["slack_ns"] / 1e6
        typer.echo(f"slack    over {d['iterations']} iterations (ms, summed over edges): " +
                   ", ".join(f"{k} {v[1]:.3f} ({v[0]} edges)" for k, v in
                             sorted(by.items(), key=lambda kv: -kv[1][1])))
    if d["stats"]:
        typer.echo("ingest notes:")
        for s in d["stats"]:
            detail = f"  ({s['detail']})" if s["detail"] else ""
            typer.echo(f"  {s['severity']:7s} {s['name']}: {s['count']}{detail}")


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="SQL (DuckDB dialect) over the graph tables, "
                                         "views and activity tables; '-' reads it from stdin. "
                                         "See docs/sql.md.")],
    store: StoreOpt = api.DEFAULT_STORE,
    fmt: Annotated[str, typer.Option("--format", "-f",
                                     help="table, csv, json or parquet.")] = "table",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the result to FILE "
                                             "(needed for parquet).")] = None,
) -> None:
    """Query the store with SQL (read-only): kernel_timeline, layer_time, iteration_time..."""
    if query == "-":
        query = sys.stdin.read()
    text = api.sql(query, store, fmt=fmt, out=out)
    if out is None:
        typer.echo(text, nl=False)
    else:
        typer.echo(text, err=True)


@app.command()
def predict(
    trace: Annotated[str | None, typer.Argument(help="Trace file (ingested if new), stored "
                                                "trace id, job name or folder of rank traces "
                                                "(a job); or --all.")] = None,
    store: StoreOpt = api.DEFAULT_STORE,
    opt: Annotated[list[str] | None, typer.Option("--opt", help="Optimization to predict, "
                                                  "e.g. amp, fused_adam, dataloader(workers=4),"
                                                  " scale(select=\"...\", factor=0.5); "
                                                  "repeat or chain with +. See `daydream opts`.")]
    = None,
    json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    timeline: Annotated[Path | None, typer.Option(help="Write the measured and simulated "
                                                  "schedules as a Chrome trace (Perfetto).")]
    = None,
    plot: Annotated[Path | None, typer.Option(help="Draw the phase breakdown and one "
                                              "iteration's timeline, before and after, as a "
                                              "PNG.")] = None,
    param_bytes: Annotated[int | None, typer.Option(help="The model's parameter bytes, for "
                                                    "ddp(...) where the trace does not tell.")]
    = None,
    all_: Annotated[bool, typer.Option("--all", help="Every stored trace (see --where) "
                                       "against every --opt; results into the store's "
                                       "prediction table.")] = False,
    where: Annotated[str | None, typer.Option(help="With --all: SQL predicate over the trace "
                                              "table, e.g. \"job = 'nightly'\".")] = None,
    workers: Annotated[int, typer.Option(help="With --all: worker processes (default: all "
                                         "cores).")] = 0,
    ray: RayOpt = None,
    force: Annotated[bool, typer.Option(help="With --all: recompute pairs already "
                                        "predicted.")] = False,
    top: Annotated[int, typer.Option(help="With --all: rows to print (best gain first); "
                                     "0 for all.")] = 30,
) -> None:
    """Predict the iteration time with --opt (or, without, replay the trace): measured,
    baseline and predicted time per iteration, phases, critical path, unit load. With --all,
    every stored trace against every --opt, printed by gain and kept for `daydream sql`."""
    if all_ or trace is None:
        if not all_:
            raise DaydreamError("give a TRACE, or --all for every stored trace")
        if trace is not None:
            raise DaydreamError("give either a TRACE or --all, not both")
        _predict_all(store, opt or [], where, workers, ray, force, top, json, param_bytes)
        return
    if where is not None:
        raise DaydreamError("--where selects traces for --all")
    d = api.predict(trace, store, opts=opt or None, timeline=timeline, plot=plot,
                    param_bytes=param_bytes)
    if json:
        typer.echo(orjson.dumps(d, option=orjson.OPT_INDENT_2).decode())
        return
    from daydream.report import print_prediction
    print_prediction(d)


def _predict_all(store: Path, opts: list[str], where: str | None, workers: int,
                 ray: str | None, force: bool, top: int, json: bool,
                 param_bytes: int | None) -> None:
    from daydream import fleet
    from daydream.report import fleet_progress, print_fleet

    with fleet_progress(enabled=sys.stderr.isatty() and not json) as (plan, tick):
        def on_pair(r) -> None:
            tick()
            if r.status == "failed":
                _err(r.error or f"{r.trace_id} {r.spec}")

        rep = fleet.predict_all(store, opts, where=where, workers=workers or None, ray=ray,
                                force=force, param_bytes=param_bytes, on_progress=on_pair,
                                on_plan=plan)
    if json:
        typer.echo(orjson.dumps(rep.table.to_pylist(), option=orjson.OPT_INDENT_2,
                                default=str).decode())
    else:
        print_fleet(rep.table, top)
    typer.echo(f"{len(rep.traces)} traces x {len(rep.specs)} specs: "
               f"{rep.count('predicted')} predicted, {rep.count('stored')} already stored, "
               f"{rep.count('failed')} failed -> table prediction in {store}", err=True)
    if rep.without_graph:
        typer.echo(f"note: {rep.without_graph} stored trace(s) have no graph (an interrupted "
                   "ingest?) and were left out; `daydream ingest` over any file builds them",
                   err=True)
    if rep.failed:
        raise typer.Exit(1)


@app.command()
def jobs(store: StoreOpt = api.DEFAULT_STORE,
         json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the jobs in the store: the traces of all ranks of one run (predict JOB replays
    them together)."""
    d = api.jobs(store)
    if json:
        typer.echo(orjson.dumps(d, option=orjson.OPT_INDENT_2).decode())
        return
    for name, ms in d.items():
        typer.echo(f"{name}  {len(ms)} ranks  " + " ".join(m["trace_id"] for m in ms))


@app.command()
def opts(json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the optimizations a prediction can apply (--opt NAME(params), chained with +)."""
    from transforms import list_opts
    items = list_opts()
    if json:
        typer.echo(orjson.dumps(items, option=orjson.OPT_INDENT_2, default=str).decode())
        return
    for o in items:
        typer.echo(f"{o['signature']}\n    {o['summary']}")


def main() -> None:
    try:
        rc = app(standalone_mode=False)
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except DaydreamError as e:
        _err(str(e))
        sys.exit(1)
    except KeyboardInterrupt:
        _err("interrupted; the store is unchanged for traces not yet committed")
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # usage errors from typer's bundled click, and the like
        from typer._click import exceptions as cx
        if isinstance(e, cx.ClickException):
            e.show()
            sys.exit(e.exit_code if e.exit_code else 2)
        abort = getattr(cx, "Abort", None)  # not in every typer's bundled click
        if abort is not None and isinstance(e, abort):
            sys.exit(1)
        raise


if __name__ == "__main__":
    main()
