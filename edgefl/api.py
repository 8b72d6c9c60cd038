"""edgefl as a library: `edgefl.run` and `edgefl.compare`, what `edgefl run` and `edgefl compare` call.

Each takes what its command's flags give, by the same names (`sets` are `--set KEY=VALUE` items), and
returns what the command made: a run's folder and summary, a comparison's folder, rows and files.
Bad input raises edgefl.errors.EdgeflError, whose text is the one line the command prints.

    import edgefl

    done = edgefl.run("quickstart", sets=["rounds=2"], dry_run=True, out="runs/try")
    print(done.line, done.run_dir / "metrics.csv")
    table = edgefl.compare("quickstart", ["jfat", "fedprophet"], seeds=3, dry_run=True)
    for row in table.rows: ...

Importing edgefl imports none of the work: torch and the rest load on the first call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefl.errors import EdgeflError, NotARunError

if TYPE_CHECKING:
    from edgefl.experiment.compare import Seeds
    from edgefl.report.compare import Row
    from edgefl.scenario import Scenario

INTERVALS = ("t", "bootstrap")  # a paired difference's 95 % interval: Student t, or a percentile bootstrap


@dataclass(frozen=True)
class RunResult:
    """A finished run.

    Attributes:
        run_dir: its run directory (scenario.toml, metrics.csv, the clients' log, summary.json, ...).
        summary: summary.json's values (method, rounds, sim_time_s, clean_acc, adv_acc, ...).
    """

    run_dir: Path
    summary: dict[str, Any]

    @property
    def line(self) -> str:
        """The line `edgefl run` prints for it."""
        from edgefl.experiment.compare import run_line

        return run_line(self.summary, self.run_dir)


@dataclass(frozen=True)
class Comparison:
    """What a comparison made.

    Attributes:
        folder: the comparison's folder, a run directory per method (and seed) inside.
        rows: one per method, comparison.csv's; over several seeds, one per method and seed,
            seeds.csv's (with its `seed`): column name -> value, None where there is none.
        seeds: the seeds compared; empty: the scenario's own seed alone.
        files: the files written: comparison.md, comparison.csv (over seeds also seeds.csv and
            differences.csv) and the figures.
    """

    folder: Path
    rows: list[Row]
    seeds: list[int]
    files: list[Path]

    @property
    def markdown(self) -> str:
        """The comparison's table as `edgefl compare` prints it (comparison.md)."""
        return (self.folder / "comparison.md").read_text()


def run(scenario: str | Path | None = None, *, sets: Sequence[str] = (), out: str | Path | None = None,
        overwrite: bool = False, resume: str | Path | None = None, dry_run: bool = False,
        download: bool = False, executor: str | None = None, progress: bool = True) -> RunResult:
    """Run a scenario (a file, or a bundled scenario's name): real training against the simulated
    clock, or with `dry_run` the engine and cost model alone.

    Args:
        scenario: the scenario file or bundled name; None with `resume`.
        sets: scenario keys overridden, as `--set` takes them (`"rounds=5"`).
        out: the run directory (default `runs/<scenario name>`, `runs/<scenario name>-dry` for a dry run).
        overwrite: replace an existing run directory.
        resume: continue the interrupted run in this directory (only `executor` and `ray.*` sets may
            change).
        dry_run: simulated times without data or training.
        download: allow downloading the dataset.
        executor: where clients train, "local" or "ray" (default the scenario's).
        progress: show a progress bar on stderr.
    """
    from edgefl.experiment import prepare, prepare_out
    from edgefl.experiment import run as run_experiment
    from edgefl.scenario import load_scenario

    overrides = _overrides(sets, download, executor)
    if resume is None:
        if scenario is None:
            raise EdgeflError("edgefl run", "scenario", "give a scenario file, or --resume RUN_DIR")
        path = _scenario(scenario)
        loaded, where = load_scenario(path, overrides), str(path)
        run_dir = _folder(out) or default_out(path, dry_run)
    else:
        given = {"the scenario": scenario, "--set": [o for o in sets if not o.strip().startswith("ray.")],
                 "--out": out, "--dry-run": dry_run, "--download": download, "--overwrite": overwrite}
        run_dir = Path(resume)
        loaded, where = _resumed(run_dir, overrides, [flag for flag, value in given.items() if value])
    exp = prepare(loaded, where, dry_run=dry_run)
    if resume is None:
        prepare_out(run_dir, overwrite)
    return RunResult(run_dir, run_experiment(exp, run_dir, progress=progress, resume=resume is not None))


def compare(scenario: str | Path, methods: str | Sequence[str], *, sets: Sequence[str] = (),
            out: str | Path | None = None, target: float | None = None, seeds: Seeds | None = None,
            reference: str | None = None, interval: str = "t", dry_run: bool = False,
            download: bool = False, executor: str | None = None, progress: bool = True) -> Comparison:
    """Run several methods on the same fleet, split and seed, and write comparison.md,
    comparison.csv and figures; finished runs are kept and interrupted ones resumed. Each run's
    line is printed on stdout as it ends.

    A method listed in the scenario's `[compare] rounds` table runs that many rounds, the others the
    scenario's `rounds` (`rounds=N` in `sets` overrides the file's table: every method N; a table
    given in `sets` too is kept). One seed: a run folder per method, `<out>/<method>/`; several:
    `<out>/<method>/seed-<s>/`, and the spread over seeds.

    Args:
        scenario: the scenario file or bundled name.
        methods: comma-separated ("jfat,fedprophet") or a list.
        sets: scenario keys overridden, as `--set` takes them (neither `method` nor, with seeds, `seed`).
        out: the comparison's folder (default `runs/compare-<scenario name>`).
        target: adversarial accuracy to reach (0-1), not with `dry_run`.
        seeds: a list of seeds, a count N (seeds 0 to N-1), or --seeds' text; default the scenario's
            `[compare] seeds`, else its seed alone.
        reference: the method the others are paired against over seeds (default jfat, when compared).
        interval: a paired difference's 95 % interval: "t" (Student t over the seeds) or "bootstrap".
        dry_run: simulated times without data or training.
        download: allow downloading the dataset.
        executor: where clients train, "local" or "ray" (default the scenario's); with "ray" the runs
            go side by side as Ray tasks.
        progress: show a progress bar on stderr.
    """
    from edgefl.experiment import compare as c
    from edgefl.report.compare import check_target

    if interval not in INTERVALS:
        raise EdgeflError("edgefl compare", "--interval", f"{interval!r}: choose from {', '.join(INTERVALS)}")
    check_target(target)
    if dry_run and target is not None:
        raise EdgeflError("--target", str(target), "a dry run has no accuracies to reach; drop "
                          "--target, or compare without --dry-run")
    path, names = _scenario(scenario), c.compared_methods(methods)
    paired = c.reference(reference, names)
    if c.sets(sets, "method"):
        raise EdgeflError("--set", "method", "edgefl compare takes its methods from --methods; drop "
                          "--set method")
    overrides = _overrides(sets, download, executor)
    seed_list = c.compared_seeds(path, overrides, seeds, c.sets(sets, "seed"))
    folder = _folder(out) or default_out(path, dry_run, "compare-")
    pending = c.pending(path, overrides, names, seed_list, folder, dry_run)
    if len(seed_list) > 1 and interval == "bootstrap" and len(seed_list) < 5:
        c.warn_bootstrap(len(seed_list))
    c.play(pending, str(path), dry_run, progress)
    try:
        if len(seed_list) > 1:
            rows, files = c.seed_outputs(folder, names, seed_list, paired, target, interval)
        else:
            rows, files = c.one_seed_outputs(folder, names, target)
    except NotARunError as err:  # a kept run damaged since: redoing it is the fix, not another folder
        raise err.with_fix(f"delete that run's folder in {folder} and run edgefl compare again to "
                           "redo it") from None
    return Comparison(folder, rows, seed_list, files)


def out_dir(text: str) -> Path:
    """An output folder given as text: never the empty string (which would be the current folder)."""
    if not text.strip():
        raise EdgeflError("--out", repr(text), "give a folder name; an empty one would be the "
                          "current folder")
    return Path(text)


def _folder(out: str | Path | None) -> Path | None:
    return out_dir(out) if isinstance(out, str) else out


def scenario_file(text: str) -> Path:
    """A scenario argument: a file that exists (`quickstart` may name ./quickstart.toml; a folder of
    that name does not count), else the bundled scenario of that name (`quickstart` or
    `quickstart.toml`; `edgefl scenarios list` shows them), else the path as given (not found)."""
    from edgefl.devices.catalog import bundled

    path = Path(text)
    if path.is_file() or path.name != text:
        return path
    name = text if text.endswith(".toml") else f"{text}.toml"
    return next((p for p in (Path(name), bundled("scenarios") / name) if p.is_file()), path)


def _scenario(given: str | Path) -> Path:
    return scenario_file(given) if isinstance(given, str) else given


def default_out(scenario: Path, dry_run: bool, prefix: str = "") -> Path:
    """runs/<prefix><scenario file name>, with -dry for a dry run (README: Outputs, Comparing methods)."""
    return Path("runs") / f"{prefix}{scenario.stem}{'-dry' if dry_run else ''}"


def _overrides(sets: Sequence[str], download: bool, executor: str | None) -> list[str]:
    """The `--set` overrides plus those the flags that stand for scenario keys give."""
    import json

    return [*sets, *(["data.download=true"] if download else []),
            *([f"executor={json.dumps(executor)}"] if executor else [])]


def _resumed(run_dir: Path, overrides: list[str], extra: list[str]) -> tuple[Scenario, str]:
    """(scenario, where) of an interrupted run to resume: `extra` names what was given beside it
    (refused: a run continues as it was started)."""
    from edgefl.rundir import CHECKPOINT
    from edgefl.scenario import load_scenario

    if extra:
        raise EdgeflError(str(run_dir), "--resume", "continues a run as it was started (only where "
                          "its clients train may change: --executor, --set ray.KEY=VALUE); drop "
                          + ", ".join(extra))
    if not run_dir.is_dir():
        what = (f"is a file; give its folder ({run_dir.parent}) if that is" if run_dir.is_file()
                else "no such folder; give")
        raise EdgeflError(str(run_dir), "--resume", f"{what} the run directory of an interrupted run")
    if not (run_dir / "scenario.toml").is_file():
        raise EdgeflError(str(run_dir), "--resume", "holds no run (no scenario.toml); give the "
                          "run directory of an interrupted run")
    if (run_dir / "summary.json").exists():
        raise EdgeflError(str(run_dir), "--resume", "this run already finished (summary.json)")
    if not (run_dir / CHECKPOINT).exists():
        raise EdgeflError(str(run_dir), "--resume", "has no checkpoint (a dry run, checkpoint_every = 0, "
                          "or killed in its first round): start it again with edgefl run --overwrite")
    where = str(run_dir / "scenario.toml")
    origin = _origin(run_dir, where)
    return load_scenario(where, overrides, beside=origin), origin


def _origin(run_dir: Path, where: str) -> str:
    """The scenario file a run started from, while its folder is there: the device profiles and a
    trace beside that file are the run's, wherever its run folder is. With that folder gone, a
    relative trace is refused where the run read it, never looked for in the run folder (where the
    run writes its own files, trace.json among them)."""
    from edgefl import rundir
    from edgefl.tomlschema import read_toml

    origin = (rundir.read_marker(run_dir) or {}).get(rundir.ORIGIN)
    if not isinstance(origin, str):
        return where
    if Path(origin).parent.is_dir():
        return origin
    fleet = read_toml(Path(where), where, "scenario", "not found").get("fleet")
    trace = fleet.get("availability") if isinstance(fleet, dict) else None
    relative = isinstance(trace, str) and not Path(trace).expanduser().is_absolute()
    if relative and trace not in ("always", "diurnal"):
        raise EdgeflError(str(run_dir), "--resume", f"the run read its trace from "
                          f"{Path(origin).parent / str(trace)}, whose folder is gone; put the trace back "
                          "there, then resume")
    return where
