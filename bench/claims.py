"""The seed papers' headline claims on the bundled digits: each claim's methods x seeds, trained for
real, and a table of the final clean, FGSM, PGD-20 and CW accuracy (mean +- std over the seeds).
Not a test. Runs one training at a time (start two claims in two shells to use two cores) and
waits while /tmp/edgefl-quiet exists (a timing measurement is running).

    .venv/bin/python bench/claims.py sfat|feddyn|gma|iid [--seeds 0 1 2] [--out DIR] [--arms A,B]
        [--set K=V ...]

* sfat   (Zhu et al., ICLR 2023, Table 3): SFAT beats FedAvg-AT (FAT) on the skew-s split.
* feddyn (Shah et al., Table 4-5): FedDynAT beats FedCurvAT and FedAvgAT at a fixed number of
  rounds; the fixed-E baselines run at E = 1 and E = E0, the paper reports each one's best.
* gma    (Tenison et al., Table 2): the sign-agreement mask on FedAvg, FedProx and FedAdam beats
  the same optimiser unmasked (tau = 0 masks nothing) on a Dirichlet label-skew split.
* iid    (FedProphet §7.2): jFAT (FedBN) and FedAvg-AT agree on an IID split.

With --out, run directories are kept there and an existing finished one (summary.json) is reused
instead of trained again; without it they go to a temporary directory.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

from seed_table import COLUMNS, final_row, spread  # bench/ is on sys.path when run as a script
from throughput import wait_quiet  # held off while a timing runs

from edgefl.experiment import prepare, run
from edgefl.scenario import load_scenario

SKEW = "scenarios/skew-digits.toml"
GMA = "scenarios/gma-digits.toml"


@dataclass(frozen=True)
class Claim:
    scenario: str
    common: tuple[str, ...]  # overrides for every arm
    arms: tuple[tuple[str, tuple[str, ...]], ...]  # (label, overrides)


def gma_arms(label: str, base: str, server: str, lr: float) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The optimiser unmasked (tau = 0: every agreement is >= tau) and with GMA's mask (tau 0.4)."""
    common = ("method=gma", f"gma.base={base}", f"gma.server={server}", f"gma.server_lr={lr}")
    return ((label, (*common, "gma.tau=0.0")), (f"{label}+GMA", (*common, "gma.tau=0.4")))


FIXED_E = tuple((f"{m} E={e}", (f"method={m}", f"training.local_epochs={e}.0"))
                for m in ("fedavg_at", "fedcurv_at") for e in (1, 4))
CLAIMS = {
    "sfat": Claim(SKEW, (), (("fedavg_at", ("method=fedavg_at",)), ("sfat", ("method=sfat",)))),
    "feddyn": Claim(SKEW, ("rounds=20",), (*FIXED_E, ("fedavg_dynat", ("method=fedavg_dynat",)),
                                            ("feddynat", ("method=feddynat",)))),
    "gma": Claim(GMA, ("rounds=30", "threads=1", "evaluation.every=10", "data.alpha=0.3"),
                 (*gma_arms("FedAvg", "fedavg", "sgd", 1.0), *gma_arms("FedProx", "fedprox", "sgd", 1.0),
                  *gma_arms("FedAdam", "fedavg", "adam", 0.01))),
    "iid": Claim(SKEW, ("data.partition=iid",),
                 (("fedavg_at", ("method=fedavg_at",)), ("jfat", ("method=jfat",)))),
}


def run_arm(claim: Claim, arm: tuple[str, ...], seed: int, extra: list[str], out: Path) -> dict[str, float]:
    """One (arm, seed) run; a finished run directory at `out` is read back instead."""
    if not (out / "summary.json").exists():
        wait_quiet()
        s = load_scenario(claim.scenario, [*claim.common, *extra, *arm, f"seed={seed}"])
        run(prepare(s, claim.scenario), out, progress=False)
    return final_row(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("claim", choices=sorted(CLAIMS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", type=Path, help="keep (and reuse) the run directories here")
    p.add_argument("--arms", help="only these arms, comma-separated labels (default: all)")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args()
    claim = CLAIMS[args.claim]
    wanted = args.arms.split(",") if args.arms else [label for label, _ in claim.arms]
    print(f"{args.claim}: {claim.scenario} {' '.join(claim.common)}, seeds {args.seeds}, "
          f"overrides {args.overrides}")
    print(f"| arm | clean % | FGSM % | PGD-20 % | CW % | simulated s | PGD-20 per seed |\n|{' --- |' * 7}")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        for label, arm in claim.arms:
            if label not in wanted:
                continue
            name = label.replace(" ", "_").replace("=", "").replace("+", "_")
            rows = [run_arm(claim, arm, seed, args.overrides, root / args.claim / f"{name}-{seed}")
                    for seed in args.seeds]
            cells = [spread([r[c] for r in rows]) for c in [*COLUMNS, "sim_s"]]
            per_seed = " ".join(f"{r['adv_acc']:.1f}" for r in rows)
            print(f"| {label} | " + " | ".join(cells) + f" | {per_seed} |", flush=True)


if __name__ == "__main__":
    main()
