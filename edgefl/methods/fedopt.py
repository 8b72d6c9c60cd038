"""FedAdam-AT, FedYogi-AT and FedAdagrad-AT: FedAvgAT's local adversarial training under the adaptive
servers of Reddi et al., "Adaptive Federated Optimization" (ICLR 2021, Alg. 2; edgefl.server.fedopt).
Each is a named pair: the client rule fedavg_at with the server rule of its name ([fedadam],
[fedyogi], [fedadagrad] hold their knobs)."""

from __future__ import annotations

from edgefl.methods.base import METHODS, Pair
from edgefl.methods.fedavg import FedAvgAT

for _rule in ("fedadam", "fedyogi", "fedadagrad"):
    METHODS.register(f"{_rule}_at")(Pair(FedAvgAT, _rule))
