"""Federated partitions of a labelled training set, each client keeping a validation slice.

* `iid`: a seeded shuffle cut into equal parts.
* `dirichlet`: per class, shares over clients drawn from Dir(alpha) (the per-class split of
  Yurochkin et al., ICML 2019, and Wang et al.'s FedMA, ICLR 2020; Hsu, Qi & Brown 2019 instead
  draw each client's class mix from Dir(alpha p)).
* `20-80` (FedProphet §7.1): 20 % of the samples dealt IID; the other 80 % sorted by label, cut
  into clients x shards_per_client shards, each client taking shards_per_client of them.
* `skew` (Shah et al. §4): the label-sorted data cut into K = clients groups; client k takes
  (100 - (K-1)s) % of group k and s % of every other group. The paper gives each client |M|/K
  whole classes and s % of every other class: the same when K divides the classes and the groups
  are equal; otherwise a class can straddle two groups (majority for two clients), a minority
  share is s % of a mixed group rather than of each class, and rounding can leave a client of a
  group of 50 (K = 20, s = 1) 40 samples of its own class and none of the others (the bundled
  skew scenarios use K = 5 on 10 classes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edgefl.config import DataConfig
from edgefl.errors import EdgeflError
from edgefl.registry import Registry

Partitioner = Callable[[np.ndarray, int, DataConfig, np.random.Generator], list[np.ndarray]]
# the key to change when a split leaves a client no training sample, and how
FEW = {"dirichlet": "data.alpha", "20-80": "data.shards_per_client"}
FIX = {"dirichlet": "raise data.alpha (a small alpha gives some clients almost nothing), use fewer "
                    "clients, or change the seed",
       "20-80": "give each client more shards, or use fewer clients"}
PARTITIONS: Registry[Partitioner] = Registry("partition")


@dataclass(frozen=True)
class ClientSplit:
    train: np.ndarray  # indices into the training set
    val: np.ndarray


def split_clients(labels: np.ndarray, clients: int, cfg: DataConfig, seed: int,
                  where: str) -> list[ClientSplit]:
    """Partition, then hold out each client's validation slice."""
    r = np.random.default_rng([seed, 7])
    parts = PARTITIONS.get(cfg.partition)(labels, clients, cfg, r)
    splits = []
    for k, idx in enumerate(parts):
        idx = r.permutation(idx)
        n_val = round(cfg.val_fraction * len(idx))
        if len(idx) - n_val < 1:
            raise EdgeflError(where, FEW.get(cfg.partition, "fleet.clients"),
                              f"client {k} gets no training sample from the {cfg.partition} split; "
                              f"{FIX.get(cfg.partition, 'use fewer clients')}")
        splits.append(ClientSplit(np.sort(idx[n_val:]), np.sort(idx[:n_val])))
    return splits


def public_split(samples: int, public: int, seed: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(public indices, the rest): a seeded draw of `public` samples that no client holds."""
    if public >= samples:
        raise EdgeflError(where, "distill.public_samples",
                          f"must leave samples for the clients: the training set has {samples}")
    order = np.random.default_rng([seed, 11]).permutation(samples)
    return np.sort(order[:public]), np.sort(order[public:])


@PARTITIONS.register("iid")
def iid(labels: np.ndarray, clients: int, cfg: DataConfig,
        r: np.random.Generator) -> list[np.ndarray]:
    return list(np.array_split(r.permutation(len(labels)), clients))


@PARTITIONS.register("dirichlet")
def dirichlet(labels: np.ndarray, clients: int, cfg: DataConfig,
              r: np.random.Generator) -> list[np.ndarray]:
    parts: list[list[int]] = [[] for _ in range(clients)]
    for c in np.unique(labels):
        idx = r.permutation(np.flatnonzero(labels == c))
        cuts = np.rint(np.cumsum(r.dirichlet([cfg.alpha] * clients)) * len(idx)).astype(int)[:-1]
        for k, chunk in enumerate(np.split(idx, cuts)):
            parts[k].extend(chunk.tolist())
    return [np.array(p, dtype=np.int64) for p in parts]


@PARTITIONS.register("20-80")
def twenty_eighty(labels: np.ndarray, clients: int, cfg: DataConfig,
                  r: np.random.Generator) -> list[np.ndarray]:
    order = r.permutation(len(labels))
    n_iid = int(cfg.iid_share * len(order))
    shared = np.array_split(order[:n_iid], clients)
    rest = order[n_iid:]
    rest = rest[np.argsort(labels[rest], kind="stable")]
    shards = np.array_split(rest, clients * cfg.shards_per_client)
    deal = r.permutation(len(shards)).reshape(clients, cfg.shards_per_client)
    return [np.concatenate([shared[k], *(shards[j] for j in deal[k])]) for k in range(clients)]


@PARTITIONS.register("skew")
def skew(labels: np.ndarray, clients: int, cfg: DataConfig,
         r: np.random.Generator) -> list[np.ndarray]:
    own = 1.0 - (clients - 1) * cfg.skew_s / 100  # scenario.validate keeps this positive
    order = np.argsort(labels, kind="stable")
    groups = [r.permutation(g) for g in np.array_split(order, clients)]
    parts: list[list[np.ndarray]] = [[] for _ in range(clients)]
    for g, idx in enumerate(groups):
        shares = [own if k == g else cfg.skew_s / 100 for k in range(clients)]
        cuts = np.rint(np.cumsum(shares) * len(idx)).astype(int)[:-1]
        for k, chunk in enumerate(np.split(idx, cuts)):
            parts[k].append(chunk)
    return [np.concatenate(p) for p in parts]
