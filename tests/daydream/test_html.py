"""``daydream report``: one self-contained HTML file whose tables are the prediction's numbers
(checked against ``predict --json``), and which a browser renders to a picture that is not
blank (headless Chromium; CI installs it, .ci/run)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
from typer.testing import CliRunner

from daydream.cli import app
from tests.conftest import DATA

TOY = DATA / "kineto" / "mi250_toy_train_rocm.json.gz"
SPECS = ["amp", "cuda_graphs"]


class Tables(HTMLParser):
    """Every table of a page by id: its header cells and rows of cell texts; and every tag's
    attributes, to look for anything fetched from elsewhere."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, dict] = {}
        self.attrs: list[tuple[str, dict]] = []
        self.ids: list[str] = []
        self._t = self._row = self._cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.attrs.append((tag, a))
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "table":
            self._t = self.tables.setdefault(a["id"], {"head": [], "rows": []})
        elif tag == "tr" and self._t is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append(("".join(self._cell), tag))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if all(t == "th" for _, t in self._row):
                self._t["head"] = [c for c, _ in self._row]
            else:
                self._t["rows"].append([c for c, _ in self._row])
            self._row = None
        elif tag == "table":
            self._t = None


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("html")
    store, out = tmp / "s", tmp / "report.html"
    run = CliRunner().invoke
    args = [a for s in SPECS for a in ("--opt", s)]
    r = run(app, ["report", str(TOY), "--store", str(store), "--out", str(out), *args])
    assert r.exit_code == 0, r.stderr
    d = json.loads(run(app, ["predict", str(TOY), "--store", str(store), "--json",
                             *args]).stdout)
    page = out.read_text()
    p = Tables()
    p.feed(page)
    return out, page, p, d


def test_one_self_contained_file(made):
    out, page, p, _ = made
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<style>" in page and "<script" not in page and "<link" not in page
    assert not re.search(r"url\(|@import", page)
    for tag, a in p.attrs:
        for k in ("src", "href"):
            if k in a:
                assert a[k].startswith("data:"), (tag, a)
    imgs = [a["src"] for tag, a in p.attrs if tag == "img"]
    assert len(imgs) == 1 and imgs[0].startswith("data:image/png;base64,")
    png = base64.b64decode(imgs[0].split(",", 1)[1])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    for section in ("s-predictions", "s-iterations", "s-basis", "s-phases", "s-timeline",
                    "s-critical-path", "s-top", "s-memory", "s-notes", "s-gates"):
        assert section in p.ids


def test_prediction_table_is_the_json(made):
    _, _, p, d = made
    t = p.tables["predictions"]
    assert t["head"][1:] == ["optimization", "reference", "reference ms", "predicted ms",
                             "interval ms", "speedup", "speedup interval"]
    assert len(t["rows"]) == len(d)
    for row, r in zip(t["rows"], d, strict=True):
        assert row[1] == r["opts"]
        assert row[3] == f"{r['reference_ms']:.3f}"
        assert row[4] == f"{r['predicted_ms']:.3f}"
        lo, hi = r["predicted_interval_ms"]
        assert row[5] in (f"{lo:.3f}-{hi:.3f}", f"{lo:.3f}")
        assert row[6] == f"{r['speedup']:.3f}x"


def test_iterations_phases_and_critical_path_are_the_json(made):
    _, _, p, d = made
    its = p.tables["iterations"]["rows"]
    assert [r[2] for r in its[:-1]] == [f"{i['measured_ms']:.3f}" for i in d[0]["iterations"]]
    assert its[-1][1] == "steady state" and its[-1][2] == f"{d[0]['measured_ms']:.3f}"
    for k, r in enumerate(d, 1):
        rows = {x[0]: x[1:] for x in p.tables[f"phases-{k}"]["rows"]}
        for ph, v in r["phases"]["predicted"].items():
            assert rows[ph][1] == f"{v['gpu_ms']:.3f}" and rows[ph][3] == f"{v['cpu_ms']:.3f}"
    cp = d[0]["critical_path"]
    want = [[by, x[by] if x[by] is not None else f"(no {by})", f"{x['ns'] / 1e6:.3f}"]
            for by in ("phase", "kind", "layer") for x in cp[f"by_{by}"] if x["ns"] > 0]
    assert [r[:3] for r in p.tables["critical-path"]["rows"]] == want


def test_top_kernels_layers_notes_and_gates(made):
    _, page, p, d = made
    ks = p.tables["top-kernels"]["rows"]
    ms = [float(r[3]) for r in ks]
    assert ks and ms == sorted(ms, reverse=True)
    gpu = sum(v["gpu_ms"] for v in d[0]["phases"]["baseline"].values())
    assert sum(ms) <= gpu + 1e-3 * len(ms)
    assert p.tables["top-layers"]["rows"]
    import html
    for r in d:
        for n in r["notes"]:
            assert html.escape(n) in page
        if r.get("gates"):
            assert any(t.startswith("gates-") for t in p.tables)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.parametrize("width", [800, 1400])
def test_a_browser_renders_it(made, tmp_path, width):
    """Headless Chromium draws the page at 800 and 1400 px: the screenshot is not blank (and
    is kept in DAYDREAM_SCREENSHOTS, a folder, where that is set: CI's output). Skipped on a
    machine without Chromium, but CI (CI=true) installs it and must not skip."""
    exe = _chromium()
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must have headless Chromium (.ci/run installs Debian's chromium)")
        pytest.skip("no chromium here (CI installs it: .ci/run)")
    out, _, _, _ = made
    shot = tmp_path / "shot.png"
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'prof'}",
                    f"--window-size={width},2000", f"--screenshot={shot}", out.as_uri()],
                   capture_output=True, timeout=180, check=True)
    keep = os.environ.get("DAYDREAM_SCREENSHOTS")
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(shot, os.path.join(keep, f"report-{width}px.png"))
    import matplotlib.image as mpimg
    import numpy as np
    img = mpimg.imread(shot)
    assert img.shape[0] >= 1000 and img.shape[1] >= width
    rgb = img[..., :3].reshape(-1, 3)
    ink = (rgb < 0.9).any(axis=1).mean()  # share of pixels that are not (near) white
    assert ink > 0.02
    assert len(np.unique((rgb[::37] * 255).astype(np.uint8), axis=0)) > 20


def test_the_title_is_the_file_and_notes_say_their_optimization_once(made):
    """The title was the trace's hash, and notes read "amp: amp: ..." (issue 37)."""
    _, page, p, d = made
    title = re.search(r"<title>(.*?)</title>", page).group(1)
    assert title == f"Daydream report: {TOY.name}"
    assert "amp: amp:" not in page and "<b>amp</b>" not in page
    notes = page[page.index('id="s-notes"'):]
    notes = notes[:notes.index("</section>")]
    for spec in SPECS:
        assert f"<h3>{spec}</h3>" in notes


def test_top_kernels_show_their_share_and_the_time_after(made):
    _, _, p, d = made
    t = p.tables["top-kernels"]
    assert t["head"][:6] == ["kernel", "class", "tensor cores", "ms", "share", "calls"]
    assert t["head"][6:] == ["after (1)", "after (2)"]
    gpu = sum(v["gpu_ms"] for v in d[0]["phases"]["baseline"].values())
    for r in t["rows"]:
        share = float(r[4].rstrip("%"))
        assert 0 < share <= 100
        # the share is of the replay's GPU work (its kernels are most of it)
        assert share / 100 * gpu >= float(r[3]) - 1e-3


def test_tensor_core_use_is_read_from_the_kernel_name():
    from daydream.html import tensor_cores
    assert tensor_cores("kernel", "volta_h884gemm_64x128_ldg8_nn") == "yes (fp16)"
    assert tensor_cores("kernel", "volta_sgemm_128x64_nn") == "no"
    assert tensor_cores("kernel", "void at::native::vectorized_elementwise_kernel<4, float>") \
        == ""
    assert tensor_cores("memcpy", "Memcpy HtoD") == ""


def test_a_path_in_a_note_is_cut_to_its_file_name():
    from daydream.html import clean_note
    assert clean_note("amp: speedups from /home/me/repo/transforms/constants.py (V100)") == \
        "amp: speedups from constants.py (V100)"
    assert clean_note("ratio 1/2 and a/b stay") == "ratio 1/2 and a/b stay"


def test_the_unit_table_is_per_iteration_too():
    from daydream.report import units_table
    t = units_table([{"unit": "gpu 0 stream 7", "busy_ns": 600_000_000, "busy_share": 0.5}],
                    iterations=6)
    assert t.rows == [["gpu 0 stream 7", "600.00", "100.00", "50.0%"]]
    assert [c.header for c in t.columns][2] == "ms per iteration"


def test_the_overview_gives_the_verdict_and_the_best_prediction(made):
    _, page, p, d = made
    verdict = re.search(r'<p id="verdict"><b>(.*?)</b>', page).group(1)
    assert verdict in ("GPU-bound", "CPU-bound", "data-bound", "communication-bound")
    assert p.tables["where"]["rows"]
    best = max(d, key=lambda r: r["speedup"])
    said = re.search(r'<p id="best">(.*?)</p>', page).group(1)
    assert f"<b>{best['opts']}</b>, {best['speedup']:.3f}x" in said
    assert f"{best['reference_ms']:.3f} ms" in said


def launched_by_operator(path) -> dict[str, float]:
    """GPU time (us, the whole trace) per operator, from the raw Kineto JSON alone: each
    kernel, copy and set goes through its correlation id to the runtime call that launched
    it, and from the call to the innermost cpu_op around it on its thread that has a tensor
    input (the innermost one where none has)."""
    import gzip
    ev = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X"]
    ops = [e for e in ev if e.get("cat") == "cpu_op"]
    calls = {e["args"]["correlation"]: e for e in ev
             if e.get("cat") in ("cuda_runtime", "cuda_driver")}

    def tensor_input(op):
        return any(isinstance(x, list) and x for x in op["args"].get("Input Dims") or [])

    out: dict[str, float] = {}
    for k in ev:
        if k.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        c = calls.get(k["args"].get("correlation"))
        around = sorted((o for o in ops if c is not None and (o["pid"], o["tid"]) ==
                         (c["pid"], c["tid"]) and o["ts"] <= c["ts"] and
                         c["ts"] + c["dur"] <= o["ts"] + o["dur"]), key=lambda o: o["dur"])
        op = next((o for o in around if tensor_input(o)), around[0] if around else None)
        name = op["name"] if op is not None else "(no operator)"
        out[name] = out.get(name, 0.0) + k["dur"]
    return out


def test_top_operators_by_gpu_time_are_what_they_launched(made):
    """The plugin's GPU time per operator (issue 37): in the toy ROCm trace, addmm launched an
    elementwise kernel (6.88 us) and a Tensile GEMM (17.6 us), copy_ two host-to-device copies;
    every operator's figure is the raw trace's, per used iteration, and its share of the GPU
    work, with its time after each prediction beside it."""
    _, _, p, d = made
    t = p.tables["top-gpu-operators"]
    assert t["head"] == ["operator", "GPU ms", "share", "GPU tasks", "after (1)", "after (2)"]
    its = d[0]["iterations"]
    assert all(i["used"] for i in its)  # so every kernel of the trace counts
    want = launched_by_operator(TOY)
    assert want["aten::addmm"] == pytest.approx(6.88 + 17.6)
    total = sum(want.values())
    rows = {r[0]: r for r in t["rows"]}
    assert set(rows) == set(want)  # 12 operators: fewer than the table's 15
    for name, us in want.items():
        assert rows[name][1] == f"{us / 1e3 / len(its):.3f}", name
        assert rows[name][2] == f"{100 * us / total:.1f}%", name
    ms = [float(r[1]) for r in t["rows"]]
    assert ms == sorted(ms, reverse=True)
    # amp and cuda_graphs change kernels, never who launched them: every row has its after
    assert all(r[4] and r[5] for r in t["rows"])


def test_gpu_time_by_operator_on_a_transformer_with_shapes(tmp_path):
    """Particle Transformer (550 kernels, shapes recorded): each operator's GPU time is the raw
    trace's to the nanosecond, and they add up to all of its GPU work."""
    from daydream import api, breakdown
    from daydream.transforms.work import ranges_of
    path = DATA / "kineto" / "particle_transformer_a100_fwd_bs16.json.gz"
    want = launched_by_operator(path)
    (p,) = api.run(str(path), tmp_path, [])
    assert [i.used for i in p.base.iterations] == [True]
    got = breakdown.by_gpu_operator(p.subject.tables, p.base, ranges_of(p.subject))
    assert set(got) == set(want)
    for name, us in want.items():
        assert got[name]["ms"] == pytest.approx(us / 1e3, rel=1e-9, abs=1e-9), name
    assert want["aten::addmm"] / 1e3 == pytest.approx(0.6137, abs=1e-4)


def test_top_operators_by_self_cpu_time(made):
    """The operators view of the profiler plugin: host work by the operator it ran in, per
    iteration, against the replay's CPU work."""
    _, _, p, d = made
    t = p.tables["top-operators"]
    assert t["head"][:3] == ["operator", "ms", "share"]
    ms = [float(r[1]) for r in t["rows"]]
    assert ms and ms == sorted(ms, reverse=True)
    cpu = sum(v["cpu_ms"] for v in d[0]["phases"]["baseline"].values())
    assert sum(ms) <= cpu + 1e-3 * len(ms)


def test_a_trace_without_allocator_records_says_how_to_record_them(made):
    _, page, p, _ = made
    memory = page[page.index('id="s-memory"'):]
    memory = memory[:memory.index("</section>")]
    assert 'id="memory-none"' in memory and "profile_memory=True" in memory
    assert not any(t.startswith("memory-") for t in p.tables)


BERT = DATA / "crossgpu" / "bert_small_uncased_h100_inference.json.gz"
BATCH = "batch(size=6, traced=2)"


@pytest.fixture(scope="module")
def with_memory(tmp_path_factory):
    """The report of a real trace with the allocator's records (BERT inference on an H100,
    one ProfilerStep), predicting a batch three times the traced one, and amp."""
    tmp = tmp_path_factory.mktemp("html_memory")
    out = tmp / "report.html"
    r = CliRunner().invoke(app, ["report", str(BERT), "--store", str(tmp / "s"), "--out",
                                 str(out), "--opt", BATCH, "--opt", "amp"])
    assert r.exit_code == 0, r.stderr
    p = Tables()
    p.feed(out.read_text())
    return p


def test_the_memory_view_is_the_files_records(with_memory):
    """The measured peak, the step's start and the batch prediction, from the raw JSON by
    hand: the GPU's largest Total Allocated and Total Reserved; the step starts at the first
    record's total less its size (no record precedes the step); at batch 6 from 2 the growth
    above that start triples."""
    import gzip
    with gzip.open(BERT, "rt") as f:
        events = json.load(f)["traceEvents"]
    gpu = [e["args"] for e in events if e.get("name") == "[memory]" and
           e["args"]["Device Type"] == 1]
    peak = max(a["Total Allocated"] for a in gpu)
    reserved = max(a["Total Reserved"] for a in gpu)
    start = gpu[0]["Total Allocated"] - gpu[0]["Bytes"]
    mib = 1 << 20
    rows = {r[0]: r for r in with_memory.tables["memory-peak"]["rows"]}
    assert rows["GPU 0"][1:4] == ["218", f"{peak / mib:,.1f}", f"{reserved / mib:,.1f}"]
    assert "CPU" in rows
    (step,) = [r for r in with_memory.tables["memory-iterations"]["rows"] if r[0] == "GPU 0"]
    assert step[1:5] == ["ProfilerStep#6", f"{start / mib:,.1f}", f"{peak / mib:,.1f}",
                         f"{(peak - start) / mib:,.1f}"]
    pred = {r[0]: r for r in with_memory.tables["memory-predicted"]["rows"]}
    assert pred[BATCH][1:4] == ["GPU 0", f"{(start + 3 * (peak - start)) / mib:,.1f}",
                                f"{3 * (peak - start) / mib:,.1f}"]
    assert "x3" in pred[BATCH][4]
    assert pred["amp"][2] == "not modeled" and pred["amp"][4].startswith("not modeled: amp: ")
