"""Resuming a run: the run folder, its checkpoint and its logs must belong together, to this scenario
and to this code (`resume_state`); then, once the round player has gone on from the checkpoint (an
async run's is played again to it: edgefl.experiment.async_rounds), the method, the client selection
and every random stream are restored from it (`restore`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgefl import checkpoint, rundir
from edgefl.errors import EdgeflError
from edgefl.experiment.prepare import Experiment
from edgefl.experiment.rows import output_format
from edgefl.runlog import log_names, pending_path
from edgefl.selection.server import Selection


@dataclass
class Resumed:
    state: dict[str, Any]  # the checkpoint
    logs: dict[str, bytes]  # each CSV log's bytes as the checkpoint vouches for them


def resume_state(exp: Experiment, out: Path, fingerprint: dict[str, str], digests: dict[str, str]) -> Resumed:
    """Check that the run folder, its checkpoint and its logs belong together and to this scenario and
    code (and its profile files, `digests`, to those the run started with); nothing is written
    before every check has passed."""
    marker = rundir.read_marker(out)
    if marker is None or marker.get("kind") != "run":
        why = (rundir.DAMAGED if marker is None and (out / rundir.MARKER).exists()
               else "missing: this folder holds no run edgefl can resume (or an older edgefl's)")
        raise EdgeflError(str(out), rundir.MARKER, f"{why}; start the run again")
    code = {k: marker.get(k) for k in ("edgefl", "code")}
    if code != {k: fingerprint[k] for k in code}:
        raise EdgeflError(str(out), "--resume", f"the run was started by edgefl {code['edgefl']} (code "
                          f"{code['code']}), this is edgefl {fingerprint['edgefl']} (code "
                          f"{fingerprint['code']}): resume it with that version, or start it again")
    if marker.get("profiles") != fingerprint["profiles"]:
        raise EdgeflError(str(out), "--resume", f"{changed_profiles(marker, digests)} since the run started "
                          "(`edgefl devices list --scenario` shows which profile files it finds): put them "
                          "back as they were, or start the run again")
    if marker.get("scenario") != fingerprint["scenario"]:
        raise EdgeflError(str(out / "scenario.toml"), "--resume", "was edited after the run started; "
                          "restore it, or start a new run with the edited scenario")
    names = tuple(log_names(output_format(exp.scenario)).values())
    state = checkpoint.load(out, exp.scenario.rounds, names)
    if state["fingerprint"] != fingerprint:
        raise EdgeflError(str(out / rundir.CHECKPOINT), "checkpoint", "belongs to another run (another "
                          "scenario, seed or edgefl); put back this run's checkpoint, or start the run again")
    logs = {name: _vouched(out / name, state["logs"][name], state["next_round"]) for name in names}
    return Resumed(state, logs)


def restore(exp: Experiment, out: Path, saved: Resumed, selection: Selection) -> None:
    """The method, the client selection's record and the RNGs as the checkpoint holds them."""
    state = saved.state
    try:
        exp.method.load_state(state["method"])
        selection.load_state(state["selection"])
        checkpoint.set_rng_state(state["rng"])
    except Exception as exc:  # any mismatch of a plain-data file is the user's input
        raise EdgeflError(str(out / rundir.CHECKPOINT), "checkpoint", f"does not fit this run's model and "
                          f"method ({type(exc).__name__}); start the run again") from None


def _vouched(path: Path, seal: list[Any], next_round: int) -> bytes:
    """The first `length` bytes of a log, if their SHA-256 is `digest` (the checkpoint's `seal` of
    it): the rows the checkpoint saw, from the log or, for a Parquet log whose move into place a crash
    cut short, from its pending file.
    Later bytes (rounds after the checkpoint, a row torn by a full disk) are dropped on resume."""
    found = [data for data in (_read_log(path, next_round), _pending(path))
             if data is not None and _holds(data, seal)]
    if not found:
        raise EdgeflError(str(path), "--resume", f"does not hold the rows of the checkpoint's "
                          f"{next_round} rounds (edited, cut or replaced); put back the original, or "
                          "start the run again")
    return found[0][:seal[0]]


def _holds(data: bytes, seal: list[Any]) -> bool:
    length, digest = seal
    return len(data) >= length and hashlib.sha256(data[:length]).hexdigest() == digest


def _read_log(path: Path, next_round: int) -> bytes:
    try:
        if path.is_symlink():
            raise OSError("a symbolic link")
        return path.read_bytes()
    except OSError as exc:
        if _pending(path) is not None:
            return b""
        raise EdgeflError(str(path), "--resume", f"cannot be read ({exc.strerror or exc}) but the "
                          f"checkpoint holds {next_round} rounds of it; put it back, or start the run "
                          "again") from None


def _pending(path: Path) -> bytes | None:
    pending = pending_path(path)
    try:
        return None if pending.is_symlink() else pending.read_bytes()
    except OSError:
        return None



def changed_profiles(marker: dict[str, Any], digests: dict[str, str]) -> str:
    """What changed among a run's profile files and trace, by name (its marker keeps each file's
    digest: a marker without them is another edgefl's, refused before)."""
    keys = sorted({k for k in marker if k.startswith("profile:")} | set(digests))
    changed = [k.removeprefix("profile:") for k in keys if marker.get(k) != digests.get(k)]
    if not changed:  # the same files, found in another order
        return "a device, app or network profile or the availability trace the run uses has changed"
    return f"the run's file{'s' if len(changed) > 1 else ''} {', '.join(changed)} changed"
