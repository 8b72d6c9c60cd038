"""The swap walk on two-atom workloads, stepped through by hand."""

from __future__ import annotations

import itertools

import pytest

from edgefl.devices.catalog import load_catalog
from edgefl.errors import EdgeflError
from edgefl.sim.paging import Plan, whole_atoms
from edgefl.sim.records import AtomProfile
from edgefl.sim.swap import ImpossibleBudget, Step, SwapWalk, Traffic, micro_batch_steps, min_budget
from edgefl.sim.workload import Workload

# Two equal atoms, batch 1: params 10 (40 B), saved activations 8 B, 1 element in and out, so a
# step's workspace (input + output in flight) is 4 x (1 + 1) = 8 B and the pinned batch 4 B.
X0 = AtomProfile("x0", macs=10.0, params=10, in_elems=1, out_elems=1, saved_bytes=8.0,
                 weighted_in_elems=1)
X1 = AtomProfile("x1", macs=10.0, params=10, in_elems=1, out_elems=1, saved_bytes=8.0,
                 weighted_in_elems=1)
# Two unequal atoms for min_budget: b is the bigger one.
A = AtomProfile("a", macs=10.0, params=10, in_elems=1, out_elems=1, saved_bytes=8.0,
                weighted_in_elems=1)
B = AtomProfile("b", macs=20.0, params=20, in_elems=1, out_elems=2, saved_bytes=4.0,
                weighted_in_elems=1)


def workload(atoms=(X0, X1), iterations=1, attack_steps=0, slots=0, batch=1) -> Workload:
    return Workload(atoms=tuple(atoms), batch=batch, iterations=iterations,
                    attack_steps=attack_steps, slots=slots, download_bytes=0.0, upload_bytes=0.0)


class NoShortcut(SwapWalk):
    """Simulates every iteration: the resident state never compares equal to the previous one."""

    def _signature(self):  # type: ignore[override]
        return object()


def total(t: Traffic) -> float:
    return t.read_bytes + t.write_bytes


# One training step needs param 40 + saved activations 8 + gradient 40 = 88 B (slots 0), plus the
# pinned batch 4 B and the workspace 8 B: a budget of 100 B holds exactly one atom's step.
ONE_STEP = 4 + 8 + 40 + 8 + 40


def iteration_steps(w: Workload, plan: Plan | None = None) -> list[Step]:
    """One iteration's steps in order: the accumulating micro-batches, then the last."""
    plan = plan or whole_atoms(w)
    accumulating, last = micro_batch_steps(w, plan)
    return accumulating * (plan.micro - 1) + last


def test_iteration_steps_order():
    steps = iteration_steps(workload(attack_steps=1))
    # forward 0, 1; attack backward 1, 0; training forward 0, 1; training backward 1, 0
    assert [s.part for s in steps] == [0, 1, 1, 0, 0, 1, 1, 0]
    assert steps[-1].needs == (("param", 0), ("act", 0), ("opt", 0), ("grad", 0))
    assert steps[-1].dirties == (("param", 0), ("opt", 0))


@pytest.mark.parametrize("iterations", [1, 2, 5])
def test_infinite_budget_reads_params_once_and_a_batch_per_iteration(iterations):
    w = workload(iterations=iterations, attack_steps=3, slots=2)
    walk = SwapWalk(w, float("inf"))
    t = walk.run()
    assert t.read_bytes == 4 * (10 + 10) + iterations * 4 * 1
    assert t.read_ops == iterations + 2
    assert (t.write_bytes, t.write_ops) == (0, 0)
    assert walk.evictions == 0


def test_one_step_budget_one_clean_iteration_by_hand():
    """Budget 100 B, LRU, slots 0 (the optimizer state takes no room), no attack.

    batch read                                 read 4
    fwd x0:  fetch p0 (40); act0 new           read 40               resident p0, a0*
    fwd x1:  room for 48 of 88: evict p0 (clean); fetch p1 (40)      resident a0*, p1, a1*
    bwd x1:  needs 88 of 88: evict a0 (dirty, write 8); grad new; p1 dirtied; a1, g1 freed
    bwd x0:  evict p1 (dirty, write 40); fetch p0 40 + a0 8; p0 dirtied; a0, g0 freed
    """
    walk = SwapWalk(workload(), ONE_STEP)
    t = walk.run()
    assert t.read_bytes == 4 + 40 + 40 + 0 + 48
    assert t.write_bytes == 8 + 40
    assert t.read_ops == 4  # batch, fwd x0, fwd x1, bwd x0
    assert t.write_ops == 2  # bwd x1, bwd x0
    assert walk.evictions == 3


def test_one_step_budget_steady_iterations_by_hand():
    """From the second iteration on, p0 is resident and dirty at the start:

    batch read                                               read 4
    fwd x0:  p0 resident; act0 new
    fwd x1:  evict p0 (dirty, write 40); fetch p1            read 40, write 40
    bwd x1:  evict a0 (dirty, write 8)                       write 8
    bwd x0:  evict p1 (dirty, write 40); fetch p0 + a0       read 48, write 40
    """
    first = Traffic(4 + 40 + 40 + 48, 8 + 40, 4, 2)
    steady = Traffic(4 + 40 + 48, 40 + 8 + 40, 3, 3)
    for n in range(1, 7):
        t = SwapWalk(workload(iterations=n), ONE_STEP).run()
        assert t == first + steady.times(n - 1)


@pytest.mark.parametrize(("attack_steps", "slots"), [(0, 0), (2, 1), (3, 2)])
def test_steady_state_shortcut_matches_full_simulation(attack_steps, slots):
    atoms = (A, B)
    probe = workload(atoms, attack_steps=attack_steps, slots=slots)
    budget = min_budget(probe)[0] + 20
    for n in range(1, 7):
        w = workload(atoms, iterations=n, attack_steps=attack_steps, slots=slots)
        assert SwapWalk(w, budget).run() == NoShortcut(w, budget).run()


@pytest.mark.parametrize(("attack_steps", "slots"), [(0, 0), (2, 1)])
def test_steady_state_shortcut_over_micro_batches_matches_full_simulation(attack_steps, slots):
    """Batch 64 below the budget the full batch needs: up to 64 micro-batches an iteration, counted
    without walking once they repeat (batch 8192 took 30 s a dry round before), as if walked."""
    from edgefl.sim.paging import candidates

    for n in (1, 3):
        w = workload((A, B), iterations=n, attack_steps=attack_steps, slots=slots, batch=64)
        budget = min_budget(w)[0] + 20
        plans = candidates(w, budget)
        assert max(p.micro for p in plans) >= 32
        for plan in plans:
            fast, slow = SwapWalk(w, budget, plan), NoShortcut(w, budget, plan)
            assert fast.run() == slow.run() and fast.evictions <= slow.evictions
            if plan.micro >= 32:  # one iteration: the shortcut is the micro-batches'
                assert len(fast.trail) < len(slow.trail) // 4


def test_traffic_is_affine_in_iterations():
    w = [workload((A, B), iterations=n, attack_steps=2, slots=1) for n in range(3, 7)]
    budget = min_budget(w[0])[0]
    t = [total(SwapWalk(x, budget).run()) for x in w]
    steps = {b - a for a, b in itertools.pairwise(t)}
    assert len(steps) == 1
    assert steps.pop() > 0


@pytest.mark.parametrize(("atoms", "slots", "grows"), [
    # budget 8 + 8 + 88 = 104 B: x0's and x1's params and activations (96 B) do not fit in the
    # 88 B of room, so every attack pass swaps
    ((X0, X1), 0, True),
    # budget 264 B: a's and b's params and activations fit outside the training backward, so
    # attack passes cost nothing extra
    ((A, B), 1, False),
])
def test_more_pgd_steps_never_reduce_traffic(atoms, slots, grows):
    budget = min_budget(workload(atoms, attack_steps=1, slots=slots))[0]
    t = [total(SwapWalk(workload(atoms, iterations=3, attack_steps=s, slots=slots), budget).run())
         for s in range(0, 6)]
    assert all(a <= b for a, b in itertools.pairwise(t))
    assert (t[-1] > t[1]) is grows


def test_smaller_budgets_never_reduce_traffic():
    w = workload((A, B, X0, X1), iterations=3, attack_steps=2, slots=1)
    low = min_budget(w)[0]
    budgets = [low + 4 * k for k in range(0, 80)]  # up to well past everything resident
    t = [total(SwapWalk(w, b).run()) for b in budgets]
    assert all(a >= b for a, b in itertools.pairwise(t))
    assert t[0] > t[-1]
    assert t[-1] == 4 * (10 + 20 + 10 + 10) + 3 * 4  # params once, a 4 B batch per iteration


def test_min_budget_is_the_largest_step():
    # T = 1: pinned clean + adversarial batch 2 x 4 B = 8 B.
    # training backward on b: 8 + workspace 4 x (1 + 2) + param 80 + act 4 + opt 80 + grad 80
    # training backward on a: 8 + 8 + 40 + 8 + 40 + 40 = 144; forwards are smaller.
    w = workload((A, B), attack_steps=1, slots=1)
    assert min_budget(w) == (8 + 12 + 80 + 4 + 80 + 80, "b")
    # clean training pins only the clean batch: 4 B less
    assert min_budget(workload((A, B), slots=1)) == (4 + 12 + 80 + 4 + 80 + 80, "b")
    # with slots 0 and a small b, the step on a is the largest
    small_b = AtomProfile("b", macs=1.0, params=1, in_elems=1, out_elems=1, saved_bytes=0.0,
                          weighted_in_elems=1)
    assert min_budget(workload((A, small_b))) == (4 + 8 + 40 + 8 + 40, "a")


def test_min_budget_runs_and_below_it_raises():
    w = workload((A, B), iterations=2, attack_steps=1, slots=1)
    need, atom = min_budget(w)
    SwapWalk(w, need).run()  # exactly enough: no error
    with pytest.raises(ImpossibleBudget) as info:
        SwapWalk(w, need - 1).run()
    assert isinstance(info.value, EdgeflError)
    assert info.value.key == atom == "b"
    assert "b" in str(info.value)


@pytest.mark.parametrize(("attack_steps", "slots"), [(0, 0), (2, 1), (3, 2)])
def test_footprint_is_where_evictions_stop_and_the_cached_walk_matches(attack_steps, slots):
    """X0, X1 by hand: params 40 + 40 B, optimizer slots x 80, grads 80, saved activations 8 + 8,
    pinned batch 4 B (x2 under attack), the largest workspace 8 B."""
    from reference import walk_traffic

    from edgefl.sim.swap import footprint

    device = load_catalog().devices["raspberry_pi_4"]
    w = workload(iterations=4, attack_steps=attack_steps, slots=slots)
    expected = 4 * (2 if attack_steps else 1) + 8 + 80 * (2 + slots) + 16
    assert footprint(w) == pytest.approx(expected)
    for budget in (footprint(w), footprint(w) + 1, 1e12):
        walk = SwapWalk(w, budget)
        traffic = walk.run()
        assert walk.evictions == 0
        assert walk_traffic(w, budget, device) == (traffic, 0, 1)
    tight = footprint(w) - 1
    walk = SwapWalk(w, tight)
    assert walk_traffic(w, tight, device) == (walk.run(), walk.evictions, 1)
