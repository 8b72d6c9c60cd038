"""Checkpoints: everything a run needs to continue after a kill, as plain data.

A checkpoint holds the next round, the method's state (edgefl.snapshot), the client selection's
record (edgefl.selection), the round player's state (edgefl.experiment.players: the simulated clock
and batteries, or an async run's replay), every RNG (torch, CUDA, NumPy's and Python's global ones),
the metrics rows so far, the run's fingerprint (edgefl.rundir) and the length and SHA-256 of each
log as it was (metrics.csv and the clients and events logs, CSV or Parquet: edgefl.runlog; the
trace's spans are read back from the events log, once it is shown to be unchanged). It is written by
rundir's safe writer, so a kill leaves the previous checkpoint whole, and it is read with
`torch.load(..., weights_only=True)`: no object is ever unpickled.
"""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgefl.errors import EdgeflError
from edgefl.rundir import CHECKPOINT, write_file


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
    """Atomically replace the run's checkpoint (rundir's safe writer)."""
    buffer = io.BytesIO()
    torch.save({**state, "rng": rng_state()}, buffer)
    write_file(out / CHECKPOINT, buffer.getvalue())


# what every checkpoint holds, by type: anything else is a foreign or damaged file
FIELDS: dict[str, type | tuple[type, ...]] = {
    "next_round": int, "method": dict, "rows": list, "rng": dict,
    "fingerprint": dict, "logs": dict, "selection": dict, "wall_s": (int, float), "player": dict}


def load(out: Path, rounds: int, logs: tuple[str, ...]) -> dict[str, Any]:
    """The run's checkpoint, checked to be plain data of the shape `save` writes for a run of
    `rounds` rounds, with a seal for each log in `logs` (RNGs not yet restored: see set_rng_state)."""
    path = out / CHECKPOINT
    if path.is_symlink():
        raise EdgeflError(str(path), "checkpoint", "is a symbolic link; put back the run's own file")
    try:
        state = torch.load(path, weights_only=True)
    except Exception:  # a corrupt or foreign file: say so, never unpickle it
        raise EdgeflError(str(path), "checkpoint", "is not a plain-data edgefl checkpoint (damaged, or "
                          "it holds objects edgefl never writes) and was not loaded; start the run "
                          "again") from None
    problem = _shape_problem(state, rounds, logs)
    if problem:
        raise EdgeflError(str(path), "checkpoint", f"is not an edgefl checkpoint of this run ({problem}); "
                          "start the run again")
    return dict(state)


def _shape_problem(state: Any, rounds: int, logs: tuple[str, ...]) -> str | None:
    if not isinstance(state, dict):
        return "not a table"
    for key, kind in FIELDS.items():
        if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool):
            return f"{key} missing or of the wrong type"
    if not 1 <= state["next_round"] <= rounds or len(state["rows"]) != state["next_round"]:
        return f"next_round {state['next_round']} does not fit {rounds} rounds and its rows"
    for name in logs:
        seal = state["logs"].get(name)
        if not (isinstance(seal, list) and len(seal) == 2 and isinstance(seal[0], int)
                and isinstance(seal[1], str)):
            return f"logs.{name} missing"
    return None
