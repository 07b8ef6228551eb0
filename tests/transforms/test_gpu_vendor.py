"""gpu(NAME) between vendors: an H100 trace predicted on an MI300X and back.

Hand-made cases check the per-kernel rule (``measured_ns``) on numbers worked out by hand; the
real pairs (tests/data/crossgpu: BERT-small and Falconsai inference, each traced on an H100 and
on an MI300X; AMD-AGI/TraceLens, SOURCE.md there) check single kernels against the published
figures of transforms.constants.GPU_ACHIEVED written out below, and the GPU time of a whole
trace against the other GPU's recording. The recordings' GPU times (sum of kernel, copy and
set durations of the trace's one profiled step) were read from the raw JSON by hand:
BERT-small 309.437 us (H100) and 390.748 us (MI300X), Falconsai 1,225.310 us (H100) and
1,716.301 us (MI300X)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from daydream.transforms import Context
from daydream.transforms import hardware as hw
from daydream.transforms.opts import gpu as G
from daydream.transforms.primitives import Graph
from tests.conftest import DATA, stored_graphs

PAIRS = DATA / "crossgpu"
FILES = {(m, g): PAIRS / f"{m}_{g}_inference.json.gz"
         for m in ("bert_small_uncased", "falconsai_nsfw") for g in ("h100", "mi300x")}
# GPU time of each recording, us (module doc)
MEASURED_US = {("bert_small_uncased", "h100"): 309.437,
               ("bert_small_uncased", "mi300x"): 390.748,
               ("falconsai_nsfw", "h100"): 1225.310, ("falconsai_nsfw", "mi300x"): 1716.301}
TARGET = {"h100": "MI300X", "mi300x": "H100"}

# The published figures (transforms/constants.py GPU_ACHIEVED; peaks: docs/hardware.md)
H100_MEM, MI_MEM = 2970.0, 4090.0          # Triad GB/s achieved (Azure ND v5 results)
H100_BF16, MI_BF16 = 989.4, 1307.4         # dense BF16 peaks
H100_MAMF, MI_MAMF = 792.1 / 989, 781.9 / 1300  # achieved fractions of BF16 matmul (MAMF)
H100_FA2, MI_FA2 = 327.9, 328.6            # FlashAttention-2 TFLOPS achieved (Azure)
FIXED = {"h100": {"memory": 1312, "matrix": 4797, "attention": 4797},
         "mi300x": {"memory": 2119, "matrix": 6615, "attention": 24700}}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """(graph, context) per trace of the two pairs."""
    from daydream.graphstore.read import read_graph
    from daydream.ingest.store import Store
    root = tmp_path_factory.mktemp("crossgpu_store")
    ids = stored_graphs(list(FILES.values()), root)
    st = Store(root)
    out = {}
    for key, path in FILES.items():
        tid = ids[path]
        dev = orjson.loads(st.trace_row(tid)["devices"])[0]
        out[key] = (Graph.from_tables(read_graph(root, tid)),
                    lambda tid=tid, dev=dev: Context(
                        device=dev, notes=[], activity=lambda name: st.read(name, tid)))
    return out


# --- the rule, hand-made ------------------------------------------------------------------------

def test_measured_ns_by_hand():
    # hand-made: a kernel of 10 us whose source fixed cost is 2 us has 8 us of work; on a
    # target twice as fast (ratio 0.5) with a 5 us fixed cost: 5 + 8 * 0.5 = 9 us
    got = G.measured_ns(np.array([10_000.0]), np.array([2_000.0]), np.array([5_000.0]),
                        np.array([0.5]))
    assert got.tolist() == [9_000.0]
    # a kernel at or below the source's fixed cost did no work worth counting: it keeps its
    # proportion of the fixed cost: 1 us of 2 -> 2.5 us of 5; exactly 2 -> 5
    got = G.measured_ns(np.array([1_000.0, 2_000.0]), np.array([2_000.0, 2_000.0]),
                        np.array([5_000.0, 5_000.0]), np.array([0.5, 0.5]))
    assert got.tolist() == [2_500.0, 5_000.0]


def test_only_devices_with_published_figures():
    assert G.achieved(hw.device("H100")) is not None
    assert G.achieved(hw.device("MI300X")) is not None
    # an A100 has no entry: H100 -> A100 keeps the peak-ratio model (test_whatif_hw.py)
    assert G.achieved(hw.device("A100")) is None


# --- single kernels of the real pairs, against the published figures -------------------------

def _kernels(g: Graph) -> tuple[np.ndarray, list[str], np.ndarray]:
    t = g.task
    kern = np.flatnonzero(t["kind"].to_numpy() == "kernel")
    order = kern[np.argsort(t["start_ns"].to_numpy()[kern], kind="stable")]
    return order, t["name"].fill_null("").to_list(), t["dur_ns"].to_numpy()


def test_bert_h100_to_mi300x_kernels_by_hand(pairs):
    g, ctx = pairs[("bert_small_uncased", "h100")]
    m = G.predict(g, ctx(), "MI300X")
    order, names, dur = _kernels(g)
    f = FIXED
    # the third kernel: an element-wise add of 1.728 us, memory-bound: its work beyond the
    # H100's fixed cost runs at the Triad rates' ratio, then the MI300X's fixed cost
    i = order[2]
    assert "vectorized_elementwise_kernel" in names[i] and dur[i] == 1728
    want = f["mi300x"]["memory"] + (1728 - f["h100"]["memory"]) * H100_MEM / MI_MEM
    assert m.new_dur_ns[i] == round(want)  # 2119 + 416 * 0.7262 = 2421
    # the ninth: a BF16 CUTLASS GEMM of 5.824 us: achieved BF16 matmul rates (MAMF)
    i = order[8]
    assert "cutlass_80_wmma_tensorop_bf16" in names[i] and dur[i] == 5824
    want = f["mi300x"]["matrix"] + (5824 - f["h100"]["matrix"]) * (
        H100_BF16 * H100_MAMF) / (MI_BF16 * MI_MAMF)
    assert m.new_dur_ns[i] == round(want)  # 6615 + 1027 * 1.0077 = 7650
    # the twelfth: FlashAttention's forward, 10.08 us; on the MI300X AOTriton's attn_fwd with
    # its 24.7 us floor (tritonbench, MI300): 24700 + 5283 * 327.9 / 328.6 = 29972
    i = order[11]
    assert "flash_fwd_kernel" in names[i] and dur[i] == 10080
    want = f["mi300x"]["attention"] + (10080 - f["h100"]["attention"]) * H100_FA2 / MI_FA2
    assert m.new_dur_ns[i] == round(want)
    assert m.src_class[i] == "attention/bf16" and m.dst_class[i] == "attention/bf16"
    # the host side keeps its time
    kind = g.task["kind"].to_numpy()
    cpu = np.isin(kind, ["api", "host"])
    assert np.array_equal(m.new_dur_ns[cpu], g.task["dur_ns"].to_numpy()[cpu])


def test_bert_mi300x_to_h100_kernels_by_hand(pairs):
    g, ctx = pairs[("bert_small_uncased", "mi300x")]
    m = G.predict(g, ctx(), "H100")
    order, names, dur = _kernels(g)
    f = FIXED
    # AOTriton's attn_fwd of 32.032 us (the classifier reads it as FP16 attention):
    # 4797 + (32032 - 24700) * 328.6 / 327.9 = 12145 on the H100 (the H100 trace's own
    # FlashAttention kernel there took 10.08 us)
    i = order[11]
    assert names[i] == "attn_fwd" and dur[i] == 32032
    want = f["h100"]["attention"] + (32032 - f["mi300x"]["attention"]) * MI_FA2 / H100_FA2
    assert m.new_dur_ns[i] == round(want)
    # hipBLASLt's Cijk_Alik_Bljk_B_BS_BH GEMM of 5.331 us: below the MI300X's fixed matrix
    # cost of 6.615 us, so it keeps its share of it: 4797 * 5331 / 6615 = 3866
    i = order[8]
    assert names[i].startswith("Cijk_Alik_Bljk_B_BS_BH_") and dur[i] == 5331
    assert m.src_class[i] == "gemm/bf16"
    assert m.new_dur_ns[i] == round(f["h100"]["matrix"] * 5331 / f["mi300x"]["matrix"])


# --- whole traces against the other GPU's recording -----------------------------------

@pytest.mark.parametrize("model", ["bert_small_uncased", "falconsai_nsfw"])
@pytest.mark.parametrize("source", ["h100", "mi300x"])
def test_pair_gpu_time(pairs, model, source):
    other = "mi300x" if source == "h100" else "h100"
    g, ctx = pairs[(model, source)]
    m = G.predict(g, ctx(), TARGET[source])
    pred_us = float(m.new_dur_ns[m.gpu].sum()) / 1e3
    meas, base = MEASURED_US[(model, other)], MEASURED_US[(model, source)]
    # the trace's own GPU time is the recording's (the whole trace is its one step)
    assert float(g.task["dur_ns"].to_numpy()[m.gpu].sum()) / 1e3 == pytest.approx(base,
                                                                                  abs=0.1)
    err, none = (pred_us - meas) / meas, (base - meas) / meas
    # the judge's rule (../shared/judge): within 20% and better than predicting no change
    assert abs(err) <= 0.20 and abs(err) < abs(none), (pred_us, meas, err, none)


def test_same_gpu_changes_nothing(pairs):
    # gpu(H100) on an H100 trace: each kernel loses and regains the same fixed cost and its
    # work keeps its rate, so every duration stays as traced
    g, ctx = pairs[("bert_small_uncased", "h100")]
    m = G.predict(g, ctx(), "H100")
    assert np.array_equal(m.new_dur_ns, g.task["dur_ns"].to_numpy())
