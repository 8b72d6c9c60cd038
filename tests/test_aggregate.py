"""Aggregation math on hand-made state dicts, and FedBN through the jFAT method."""

from __future__ import annotations

import torch
from support import QUICKSTART
from torch import nn

from edgefl.experiment import prepare
from edgefl.methods import base as method_template
from edgefl.methods.aggregate import keep_local, state_bytes
from edgefl.scenario import load_scenario
from edgefl.server.base import bn_keys
from edgefl.server.mean import fedavg


def test_fedavg_weighted_mean():
    a = {"w": torch.tensor([1.0, 2.0])}
    b = {"w": torch.tensor([5.0, 6.0])}
    out = fedavg([a, b], [1, 3])
    # (1 x [1, 2] + 3 x [5, 6]) / 4 = [16, 20] / 4
    assert torch.equal(out["w"], torch.tensor([4.0, 5.0]))
    assert out["w"].dtype == torch.float32


def test_fedavg_weights_need_not_sum_to_one():
    a = {"w": torch.tensor([0.0, 8.0])}
    b = {"w": torch.tensor([4.0, 0.0])}
    assert torch.equal(fedavg([a, b], [10.0, 30.0])["w"], torch.tensor([3.0, 2.0]))
    assert torch.equal(fedavg([a, b], [0.25, 0.75])["w"], torch.tensor([3.0, 2.0]))


def test_fedavg_rounds_integer_buffers_and_keeps_dtype():
    a = {"num_batches_tracked": torch.tensor(10), "h": torch.tensor([1.0], dtype=torch.float16)}
    b = {"num_batches_tracked": torch.tensor(11), "h": torch.tensor([3.0], dtype=torch.float16)}
    out = fedavg([a, b], [1, 3])
    # (10 + 3 x 11) / 4 = 10.75: rounded to 11, not truncated to 10
    assert out["num_batches_tracked"].item() == 11
    assert out["num_batches_tracked"].dtype == torch.int64
    assert out["h"].dtype == torch.float16
    assert out["h"].item() == 2.5  # (1 + 9) / 4


def test_fedavg_does_not_modify_inputs():
    a = {"w": torch.tensor([1.0, 2.0])}
    b = {"w": torch.tensor([5.0, 6.0])}
    fedavg([a, b], [1, 1])
    assert torch.equal(a["w"], torch.tensor([1.0, 2.0]))
    assert torch.equal(b["w"], torch.tensor([5.0, 6.0]))


def test_keep_local_replaces_exactly_the_given_keys():
    glob = {k: torch.full((2,), float(i)) for i, k in enumerate("abc")}
    local = {k: torch.full((2,), 10.0 + i) for i, k in enumerate("abc")}
    merged = keep_local(glob, local, ["b"])
    assert set(merged) == {"a", "b", "c"}
    assert torch.equal(merged["a"], torch.full((2,), 0.0))
    assert torch.equal(merged["b"], torch.full((2,), 11.0))
    assert torch.equal(merged["c"], torch.full((2,), 2.0))
    assert torch.equal(glob["b"], torch.full((2,), 1.0))  # the global state is untouched
    assert keep_local(glob, local, []) == glob


def test_bn_keys_lists_batchnorm_state_only():
    model = nn.Sequential(
        nn.Conv2d(1, 2, 3),
        nn.Sequential(nn.BatchNorm2d(2), nn.ReLU()),
        nn.Flatten(),
        nn.Linear(2, 3),
    )
    stats = ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    assert bn_keys(model) == {f"1.0.{k}" for k in stats}
    assert bn_keys(nn.Linear(2, 2)) == set()
    assert bn_keys(nn.BatchNorm1d(3)) == set(stats)


def test_state_bytes_counts_numel_times_element_size():
    state = {"a": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.int64),
             "c": torch.zeros(2, dtype=torch.float16)}
    assert state_bytes(state) == 12 * 4 + 5 * 8 + 2 * 2
    assert state_bytes(state, ["a"]) == 48
    assert state_bytes(state, []) == 0


# ------------------------------------------------------------------ FedBN through jFAT


def experiment(fedbn: bool):
    scenario = load_scenario(QUICKSTART, [
        "rounds=2", "training.local_iters=2", "attack.steps=1", f"training.fedbn={str(fedbn).lower()}",
        "device=cpu"])
    return prepare(scenario, str(QUICKSTART))


RM = "conv1.1.running_mean"
WEIGHT = "conv1.0.weight"


def start_of_round_1(exp, monkeypatch):
    """Clients 0 and 1 train in round 0; client 0 trains again in round 1.

    Returns (round-0 updates, the global state after round 0, client 0's state at the start of
    its round-1 training)."""
    method = exp.method
    updates = []
    for k in (0, 1):
        w = method.plan(0, k, exp.pool.state(k, 0))
        updates.append(method.train(0, k, w))
    method.aggregate(0, updates)
    glob = {k: v.clone() for k, v in method.model.state_dict().items()}

    seen = {}
    real = method_template.train_local

    def spy(model, *args, **kwargs):
        seen.update({k: v.detach().clone() for k, v in model.state_dict().items()})
        return real(model, *args, **kwargs)

    monkeypatch.setattr(method_template, "train_local", spy)
    method.train(1, 0, method.plan(1, 0, exp.pool.state(0, 1)))
    return updates, glob, seen


def test_fedbn_client_resumes_from_its_own_bn(monkeypatch):
    exp = experiment(fedbn=True)
    (u0, u1), glob, start = start_of_round_1(exp, monkeypatch)
    n0, n1 = u0.num_samples, u1.num_samples
    average = (n0 * u0.state[RM] + n1 * u1.state[RM]) / (n0 + n1)
    assert torch.allclose(glob[RM], average)
    assert not torch.allclose(u0.state[RM], average)  # the two clients' statistics differ
    # its own BN from round 0, the global (averaged) everything else
    for key in bn_keys(exp.method.model):
        assert torch.equal(start[key], u0.state[key]), key
    assert torch.equal(start[WEIGHT], glob[WEIGHT])
    assert not torch.equal(start[WEIGHT], u0.state[WEIGHT])


def test_without_fedbn_client_starts_from_the_global_average(monkeypatch):
    exp = experiment(fedbn=False)
    (u0, u1), glob, start = start_of_round_1(exp, monkeypatch)
    n0, n1 = u0.num_samples, u1.num_samples
    average = (n0 * u0.state[RM] + n1 * u1.state[RM]) / (n0 + n1)
    assert torch.allclose(start[RM], average)
    assert not torch.allclose(start[RM], u0.state[RM])
    for key, value in glob.items():
        assert torch.equal(start[key], value), key


# digits_cnn on 1x8x8 digits, 10 classes (fp32 = 4 B, the BN counters int64 = 8 B):
#   norm mean, std: 1 + 1;  conv1 1->16 3x3: 144;  conv2 16->32: 4608;  conv3 32->64: 18432;
#   linear 64 x 2 x 2 -> 10: 2560 + 10;  BN 16, 32, 64 channels x 4 tensors + 3 counters
NON_BN = 4 * (2 + 144 + 4608 + 18432 + 2560 + 10)
BN = 4 * 4 * (16 + 32 + 64) + 3 * 8


def test_download_bytes_exclude_bn_only_once_the_client_holds_its_own(monkeypatch):
    exp = experiment(fedbn=True)
    first = exp.method.plan(0, 0, exp.pool.state(0, 0)).workload
    assert first.download_bytes == NON_BN + BN  # a new client gets the server's BN once
    assert first.upload_bytes == NON_BN + BN
    start_of_round_1(exp, monkeypatch)  # client 0 has trained and keeps its BN
    assert exp.method.plan(1, 0, exp.pool.state(0, 1)).workload.download_bytes == NON_BN


def test_download_bytes_include_bn_without_fedbn(monkeypatch):
    exp = experiment(fedbn=False)
    start_of_round_1(exp, monkeypatch)
    assert exp.method.plan(1, 0, exp.pool.state(0, 1)).workload.download_bytes == NON_BN + BN
