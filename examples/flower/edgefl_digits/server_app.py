"""The ServerApp: Flower's FedAvg, on edgefl's fleet and clock (`DeviceClock`).

DeviceClock picks each round's nodes as edgefl picks its clients, plays the round on the prices
the nodes' replies carry, aggregates (with FedAvg) the updates of the clients that completed in
simulated time, and writes an edgefl run folder: `edgefl report OUT` makes its page.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from edgefl.flower import DeviceClock
from edgefl_digits import task
from edgefl_digits.client_app import EPS, STEP_SIZE

HERE = Path(__file__).parent
DEFAULTS: dict[str, Any] = {"num-server-rounds": 3, "scenario": "scenario.toml", "edgefl-set": "",
                            "out": "runs/flower-digits", "dry-price": False, "seed": 0}


def central_evaluation(dry: bool) -> Any:
    """Clean and PGD-20 accuracy of the global model on the held-out digits (none in a dry price)."""

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if dry or server_round == 0:
            return None
        model = task.Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        clean, adv = task.test(model, EPS, STEP_SIZE, 20)
        return MetricRecord({"clean_acc": clean, "adv_acc": adv})

    return evaluate


def make_server_app(**given: Any) -> ServerApp:
    """The ServerApp; `given` settings (DEFAULTS' keys) win over the run config's."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        cfg = {**DEFAULTS, **dict(context.run_config), **given}
        scenario = Path(str(cfg["scenario"]))
        overrides = [s.strip() for s in str(cfg["edgefl-set"]).split(";") if s.strip()]
        dry = bool(cfg["dry-price"])
        strategy = DeviceClock(FedAvg(fraction_evaluate=0.0), scenario if scenario.is_absolute() else
                               HERE / scenario, out=cfg["out"], overrides=overrides, overwrite=True,
                               trained=not dry)
        torch.manual_seed(int(cfg["seed"]))  # the initial model
        strategy.start(grid=grid, initial_arrays=ArrayRecord(task.Net().state_dict()),
                       num_rounds=int(cfg["num-server-rounds"]), evaluate_fn=central_evaluation(dry))

    return app


app = make_server_app()
