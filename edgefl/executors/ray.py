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
unless `ray.trust_address = true`. Joining a cluster is one edgefl line when its head stops answering
or lets the run wait JOIN_S, and SIGTERM stops a run on Ray as it stops one in-process (Ray's own
handler, which exits without a word, is undone).

Fault injection: a worker that finds the file named by EDGEFL_FAULT_ONCE deletes it and exits,
once, which is how the tests check that a dead worker's task is retried.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from edgefl.config import RayConfig
from edgefl.errors import EdgeflError, Terminated
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
        start = functools.partial(ray.init, address=cfg.address or "local", num_cpus=cpus,
                                  include_dashboard=False, log_to_driver=False, configure_logging=False)
        with _sigterm_kept():
            if cfg.address:
                _joined(start, cfg.address, where)
            else:
                start()  # in this thread: the processes of a local Ray end with the thread that made them
    return ray


@contextlib.contextmanager
def _sigterm_kept() -> Iterator[None]:
    """`ray.init`, called in the main thread, sets a SIGTERM handler of its own (exit at once, without
    a word): the one before it (the CLI's: stop as Ctrl-C does, say how to resume) is put back after,
    and a SIGTERM that Ray's handler met meanwhile is the CLI's Terminated."""
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    except SystemExit as exc:
        if exc.code != signal.SIGTERM:
            raise
        raise Terminated from None
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)


JOIN_S = 60.0  # how long joining a cluster whose head answers may take (a second or two when it is up)


def _joined(start: Callable[[], Any], address: str, where: str) -> None:
    """`start()` (ray.init) joining the cluster at `address`, in a thread of its own: Ray's core
    retries a head that stopped answering for minutes, inside calls that hold off signals. This thread
    waits instead, SIGTERM and Ctrl-C heard at once: it asks the head every PROBE_S, and stops with one
    line when it no longer answers or the join takes JOIN_S (the thread left behind ends with the
    process)."""
    failed: list[BaseException] = []
    thread = threading.Thread(target=_kept_failure, args=(start, failed), daemon=True)
    told = logging.getLogger("ray._private.worker")  # would say it set no SIGTERM handler: edgefl's stays
    told.disabled = True
    thread.start()
    deadline = time.monotonic() + JOIN_S
    try:
        while thread.is_alive():
            thread.join(PROBE_S)
            why = _unanswered(address, PROBE_S) if thread.is_alive() else ""
            if why or time.monotonic() > deadline:
                raise _not_joined(address, why, where)
    finally:
        told.disabled = False
    if failed:
        raise failed[0]


def _not_joined(address: str, why: str, where: str) -> EdgeflError:
    """The line of a join given up: the head gone (`why`), or silent for JOIN_S."""
    what = f"no longer answers ({why})" if why else f"answers but did not let this run join in {JOIN_S:.0f} s"
    lost = EdgeflError(where, "ray.address", f"the Ray cluster at {address} {what} while the run started; "
                       "check it (ray status) or start it again (ray start --head), or leave ray.address "
                       "empty for a local Ray")
    lost.resumable = True  # the CLI says how to go on with this run folder
    return lost


def _kept_failure(start: Callable[[], Any], failed: list[BaseException]) -> None:
    """start(), what it raised kept in `failed` (for the thread that waits on this one)."""
    try:
        start()
    except BaseException as exc:
        failed.append(exc)


class RayExecutor:
    def __init__(self, cfg: RayConfig, where: str, method: Method, rebuild: Callable[[], Method]) -> None:
        ray = started_ray(cfg, where)
        self.ray, self.method, self.rebuild = ray, method, rebuild
        gpus = 1 if method.ctx.device.type == "cuda" else 0  # Ray hides GPUs from tasks that ask for none
        self.task = ray.remote(num_cpus=1, num_gpus=gpus, max_retries=cfg.max_retries)(_train_group)

    def train(self, round_: int, plans: dict[int, ClientPlan]) -> list[ClientUpdate]:
        try:
            snapshot = self.ray.put(self.method.state())
        except self.ray.exceptions.RayError as exc:
            raise failure(exc, f"round {round_}'s model state") from None
        sent = [(list(group), self.task.remote(self.rebuild, snapshot, round_, group))
                for group in groups(self.method, round_, plans)]
        device = self.method.ctx.device
        updates = [ClientUpdate(u.client, restore(None, u.state, device), u.num_samples, u.loss,
                                restore(None, u.extra, device), u.real_compute_s)
                   for clients, ref in sent for u in fetched(self.ray, ref, _named(clients))]
        return in_order(updates, plans)


def _named(clients: list[int]) -> str:
    return f"client{'s' if len(clients) > 1 else ''} {', '.join(map(str, clients))}"


PROBE_S = 1.0  # how often a wait on the cluster checks that its head still answers


def first_ready(ray: Any, refs: list[Any], where: str) -> Any:
    """The first of `refs` to finish. Before the wait, and every PROBE_S without one, the cluster's
    head (its GCS) must still accept a connection: a driver that has lost it is ended by Ray's own
    core about a minute later, with no word of edgefl's and no chance to say how to go on, even
    while its tasks, on nodes that outlive the head, still finish."""
    while True:
        head = ray.get_runtime_context().gcs_address
        why = _unanswered(head, PROBE_S)
        if why:
            lost = EdgeflError(where, "ray", f"the Ray cluster's head at {head} no longer answers ({why}); "
                               "the round in progress was lost")
            lost.resumable = True
            raise lost
        ready, _ = ray.wait(refs, num_returns=1, timeout=PROBE_S)
        if ready:
            return ready[0]


def fetched(ray: Any, ref: Any, where: str) -> Any:
    """What the task `ref` returned, once it has (first_ready); Ray's failure as one line naming
    `where` (failure)."""
    try:
        return ray.get(first_ready(ray, [ref], where))
    except ray.exceptions.RayError as exc:
        raise failure(exc, where) from None


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
    why = _unanswered(address, CONNECT_S)
    if why:
        raise EdgeflError(where, "ray.address", f"no Ray cluster answers at {address} ({why}); start it "
                          "(ray start --head) or check the address, or leave it empty for a local "
                          "Ray")


def _unanswered(address: str, timeout: float) -> str:
    """Why `host:port` (or `ray://host:port`) accepts no connection within `timeout` seconds; "" when
    it does, or when `address` names no port (Ray's to find)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return ""
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        return exc.strerror or str(exc)
    return ""


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
