"""edgefl on a multi-node Ray cluster (issue 39): a head and two worker nodes on this machine
(`ray.cluster_utils.Cluster`, on this machine's own address, as a local Ray is; a driver could not
join one bound to 127.0.0.1 here). A run gives the files an in-process run
gives, and still does when a worker node is removed while the round's tasks run on it: Ray runs each
lost task again on a node that is left (`ray.max_retries`, 3 by default). A head lost mid-round
stops the run in one line, and it resumes in-process to the same files."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edgefl import rundir
from edgefl.cli import main

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from support import simulated_rows  # noqa: E402

pytestmark = pytest.mark.slow  # Ray clusters started and killed, drivers in processes of their own
ROOT = Path(__file__).resolve().parents[1]
SMALL = ["rounds=3", "fleet.clients=6", "training.local_iters=4", "attack.steps=2", "evaluation.steps=2",
         "data.test_samples=32", "threads=1"]


@pytest.fixture
def cluster() -> Iterator[Any]:
    """A head of one CPU and two worker nodes of one CPU each; shut down after the test."""
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.workers = [c.add_node(num_cpus=1, node_name=f"worker{i}") for i in range(2)]
    c.wait_for_nodes()
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


RUN = ["run", str(ROOT / "scenarios" / "quickstart.toml"), *sets(SMALL), "--quiet"]


def on_cluster(cluster: Any) -> list[str]:
    return sets([f'ray.address="{cluster.address}"', "ray.trust_address=true"])  # this machine's own


def when_tasks_are_out(monkeypatch: Any, fault: Callable[[], None],
                       when: Callable[[], bool] = lambda: True) -> list[int]:
    """`fault()` once, when the driver first waits for a round's tasks with `when()` true; returns a
    list that holds 1 once it has."""
    real_wait, done = ray.wait, []

    def wait(refs: Any, *args: Any, **kwargs: Any) -> Any:
        if not done and when():
            done.append(1)
            fault()
        return real_wait(refs, *args, **kwargs)

    monkeypatch.setattr(ray, "wait", wait)
    return done


def same_files(ours: Path, theirs: Path) -> None:
    assert (ours / "metrics.csv").read_text() == (theirs / "metrics.csv").read_text()
    assert simulated_rows(ours / "clients.csv") == simulated_rows(theirs / "clients.csv")


def test_a_run_on_a_cluster_that_loses_a_node_mid_round_gives_the_in_process_files(cluster, tmp_path,
                                                                                 monkeypatch):
    """The first round's tasks are out: the first worker node goes, with what runs on it."""
    lost = when_tasks_are_out(monkeypatch, lambda: cluster.remove_node(cluster.workers[0]))
    assert main([*RUN, *on_cluster(cluster), "--executor", "ray", "--out", str(tmp_path / "cluster")]) == 0
    assert lost and len([n for n in ray.nodes() if n["Alive"]]) == 2  # the head and one worker node left
    monkeypatch.undo()
    assert main([*RUN, "--out", str(tmp_path / "local")]) == 0
    same_files(tmp_path / "cluster", tmp_path / "local")


# The driver of the head-kill test, in a process of its own: Ray's core ends a driver whose head is
# gone by itself about a minute later (even after ray.shutdown(), now and then), which must not end
# the test run. It joins the cluster through worker1's raylet, as a driver on a machine that outlives
# the head (Ray would pick the head's raylet on this machine, and a driver whose own raylet is killed
# is ended by Ray at once, with exit 1 and no word, as a driver on a head machine that dies would
# be). It kills the head's processes (by pid) when it first waits for a round's tasks once round 0
# is checkpointed, then runs edgefl; exit 3 if the kill never came.
HEADLESS_DRIVER = """
import json, os, signal, sys
from pathlib import Path
import ray
from ray._private import services
from edgefl.cli import main

pids, checkpoint, args = json.loads(sys.argv[1])
node_for = services.get_node_to_connect_for_driver
services.get_node_to_connect_for_driver = lambda gcs, **kw: node_for(gcs, **{**kw, "node_name": "worker1"})
real_wait, done = ray.wait, []
def wait(refs, *more, **kw):
    if not done and Path(checkpoint).exists():
        done.append(1)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    return real_wait(refs, *more, **kw)
ray.wait = wait
code = main(args)
sys.stderr.flush()
os._exit(code if done else 3)
"""


def test_a_run_whose_cluster_loses_its_head_stops_in_one_line_and_resumes_in_process(cluster, tmp_path):
    """The head's processes killed (its GCS and raylet) while round 1's tasks run: Ray itself raises
    nothing, may even finish the tasks on the worker nodes, and would end the driver a minute later;
    edgefl finds the head gone at its next wait for a task (executors.ray `first_ready`), stops
    with one line and exit 2, and `--resume --executor local` ends with the files of a run that lost
    nothing."""
    out = tmp_path / "cluster"
    pids = [p.process.pid for procs in cluster.head_node.all_processes.values() for p in procs]
    args = [*RUN, *on_cluster(cluster), "--executor", "ray", "--out", str(out)]
    done = subprocess.run([sys.executable, "-c", HEADLESS_DRIVER,
                           json.dumps([pids, str(out / rundir.CHECKPOINT), args])],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("edgefl:")]
    assert len(said) == 1 and "ray: the Ray cluster's head at " in said[0], said
    assert "no longer answers" in said[0] and f"edgefl run --resume {out}" in said[0]
    assert main(["run", "--resume", str(out), "--executor", "local", "--quiet"]) == 0
    assert main([*RUN, "--out", str(tmp_path / "local")]) == 0
    same_files(out, tmp_path / "local")
