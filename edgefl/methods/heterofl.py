"""HeteroFL-AT (FedProphet §7.2): HeteroFL (Diao, Ding & Tarokh, ICLR 2021) with local adversarial
training. A client keeps the first ceil(r C) channels of every hidden layer, r from its available
memory; the server averages each element over the clients that held it (edgefl.methods.width)."""

from __future__ import annotations

from edgefl.methods.base import METHODS
from edgefl.methods.width import WidthMethod


def static_channels(n: int) -> list[int]:
    """The first n channels."""
    return list(range(n))


@METHODS.register("heterofl_at")
class HeteroFLAT(WidthMethod):
    def channels(self, count: int, n: int, round_: int, client: int) -> list[int]:
        return static_channels(n)
