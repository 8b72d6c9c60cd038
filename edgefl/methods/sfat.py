"""SFAT: Slack Federated Adversarial Training (Zhu et al., ICLR 2023, App. D Alg. 1), a named pair:
the client rule `sfat.base` (fedavg: fedavg_at, fedprox: fedprox_at, scaffold: scaffold_at) with the
alpha-slack server rule (edgefl.server.slack), which boosts the clients of lowest loss. Any other
whole-model method takes the same server with `[server] rule = "slack"`.

Its paper's headline claim, checked on digits (`bench/claims.py sfat`), and what edgefl measured:
docs/claims.md.
"""

from __future__ import annotations

from edgefl.config import Scenario
from edgefl.methods.base import METHODS, Method, Pair, method_class
from edgefl.server.slack import SFATConfig


def sfat_clients(s: Scenario) -> type[Method]:
    """The client rule `sfat.base` names."""
    return method_class(f"{s.knobs(SFATConfig).base}_at")


METHODS.register("sfat")(Pair(sfat_clients, "slack"))
