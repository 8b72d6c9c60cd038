"""Worker processes for the CPU parts of a grouped round (issue 16; edgefl.execution.grouped).

A grouped round on the CPU trains in one part per torch thread, all at once: the first part in
this process and every other part in a worker process of its own, each on one torch thread. The
parts used to be Python threads of this process, and a thread that found the other holding the
GIL slept until it was handed over and then waited to be woken on its core: about 1,200
voluntary context switches a quickstart round, against about 20 in each process now. In
processes the quickstart round (two parts of five clients) is 1.03x-1.09x faster, median 1.07x,
the same bits (`bench/throughput.py --part processes`, median of 9 alternating rounds, eleven runs).

A worker is a fresh interpreter (`python -P -m edgefl.execution.workers FD`, started in its own
session, so a terminal's Ctrl-C reaches only this process); nothing of this process's threads or
locks is inherited. It is started before the first group that may need it (importing torch: about
2.3 s here) and lives until this process exits or closes its pipe; it holds about 0.4 GB of its
own. A call crosses the worker's stdin, its result a pipe of its own (what the worker prints goes
where this process's output goes), as pickles whose tensors travel as their raw storage bytes
(`dumps`) rather than through torch's own pickling, which writes each storage with `torch.save`
(2.6 against 7 ms for a quickstart part's arguments). Only this process and its own workers read
these pickles. An exception in a worker is raised here, with the worker's traceback as a note; a
worker that dies is replaced by the next call, and one whose call was abandoned (a part failed or
was interrupted meanwhile) is stopped at once.
"""

from __future__ import annotations

import atexit
import io
import os
import pickle
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import IO, Any

import torch
from torch import nn

from edgefl.errors import WorkerDied
from edgefl.execution.allocator import keep_freed_memory


def dumps(obj: object) -> bytes:
    """`pickle.dumps(obj)`, tensors and parameters as (raw storage bytes, dtype, shape, strides):
    a tensor comes back with its own memory layout (channels_last weights stay channels_last)."""
    out = io.BytesIO()
    _TensorPickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return out.getvalue()


class _TensorPickler(pickle.Pickler):
    """Plain CPU tensors and parameters by their bytes; anything else (CUDA, sparse, quantized,
    conjugate or negative views) as torch pickles it."""

    def reducer_override(self, obj: Any) -> Any:
        plain = type(obj) in (torch.Tensor, nn.Parameter)
        if (not plain or obj.device.type != "cpu" or obj.layout != torch.strided or obj.is_quantized
                or obj.is_conj() or obj.is_neg()):
            return NotImplemented
        t = obj.detach()
        if t.storage_offset() or t.untyped_storage().nbytes() != t.numel() * t.element_size():
            t = t.clone()  # a view: only its own elements travel
        raw = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).numpy()
        parameter = type(obj) is nn.Parameter
        return _tensor, (raw, t.dtype, tuple(t.shape), t.stride(), parameter, obj.requires_grad)


def _tensor(raw: Any, dtype: torch.dtype, shape: tuple[int, ...], stride: tuple[int, ...], parameter: bool,
            requires_grad: bool) -> torch.Tensor:
    """A tensor from `_TensorPickler`'s parts."""
    t = torch.from_numpy(raw).view(dtype).as_strided(shape, stride)
    return nn.Parameter(t, requires_grad=requires_grad) if parameter else t.requires_grad_(requires_grad)


class PartWorker:
    """One worker process (`python -m edgefl.execution.workers FD`) that runs calls on one torch
    thread, one at a time: each call a pickle on its stdin, each reply one on the pipe FD (not its
    stdout, where whatever it prints goes as this process's would), each after its length."""

    def __init__(self) -> None:
        if not sys.executable:
            raise RuntimeError("no Python executable to start a training worker process with (sys.executable "
                               "is empty): set threads = 1 or training.group_clients = false")
        # It finds what this process finds (-P: not a module of the working directory first), and
        # what it prints is not held back in a buffer when it is stopped.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PYTHONUNBUFFERED": "1"}
        replies, theirs = os.pipe()
        try:
            self.process = subprocess.Popen([sys.executable, "-P", "-m", __name__, str(theirs)],
                                            pass_fds=(theirs,), stdin=subprocess.PIPE, env=env,
                                            start_new_session=True)
        except BaseException:
            os.close(replies)
            raise
        finally:
            os.close(theirs)
        assert self.process.stdin is not None
        self.requests, self.replies = self.process.stdin, os.fdopen(replies, "rb")
        self.busy = False  # a call sent whose reply is not read yet
        self.answered = False  # it has replied once: it is up

    def send(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        request = dumps((fn, args))  # a call that cannot be pickled leaves the worker idle
        self.busy = True  # from the first byte written: a call cut short leaves it unusable
        try:
            _write(self.requests, request)
        except BrokenPipeError:  # it died since it was last checked
            raise WorkerDied(self.process.pid, self.process.wait()) from None

    def receive(self) -> Any:
        """The result of the call sent last; its exception raised here."""
        try:
            reply = _read(self.replies)
        except EOFError:
            raise WorkerDied(self.process.pid, self.process.wait()) from None
        self.busy, self.answered = False, True
        ok, value = pickle.loads(reply)
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        for pipe in (self.requests, self.replies):
            with suppress(OSError):  # a broken pipe's unsent bytes
                pipe.close()


def _write(pipe: IO[bytes], data: bytes) -> None:
    pipe.write(len(data).to_bytes(8, "little"))
    pipe.write(data)
    pipe.flush()


def _read(pipe: IO[bytes]) -> bytes:
    header = pipe.read(8)
    size = int.from_bytes(header, "little")
    data = pipe.read(size) if len(header) == 8 else b""
    if len(header) < 8 or len(data) < size:
        raise EOFError
    return data


def _serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """A worker's loop: a call in, its reply out, until its parent closes the pipe."""
    torch.set_num_threads(1)
    keep_freed_memory()
    while True:
        try:
            request = _read(requests)
        except EOFError:
            return
        _write(replies, _answer(request))


def _answer(request: bytes) -> bytes:
    """(True, fn(*args)) pickled; or (False, the exception, the worker's traceback as a note), or,
    for an exception that does not survive pickling, a RuntimeError with its traceback."""
    try:
        fn, args = pickle.loads(request)
        return dumps((True, fn(*args)))
    except Exception as e:
        where = f"in the training worker process {os.getpid()}:\n{traceback.format_exc()}"
        e.add_note(where)
        try:
            reply = dumps((False, e))
            pickle.loads(reply)
        except Exception:
            reply = dumps((False, RuntimeError(where)))
        return reply


_WORKERS: list[PartWorker] = []
_LOCK = threading.Lock()  # one caller at a time: a worker answers one call at a time


def _workers(n: int) -> list[PartWorker]:
    """n live, idle workers, started as needed (a dead one replaced, and a busy one: its call was
    abandoned, and its reply would answer the next)."""
    _stop_where(lambda w: w.busy or w.process.poll() is not None)
    while len(_WORKERS) < n:
        _WORKERS.append(PartWorker())
    return _WORKERS[:n]


def _stop_where(stale: Callable[[PartWorker], bool]) -> None:
    """Stop and forget the workers that are `stale`."""
    for w in [w for w in _WORKERS if stale(w)]:
        _WORKERS.remove(w)
        w.stop()


@atexit.register
def _stop_all() -> None:
    while _WORKERS:
        _WORKERS.pop().stop()


def ready(n: int) -> None:
    """n workers started and answering: a round can wait for their start-up before it is timed."""
    with _LOCK:
        for w in _workers(n):
            if not w.answered:
                w.send(int, ())
                w.receive()


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch on one intra-op thread within."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def run_parts(fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> list[Any]:
    """[fn(*args) for args in calls], all at once: the first in this process on one torch thread,
    each other in a worker process of its own. Should one fail or be interrupted, the workers
    still at theirs are stopped."""
    with _LOCK:
        workers = _workers(len(calls) - 1)
        try:
            for w, args in zip(workers, calls[1:], strict=True):
                w.send(fn, args)
            with one_torch_thread():
                first = fn(*calls[0])
            return [first, *(w.receive() for w in workers)]
        finally:
            _stop_where(lambda w: w.busy)  # still at an abandoned call: its reply would answer the next


if __name__ == "__main__":
    from edgefl.execution import workers  # this module by its name, for what its replies pickle

    workers._serve(sys.stdin.buffer, os.fdopen(int(sys.argv[1]), "wb"))
