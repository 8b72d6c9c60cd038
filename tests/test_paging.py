"""The swap walk at a finer grain: paging an atom layer by layer, micro-batching, and refusal,
each stepped through by hand."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from edgefl.cli import main
from edgefl.devices.profile import Fitted
from edgefl.errors import EdgeflError
from edgefl.experiment import prepare
from edgefl.scenario import load_scenario
from edgefl.sim.cost import plan_seconds
from edgefl.sim.paging import candidates, peak, whole
from edgefl.sim.records import AtomProfile, LayerProfile
from edgefl.sim.swap import (
    ImpossibleBudget,
    SwapWalk,
    Traffic,
    cheapest,
    min_budget,
    traced_walks,
)
from edgefl.sim.workload import Workload


def layer(name: str, params: int, saved: float, out: int = 1) -> LayerProfile:
    return LayerProfile(name, "conv", macs=1.0, params=params, in_elems=1, out_elems=out,
                        saved_bytes=saved)


def atom(name: str, *layers: LayerProfile) -> AtomProfile:
    """An atom made of `layers` in a chain: its sizes are theirs summed, in and out at the ends."""
    return AtomProfile(name, macs=len(layers), params=sum(x.params for x in layers),
                       in_elems=layers[0].in_elems, out_elems=layers[-1].out_elems,
                       saved_bytes=sum(x.saved_bytes for x in layers), weighted_in_elems=1,
                       layers=layers)


# Two layers of 10 parameters (40 B), 8 B saved, one element in and out: the atom holds 80 B of
# weights and 16 B of activations.
PAIR = atom("a", layer("a.l0", 10, 8.0), layer("a.l1", 10, 8.0))
# Two plain atoms of the same size, with no layers to split into.
X0 = AtomProfile("x0", macs=10.0, params=10, in_elems=1, out_elems=1, saved_bytes=8.0,
                 weighted_in_elems=1)
X1 = AtomProfile("x1", macs=10.0, params=10, in_elems=1, out_elems=1, saved_bytes=8.0,
                 weighted_in_elems=1)


def moved(micro: int, t: Traffic) -> float:
    """A device whose storage time is bytes moved, whatever the plan's compute."""
    return t.read_bytes + t.write_bytes


def walk(w: Workload, budget: float, seconds) -> tuple:
    """(plan, traffic, evictions) of the plan that fits `budget` and costs the fewest `seconds`, as
    edgefl.sim.cost takes it: `cheapest` of `traced_walks`."""
    walks, trail = traced_walks(w, budget)
    i = cheapest(walks, seconds)
    return trail[i][0], walks[i][1], walks[i][2]


def workload(atoms, batch=1, iterations=1, attack_steps=0, slots=0) -> Workload:
    return Workload(atoms=tuple(atoms), batch=batch, iterations=iterations,
                    attack_steps=attack_steps, slots=slots, download_bytes=0.0, upload_bytes=0.0)


def test_step_sizes_whole_and_by_layers_by_hand():
    """Batch 1, no attack (pinned: the 4 B batch), slots 0. Training backward on the whole atom:
    4 + workspace 4 x (1 + 1) + weights 80 + gradient 80 + activations 16 = 188 B; on one layer:
    4 + 8 + 40 + 40 + 8 = 100 B."""
    w = workload([PAIR])
    assert peak(w, whole(w, 0), 1) == 188
    assert [peak(w, p, 1) for p in candidates(w, 100)[0].parts] == [100, 100]
    assert min_budget(w)[0] == 100


def test_an_atom_that_does_not_fit_whole_is_paged_layer_by_layer_by_hand():
    """Budget 100 B: the whole atom (188 B) cannot run, its layers can (room 100 - 4 - 8 = 88 B).

    batch read                                              read 4
    fwd l0:  fetch w0 (40); act0 new                        read 40          resident w0, a0*
    fwd l1:  room for 48 of 88: evict w0 (clean); fetch w1  read 40          resident a0*, w1, a1*
    bwd l1:  needs w1 + a1 + g1 = 88: evict a0 (dirty)      write 8;  w1 dirtied, a1 and g1 freed
    bwd l0:  evict w1 (dirty); fetch w0 + a0                read 48, write 40; w0 dirtied
    """
    w = workload([PAIR])
    with pytest.raises(ImpossibleBudget):
        SwapWalk(w, 100).run()  # whole atoms do not fit
    plan, traffic, evictions = walk(w, 100, moved)
    assert [p.name for p in plan.parts] == ["a.l0", "a.l1"] and plan.micro == 1
    assert traffic == Traffic(4 + 40 + 40 + 48, 8 + 40, read_ops=4, write_ops=2)
    assert evictions == 3


def test_steady_iterations_of_a_paged_atom_by_hand():
    """From the second iteration on w0 is resident and dirty: batch 4; fwd l1 evicts w0 (write
    40) and fetches w1 (read 40); bwd l1 evicts a0 (write 8); bwd l0 evicts w1 (write 40) and
    fetches w0 + a0 (read 48)."""
    first = Traffic(4 + 40 + 40 + 48, 8 + 40, 4, 2)
    steady = Traffic(4 + 40 + 48, 40 + 8 + 40, 3, 3)
    for n in (2, 5):
        assert walk(workload([PAIR], iterations=n), 100, moved)[1] == first + steady.times(n - 1)


def test_atoms_that_fit_stay_whole_next_to_one_that_is_paged():
    """With x0 in front the largest whole step is still the pair's 188 B; x0 alone needs
    4 + 8 + 80 + 8 = 100 B, so at 100 B x0 stays whole and only the pair is split."""
    w = workload([X0, PAIR])
    plan, _, _ = walk(w, 100, moved)
    assert [p.name for p in plan.parts] == ["x0", "a.l0", "a.l1"]
    assert [p.atom for p in plan.parts] == [0, 1, 1]


def test_micro_batched_step_by_hand():
    """x0, x1 at batch 2 (no layers), no attack, slots 0. Whole batch: 8 pinned + 4 x 2 x (1 + 1)
    + 40 + 40 + 2 x 8 = 120 B per training backward; micro-batches of 1: 4 + 8 + 40 + 40 + 8 = 100.
    At 100 B the batch runs as 2 micro-batches (room 88 B); the first accumulates the gradient,
    the second updates.

    batch reads: 2 micro-batches of 4 B                       read 8 (2 ops)
    1  fwd x0:  fetch w0                                      read 40        w0, a0*
       fwd x1:  evict w0 (clean); fetch w1                    read 40        a0*, w1, a1*
       bwd x1:  evict a0 (dirty); g1 new; a1 freed            write 8        w1, g1*
       bwd x0:  evict w1 (clean), g1 (dirty); fetch w0 + a0   read 48, write 40   w0, g0*
    2  fwd x0:  a0 new, 88 of 88 used                                        g0*, w0, a0*
       fwd x1:  evict g0 (dirty), w0 (clean); fetch w1        read 40, write 40   a0*, w1, a1*
       bwd x1:  evict a0 (dirty); fetch g1; update            read 40, write 8    w1*
       bwd x0:  evict w1 (dirty); fetch w0 + a0 + g0; update  read 88, write 40   w0*
    """
    w = workload([X0, X1], batch=2)
    assert [p.micro for p in candidates(w, 119)] == [2]
    assert candidates(w, 120)[0].micro == 1
    plan, traffic, evictions = walk(w, 100, moved)
    assert plan.micro == 2
    assert traffic == Traffic(8 + 40 + 40 + 48 + 40 + 40 + 88, 8 + 40 + 40 + 8 + 40,
                              read_ops=2 + 6, write_ops=5)
    assert evictions == 8


def test_every_plan_that_fits_is_walked_and_the_device_takes_its_fastest():
    """Both fit at 130 B for the pair at batch 2 (whole atom per sample: 4 + 8 + 160 + 16 = 188;
    by layers at batch 2: 8 + 16 + 80 + 16 = 120). Then x0 and the pair at batch 4 and 190 B, per
    micro-batch b: x0 whole 20b + 80, the pair whole 28b + 160, a layer of it 20b + 80. b = 4: x0
    whole (160), the pair by layers (272 > 190); b = 2 the same (216 > 190); b = 1: both whole (188),
    which is also all atoms whole micro-batched (once). `walk` returns the plan of fewest seconds
    (bytes moved, operations, or per micro-batch), whatever its place among the candidates."""
    w = workload([PAIR], batch=2, iterations=3)
    plans = candidates(w, 130)
    assert [(len(p.parts), p.micro) for p in plans] == [(2, 1), (2, 2)]  # the whole pair: 188 even at 1
    w = workload([X0, PAIR], batch=4, iterations=3)
    walks, trail = traced_walks(w, 190)
    plans = [p for p, _ in trail]
    assert [(len(p.parts), p.micro) for p in plans] == [(3, 1), (3, 2), (2, 4)]
    assert [micro for micro, _, _ in walks] == [1, 2, 4]
    for i, walked in enumerate(walks):
        reference = SwapWalk(w, 190, plans[i])
        assert walked[1:] == (reference.run(), reference.evictions)

    def taken(i: int) -> tuple:
        return plans[i], walks[i][1], walks[i][2]

    assert walk(w, 190, moved) == taken(min(range(3), key=lambda i: moved(*walks[i][:2])))
    assert walk(w, 190, lambda micro, t: t.read_ops + t.write_ops) == taken(
        min(range(3), key=lambda i: walks[i][1].read_ops + walks[i][1].write_ops))
    assert walk(w, 190, lambda micro, t: micro) == taken(0)
    assert walk(w, 190, lambda micro, t: -micro) == taken(2)


def test_whole_atoms_at_the_full_batch_are_the_one_plan_once_their_steps_fit_by_hand():
    """x0, x1 at batch 2, iterations 2, budget 120 B: the full batch's largest step (120 B) fits,
    with room 120 - 8 - 16 = 96 B for w0 + a0 + g0 = 40 + 16 + 40, so almost every step evicts;
    it is still the one plan walked (jFAT swaps the model as it is; finer plans are for a step that
    cannot run).

    iteration 1: batch read 8; fwd x0 fetch w0 (40); fwd x1 evict w0, fetch w1 (40); bwd x1 evict
    a0 (write 16); bwd x0 evict w1* (write 40), fetch w0 + a0 (56)       read 144, write 56, ops 4 + 2
    iteration 2: batch 8; fwd x0 nothing; fwd x1 evict w0* (write 40), fetch w1 (40); bwd x1 evict a0
    (write 16); bwd x0 evict w1* (write 40), fetch w0 + a0 (56)          read 104, write 96, ops 3 + 3
    """
    w = workload([X0, X1], batch=2, iterations=2)
    walks, trail = traced_walks(w, 120)
    assert [(len(p.parts), p.micro) for p, _ in trail] == [(2, 1)]
    assert walks == ((1, Traffic(144 + 104, 56 + 96, 4 + 3, 2 + 3), 6),)


def test_a_budget_below_the_smallest_step_is_refused():
    """Layers of 10 and 20 parameters at batch 2, slots 1. One sample at a time (pinned 4 B):
    s0 4 + 4 x (1 + 1) + 3 x 40 + 8 = 140 B; s1 4 + 4 x (1 + 2) + 3 x 80 + 4 = 260 B; the whole
    atom 4 + 12 + 3 x 120 + 12 = 388 B. Nothing runs below 260 B."""
    big = atom("b", layer("b.s0", 10, 8.0), layer("b.s1", 20, 4.0, out=2))
    w = workload([big], batch=2, slots=1)
    assert min_budget(w) == (260, "b.s1")
    plan, traffic, _ = walk(w, 260, moved)
    assert (len(plan.parts), plan.micro) == (2, 2)
    assert traffic.read_bytes > 0
    with pytest.raises(ImpossibleBudget) as info:
        walk(w, 259, moved)
    assert isinstance(info.value, EdgeflError)
    assert info.value.key == "b.s1" and "b.s1" in str(info.value)


def test_a_fleet_below_the_smallest_step_is_one_line(tmp_path, capsys):
    """digits_cnn at batch 32: its largest conv layer's weights, gradient and momentum alone
    outgrow 0.05 MB of R_min, however the walk pages; the run stops before round 0 with one line."""
    root = Path(__file__).resolve().parents[1]
    code = main(["run", str(root / "scenarios" / "quickstart.toml"), "--dry-run", "--set", "rounds=1",
                 "--set", "fleet.reserved_memory_mb=0.05", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert "paged layer by layer, one sample at a time" in err and "0.050 MB" in err
    assert "raise fleet.reserved_memory_mb" in err  # these devices have more memory to give
    assert not (tmp_path / "r").exists()


def test_a_device_smaller_than_the_smallest_step_is_told_to_go(tmp_path, capsys):
    """smallcnn on the 256 KB nRF52840: its step needs more than the whole device, so raising
    R_min cannot help (it is capped at the device's memory); the line says to drop it."""
    root = Path(__file__).resolve().parents[1]
    code = main(["run", str(root / "scenarios" / "quickstart.toml"), "--dry-run", "--set", "rounds=1",
                 "--set", "fleet.pool=tiny", "--set", "model.name=smallcnn", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert "0.256 MB" in err and err.endswith("drop the device or choose a smaller model")


@pytest.mark.parametrize("budget", [188, 200, 1e9])
def test_atoms_that_fit_walk_whole_as_before(budget):
    """From 188 B on the pair's whole step fits: the walk keeps the atom whole, one batch."""
    w = workload([PAIR], iterations=3)
    plan, traffic, evictions = walk(w, budget, moved)
    assert [p.name for p in plan.parts] == ["a"] and plan.micro == 1
    reference = SwapWalk(w, budget)
    assert (traffic, evictions) == (reference.run(), reference.evictions)


def test_just_below_the_full_batch_fitting_a_device_micro_batches_and_from_there_it_swaps():
    """The quickstart's jFAT round (digits_cnn, batch 32, PGD-10) on a Raspberry Pi 4. One byte
    below the largest whole step at the full batch (0.93 MB) a step cannot run whole: the device
    takes the plan of fewest seconds among the finer ones (edgefl.sim.cost.plan_seconds), a
    micro-batched one that evicts nothing. From that budget up the full batch is the one plan, and
    it swaps: more bytes and more seconds.

    Which finer plan is cheapest weighs the device's per-operator overhead (micro-batches launch
    more operators) against its microSD traffic, so the premise is pinned on a Pi 4 with the figures
    it had before the fit on published step times (issue 51): 8 GFLOP/s sustained (1/6 of its 48
    GFLOP/s peak), the sbc class's 4 GB/s and 20 us per operator. With its fitted figures (a dearer
    operator) a micro-batch of 2 that evicts a little may be the cheapest; the rest holds for it too."""
    root = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.toml"
    s = load_scenario(root)
    exp = prepare(s, str(root), dry_run=True)
    w = exp.method.plan(0, 0, exp.pool.state(0, 0)).workload
    edge = max(peak(w, whole(w, i), w.batch) for i in range(len(w.atoms)))  # the largest whole step
    fitted = next(d for d in exp.pool.kinds if d.name == "raspberry_pi_4")
    pinned = dataclasses.replace(fitted, family="", fitted=Fitted(), efficiency=8 / 48,
                                 memory_bandwidth_gbps=None, op_overhead_us=None)
    for pi4 in (pinned, fitted):
        seconds = plan_seconds(w, pi4)
        below, moved_below, evicted_below = walk(w, edge - 1, seconds)
        walks, _ = traced_walks(w, edge - 1)
        assert below.micro > 1 and (evicted_below == 0 or pi4 is fitted)
        assert seconds(below.micro, moved_below) == min(seconds(m, t) for m, t, _ in walks)
        at, moved_at, evicted_at = walk(w, edge, seconds)
        assert at.micro == 1 and evicted_at > 0
        assert moved(1, moved_at) > moved(below.micro, moved_below)
        assert seconds(1, moved_at) > seconds(below.micro, moved_below)
