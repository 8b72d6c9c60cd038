"""A run met by signals and closed streams (issue 39, "processes and signals"): SIGTERM is Ctrl-C (one
line, exit 130, no child process left, the checkpoint resumable), and a run whose stderr is closed
still finishes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import torch

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


def test_a_run_with_its_stderr_closed_finishes(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([*EDGEFL, "run", "quickstart", "--dry-run", "--set", "rounds=2", "--out", str(out)],
                          cwd=ROOT, stdout=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(2))
    assert done.returncode == 0, done.stdout
    assert (out / "summary.json").is_file()
