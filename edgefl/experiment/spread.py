"""A comparison's runs spread over a Ray cluster: with `executor = "ray"`, `edgefl compare` sends each
(method, seed) run that is not finished as one Ray task, and they run side by side.

A task prepares its run where it lands and trains its clients in that process (`Experiment.clients_here`;
the Ray executor's updates equal in-process ones, edgefl.executors.ray), writing the run folder as
`edgefl run` does: the folder must be on storage every node sees (a local Ray, or a shared file
system). A task whose worker dies is retried up to `ray.max_retries` times, and the retry resumes
from the run's last checkpoint (`start_or_resume`). The driver prints each run's line as it ends.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgefl.errors import EdgeflError
from edgefl.executors.ray import die_once_on_fault, fetched, first_ready, started_ray
from edgefl.experiment.loop import start_or_resume
from edgefl.experiment.prepare import prepare
from edgefl.scenario import Scenario, scenario_from_toml, to_toml
from edgefl.training.local import resolve_device


@dataclass(frozen=True)
class Job:
    """One run as a task: its resolved scenario, its file and run folder (absolute), dry or trained."""

    text: str
    where: str
    out: str
    dry_run: bool
    cwd: str  # the driver's working folder: relative paths in the scenario (data.root) mean the same


def job(scenario: Scenario, where: str, out: Path, dry_run: bool) -> Job:
    return Job(to_toml(scenario), str(Path(where).resolve()), str(out.resolve()), dry_run, os.getcwd())


def run_job(task: Job) -> dict[str, Any]:
    """Runs on a Ray worker: prepare the run, train its clients here, return its summary."""
    die_once_on_fault()
    os.chdir(task.cwd)
    scenario = scenario_from_toml(tomllib.loads(task.text), task.where)
    exp = replace(prepare(scenario, task.where, dry_run=task.dry_run), clients_here=True)
    return start_or_resume(exp, Path(task.out), progress=False)


def run_spread(jobs: list[tuple[str, Scenario, Job]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every job as a Ray task on the cluster of the first scenario's `[ray]` section; yields each
    (name, summary) as its run ends. A run's error (a missing dataset, a full disk) is raised here as
    the one line it would be in-process."""
    _, first, _ = jobs[0]
    ray = started_ray(first.ray, jobs[0][2].where)
    gpus = 1 if resolve_device(first.device).type == "cuda" else 0
    cpus, there = max(first.threads, 1), int(ray.cluster_resources().get("CPU", 0))
    if cpus > there:
        raise EdgeflError(jobs[0][2].where, "threads", f"a run asks for {cpus} CPUs and the Ray cluster has "
                          f"{there}, so no run could start; lower threads")
    task = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=first.ray.max_retries)(run_job)
    pending = {task.remote(j): name for name, _, j in jobs}
    try:
        while pending:
            ready = first_ready(ray, list(pending), "the Ray cluster")
            name = pending.pop(ready)
            yield name, dict(fetched(ray, ready, name))  # its error: its own, or its worker's or node's
    finally:  # a run failed or the driver was interrupted: the others stop at their last checkpoint
        for ref in pending:
            ray.cancel(ref, force=True)
