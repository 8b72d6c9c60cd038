"""The server's shared links: concurrent transfers share its bandwidth by processor sharing.

Each active transfer gets min(its client's bandwidth, its fair share of the server's link), the
share found by water-filling: clients slower than the level keep their own rate and the rest split
what is left equally (max-min fairness, Bertsekas & Gallager, "Data Networks", 1992, §6.5.2). Rates
change only when a transfer starts or ends, so finish times are exact event by event.

The compiled loop of edgefl.sim.round_loop plays every round's transfers, O(log n) an event (a
virtual clock for the transfers at the level, heaps by cap and by end): a living round's and an
async run's, which start and stop as their clients do, and a synchronous round's (`shared_round`:
downloads all from the round's start, uploads as each client finishes computing). The reference
that plays them in Python (`Sharing`), against which it is tested, is in the tests
(tests/simpy_clients.py, tests/test_links.py). A capacity of inf (`server.down_mbit_s = 0`, the
default) leaves every transfer at its own rate.

`Links.of_server` sizes the links from a scenario's `[server]` (`server_mbps`, the one place that
does): a fixed Mbit/s plus a share per device of the fleet (`down_mbit_s_per_device`,
`up_mbit_s_per_device`), so that a fleet a thousand times larger meets a link a thousand times wider,
as a content delivery network deploys capacity in proportion to the users it serves (Nygren,
Sitaraman & Sun, "The Akamai Network: A Platform for High-Performance Internet Applications", ACM
SIGOPS Operating Systems Review 44(3), 2010).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgefl.config import ServerConfig
from edgefl.sim.clients import Drains, Transfers


def server_mbps(server: ServerConfig, clients: int) -> tuple[float, float]:
    """The server's (down, up) Mbit/s for a fleet of `clients` devices: each link's fixed Mbit/s plus
    its share per device times the fleet (0 in all = unlimited)."""
    return (server.down_mbit_s + server.down_mbit_s_per_device * clients,
            server.up_mbit_s + server.up_mbit_s_per_device * clients)


@dataclass(frozen=True)
class Links:
    """The server's download and upload capacities, bytes/s (inf = unlimited)."""

    down_bps: float
    up_bps: float

    @classmethod
    def of_mbps(cls, down_mbit_s: float, up_mbit_s: float) -> Links:
        return cls(*(m * 1e6 / 8 if m > 0 else math.inf for m in (down_mbit_s, up_mbit_s)))

    @classmethod
    def of_server(cls, server: ServerConfig, clients: int) -> Links:
        """The links of a scenario's `[server]` for a fleet of `clients` devices (`server_mbps`)."""
        return cls.of_mbps(*server_mbps(server, clients))

    @property
    def unlimited(self) -> bool:
        return math.isinf(self.down_bps) and math.isinf(self.up_bps)


def shared_round(links: Links, phases: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
                 sent: tuple[np.ndarray, np.ndarray], bps: tuple[np.ndarray, np.ndarray],
                 latency_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A synchronous round's (download_s, upload_s) on shared links. `phases` are the clients'
    (download, data access, compute, upload) seconds alone, `sent` the bytes (down, up), `bps` their
    own (down, up) bandwidths: every download starts at the round's start, every upload when its
    client has computed; each transfer's latency is added after its bytes. Played by the compiled
    loop of a living round (edgefl.sim.round_loop), its clients always online and on mains."""
    from edgefl.sim import round_loop  # here: Numba's import costs a plain fleet's run 0.1 GB

    n = len(latency_s)
    transfers = Transfers(np.column_stack(sent).reshape(n, 2), np.column_stack(bps).reshape(n, 2), latency_s)
    _, _, seconds, _ = round_loop.play(np.column_stack(phases).reshape(n, 4), np.full(n, math.inf), transfers,
                                       Drains.none(n), (links.down_bps, links.up_bps), True, 0.0, n, math.inf)
    return seconds[:, 0], seconds[:, 1]
