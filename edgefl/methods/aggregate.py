"""Aggregation as pure functions over state dicts and weights (McMahan et al., FedAvg, Alg. 1;
Li et al., FedBN, ICLR 2021)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

State = dict[str, torch.Tensor]


def fedavg(states: Sequence[State], weights: Sequence[float]) -> State:
    """sum_k w_k x_k / sum_k w_k for every key; integer buffers (BN's counters) are rounded."""
    total = float(sum(weights))
    out: State = {}
    for key, first in states[0].items():
        acc = torch.stack([s[key].double() * (w / total)
                           for s, w in zip(states, weights, strict=True)]).sum(0)
        out[key] = (acc if first.is_floating_point() else acc.round()).to(first.dtype)
    return out


def bn_keys(model: nn.Module) -> set[str]:
    """State-dict keys that belong to BatchNorm layers (weights, biases, running statistics)."""
    return {f"{name}.{key}" if name else key
            for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
            for key in m.state_dict()}


def keep_local(global_state: State, local_state: State, keys: Iterable[str]) -> State:
    """FedBN's download: the global state with the client's own values at `keys`."""
    merged = dict(global_state)
    for key in keys:
        merged[key] = local_state[key]
    return merged


def state_bytes(state: State, keys: Iterable[str] | None = None) -> int:
    """Bytes of the tensors at `keys` (all by default), as sent over the network."""
    names = state.keys() if keys is None else keys
    return sum(state[k].numel() * state[k].element_size() for k in names)


def partial_average(global_state: State, states: Sequence[State], weights: Sequence[float]) -> State:
    """Each key averaged over the clients that sent it, weighted by their q_k; keys nobody sent
    keep the global value (FedProphet Eq. 14-15; HeteroFL's partial average)."""
    out = dict(global_state)
    for key in global_state:
        held = [(s, w) for s, w in zip(states, weights, strict=True) if key in s]
        if held:
            out[key] = fedavg([{key: s[key]} for s, _ in held], [w for _, w in held])[key]
    return out


def slack_weights(losses: Sequence[float], samples: Sequence[int], alpha: float, k_hat: int) -> list[float]:
    """SFAT's alpha-slack aggregation weights (Zhu et al., App. D Alg. 1, and its release): the
    k_hat clients with the smallest N_k/N L_k get (1 + alpha) / (1 - alpha), the others 1, each
    times N_k, normalised to sum to one."""
    total = sum(samples)
    scores = [n / total * loss for n, loss in zip(samples, losses, strict=True)]
    threshold = sorted(scores)[k_hat - 1]  # Alg. 1: score <= the k_hat-th smallest (ties included)
    boost = (1 + alpha) / (1 - alpha)
    raw = [n * (boost if score <= threshold else 1.0) for n, score in zip(samples, scores, strict=True)]
    return [w / sum(raw) for w in raw]


def gma_mask(deltas: Sequence[torch.Tensor], tau: float) -> torch.Tensor:
    """GMA's soft mask (Tenison et al., Alg. 1): A = |mean_n sign(delta_n)|; 1 where A >= tau,
    else A."""
    agreement = torch.stack([d.sign() for d in deltas]).mean(0).abs()
    return torch.where(agreement >= tau, torch.ones_like(agreement), agreement)

