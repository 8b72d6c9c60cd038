"""The two cost accountings on hand-made atoms and device states, worked out by hand: each priced
through the one interface (`CostModel.price`, one client), the walk's row equal to its scalar twin
(tests/reference.py `walk_cost`)."""

from __future__ import annotations

import itertools
import math
from typing import cast

import numpy as np
import pytest
from reference import walk_cost

from edgefl.config import CostConfig
from edgefl.devices.classes import perf_flops
from edgefl.devices.pool import DevicePool, DeviceState, States
from edgefl.devices.profile import DeviceProfile
from edgefl.sim.cost import ClientCost, CostModel, PaperCost, RoundPlan, WalkCost, make_cost_model
from edgefl.sim.records import AtomProfile
from edgefl.sim.swap import min_budget
from edgefl.sim.workload import Workload

# Paper atoms: P = 10 + 20 = 30 params, weighted inputs 2 + 4 = 6 per sample, MACs 100 + 50.
A0 = AtomProfile("a0", macs=100.0, params=10, in_elems=2, out_elems=4, saved_bytes=8.0,
                 weighted_in_elems=2)
A1 = AtomProfile("a1", macs=50.0, params=20, in_elems=4, out_elems=2, saved_bytes=16.0,
                 weighted_in_elems=4)
# Walk atoms: a weightless first atom (like the input normalisation), then A0 and A1.
NORM = AtomProfile("norm", macs=5.0, params=0, in_elems=2, out_elems=2, saved_bytes=0.0,
                   weighted_in_elems=0)

BATCH, ITERS = 2, 3


def workload(atoms=(A0, A1), attack_steps=0, slots=1, down=0.0, up=0.0, **more) -> Workload:
    return Workload(atoms=tuple(atoms), batch=BATCH, iterations=ITERS, attack_steps=attack_steps,
                    slots=slots, download_bytes=down, upload_bytes=up, **more)


def device(read_mbps=1e-4, write_mbps=5e-5, latency_ms=10.0) -> DeviceProfile:
    # 1e-4 MB/s = 100 B/s read, 50 B/s write: small round numbers for tiny atoms
    return DeviceProfile(name="toy", description="", source="hand", memory_mb=1.0,
                         compute_gflops=1.0, storage_read_mb_s=read_mbps,
                         storage_write_mb_s=write_mbps, storage_latency_ms=latency_ms)


def state(memory: float, flops: float = 1000.0, dev: DeviceProfile | None = None,
          up: float = 50.0, down: float = 200.0, latency: float = 0.5) -> DeviceState:
    return DeviceState(device=dev or device(), app="idle", memory_bytes=memory, flops=flops,
                       network="wifi", up_bps=up, down_bps=down, latency_s=latency)


class OnePool:
    """What `CostModel.price` asks of a pool, for one hand-made client's state."""

    def __init__(self, st: DeviceState) -> None:
        self.st, self.kinds, self.kind_flops = st, [st.device], np.array([perf_flops(st.device)])
        self.kind_read_bps = np.array([st.device.storage_read_mb_s * 1e6])
        self.kind_write_bps = np.array([st.device.storage_write_mb_s * 1e6])
        self.kind_latency_ms = np.array([st.device.storage_latency_ms])

    def state_at(self, states: States, i: int) -> DeviceState:
        return self.st


class Planned:
    def __init__(self, w: Workload) -> None:
        self.workload = w


def price(model: CostModel, w: Workload, st: DeviceState) -> ClientCost:
    """`w` on one client in state `st`, priced by `model.price` (its training set: w.samples)."""
    one = np.zeros(1, dtype=np.int64)
    states = States(one, one, one, np.array([st.memory_bytes]), np.array([st.flops]), one,
                    np.array([st.up_bps]), np.array([st.down_bps]), np.array([st.latency_s]))
    c = model.price(RoundPlan([Planned(w)], one), states, cast(DevicePool, OnePool(st)), lambda k: w.samples
                    ).cost(0)
    if model.walks:  # the walk accounting: its scalar twin gives the same bits
        assert c == walk_cost(cast(WalkCost, model), w, st)
    return c


PAPER = PaperCost(CostConfig(accounting="paper"))


def test_make_cost_model_picks_the_accounting():
    assert isinstance(make_cost_model(CostConfig(accounting="paper")), PaperCost)
    assert isinstance(make_cost_model(CostConfig()), WalkCost)


# ---------------------------------------------------------------- paper accounting


@pytest.mark.parametrize("steps", [0, 1, 3, 10])
def test_paper_compute_grows_as_one_plus_t(steps):
    c = price(PAPER, workload(attack_steps=steps), state(memory=1e9, flops=1000.0))
    # iterations x 2 x MACs x batch x (1 + T) / perf
    assert c.compute_s == pytest.approx(3 * 2 * 150 * 2 * (1 + steps) / 1000.0)


def test_paper_fits_reads_only_the_batch_and_the_params_once():
    # MemReq = 4 x (3 x 30 + 2 x 6) = 408 B <= 1000 B
    c = price(PAPER, workload(attack_steps=10, down=1e6, up=1e6), state(memory=1000.0))
    assert c.mem_req_bytes == 408
    assert not c.swapped
    # 3 x (batch 4 x 2 x 2 = 16 B / 100 B/s + 0.17 s) + 4 x 30 B / 100 B/s
    assert c.data_access_s == pytest.approx(3 * (16 / 100 + 0.17) + 120 / 100)
    assert c.data_access_s == pytest.approx(2.19)
    assert (c.download_s, c.upload_s) == (0.0, 0.0)  # paper: no communication


def test_paper_fits_exactly_at_mem_req():
    c = price(PAPER, workload(), state(memory=408.0))
    assert not c.swapped
    assert c.data_access_s == pytest.approx(3 * (16 / 100 + 0.17) + 120 / 100)


def test_paper_swap_clean():
    # F = 2 x 6 = 12, P = 30, s = 3; mem 100 B < MemReq 408 B
    c = price(PAPER, workload(attack_steps=0), state(memory=100.0))
    assert c.swapped
    moved = 4 * (2 * 12 + 4 * 30 + 2 * 1 * 30)  # 816 B
    accesses = math.ceil(4 * (12 + 30) / 100) + math.ceil(408 / 100)  # 2 + 5
    per_batch = moved / 100 + 0.17 * accesses  # 8.16 + 1.19 = 9.35
    assert c.data_access_s == pytest.approx(3 * per_batch)
    assert c.data_access_s == pytest.approx(3 * 9.35)


def test_paper_swap_with_pgd_steps_that_do_not_fit():
    c = price(PAPER, workload(attack_steps=2), state(memory=100.0))
    per_batch = 816 / 100 + 0.17 * (2 + 5)
    # a PGD step's need 4 x (12 + 30) = 168 B > 100 B: 4 x (2F + 4P) = 576 B, 2 x ceil(168/100)
    per_step = 576 / 100 + 0.17 * 2 * 2  # 5.76 + 0.68 = 6.44
    assert c.data_access_s == pytest.approx(3 * (per_batch + 2 * per_step))
    assert c.data_access_s == pytest.approx(3 * (9.35 + 2 * 6.44))


def test_paper_swap_with_pgd_steps_that_fit():
    # mem 200 B: MemReq 408 B does not fit, a PGD step's 168 B does (no per-step swap)
    c = price(PAPER, workload(attack_steps=5), state(memory=200.0))
    # 816 B over 100 B/s, accesses ceil(168 / 200) + ceil(408 / 200) = 1 + 3
    per_batch = 816 / 100 + 0.17 * (math.ceil(168 / 200) + math.ceil(408 / 200))  # 8.16 + 0.68
    assert c.data_access_s == pytest.approx(3 * per_batch)
    assert c.data_access_s == pytest.approx(3 * 8.84)


def test_paper_access_seconds_come_from_the_config():
    cost = PaperCost(CostConfig(accounting="paper", paper_access_s=1.0))
    c = price(cost, workload(), state(memory=100.0))
    assert c.data_access_s == pytest.approx(3 * (816 / 100 + 1.0 * 7))


def test_paper_swap_time_never_decreases_with_pgd_steps():
    times = [price(PAPER, workload(attack_steps=t), state(memory=100.0)).data_access_s
             for t in range(5)]
    assert all(a < b for a, b in itertools.pairwise(times))


@pytest.mark.parametrize(("samples", "iters", "sizes"), [
    (0, 3, [2, 2, 2]),  # unknown: every batch full
    (5, 3, [2, 2, 1]),  # an epoch of 2 + 2 + 1
    (5, 5, [2, 2, 1, 2, 2]),  # the next epoch starts again with full batches
    (4, 3, [2, 2, 2]),  # no remainder, no short batch
    (1, 2, [1, 1]),  # fewer samples than a batch: one short batch an epoch
])
def test_batches_walk_epochs_with_a_short_last_batch(samples, iters, sizes):
    w = Workload(atoms=(A0, A1), batch=2, iterations=iters, attack_steps=0, slots=1,
                 download_bytes=0.0, upload_bytes=0.0, samples=samples)
    assert w.batch_sizes() == sizes


def test_paper_short_last_batch_that_fits():
    # 5 samples, batch 2: batches 2, 2, 1; the 1-sample batch reads 4 x 1 x 2 = 8 B and costs half
    c = price(PAPER, workload(attack_steps=1, samples=5), state(memory=1000.0, flops=1000.0))
    assert c.compute_s == pytest.approx(2 * 150 * (2 + 2 + 1) * (1 + 1) / 1000.0)  # 3.0
    assert c.data_access_s == pytest.approx(2 * (16 / 100 + 0.17) + (8 / 100 + 0.17) + 120 / 100)
    assert c.mem_req_bytes == 408  # MemReq is the full batch's


def test_paper_short_last_batch_that_swaps():
    # the 1-sample batch: F = 6, MemReq 4 x (90 + 6) = 384 B, forward need 4 x 36 = 144 B in 100 B;
    # moved 4 x (12 + 120 + 60) = 768 B; accesses ceil(1.44) + ceil(3.84) = 2 + 4
    c = price(PAPER, workload(samples=5), state(memory=100.0))
    assert c.data_access_s == pytest.approx(2 * 9.35 + (7.68 + 0.17 * 6))
    assert c.data_access_s == pytest.approx(27.4)


def test_paper_trades_charges_the_second_pair_and_the_forward():
    # TRADES: 2 (forward, training backward) pairs, 1 forward-only pass, PGD-2, in 100 B.
    # compute per batch: (2 x 300 MACs x (2 pairs + 2 steps) + 300 x 1 forward) / 1000 = 2.7 s
    c = price(PAPER, workload(attack_steps=2, train_pairs=2, extra_forwards=1), state(memory=100.0))
    assert c.compute_s == pytest.approx(3 * 2.7)
    # access per batch: the training pair 9.35 s; the second pair and each PGD step 6.44 s
    # (4 x (2F + 4P) = 576 B, 2 x ceil(168 / 100) accesses); the forward moves the parameters in
    # and out, 4 x 2 x 30 = 240 B, with ceil(168 / 100) = 2 accesses: 2.4 + 0.34
    assert c.data_access_s == pytest.approx(3 * (9.35 + 6.44 + 2 * 6.44 + 2.74))
    assert c.data_access_s == pytest.approx(3 * 31.41)


def test_paper_trades_pair_when_the_batch_fits_costs_compute_only():
    c = price(PAPER, workload(train_pairs=2, extra_forwards=1), state(memory=1000.0, flops=1000.0))
    assert c.compute_s == pytest.approx(3 * (2 * 300 * 2 + 300) / 1000.0)
    assert c.data_access_s == pytest.approx(3 * (16 / 100 + 0.17) + 120 / 100)


def test_paper_fisher_pass_is_charged_as_clean_batches():
    # FedCurv: a forward and a training backward over 5 samples (train_pass_flops each), batches 2, 2, 1
    # train_pass_flops: a forward 2 x 150 = 300, a backward 300 - 200 (no input gradient into the
    # first atom) + 300 (weight gradients): 700 a sample
    per_sample = 2 * 2 * (100 + 50) - 2 * 100 + 2 * (100 + 50)
    w = workload(extra_flops=5 * per_sample)
    c = price(PAPER, w, state(memory=1000.0, flops=1000.0))
    assert c.compute_s == pytest.approx((3 * 2 * 300 + 2 * (300 + 300 + 150)) / 1000.0)
    assert c.data_access_s == pytest.approx(3 * (16 / 100 + 0.17) + 2 * (16 / 100 + 0.17)
                                            + (8 / 100 + 0.17) + 120 / 100)


def test_paper_leaves_the_auxiliary_head_out_and_adds_the_module_output():
    # FedProphet's module A0 with its head: the release charges A0's MACs and parameters and adds
    # A0's output (4 a sample) to its inputs (2): F = 2 x 6 = 12, P = 10
    head = AtomProfile("head", macs=7.0, params=5, in_elems=4, out_elems=3, saved_bytes=0.0,
                       weighted_in_elems=4)
    c = price(PAPER, workload(atoms=(A0, head)), state(memory=1e9, flops=1000.0))
    assert c.mem_req_bytes == 4 * (3 * 10 + 12)
    assert c.compute_s == pytest.approx(3 * 2 * 100 * 2 / 1000.0)


# ---------------------------------------------------------------- walk accounting

WALK = WalkCost(CostConfig())


@pytest.mark.parametrize("steps", [0, 1, 10])
def test_walk_compute_counts_every_pass(steps):
    w = workload(atoms=(NORM, A0, A1), attack_steps=steps)
    fwd = 2 * (5 + 100 + 50)  # 310 FLOPs a sample
    with_params = 2 * (100 + 50)  # 300
    train_bwd = fwd - 2 * 5 + with_params  # no input gradient into the first atom: 600
    per_iteration = BATCH * (steps * 2 * fwd + fwd + train_bwd)  # 2 x (620 T + 910)
    assert w.flops_per_iteration() == per_iteration
    # The walk's compute model (edgefl.sim.compute) on a device of no class: peak FLOP/s, no
    # bandwidth bound, no overhead, so only FLOPs count, over the app's share (1000 of 1e9 FLOP/s).
    # Atoms without layers are one layer each. A PGD step: forward 310 + input gradients of every
    # layer 310. The training backward takes no input gradient where no layer below has weights
    # (norm, a0): weight gradients of a0 and a1 (200 + 100) and a1's input gradient (100): 400,
    # so a training pair is 310 + 400 = 710 (the FLOPs estimate above also charges a0's input
    # gradient, which PyTorch never computes).
    c = price(WALK, w, state(memory=1e9, flops=1000.0))
    assert c.compute_s == pytest.approx(3 * 2 * (620 * steps + 710) / 1000.0)


def test_walk_fits_reads_params_once_and_a_batch_per_iteration():
    w = workload(atoms=(NORM, A0, A1), attack_steps=2, down=400.0, up=100.0)
    c = price(WALK, w, state(memory=1e9))
    assert not c.swapped
    params = 4 * (10 + 20)  # 120 B on the first iteration
    batches = ITERS * 4 * BATCH * 2  # 3 x 16 B
    ops = ITERS + 2  # a read per batch, one per atom with parameters
    assert c.read_bytes == params + batches == 168
    assert c.write_bytes == 0
    assert c.data_access_s == pytest.approx((params + batches) / 100 + ops * 10 / 1e3)
    # 400 B / 200 B/s + 0.5 s down, 100 B / 50 B/s + 0.5 s up
    assert c.download_s == pytest.approx(400 / 200 + 0.5)
    assert c.upload_s == pytest.approx(100 / 50 + 0.5)


def test_walk_mem_req_is_the_default_estimator():
    w = workload(atoms=(NORM, A0, A1), attack_steps=1, slots=1)
    state_b = 3 * 4 * 30  # params + grads + momentum
    saved = BATCH * (0 + 8 + 16)
    workspace = 4 * BATCH * (2 * 2 + 6)  # clean + adversarial batch, largest in+out (a0: 2 + 4)
    assert price(WALK, w, state(memory=1e9)).mem_req_bytes == state_b + saved + workspace


def test_walk_communication_can_be_left_out():
    w = workload(atoms=(NORM, A0, A1), down=400.0, up=100.0)
    c = price(WalkCost(CostConfig(communication=False)), w, state(memory=1e9))
    assert (c.download_s, c.upload_s) == (0.0, 0.0)
    assert c.compute_s > 0


def test_walk_swaps_below_mem_req():
    w = workload(atoms=(NORM, A0, A1), attack_steps=1, slots=1)
    fits = price(WALK, w, state(memory=1e9))
    budget, _ = min_budget(w)
    assert budget < fits.mem_req_bytes
    tight = price(WALK, w, state(memory=budget))
    assert tight.swapped
    assert tight.write_bytes > 0
    assert tight.read_bytes > fits.read_bytes
    assert tight.data_access_s > fits.data_access_s
    assert tight.compute_s == fits.compute_s  # swapping costs time, not FLOPs


def test_walk_write_bandwidth_and_latency_enter_data_access():
    w = workload(atoms=(NORM, A0, A1), attack_steps=1, slots=1)
    budget, _ = min_budget(w)
    slow = price(WALK, w, state(memory=budget, dev=device(write_mbps=1e-5, latency_ms=0.0)))
    fast = price(WALK, w, state(memory=budget, dev=device(write_mbps=1e-4, latency_ms=0.0)))
    assert slow.read_bytes == fast.read_bytes and slow.write_bytes == fast.write_bytes
    # only the write bandwidth differs: 10 B/s against 100 B/s
    assert slow.data_access_s - fast.data_access_s == pytest.approx(
        slow.write_bytes / 10 - slow.write_bytes / 100)


def test_paper_round_without_batches_costs_nothing():
    # FedDynAT's E_t can reach 0 local iterations: no batch, no parameter read (release line 378)
    c = price(PAPER, Workload(atoms=(A0, A1), batch=BATCH, iterations=0, attack_steps=10, slots=1,
                            download_bytes=0.0, upload_bytes=0.0, samples=5), state(memory=1000.0))
    assert (c.compute_s, c.data_access_s) == (0.0, 0.0)
