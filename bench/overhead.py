"""Emulator overhead: the wall time of an edgefl run against a bare PyTorch loop doing the same work.

What it measures, on the quickstart scenario (jFAT on the bundled 8x8 digits, digits_cnn, 20
clients, 10 per round, 10 local PGD-10 iterations at batch 32) shortened to `--rounds` rounds:

- edgefl: `edgefl.scenario.load_scenario(scenario, overrides)`, `edgefl.experiment.prepare` (data,
  split, model, fvcore profile, fleet, budget check) and `edgefl.experiment.run(progress=False)`
  into a temporary directory (training, SimPy rounds, cost model, FedAvg with FedBN, evaluation,
  metrics.csv / clients.csv / summary.json);
- bare: a plain PyTorch script doing the same local training: scikit-learn's digits in [0, 1], an
  IID split with the same per-client sample counts, the same model from
  `edgefl.models.build_model`, the same number of clients per round x rounds x local iterations,
  each iteration a PGD (same eps, step, steps; random start; model in eval mode) then one SGD step
  (momentum 0.9, weight decay 1e-4) at the same batch size, FedAvg of the state dicts, and the same
  evaluation (clean + PGD-20 on the same number of test samples) on the same schedule as edgefl's
  (every `evaluation.every` rounds and after the last).

Both sides are timed in two parts: setup (edgefl: load_scenario + prepare; bare: load the data,
split it, build the model) and the rounds (edgefl: run; bare: the training loop and evaluations),
each the median of `--repeats` runs (default 3), edgefl and bare alternating, after one untimed
one-round warm-up of each. The ratio edgefl / bare is the emulator's overhead factor (1.00 = none).

Run:
    .venv/bin/python bench/overhead.py                    # quickstart, 3 rounds, 3 repeats
    .venv/bin/python bench/overhead.py --rounds 10 --repeats 5
    .venv/bin/python bench/overhead.py --set evaluation.every=1000   # evaluate only at the end
    .venv/bin/python bench/overhead.py --set training.local_iters=30 --device cpu

`--set KEY=VALUE` takes the same overrides as `edgefl run --set`. Both sides run with `--threads`
torch CPU threads, 1 by default: on a small shared machine two OpenMP threads competing with other
work made single runs 3-30x slower at random, and the ratio is about what edgefl adds around the
same tensor work, which the thread count scales alike on both sides (`--threads 0` keeps torch's
default). The load average before and after is printed, since other work on the machine skews
the figures. The defaults take about a minute and a half on a 2-core CPU. Figures only: nothing
is asserted.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edgefl.config import Scenario
from edgefl.experiment import prepare, run
from edgefl.models import build_model
from edgefl.scenario import load_scenario
from edgefl.training.local import resolve_device

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "scenarios" / "quickstart.toml"


@dataclass(frozen=True)
class Timing:
    setup_s: float
    rounds_s: float

    @property
    def total_s(self) -> float:
        return self.setup_s + self.rounds_s


# ---------------------------------------------------------------------------------------------
# edgefl


def time_edgefl(path: Path, overrides: list[str]) -> Timing:
    started = time.perf_counter()
    scenario = load_scenario(path, overrides)
    exp = prepare(scenario, str(path))
    ready = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edgefl-overhead-") as out:
        run(exp, Path(out) / "run", progress=False)
        done = time.perf_counter()
    return Timing(ready - started, done - ready)


# ---------------------------------------------------------------------------------------------
# bare PyTorch


def pgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, step: float,
        steps: int) -> torch.Tensor:
    """PGD-Linf with a uniform random start, crafted in eval mode."""
    was_training = model.training
    model.eval()
    x_adv = (x + torch.empty_like(x).uniform_(-eps, eps)).clamp(0, 1)
    for _ in range(steps):
        x_adv = x_adv.detach().requires_grad_(True)
        loss = nn.functional.cross_entropy(model(x_adv), y)
        (grad,) = torch.autograd.grad(loss, x_adv)
        x_adv = x_adv.detach() + step * grad.sign()
        x_adv = torch.min(torch.max(x_adv, x - eps), x + eps).clamp(0, 1)
    model.train(was_training)
    return x_adv.detach()


def load_digits_bare(s: Scenario, device: torch.device) -> tuple[
        list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor, list[float],
        list[float]]:
    """Digits in [0, 1], an IID split with a validation hold-out, and the test set."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.from_numpy((bunch.images / 16.0).astype(np.float32)[:, None])
    labels = torch.from_numpy(bunch.target.astype(np.int64))
    order = torch.from_numpy(np.random.default_rng(0).permutation(len(labels)))
    cut = int(0.8 * len(order))
    train_x, train_y = images[order[:cut]], labels[order[:cut]]
    test_x, test_y = images[order[cut:]], labels[order[cut:]]
    if s.data.test_samples:
        test_x, test_y = test_x[:s.data.test_samples], test_y[:s.data.test_samples]
    mean = [float(train_x.mean())]
    std = [float(train_x.std())]
    rng = np.random.default_rng(s.seed)
    clients = []
    for part in np.array_split(rng.permutation(cut), s.fleet.clients):
        keep = torch.from_numpy(part[round(s.data.val_fraction * len(part)):])
        clients.append((train_x[keep].to(device), train_y[keep].to(device)))
    return clients, test_x.to(device), test_y.to(device), mean, std


def fedavg_bare(states: list[dict[str, torch.Tensor]], weights: list[int]) -> dict[
        str, torch.Tensor]:
    total = float(sum(weights))
    out = {}
    for key, first in states[0].items():
        acc = sum(s[key].double() * (w / total) for s, w in zip(states, weights, strict=True))
        assert isinstance(acc, torch.Tensor)
        out[key] = (acc if first.is_floating_point() else acc.round()).to(first.dtype)
    return out


def evaluate_bare(model: nn.Module, x: torch.Tensor, y: torch.Tensor, s: Scenario) -> None:
    e = s.evaluation
    eps, step = e.eps or s.attack.eps, e.step_size or s.attack.step_size
    model.eval()
    for i in range(0, len(x), 512):
        xb, yb = x[i:i + 512], y[i:i + 512]
        with torch.no_grad():
            model(xb).argmax(1)
        xa = pgd(model, xb, yb, eps, step, e.steps)
        with torch.no_grad():
            model(xa).argmax(1)


def local_train_bare(model: nn.Module, x: torch.Tensor, y: torch.Tensor, s: Scenario,
                     gen: torch.Generator) -> None:
    t, a = s.training, s.attack
    opt = torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum,
                          weight_decay=t.weight_decay)
    model.train()
    batch = min(t.batch_size, len(x))
    for _ in range(t.local_iters):
        idx = torch.randperm(len(x), generator=gen)[:batch].to(x.device)
        xb, yb = x[idx], y[idx]
        xb = pgd(model, xb, yb, a.eps, a.step_size, a.steps)
        loss = nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def time_bare(s: Scenario) -> Timing:
    device = resolve_device(s.device)
    started = time.perf_counter()
    clients, test_x, test_y, mean, std = load_digits_bare(s, device)
    torch.manual_seed(s.seed)
    model = build_model(s.model.name, 10, tuple(test_x.shape[1:]), mean, std).to(device)
    ready = time.perf_counter()
    per_round = max(1, round(s.fleet.sample_fraction * s.fleet.clients))
    rng = np.random.default_rng(s.seed)
    gen = torch.Generator().manual_seed(s.seed)
    for r in range(s.rounds):
        states, weights = [], []
        for k in sorted(rng.choice(s.fleet.clients, size=per_round, replace=False)):
            local = copy.deepcopy(model)
            x, y = clients[k]
            local_train_bare(local, x, y, s, gen)
            states.append({n: v.detach().clone() for n, v in local.state_dict().items()})
            weights.append(len(x))
        model.load_state_dict(fedavg_bare(states, weights))
        if (r + 1) % s.evaluation.every == 0 or r + 1 == s.rounds:
            evaluate_bare(model, test_x, test_y, s)
    return Timing(ready - started, time.perf_counter() - ready)


# ---------------------------------------------------------------------------------------------


def median_timing(runs: list[Timing]) -> Timing:
    return Timing(statistics.median(t.setup_s for t in runs),
                  statistics.median(t.rounds_s for t in runs))


def check_supported(s: Scenario) -> None:
    """The bare loop mirrors jFAT with PGD on the digits; refuse what it does not mirror."""
    if s.method != "jfat" or s.data.dataset != "digits" or s.attack.name != "pgd":
        raise SystemExit("bench/overhead.py mirrors jfat + pgd on the digits dataset only; got "
                         f"method={s.method}, dataset={s.data.dataset}, attack={s.attack.name}")
    if s.data.partition != "iid" or s.evaluation.attack != "pgd" or s.training.optimizer != "sgd":
        raise SystemExit("bench/overhead.py mirrors an iid split, SGD and PGD evaluation only")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scenario", type=Path, default=QUICKSTART)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads for both sides (default 1; 0 = torch's default)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="scenario override, as `edgefl run --set`")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    overrides = [f"rounds={args.rounds}", f'device="{args.device}"', *args.overrides]
    scenario = load_scenario(args.scenario, overrides)
    check_supported(scenario)
    load_before = os.getloadavg()[0]
    warm = [*overrides, "rounds=1"]
    cold = (time_edgefl(args.scenario, warm), time_bare(load_scenario(args.scenario, warm)))

    edge_runs: list[Timing] = []
    bare_runs: list[Timing] = []
    timers: list[tuple[list[Timing], Callable[[], Timing]]] = [
        (edge_runs, lambda: time_edgefl(args.scenario, overrides)),
        (bare_runs, lambda: time_bare(scenario)),
    ]
    for _ in range(args.repeats):
        for runs, timer in timers:
            runs.append(timer())
    edge, bare = median_timing(edge_runs), median_timing(bare_runs)
    load_after = os.getloadavg()[0]

    s = scenario
    per_round = max(1, round(s.fleet.sample_fraction * s.fleet.clients))
    evals = sum(1 for r in range(s.rounds) if (r + 1) % s.evaluation.every == 0 or r + 1 == s.rounds)
    print(f"torch {torch.__version__}, device {resolve_device(s.device)}, "
          f"threads {torch.get_num_threads()}, {os.cpu_count()} CPUs, load average "
          f"{load_before:.1f} before / {load_after:.1f} after (other work on the machine skews "
          "both sides)")
    print(f"{args.scenario.name}: {s.method}, {s.model.name}, {s.rounds} rounds x {per_round} "
          f"clients x {s.training.local_iters} iters of PGD-{s.attack.steps} at batch "
          f"{s.training.batch_size}; {evals} evaluation(s) (PGD-{s.evaluation.steps}); "
          f"median of {args.repeats}")
    head = f"{'part':<12} {'edgefl s':>9} {'bare s':>9} {'edgefl/bare':>12}"
    print(head)
    print("-" * len(head))
    for label, e, b in [("setup", edge.setup_s, bare.setup_s),
                        ("rounds", edge.rounds_s, bare.rounds_s),
                        ("total", edge.total_s, bare.total_s)]:
        print(f"{label:<12} {e:>9.2f} {b:>9.2f} {e / b:>12.2f}")
    spread = [f"{min(t.total_s for t in runs):.2f}-{max(t.total_s for t in runs):.2f}"
              for runs in (edge_runs, bare_runs)]
    print(f"per round: edgefl {edge.rounds_s / s.rounds:.2f} s, bare {bare.rounds_s / s.rounds:.2f} "
          f"s, overhead {(edge.rounds_s - bare.rounds_s) / s.rounds:+.2f} s; total range over "
          f"repeats: edgefl {spread[0]} s, bare {spread[1]} s")
    print(f"cold first run in this process (1 round, imports and caches included, not in the "
          f"table): edgefl {cold[0].total_s:.2f} s, bare {cold[1].total_s:.2f} s")


if __name__ == "__main__":
    main()
