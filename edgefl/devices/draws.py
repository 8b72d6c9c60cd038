"""Counter-based random draws: every number is a hash of where it is used.

A client's draws in a round are 64-bit words keyed by (seed, stream, round, client, draw index), so a
round's clients are drawn as NumPy arrays in one pass, in any order and any batch, and one client
drawn alone gets the same words (the per-client reference, `key`, folds the key with Python
integers). The key is folded word by word with SplitMix64's finaliser (Steele, Lea and Flood, "Fast
splittable pseudorandom number generators", OOPSLA 2014; a bijection of 64-bit words):
h <- mix(h + golden + word), starting from 0. A uniform on [0, 1) is the top 53 bits over 2^53; an
index below n is (top 32 bits x n) >> 32.
"""

from __future__ import annotations

import numpy as np

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
M1, M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def mix(z: int) -> int:
    """SplitMix64's finaliser on a Python integer (0 <= z < 2^64)."""
    z = ((z ^ (z >> 30)) * M1) & MASK
    z = ((z ^ (z >> 27)) * M2) & MASK
    return z ^ (z >> 31)


def mix_array(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 words (NumPy arrays wrap modulo 2^64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(M2)
    return z ^ (z >> np.uint64(31))


def key(*words: int) -> int:
    """The hash of a key, word by word."""
    h = 0
    for w in words:
        h = mix((h + GOLDEN + (w & MASK)) & MASK)
    return h


def keys(prefix: int, ids: np.ndarray) -> np.ndarray:
    """key(*words before the id, ids[i]) for every id (ids >= 0), where `prefix` is key(*the words
    before the id)."""
    return mix_array(ids.astype(np.uint64) + np.uint64((prefix + GOLDEN) & MASK))


def words(prefix: int, ids: np.ndarray, draws: int) -> np.ndarray:
    """Words of shape (len(ids), draws): row i, column j is key(*words before the id, ids[i], j), where
    `prefix` is key(*the words before the id)."""
    return mix_array(keys(prefix, ids)[:, None] + np.arange(draws, dtype=np.uint64) + np.uint64(GOLDEN))


def uniform(w: np.ndarray) -> np.ndarray:
    """Uniforms on [0, 1) from words: the top 53 bits over 2^53 (exact doubles)."""
    return (w >> np.uint64(11)).astype(np.float64) * 2.0**-53


def index(w: np.ndarray, n: np.ndarray | int) -> np.ndarray:
    """Indices in [0, n) from words (n < 2^32): the top 32 bits times n, over 2^32."""
    return (((w >> np.uint64(32)) * np.asarray(n, dtype=np.uint64)) >> np.uint64(32)).astype(np.int64)
