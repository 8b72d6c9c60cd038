"""The ClientApp: PGD adversarial training of the CNN on the node's digits, priced on its device.

`device_time()` (edgefl.flower) is the only edgefl line a Flower ClientApp needs: it prices each
train reply on the edge device the node's partition-id is, and tells DeviceClock which client the
node is. The node runs the plan DeviceClock sent (`edgefl` ConfigRecord: local iterations, batch
size, PGD steps) and says in its MetricRecord what it ran (`edgefl.did.*`).
"""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from edgefl.flower import device_time
from edgefl_digits import task

EPS, STEP_SIZE, LR = 0.2, 0.05, 0.05  # the scenario's attack.eps, attack.step_size, training.lr


def make_client_app(dry_price: bool | None = None) -> ClientApp:
    """The ClientApp; `dry_price` (default: the run config's `dry-price`) skips the training."""
    app = ClientApp(mods=[device_time()])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid, parts = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
        plan = msg.content.config_records.get("edgefl", {})
        iterations = int(plan.get("plan.iterations", 10))
        batch, steps = int(plan.get("plan.batch", 32)), int(plan.get("plan.attack_steps", 10))
        model = task.Net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        x, y = task.load_data(pid, parts)
        metrics: dict[str, int | float] = {"num-examples": len(y)}
        dry = dry_price if dry_price is not None else bool(context.run_config.get("dry-price", False))
        if not dry:
            server_round = int(msg.content["config"]["server-round"])
            metrics["train_loss"] = task.train(model, x, y, iterations, batch, LR, EPS, STEP_SIZE, steps,
                                               seed=1000 * server_round + pid)
            metrics.update({"edgefl.did.iterations": iterations, "edgefl.did.batch": batch,
                            "edgefl.did.attack_steps": steps})
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)})
        return Message(content=content, reply_to=msg)

    return app


app = make_client_app()
