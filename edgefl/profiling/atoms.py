"""Per-atom profile of a real model: forward FLOPs from fvcore, parameters, activation sizes.

fvcore counts multiply-accumulates (MACs); a forward pass costs 2 x MACs FLOPs. Activations saved
for backward are measured, not guessed: every tensor autograd saves during the atom's forward is
recorded through `saved_tensors_hooks` (parameters excluded, shared storage counted once).
"""

from __future__ import annotations

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
    params = {p.data_ptr() for p in model.parameters()}
    atoms = []
    h = x.requires_grad_(True)
    for atom_name, atom in model.named_children():
        weighted = _weighted_inputs(atom, h)
        saved = _saved_bytes(atom, h, params)
        out = atom(h)
        atoms.append(AtomProfile(
            name=atom_name,
            macs=macs.get(atom_name, 0) / batch,
            params=sum(p.numel() for p in atom.parameters()),
            in_elems=h[0].numel(),
            out_elems=out[0].numel(),
            saved_bytes=saved / batch,
            weighted_in_elems=weighted // batch,
        ))
        h = out.detach().requires_grad_(True)
    return ModelProfile(name, tuple(atoms))


def _saved_bytes(atom: nn.Module, x: torch.Tensor, params: set[int]) -> int:
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        atom(x.clone())
    return sum(seen.values())


def _weighted_inputs(atom: nn.Module, x: torch.Tensor) -> int:
    total = 0

    def hook(_m: nn.Module, inputs: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
        nonlocal total
        total += inputs[0].numel()

    handles = [m.register_forward_hook(hook) for m in atom.modules() if isinstance(m, WEIGHTED)]
    with torch.no_grad():
        atom(x.clone())
    for handle in handles:
        handle.remove()
    return total
