"""What methods do with state dicts beside a server rule (edgefl.server, where FedAvg's `fedavg`
lives): FedBN's local keys (Li et al., ICLR 2021), bytes sent, and the partial average of
sub-models (HeteroFL, FedProphet)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from edgefl.server.base import State
from edgefl.server.mean import fedavg


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
