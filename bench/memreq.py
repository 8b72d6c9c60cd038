"""MemReq against measured peak memory, per model.

What it measures: for each model (digits_cnn on 1x8x8, cnn3 / vgg11 / vgg16 on 3x32x32), the bytes
that two memory estimators predict for one adversarial training iteration, and the peak bytes that
a real iteration takes:

- estimator: `edgefl.sim.records.mem_req(atoms, batch, slots=1, adversarial=True)`, the default
  accounting (parameters + gradients + momentum + saved activations + workspace);
- paper:     `edgefl.sim.records.paper_mem_req(atoms, batch, slots=1)`, the FedProphet release's;
- measured:  the peak of real training through edgefl's own `train_local` (PGD-10 crafting of the
  batch, then one SGD-momentum step on it; lr 0.05, momentum 0.9, weight decay 1e-4), counting
  the model's weights and buffers, gradients, optimizer state, activations and every transient.

Two iterations are measured from a freshly built model and the peak over both is kept: the first
creates the gradients and the momentum buffers, the second is the steady state in which they are
alive while the next batch is attacked. The client's dataset itself (here exactly one batch of
random inputs in [0, 1] and random labels) is not counted, as MemReq does not count it; the batch
copy `train_local` indexes out of it is counted.

How the peak is measured:

- CUDA: `torch.cuda.max_memory_allocated()` minus `torch.cuda.memory_allocated()` taken after the
  dataset is on the GPU and before the model is moved there (so the weights count).
- CPU: there is no allocator peak counter. PyTorch's CPU allocator reports every allocation and
  free to the profiler when `torch.profiler.profile(profile_memory=True)` is on (c10's
  ProfiledCPUMemoryReporter; the buffers oneDNN convolutions take from it show up too). The
  benchmark walks the profiler's raw allocation events in time order, sums their signed sizes,
  takes the peak of that running total, and adds the bytes of the model's parameters and buffers,
  which were allocated before profiling began. This counts what the allocator hands out (tensor
  storage and operator scratch), not the allocator's or the OS's own overhead.

Run:
    .venv/bin/python bench/memreq.py                      # all four models, default batches
    .venv/bin/python bench/memreq.py --batch 128          # one batch size for every model
    .venv/bin/python bench/memreq.py --models vgg16 --device cuda
    .venv/bin/python bench/memreq.py --models timm:resnet18 torchvision:mobilenet_v3_small --steps 3

A `torchvision:NAME` or `timm:NAME` model (issue 53) is cut into atoms by edgefl.models.cut and run
on 3xSxS inputs (S = --side, 32 by default) with CIFAR-10's statistics and 10 classes. The peak
depends on the oneDNN kernels the CPU gets: on 32x32 an ImageNet-stem ResNet's last stage runs on
1x1 maps, where oneDNN's AVX2 weight-gradient kernel (`ONEDNN_MAX_CPU_ISA=AVX2`, or a CPU without
AVX-512) takes a scratch of 4x the weights per thread and the AVX-512 one does not; MemReq models
neither (docs/scenarios.md). The header line names the kernels.

Defaults (digits_cnn batch 32, the 3x32x32 models batch 64) finish in about 20 s on an idle 2-core
CPU (two minutes when other work shares it); `--batch 128` doubles the work. `--iters 1` measures
only the first, cold iteration, whose peak is lower (no gradients or momentum yet while
attacking). The profiler's start/stop lines (`USDT: ... profiler_start`) go to stderr and are not
part of the figures. Figures only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from dataclasses import dataclass

import torch
from torch import nn

from edgefl.attacks import make_attack
from edgefl.config import TrainingConfig
from edgefl.models import AtomModel, build_model
from edgefl.models.vision import is_vision
from edgefl.profiling import profile_model
from edgefl.sim.records import mem_req, optimizer_slots, paper_mem_req
from edgefl.training.local import make_optimizer, resolve_device, train_local

MB = 1e6
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


@dataclass(frozen=True)
class Case:
    model: str
    input_shape: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    batch: int
    eps: float
    step_size: float


CASES = {
    "digits_cnn": Case("digits_cnn", (1, 8, 8), (0.3,), (0.4,), 32, 0.1, 0.025),
    "cnn3": Case("cnn3", (3, 32, 32), CIFAR_MEAN, CIFAR_STD, 64, 8 / 255, 2 / 255),
    "vgg11": Case("vgg11", (3, 32, 32), CIFAR_MEAN, CIFAR_STD, 64, 8 / 255, 2 / 255),
    "vgg16": Case("vgg16", (3, 32, 32), CIFAR_MEAN, CIFAR_STD, 64, 8 / 255, 2 / 255),
}


@dataclass(frozen=True)
class Row:
    model: str
    batch: int
    params: int
    estimator: float
    paper: float
    measured: float
    seconds: float


def new_model(case: Case) -> AtomModel:
    return build_model(case.model, 10, case.input_shape, case.mean, case.std)


def tensor_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of distinct storages among `tensors`."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


def train_iters(model: nn.Module, x: torch.Tensor, y: torch.Tensor, case: Case, iters: int,
                steps: int) -> None:
    """`iters` iterations of edgefl's local adversarial training (PGD + SGD-momentum step)."""
    cfg = TrainingConfig()
    opt = make_optimizer(list(model.parameters()), cfg, cfg.lr)
    attack = make_attack("pgd", case.eps, case.step_size, steps)
    gen = torch.Generator().manual_seed(0)
    train_local(model, x, y, opt, iters, len(x), attack, gen)


def peak_cpu(case: Case, x: torch.Tensor, y: torch.Tensor, iters: int, steps: int) -> float:
    """Peak allocator bytes on the CPU (profiler allocation events + pre-existing weights)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    model = new_model(case)
    resident = tensor_bytes([*model.parameters(), *model.buffers()])
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        train_iters(model, x, y, case, iters, steps)
    events: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    events.sort()
    running = itertools.accumulate(size for _, size in events)
    return float(resident + max(running, default=0))


def peak_cuda(case: Case, x: torch.Tensor, y: torch.Tensor, iters: int, steps: int,
              device: torch.device) -> float:
    """Peak CUDA allocator bytes above what was allocated before the model arrived."""
    x, y = x.to(device), y.to(device)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    model = new_model(case).to(device)
    train_iters(model, x, y, case, iters, steps)
    torch.cuda.synchronize(device)
    return float(torch.cuda.max_memory_allocated(device) - before)


def measure(case: Case, batch: int, device: torch.device, iters: int, steps: int) -> Row:
    torch.manual_seed(0)
    profile = profile_model(new_model(case), case.model)
    slots = optimizer_slots(TrainingConfig().optimizer, TrainingConfig().momentum)
    estimator = mem_req(profile.atoms, batch, slots=slots, adversarial=True)
    paper = paper_mem_req(profile.atoms, batch, slots=slots)
    x = torch.rand(batch, *case.input_shape)
    y = torch.randint(0, 10, (batch,))
    started = time.perf_counter()
    if device.type == "cuda":
        measured = peak_cuda(case, x, y, iters, steps, device)
    else:
        measured = peak_cpu(case, x, y, iters, steps)
    return Row(case.model, batch, profile.params, estimator, paper, measured,
               time.perf_counter() - started)


def error(estimate: float, measured: float) -> str:
    return f"{100 * (estimate - measured) / measured:+.1f}%"


def print_table(rows: list[Row], method: str) -> None:
    print(f"peak measured with: {method}")
    print("error = (estimate - measured) / measured; negative = the estimate is too small")
    head = (f"{'model':<11} {'batch':>5} {'params':>11} {'estim MB':>9} {'paper MB':>9} "
            f"{'meas MB':>9} {'estim err':>9} {'paper err':>9} {'time s':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r.model:<11} {r.batch:>5} {r.params:>11,} {r.estimator / MB:>9.2f} "
              f"{r.paper / MB:>9.2f} {r.measured / MB:>9.2f} {error(r.estimator, r.measured):>9} "
              f"{error(r.paper, r.measured):>9} {r.seconds:>7.1f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--models", nargs="+", default=list(CASES),
                        help=f"{', '.join(CASES)}, torchvision:NAME or timm:NAME")
    parser.add_argument("--side", type=int, default=32, help="input side of a torchvision or timm model")
    parser.add_argument("--batch", type=int, default=0,
                        help="batch size for every model (default: digits_cnn 32, others 64)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--steps", type=int, default=10, help="PGD steps (default 10)")
    parser.add_argument("--iters", type=int, default=2,
                        help="training iterations measured, from a fresh model (default 2)")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    if device.type == "cuda":
        method = f"torch.cuda.max_memory_allocated on {torch.cuda.get_device_name(device)}"
    else:
        method = ("CPU allocator events from torch.profiler(profile_memory=True): peak running "
                  "sum + weights and buffers")
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "the CPU's best")
    kernels = f"ATen {torch.backends.cpu.get_cpu_capability()}, oneDNN ISA {isa}"
    print(f"torch {torch.__version__}, device {device} ({kernels}), threads {torch.get_num_threads()}, "
          f"PGD-{args.steps}, {args.iters} iterations from a fresh model")
    rows = []
    for name in args.models:
        if name not in CASES and not is_vision(name):
            parser.error(f"unknown model {name!r}: one of {', '.join(CASES)}, torchvision:NAME or timm:NAME")
        case = CASES.get(name) or Case(name, (3, args.side, args.side), CIFAR_MEAN, CIFAR_STD, 32, 8 / 255,
                                       2 / 255)
        rows.append(measure(case, args.batch or case.batch, device, args.iters, args.steps))
    print_table(rows, method)


if __name__ == "__main__":
    main()
