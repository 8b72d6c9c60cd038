"""FedProphet's module lengths for dry runs, from the paper's reported times and edgefl's per-round costs.

A dry run has no validation, so it cannot tell when the release's rule (module_scheduler.py:178-216:
score from round adv_warmup + 0.05 x 500 = 125 of a module, advance after 0.1 x 500 = 50 scored rounds
without gain, or after 500) ends a module: `fedprophet.module_rounds` gives the lengths. This bench
derives one length L per setting (the same for every module: the paper reports no per-module
lengths) from the paper's FedProphet time T (FedProphet Table 3 / Fig. 8, ../shared/REFERENCE.md):

    T = sum over modules m of  W x w_m + (L - W) x a_m

where W is the per-module clean warm-up (100 rounds), w_m and a_m the mean round time of module m in
its warm-up and in its adversarial rounds. Those means come from a dry run of the whole 7 x 500-round
budget under the `paper` accounting. It prints w_m and a_m per module, L, whether L lies inside
the release's bounds [125 + 50, 500], and whether the scenario file's module_rounds are L rounded
(a change to the cost model moves the derivation; the file then wants updating).

Run:
    .venv/bin/python bench/module_rounds.py                      # the four paper settings (~1 min)
    .venv/bin/python bench/module_rounds.py --settings cifar10
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# FedProphet's total training time in the paper (s), per scenario file
PAPER_TIME = {"cifar10": 9.2e4, "cifar10-unbalanced": 1.8e5, "caltech256": 3.6e4,
              "caltech256-unbalanced": 6.2e4}
SHORTEST, LONGEST = 125 + 50, 500  # the release's bounds on a module's rounds


def per_module(setting: str) -> tuple[int, list[tuple[float, float]]]:
    """(warm-up rounds W, [(w_m, a_m)]) from a dry run of the whole budget."""
    from edgefl.experiment import prepare, run
    from edgefl.methods.fedprophet.knobs import FedProphetConfig
    from edgefl.runlog import read_rows
    from edgefl.scenario import load_scenario

    path = ROOT / "scenarios" / f"fedprophet-{setting}.toml"
    s = load_scenario(path, ["fedprophet.module_rounds=[]", "rounds=3500", "threads=1"])
    with tempfile.TemporaryDirectory() as out:
        run(prepare(s, str(path), dry_run=True), Path(out), progress=False)
        rows = read_rows(Path(out), "metrics")[1]
    warm = s.knobs(FedProphetConfig).warmup_rounds
    times: dict[tuple[int, bool], list[float]] = defaultdict(list)
    start: dict[int, int] = {}
    for r in rows:
        m, t = int(r["module"]), int(r["round"])
        start.setdefault(m, t)
        times[(m, t - start[m] < warm)].append(float(r["round_time_s"]))
    return warm, [(mean(times[(m, True)]), mean(times[(m, False)])) for m in sorted(start)]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default=",".join(PAPER_TIME))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    for setting in args.settings.split(","):
        warm, modules = per_module(setting)
        w, a = sum(x for x, _ in modules), sum(y for _, y in modules)
        length = warm + (PAPER_TIME[setting] - warm * w) / a
        print(f"{setting}: T = {PAPER_TIME[setting]:.3g} s, W = {warm}")
        for m, (wm, am) in enumerate(modules, 1):
            print(f"  module {m}: warm-up round {wm:8.2f} s, adversarial round {am:8.2f} s")
        inside = SHORTEST <= length <= LONGEST
        print(f"  sum w = {w:.2f} s, sum a = {a:.2f} s -> L = {length:.1f} rounds "
              f"({'inside' if inside else 'OUTSIDE'} the release's [{SHORTEST}, {LONGEST}])")
        given = scenario_rounds(setting)
        same = given == [round(length)] * len(modules)
        print(f"  the scenario's module_rounds: {given} ({'as derived' if same else 'DIFFERENT: update it'})")


def scenario_rounds(setting: str) -> list[int]:
    """`fedprophet.module_rounds` as the scenario file gives it (pricing changes move the derivation)."""
    from edgefl.methods.fedprophet.knobs import FedProphetConfig
    from edgefl.scenario import load_scenario

    s = load_scenario(ROOT / "scenarios" / f"fedprophet-{setting}.toml")
    return list(s.knobs(FedProphetConfig).module_rounds)


if __name__ == "__main__":
    main()
