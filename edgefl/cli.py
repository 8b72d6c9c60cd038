"""The `edgefl` command: run, compare, plot, report, partition, scenarios list, devices list|show|...

Bad input ends with one line naming the file, the key and the fix, and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefl import api
from edgefl.api import default_out, out_dir, scenario_file
from edgefl.config import MAX_THREADS
from edgefl.errors import EdgeflError, Terminated
from edgefl.rundir import CHECKPOINT

if TYPE_CHECKING:
    from edgefl.devices.catalog import Catalog


# GNU OpenMP (PyTorch's CPU threads) spins 300,000 times at a barrier before it sleeps; on a machine
# other work shares, a thread spinning for one that is descheduled made the quickstart (3 rounds, 2
# threads, beside two busy processes) take 32 s, and 15 s with 3,000 spins; on a quiet machine 7.3-7.7 s
# either way, and the same results (waiting is all it changes). Read once, when torch is first
# imported; a value the user set is kept.
GOMP_SPINCOUNT = "3000"


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT)
    _streams_open()
    main_thread = threading.current_thread() is threading.main_thread()  # where Python runs handlers
    TERMINATED.clear()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    args = None
    try:
        args = parser().parse_args(argv)
        return int(args.func(args))
    except EdgeflError as exc:
        _error(str(_blamed(exc, args)) + (_resume_hint(args) if exc.resumable else ""))
        return 2
    except BrokenPipeError:  # the reader went away (`edgefl devices list | head -1`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 141  # as a shell tool killed by SIGPIPE
    except (ImportError, OSError) as exc:
        if _loading_torch(exc):
            _error(_torch_failed(exc))
        elif isinstance(exc, OSError):  # a storage failure no check foresaw: one line, never a traceback
            _error(f"{exc.filename or 'storage'}: {exc.strerror or exc}")
        else:
            raise  # an import of edgefl's own that fails: a bug, not the user's to fix
        return 2
    except KeyboardInterrupt as exc:
        what = "terminated (SIGTERM)" if isinstance(exc, Terminated) or TERMINATED.is_set() else "interrupted"
        print(f"edgefl: {what}{_resume_hint(args)}", file=sys.stderr)
        return 130
    finally:
        if main_thread:  # None: a handler not set from Python
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


# set by SIGTERM's handler: a Ray call the handler interrupts raises a KeyboardInterrupt of its own
# in place of the handler's Terminated, and the stop is still said to be SIGTERM's
TERMINATED = threading.Event()


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM handled as Ctrl-C is (edgefl.errors.Terminated)."""
    TERMINATED.set()
    raise Terminated


def _torch_failed(exc: Exception) -> str:
    """Why torch did not load, and what to do: under a memory limit its shared libraries fail to map
    (`ulimit -v 3000000`: "libtorch_cuda.so: failed to map segment from shared object")."""
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return (f"torch failed to load ({reason}): a memory limit too low to map its libraries, or a broken "
            "install; raise or lift the limit (ulimit -v unlimited), or reinstall torch (pip install "
            "--force-reinstall torch)")


def _loading_torch(exc: BaseException) -> bool:
    """Whether `exc` stopped the import of torch: raised while torch's __init__ ran, or no torch."""
    if isinstance(exc, ModuleNotFoundError) and exc.name == "torch":
        return True
    spec = importlib.util.find_spec("torch")
    init = spec.origin if spec else None  # torch/__init__.py
    return any(frame.f_code.co_name == "<module>" and frame.f_code.co_filename == init
               for frame, _ in traceback.walk_tb(exc.__traceback__))


def _streams_open() -> None:
    """A process started with its stdin, stdout or stderr closed (`2>&-`), or with a stderr that
    cannot be written (opened read-only, `2</dev/null`; a full device, `2>/dev/full`), has the null
    device there instead: its progress and warnings have nowhere to go, its run still has to finish
    (a progress line that cannot be written is no failure of the run's storage), and a file it opens
    never takes descriptor 2 (where a library's own errors would land in it). A stdout that cannot be
    written stays: what a command prints there is its result, and failing to print it is an error."""
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        try:
            os.fstat(fd)
            if fd == 2:
                os.write(fd, b"")  # fails as a write would (EBADF read-only, ENOSPC full); else no-op
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))  # noqa: SIM115


def _error(text: str) -> None:
    """The error line on stderr: one line, even where a path holds a line break."""
    print("edgefl: error: " + text.replace("\n", "\\n"), file=sys.stderr)


def _resume_hint(args: argparse.Namespace | None) -> str:
    """How to go on after Ctrl-C: a run with a checkpoint resumes, a comparison is run again."""
    func = getattr(args, "func", None)
    if func is cmd_compare:
        return "; run the same edgefl compare again: finished runs are kept, the others resumed"
    if func is not cmd_run or args is None or (args.scenario is None and args.resume is None):
        return ""
    out = args.resume or args.out or default_out(args.scenario, args.dry_run)
    if args.dry_run or not (out / "scenario.toml").exists():  # stopped before it wrote anything
        return ""
    if not (out / CHECKPOINT).exists():
        return "; no round was checkpointed: run it again with --overwrite"
    return f"; continue from its last checkpoint with edgefl run --resume {out}"


def _blamed(exc: EdgeflError, args: argparse.Namespace | None) -> EdgeflError:
    """An error about a scenario key that --set gave names the --set flag, not the file."""
    scenario, overrides = getattr(args, "scenario", None), getattr(args, "overrides", [])
    if not (scenario and overrides):
        return exc
    from edgefl.scenario import blame_set  # imports the methods: only when a --set may be to blame

    return blame_set(exc, str(scenario), overrides)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgefl", description=__doc__.splitlines()[0] if __doc__ else "")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    settings, training = _settings_flags(), _training_flags()
    _run_parser(sub, settings, training)
    _compare_parser(sub, settings, training)
    _plot_parser(sub)
    _report_parser(sub)
    part = sub.add_parser("partition", parents=[settings],
                          help="FedProphet's modules for a scenario's model and R_min")
    part.add_argument("scenario", type=scenario_file, help="scenario file or bundled scenario name")
    part.add_argument("--json", action="store_true", help="print a JSON list of modules")
    part.set_defaults(func=cmd_partition)
    scen = sub.add_parser("scenarios", help="the bundled scenarios")
    ssub = scen.add_subparsers(dest="scenarios_command", required=True, metavar="{list}")
    ssub.add_parser("list", help="list the bundled scenarios (edgefl run NAME runs one)").set_defaults(
        func=cmd_scenarios_list)
    _devices_parser(sub)
    _price_parser(sub)
    return p


Subparsers = argparse._SubParsersAction  # what add_subparsers returns


def _settings_flags() -> argparse.ArgumentParser:
    """--set, shared by the commands that read a scenario."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a scenario key, e.g. --set rounds=5 --set fleet.clients=10")
    return flags


def _training_flags() -> argparse.ArgumentParser:
    """The flags of the commands that train: run and compare."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument("--download", action="store_true", help="allow downloading the dataset")
    flags.add_argument("--quiet", action="store_true", help="no progress bar")
    flags.add_argument("--dry-run", action="store_true",
                       help="engine and cost model only: simulated times without data or training "
                       "(client sample counts, when a method needs them, come from balanced labels)")
    flags.add_argument("--executor", choices=["local", "ray"], help="where clients train (default: "
                       "the scenario's `executor`)")
    return flags


def _run_parser(sub: Subparsers, *parents: argparse.ArgumentParser) -> None:
    run = sub.add_parser("run", parents=list(parents), help="run a scenario: real training, simulated clock")
    run.add_argument("scenario", type=scenario_file, nargs="?",
                     help="scenario file or bundled scenario name (not with --resume)")
    run.add_argument("--out", type=out_dir, help="run directory (default runs/<scenario name>, "
                     "runs/<scenario name>-dry for a dry run)")
    run.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    run.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue an interrupted run")
    run.set_defaults(func=cmd_run)


def _compare_parser(sub: Subparsers, *parents: argparse.ArgumentParser) -> None:
    comp = sub.add_parser("compare", parents=list(parents), help="run several methods on the same fleet, "
                          "split and seed; write comparison.md, comparison.csv and figures")
    comp.add_argument("scenario", type=scenario_file, help="scenario file or bundled scenario name")
    comp.add_argument("--methods", required=True, help="comma-separated, e.g. jfat,fedprophet,heterofl_at")
    comp.add_argument("--out", type=out_dir, help="folder (default runs/compare-<scenario name>), one run "
                      "directory per method; finished runs are kept, interrupted ones resumed")
    comp.add_argument("--target", type=float, metavar="ACC", help="adversarial accuracy to reach (0-1)")
    comp.add_argument("--seeds", metavar="SEEDS", help="run every method once per seed, each in "
                      "<out>/<method>/seed-<s>/: a list (0,1,2) or a count (5: seeds 0-4); default the "
                      "scenario's [compare] seeds, else its seed alone")
    comp.add_argument("--reference", metavar="METHOD", help="the method the others are paired against "
                      "over seeds (default jfat, when compared)")
    comp.add_argument("--interval", choices=["t", "bootstrap"], default="t", help="95 %% interval of a "
                      "paired difference: Student t over the seeds (default) or a percentile bootstrap")
    comp.set_defaults(func=cmd_compare)


def _plot_parser(sub: Subparsers) -> None:
    plot = sub.add_parser("plot", help="figures (PNG and SVG) from run directories: accuracy against "
                          "simulated time, speed-up over jFAT, time breakdown, fleet memory, epsilon, "
                          "per-client timeline")
    plot.add_argument("runs", type=Path, nargs="+")
    plot.add_argument("--out", type=out_dir, help="folder for the figures (default: the first RUN/figures)")
    plot.add_argument("--target", type=float, metavar="ACC",
                      help="adversarial accuracy to reach, a fraction (e.g. 0.5): adds time-to-target")
    plot.add_argument("--timeline-clients", type=int, default=10, metavar="N",
                      help="per-client timeline (Gantt chart) of each run's first N clients (0: none)")
    plot.set_defaults(func=cmd_plot)


def _report_parser(sub: Subparsers) -> None:
    rep = sub.add_parser("report", help="one self-contained HTML page from run directories or a "
                         "comparison folder: summary, accuracy against simulated time, time breakdown, "
                         "memory, timeline, energy, comparison table")
    rep.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR",
                     help="a run directory, or a folder edgefl compare wrote (its runs)")
    rep.add_argument("--out", type=Path, metavar="FILE.html", help="the page (default: report.html in "
                     "the first RUN_DIR, for several runs too; a new file, or one edgefl report wrote)")
    rep.add_argument("--target", type=float, metavar="ACC",
                     help="adversarial accuracy to reach, a fraction (e.g. 0.5): adds time-to-target")
    rep.set_defaults(func=cmd_report)


def _devices_parser(sub: Subparsers) -> None:
    dev = sub.add_parser("devices", help="device profiles")
    dsub = dev.add_subparsers(dest="devices_command", required=True,
                              metavar="{list,show,validate,calibrate,fit}")
    ls = dsub.add_parser("list", help="list device profiles")
    ls.add_argument("--pool", help="only this pool")
    ls.add_argument("--scenario", type=scenario_file, help="the profiles this scenario sees (its "
                    "device_profiles/ folder first)")
    ls.set_defaults(func=cmd_devices_list)
    show = dsub.add_parser("show", help="show one device profile")
    show.add_argument("name")
    show.add_argument("--scenario", type=scenario_file, help="the profiles this scenario sees")
    show.set_defaults(func=cmd_devices_show)
    val = dsub.add_parser("validate", help="check device profile files")
    val.add_argument("files", type=Path, nargs="+")
    val.set_defaults(func=cmd_devices_validate)
    cal = dsub.add_parser("calibrate", help="measure this machine and write its device profile")
    cal.add_argument("--out", type=Path, required=True, help="profile file, e.g. device_profiles/NAME.toml "
                     "beside your scenario, or in a folder of EDGEFL_PROFILE_PATH")
    cal.add_argument("--pool", default="host", help="pool the profile joins (default host)")
    cal.add_argument("--repeats", type=int, default=5, help="timed repeats per figure; the median is kept")
    cal.add_argument("--quick", action="store_true", help="small sizes: seconds, rough figures (tests)")
    cal.add_argument("--overwrite", action="store_true", help="replace an existing profile file")
    cal.add_argument("--threads", type=int, default=0,
                     help="torch threads to measure with (0 = PyTorch's default); runs checked against "
                          "this profile should use the same `threads`")
    cal.add_argument("--cpu-time", action="store_true",
                     help="time compute on the process's CPU clock (a shared machine; use with --threads 1)")
    cal.set_defaults(func=cmd_devices_calibrate)
    fit = dsub.add_parser("fit", help="fit a device's per-kind efficiencies on your own step timings")
    fit.add_argument("measurements", type=Path, help="CSV with the columns of "
                     "device_profiles/evidence/measurements.csv (model, batch, input, seconds_per_step)")
    fit.add_argument("--device", required=True, help="the profile the timings were measured on")
    fit.add_argument("--out", type=Path, required=True, help="the fitted profile, e.g. my_devices/NAME.toml")
    fit.add_argument("--overwrite", action="store_true", help="replace an existing profile file")
    fit.add_argument("--scenario", type=scenario_file, help="the profiles this scenario sees")
    fit.set_defaults(func=cmd_devices_fit)


def _price_parser(sub: Subparsers) -> None:
    price = sub.add_parser("price", help="what one step of a model costs on a device (no scenario)")
    price.add_argument("model", help="a zoo model (smallcnn, vgg11, resnet18, ...), torchvision:NAME or "
                       "timm:NAME (where timm is installed)")
    price.add_argument("--device", required=True, help="a device profile's name (edgefl devices list)")
    price.add_argument("--batch", type=int, default=32, help="samples per iteration (default 32)")
    price.add_argument("--input", help="one sample's C,H,W (default 3,32,32 for the zoo, 3,224,224 for "
                       "torchvision and timm)")
    price.add_argument("--classes", type=int, help="outputs (default 10 for the zoo, 1000 for torchvision "
                       "and timm)")
    price.add_argument("--pass", dest="pass_", default="train", help="train (default) or forward")
    price.add_argument("--attack-steps", type=int, default=0,
                       help="PGD steps per train iteration (default 0)")
    price.add_argument("--optimizer", default="sgd", help="sgd (default), momentum or adam")
    price.add_argument("--precision", default="fp32", help="fp32 (default), fp16, bf16 or int8 (the "
                       "device's profile must give that peak)")
    price.add_argument("--scenario", type=scenario_file, help="the profiles this scenario sees")
    price.add_argument("--json", action="store_true", help="one JSON object (key seconds, and the rest)")
    price.set_defaults(func=cmd_price)


def cmd_price(args: argparse.Namespace) -> int:
    from edgefl.price import atoms_of, check, lines, price, step_for

    device, _ = _device(args.device, args.scenario)
    step = step_for(args.model, args.batch, args.input, args.classes, pass_=args.pass_,
                    attack_steps=args.attack_steps, optimizer=args.optimizer, precision=args.precision)
    check(step, device)
    found = price(step, atoms_of(step), device)
    print(json.dumps(found.as_json()) if args.json else "\n".join(lines(found)))
    return 0


def _device(name: str, scenario: Path | None) -> tuple[Any, Path]:
    """The profile `name` as the catalog `scenario` sees it, and its file; one line naming the known
    ones."""
    from edgefl.devices.catalog import search_path

    catalog = seen_by(scenario)
    if name not in catalog.devices:
        where = "" if scenario else (" (a profile beside a scenario: add --scenario FILE; "
                                     "one elsewhere: put its folder on EDGEFL_PROFILE_PATH)")
        raise EdgeflError(":".join(map(str, search_path(scenario))), name,
                          f"no such device; known: {', '.join(sorted(catalog.devices))}{where}")
    return catalog.devices[name], catalog.file("devices", name)


def cmd_run(args: argparse.Namespace) -> int:
    done = api.run(args.scenario, sets=args.overrides, out=args.out, overwrite=args.overwrite,
                   resume=args.resume, dry_run=args.dry_run, download=args.download, executor=args.executor,
                   progress=not args.quiet)
    print(done.line)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """edgefl.api.compare, its table printed, then the files it wrote."""
    done = api.compare(args.scenario, args.methods, sets=args.overrides, out=args.out, target=args.target,
                       seeds=args.seeds, reference=args.reference, interval=args.interval,
                       dry_run=args.dry_run, download=args.download, executor=args.executor,
                       progress=not args.quiet)
    print(done.markdown, end="")
    if len(done.seeds) <= 1:
        which = done.seeds[0] if done.seeds else "the scenario's"
        print(f"One seed ({which}): no spread and no intervals; --seeds 0,1,2 runs every method on "
              "three seeds and pairs them.")
    print("\n".join(str(p) for p in done.files))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """The figures of the runs; a run without an events log gets no timeline, said in a warning line
    on stderr (its other figures are drawn, and the exit status is 0)."""
    from edgefl.report.compare import differing_setup
    from edgefl.report.figures import make_figures
    from edgefl.report.timeline import MAX_CLIENTS, has_events

    if not 0 <= args.timeline_clients <= MAX_CLIENTS:
        raise EdgeflError("--timeline-clients", str(args.timeline_clients), "must be 0 (no timeline) or a "
                          f"client count up to {MAX_CLIENTS} (a row each: a taller chart can be neither "
                          "read nor drawn in reasonable time)")
    for path in make_figures(args.runs, args.out or args.runs[0] / "figures", args.target,
                             args.timeline_clients):
        print(path)
    for run in [r for r in args.runs if args.timeline_clients and not has_events(r)]:
        print(f"edgefl: warning: {run}: no events log (events.parquet or events.csv): its timeline is "
              "skipped, the other figures are drawn", file=sys.stderr)
    differ = differing_setup(args.runs)
    if differ:
        print(f"edgefl: warning: the runs differ in {', '.join(differ)} (their scenario.toml): the figures "
              "set side by side runs of different set-ups (edgefl compare keeps them alike)", file=sys.stderr)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from edgefl.report.html import write_report

    print(write_report(args.runs, args.out, args.target))
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    """Partition without the data: the dataset's input shape and classes are known in advance."""
    from edgefl.data.datasets import shapes_only
    from edgefl.experiment import fitted_profile
    from edgefl.experiment.prepare import model_factory
    from edgefl.methods.fedprophet.partition import partition_model
    from edgefl.scenario import load_scenario
    from edgefl.sim.cost import make_cost_model

    s = load_scenario(args.scenario, args.overrides)
    data = shapes_only(s.data)
    where = str(args.scenario)
    profile = fitted_profile(s, model_factory(s, data, where), data.input_shape, where)
    _, modules = partition_model(profile, data.num_classes, s, str(args.scenario), make_cost_model(s.cost))
    if args.json:
        print(json.dumps([{"index": m.index, "atoms": list(m.names), "mem_bytes": m.mem_bytes,
                           "flops": m.flops, "out_shape": list(m.out_shape)} for m in modules], indent=2))
        return 0
    print(f"{s.model.name} on {s.data.dataset}, batch {s.training.batch_size}, "
          f"{s.cost.accounting} MemReq, R_min {s.fleet.reserved_memory_mb} MB: {len(modules)} modules")
    print(f"{'module':<8}{'MemReq MB':>11}{'MFLOPs/sample':>15}  {'output':<16}atoms")
    for m in modules:
        print(f"{m.index + 1:<8}{m.mem_bytes / 1e6:>11.1f}{m.flops / 1e6:>15.2f}  "
              f"{'x'.join(map(str, m.out_shape)):<16}{', '.join(m.names)}")
    return 0


def cmd_scenarios_list(args: argparse.Namespace) -> int:
    from edgefl.devices.catalog import bundled

    for path in sorted(bundled("scenarios").glob("*.toml"), key=lambda p: p.stem):
        print(f"{path.stem:<34}{opening_comment(path.read_text(encoding='utf-8-sig'))}")
    return 0


def opening_comment(text: str, width: int = 100) -> str:
    """A file's opening comment as one line, cut at a word to `width` characters."""
    import textwrap

    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("#")), len(lines))
    block = []
    for line in lines[start:]:
        if not line.startswith("#") or not line.lstrip("#").strip():
            break
        block.append(line.lstrip("#").strip())
    return textwrap.shorten(" ".join(block), width, placeholder=" ...")


def seen_by(scenario: Path | None) -> Catalog:
    """The profiles `--scenario` sees (without one, those of EDGEFL_PROFILE_PATH and the bundled)."""
    from edgefl.devices.catalog import catalog_for

    if scenario is not None and not scenario.is_file():
        from edgefl.scenario import NOT_FOUND  # imports the methods: only when needed

        raise EdgeflError(str(scenario), "file", NOT_FOUND)
    return catalog_for(scenario)


def cmd_devices_list(args: argparse.Namespace) -> int:
    from edgefl.devices.catalog import search_path

    catalog = seen_by(args.scenario)
    if args.pool and args.pool not in catalog.pools():
        raise EdgeflError(":".join(map(str, search_path(args.scenario))), "--pool",
                          f"no device is in pool {args.pool!r}; pools: {', '.join(catalog.pools())}")
    devices = catalog.pool(args.pool) if args.pool else list(catalog.devices.values())
    print(f"{'name':<22}{'pools':<14}{'memory MB':>12}{'GFLOP/s':>10}{'read MB/s':>11}  file")
    for d in devices:
        print(f"{d.name:<22}{','.join(d.pools):<14}{d.memory_mb:>12.3f}"
              f"{d.compute_gflops:>10.1f}{d.storage_read_mb_s:>11.1f}  {catalog.file('devices', d.name)}")
    return 0


def cmd_devices_show(args: argparse.Namespace) -> int:
    from edgefl.devices.classes import provenance

    device, path = _device(args.name, args.scenario)
    print(f"# {path}\n{path.read_text(encoding='utf-8-sig')}", end="")
    print("\n# where the compute model's figures come from:")
    print("\n".join(f"#   {x}" for x in provenance(device)))
    return 0


def cmd_devices_validate(args: argparse.Namespace) -> int:
    """Every file checked, each found wrong one error line; exit 2 when any was."""
    wrong = 0
    for path in args.files:
        try:
            print(f"{path}: ok ({validated(path)})")
        except EdgeflError as exc:
            print(f"edgefl: error: {exc}", file=sys.stderr)
            wrong += 1
    return 2 if wrong else 0


def validated(path: Path) -> str:
    """What `path` holds, as a profile of the folder it is in: a device (its networks those of that
    folder, of EDGEFL_PROFILE_PATH and the bundled ones), or an app or a network in an `apps/` or
    `networks/` folder."""
    from edgefl.devices.catalog import load_profile, network_names, search_path
    from edgefl.devices.profile import AppProfile, DeviceProfile, NetworkProfile

    if not path.is_file():
        raise EdgeflError(str(path), "file", "not a file; give profile files (.toml)")
    if path.parent.name == "apps":
        return f"{load_profile(path, AppProfile).name}: app"
    if path.parent.name == "networks":
        return f"{load_profile(path, NetworkProfile).name}: network"
    p = load_profile(path, DeviceProfile, network_names((path.parent.resolve(), *search_path())))
    return f"{p.name}: {p.memory_mb} MB, {p.compute_gflops} GFLOP/s"


def cmd_devices_calibrate(args: argparse.Namespace) -> int:
    from edgefl.calibration.calibrate import (
        FULL,
        QUICK,
        calibrate,
        prepare_target,
        render_profile,
        write_profile,
    )
    name = args.out.stem  # profiles are named by their file
    if not 0 <= args.threads <= MAX_THREADS:  # checked before prepare_target creates the folder
        raise EdgeflError(str(args.out), "--threads",
                          f"must be 0 (PyTorch's default) or a positive count up to {MAX_THREADS}")
    prepare_target(args.out, args.repeats, args.overwrite)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        c = calibrate(args.out.parent, QUICK if args.quick else FULL, args.repeats, args.cpu_time)
        p = write_profile(args.out, render_profile(name, args.pool, c))
    except OSError as exc:
        raise EdgeflError(str(args.out), "--out", f"cannot write there ({exc})") from None
    s = c.storage
    print(f"memory {p.memory_mb:.0f} MB; matmul {c.compute.matmul_gflops:.4g}, conv2d "
          f"{c.compute.conv_gflops:.4g} GFLOP/s; storage read {s.read_mbps:.4g}, write {s.write_mbps:.4g} "
          f"MB/s, latency read {s.read_latency_ms:.4g}, write {s.write_latency_ms:.4g} ms; "
          f"rooflines of {len(c.rooflines)} (kind, pass) on {c.threads} threads -> {args.out}")
    print(_found_how(args.out, name))
    if args.quick:
        print("edgefl: warning: --quick times a few small shapes (for tests): its figures are rough and can "
              "be off many times over on a real model; calibrate without --quick for a profile to run on",
              file=sys.stderr)
    return 0


def cmd_devices_fit(args: argparse.Namespace) -> int:
    """The device's `[fitted]` figures fitted on the user's timings, starting from (and pulled
    toward) those its profile carries; each row's leave-one-out error printed."""
    import re
    import statistics

    from edgefl.calibration.calibrate import prepare_target, write_profile
    from edgefl.calibration.fit import FIT_KINDS, Fit, fit, left_out, priced, profile_fit, read_measurements
    from edgefl.calibration.profiles import fitted_table, with_table
    from edgefl.devices.families import fitted_of
    from edgefl.price import atoms_of, step_for

    device, path = _device(args.device, args.scenario)
    if any(getattr(device.kernels, k) for k in FIT_KINDS):
        raise EdgeflError(args.device, "kernels", "a calibrated profile's [kernels] set its convolution "
                          "and linear rates, which fitted efficiencies would not change; fit a datasheet "
                          "profile, or calibrate this host again (edgefl devices calibrate)")
    prepare_target(args.out, 1, args.overwrite)
    rows = []
    for i, r in enumerate(read_measurements(args.measurements, args.device), 1):
        optimizer = r.get("optimizer") or "sgd"
        step = step_for(r.get("price_model") or r.get("model", ""), int(r["batch"]),
                        r.get("input", "").split(" ")[0], int(r.get("classes") or 0),
                        optimizer="sgd" if optimizer == "none" else optimizer,
                        precision=r.get("price_precision") or r.get("precision") or "fp32")
        rows.append(priced(r.get("id") or f"row {i}", "user", float(r["seconds_per_step"]), step,
                           atoms_of(step), device, optimizer_step=optimizer != "none"))
    # what runs charge it now; the fit starts from (and is pulled toward) its fitted or family
    # figures where it has them, else its class's
    charged = profile_fit(device)
    base = charged if fitted_of(device.family, device.fitted).efficiency else Fit({})
    whole, loo = Fit({**base.params, **fit(rows, base=base).params}), left_out(rows, base=base)
    print(f"{'row':<10}{'measured s':>12}{'profile':>9}{'fitted':>9}{'LOO':>9}   (predicted / measured)")
    now = {p.id: charged.predict(p) for p in rows}
    for p in rows:
        print(f"{p.id:<10}{p.seconds:>12.4g}{now[p.id] / p.seconds:>9.2f}"
              f"{whole.predict(p) / p.seconds:>9.2f}{loo[p.id] / p.seconds:>9.2f}")
    error = statistics.median(abs(math.log2(loo[p.id] / p.seconds)) for p in rows)
    stamp = (f"edgefl devices fit on {args.measurements.name}, {len(rows)} rows, leave-one-out median "
             f"|log2(predicted / measured)| {error:.2f}, from {device.name}'s figures")
    table = fitted_table(whole, device, rows, now, stamp)
    text = with_table(path.read_text(encoding="utf-8-sig"), table)
    write_profile(args.out, re.sub(r'(?m)^name = .*$', f"name = {json.dumps(args.out.stem)}", text, count=1))
    print(f"leave-one-out median |log2 ratio| {error:.2f} over {len(rows)} rows -> {args.out}")
    return 0


def _found_how(out: Path, name: str) -> str:
    """How a scenario finds the profile just written, without copying it anywhere."""
    from edgefl.devices.catalog import ENV, search_path

    folder = out.parent.resolve()
    use = f"fleet.devices = [{name!r}]"
    if folder in search_path():
        return f"scenarios find it ({folder} is on the profile search path): use {use}"
    if folder.name == "device_profiles":
        return (f"a scenario file in {folder.parent} finds it there: use {use}; from elsewhere, "
                f"export {ENV}={folder}")
    return f"to use it, export {ENV}={folder} (or put it in device_profiles/ beside the scenario): {use}"
