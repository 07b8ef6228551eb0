"""Layer markers from PyTorch hooks, on the CPU: a tiny model trained for two iterations."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from daydream.collect.hooks import LayerHooks  # noqa: E402
from daydream.collect.markers import Markers  # noqa: E402
from daydream.ingest import cupti_format as fmt  # noqa: E402


class Block(nn.Module):
    """conv-bn-relu with a residual add and in-place ReLUs: what register_full_backward_hook
    cannot take (torchvision's ResNet blocks look like this)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1, bias=False)

    def forward(self, x):
        out = self.relu(self.bn(self.conv(x)))
        identity = out
        out = self.conv2(out)
        out += identity
        return self.relu(out)


def tiny():
    torch.manual_seed(0)
    return nn.Sequential(Block(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3), nn.ReLU())


class Recorder:
    """Markers' push/pop, checked per thread as CUPTI keeps them."""

    def __init__(self):
        self.stacks: dict[int, list[int]] = {}
        self.lock = threading.Lock()

    def push(self, mid):
        with self.lock:
            self.stacks.setdefault(threading.get_native_id(), []).append(mid)

    def pop(self):
        with self.lock:
            self.stacks[threading.get_native_id()].pop()


def train(model, hooks_on_model=True, iterations=2, optimizer_cls=torch.optim.Adam):
    ext = Recorder()
    markers = Markers(push=ext.push, pop=ext.pop)
    steps = []
    hooks = LayerHooks(markers, on_step=lambda: steps.append(len(steps)))
    opt = optimizer_cls(model.parameters(), lr=0.01)
    if hooks_on_model:
        hooks.attach_model(model)
        hooks.attach_optimizer(opt)
    else:
        hooks.attach_global()
        hooks.attach_optimizers_global()
    loss_fn = nn.MSELoss()  # a module without parameters, called after the model
    try:
        for _ in range(iterations):
            x = torch.randn(2, 3, 6, 6)
            out = model(x)
            loss = loss_fn(out, torch.zeros_like(out))
            loss.backward()
            opt.step()
            opt.zero_grad()
    finally:
        hooks.detach()
    return markers, hooks, ext, steps


def intervals(markers: Markers) -> list[dict]:
    arr = markers.drain()
    names = markers.names.words
    return [{"name": names[r["name"]], "start": int(r["start"]), "end": int(r["end"]),
             "kind": fmt.MARKER_KINDS[r["kind"]], "phase": fmt.MARKER_PHASES[r["phase"]],
             "bytes": int(r["param_bytes"]), "tid": int(r["tid"]), "id": int(r["id"]),
             "type": None if r["module_type"] < 0 else names[r["module_type"]]} for r in arr]


PATHS = ["model", "model.0", "model.0.conv", "model.0.bn", "model.0.relu", "model.0.conv2",
         "model.1", "model.2", "model.3"]
CALLS = {"model.0.relu": 2}  # the block calls its ReLU twice


@pytest.fixture(scope="module")
def run():
    model = tiny()
    markers, hooks, ext, steps = train(model)
    return model, intervals(markers), hooks, ext, steps


def test_every_module_has_forward_and_backward_markers(run):
    _, ivs, hooks, _, _ = run
    assert hooks.errors == 0, hooks.first_error
    counts = Counter((iv["name"]) for iv in ivs)
    types = {"model": "Sequential", "model.0": "Block", "model.0.conv": "Conv2d",
             "model.0.bn": "BatchNorm2d", "model.0.relu": "ReLU", "model.0.conv2": "Conv2d",
             "model.1": "Flatten", "model.2": "Linear", "model.3": "ReLU"}
    for path in PATHS:
        label = f"{path} ({types[path]})"
        n = 2 * CALLS.get(path, 1)  # two iterations
        assert counts[f"{label} [forward]"] == n, path
        assert counts[f"{label} [backward]"] == n, path
    assert counts["Optimizer.step#Adam.step"] == 2
    assert all(iv["end"] >= iv["start"] for iv in ivs)


def _encloses(a, b) -> bool:
    return a["start"] <= b["start"] and b["end"] <= a["end"]


def _of(ivs, name, phase):
    return [iv for iv in ivs if iv["name"].startswith(name + " (") and iv["phase"] == phase]


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_markers_nest_like_the_modules(run, phase):
    _, ivs, _, _, _ = run
    for parent, child in [("model", "model.0"), ("model.0", "model.0.conv"),
                          ("model.0", "model.0.conv2"), ("model.0", "model.0.relu"),
                          ("model", "model.2"), ("model", "model.3")]:
        outers = _of(ivs, parent, phase)
        for c in _of(ivs, child, phase):
            assert any(_encloses(o, c) for o in outers), (phase, parent, child)
    # siblings do not overlap, in either pass
    convs = sorted(_of(ivs, "model.0.conv", phase) + _of(ivs, "model.2", phase),
                   key=lambda iv: iv["start"])
    for a, b in zip(convs, convs[1:], strict=False):
        assert a["end"] <= b["start"]


def test_backward_follows_forward_in_reverse(run):
    _, ivs, _, _, _ = run
    first = [iv for iv in ivs if iv["start"] < _of(ivs, "model", "forward")[1]["start"]]
    fwd_end = _of(first, "model", "forward")[0]["end"]
    bwd = sorted((iv for iv in first if iv["phase"] == "backward"
                  and iv["name"].split(" ")[0] in ("model.0.conv", "model.2")),
                 key=lambda iv: iv["start"])
    assert all(iv["start"] >= fwd_end for iv in bwd)
    # the linear layer ran last forward, so its gradient is computed first
    assert [iv["name"].split(" ")[0] for iv in bwd] == ["model.2", "model.0.conv"]
    (step,) = [iv for iv in first if iv["kind"] == "user_annotation"]
    assert step["phase"] == "weight_update"
    assert all(iv["end"] <= step["start"] for iv in first if iv["phase"] == "backward")


def test_parameter_bytes(run):
    model, ivs, hooks, _, _ = run
    conv = model[0].conv
    own = (conv.weight.numel() + conv.bias.numel()) * 4
    (fwd, *_) = _of(ivs, "model.0.conv", "forward")
    assert fwd["bytes"] == own and fwd["type"] == "Conv2d"
    assert _of(ivs, "model.0", "forward")[0]["bytes"] == 0  # a container owns none itself
    bn = model[0].bn
    assert _of(ivs, "model.0.bn", "backward")[0]["bytes"] == (bn.weight.numel() * 2) * 4
    total = sum(p.numel() * 4 for p in model.parameters())
    assert hooks.layers["model"] == {"type": "Sequential", "param_bytes": 0,
                                     "param_bytes_total": total}
    assert hooks.layers["model.2"]["param_bytes"] == (3 * 144 + 3) * 4


def test_external_correlation_stack_is_balanced(run):
    _, ivs, _, ext, steps = run
    assert all(not s for s in ext.stacks.values())  # every push popped, on its own thread
    assert steps == [0, 1]  # one iteration boundary per optimizer step


def test_global_hooks_name_an_unmodified_script():
    model = tiny()
    markers, hooks, ext, steps = train(model, hooks_on_model=False, iterations=1,
                                       optimizer_cls=torch.optim.SGD)
    ivs = intervals(markers)
    assert hooks.errors == 0, hooks.first_error
    names = {iv["name"] for iv in ivs}
    assert "model (Sequential) [forward]" in names
    assert "model.0.conv2 (Conv2d) [backward]" in names
    assert "Optimizer.step#SGD.step" in names
    assert "MSELoss (MSELoss) [forward]" in names  # a root that is not the model
    assert steps == [0]
    # detached: later calls leave no marker
    model(torch.randn(1, 3, 6, 6)).sum().backward()
    assert len(markers.drain()) == 0


def test_no_backward_markers_without_grad():
    model = tiny()
    markers = Markers()
    hooks = LayerHooks(markers)
    hooks.attach_model(model)
    with torch.no_grad():
        model(torch.randn(1, 3, 6, 6))
    hooks.detach()
    phases = Counter(fmt.MARKER_PHASES[p] for p in markers.drain()["phase"])
    assert phases == {"forward": len(PATHS) + 1}


def test_a_hook_error_never_reaches_the_job():
    model = tiny()

    class Broken(Markers):
        def begin(self, *a, **k):
            raise RuntimeError("boom")

    hooks = LayerHooks(Broken())
    hooks.attach_model(model)
    model(torch.randn(1, 3, 6, 6)).sum().backward()
    hooks.detach()
    assert hooks.errors > 0 and "boom" in hooks.first_error
