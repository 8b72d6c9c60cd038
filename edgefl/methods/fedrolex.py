"""FedRolex-AT (FedProphet §7.2): FedRolex (Alam, Liu, Yan & Zhang, NeurIPS 2022) with local
adversarial training. A client keeps the window of ceil(r C) channels starting at (round mod C) of
every hidden layer, wrapping around, r from its available memory; the server averages each element
over the clients that held it (edgefl.methods.width)."""

from __future__ import annotations

from edgefl.methods.base import METHODS
from edgefl.methods.width import WidthMethod


def rolling_channels(count: int, n: int, round_: int) -> list[int]:
    """The n channels from (round mod count) on, wrapping around."""
    return [(round_ + i) % count for i in range(n)]


@METHODS.register("fedrolex_at")
class FedRolexAT(WidthMethod):
    def channels(self, count: int, n: int, round_: int, client: int) -> list[int]:
        return rolling_channels(count, n, round_)
