"""The Ray executor: each selected client's local training (each group's, edgefl.executors.executor
`groups`) runs as a Ray task.

Every round the driver puts one snapshot of the method's state (edgefl.snapshot) in Ray's object
store; a task remakes the method once per worker process from the recipe the experiment gives (the
resolved scenario and its file: edgefl.experiment.prepare.Rebuild, so the worker needs the dataset at
`data.root`, as the driver does), loads the snapshot and trains its client, or its group of clients
trained together, with their plans (`train_timed_group`, as in-process). Training is seeded per (seed,
round, client) and never writes the method's state, so the updates equal the in-process executor's
on the same hardware.
A task whose worker process dies is retried up to `ray.max_retries` times. Ray moves the state and
the task's code with cloudpickle, so whoever runs the cluster runs code edgefl sends and sends back
objects edgefl unpickles: scenario validation (edgefl.scenario) refuses an address not on this machine
unless `ray.trust_address = true`.

Fault injection: a worker that finds the file named by EDGEFL_FAULT_ONCE deletes it and exits,
once, which is how the tests check that a dead worker's task is retried.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgefl.config import RayConfig
from edgefl.errors import EdgeflError
from edgefl.executors.executor import groups, in_order, train_timed_group
from edgefl.methods import ClientPlan, ClientUpdate, Method
from edgefl.snapshot import plain, restore

_WORKER: dict[Callable[[], Method], Method] = {}  # the recipe -> the worker's method


def started_ray(cfg: RayConfig, where: str) -> Any:
    """The `ray` module, joined to the cluster at `ray.address` or to a new local Ray of `ray.workers`
    CPUs (once per process; "local": never a cluster this machine runs already, whose CPUs are not
    the workers asked for)."""
    try:
        import ray
    except ImportError:
        raise EdgeflError(where, "executor", "ray is not installed; pip install ray, "
                          'or use executor = "local"') from None
    if not ray.is_initialized():
        cpus = None if cfg.address else (cfg.workers or None)  # a cluster brings its own
        ray.init(address=cfg.address or "local", num_cpus=cpus, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    return ray


class RayExecutor:
    def __init__(self, cfg: RayConfig, where: str, method: Method, rebuild: Callable[[], Method]) -> None:
        ray = started_ray(cfg, where)
        self.ray, self.method, self.rebuild = ray, method, rebuild
        gpus = 1 if method.ctx.device.type == "cuda" else 0  # Ray hides GPUs from tasks that ask for none
        self.task = ray.remote(num_cpus=1, num_gpus=gpus, max_retries=cfg.max_retries)(_train_group)

    def train(self, round_: int, plans: dict[int, ClientPlan]) -> list[ClientUpdate]:
        snapshot = self.ray.put(self.method.state())
        sent = [(list(group), self.task.remote(self.rebuild, snapshot, round_, group))
                for group in groups(self.method, round_, plans)]
        device = self.method.ctx.device
        updates = [ClientUpdate(u.client, restore(None, u.state, device), u.num_samples, u.loss,
                                restore(None, u.extra, device), u.real_compute_s)
                   for clients, ref in sent for u in self._got(ref, clients)]
        return in_order(updates, plans)

    def _got(self, ref: Any, clients: list[int]) -> list[ClientUpdate]:
        """A group's updates; Ray's failure as one line naming the clients (edgefl's own error as is)."""
        try:
            return list(self.ray.get(ref))
        except self.ray.exceptions.RayError as exc:
            raise failure(exc, f"client{'s' if len(clients) > 1 else ''} {', '.join(map(str, clients))}"
                          ) from None


def failure(exc: Exception, where: str) -> EdgeflError:
    """Why a Ray task (the clients or the run `where` names) failed, as one line naming the setting to
    change: out of memory, Ray's object store full, or the cluster itself failing (a lost head or
    node after the retries: the run's last checkpoint is intact, the CLI says how to go on); an error
    of edgefl's inside the task is itself."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, EdgeflError):
        return cause
    name = type(exc).__name__
    if name == "OutOfMemoryError":
        return EdgeflError(where, "ray.workers", "its Ray task ran out of memory on its node; lower "
                           "ray.workers (fewer tasks at once) or training.batch_size")
    if name == "ObjectStoreFullError":
        return EdgeflError(where, "ray.workers", "Ray's object store is full; lower ray.workers, or give "
                           "each node more (ray start --object-store-memory)")
    reason = (str(exc).strip().splitlines() or [""])[0][:200]
    lost = EdgeflError(where, "ray", f"the Ray cluster failed ({name}: {reason}) after ray.max_retries "
                       "retries; the round in progress was lost")
    lost.resumable = True
    return lost


CONNECT_S = 10.0  # how long a cluster's head may take to accept a connection


def check_reachable(address: str, where: str) -> None:
    """Refuse, in one line, a `host:port` (or `ray://host:port`) address whose port does not accept a
    connection within CONNECT_S: `ray.init` would retry it for minutes, printing only Ray's own
    messages. "" (a local Ray) and "auto" (whatever cluster this machine joined) are Ray's to find."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_S).close()
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise EdgeflError(where, "ray.address", f"no Ray cluster answers at {address} ({why}); start it "
                          "(ray start --head) or check the address, or leave it empty for a local "
                          "Ray") from None


def _train_group(rebuild: Callable[[], Method], snapshot: dict[str, Any], round_: int,
                 plans: dict[int, ClientPlan]) -> list[ClientUpdate]:
    """Runs on a Ray worker: one client, or a group trained together."""
    die_once_on_fault()
    method = _worker_method(rebuild)
    method.load_state(snapshot)
    return [ClientUpdate(u.client, plain(u.state), u.num_samples, u.loss, plain(u.extra), u.real_compute_s)
            for u in train_timed_group(method, round_, plans)]


def die_once_on_fault() -> None:
    """The fault injection of the tests: the one worker that deletes the file named by
    EDGEFL_FAULT_ONCE exits at once; the others go on."""
    fault = os.environ.get("EDGEFL_FAULT_ONCE")
    if fault:
        try:
            Path(fault).unlink()
        except FileNotFoundError:
            pass
        else:
            os._exit(1)


def _worker_method(rebuild: Callable[[], Method]) -> Method:
    if rebuild not in _WORKER:
        _WORKER.clear()
        _WORKER[rebuild] = rebuild()
    return _WORKER[rebuild]
