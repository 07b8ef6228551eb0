"""predict --plot: a real PNG whose bars are the prediction's numbers."""

import numpy as np
import polars as pl
import pytest

from daydream.graphstore.schema import GPU_KINDS
from tests.conftest import DATA

SPEC = "scale(select=\"kind = 'kernel'\", factor=0.5)"


@pytest.fixture(scope="module")
def predicted(tmp_path_factory):
    from daydream import api
    from daydream.graphstore.read import read_graph
    from daydream.transforms import rewrite
    tmp = tmp_path_factory.mktemp("plot")
    png = tmp / "out" / "v100.png"
    d = api.predict(DATA / "kineto" / "resnet50_v100_nw0_run1.json.gz", tmp / "store",
                    opts=[SPEC], plot=png)
    g = read_graph(tmp / "store", d.trace_id)
    return d, png, g, rewrite(g, SPEC)


def gpu_ms_by_phase(task: pl.DataFrame, iterations: list[int]) -> dict[str, float]:
    """GPU busy ms per phase and iteration straight from the graph: on a stream a task holds
    its unit for exactly dur_ns, so no schedule is needed."""
    t = task.filter(pl.col("kind").is_in(GPU_KINDS), pl.col("iteration").is_in(iterations))
    s = t.group_by(pl.col("phase").fill_null("other")).agg(pl.col("dur_ns").sum())
    return {r["phase"]: r["dur_ns"] / 1e6 / len(iterations) for r in s.iter_rows(named=True)}


def test_png_written(predicted):
    import matplotlib.image as mpimg
    d, png, _, _ = predicted
    assert d.plot_path == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(png)
    assert img.ndim == 3 and img.shape[0] > 400 and img.shape[1] > 800
    # not a blank canvas: several distinct colours drawn
    assert len(np.unique(img.reshape(-1, img.shape[2])[::97], axis=0)) > 5


def test_phase_bars_are_the_prediction(predicted):
    from daydream.plot import phase_stack
    d, _, g, g2 = predicted
    names, bars = phase_stack(d.phases.as_dict())
    assert set(bars) == {"GPU baseline", "GPU predicted", "CPU baseline", "CPU predicted"}
    used = [i.index for i in d.iterations if i.used]
    want_b = gpu_ms_by_phase(pl.from_arrow(g["task"]), used)
    want_p = gpu_ms_by_phase(pl.from_arrow(g2["task"]), used)
    for i, ph in enumerate(names):
        assert bars["GPU baseline"][i] == pytest.approx(want_b.get(ph, 0.0), abs=1e-9)
        assert bars["GPU predicted"][i] == pytest.approx(want_p.get(ph, 0.0), abs=1e-9)
    # kernels at half their time: GPU bars shrink to about half (copies and sets kept)
    assert 0.45 < sum(bars["GPU predicted"]) / sum(bars["GPU baseline"]) < 0.6
    assert {"forward", "backward", "weight_update"} <= set(names)


def test_timeline_bars_are_the_schedule(predicted):
    from daydream.plot import timeline_bars
    from daydream.simulate.replay import replay
    d, _, g, g2 = predicted
    it = d.plot_iteration
    assert it == next(i.index for i in d.iterations if i.used)
    for tables in (g, g2):
        rep = replay(tables)
        b = timeline_bars(tables, rep.schedule.start_ns, rep.schedule.end_ns, it)
        task = pl.from_arrow(tables["task"])
        gpu = task.filter(pl.col("iteration") == it, pl.col("kind").is_in(GPU_KINDS),
                          pl.col("dur_ns") > 0)
        sb = b.filter(pl.col("unit") == "gpu 0 stream 7")
        assert sb.height == gpu.height
        assert sb["dur_ms"].sum() == pytest.approx(gpu["dur_ns"].sum() / 1e6)
        assert b["start_ms"].min() == 0.0
        assert set(b["unit"]) == {"gpu 0 stream 7", "thread 25738:25738",
                                  "thread 25738:25772"}
        # every CPU task of the iteration that ran for a while is a bar on its thread
        cpu = task.filter(pl.col("iteration") == it, pl.col("kind").is_in(["api", "host"]),
                          pl.col("dur_ns") > 0)
        assert b.filter(pl.col("kind").is_in(["api", "host"])).height >= cpu.height


def test_plot_cli(predicted, tmp_path):
    import subprocess
    import sys
    d, _, _, _ = predicted
    store = tmp_path / "s"
    png = tmp_path / "base.png"
    p = subprocess.run([sys.executable, "-m", "daydream", "predict",
                        str(DATA / "kineto" / "alexnet_fwd_a100.json.gz"), "--store",
                        str(store), "--plot", str(png)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "plot of iteration" in p.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_the_timelines_mark_the_step(tmp_path, monkeypatch):
    """The plot drew a 72 ms step over 160 ms of tasks with no marker (issue 37): each
    timeline marks where the drawn iteration's step ends, before and after."""
    from daydream import api
    from daydream import plot as _pl
    seen = {}
    real = _pl.write_plot

    def spy(*a, **kw):
        seen.update(kw)
        return real(*a, **kw)
    monkeypatch.setattr(_pl, "write_plot", spy)
    toy = DATA / "kineto" / "mi250_toy_train_rocm.json.gz"
    d = api.predict(toy, tmp_path / "s", opts=["cuda_graphs"], plot=tmp_path / "p.png")
    it = next(i for i in d.iterations if i.index == d.plot_iteration)
    assert seen["steps"] == [pytest.approx(it.baseline_ms), pytest.approx(it.predicted_ms)]
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
