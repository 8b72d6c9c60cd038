"""Per-atom profile of a real model: forward FLOPs from fvcore, parameters, activation sizes.

fvcore counts multiply-accumulates (MACs); a forward pass costs 2 x MACs FLOPs. Activations saved
for backward are measured, not guessed: every tensor autograd saves during one forward pass of the
whole model is recorded through `saved_tensors_hooks` and charged to the atom running when it was
first saved (parameters excluded, a storage shared across layers or atoms counted once).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from fvcore.nn import FlopCountAnalysis
from torch import nn

from edgefl.models.base import AtomModel

BYTES = 4  # fp32
WEIGHTED = (nn.Conv2d, nn.Linear, nn.BatchNorm2d, nn.BatchNorm1d)


@dataclass(frozen=True)
class AtomProfile:
    """One atom, per sample: MACs, parameters, input/output elements, bytes saved for backward."""

    name: str
    macs: float
    params: int
    in_elems: int
    out_elems: int
    saved_bytes: float
    weighted_in_elems: int  # summed input sizes of its conv/BN/linear layers (release MemReq)
    out_shape: tuple[int, ...] = ()  # one sample's output

    @property
    def flops(self) -> float:
        """Forward FLOPs per sample."""
        return 2.0 * self.macs

    @property
    def param_bytes(self) -> int:
        return BYTES * self.params


@dataclass(frozen=True)
class ModelProfile:
    name: str
    atoms: tuple[AtomProfile, ...]

    @property
    def params(self) -> int:
        return sum(a.params for a in self.atoms)

    @property
    def input_bytes(self) -> int:
        """Bytes of one input sample."""
        return BYTES * self.atoms[0].in_elems


def profile_model(model: AtomModel, name: str = "", batch: int = 2) -> ModelProfile:
    """Profile every atom of `model` on a random batch (in train mode, on the CPU)."""
    model = model.to("cpu").train()
    x = torch.rand(batch, *model.input_shape)
    macs = FlopCountAnalysis(model, x).unsupported_ops_warnings(False).uncalled_modules_warnings(
        False).by_module()
    saved_per_atom = _saved_bytes(model, x)
    atoms = []
    h = x
    for (atom_name, atom), saved in zip(model.named_children(), saved_per_atom, strict=True):
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
        ))
        h = out
    return ModelProfile(name, tuple(atoms))


def _saved_bytes(model: AtomModel, x: torch.Tensor) -> list[int]:
    """Bytes saved for backward by each atom in one forward pass of the whole model."""
    seen = {p.untyped_storage().data_ptr() for p in model.parameters()}
    sizes = [0] * len(model)
    running = [0]

    def enter(i: int) -> Callable[..., None]:
        def hook(*_: object) -> None:
            running[0] = i
        return hook

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            sizes[running[0]] += t.untyped_storage().nbytes()
        return t

    handles = [atom.register_forward_pre_hook(enter(i)) for i, atom in enumerate(model.children())]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x.clone().requires_grad_(True))
    for handle in handles:
        handle.remove()
    return sizes


def _weighted_inputs(atom: nn.Module, x: torch.Tensor) -> int:
    """Summed input sizes of the conv/BN/linear layers; an input two layers share (a residual
    block's conv1 and its shortcut conv) counts once."""
    seen: dict[int, torch.Tensor] = {}  # kept alive so a freed address is not reused

    def hook(_m: nn.Module, inputs: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
        seen.setdefault(inputs[0].untyped_storage().data_ptr(), inputs[0])

    handles = [m.register_forward_hook(hook) for m in atom.modules() if isinstance(m, WEIGHTED)]
    with torch.no_grad():
        atom(x.clone())
    for handle in handles:
        handle.remove()
    return sum(t.numel() for t in seen.values())
