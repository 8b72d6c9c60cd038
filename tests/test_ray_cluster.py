"""edgefl on a multi-node Ray cluster (issue 39): a head and two worker nodes on this machine
(`ray.cluster_utils.Cluster`, on this machine's own address, as a local Ray is; a driver could not
join one bound to 127.0.0.1 here). A run gives the files an in-process run
gives, and still does when a worker node is removed while the round's tasks run on it: Ray runs each
lost task again on a node that is left (`ray.max_retries`, 3 by default)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgefl.cli import main

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from test_fidelity import simulated_rows  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["rounds=2", "fleet.clients=6", "training.local_iters=4", "attack.steps=2", "evaluation.steps=2",
         "data.test_samples=32", "threads=1"]


@pytest.fixture
def cluster() -> Iterator[Any]:
    """A head of one CPU and two worker nodes of one CPU each; shut down after the test."""
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.workers = [c.add_node(num_cpus=1), c.add_node(num_cpus=1)]
    c.wait_for_nodes()
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def test_a_run_on_a_cluster_that_loses_a_node_mid_round_gives_the_in_process_files(cluster, tmp_path,
                                                                                 monkeypatch):
    real_get, lost = ray.get, []

    def get(refs: Any, *args: Any, **kwargs: Any) -> Any:
        """The first round's tasks are out: the first worker node goes, with what runs on it."""
        if not lost:
            lost.append(cluster.workers[0])
            cluster.remove_node(cluster.workers[0])
        return real_get(refs, *args, **kwargs)

    monkeypatch.setattr(ray, "get", get)
    run = ["run", str(ROOT / "scenarios" / "quickstart.toml"), *sets(SMALL), "--quiet"]
    joins = [f'ray.address="{cluster.address}"', "ray.trust_address=true"]  # this machine's own address
    assert main([*run, *sets(joins), "--executor", "ray",
                 "--out", str(tmp_path / "cluster")]) == 0
    assert lost and len([n for n in ray.nodes() if n["Alive"]]) == 2  # the head and one worker node left
    monkeypatch.undo()
    assert main([*run, "--out", str(tmp_path / "local")]) == 0
    ours, theirs = tmp_path / "cluster", tmp_path / "local"
    assert (ours / "metrics.csv").read_text() == (theirs / "metrics.csv").read_text()
    assert simulated_rows(ours / "clients.csv") == simulated_rows(theirs / "clients.csv")
