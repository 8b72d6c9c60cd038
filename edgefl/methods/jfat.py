"""jFAT: joint federated adversarial training of the whole model (FedProphet §7.2; Zizzo et al.).

Every client trains the whole model with local PGD adversarial training and the server averages
(FedAvg). With `training.fedbn` (the release's default) BatchNorm stays local: a client keeps its
own BN parameters and statistics across rounds and downloads everything else; the server averages
the uploaded BN only for the model it evaluates. A client whose available memory cannot hold the
model swaps, and the cost model charges it.
"""

from __future__ import annotations

import copy

import torch

from edgefl.devices.pool import DeviceState
from edgefl.execution.local import make_optimizer, seed_everything, train_local
from edgefl.methods.aggregate import State, bn_keys, fedavg, keep_local, state_bytes
from edgefl.methods.base import METHODS, ClientUpdate, Context, Method
from edgefl.profiling import optimizer_slots
from edgefl.sim.workload import Workload


@METHODS.register("jfat")
class JFAT(Method):
    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.model = ctx.new_model().to(ctx.device)
        self.fedbn = ctx.scenario.training.fedbn
        self.local_keys = bn_keys(self.model) if self.fedbn else set()
        self.local_states: dict[int, State] = {}
        t = ctx.scenario.training
        self.slots = optimizer_slots(t.optimizer, t.momentum)

    def plan(self, round_: int, client: int, state: DeviceState) -> Workload:
        t, s = self.ctx.scenario.training, self.model.state_dict()
        attack = self.ctx.attack_for(round_)
        return Workload(
            atoms=self.ctx.profile.atoms, batch=t.batch_size, iterations=t.local_iters,
            attack_steps=attack.steps if attack else 0, slots=self.slots,
            download_bytes=state_bytes(s, set(s) - self.kept_by(client)), upload_bytes=state_bytes(s))

    def kept_by(self, client: int) -> set[str]:
        """Keys the client already holds locally (FedBN), so it does not download them."""
        return self.local_keys if client in self.local_states else set()

    def train(self, round_: int, client: int, workload: Workload) -> ClientUpdate:
        gen = seed_everything(self.ctx.scenario.seed, round_, client)
        model = copy.deepcopy(self.model)
        if client in self.local_states:
            model.load_state_dict(keep_local(model.state_dict(), self.local_states[client],
                                             self.local_keys))
        x, y = self.ctx.client_data(client)
        opt = make_optimizer(list(model.parameters()), self.ctx.scenario.training,
                             self.ctx.lr(round_))
        loss = train_local(model, x, y, opt, workload.iterations, workload.batch,
                           self.ctx.attack_for(round_), gen)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if self.fedbn:
            self.local_states[client] = {k: state[k] for k in self.local_keys}
        return ClientUpdate(client, state, len(x), loss)

    def aggregate(self, round_: int, updates: list[ClientUpdate]) -> None:
        new = fedavg([u.state for u in updates], [u.num_samples for u in updates])
        self.model.load_state_dict(new)

    def global_model(self) -> torch.nn.Module:
        return self.model
