"""`DeviceClock`: any Flower strategy, with edgefl's fleet and simulated clock around it.

    strategy = DeviceClock(FedAvg(), scenario="scenario.toml", out="runs/flower")
    strategy.start(grid=grid, initial_arrays=arrays, num_rounds=3, evaluate_fn=...)

The wrapped strategy's aggregation is Flower's; DeviceClock decides who trains and whose update
counts, as edgefl would (edgefl.flower.clock `Clock`): each round it asks edgefl which clients of
the fleet take part (the selection policy; on a living fleet those online at the round's start,
with the scenario's over-selection), sends each the wrapped strategy's message (its arrays and
config) with the client's plan, plays the round on the prices the nodes' replies carry (the
`device_time` mod), and hands the wrapped strategy the replies of the clients that completed
(deadline, stragglers dropped once the target has uploaded, devices gone offline or out of
battery, failed nodes: left out). The clock moves on by the round's time, and edgefl's run folder
is written (edgefl.flower.runfolder). Nodes are clients by their `partition-id`, which the mod
tells DeviceClock once, at the first round.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from edgefl.config import Scenario
from edgefl.errors import EdgeflError
from edgefl.experiment.living import completed
from edgefl.flower.clock import Clock
from edgefl.flower.mod import WHOAMI
from edgefl.flower.runfolder import RunFolder
from edgefl.flower.shadow import KEY, PRICES, Shadow, check_model
from edgefl.sim.clients import STATUSES

log = logging.getLogger("flwr")
WHERE = "DeviceClock"


def _reason(text: str) -> str:
    """An error's reason on one line (its last non-empty line: a traceback's exception)."""
    lines = [x.strip() for x in str(text).splitlines() if x.strip()]
    return (lines[-1] if lines else "unknown error")[:300]


class DeviceClock(Strategy):
    """A Flower strategy on edgefl's fleet and clock (see the module's docstring).

    strategy: the Flower strategy that aggregates (FedAvg, FedAdam, FedProx, ...); its own node
      sampling is replaced by edgefl's selection, and every selected node gets its message's content.
    scenario: an edgefl scenario file (or Scenario): the fleet, seed, round mode, deadline,
      over-selection, energy and the plan each client runs; `overrides`: `--set`-style KEY=VALUE.
    out: the run folder to write (refused if it holds other files; an edgefl run in it is
      replaced only with `overwrite`).
    trained: False when the nodes do not train (a dry price): summary.json then says dry_run.
    model: the network the nodes train (a function making the torch module, e.g. the class Net), to
      price its layers instead of the scenario's `model.name`; give the mod the same (`device_time`).
    """

    def __init__(self, strategy: Strategy, scenario: str | Path | Scenario, *,
                 out: str | Path = "runs/flower", overrides: list[str] | None = None, overwrite: bool = False,
                 trained: bool = True, timeout: float | None = None,
                 model: Callable[[], Any] | None = None) -> None:
        if not isinstance(strategy, Strategy):
            raise EdgeflError(WHERE, "strategy", f"wraps a Flower strategy (flwr.serverapp.strategy."
                              f"Strategy, e.g. FedAvg()), not {type(strategy).__name__}")
        if isinstance(strategy, DeviceClock):
            raise EdgeflError(WHERE, "strategy", "is already a DeviceClock: wrap the Flower strategy once")
        if not isinstance(out, str | Path) or not str(out):
            raise EdgeflError(WHERE, "out", f"is the run folder to write (a path), not {out!r}")
        if overrides is not None and (not isinstance(overrides, list | tuple)
                                      or not all(isinstance(o, str) for o in overrides)):
            raise EdgeflError(WHERE, "overrides", "is a list of KEY=VALUE strings (as edgefl run --set)")
        if timeout is not None and (not isinstance(timeout, int | float) or not timeout > 0):
            raise EdgeflError(WHERE, "timeout", f"is the seconds to wait for a node's answer, > 0, "
                              f"not {timeout!r}")
        self.strategy, self.out, self.overwrite, self.trained = strategy, Path(out), overwrite, trained
        check_model(model, WHERE)
        self.shadow = Shadow.load(scenario, list(overrides) if overrides else None, model)
        if self.shadow.scenario.round.mode == "async":
            raise EdgeflError(self.shadow.where, "round.mode", "async rounds (FedBuff) are not a Flower "
                              "strategy's rounds; use sync or deadline")
        self.clock = Clock(self.shadow)
        self.timeout = timeout
        self.folder: RunFolder | None = None
        self.nodes: dict[int, int] | None = None  # client -> node id
        self.sent: dict[int, int] = {}  # node id -> client, this round
        self.unpriced = False

    # --- Strategy --------------------------------------------------------------------------------
    def summary(self) -> None:
        s = self.shadow.scenario
        log.info("\t├── edgefl DeviceClock: %s clients (%s), round mode %s, seed %s -> %s",
                 s.fleet.clients, s.fleet.pool if not s.fleet.devices else ", ".join(s.fleet.devices),
                 s.round.mode, s.seed, self.out)
        self.strategy.summary()

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None) -> Result:
        """Flower's round loop on this strategy; the run folder is finished when it ends."""

        def evaluated(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            assert evaluate_fn is not None
            res = evaluate_fn(server_round, arrays)
            if res is not None and server_round > 0 and self.folder is not None:
                self.folder.evaluated(dict(res))
            return res

        self.timeout = self.timeout or timeout
        try:
            return super().start(grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config,
                                 evaluated if evaluate_fn else None)
        finally:
            self.close()

    def close(self) -> dict[str, Any]:
        """Finish the run folder (trace.json, summary.json); `start` does it when its rounds end."""
        return self.folder.close(self.trained) if self.folder is not None else {}

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        if self.folder is None:
            self.folder = RunFolder(self.out, self.shadow, self.clock.selection, self.overwrite)
        if self.nodes is None:
            self.nodes = self._clients(grid)
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        self.sent = {}
        if not messages:  # the strategy trains no one this round (fraction_train = 0)
            return []
        t = server_round - 1
        plans = self.clock.begin(t)
        content = messages[0].content
        out = []
        for k, numbers in plans.items():
            record = RecordDict(dict(content.items()))
            record[KEY] = ConfigRecord({"scenario": self.shadow.text, "where": self.shadow.where, "round": t,
                                        "client": k, **{f"plan.{n}": v for n, v in numbers.items()}})
            out.append(Message(content=record, dst_node_id=self.nodes[k], message_type=MessageType.TRAIN))
            self.sent[self.nodes[k]] = k
        log.info("edgefl: round %d starts at %.1f s simulated: %d clients of %d", t, self.clock.now, len(out),
                 self.shadow.clients)
        return out

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        assert self.folder is not None
        t, replies = server_round - 1, list(replies)
        if not self.sent:
            return self.strategy.aggregate_train(server_round, replies)
        prices: dict[int, dict[str, float]] = {}
        failed: dict[int, str] = {}
        losses: dict[int, float] = {}
        real: dict[int, float] = {}
        for msg in replies:
            k = self.sent.get(msg.metadata.src_node_id)
            if k is None:
                continue
            if msg.has_error():
                failed[k] = f"the ClientApp failed: {_reason(msg.error.reason or '')}"
                continue
            record = next(iter(msg.content.metric_records.values()), MetricRecord())
            ours = {name[len(KEY) + 1:]: cast(float, record.pop(name)) for name in list(record)
                    if name.startswith(f"{KEY}.")}  # the wrapped strategy aggregates the app's own metrics
            if all(p in ours for p in PRICES):
                prices[k] = {p: float(ours[p]) for p in PRICES}
            if "real_compute_s" in ours:
                real[k] = float(ours["real_compute_s"])
            for name in ("train_loss", "loss"):
                if name in record:
                    losses[k] = float(cast(float, record[name]))
                    break
        answered = {self.sent[m.metadata.src_node_id] for m in replies if m.metadata.src_node_id in self.sent}
        for k in sorted(set(self.sent.values()) - answered):
            failed[k] = "no reply from its node within the timeout"
        missing = set(self.sent.values()) - set(prices) - set(failed)
        if missing and not self.unpriced:
            self.unpriced = True
            log.warning("edgefl: %d replies carry no edgefl prices: the server prices them (add "
                        "edgefl.flower.device_time() to the ClientApp's mods)", len(missing))
        table = self.clock.end(t, prices, failed, losses)
        done = set(completed(table))
        finish = dict(zip(table.states.clients.tolist(), table.finish_s.tolist(), strict=True))
        kept = [m for m in replies if not m.has_error() and self.sent.get(m.metadata.src_node_id) in done]
        kept.sort(key=lambda m: (finish[self.sent[m.metadata.src_node_id]],
                                 self.sent[m.metadata.src_node_id]))
        # in simulated completion order, whatever order they came in: the aggregate is reproducible
        arrays, metrics = self.strategy.aggregate_train(server_round, kept) if kept else (None, None)
        counted = [losses[k] for k in sorted(done) if k in losses]
        loss: float | str = round(sum(counted) / len(counted), 5) if counted else ""
        self.folder.round(table, loss, real, failed)
        counts = ", ".join(f"{int((table.status == i).sum())} {name}" for i, name in enumerate(STATUSES)
                           if (table.status == i).any())
        log.info("edgefl: round %d ends at %.1f s simulated (%.1f s): %s", t, table.end_s, table.duration_s,
                 counts)
        for k, why in sorted(failed.items()):
            log.info("edgefl: round %d: client %d dropped: %s", t, k, why)
        return arrays, metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        res = self.strategy.aggregate_evaluate(server_round, replies)
        if res is not None and self.folder is not None:
            self.folder.evaluated(dict(res))
        return res

    # --- which node is which client -------------------------------------------------------------
    def _clients(self, grid: Grid) -> dict[int, int]:
        """Each client's node: every node is asked its partition-id (the mod answers)."""
        nodes = sorted(grid.get_node_ids())
        ask = [Message(content=RecordDict({KEY: ConfigRecord({WHOAMI: True})}), dst_node_id=n,
                       message_type=MessageType.TRAIN) for n in nodes]  # the mod answers it
        answers = list(grid.send_and_receive(ask, timeout=self.timeout or 600))
        found: dict[int, int] = {}
        for msg in answers:
            if msg.has_error() or KEY not in msg.content.config_records:
                why = _reason(msg.error.reason or "") if msg.has_error() else "no edgefl record"
                node = msg.metadata.src_node_id
                raise EdgeflError(WHERE, "ClientApp", f"node {node} did not say which client it is "
                                  f"({why}): add edgefl.flower.device_time() to the ClientApp's mods")
            pid = msg.content.config_records[KEY]["partition-id"]
            found[int(cast(int, pid))] = msg.metadata.src_node_id
        return every_client(found, len(nodes), self.shadow)


def every_client(found: dict[int, int], nodes: int, shadow: Shadow) -> dict[int, int]:
    """`found` (client -> node), checked to hold every client of the fleet."""
    n = shadow.clients
    if any(k not in found for k in range(n)):
        raise EdgeflError(shadow.where, "fleet.clients", f"the fleet has {n} clients but the Flower "
                          f"federation has {nodes} nodes (partition-ids {_span(found)}); run {n} nodes "
                          f"(num-supernodes) or set fleet.clients = {nodes}")
    return found


def _span(found: dict[int, int]) -> str:
    ids = sorted(found)
    return "none" if not ids else f"{ids[0]} to {ids[-1]}" if len(ids) > 1 else str(ids[0])


__all__ = ["DeviceClock"]
