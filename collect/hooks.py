"""PyTorch layer markers: forward and backward of every module, and the optimizer step.

Each call of a module opens a marker ``"<path> (<Type>) [forward]"`` in its forward pre-hook and
closes it in its forward hook (``always_call``, so an exception does not leave it open). Its
backward marker ``"<path> (<Type>) [backward]"`` spans the autograd nodes that call created:

* it opens when autograd is about to run the node that produced the call's output (a pre-hook
  on that node);
* it closes when every node of the call that leads out of it (to the call's inputs, or to
  parameters' AccumulateGrad) has run (post-hooks on those nodes, counted down). The call's
  nodes are found in its forward hook by walking the graph back from the output while the
  nodes' sequence numbers are above the highest one among the inputs' nodes: nodes created
  before the call have lower numbers on the same thread.

Why not ``register_full_backward_hook``: it wraps inputs and outputs in a custom autograd
function, and then any in-place op on them (torchvision's ``ReLU(inplace=True)``, residual
``out += identity``) raises "a view ... is being modified inplace". Node hooks change nothing in
the graph. When several calls begin at one node (a module and its last submodule share their
output node) the outer one opens first; when they end at one node the inner one closes first.

``path`` is the module's name in ``named_modules()`` of the root it was reached from, the root
being ``root_name`` (``model``) for the model given or, with global hooks, for the first module
with parameters called outside any other (other roots, such as a loss, go by their class
name). Parameter bytes are the module's own (``recurse=False``), so they add up over layers
without double counting, with the recursive total in ``layers``.

Optimizer steps are ``Optimizer.step#<Class>.step`` annotations (PyTorch profiler's name), phase
weight_update; after the step of the first optimizer seen, ``on_step`` is called: that is the
iteration boundary when collection steps automatically. Forward calls made while autograd runs
(activation checkpointing's recomputation) get phase ``recompute``.

Hooks never raise into the job: an error inside one is counted (``errors``) and dropped.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

from daydream.collect.markers import (
    ANNOTATION,
    BACKWARD,
    FORWARD,
    MODULE,
    RECOMPUTE,
    WEIGHT_UPDATE,
    Markers,
)

_ACCUMULATE = (1 << 64) - 1  # sequence number of AccumulateGrad nodes
MAX_WALK = 100_000           # nodes visited per module call before giving up on its backward
KEEP_GENERATIONS = 4         # forward passes whose un-run backward hooks are remembered


@dataclass
class ModuleInfo:
    path: str
    type: str
    param_bytes: int        # own parameters (recurse=False)
    param_bytes_total: int  # with submodules'
    forward: str
    backward: str
    recompute: str


@dataclass
class _Call:
    """One module call's backward marker: opened once, closed when ``left`` sinks have run."""

    info: ModuleInfo
    left: int
    generation: int
    mid: int = 0
    begun: bool = False
    done: bool = False


def _param_bytes(module: torch.nn.Module, recurse: bool) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters(recurse=recurse))


def _tensors(obj, out: list, depth: int = 0) -> list:
    """Tensors in a forward's output (tensor, tuple/list, dict values, dataclass-like)."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif depth < 3 and isinstance(obj, (tuple, list)):
        for o in obj[:64]:
            _tensors(o, out, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for o in list(obj.values())[:64]:
            _tensors(o, out, depth + 1)
    return out


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


class LayerHooks:
    """Marks module calls and optimizer steps into ``markers``."""

    def __init__(self, markers: Markers, *, root_name: str = "model", backward: bool = True,
                 on_step: Callable[[], None] | None = None):
        self.markers = markers
        self.root_name = root_name
        self.backward = backward
        self.on_step = on_step
        self.infos: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.layers: dict[str, dict] = {}   # path -> type, param bytes (for the trace metadata)
        self.new_layers: dict[str, dict] = {}
        self.handles: list = []
        self.errors = 0
        self.first_error: str | None = None
        self.inert = False
        self.walk_limit_hit = 0
        self._local = threading.local()
        self._roots = 0
        self._generation = 0
        self._begin_at: dict[tuple[int, int], tuple[int, list]] = {}
        self._end_at: dict[tuple[int, int], tuple[int, list]] = {}
        self._step_optimizer: weakref.ref | None = None
        self._opt_marker: dict[int, int] = {}

    # ---- attaching ---------------------------------------------------------------------------

    def attach_model(self, model: torch.nn.Module, name: str | None = None) -> None:
        """Hooks on every module of ``model``, named from its ``named_modules()``."""
        self._name_tree(model, name or self.root_name)
        for module in model.modules():
            self.handles.append(module.register_forward_pre_hook(self._guard(self._pre)))
            self.handles.append(module.register_forward_hook(self._guard(self._post),
                                                             always_call=True))

    def attach_global(self) -> None:
        """Hooks on every module of the process (an unmodified script): a module first called
        outside any other is a root, named ``root_name`` (the first) or after its class."""
        from torch.nn.modules import module as mod
        self.handles.append(mod.register_module_forward_pre_hook(self._guard(self._pre)))
        self.handles.append(mod.register_module_forward_hook(self._guard(self._post),
                                                             always_call=True))

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self.handles.append(optimizer.register_step_pre_hook(self._guard(self._opt_pre)))
        self.handles.append(optimizer.register_step_post_hook(self._guard(self._opt_post)))

    def attach_optimizers_global(self) -> None:
        from torch.optim import optimizer as opt
        self.handles.append(opt.register_optimizer_step_pre_hook(self._guard(self._opt_pre)))
        self.handles.append(opt.register_optimizer_step_post_hook(self._guard(self._opt_post)))

    def detach(self) -> None:
        """Make every hook inert, and remove the handles unless called from inside a hook
        (PyTorch iterates its hook dicts while calling them: removing one then would raise in
        the job; an inert hook costs a flag test)."""
        self.inert = True
        self._begin_at.clear()
        self._end_at.clear()
        if getattr(self._local, "depth", 0):
            return
        for h in self.handles:
            h.remove()
        self.handles = []

    def _guard(self, fn):
        local = self._local

        def hook(*args):
            if self.inert:
                return
            local.depth = getattr(local, "depth", 0) + 1
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001 - never break the job being profiled
                self.errors += 1
                if self.first_error is None:
                    self.first_error = f"{type(e).__name__}: {e}"
            finally:
                local.depth -= 1
        return hook

    # ---- names -------------------------------------------------------------------------------

    def _name_tree(self, root: torch.nn.Module, root_path: str) -> None:
        for name, module in root.named_modules():
            if module in self.infos:
                continue
            path = f"{root_path}.{name}" if name else root_path
            self._add_info(module, path)

    def _add_info(self, module: torch.nn.Module, path: str) -> ModuleInfo:
        typ = type(module).__name__
        label = f"{path} ({typ})"
        info = ModuleInfo(path, typ, _param_bytes(module, False), _param_bytes(module, True),
                          f"{label} [forward]", f"{label} [backward]", f"{label} [recompute]")
        self.infos[module] = info
        entry = {"type": typ, "param_bytes": info.param_bytes,
                 "param_bytes_total": info.param_bytes_total}
        self.layers[path] = entry
        self.new_layers[path] = entry
        return info

    def _info(self, module: torch.nn.Module, stack: list) -> ModuleInfo:
        info = self.infos.get(module)
        if info is not None:
            return info
        if stack:  # not a registered submodule of its caller: name it under the caller
            parent = self.infos[stack[-1][0]]
            return self._add_info(module, f"{parent.path}.{type(module).__name__}")
        # the first root with parameters is the model; others (a loss, an augmentation) are
        # named after their class
        is_model = not self._roots and next(module.parameters(), None) is not None
        self._roots += is_model
        root = self.root_name if is_model else type(module).__name__
        while root in self.layers:
            root += "_"
        self._name_tree(module, root)
        return self.infos[module]

    def take_new_layers(self) -> dict[str, dict]:
        new, self.new_layers = self.new_layers, {}
        return new

    # ---- forward -----------------------------------------------------------------------------

    def _stack(self) -> list:
        s = getattr(self._local, "stack", None)
        if s is None:
            s = self._local.stack = []
        return s

    def _pre(self, module, args) -> None:
        if not self.markers.enabled:
            return
        stack = self._stack()
        info = self._info(module, stack)
        recompute = _in_backward()
        if not stack and not recompute:
            self._new_generation()
        floor = -1
        for a in args:
            if isinstance(a, torch.Tensor) and a.grad_fn is not None:
                floor = max(floor, a.grad_fn._sequence_nr())
        mid = self.markers.begin(info.recompute if recompute else info.forward, kind=MODULE,
                                 phase=RECOMPUTE if recompute else FORWARD,
                                 param_bytes=info.param_bytes, module_type=info.type)
        stack.append((module, mid, floor))

    def _post(self, module, args, output) -> None:
        stack = self._stack()
        while stack and stack[-1][0] is not module:  # a call whose post-hook never ran
            self.markers.end(stack.pop()[1])
        if not stack:
            return
        _, mid, floor = stack.pop()
        self.markers.end(mid)
        if self.backward and self.markers.enabled and torch.is_grad_enabled() \
                and not _in_backward():
            self._arm_backward(self.infos[module], output, floor)

    # ---- backward ----------------------------------------------------------------------------

    def _new_generation(self) -> None:
        """A new outermost forward: forget hooks of passes whose backward never ran."""
        self._generation += 1
        old = self._generation - KEEP_GENERATIONS
        for table in (self._begin_at, self._end_at):
            for key in [k for k, (gen, _) in table.items() if gen < old]:
                del table[key]

    def _arm_backward(self, info: ModuleInfo, output, floor: int) -> None:
        roots = []
        for t in _tensors(output, []):
            if t.grad_fn is not None and t.grad_fn not in roots:
                roots.append(t.grad_fn)
        if not roots:
            return
        inside: dict[int, object] = {}
        todo = list(roots)
        while todo:
            node = todo.pop()
            if node is None or id(node) in inside:
                continue
            seq = node._sequence_nr()
            if seq == _ACCUMULATE or seq <= floor:
                continue
            inside[id(node)] = node
            if len(inside) > MAX_WALK:
                self.walk_limit_hit += 1
                return
            todo.extend(nxt for nxt, _ in node.next_functions)
        sinks = [n for n in inside.values()
                 if not any(nxt is not None and id(nxt) in inside for nxt, _ in n.next_functions)]
        call = _Call(info, len(sinks), self._generation)
        for node in roots:
            if id(node) in inside:
                self._at(self._begin_at, node, True).append(call)
        for node in sinks:
            self._at(self._end_at, node, False).append(call)

    def _at(self, table: dict, node, begin: bool) -> list:
        """The list of calls to begin (or end) at ``node``, hooking the node on first use."""
        key = (id(node), node._sequence_nr())
        entry = table.get(key)
        if entry is None:
            calls: list = []
            table[key] = (self._generation, calls)
            if begin:
                node.register_prehook(self._guard(lambda _g, k=key: self._on_begin(k)))
            else:
                node.register_hook(self._guard(lambda _gi, _go, k=key: self._on_end(k)))
            return calls
        return entry[1]

    def _on_begin(self, key) -> None:
        entry = self._begin_at.pop(key, None)
        if entry is None:
            return
        for call in reversed(entry[1]):  # registered inner first: open the outer first
            if not call.begun and not call.done:
                call.begun = True
                call.mid = self.markers.begin(call.info.backward, kind=MODULE, phase=BACKWARD,
                                              param_bytes=call.info.param_bytes,
                                              module_type=call.info.type)

    def _on_end(self, key) -> None:
        entry = self._end_at.pop(key, None)
        if entry is None:
            return
        for call in entry[1]:  # inner first
            call.left -= 1
            if call.left <= 0 and not call.done:
                call.done = True
                if call.begun:
                    self.markers.end(call.mid)

    # ---- optimizer ---------------------------------------------------------------------------

    def _opt_pre(self, optimizer, args, kwargs) -> None:
        if self._step_optimizer is None or self._step_optimizer() is None:
            self._step_optimizer = weakref.ref(optimizer)
        if not self.markers.enabled:
            return
        name = f"Optimizer.step#{type(optimizer).__name__}.step"
        self._opt_marker[id(optimizer)] = self.markers.begin(name, kind=ANNOTATION,
                                                             phase=WEIGHT_UPDATE)

    def _opt_post(self, optimizer, args, kwargs) -> None:
        self.markers.end(self._opt_marker.pop(id(optimizer), 0))
        if self.on_step is not None and self._step_optimizer is not None \
                and self._step_optimizer() is optimizer:
            self.on_step()
