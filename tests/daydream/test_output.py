"""What ``daydream`` prints, as a user reads it: tables whole in a pipe and within 80 columns,
what a prediction rests on, JSON and CSV for programs, ``--opt`` repeated as separate
predictions, notes in ms, no ``None``, plurals, help that reads as sentences, defaults as they
are, one timeline file, and a README that lists every command."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from daydream import api
from daydream.base.errors import DaydreamError
from daydream.cli import app
from tests.conftest import DATA, ROOT

RESNET = DATA / "kineto" / "resnet50_v100_nw0_run1.json.gz"
TOY = DATA / "kineto" / "mi250_toy_train_rocm.json.gz"
WHOLE = DATA / "kineto" / "alexnet_fwd_a100.json.gz"  # no iteration markers


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("output") / "store"
    api.ingest([RESNET, TOY, WHOLE], root, jobs=1, strict=True)
    return root


def cli(*args: str, columns: int | None = None):
    """The CLI in this process, its stdout a pipe; COLUMNS set as a terminal of that width
    sets it."""
    env = {"COLUMNS": str(columns) if columns else ""}
    r = CliRunner().invoke(app, [str(a) for a in args], env=env, catch_exceptions=False)
    return r


def test_predict_into_a_pipe_prints_whole_headers_and_labels(store):
    r = cli("predict", RESNET, "--store", store, "--opt", "amp")
    assert r.exit_code == 0, r.stderr
    out = r.stdout
    assert "…" not in out and "None" not in out
    head = next(x for x in out.splitlines() if x.startswith("iteration"))
    for h in ("label", "measured ms", "replayed ms", "replay error", "explained ms",
              "predicted ms", "speedup"):
        assert h in head
    assert "ProfilerStep#10" in out and "steady state" in out


def test_predict_fits_80_columns_and_shows_what_it_rests_on(store):
    d = api.predict(str(RESNET), store, opts=["amp"])
    out = cli("predict", RESNET, "--store", store, "--opt", "amp", columns=80).stdout
    assert max(len(x) for x in out.splitlines()) <= 80
    assert "…" not in out and "ProfilerStep#10" in out
    for word in ("measured", "replayed", "explained", "predicted", "speedup", "interval"):
        assert word in out
    # the pipeline's result fields a prediction rests on, each on the screen
    flat = " ".join(out.split())
    assert f"{d.measured_ms:.3f} ms measured" in flat
    assert f"median {d.measured_median_ms:.3f} ms" in flat
    assert f"mean {d.measured_mean_ms:.3f} ms" in flat
    lo, hi = d.measured_spread_ms
    assert f"fastest {lo:.3f} ms, slowest {hi:.3f} ms" in flat
    assert f"{d.explained_ms:.3f} ms" in flat
    assert f"{d.explained_no_inferred_ms:.3f} ms without the inferred edges" in flat
    a, b = d.predicted_interval_ms
    assert f"{a:.3f}-{b:.3f}" in flat
    for kind in d.trace.slack_ms:
        assert kind in flat
    for kind, n in d.trace.inferred_edges.items():
        assert f"{kind} {n}" in flat


def test_json_and_csv_for_programs(store):
    d = json.loads(cli("predict", RESNET, "--store", store, "--opt", "amp", "--json").stdout)
    assert d["opts"] == "amp" and d["predicted_ms"] > 0
    rows = list(csv.DictReader(io.StringIO(
        cli("predict", RESNET, "--store", store, "--opt", "amp", "--format", "csv").stdout)))
    assert len(rows) == 1 and rows[0]["spec"] == "amp"
    assert float(rows[0]["predicted_ms"]) == pytest.approx(d["predicted_ms"])
    assert float(rows[0]["predicted_low_ms"]) == pytest.approx(d["predicted_interval_ms"][0])
    assert float(rows[0]["speedup"]) == pytest.approx(d["speedup"])


def test_repeated_opt_is_separate_predictions_and_plus_chains(store):
    both = json.loads(cli("predict", TOY, "--store", store, "--opt", "amp", "--opt",
                          "cuda_graphs", "--json").stdout)
    assert [x["opts"] for x in both] == ["amp", "cuda_graphs"]
    for x in both:
        one = api.predict(str(TOY), store, opts=[x["opts"]])
        assert x["predicted_ms"] == one.predicted_ms
    chained = json.loads(cli("predict", TOY, "--store", store, "--opt", "amp+cuda_graphs",
                             "--json").stdout)
    assert chained["opts"] == "amp+cuda_graphs"
    text = cli("predict", TOY, "--store", store, "--opt", "amp", "--opt", "cuda_graphs").stdout
    table = text[text.index("Predictions"):]
    assert "(1)  amp" in table and "(2)  cuda_graphs" in table
    with pytest.raises(DaydreamError, match="chain optimizations with"):
        api.predict(str(TOY), store, opts=["amp", "cuda_graphs"])
    assert [x.spec for x in api.predictions(str(TOY), store, ["amp", "cuda_graphs"])] == \
        ["amp", "cuda_graphs"]


def test_no_none_and_no_zero_length_parts_in_the_critical_path(store):
    d = api.predict(str(RESNET), store)
    zero = [r["kind"] for r in d.trace.critical_path["by_kind"] if r["ns"] == 0]
    assert zero  # the trace has parts of no length (delay: thread)
    out = cli("predict", RESNET, "--store", store).stdout
    cp = out[out.index("Critical path"):out.index("Unit load")]
    for k in zero:
        assert k not in cp
    assert "(no layer)" in cp and "None" not in out


def test_notes_are_in_ms(store):
    """Every registered optimization's notes on a real trace: times in ms (or us), never a
    raw count of nanoseconds."""
    from daydream.advise import candidates
    raw = re.compile(r"\d{4,} ns\b|\(ns\)")
    notes = []
    for spec in candidates()[0]:
        try:
            notes += api.predict(str(RESNET), store, opts=[spec]).notes
        except DaydreamError:
            pass  # does not apply to a single-GPU trace
    assert [n for n in notes if raw.search(n)] == []
    assert any(n.startswith("fusion:") and " ms" in n for n in notes)


def test_a_trace_without_markers_says_how_its_iterations_were_found(store):
    d = api.predict(str(WHOLE), store)
    assert d.iterations_from == "whole_trace"
    out = cli("predict", WHOLE, "--store", store).stdout
    assert "(whole trace)" in out
    assert "the whole trace is one iteration: it has no iteration markers" in " ".join(
        out.split())
    assert api.predict(str(RESNET), store).iterations_from == "ProfilerStep"


def test_one_timeline_file_holds_measured_replayed_and_predicted(store, tmp_path):
    tl = tmp_path / "t.json"
    r = cli("predict", TOY, "--store", store, "--opt", "amp", "--opt", "cuda_graphs",
            "--timeline", tl)
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]  # no .predicted.json
    ev = json.loads(tl.read_text())["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(procs.values()) == ["measured", "predicted: amp", "predicted: cuda_graphs",
                                      "replayed (baseline)"]
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev
              if e["ph"] == "M" and e["name"] == "thread_name"}
    busy = {(e["pid"], e["tid"]) for e in ev if e["ph"] == "X"}
    assert set(tracks) == busy  # no empty track (the origin marker's unit)
    assert "origin" not in tracks.values()
    for pid in procs:
        assert any(p == pid for p, _ in busy)


def test_plurals_and_the_ingest_summary(tmp_path):
    r = cli("ingest", TOY, "--store", tmp_path / "s", "-j", "1")
    assert r.exit_code == 0
    assert "1 trace ingested, 0 already stored, 0 failed" in r.stderr
    from daydream.report import plural
    assert plural(1, "rank") == "1 rank" and plural(2, "rank") == "2 ranks"


def test_predict_all_names_whole_files_and_counts_right(tmp_path):
    from tests.daydream.variants import make_variants
    files = make_variants([TOY], 3, tmp_path / "in")
    root = tmp_path / "s"
    api.ingest(files, root, jobs=1, strict=True)
    r = cli("predict", "--all", "--store", root, "--opt", "amp", "--workers", "1")
    assert r.exit_code == 0, r.stderr
    for f in files:  # names that share their first 20 characters, each printed whole
        assert f.name in r.stdout
    assert "3 traces x 1 spec: 3 predicted" in r.stderr
    r = cli("predict", "--all", "--store", root, "--opt", "amp", "--workers", "1",
            "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert sorted(r["file"].rsplit("/", 1)[-1] for r in rows) == sorted(f.name for f in files)


def test_a_failed_pair_names_its_optimization_once(tmp_path):
    root = tmp_path / "s"
    api.ingest([TOY], root, jobs=1, strict=True)
    r = cli("predict", "--all", "--store", root, "--opt", "no_straggler", "--workers", "1")
    assert r.exit_code == 1
    err = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert err and all("no_straggler: no_straggler" not in x for x in err)
    assert "no_straggler: needs a job" in err[0]


def test_help_reads_as_sentences_and_defaults_are_what_they_are():
    r = cli("--help", columns=250)
    listing = r.stdout[r.stdout.index("Commands"):]
    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    for name in names:
        line = next(x for x in listing.splitlines() if re.match(rf"\W*{name}\s", x))
        summary = line.split(name, 1)[1].strip(" │")
        assert summary.endswith("."), summary  # a whole sentence on one line
    for name in names:  # each paragraph of a command's help is whole sentences
        h = cli(name, "--help", columns=600).stdout.splitlines()
        top = h[next(k for k, x in enumerate(h) if "Usage:" in x) + 1:
                next(k for k, x in enumerate(h) if x.startswith("╭"))]
        paras = [x.strip() for x in top if x.strip()]
        assert paras and all(p.endswith(".") for p in paras), (name, paras)
    for cmd in ("predict", "ingest"):
        h = " ".join(cli(cmd, "--help", columns=250).stdout.split())
        assert "[default: 0]" not in h
        assert "[default: (every core)]" in h


def test_readme_names_every_command():
    readme = (ROOT / "README.md").read_text()
    use = readme[readme.index("## Use"):readme.index("## Supported traces")]
    for c in app.registered_commands:
        name = c.name or c.callback.__name__
        assert f"daydream {name}" in use, name
        assert f"- `{name}`" in use, name
    assert "COLUMNS" not in use or "pipe" in use


def test_the_cli_starts_without_the_simulator_or_the_collector():
    """`daydream sql` and `daydream ingest` start without the prediction pipeline's compiled
    core and the collector (imported by the commands that use them): importing them cost
    `daydream sql` 1.4 s of its 1.9 s."""
    import subprocess
    import sys
    code = ("import sys, daydream.cli, daydream.api; "
            "print(sorted(m for m in ('numba', 'daydream.simulate._core', 'daydream.collect.api', "
            "'daydream.pipeline', 'daydream.transforms') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "[]"
    import daydream  # the public functions are still there, imported on first use
    from daydream import api
    assert callable(daydream.predict) and callable(api.collect) and callable(api.ingest)
    # the stages own their names: importing one never turns a public function into it
    import daydream.collect.cli  # noqa: F401
    import daydream.ingest.store  # noqa: F401
    assert callable(daydream.predict) and callable(daydream.sql) and callable(daydream.info)


# `daydream` with every command line read by the typer app (daydream/commandline.py's parse
# not asked)
TYPER_ONLY = ("import sys; from daydream.commandline import main; sys.argv[0] = 'daydream'; "
              "main(fast=False)")


def _both(args: list[str]) -> tuple:
    """(exit code, stdout, stderr) of ARGS through daydream/__main__.py (``python -m
    daydream``), and through the typer app alone."""
    import subprocess
    import sys
    fast = subprocess.run([sys.executable, "-m", "daydream", *args], capture_output=True,
                          text=True, cwd=ROOT)
    typed = subprocess.run([sys.executable, "-c", TYPER_ONLY, *args], capture_output=True,
                           text=True, cwd=ROOT)
    return (fast.returncode, fast.stdout, fast.stderr), (typed.returncode, typed.stdout,
                                                         typed.stderr)


def _loaded_after(args: list[str], heavy: tuple[str, ...]) -> list[str]:
    """The modules of HEAVY that ``daydream ARGS`` (through daydream/__main__.py) imports."""
    import subprocess
    import sys
    code = (f"import sys, runpy; sys.argv = ['daydream', *{args!r}]; "
            "runpy.run_module('daydream', run_name='__main__'); "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return eval(p.stdout.strip().splitlines()[-1])


def test_ingest_through_main_prints_and_stores_what_the_typer_command_does(tmp_path):
    """`python -m daydream ingest` ends its process without the interpreter's teardown
    (daydream/__main__.py): what it printed into a pipe, its exit status, and the store it
    leaves (activity tables, graph database, no staging left) are what the typer command
    gives, for a good file and for a bad one."""
    import subprocess
    import sys

    from daydream.graphstore import db
    from daydream.ingest.store import Store

    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    good = DATA / "kineto" / "event_sync_single_stream.json.gz"
    for files in ([good], [bad], [good, bad]):
        got = []
        for how, cmd in (("main", ["-m", "daydream"]),
                         ("typer", ["-c", TYPER_ONLY])):
            root = tmp_path / f"{how}-{len(files)}-{files[-1].stem}"
            p = subprocess.run([sys.executable, *cmd, "ingest", *map(str, files), "--store",
                                str(root), "-j", "1"], capture_output=True, text=True,
                               cwd=ROOT)
            st = Store(root)
            got.append((p.returncode, p.stdout.replace(str(root), "STORE"),
                        p.stderr.replace(str(root), "STORE"), st.trace_ids(),
                        db.trace_ids(root) if db.db_path(root).exists() else None,
                        sorted(q.name for q in st.staging.iterdir())))
        assert got[0] == got[1], files
        code, out, err, ids, graphs, staging = got[0]
        assert code == (0 if files == [good] else 1) and staging == []
        if files == [bad]:
            assert ids == [] and graphs is None and "ingested" not in out
        else:  # the good file's trace and its graph are stored
            assert len(ids) == 1 and graphs == ids and f"{ids[0]}  ingested" in out
        assert ("bad.json" in err) == (bad in files)


def test_predict_through_main_prints_and_stores_what_the_typer_command_does(tmp_path):
    """`python -m daydream predict` ends its process without the interpreter's teardown
    (daydream/__main__.py), as ingest does: what it printed into a pipe, its exit status and
    the predictions it stored are what the typer command gives, for a fleet (with a spawned
    worker), one trace, and commands that fail."""
    import shutil
    import subprocess
    import sys

    from daydream.graphstore import sql_query

    base = tmp_path / "base"
    files = [DATA / "kineto" / n for n in ("event_sync_single_stream.json.gz",
                                            "event_sync_multi_stream.json.gz")]
    p = subprocess.run([sys.executable, "-m", "daydream", "ingest", *map(str, files),
                        "--store", str(base), "-j", "1"], capture_output=True, text=True,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr
    one = p.stdout.split()[0]  # a stored trace id
    cases = {"all": ["--all", "--opt", "amp", "--opt", "cuda_graphs", "--workers", "2",
                     "--format", "csv"],
             "one": [one, "--opt", "amp", "--format", "csv"],
             "bad_spec": ["--all", "--opt", "no_such_optimization"],
             "no_graph": ["--all", "--opt", "amp", "--store", str(tmp_path / "empty")]}
    for case, args in cases.items():
        got = []
        for how, cmd in (("main", ["-m", "daydream"]), ("typer", ["-c", TYPER_ONLY])):
            root = tmp_path / f"{how}-{case}"
            shutil.copytree(base, root)
            store = [] if "--store" in args else ["--store", str(root)]
            p = subprocess.run([sys.executable, *cmd, "predict", *args, *store],
                               capture_output=True, text=True, cwd=ROOT)
            stored = sql_query.run_sql(root, "SELECT trace_id, spec, predicted_ms FROM "
                                       "prediction ORDER BY ALL").to_pylist() \
                if case == "all" else None
            got.append((p.returncode, p.stdout.replace(str(root), "STORE"),
                        p.stderr.replace(str(root), "STORE"), stored))
        assert got[0] == got[1], case
        code, out, err, stored = got[0]
        assert code == (0 if case in ("all", "one") else 1), (case, err)
        if case == "all":
            assert len(stored) == 4 and out.count("\n") >= 5
        elif case == "one":
            assert "amp" in out
        else:
            assert err.startswith("error: ") and "Traceback" not in err


def _sample(p) -> str:
    """A value of parameter P's type, as a command line gives it."""
    return {int: "3", Path: "some/path", str: "x y"}[p.type]


def test_plain_command_lines_are_read_as_typer_reads_them():
    """daydream/commandline.py reads plain command lines itself (``parse``) and leaves the
    rest to the typer app made from the same declarations (daydream/cli.py). For every
    parameter of every declared command, by each of its names, as --name VALUE and
    --name=VALUE, repeated where it may be, a negative whole number, an argument after --:
    ``parse`` takes the command line and gives the command the values typer gives it."""
    from daydream.commandline import declared, parse, typer_app

    seen = []
    typed = typer_app(call=lambda cmd, kw: seen.append(kw))
    lines = []
    for name, cmd in declared().items():
        def required(but=None, cmd=cmd):
            out = []
            for p in cmd.params:
                if p.required and p is not but:
                    out += [p.names[0], _sample(p)] if p.names else [_sample(p)]
            return out
        lines.append([name, *required()])
        for p in cmd.params:
            req = required(p)
            if not p.names:
                if p.many:
                    lines.append([name, *req, "--", "-a", "b"])
                elif not p.required:
                    lines.append([name, *req, _sample(p)])
                continue
            for o in p.names:
                if p.type is bool:
                    lines.append([name, *req, o])
                    continue
                lines.append([name, *req, o, _sample(p)])
                if o.startswith("--"):
                    lines.append([name, f"{o}={_sample(p)}", *req])
                if p.type is int:
                    lines.append([name, *req, o, "-7"])
                if p.many:
                    lines.append([name, *req, o, "a", o, "b"])
    assert len(lines) > 100
    for line in lines:
        got = parse(line)
        assert got is not None, line
        seen.clear()
        r = CliRunner().invoke(typed, line, catch_exceptions=False)
        assert r.exit_code == 0 and seen == [got[1]], (line, r.output, seen, got[1])
    # what parse leaves to typer: help, a --no- form, an option given twice, a short option
    # with its value attached, a whole number typer may read otherwise, an unknown command
    for line in (["sql", "--help"], ["ingest", "a", "--no-force"],
                 ["info", "x", "--json", "--json"], ["ingest", "a", "-j4"],
                 ["ingest", "a", "-j", "1_000"], ["sql", "q", "-f=csv"], ["--help"], [],
                 ["nope"]):
        assert parse(line) is None, line


def test_an_error_or_an_interrupt_ends_a_command_alike_both_ways(monkeypatch, capsys):
    """A command read by ``parse`` and one read by the typer app end alike: a DaydreamError
    as `error: ...` with status 1, an interrupt with status 130, no traceback."""
    from daydream import commandline

    for name, args, exc, code, msg in (
            ("jobs", ["jobs"], DaydreamError("no jobs"), 1, "error: no jobs\n"),
            ("jobs", ["jobs"], KeyboardInterrupt(), 130, "error: interrupted\n"),
            ("ingest", ["ingest", "t.json"], KeyboardInterrupt(), 130,
             "error: interrupted; the store is unchanged for traces not yet committed\n"),
            ("collect", ["collect", "--", "true"], KeyboardInterrupt(), 130,
             "error: interrupted\n")):
        cmd = commandline.declared()[name]

        def fail(exc=exc, **kw):
            raise exc
        fail.__name__ = cmd.fn.__name__  # the command's own name: what says it reads only
        monkeypatch.setattr(cmd, "fn", fail)
        for fast in (True, False):
            with pytest.raises(SystemExit) as e:
                commandline.main(args, fast=fast)
            assert (e.value.code, capsys.readouterr().err) == (code, msg), (name, fast)


def test_sql_answered_without_the_cli_framework_prints_what_the_cli_prints(store, tmp_path):
    """`python -m daydream sql` with plain arguments is read without typer
    (daydream/commandline.py); it must print what the typer app prints, and leave everything
    else (help, repeated or unknown options) to the typer app."""
    import subprocess
    import sys

    from daydream.commandline import parse

    q = "SELECT trace_id, count(*) AS n FROM task GROUP BY 1 ORDER BY 1"
    for args in (["sql", q, "--store", str(store)], ["sql", "--store=" + str(store), "-f",
                                                       "csv", q],
                 ["sql", "--format", "json", "--store", str(store), "--", q],
                 ["sql", "SELEC 1", "--store", str(store)],
                 ["sql", q, "--store", str(tmp_path / "none")]):
        assert parse(args) is not None
        fast, typed = _both(args)
        assert fast == typed, args
    out = tmp_path / "r.parquet"
    fast = subprocess.run([sys.executable, "-m", "daydream", "sql", q, "--store", str(store),
                           "-f", "parquet", "-o", str(out)], capture_output=True, text=True,
                          cwd=ROOT)
    assert fast.returncode == 0 and fast.stderr == f"3 rows -> {out}\n"
    # the fast path imports no CLI framework
    # nor Arrow (pyarrow and numpy, a third of a second): the rows come from DuckDB
    light = ("typer", "pydantic", "rich", "polars", "numba", "pyarrow", "numpy")
    for q in ("SELECT 1", "SELECT count(*) FROM task", "SELECT * FROM trace"):
        for f in ("table", "csv", "json"):
            assert _loaded_after(["sql", q, "--store", str(store), "-f", f], light) == [], q
    for args in (["sql", "--help"], ["sql", q, "--store", "a", "--store", "b"],
                 ["sql", q, "--nope"], ["sql"], ["sql", "a", "b"], ["sql", q, "-f=csv"],
                 ["sql", q, "--out"], ["info", "x", "--json", "--json"], ["info"],
                 ["opts", "x"], ["opts", "--json=1"], ["--help"], []):
        assert parse(args) is None, args


def test_opts_and_info_answered_without_the_cli_framework_print_what_the_cli_prints(store):
    """`daydream opts` and `daydream info` are read without typer too: the same output as
    the typer app, the errors included, and `opts` without importing any
    optimization (their listing comes from transforms/opts/catalog.json)."""
    from daydream.commandline import parse

    tid = api.open_store(store).trace_ids()[0]
    for args in (["opts"], ["opts", "--json"], ["info", tid, "--store", str(store)],
                 ["info", "--json", tid[:6], "--store", str(store)],
                 ["info", "nope", "--store", str(store)]):
        assert parse(args) is not None, args
        fast, typed = _both(args)
        assert fast == typed, args
        assert fast[0] == (1 if "nope" in args else 0) and fast[1 if fast[0] == 0 else 2]
    heavy = ("typer", "pydantic", "rich", "polars", "numba", "pyarrow", "duckdb", "numpy",
             "daydream.transforms.registry", "daydream.transforms.primitives")
    assert _loaded_after(["opts"], heavy) == []
    assert _loaded_after(["opts", "--json"], heavy) == []
    # info reads the store through DuckDB alone: no Arrow (pyarrow and numpy, a third of a
    # second), no polars
    light = tuple(m for m in heavy if m != "duckdb")
    assert _loaded_after(["info", tid, "--store", str(store)], light) == []
    assert _loaded_after(["info", "--json", tid, "--store", str(store)], light) == []


def test_info_prints_no_none_and_says_what_the_trace_does_not_record(store):
    """The alexnet trace has a rank but records no world size (its distributedInfo has
    none): `info` says so rather than printing "rank 0 of None"."""
    for path in (RESNET, TOY, WHOLE):
        d = api.info(str(path), store)
        out = cli("info", path, "--store", store).stdout
        assert "None" not in out, path
        rank = next((x for x in out.splitlines() if x.startswith("rank")), None)
        if d["rank"] is None:
            assert rank is None, path
        elif path == WHOLE:
            assert d["rank"] == 0 and d["world_size"] is None
            assert rank.split(None, 1)[1] == "0 (the trace records no world size)"
        else:
            assert rank.split(None, 1)[1] == f"{d['rank']} of {d['world_size']}"


def test_info_of_a_trace_without_a_graph_beside_one_with(tmp_path):
    """A store where one trace has its graph and the other does not yet (ingested by the
    stage alone): `info` gives the graph's facts for the first only, and for the second what
    its trace table says (its listed devices, no iteration count)."""
    from daydream.graphstore import load
    from daydream.ingest.batch_ingest import ingest
    from daydream.ingest.store import Store

    root = tmp_path / "s"
    rep = ingest([TOY, WHOLE], Store(root), jobs=1, strict=True)
    ids = {Path(r.path).name: r.trace_id for r in rep.results}
    load.load(root, ids[WHOLE.name])
    built, bare = api.info(ids[WHOLE.name], root), api.info(ids[TOY.name], root)
    assert built["iterations"] == 1 and built["iterations_from"] == "whole_trace"
    assert built["slack"] and [x["id"] for x in built["devices"]] == [0]
    assert bare["iterations"] is None and bare["slack"] == []
    assert bare["tables"]["kernel"] > 0
    out = cli("info", ids[TOY.name], "--store", root).stdout
    assert "iterations" not in out and "slack" not in out and "None" not in out


def test_gpu_idle_nothing_ended_gets_its_own_line():
    # hand-made results: 30 ms of unexplained GPU idle in a 100 ms step is named, 5 is not
    from dataclasses import replace

    from daydream import report
    from daydream.graphstore.prediction import IterationTimes, PredictionResult, TraceFacts
    it = IterationTimes(index=0, label=None, measured_ms=100.0, baseline_ms=100.0,
                        error_pct=0.0, used=True, note=None, explained_ms=None,
                        explained_no_inferred_ms=None)
    facts = TraceFacts(critical_path={}, unit_load=[], inferred_edges={}, profiler=None,
                       slack_ms={"gpu_idle": 30.0, "launch": 1.0})
    d = PredictionResult(
        trace_id="t", file="", measured_ms=100.0, baseline_ms=100.0, iterations=(it,),
        baseline_error_pct=0.0, measured_median_ms=None, measured_mean_ms=None,
        measured_spread_ms=None, explained_ms=None, explained_no_inferred_ms=None,
        explained_peer_wait_ms=None, explained_error_pct=None, iterations_from=None,
        trace=facts)
    rows = {r[0]: r[1] for r in report.basis_table(d).rows}
    assert rows["GPU idle"].startswith("30.00 ms per iteration")
    d = replace(d, trace=replace(facts, slack_ms={"gpu_idle": 5.0, "launch": 1.0}))
    assert "GPU idle" not in {r[0] for r in report.basis_table(d).rows}


def test_the_top_level_help_is_typers_without_markdown_it():
    """`daydream --help` and `daydream` alone are printed by typer, with typer.rich_utils
    imported without rich.markdown (markdown-it) and rich.traceback, which it uses for
    neither (daydream/commandline.py): the same bytes, exit status and streams as with
    typer.rich_utils imported whole, in a pipe and in colour, at any width."""
    import os
    import subprocess
    import sys
    for extra in ({}, {"COLUMNS": "60"}, {"COLUMNS": "250"}, {"FORCE_COLOR": "1"},
                  {"FORCE_COLOR": "1", "COLUMNS": "50"}, {"TERMINAL_WIDTH": "70"}):
        env = {k: v for k, v in os.environ.items()
               if k not in ("COLUMNS", "FORCE_COLOR", "NO_COLOR", "TERMINAL_WIDTH")} | extra
        for args in (["--help"], []):
            outs = [subprocess.run([sys.executable, "-c", "import sys; sys.argv[0] = "
                                    f"'daydream'; {run}", *args],
                                   capture_output=True, text=True, cwd=ROOT, env=env)
                    for run in ("from daydream.__main__ import main; main()",
                                # typer's help module imported whole first
                                "import typer.rich_utils; from daydream.commandline import "
                                "main; main()")]
            fast, typed = [(p.returncode, p.stdout, p.stderr) for p in outs]
            assert fast == typed, (extra, args)
            plain = re.sub(r"\x1b\[[0-9;]*m", "", fast[1])
            assert "╭─ Commands" in plain and fast[0] == (0 if args else 2)
            assert ("\x1b[" in fast[1]) == ("FORCE_COLOR" in extra)
    assert _loaded_after(["--help"], ("rich.markdown", "markdown_it", "rich.traceback",
                                      "pygments", "pydantic", "polars", "pyarrow",
                                      "duckdb")) == []


def test_plain_ingest_command_lines_are_answered_without_typer(tmp_path):
    """`daydream ingest` with plain arguments is read without typer and pydantic (0.2 s of
    the command); anything else goes to typer, which then reports usage errors as it always
    did."""
    import subprocess
    import sys

    from daydream.commandline import parse
    cmd, kw = parse(["ingest", "a.json", "b", "--store", "s", "-j", "2", "--force",
                     "--strict", "--job", "x", "--ray=auto", "--", "-c.json"])
    assert cmd.fn.__name__ == "ingest" and kw == {
        "paths": ["a.json", "b", "-c.json"], "store": Path("s"), "jobs": 2, "force": True,
        "strict": True, "job": "x", "ray": "auto"}
    for args in (["ingest"], ["ingest", "a", "-j", "x"], ["ingest", "a", "--no-force"],
                 ["ingest", "a", "-j4"], ["ingest", "a", "--force", "--force"],
                 ["ingest", "--help"], ["ingest", "a", "--workers", "2", "-j", "3"],
                 ["ingest", "a", "--store"]):
        assert parse(args) is None, args
    good = DATA / "kineto" / "event_sync_single_stream.json.gz"
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "daydream", "ingest",
                        str(good), "--store", str(tmp_path / "s"), "-j", "1"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0 and "1 trace ingested" in p.stderr, p.stderr[-2000:]
    imported = {ln.split("|")[-1].strip() for ln in p.stderr.splitlines()
                if ln.startswith("import time:")}
    assert "daydream.ingest.batch_ingest" in imported and not imported & {"typer", "pydantic"}
    p = subprocess.run([sys.executable, "-m", "daydream", "ingest", str(good), "-j", "x"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 1 and "Input should be a valid integer" in p.stderr, p.stderr


@pytest.mark.parametrize("args, says, helps", [
    (["predict", "--bogus", "x"], "error: no such option: --bogus (see ", "daydream predict"),
    (["frob"], "error: no such command 'frob' (see ", "daydream"),
    (["compare", "a", "b"], "error: missing option '--opt' (see ", "daydream compare"),
    (["ingest", "a.json", "-j", "x"], "error: invalid value for '--workers'", "daydream ingest"),
])
def test_usage_errors_are_one_line_and_exit_1(args, says, helps):
    """A usage error reads as every other error (README: one line, `error: ...`, exit code
    1, no traceback), not in click's style with status 2; it names the command's help."""
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "daydream", *args], capture_output=True,
                       text=True, cwd=ROOT)
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(says), p.stderr
    assert lines[0].endswith(f"{helps} --help)"), p.stderr
    assert "Usage:" not in p.stderr and "Traceback" not in p.stderr and not p.stdout


def test_sql_fits_columns_like_the_other_tables(store):
    """`daydream sql` printed lines of 650-800 characters at COLUMNS=100 (issue 37): it fits
    the terminal or COLUMNS as every other table does, and prints whole names into a pipe."""
    q = ("SELECT name, kind, dur_ns FROM task WHERE kind = 'kernel' "
         "ORDER BY length(name) DESC, name LIMIT 5")
    piped = cli("sql", q, "--store", store)
    assert piped.exit_code == 0, piped.stderr
    longest = max(len(x) for x in piped.stdout.splitlines())
    assert longest > 100  # kernel names longer than the terminal, whole in a pipe
    for cols in (60, 100):
        out = cli("sql", q, "--store", store, columns=cols).stdout
        assert max(len(x) for x in out.splitlines()) <= cols, out
        assert out.rstrip().endswith("(5 rows)")
        assert "kernel" in out


def test_long_commands_show_progress_on_a_terminal_only(capsys):
    """predict, report, compare and advise say they are working on a terminal (a spinner or
    a bar on stderr, gone when done), and write nothing extra into a pipe."""
    import rich.status

    from daydream.report import busy, fleet_progress
    with busy("predicting", enabled=False):
        pass
    with fleet_progress(enabled=False) as (plan, tick):
        plan(3)
        tick()
    assert capsys.readouterr().err == ""
    assert isinstance(busy("predicting", enabled=True), rich.status.Status)
    assert busy("predicting").__class__.__name__ == "nullcontext"  # pytest's stderr: no tty


def test_ingest_tells_the_allocators_and_blas_before_numpy_is_imported(tmp_path):
    """`daydream ingest` sets NUMPY_MADVISE_HUGEPAGE=0, MIMALLOC_ALLOW_THP=0 and
    OPENBLAS_NUM_THREADS=1 (daydream.__main__._ingest) before numpy, pyarrow or polars is
    imported, where they are read (and its spawned workers inherit them); a value the user set
    is kept."""
    import subprocess
    import sys

    script = (
        "import os, sys\n"
        "from daydream import __main__ as m, commandline\n"
        "run = commandline.main\n"
        "def seen(argv=None):\n"
        "    print({k: os.environ.get(k) for k in ('NUMPY_MADVISE_HUGEPAGE', "
        "'MIMALLOC_ALLOW_THP', 'OPENBLAS_NUM_THREADS')}, "
        "[n for n in ('numpy', 'pyarrow', 'polars') if n in sys.modules], flush=True)\n"
        "    return run(argv)\n"
        "commandline.main = seen\n"
        "sys.argv = ['daydream'] + sys.argv[1:]\n"
        "m.main()\n")
    good = DATA / "kineto" / "event_sync_single_stream.json.gz"
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("NUMPY_MADVISE_HUGEPAGE", "MIMALLOC_ALLOW_THP")}
    env["OPENBLAS_NUM_THREADS"] = "3"  # the user's own
    p = subprocess.run([sys.executable, "-c", script, "ingest", str(good), "--store",
                        str(tmp_path / "s"), "-j", "1"], capture_output=True, text=True,
                       cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    env_seen = {"NUMPY_MADVISE_HUGEPAGE": "0", "MIMALLOC_ALLOW_THP": "0",
                "OPENBLAS_NUM_THREADS": "3"}
    assert p.stdout.splitlines()[0] == f"{env_seen} []"  # nothing of the three imported yet
