"""FedDrop-AT (FedProphet §7.2): federated dropout (Caldas et al., "Expanding the Reach of Federated
Learning by Reducing Client Resource Requirements", 2018) with local adversarial training. A client
keeps a random ceil(r C) of every hidden layer's C channels, drawn from (seed, round, client), r from
its available memory; the server averages each element over the clients that held it
(edgefl.methods.width)."""

from __future__ import annotations

import numpy as np

from edgefl.methods.base import METHODS
from edgefl.methods.width import WidthMethod


def random_channels(count: int, n: int, seed: int, round_: int, client: int) -> list[int]:
    """n of `count` channels drawn without replacement, seeded by (seed, round, client, count)."""
    draw = np.random.default_rng([seed, round_, client, count]).choice(count, size=n, replace=False)
    return sorted(int(c) for c in draw)


@METHODS.register("feddrop_at")
class FedDropAT(WidthMethod):
    def channels(self, count: int, n: int, round_: int, client: int) -> list[int]:
        return random_channels(count, n, self.ctx.scenario.seed, round_, client)
