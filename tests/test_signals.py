"""A run met by signals and closed streams (issue 39, "processes and signals"): SIGTERM is Ctrl-C (one
line, exit 130, no child process left, the checkpoint resumable), and a run whose stderr is closed
still finishes."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import torch

from edgefl.sim.round_loop import PREPARING

pytestmark = pytest.mark.slow  # runs in processes of their own, signalled or on Ray clusters

ROOT = Path(__file__).resolve().parents[1]
EDGEFL = [sys.executable, "-c", "import sys; from edgefl.cli import main; sys.exit(main())"]
LONG = ["run", "quickstart", "--set", "rounds=40", "--set", "evaluation.every=40", "--quiet"]


def start(args: list[str], **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen([*EDGEFL, *args], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kw)  # type: ignore[call-overload]


def after_checkpoint(process: subprocess.Popen[str], out: Path) -> None:
    """Wait (at most 120 s) until the run checkpointed a round."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if (out / "checkpoint.pt").exists():
            return
        time.sleep(0.2)
    raise AssertionError(f"the run ended or stalled before its first checkpoint: {process.communicate()}")


def test_sigterm_is_ctrl_c_no_child_is_left_and_the_run_resumes(tmp_path):
    out = tmp_path / "run"
    process = start([*LONG, "--out", str(out)])
    after_checkpoint(process, out)
    children = psutil.Process(process.pid).children(recursive=True)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130
    assert err == ("edgefl: terminated (SIGTERM); continue from its last checkpoint with edgefl run "
                   f"--resume {out}\n")
    psutil.wait_procs(children, timeout=10)
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)
    state = torch.load(out / "checkpoint.pt", weights_only=True)  # intact: what --resume reads first
    assert 1 <= state["next_round"] < 40


def children_of(process: subprocess.Popen[str]) -> list[psutil.Process]:
    """The process's children, once it has one (at most 30 s)."""
    deadline = time.monotonic() + 30
    while not (found := psutil.Process(process.pid).children(recursive=True)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


@pytest.mark.slow  # a run in a process of its own on a cold cache: 25-30 s on 2 busy cores
def test_sigterm_while_the_round_engine_compiles_stops_the_run(tmp_path):
    """A cold Numba cache (a fresh install): one line says the round engine is being prepared, and a
    SIGTERM during its compile (a minute or more in LLVM, where llvmlite printed the signal's traceback
    and compiled on) stops the run at once with edgefl's line, the compiling process gone too."""
    process = start(["run", "living-digits", "--dry-run", "--quiet", "--out", str(tmp_path / "run")],
                    env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")})
    assert process.stderr is not None
    ready, _, _ = select.select([process.stderr], [], [], 120)
    first = process.stderr.readline() if ready else ""
    try:
        assert first == f"{PREPARING}\n", first
        compiling = children_of(process)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130 and err == "edgefl: terminated (SIGTERM)\n", err
    psutil.wait_procs(compiling, timeout=10)
    assert compiling and not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in compiling)


@pytest.mark.slow  # starts a local Ray
def test_sigterm_on_a_ray_run_is_said_as_on_a_local_one(tmp_path):
    """Ray's init sets a SIGTERM handler of its own (exit 15, Ray's lines only): edgefl's is kept."""
    out = tmp_path / "run"
    process = start([*LONG, "--out", str(out), "--executor", "ray", "--set", "ray.workers=1", "--set",
                     "threads=1"])
    after_checkpoint(process, out)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert [line for line in err.splitlines() if line.startswith("edgefl")] == [
        f"edgefl: terminated (SIGTERM); continue from its last checkpoint with edgefl run --resume {out}"]


def stderr_as(path: str | None, flags: int) -> Callable[[], None]:
    """The child's stderr (descriptor 2) closed (`2>&-`, path None) or opened on `path` with `flags`."""
    def child() -> None:
        if path is None:
            os.close(2)
        else:
            os.dup2(os.open(path, flags), 2)
    return child


@pytest.mark.parametrize("stderr", [stderr_as(None, 0), stderr_as(os.devnull, os.O_RDONLY),
                                    stderr_as("/dev/full", os.O_WRONLY)], ids=["closed", "read-only", "full"])
def test_a_run_with_its_stderr_closed_or_unwritable_finishes(tmp_path, stderr):
    """`2>&-`, `2</dev/null` and `2>/dev/full`: the progress bar cannot be written, the run finishes."""
    out = tmp_path / "run"
    done = subprocess.run([*EDGEFL, "run", "quickstart", "--dry-run", "--set", "rounds=2", "--out", str(out)],
                          cwd=ROOT, stdout=subprocess.PIPE, text=True, preexec_fn=stderr)
    assert done.returncode == 0, done.stdout
    assert (out / "summary.json").is_file()
