"""A run met by signals and closed streams (issue 39, "processes and signals"): SIGTERM is Ctrl-C (one
line, exit 130, no worker process left, the checkpoint resumable), a training worker killed mid-run
is one line naming it and how to resume, and a run whose stderr is closed still finishes."""

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
# quickstart's two threads train each round's clients in two parts, the second in a worker process
LONG = ["run", "quickstart", "--set", "rounds=40", "--set", "evaluation.every=40", "--quiet"]


def start(args: list[str], **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen([*EDGEFL, *args], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kw)  # type: ignore[call-overload]


def workers_of(process: subprocess.Popen[str]) -> list[psutil.Process]:
    """The training worker processes `process` started (each in a session of its own)."""
    return [p for p in psutil.Process(process.pid).children(recursive=True)
            if "edgefl.execution.workers" in " ".join(p.cmdline())]


def after_checkpoint(process: subprocess.Popen[str], out: Path) -> list[psutil.Process]:
    """Wait (at most 120 s) until the run checkpointed a round and has its worker; return the workers."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        found = workers_of(process)
        if found and (out / "checkpoint.pt").exists():
            return found
        time.sleep(0.2)
    raise AssertionError(f"the run ended or stalled before its first checkpoint: {process.communicate()}")


def test_sigterm_is_ctrl_c_no_worker_is_left_and_the_run_resumes(tmp_path):
    out = tmp_path / "run"
    process = start([*LONG, "--out", str(out)])
    found = after_checkpoint(process, out)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130
    assert err == ("edgefl: terminated (SIGTERM); continue from its last checkpoint with edgefl run "
                   f"--resume {out}\n")
    psutil.wait_procs(found, timeout=10)
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in found)
    state = torch.load(out / "checkpoint.pt", weights_only=True)  # intact: what --resume reads first
    assert 1 <= state["next_round"] < 40


def test_a_killed_training_worker_is_one_line_that_says_how_to_resume(tmp_path):
    out = tmp_path / "run"
    process = start([*LONG, "--out", str(out)])
    found = after_checkpoint(process, out)
    found[0].kill()
    _, err = process.communicate(timeout=120)
    assert process.returncode == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"edgefl: error: training worker process {found[0].pid}: exit: it died")
    assert err.endswith(f"continue from its last checkpoint with edgefl run --resume {out}\n")


def test_a_run_with_its_stderr_closed_finishes(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([*EDGEFL, "run", "quickstart", "--dry-run", "--set", "rounds=2", "--out", str(out)],
                          cwd=ROOT, stdout=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(2))
    assert done.returncode == 0, done.stdout
    assert (out / "summary.json").is_file()
