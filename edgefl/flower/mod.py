"""The client mod: a Flower node is a device of an edgefl fleet, and its train reply carries its price.

`device_time()` is a Flower client mod (`ClientApp(mods=[device_time()])`). A node's
`partition-id` (its node config; Flower's simulation sets it) is its client of the fleet. On a
train message it runs the ClientApp, then prices what the node did on its device in that round
with edgefl's cost model (edgefl.flower.shadow `Shadow.price`: compute, data access and swap,
download, upload, and joules) and adds the prices to the reply's MetricRecord as
`edgefl.<name>` (`edgefl.compute_s`, ...), with `edgefl.client` and `edgefl.real_compute_s` (the
seconds the ClientApp took here).

What is priced is the round's plan: the one `DeviceClock` sent with the message (its
`edgefl` ConfigRecord: the scenario, the round, the workload's numbers), or without one (a plain
Flower strategy) the plan the mod's own `scenario` makes for the node in round `server-round` - 1.
A ClientApp that trained otherwise says so in its reply's MetricRecord: `edgefl.did.iterations`,
`edgefl.did.batch`, `edgefl.did.attack_steps` replace the plan's figures (and are removed).
The mod also answers `DeviceClock`'s question of which client a node is: a train message carrying
only `edgefl.whoami`, answered before the ClientApp sees it (a query would need the app to register
a query function).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp.typing import ClientAppCallable, Mod

from edgefl.config import Scenario
from edgefl.errors import EdgeflError
from edgefl.flower.shadow import DID, KEY, PLANNED, Shadow, check_model, key

WHOAMI = "whoami"
_SHADOWS: dict[tuple[str, str, Any], Shadow] = {}  # per process: a scenario is prepared once


def partition_id(context: Context) -> int:
    """The node's client of the fleet: its node config's `partition-id`."""
    pid = context.node_config.get("partition-id")
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise EdgeflError("node config", "partition-id", "is missing or not an integer: run the app in "
                          "Flower's simulation (it sets partition-id) or give each SuperNode "
                          "--node-config \"partition-id=K\"")
    return pid


def shadow_of(text: str, where: str, model: Callable[[], Any] | None = None) -> Shadow:
    """The scenario a server sent (its resolved text, found beside `where`), prepared once here."""
    k = (text, where, model)
    if k not in _SHADOWS:
        _SHADOWS[k] = Shadow.from_text(text, where, model)
    return _SHADOWS[k]


def device_time(scenario: str | Path | Scenario | None = None, overrides: list[str] | None = None,
                model: Callable[[], Any] | None = None) -> Mod:
    """A client mod pricing each train reply on the node's device. `scenario` (a file or Scenario,
    with `--set` overrides) is needed only under a strategy that is not wrapped in `DeviceClock`,
    which sends its own. `model` (a function making the torch network the node trains, as given
    to DeviceClock) prices that network's layers instead of the scenario's `model.name`."""
    check_model(model, "device_time")
    own: list[Shadow] = []

    def local() -> Shadow:
        if not own:
            if scenario is None:
                raise EdgeflError("device_time", "scenario", "no scenario: wrap the strategy in "
                                  "edgefl.flower.DeviceClock, or give device_time(scenario=FILE)")
            own.append(Shadow.load(scenario, overrides, model))
        return own[0]

    def mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        told = msg.content.config_records.get(KEY) if msg.has_content() else None
        kind = msg.metadata.message_type
        if told is not None and WHOAMI in told:  # a train message (every ClientApp trains), not the app's
            answer = ConfigRecord({"partition-id": partition_id(context)})
            return Message(RecordDict({KEY: answer}), reply_to=msg)
        if kind.split(".")[0] != MessageType.TRAIN:
            return call_next(msg, context)
        started = time.perf_counter()
        reply = call_next(msg, context)
        took = time.perf_counter() - started
        if reply.has_error():
            return reply
        client = partition_id(context)
        if told is not None and "scenario" in told:
            shadow = shadow_of(str(told["scenario"]), str(told["where"]), model)
            t = int(cast(int, told["round"]))
            sent = {k: told[f"plan.{k}"] for k in PLANNED if f"plan.{k}" in told}
        else:
            shadow, t, sent = local(), _server_round(msg) - 1, {}
        metrics = _metric_record(reply)
        did = {k: metrics.pop(key(f"did.{k}")) for k in DID if key(f"did.{k}") in metrics}
        prices = shadow.price(client, t, sent, did)
        for name, value in prices.items():
            if value == value:  # NaN (energy not priced) is left out
                metrics[key(name)] = value
        metrics[key("client")] = client
        metrics[key("real_compute_s")] = took
        return reply

    return mod


def _server_round(msg: Message) -> int:
    """The round a plain Flower strategy says it is (FedAvg's `server-round`), from 1."""
    for record in msg.content.config_records.values():
        if "server-round" in record:
            return int(cast(int, record["server-round"]))
    raise EdgeflError("train message", "server-round", "the strategy sent no server-round; wrap it in "
                      "edgefl.flower.DeviceClock")


def _metric_record(reply: Message) -> MetricRecord:
    """The reply's MetricRecord (Flower's strategies expect exactly one); one is added if it has none."""
    records = reply.content.metric_records
    if records:
        return next(iter(records.values()))
    reply.content["metrics"] = MetricRecord()
    return reply.content.metric_records["metrics"]
