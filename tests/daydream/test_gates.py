"""The plausibility gates of a prediction (daydream/gates.py) on a real trace: a chain that
inserts work and predicts a slower step names the tasks that made it slower, in a gate and a
note (ACCURACY.md, section 5)."""

from __future__ import annotations

from daydream import api
from tests.conftest import DATA

V100 = DATA / "kineto" / "resnet50_v100_rank0.json.gz"


def test_a_slower_prediction_names_the_tasks_that_made_it_so(tmp_path):
    """Activation checkpointing on the GPU-bound ResNet-50 V100 trace runs the forward
    kernels again in backward: the step is slower, and the recomputed kernels ("(recompute)")
    are among the tasks the gate and the note name."""
    d = api.predict(str(V100), tmp_path / "store", opts=["checkpointing"])
    assert d.predicted_ms > 1.05 * d.baseline_ms
    g = {x.name: x for x in d.gates}
    assert "no_slowdown" not in g  # checkpointing is not an optimization that only shrinks
    assert g["slowdown_named"].ok
    assert "tasks whose time grew per iteration: " in g["slowdown_named"].note
    note = next(n for n in d.notes if n.startswith("slower: checkpointing predicts"))
    assert "every recomputed task (recompute) +" in note
    # a prediction that is not slower has no such gate
    d2 = api.predict(str(V100), tmp_path / "store", opts=["fusion"])
    assert d2.predicted_ms <= d2.baseline_ms
    assert "slowdown_named" not in {x.name for x in d2.gates}


def test_shrinking_is_said_at_registration():
    """Which optimizations only remove or shrink work is said where each is registered
    (``register(..., shrinks=True)``), and the gate reads it there."""
    from daydream.transforms.registry import opts, shrinking
    assert {n for n, o in opts().items() if o.shrinks} == {
        "amp", "fused_adam", "fused_adamw", "fused_sgd", "fused_adagrad", "fused_optimizer",
        "fusion", "bn_restructure", "dataloader", "p3", "dgc", "blueconnect", "local_sgd",
        "no_straggler", "no_profiler"}
    assert shrinking(["amp", "fusion"]) and not shrinking(["amp", "ddp"])
    assert not shrinking(["no_such_optimization"])
