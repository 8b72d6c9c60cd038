"""Checkpoints: everything a run needs to continue after a kill, as plain data.

A checkpoint holds the next round, the method's state (edgefl.snapshot), every RNG (torch, CUDA,
NumPy's and Python's global ones), the simulated clock and the metrics rows so far (the spans are
read back from the run's events.csv). It
is written to a temporary file and renamed, so a kill leaves the previous checkpoint whole, and it
is read with `torch.load(..., weights_only=True)`: no object is ever unpickled.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgefl.errors import EdgeflError

FILE = "checkpoint.pt"


def rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": [kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, gauss],
            "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(state["python"])


def save(out: Path, state: dict[str, Any]) -> None:
    """Atomically replace the run's checkpoint."""
    tmp = out / (FILE + ".tmp")
    torch.save({**state, "rng": rng_state()}, tmp)
    os.replace(tmp, out / FILE)


def load(out: Path) -> dict[str, Any] | None:
    """The run's checkpoint (RNGs restored), or None when it has none yet."""
    path = out / FILE
    if not path.exists():
        return None
    try:
        state = torch.load(path, weights_only=True)
    except Exception as exc:  # a corrupt or foreign file: say so, never unpickle it
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EdgeflError(str(path), "checkpoint", f"is not a plain-data edgefl checkpoint ({reason}); "
                          "start the run again without --resume") from None
    set_rng_state(state["rng"])
    return dict(state)
