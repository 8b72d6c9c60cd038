"""The `edgefl` command: run | plot | partition | devices (list, show, validate).

Bad input ends with one line naming the file, the key and the fix, and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from edgefl.errors import EdgeflError


def main(argv: Sequence[str] | None = None) -> int:
    # fvcore scripts a few helpers with torch.jit, which recent torch warns about on every start
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.* is deprecated")
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except EdgeflError as exc:
        print(f"edgefl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("edgefl: interrupted", file=sys.stderr)
        return 130


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgefl", description=__doc__.splitlines()[0] if __doc__ else "")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a scenario: real training, simulated clock")
    run.add_argument("scenario", type=Path)
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a scenario key, e.g. --set rounds=5 --set fleet.clients=10")
    run.add_argument("--out", type=Path, help="run directory (default runs/<scenario name>)")
    run.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    run.add_argument("--download", action="store_true", help="allow downloading the dataset")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=cmd_run)

    plot = sub.add_parser("plot", help="accuracy against simulated time, one line per run")
    plot.add_argument("runs", type=Path, nargs="+")
    plot.add_argument("--out", type=Path, help="PNG file (default RUN/accuracy.png of the first run)")
    plot.set_defaults(func=cmd_plot)

    part = sub.add_parser("partition", help="FedProphet's modules for a scenario's model and R_min")
    part.add_argument("scenario", type=Path)
    part.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    part.add_argument("--json", action="store_true", help="print a JSON list of modules")
    part.set_defaults(func=cmd_partition)

    dev = sub.add_parser("devices", help="device profiles")
    dsub = dev.add_subparsers(dest="devices_command", required=True)
    ls = dsub.add_parser("list", help="list device profiles")
    ls.add_argument("--pool", help="only this pool")
    ls.set_defaults(func=cmd_devices_list)
    show = dsub.add_parser("show", help="show one device profile")
    show.add_argument("name")
    show.set_defaults(func=cmd_devices_show)
    val = dsub.add_parser("validate", help="check device profile files")
    val.add_argument("files", type=Path, nargs="+")
    val.set_defaults(func=cmd_devices_validate)
    return p


def cmd_run(args: argparse.Namespace) -> int:
    from edgefl.config import load_scenario
    from edgefl.experiment import prepare, prepare_out, run

    overrides = [*args.overrides, *(["data.download=true"] if args.download else [])]
    scenario = load_scenario(args.scenario, overrides)
    out = args.out or Path("runs") / args.scenario.stem
    exp = prepare(scenario, str(args.scenario))
    prepare_out(out, args.overwrite, str(args.scenario))
    summary = run(exp, out, progress=not args.quiet)
    swapped = summary["client_rounds_swapped"]
    print(f"{summary['method']}: {summary['rounds']} rounds, "
          f"simulated {summary['sim_time_s'] / 3600:.2f} h (wall {summary['wall_time_s']:.0f} s), "
          f"clean {100 * summary['clean_acc']:.1f} %, PGD {100 * summary['adv_acc']:.1f} %, "
          f"{swapped}/{summary['client_rounds']} client-rounds swapped -> {out}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from edgefl.report.plot import plot_accuracy

    out = plot_accuracy(args.runs, args.out or args.runs[0] / "accuracy.png")
    print(out)
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    """Partition without the data: the dataset's input shape and classes are known in advance."""
    import json

    from edgefl.config import load_scenario
    from edgefl.data.datasets import DATASETS
    from edgefl.methods.fedprophet.partition import partition_model
    from edgefl.models import build_model
    from edgefl.profiling import profile_model

    s = load_scenario(args.scenario, args.overrides)
    spec = DATASETS.get(s.data.dataset)
    channels = spec.input_shape[0]
    model = build_model(s.model.name, spec.num_classes, spec.input_shape, [0.5] * channels,
                        [0.25] * channels)
    profile = profile_model(model, s.model.name)
    _, modules = partition_model(profile, spec.num_classes, spec.input_shape[-1], s, str(args.scenario))
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


def cmd_devices_list(args: argparse.Namespace) -> int:
    from edgefl.devices.catalog import PROFILES_DIR, load_catalog

    catalog = load_catalog()
    if args.pool and args.pool not in catalog.pools():
        raise EdgeflError(str(PROFILES_DIR), "--pool",
                          f"no device is in pool {args.pool!r}; pools: {', '.join(catalog.pools())}")
    devices = catalog.pool(args.pool) if args.pool else list(catalog.devices.values())
    print(f"{'name':<22}{'pools':<14}{'memory MB':>12}{'GFLOP/s':>10}{'read MB/s':>11}")
    for d in devices:
        print(f"{d.name:<22}{','.join(d.pools):<14}{d.memory_mb:>12.3f}"
              f"{d.compute_gflops:>10.1f}{d.storage_read_mbps:>11.1f}")
    return 0


def cmd_devices_show(args: argparse.Namespace) -> int:
    from edgefl.devices.catalog import PROFILES_DIR, load_catalog

    catalog = load_catalog()
    if args.name not in catalog.devices:
        raise EdgeflError(str(PROFILES_DIR), args.name,
                          f"no such device; known: {', '.join(sorted(catalog.devices))}")
    print((PROFILES_DIR / f"{args.name}.toml").read_text(), end="")
    return 0


def cmd_devices_validate(args: argparse.Namespace) -> int:
    from edgefl.devices.profile import DeviceProfile, load_profile

    for path in args.files:
        if not path.is_file():
            raise EdgeflError(str(path), "file", "not found")
        p = load_profile(path, DeviceProfile)
        print(f"{path}: ok ({p.name}: {p.memory_mb} MB, {p.compute_gflops} GFLOP/s)")
    return 0
