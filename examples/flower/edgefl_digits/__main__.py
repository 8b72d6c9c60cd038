"""`python -m edgefl_digits`: the app in Flower's simulation (run_simulation), without `flwr run`."""

from __future__ import annotations

import argparse

from flwr.simulation import run_simulation

from edgefl_digits.client_app import make_client_app
from edgefl_digits.server_app import make_server_app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m edgefl_digits", description=__doc__)
    p.add_argument("--nodes", type=int, default=10, help="virtual nodes (the scenario's fleet.clients)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="runs/flower-digits", help="the edgefl run folder to write")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of the scenario (as edgefl run --set)")
    p.add_argument("--dry-price", action="store_true", help="do not train: simulated times only")
    p.add_argument("--cpus", type=float, default=1.0, help="CPUs per virtual node")
    a = p.parse_args(argv)
    server = make_server_app(**{"num-server-rounds": a.rounds, "out": a.out, "dry-price": a.dry_price,
                                "edgefl-set": ";".join([f"fleet.clients={a.nodes}", *a.overrides])})
    run_simulation(server_app=server, client_app=make_client_app(a.dry_price), num_supernodes=a.nodes,
                   backend_config={"client_resources": {"num_cpus": a.cpus, "num_gpus": 0.0}})


if __name__ == "__main__":
    main()
