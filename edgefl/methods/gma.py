"""GMA: Gradient Masked Averaging (Tenison et al., TMLR 2023, Alg. 1 and App.), a named pair: the
client rule `gma.base` (fedavg: fedavg_at, fedprox: fedprox_at) with GMA's server rule, its
sign-agreement mask over a server optimizer (edgefl.server.gma). Any other whole-model method takes
the same server with `[server] rule = "gma"`.

Its paper's headline claim, checked on digits (`bench/claims.py gma`), and what edgefl measured:
docs/claims.md.
"""

from __future__ import annotations

from edgefl.config import Scenario
from edgefl.methods.base import METHODS, Method, Pair, method_class
from edgefl.server.gma import GMAConfig


def gma_clients(s: Scenario) -> type[Method]:
    """The client rule `gma.base` names."""
    return method_class(f"{s.knobs(GMAConfig).base}_at")


METHODS.register("gma")(Pair(gma_clients, "gma"))
