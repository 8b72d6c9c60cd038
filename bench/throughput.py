"""Throughput of edgefl's local adversarial training against a bare PyTorch PGD-AT loop.

Both sides do Madry et al.'s PGD adversarial training (ICLR 2018; FedProphet §7.1's PGD-10 at
eps 8/255, step 2/255) on the same model, batch and device:

- edgefl: `edgefl.training.local.train_local` with the `pgd` attack and the `pgd_at` objective,
  SGD from `make_optimizer` with the scenario defaults (momentum 0.9, weight decay 1e-4), and the
  `TrainSettings` given by `--precision` / `--channels-last`;
- bare: the same work written out below: batch indices drawn on the device, PGD with a uniform
  random start in the eps ball, signed-gradient steps, projection and [0, 1] clamp with the model
  in eval mode, then one cross-entropy step in train mode with `torch.optim.SGD` (same momentum,
  weight decay and learning rate), under the same autocast and memory format.

Data are uniform random images in [0, 1] with random labels (10 classes), `8 x batch` samples
resident on the device. Cases: vgg11 on CIFAR-shaped 3x32x32 at batch 64 and digits_cnn on
1x8x8 at batch 32 (`--model` picks one, `--batch` overrides the batch). Each side is warmed up,
then timed over `--iters` iterations `--repeats` times, the two sides alternating; the best time
counts (other work on the machine only ever slows a repeat down). CUDA is synchronised before
and after each timed stretch. Printed per case: samples/s of each side and edgefl / bare
(1.00 = no loss against the bare loop).

Grouped vs one-by-one (issue 16): the quickstart's first round (scenarios/quickstart.toml: jFAT,
digits_cnn on 8x8 digits, its first 10 clients at batch 32, its local iterations and PGD-10) trained
one client after another by `FedAvgAT.train` (`training.group_clients = false`), and all together
by `FedAvgAT.train_group` (edgefl.training.grouped). The two alternate in one process,
`--group-repeats` times per thread count (1 and 2 by default, `--group-threads`); the quickstart
itself runs on 2 (`threads`). Printed per thread count: the median seconds per round of each and
the median of the per-repeat ratios one-by-one / grouped, and their range, and the ratio of the two
sides' best rounds (as the bare loop's timing counts: other work only slows a round down).
`--part archs` times the same round per model (issue 50), one by one and grouped, alternating, on
the last of `--group-threads`, printed the same way: by default the quickstart's model, and resnet10
on the quickstart's digits for one local iteration; `--archs` picks others of `ARCHS` (models on
32x32 noise images). While /tmp/edgefl-quiet exists
(another timing on this machine) the bench waits before each timing; `--hold-quiet` makes the bench
hold that file itself for its grouped timings (it then holds it with its process id, waits for no
one else's, and removes it at the end).

Run:
    .venv/bin/python bench/throughput.py                        # both cases, auto device
    .venv/bin/python bench/throughput.py --device cuda --precision bf16 --channels-last
    .venv/bin/python bench/throughput.py --model vgg11 --batch 128 --iters 100

On the CPU the defaults are small (one vgg11 iteration per repeat, 1 torch thread by default,
`--threads 0` keeps torch's default) and take about 40 s of CPU time (a minute and a half on a
busy 2-core machine), plus about 40 s for grouped vs one-by-one (`--part` picks one); `--part
archs` takes about a minute at `--group-repeats 3` (its 32x32 models some minutes each). Figures
only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from edgefl.attacks import make_attack
from edgefl.config import TrainingConfig
from edgefl.experiment import prepare
from edgefl.methods import ClientPlan
from edgefl.methods.fedavg import FedAvgAT
from edgefl.models import build_model
from edgefl.scenario import load_scenario
from edgefl.sim.workload import Workload
from edgefl.training.local import TrainSettings, make_optimizer, resolve_device, synchronize, train_local
from edgefl.training.objectives import PGDAT

EPS, STEP, STEPS, CLASSES = 8 / 255, 2 / 255, 10, 10


@dataclass(frozen=True)
class Case:
    shape: tuple[int, int, int]
    batch: int
    cpu_iters: int
    gpu_iters: int


CASES = {"vgg11": Case((3, 32, 32), 64, 1, 50), "digits_cnn": Case((1, 8, 8), 32, 20, 200)}


def bare_pgd_at(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                iters: int, batch: int, bf16: bool, nhwc: bool) -> None:
    """`iters` steps of PGD-10 adversarial training in plain PyTorch (the model already in the
    memory format asked for)."""
    fmt = torch.channels_last if nhwc else torch.contiguous_format
    rows = torch.randint(len(x), (iters, batch), device=x.device)
    for idx in rows:
        xb, yb = x[idx].contiguous(memory_format=fmt), y[idx]
        model.eval()
        xa = (xb + torch.empty_like(xb).uniform_(-EPS, EPS)).clamp(0, 1)
        for _ in range(STEPS):
            xa.requires_grad_(True)
            with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(model(xa), yb)
            (grad,) = torch.autograd.grad(loss, xa)
            xa = torch.min(torch.max(xa.detach() + STEP * grad.sign(), xb - EPS), xb + EPS).clamp(0, 1)
        model.train()
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(xa), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def sides(name: str, batch: int, device: torch.device,
          settings: TrainSettings) -> dict[str, Callable[[int], object]]:
    """name -> run(iters) for edgefl and the bare loop, each on its own copy of one model."""
    torch.manual_seed(0)  # weights, data and (from torch's generator) the attacks' random starts
    case = CASES[name]
    c = case.shape[0]
    model = build_model(name, CLASSES, case.shape, [0.5] * c, [0.25] * c).to(device)
    twin = copy.deepcopy(model)
    x = torch.rand(8 * batch, *case.shape, device=device)
    y = torch.randint(CLASSES, (8 * batch,), device=device)
    if settings.channels_last:  # train_local converts its own model
        twin.to(memory_format=torch.channels_last)
    cfg = TrainingConfig()
    opt = make_optimizer(list(model.parameters()), cfg, cfg.lr)
    bare_opt = torch.optim.SGD(twin.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay)
    attack, gen = make_attack("pgd", EPS, STEP, STEPS), torch.Generator().manual_seed(0)
    return {
        "edgefl": lambda n: train_local(model, x, y, opt, n, batch, attack, gen, PGDAT(), settings=settings),
        "bare": lambda n: bare_pgd_at(twin, bare_opt, x, y, n, batch, settings.precision == "bf16",
                                      settings.channels_last),
    }


def best_seconds(runs: dict[str, Callable[[int], object]], iters: int, repeats: int,
                 device: torch.device) -> dict[str, float]:
    """Warm each side up, then the best of `repeats` timed stretches of `iters`, sides alternating."""
    for run in runs.values():
        run(max(1, iters // 5))
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for side, run in runs.items():
            synchronize(device)
            start = time.perf_counter()
            run(iters)
            synchronize(device)
            best[side] = min(best[side], time.perf_counter() - start)
    return best


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} thread(s)"


QUIET = Path("/tmp/edgefl-quiet")
QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.toml"


def wait_quiet() -> None:
    """Wait while another timing on this machine holds /tmp/edgefl-quiet."""
    while QUIET.exists() and QUIET.read_text().strip() != str(os.getpid()):
        time.sleep(5)


@contextmanager
def quiet(hold: bool) -> Iterator[None]:
    """Hold /tmp/edgefl-quiet (with this process id) while the body runs, when `hold`."""
    if not hold:
        yield
        return
    wait_quiet()
    QUIET.write_text(str(os.getpid()))
    try:
        yield
    finally:
        QUIET.unlink(missing_ok=True)


def round_sides(clients: int, overrides: Sequence[str] = ()) -> tuple[dict[str, Callable[[], object]], str]:
    """one-by-one and grouped training of the quickstart's first round (its first `clients`, the
    scenario changed by `overrides`); the bench sets the threads, not the scenario."""
    scenario = load_scenario(QUICKSTART, ["threads=0", *overrides])
    exp = prepare(scenario, str(QUICKSTART))
    method, ctx, t = exp.method, exp.ctx, scenario.training
    assert isinstance(method, FedAvgAT)
    attack = ctx.attack_for(0)
    w = Workload(ctx.profile.atoms, t.batch_size, t.local_iters, attack.steps if attack else 0, 1, 0, 0)
    plans = dict.fromkeys(range(clients), ClientPlan(w, attack, ctx.lr(0)))
    what = (f"{scenario.method}, {scenario.model.name}, {clients} clients x {t.local_iters} iterations "
            f"of batch {t.batch_size}, PGD-{attack.steps if attack else 0}, on {ctx.device}")
    return {"one-by-one": lambda: [method.train(0, k, p) for k, p in plans.items()],
            "grouped": lambda: method.train_group(0, plans)}, what


def alternate(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Each side warmed up, then `repeats` timed rounds of each, the sides alternating."""
    for run in runs.values():
        run()
    secs: dict[str, list[float]] = {side: [] for side in runs}
    for _ in range(repeats):
        for side, run in runs.items():
            wait_quiet()
            start = time.perf_counter()
            run()
            secs[side].append(time.perf_counter() - start)
    return secs


def compared(slow: list[float], fast: list[float]) -> str:
    """The medians, the median and range of the paired ratios slow / fast, the ratio of the bests."""
    ratios = [a / b for a, b in zip(slow, fast, strict=True)]
    median = statistics.median
    return (f"{median(slow):>12.3f} {median(fast):>10.3f} {median(ratios):>7.2f}x "
            f"{min(ratios):>5.2f}x-{max(ratios):.2f}x {min(slow) / min(fast):>5.2f}x")


def bench_grouped(threads: list[int], repeats: int, clients: int) -> None:
    runs, what = round_sides(clients)
    print(f"grouped vs one-by-one, one quickstart round ({what}); median of {repeats}; "
          f"the quickstart itself runs on threads = {load_scenario(QUICKSTART).threads}")
    print(f"{'threads':>7} {'one-by-one s':>12} {'grouped s':>10} {'speed-up':>8} {'range':>13} {'best':>6}")
    for n in threads:
        torch.set_num_threads(n)
        secs = alternate(runs, repeats)
        print(f"{n:>7} {compared(secs['one-by-one'], secs['grouped'])}")


BIG = ['fleet.pool="mid"', "fleet.reserved_memory_mb=256"]  # devices whose training memory holds the model
NOISE = ['data.dataset="synthetic"', "data.synthetic_train=2000", *BIG]  # 3x32x32 noise images, no download
# `--part archs`: the quickstart's round (its own model by default) with other models and images; fewer
# local iterations where a model does 20-400x the quickstart model's work
ARCHS = {"digits_cnn": [],
         "resnet10": ['model.name="resnet10"', "training.local_iters=1", *BIG],
         "smallcnn-28": ['model.name="smallcnn"', "training.local_iters=3", *NOISE,
                         "data.synthetic_shape=[1,28,28]"],
         "cnn4-32": ['model.name="cnn4"', "training.local_iters=3", *NOISE],
         "vgg11-32": ['model.name="vgg11"', "training.local_iters=1", *NOISE],
         "resnet10-32": ['model.name="resnet10"', "training.local_iters=1", *NOISE]}


def bench_archs(names: list[str], repeats: int, clients: int, threads: int) -> None:
    """Per model of ARCHS, one round one by one and grouped, alternating, on `threads` torch threads
    (grouped even where the executor would train the clients one by one, `why_not_worth_it`)."""
    torch.set_num_threads(threads)
    print(f"grouped vs one-by-one per model, {threads} torch thread(s), median of {repeats}")
    print(f"{'model':<11} {'one-by-one s':>12} {'grouped s':>10} {'speed-up':>8} {'range':>13} {'best':>6}")
    for name in names:
        runs, what = round_sides(clients, ARCHS[name])
        secs = alternate(runs, repeats)
        print(f"{name:<11} {compared(secs['one-by-one'], secs['grouped'])}   ({what})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="auto", help="auto (CUDA when available) | cpu | cuda | cuda:N")
    ap.add_argument("--model", choices=sorted(CASES), help="one case (default: all)")
    ap.add_argument("--batch", type=int, help="batch size (default: the case's)")
    ap.add_argument("--iters", type=int, help="timed iterations per repeat (default: per case and device)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0 = torch's default)")
    ap.add_argument("--part", choices=["bare", "grouped", "both", "archs"], default="both",
                    help="edgefl vs the bare loop, grouped vs one-by-one, or both; or grouped vs one-by-one "
                         "per model (archs)")
    ap.add_argument("--group-threads", type=int, nargs="+", default=[1, 2],
                    help="torch CPU threads for grouped vs one-by-one")
    ap.add_argument("--group-repeats", type=int, default=7)
    ap.add_argument("--clients", type=int, default=10, help="clients in the grouped round")
    ap.add_argument("--archs", nargs="+", choices=list(ARCHS), default=["digits_cnn", "resnet10"],
                    help="models for --part archs")
    ap.add_argument("--hold-quiet", action="store_true",
                    help="hold /tmp/edgefl-quiet during grouped vs one-by-one (see the docstring)")
    args = ap.parse_args()
    if args.part == "archs":
        with quiet(args.hold_quiet):
            bench_archs(args.archs, args.group_repeats, args.clients, args.group_threads[-1])
        return
    if args.part != "bare":
        with quiet(args.hold_quiet):
            bench_grouped(args.group_threads, args.group_repeats, args.clients)
    if args.part == "grouped":
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    settings = TrainSettings(args.precision, args.channels_last)
    print(f"device: {device_name(device)}; precision {args.precision}; channels_last {args.channels_last}; "
          f"PGD-{STEPS} eps {EPS:.4f} step {STEP:.4f}")
    print(f"{'model':<11} {'batch':>5} {'iters':>5} {'edgefl/s':>10} {'bare/s':>10} {'ratio':>6}")
    for name in [args.model] if args.model else list(CASES):
        case = CASES[name]
        batch = args.batch or case.batch
        iters = args.iters or (case.gpu_iters if device.type == "cuda" else case.cpu_iters)
        secs = best_seconds(sides(name, batch, device, settings), iters, args.repeats, device)
        rate = {side: iters * batch / s for side, s in secs.items()}
        print(f"{name:<11} {batch:>5} {iters:>5} {rate['edgefl']:>10.1f} {rate['bare']:>10.1f} "
              f"{rate['edgefl'] / rate['bare']:>6.3f}")


if __name__ == "__main__":
    main()
