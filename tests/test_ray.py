"""The Ray executor on a local Ray: the same model and simulated times as in-process, and a worker
that dies is retried."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

from edgefl import rundir
from edgefl.cli import main

ray = pytest.importorskip("ray")
from support import QUICKSTART, ROOT, simulated_rows  # noqa: E402

SMALL = ["rounds=2", "fleet.clients=6", "training.local_iters=4", "attack.steps=2", "evaluation.steps=2",
         "data.test_samples=32", "threads=1", "ray.workers=2"]


def sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


@pytest.mark.slow
def test_ray_matches_in_process_and_survives_a_dead_worker(tmp_path, monkeypatch):
    fault = tmp_path / "kill-one-worker"
    fault.touch()
    monkeypatch.setenv("EDGEFL_FAULT_ONCE", str(fault))  # inherited by the local Ray's workers
    try:
        assert main(["run", str(QUICKSTART), *sets(SMALL), "--out", str(tmp_path / "ray"), "--quiet",
                     "--executor", "ray"]) == 0
    finally:
        ray.shutdown()
    assert not fault.exists(), "no worker died, so the retry was not exercised"
    monkeypatch.delenv("EDGEFL_FAULT_ONCE")
    assert main(["run", str(QUICKSTART), *sets(SMALL), "--out", str(tmp_path / "local"), "--quiet"]) == 0
    ray_run, local_run = tmp_path / "ray", tmp_path / "local"
    assert (ray_run / "metrics.csv").read_text() == (local_run / "metrics.csv").read_text()
    assert simulated_rows(ray_run / "clients.csv") == simulated_rows(local_run / "clients.csv")
    ours, theirs = (torch.load(tmp_path / d / rundir.CHECKPOINT, weights_only=True)["method"]
                    for d in ("ray", "local"))
    assert ours["model"].keys() == theirs["model"].keys()
    for key, tensor in ours["model"].items():
        assert torch.equal(tensor, theirs["model"][key]), key
    assert os.environ.get("EDGEFL_FAULT_ONCE") is None


@pytest.mark.slow
def test_a_compare_over_seeds_spreads_its_runs_over_ray_with_the_in_process_files(tmp_path, monkeypatch):
    """Each (method, seed) run is a Ray task that trains its clients where it lands; a worker that
    dies at a task's start is retried; every run's logs equal the in-process comparison's."""
    from edgefl.experiment import loop

    compare = ["compare", str(ROOT / "scenarios" / "compare-digits.toml"), "--methods", "jfat",
               "--seeds", "0,1", "--quiet", *sets([*SMALL, "training.warmup_rounds=1"])]
    fault = tmp_path / "kill-one-worker"
    fault.touch()
    monkeypatch.setenv("EDGEFL_FAULT_ONCE", str(fault))

    def not_here(*args: object) -> None:
        raise AssertionError("a run trained its clients through Ray from the driver: not spread")

    try:
        with monkeypatch.context() as patch:
            patch.setattr(loop, "RayExecutor", not_here)
            assert main([*compare, "--out", str(tmp_path / "ray"), "--executor", "ray"]) == 0
    finally:
        ray.shutdown()
    assert not fault.exists(), "no worker died, so the retry was not exercised"
    monkeypatch.delenv("EDGEFL_FAULT_ONCE")
    assert main([*compare, "--out", str(tmp_path / "local")]) == 0
    for run in ("jfat/seed-0", "jfat/seed-1"):
        ray_run, local_run = tmp_path / "ray" / run, tmp_path / "local" / run
        assert (ray_run / "metrics.csv").read_text() == (local_run / "metrics.csv").read_text(), run
        assert simulated_rows(ray_run / "clients.csv") == simulated_rows(local_run / "clients.csv"), run
    same = [(tmp_path / d / "seeds.csv").read_text() for d in ("ray", "local")]
    assert same[0] == same[1]


@pytest.mark.slow
def test_an_async_run_under_ray_evaluates_as_in_process(tmp_path):
    """The evaluation attack's random starts are drawn from the driver's torch state, which in-process
    training once moved between an async run's client starts (issue 39: PGD 0.13 under Ray, 0.145
    in-process); training now runs on a fork of it, as on a Ray worker."""
    small = sets(["rounds=3", "training.local_iters=2", "attack.steps=2", "evaluation.steps=3",
                  "data.test_samples=64", "evaluation.every=1", "ray.workers=2"])
    args = ["run", str(ROOT / "scenarios" / "async-digits.toml"), *small, "--quiet"]
    try:
        assert main([*args, "--out", str(tmp_path / "ray"), "--executor", "ray"]) == 0
    finally:
        ray.shutdown()
    assert main([*args, "--out", str(tmp_path / "local")]) == 0
    assert (tmp_path / "ray" / "metrics.csv").read_text() == (tmp_path / "local" / "metrics.csv").read_text()


@pytest.mark.parametrize(("error", "says"), [
    ("OutOfMemoryError", "clients 3, 5: ray.workers: its Ray task ran out of memory"),
    ("ObjectStoreFullError", "clients 3, 5: ray.workers: Ray's object store is full"),
    ("RaySystemError", "clients 3, 5: ray: the Ray cluster failed (RaySystemError: System error: gcs lost)"),
])
def test_a_failed_ray_task_is_one_line_naming_its_clients_and_the_setting(error, says):
    from edgefl.executors.ray import failure

    found = failure(getattr(ray.exceptions, error)("gcs lost"), "clients 3, 5")
    assert str(found).startswith(says) and "\n" not in str(found)
    assert found.resumable == (error == "RaySystemError")


def failed_on_ray(tmp_path, capsys) -> list[str]:
    """The lines edgefl printed for a small run on a local Ray that must stop with exit 2."""
    try:
        assert main(["run", str(QUICKSTART), *sets(SMALL), "--out", str(tmp_path / "run"), "--quiet",
                     "--executor", "ray"]) == 2
    finally:
        ray.shutdown()
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("edgefl:")]


@pytest.mark.slow
def test_a_task_that_runs_its_node_out_of_memory_is_one_line_naming_its_clients(tmp_path, monkeypatch,
                                                                              capsys):
    """Ray's memory monitor kills the task (its threshold set at 1 % of the node's memory, no retries
    for an out-of-memory kill): the run stops in one line naming the clients and ray.workers, exit 2."""
    monkeypatch.setenv("RAY_memory_usage_threshold", "0.01")  # read by the local Ray edgefl starts
    monkeypatch.setenv("RAY_memory_monitor_refresh_ms", "50")
    monkeypatch.setenv("RAY_task_oom_retries", "0")
    said = failed_on_ray(tmp_path, capsys)
    assert len(said) == 1 and ": ray.workers: its Ray task ran out of memory on its node" in said[0], said
    assert said[0].startswith("edgefl: error: client")


@pytest.mark.slow
def test_a_full_object_store_for_the_model_state_is_one_line(tmp_path, monkeypatch, capsys):
    """Raised by Ray where the driver puts the round's state (a full store could not be made here: Ray
    falls back to disk, 10 puts of 20 MiB into an 80 MiB store with spilling off all succeeded)."""
    def put(value, *args, **kwargs):
        raise ray.exceptions.ObjectStoreFullError("object store full")

    monkeypatch.setattr(ray, "put", put)
    said = failed_on_ray(tmp_path, capsys)
    assert said == ["edgefl: error: round 0's model state: ray.workers: Ray's object store is full; lower "
                    "ray.workers, or give each node more (ray start --object-store-memory)"], said


@pytest.mark.slow
def test_a_cluster_failing_mid_run_is_one_line_and_the_run_resumes_to_the_same_files(tmp_path, monkeypatch,
                                                                                     capsys):
    """The cluster fails in round 1 (its head lost: every get fails); the run stops with one line and
    its round-0 checkpoint, and `--resume` on a fresh local Ray ends with an uninterrupted run's files."""
    real_get, calls = ray.get, []

    def get(refs, *args, **kwargs):
        calls.append(1)
        if len(calls) > 2:  # round 0's groups came back; round 1's do not
            raise ray.exceptions.RaySystemError("the GCS at the head node is gone")
        return real_get(refs, *args, **kwargs)

    out, whole = tmp_path / "ray", tmp_path / "local"
    run = ["run", str(QUICKSTART), *sets([*SMALL, "rounds=3"]), "--quiet"]
    try:
        with monkeypatch.context() as patch:
            patch.setattr(ray, "get", get)
            assert main([*run, "--executor", "ray", "--out", str(out)]) == 2
    finally:
        ray.shutdown()
    err = [line for line in capsys.readouterr().err.splitlines(keepends=True)  # Ray's own notices aside
           if line.startswith("edgefl:")]
    assert len(err) == 1 and "ray: the Ray cluster failed (RaySystemError: System error: the GCS" in err[0]
    assert err[0].endswith(f"continue from its last checkpoint with edgefl run --resume {out}\n")
    try:
        assert main(["run", "--resume", str(out), "--quiet"]) == 0
    finally:
        ray.shutdown()
    assert main([*run, "--out", str(whole)]) == 0
    assert (out / "metrics.csv").read_text() == (whole / "metrics.csv").read_text()
    assert simulated_rows(out / "clients.csv") == simulated_rows(whole / "clients.csv")


@pytest.mark.slow
def test_a_run_begun_on_ray_resumes_in_process_to_the_same_files(tmp_path):
    """Its driver lost at round 1's checkpoint (killed: the cluster's work is gone with it); `--resume
    --executor local` goes on in-process and ends with the files of a run that never stopped."""
    from support import dies_before_checkpoint

    out, whole = tmp_path / "ray", tmp_path / "local"
    run = ["run", str(QUICKSTART), *sets([*SMALL, "rounds=3"]), "--quiet"]
    try:
        with dies_before_checkpoint(2):
            assert main([*run, "--executor", "ray", "--out", str(out)]) == 130
    finally:
        ray.shutdown()
    assert main(["run", "--resume", str(out), "--executor", "local", "--quiet"]) == 0
    assert main([*run, "--out", str(whole)]) == 0
    assert (out / "metrics.csv").read_text() == (whole / "metrics.csv").read_text()
    assert simulated_rows(out / "clients.csv") == simulated_rows(whole / "clients.csv")


class Head:
    """A cluster head that accepts connections and says nothing (one stuck, or not Ray's), on a
    port of this machine, until `close`; `accepted` counts the connections it took."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.socket.getsockname()[1]}"
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed
            while True:
                self.socket.accept()[0].close()
                self.accepted += 1

    def close(self) -> None:
        self.socket.close()


@pytest.mark.slow  # a run in a process of its own: 20-25 s on 2 busy cores
@pytest.mark.parametrize("then", ["stops answering", "SIGTERM"])
def test_a_head_lost_while_a_run_joins_is_one_edgefl_line(tmp_path, then):
    """ray.init retries a head that stopped answering for minutes, deaf to SIGTERM, saying only Ray's
    lines: the run joins in a thread of its own, and the head asked once a second (the check before
    the run is the first connection, the join's first question the second) going away, or SIGTERM,
    ends it at once with edgefl's line and what to do with the run folder."""
    out, head = tmp_path / "run", Head()
    joins = sets([*SMALL, f'ray.address="{head.address}"', "ray.trust_address=true"])
    edgefl = [sys.executable, "-c", "import sys; from edgefl.cli import main; sys.exit(main())"]
    process = subprocess.Popen([*edgefl, "run", str(QUICKSTART), *joins, "--executor", "ray", "--quiet",
                                "--out", str(out)], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while head.accepted < 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert head.accepted >= 2, "the run never asked the head while it joined"
        if then == "SIGTERM":
            process.send_signal(signal.SIGTERM)
        else:
            head.close()
        _, err = process.communicate(timeout=30)
    finally:
        head.close()
        process.kill()
    said = [line for line in err.splitlines() if line.startswith("edgefl")]
    hint = "; no round was checkpointed: run it again with --overwrite"
    if then == "SIGTERM":
        assert process.returncode == 130 and said == [f"edgefl: terminated (SIGTERM){hint}"], err
    else:
        assert process.returncode == 2 and said == [
            f"edgefl: error: --set: ray.address: the Ray cluster at {head.address} no longer answers "
            "(Connection refused) while the run started; check it (ray status) or start it again (ray start "
            f"--head), or leave ray.address empty for a local Ray{hint}"], err
