"""Per-atom profile of a real model: forward FLOPs from fvcore, parameters, activation sizes.

This measures a real PyTorch model and fills the plain records the cost model reads
(edgefl.sim.records: `ModelProfile`, `AtomProfile`, `LayerProfile`): per atom, and per layer
(every call of a leaf module in one forward pass, and every tensor operator an atom runs outside
its leaf modules, a residual block's `out + identity`), with the operators each launches. A layer
with weights that holds modules (timm's BatchNormAct2d) is one layer, as a leaf is.

fvcore counts multiply-accumulates (MACs); a forward pass costs 2 x MACs FLOPs. Activations saved
for backward are measured, not guessed: every tensor autograd saves during one forward pass of the
whole model is recorded through `saved_tensors_hooks` and charged to the atom running when it was
first saved (parameters excluded, a storage shared across layers or atoms counted once).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

with warnings.catch_warnings():  # fvcore scripts a few helpers with torch.jit, which torch now warns of
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.* is deprecated")
    from fvcore.nn import FlopCountAnalysis

from edgefl.models.base import AtomModel
from edgefl.profiling.layers import ELEMENTWISE, WEIGHTED_KINDS, layer_kind
from edgefl.sim.records import AtomProfile, LayerProfile, ModelProfile


def profile_model(model: AtomModel, name: str = "", batch: int = 2) -> ModelProfile:
    """Profile every atom of `model` on a random batch (in train mode, on the CPU)."""
    model = model.to("cpu").train()
    x = torch.rand(batch, *model.input_shape)
    macs = FlopCountAnalysis(model, x).unsupported_ops_warnings(False).uncalled_modules_warnings(
        False).by_module()
    layers = _layers(model, x, macs)
    atoms = []
    h = x
    for atom_name, atom in model.named_children():
        saved = sum(layer.saved_bytes for layer in layers.get(atom_name, []))
        weighted = _weighted_inputs(atom, h)
        with torch.no_grad():
            out = atom(h)
        atoms.append(AtomProfile(
            name=atom_name,
            macs=macs.get(atom_name, 0) / batch,
            params=sum(p.numel() for p in atom.parameters()),
            in_elems=h[0].numel(),
            out_elems=out[0].numel(),
            saved_bytes=saved / batch,
            weighted_in_elems=weighted // batch,
            out_shape=tuple(out.shape[1:]),
            layers=tuple(replace(layer, macs=layer.macs / batch, in_elems=layer.in_elems // batch,
                                 out_elems=layer.out_elems // batch,
                                 saved_bytes=layer.saved_bytes / batch)
                         for layer in layers.get(atom_name, [])),
        ))
        h = out
    return ModelProfile(name, tuple(atoms))


def _weighted_inputs(atom: nn.Module, x: torch.Tensor) -> int:
    """Summed input sizes of the layers with weights (conv, norm, linear: edgefl.profiling.layers);
    an input two layers share (a residual block's conv1 and its shortcut conv) counts once."""
    seen: dict[int, torch.Tensor] = {}  # kept alive so a freed address is not reused

    def hook(_m: nn.Module, inputs: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
        seen.setdefault(inputs[0].untyped_storage().data_ptr(), inputs[0])

    weighted = [m for m in atom.modules() if layer_kind(m) in WEIGHTED_KINDS]
    with _hooked([m.register_forward_hook(hook) for m in weighted]), torch.no_grad():
        atom(x.clone())
    return sum(t.numel() for t in seen.values())


class _LayerRecorder(TorchFunctionMode):
    """Records one forward pass layer by layer (whole batch): leaf-module calls through hooks,
    operators outside leaves and the operators inside each leaf through torch functions, saved
    tensors through autograd's pack hook (charged to the layer running)."""

    def __init__(self, model: AtomModel, macs: dict[str, int]) -> None:
        super().__init__()
        self.model, self.macs = model, macs
        self.layers: dict[str, list[dict[str, Any]]] = {}
        self.atom = ""
        self.current: dict[str, Any] | None = None  # the leaf running, if any
        self.charged: dict[str, Any] | None = None  # the layer saved tensors go to
        self.seen = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.calls: dict[str, int] = {}
        self.counted: set[str] = set()

    def new_layer(self, name: str, kind: str, x: torch.Tensor, module: nn.Module | None) -> dict[str, Any]:
        layer: dict[str, Any] = {"name": name, "kind": kind, "macs": 0.0, "params": 0,
                                 "in_elems": x.numel(), "out_elems": 0, "saved_bytes": 0, "ops": 0,
                                 "tensors": 0}
        if module is not None and name not in self.counted:
            self.counted.add(name)
            layer["params"] = sum(p.numel() for p in module.parameters())
            layer["tensors"] = len(list(module.parameters()))
        self.layers.setdefault(self.atom, []).append(layer)
        return layer

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.current is not None:
            out = func(*args, **kwargs)
            self.current["ops"] += isinstance(out, torch.Tensor)
            return out
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if first is None or not self.atom:
            return func(*args, **kwargs)
        layer = self.new_layer(f"{self.atom}.{getattr(func, '__name__', 'op')}", ELEMENTWISE, first, None)
        self.charged = layer
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            layer["ops"], layer["out_elems"] = 1, out.numel()
        else:  # a size query (numel, dim), not an operator
            self.layers[self.atom].pop()
        return out

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self.seen and self.charged is not None:
            self.seen.add(ptr)
            self.charged["saved_bytes"] += t.untyped_storage().nbytes()
        return t

    def hooks(self) -> list[Any]:
        handles = [atom.register_forward_pre_hook(self._enter_atom(name))
                   for name, atom in self.model.named_children()]
        for name, module in _units(self.model):
            handles.append(module.register_forward_pre_hook(self._enter_leaf(name, module)))
            handles.append(module.register_forward_hook(self._leave_leaf))
        return handles

    def _enter_atom(self, name: str) -> Callable[..., None]:
        def hook(*_: object) -> None:
            self.atom = name
        return hook

    def _enter_leaf(self, name: str, module: nn.Module) -> Callable[..., None]:
        def hook(_m: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            self.calls[name] = self.calls.get(name, 0) + 1
            label = name if self.calls[name] == 1 else f"{name}#{self.calls[name]}"
            self.current = self.charged = self.new_layer(label, layer_kind(module), inputs[0], module)
            self.current["module"] = name
        return hook

    def _leave_leaf(self, _m: nn.Module, _inputs: object, out: torch.Tensor) -> None:
        if self.current is not None:
            self.current["out_elems"] = out.numel()
        self.current = None

    def result(self) -> dict[str, list[LayerProfile]]:
        """Layers per atom; a leaf's fvcore MACs are shared by its calls."""
        out: dict[str, list[LayerProfile]] = {}
        for atom, records in self.layers.items():
            for r in records:
                module = r.pop("module", None)
                if module is not None:
                    r["macs"] = self.macs.get(module, 0) / self.calls[module]
                out.setdefault(atom, []).append(LayerProfile(**r))
        return out


def _units(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """The modules profiled as one layer each: the leaves, and a layer with weights that holds
    modules of its own (timm's BatchNormAct2d, a BatchNorm2d running its activation) with them."""
    units: list[str] = []
    for name, module in model.named_modules():
        if name and not any(name.startswith(f"{u}.") for u in units) and (
                not list(module.children()) or layer_kind(module) in WEIGHTED_KINDS):
            units.append(name)
            yield name, module


def _layers(model: AtomModel, x: torch.Tensor, macs: dict[str, int]) -> dict[str, list[LayerProfile]]:
    """Per atom, its layers in one forward pass of the whole model (whole-batch figures)."""
    recorder = _LayerRecorder(model, macs)
    with _hooked(recorder.hooks()), torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t):
        inp = x.clone().requires_grad_(True)
        with recorder:
            model(inp)
    return recorder.result()


@contextmanager
def _hooked(handles: list[Any]) -> Iterator[None]:
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
