"""Worker processes for a grouped round's CPU parts (edgefl.execution.workers): what crosses the
pipe comes back as it went, results come back in order, and a worker's failure is this process's
error, after which the next call gets a fresh worker."""

from __future__ import annotations

import functools
import math
import operator
import os
import pickle
import threading
import time
from pathlib import Path
from typing import IO

import pytest
import torch
from torch import nn

from edgefl.errors import WorkerDied
from edgefl.execution import workers
from edgefl.execution.workers import PartWorker, dumps, run_parts


def test_tensors_cross_with_their_values_dtype_layout_and_kind() -> None:
    weight = nn.Parameter(torch.randn(8, 3, 3, 3).to(memory_format=torch.channels_last))
    frozen = nn.Parameter(torch.ones(2), requires_grad=False)
    ints, flags, scalar = torch.arange(6).view(2, 3), torch.tensor([True, False]), torch.tensor(7)
    half, empty = torch.randn(3, 2).to(torch.bfloat16), torch.zeros(0, 4)
    sent = {"w": weight, "f": frozen, "i": ints, "b": flags, "s": scalar, "h": half, "e": empty}
    got = pickle.loads(dumps(sent))
    assert type(got["w"]) is nn.Parameter and got["w"].requires_grad
    assert got["w"].stride() == weight.stride() and torch.equal(got["w"], weight)
    assert type(got["f"]) is nn.Parameter and not got["f"].requires_grad
    for key, want in (("i", ints), ("b", flags), ("s", scalar), ("h", half), ("e", empty)):
        assert type(got[key]) is torch.Tensor and got[key].dtype == want.dtype
        assert got[key].shape == want.shape and torch.equal(got[key], want)


def test_a_view_sends_only_its_own_elements() -> None:
    big = torch.zeros(1_000_000)
    view = big[10:20]
    assert len(dumps(view)) < 1000  # not the 4 MB storage under it
    assert torch.equal(pickle.loads(dumps(view)), view)


def test_a_sparse_tensor_goes_through_torchs_own_pickling() -> None:
    sparse = torch.eye(3).to_sparse()
    assert torch.equal(pickle.loads(dumps(sparse)).to_dense(), torch.eye(3))


def test_a_module_crosses_whole() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    back = pickle.loads(dumps(model))
    assert [type(p) for p in back.parameters()] == [nn.Parameter] * 4
    for (k, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(a, b), k


def test_parts_run_at_once_in_order_each_on_one_torch_thread() -> None:
    torch.set_num_threads(2)
    assert run_parts(operator.add, [(1, 2), (3, 4), (5, 6)]) == [3, 7, 11]
    assert run_parts(torch.get_num_threads, [(), ()]) == [1, 1]
    assert torch.get_num_threads() == 2
    pids = run_parts(os.getpid, [(), ()])
    assert pids[0] == os.getpid() != pids[1]


def meet(folder: Path, me: str, other: str) -> bool:
    """Leave a mark and wait (up to 60 s) for the other's: True only if both ran at once."""
    (folder / me).touch()
    deadline = time.monotonic() + 60
    while not (folder / other).exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_parts_run_at_the_same_time(tmp_path: Path) -> None:
    assert run_parts(meet, [(tmp_path, "a", "b"), (tmp_path, "b", "a")]) == [True, True]


def test_an_exception_in_a_worker_is_raised_here_and_the_worker_stays() -> None:
    run_parts(operator.add, [(1, 2), (3, 4)])
    worker = workers._WORKERS[0]
    with pytest.raises(ValueError, match="math domain error"):
        run_parts(math.sqrt, [(4.0,), (-1.0,)])
    assert run_parts(operator.add, [(1, 2), (3, 4)]) == [3, 7]
    assert workers._WORKERS[0] is worker


def test_an_abandoned_call_does_not_answer_the_next_one() -> None:
    """The first part fails here while the worker still trains: its late reply (2.0) must not be
    taken for the next call's; the busy worker is replaced."""
    with pytest.raises(ValueError):
        run_parts(math.sqrt, [(-1.0,), (4.0,)])
    assert run_parts(operator.add, [(1, 2), (3, 4)]) == [3, 7]


class Locked(Exception):
    """An exception that cannot be pickled (it holds a lock)."""

    def __init__(self) -> None:
        super().__init__("locked out")
        self.lock = threading.Lock()


def raise_locked_in_a_worker(parent: int) -> None:
    if os.getpid() != parent:
        raise Locked()


class Unreadable:
    """An argument whose unpickling fails in the worker (1 / 0)."""

    def __reduce__(self) -> tuple[object, tuple[int, int]]:
        return operator.truediv, (1, 0)


def test_what_a_worker_cannot_send_back_or_read_is_an_error_here_and_the_worker_stays() -> None:
    run_parts(operator.add, [(1, 2), (3, 4)])
    worker = workers._WORKERS[0]
    with pytest.raises(RuntimeError, match="Locked: locked out"):
        run_parts(raise_locked_in_a_worker, [(os.getpid(),), (os.getpid(),)])
    with pytest.raises(ZeroDivisionError) as caught:
        run_parts(id, [(0,), (Unreadable(),)])
    assert "in the training worker process" in "".join(caught.value.__notes__)
    assert run_parts(operator.add, [(1, 2), (3, 4)]) == [3, 7]
    assert workers._WORKERS[0] is worker


def test_a_call_cut_short_while_sent_does_not_stall_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt after the length went but before the pickle did: the worker, which would read
    the next call as the rest of this one, is replaced."""
    run_parts(operator.add, [(1, 2), (3, 4)])
    write = workers._write

    def cut(pipe: IO[bytes], data: bytes) -> None:
        pipe.write(len(data).to_bytes(8, "little"))
        pipe.flush()
        raise KeyboardInterrupt

    monkeypatch.setattr(workers, "_write", cut)
    with pytest.raises(KeyboardInterrupt):
        run_parts(operator.add, [(1, 2), (3, 4)])
    monkeypatch.setattr(workers, "_write", write)
    assert run_parts(operator.add, [(5, 6), (7, 8)]) == [11, 15]


def test_what_a_worker_prints_is_printed_not_read_as_a_reply(capfd: pytest.CaptureFixture[str]) -> None:
    workers._stop_all()  # a worker started now writes where this test captures
    say = functools.partial(print, flush=True)
    assert run_parts(say, [("here",), ("from the worker",)]) == [None, None]
    assert "from the worker" in capfd.readouterr().out


def test_ready_waits_for_the_workers_to_answer() -> None:
    workers._stop_all()
    workers.ready(1)
    assert [w.answered for w in workers._WORKERS] == [True]


def test_a_start_up_wait_cut_short_does_not_answer_the_next_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while `ready` waits for a new worker: its reply to `ready`'s call (0) is never read,
    so the worker is replaced rather than asked again."""
    workers._stop_all()
    read = workers._read

    def cut(pipe: IO[bytes]) -> bytes:
        monkeypatch.setattr(workers, "_read", read)
        raise KeyboardInterrupt

    monkeypatch.setattr(workers, "_read", cut)
    with pytest.raises(KeyboardInterrupt):
        workers.ready(1)
    assert run_parts(operator.add, [(1, 2), (3, 4)]) == [3, 7]
    assert run_parts(operator.add, [(5, 6), (7, 8)]) == [11, 15]


def test_a_dead_worker_is_an_error_naming_it_and_is_replaced() -> None:
    worker = PartWorker()
    worker.send(time.sleep, (30,))
    worker.process.kill()
    with pytest.raises(WorkerDied, match=f"worker process {worker.process.pid}: exit: it died"):
        worker.receive()
    worker.stop()
    run_parts(operator.add, [(1, 2), (3, 4)])
    workers._WORKERS[0].process.kill()
    workers._WORKERS[0].process.wait()
    assert run_parts(operator.add, [(1, 2), (3, 4)]) == [3, 7]


def test_edgefl_errors_cross_a_process_boundary_whole() -> None:
    """A Ray task's or a worker's error comes back pickled: the class, its fields and its line."""
    import pickle

    from edgefl.errors import EdgeflError, NotARunError

    for error in (EdgeflError("s.toml", "rounds", "must be 1 or more"), WorkerDied(41, -9),
                  NotARunError("run", "metrics.csv", "missing")):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
        assert (back.where, back.key, back.fix) == (error.where, error.key, error.fix)
    assert pickle.loads(pickle.dumps(WorkerDied(41, -9))).resumable
