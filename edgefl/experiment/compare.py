"""A comparison's runs (edgefl.api.compare, `edgefl compare`): the methods and seeds asked for, each
(method, seed) run's folder, kept when finished and resumed when interrupted, the runs played here
or spread over Ray, and the tables and figures written from them.

Each run's line is printed on stdout as it ends, as `edgefl run` prints its own (`run_line`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefl.config import MAX_SEEDS
from edgefl.errors import EdgeflError
from edgefl.rundir import CHECKPOINT

if TYPE_CHECKING:
    from edgefl.report.compare import Row
    from edgefl.scenario import Scenario

Seeds = int | str | Sequence[int]  # a count (seeds 0 to N-1), "0,1,2" or "5" as --seeds takes them, or a list


@dataclass(frozen=True)
class ComparedRun:
    """A run of a comparison: `name` (its method, and seed), its scenario, the comparison's folders
    (outermost first) and its run folder."""

    name: str
    scenario: Scenario
    folders: list[Path]
    run_dir: Path


def run_line(summary: dict[str, Any], out: Path) -> str:
    """The line a run ends with: its method, rounds, simulated and wall time, accuracies, swaps."""
    swapped = f"{summary['client_rounds_swapped']}/{summary['client_rounds']} client-rounds swapped"
    head = (f"{summary['method']}: {summary['rounds']} rounds, simulated "
            f"{summary['sim_time_s'] / 3600:.2f} h (wall {summary['wall_time_s']:.0f} s)")
    if summary["dry_run"]:
        return f"{head} [dry run], {swapped} -> {out}"
    error = summary.get("time_prediction_error")
    check = "" if error is None else f", simulated compute {100 * error:+.1f} % vs measured on this host"
    return (f"{head}, clean {100 * summary['clean_acc']:.1f} %, PGD {100 * summary['adv_acc']:.1f} %, "
            f"{swapped}{check} -> {out}")


def compared_methods(given: str | Sequence[str]) -> list[str]:
    """The methods, comma-separated or a list: known method names, each once."""
    from edgefl.methods import METHODS

    methods = [m.strip() for m in (given.split(",") if isinstance(given, str) else given)]
    if "" in methods or len(set(methods)) != len(methods):
        raise EdgeflError("edgefl compare", "--methods", "give each method once, comma-separated, "
                          "e.g. jfat,fedprophet")
    unknown = [m for m in methods if m not in METHODS.names()]
    if unknown:
        raise EdgeflError("edgefl compare", "--methods", f"unknown method {unknown[0]!r}; choose from: "
                          f"{', '.join(METHODS.names())}")
    return methods


def reference(name: str | None, methods: list[str]) -> str | None:
    """The method the others are paired against, one of the compared methods; by default jFAT when
    it is compared."""
    from edgefl.report.compare import BASELINE

    if name is None:
        return BASELINE if BASELINE in methods else None
    if name not in methods:
        raise EdgeflError("edgefl compare", "--reference", f"{name!r} is not among --methods "
                          f"({', '.join(methods)}); add it there or name one of them")
    return name


def sets(overrides: Sequence[str], key: str) -> bool:
    """Whether one of the `--set` overrides gives `key`."""
    return any(o.partition("=")[0].strip() == key for o in overrides)


def compared_seeds(scenario: Path, overrides: list[str], given: Seeds | None, set_seed: bool) -> list[int]:
    """The seeds given (`parse_seeds`), else the scenario's `[compare] seeds`; empty: the scenario's
    own seed, one run per method as without seeds. `set_seed`: a `--set seed` was given."""
    from edgefl.scenario import load_scenario

    if given is None:
        seeds = load_scenario(scenario, overrides).compare.seeds
        source = "[compare] seeds"
    else:
        seeds, source = parse_seeds(given), "--seeds"
    if seeds and set_seed:
        raise EdgeflError("--set", "seed", f"the comparison's seeds come from {source}; drop --set seed")
    return seeds


def parse_seeds(given: Seeds) -> list[int]:
    """Seeds as a list, or one count N for seeds 0 to N-1 (an int, or text of one number as --seeds
    takes it, comma-separated otherwise)."""
    fix = "give seeds as 0,1,2 or a count such as 5 (seeds 0-4)"
    text = str(given) if isinstance(given, str | int) else ",".join(map(str, given))
    try:
        items = [int(t) for t in text.split(",")]
    except ValueError:
        raise EdgeflError("edgefl compare", "--seeds", f"{text!r} is not a list of seeds; {fix}") from None
    count = isinstance(given, str | int) and len(items) == 1
    if count and not 0 < items[0] <= MAX_SEEDS:  # a count, checked before it is counted out
        raise EdgeflError("edgefl compare", "--seeds", f"{text!r}: {fix}; a count is 1 to {MAX_SEEDS}")
    seeds = list(range(items[0])) if count else items
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds) or len(seeds) > MAX_SEEDS:
        raise EdgeflError("edgefl compare", "--seeds", f"{text!r}: {fix}, each seed once, non-negative, "
                          f"at most {MAX_SEEDS}")
    return seeds


def pending(scenario: Path, overrides: list[str], methods: list[str], seeds: list[int], folder: Path,
            dry_run: bool) -> list[ComparedRun]:
    """The comparison's runs not finished, every one's scenario validated before any starts; the
    comparison's folder, when there, checked to be a comparison's."""
    from edgefl.rundir import claim, probe, refuse_links
    from edgefl.scenario import compare_scenario

    several = len(seeds) > 1
    each: list[int | None] = [*seeds] or [None]  # None: the scenario's own seed
    scenarios = {(m, s): compare_scenario(scenario, overrides, m, s) for m in methods for s in each}
    if probe(folder, "--out") != "missing":  # checked now; a new folder is made by the first run
        claim(folder, "compare")
        refuse_links(folder)
    return [p for (method, seed), s in scenarios.items()
            if (p := _unfinished(f"{method} seed {seed}" if several else method, s,
                                [folder, folder / method] if several else [folder], dry_run))]


def _unfinished(name: str, scenario: Scenario, folders: list[Path], dry_run: bool) -> ComparedRun | None:
    """The run of a comparison in the last of `folders`, or None (said on stdout) when it finished."""
    run_dir = folders[-1] / (f"seed-{scenario.seed}" if len(folders) > 1 else scenario.method)
    _check_kept(run_dir, scenario, dry_run)
    if (run_dir / "summary.json").exists():
        print(f"{name}: finished, kept ({run_dir})")
        return None
    return ComparedRun(name, scenario, folders, run_dir)


def play(runs: list[ComparedRun], where: str, dry_run: bool, progress: bool) -> None:
    """The runs not finished: side by side as Ray tasks when they train on Ray, else one by one here."""
    if len(runs) > 1 and runs[0].scenario.executor == "ray" and not dry_run:
        _spread_runs(runs, where, dry_run)
    else:
        for run in runs:
            _compare_run(run, where, dry_run, progress)


def _compare_run(run: ComparedRun, where: str, dry_run: bool, progress: bool) -> None:
    """A run of a comparison in this process: resumed when interrupted, else started. The
    comparison's folders are claimed once the run is prepared (its data loaded): a comparison
    refused before then leaves no folder behind."""
    from edgefl.experiment import prepare, start_or_resume
    from edgefl.rundir import claim

    exp = prepare(run.scenario, where, dry_run=dry_run)
    for folder in run.folders:
        claim(folder, "compare")
    print(run_line(start_or_resume(exp, run.run_dir, progress=progress), run.run_dir))


def _spread_runs(runs: list[ComparedRun], where: str, dry_run: bool) -> None:
    """The runs side by side as Ray tasks (edgefl.experiment.spread), each line printed as it ends."""
    from edgefl.experiment import prepare
    from edgefl.experiment.spread import job, run_spread
    from edgefl.rundir import claim

    prepare(runs[0].scenario, where, dry_run=dry_run)  # the data here first: a missing data set is
    # refused before any folder is made, and a download happens once, not in every task
    for folder in dict.fromkeys(f for r in runs for f in r.folders):
        claim(folder, "compare")
    jobs = [(r.name, r.scenario, job(r.scenario, where, r.run_dir, dry_run)) for r in runs]
    for name, summary in run_spread(jobs):
        print(run_line(summary, next(r.run_dir for r in runs if r.name == name)))


def one_seed_outputs(out: Path, methods: list[str], target: float | None) -> tuple[list[Row], list[Path]]:
    """A comparison on one seed: its rows (one per method), its tables and figures."""
    from edgefl.report.compare import compare_table, write_comparison
    from edgefl.report.figures import make_figures

    runs = [out / m for m in methods]
    rows = compare_table(runs, target)
    return rows, [*write_comparison(rows, out, target), *make_figures(runs, out / "figures", target)]


def seed_outputs(out: Path, methods: list[str], seeds: list[int], reference: str | None,
                 target: float | None, interval: str) -> tuple[list[Row], list[Path]]:
    """A comparison over seeds: its rows (one per method and seed), its tables (edgefl.report.seeds)
    and figures with spread."""
    from edgefl.report.compare import load_run
    from edgefl.report.figures import make_seed_figures
    from edgefl.report.seeds import attack_label, seed_rows, write_seed_comparison

    runs = {m: [load_run(out / m / f"seed-{s}") for s in seeds] for m in methods}
    rows = seed_rows({s: [runs[m][i] for m in methods] for i, s in enumerate(seeds)}, target)
    files = write_seed_comparison(rows, out, target, reference, interval,
                                  attack_label(runs[methods[0]][0].scenario))
    return rows, [*files, *make_seed_figures(runs, rows, out / "figures", target)]


def warn_bootstrap(seeds: int) -> None:
    print(f"edgefl: warning: a bootstrap over {seeds} seeds is about the range of the paired "
          "differences, narrower than it should be; use --interval t, or 5 seeds or more", file=sys.stderr)


def _check_kept(run_dir: Path, scenario: Scenario, dry_run: bool) -> None:
    """A comparison's run folder already there must hold a run of this scenario, dry or trained as
    this comparison is (a finished dry run has no accuracies to compare; a trained one is not redone
    dry). Its scenario.toml is this scenario as written, or as an earlier edgefl wrote it: the same
    values, with the keys added since at their defaults."""
    saved = _saved_scenario(run_dir)
    if saved is not None and not _same_scenario(saved, scenario, str(run_dir / "scenario.toml")):
        raise EdgeflError(str(run_dir), "scenario.toml", "holds a run of another scenario; "
                          "choose another --out or delete that run directory")
    summary = run_dir / "summary.json"
    if summary.is_file():
        try:
            was_dry = bool(json.loads(summary.read_text()).get("dry_run"))
        except (OSError, ValueError, AttributeError) as exc:
            raise EdgeflError(str(summary), "summary.json", f"cannot be read ({type(exc).__name__}); "
                              "delete that run directory to run it again") from None
    elif (run_dir / CHECKPOINT).exists():
        was_dry = False  # only a trained run checkpoints
    else:
        return
    if was_dry != dry_run:
        kind = "a dry run" if was_dry else "a trained run"
        raise EdgeflError(str(run_dir), "--dry-run", f"holds {kind} of this scenario, and this comparison "
                          f"{'is dry' if dry_run else 'trains'}; choose another --out or delete that run "
                          "directory")


def _same_scenario(saved: str, scenario: Scenario, where: str) -> bool:
    import tomllib

    from edgefl.scenario import scenario_from_toml, to_toml

    if saved == to_toml(scenario):
        return True
    try:
        return scenario_from_toml(tomllib.loads(saved), where) == scenario
    except (EdgeflError, ValueError, RecursionError):
        return False


def _saved_scenario(run_dir: Path) -> str | None:
    """A run folder's scenario.toml text; None when it has none."""
    path = run_dir / "scenario.toml"
    if not path.exists() and not path.is_symlink():
        return None
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise EdgeflError(str(path), "scenario.toml", f"cannot be read ({exc}); choose another "
                          "--out") from None
