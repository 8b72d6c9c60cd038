"""Client selection (edgefl.selection): Oort's utility by hand (Lai et al., OSDI 2021, Algorithm 1),
power-of-choice's picks (Cho et al. 2020), memory_fit's preference, seeding, and resume."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from support import QUICKSTART, dies_before_checkpoint

from edgefl.cli import main
from edgefl.config import FleetConfig, Scenario, SelectionConfig
from edgefl.devices.catalog import load_catalog
from edgefl.devices.pool import DevicePool
from edgefl.errors import EdgeflError
from edgefl.scenario import load_scenario
from edgefl.selection import SELECTORS, Ask, Known, Picked
from edgefl.selection.oort import exploration, oort_utility


def ask(clients: int, count: int, sizes: list[float], round_: int = 2, seed: int = 0, need: float = 1.0,
        dry_run: bool = False) -> Ask:
    fleet = FleetConfig(clients=clients, sample_fraction=count / clients, pool="low")
    pool = DevicePool(load_catalog(), fleet, seed)
    return Ask(round_, count, pool, dry_run, lambda: np.array(sizes), lambda: need)


def known(loss: list[float], duration: list[float], last: list[int]) -> Known:
    return Known(np.array(loss, dtype=float), np.array(duration, dtype=float), np.array(last))


def pick(policy: str, a: Ask, k: Known, **cfg: float) -> Picked:
    """`policy`'s picks with its knob section set to `cfg`."""
    s = Scenario(selection=SelectionConfig(policy=policy))
    if cfg:
        s.sections[policy] = replace(s.sections[policy], **cfg)
    return SELECTORS.get(policy)(s).select(a, k)


def test_oort_utility_of_three_clients_by_hand():
    """|B| = 10, 20, 40; loss 1, 0.5, 0.5; last picked in rounds 1, 2, 2 (1-based); now round R = 3;
    durations 5, 20, 10 s against T = 10 s, alpha = 2:
    U = 10, 10, 20; bonus sqrt(0.1 ln 3 / 1) = 0.331453, sqrt(0.1 ln 3 / 2) = 0.234373;
    client 1 is slower than T: (10.234373) x (10 / 20)^2 = 2.558593."""
    util = oort_utility(np.array([10.0, 20, 40]), np.array([1.0, 0.5, 0.5]), np.array([5.0, 20, 10]),
                        np.array([0, 1, 1]), 2, 10.0, 2.0)
    assert util == pytest.approx([10.331453, 2.558593, 20.234373], abs=1e-6)


def test_oort_exploration_decays_to_its_floor():
    assert exploration(0.9, 0.98, 0.2, 0) == 0.9
    assert exploration(0.9, 0.98, 0.2, 2) == pytest.approx(0.9 * 0.9604)
    assert exploration(0.9, 0.98, 0.2, 200) == 0.2


def test_oort_exploits_the_highest_utility_and_explores_the_rest():
    """The three clients above plus two never picked; K = 2 at epsilon 0.5: one exploit, one explore.
    The cut-off is 0.95 x 20.23 (the 1st highest), so only client 2 qualifies. At K = 2 and epsilon 0
    the cut-off is 0.95 x 10.33 (the 2nd highest) = 9.81: clients 0 and 2, never the slow client 1."""
    k = known([1.0, 0.5, 0.5, np.nan, np.nan], [5.0, 20, 10, np.nan, np.nan], [0, 1, 1, -1, -1])
    a = ask(5, 2, [10, 20, 40, 5, 5])
    p = pick("oort", a, k, epsilon=0.5, epsilon_min=0.5, round_s=10.0)
    assert p.clients[0] == 2 and p.clients[1] in (3, 4)
    assert p.reason == ["exploit", "explore"]
    assert p.utility[0] == pytest.approx(20.234373, abs=1e-6) and np.isnan(p.utility[1])
    p2 = pick("oort", ask(5, 2, [10, 20, 40, 5, 5]), k, epsilon=0.0, epsilon_min=0.0,
              round_s=10.0)
    assert p2.clients.tolist() == [0, 2] and p2.reason == ["exploit"] * 2


def test_oort_in_a_dry_run_uses_data_sizes_and_says_so():
    """No losses: U(i) = |B_i|; T is the median duration (10 s), so client 1 (20 s) is penalised."""
    k = known([np.nan] * 3, [5.0, 20, 10], [0, 1, 1])
    p = pick("oort", ask(3, 1, [10, 20, 40], dry_run=True), k, epsilon=0.0, epsilon_min=0.0)
    assert p.clients.tolist() == [2]
    assert p.utility[0] == pytest.approx(40.234373, abs=1e-6)
    assert "dry run" in p.reason[0]


def test_power_of_choice_picks_the_highest_losses_among_the_candidates():
    sizes = [1.0] * 6
    losses = [0.1, 0.9, 0.3, 0.8, 0.2, 0.5]
    k = known(losses, [1.0] * 6, [0] * 6)
    assert pick("power_of_choice", ask(6, 2, sizes), k, d=6).clients.tolist() == [1, 3]
    k.loss[0] = np.nan
    k.last_round[0] = -1  # never picked: ranks first
    p = pick("power_of_choice", ask(6, 2, sizes), k, d=6)
    assert p.clients.tolist() == [0, 1] and p.reason == ["no loss yet", "highest loss"]
    k.last_round[0] = 0  # picked, but never reported a loss (late every time): ranks last
    k.loss[1:] = np.nan  # and behind it the others that never reported: all six are candidates
    k.loss[5] = 0.05
    p = pick("power_of_choice", ask(6, 2, sizes), k, d=6)
    why = dict(zip(p.clients.tolist(), p.reason, strict=True))
    assert why.pop(5) == "highest loss" and list(why.values()) == ["no loss reported"]


def test_a_diverged_client_s_infinite_loss_is_drawn_first_not_a_crash():
    """Oort's utility of a client whose training diverged (loss inf) is inf: it is drawn before the
    finite ones, and the draw does not fail on inf / inf."""
    from edgefl.selection.base import weighted_draw

    rng = np.random.default_rng(0)
    drawn = weighted_draw(rng, np.arange(4), np.array([1.0, np.inf, 2.0, 0.0]), 3)
    assert drawn[0] == 1 and sorted(drawn.tolist()) in ([0, 1, 2], [1, 2, 3], [0, 1, 3])
    assert 3 not in drawn[:2]  # weight 0 only once every positive one is drawn
    k = known([0.5, np.inf, 0.3, 0.4], [1.0] * 4, [0] * 4)
    p = pick("oort", ask(4, 2, [1.0] * 4, round_=5), k)
    assert 1 in p.clients.tolist()


def test_power_of_choice_draws_candidates_by_data_size():
    """Clients 0-2 hold no samples, so the d = 3 candidates are 3, 4, 5; of those, 4 has the highest
    loss, though 0-2 have higher ones."""
    k = known([0.9, 0.9, 0.9, 0.1, 0.5, 0.3], [1.0] * 6, [0] * 6)
    p = pick("power_of_choice", ask(6, 1, [0, 0, 0, 1, 1, 1]), k, d=3)
    assert p.clients.tolist() == [4] and p.utility.tolist() == [0.5]


def test_memory_fit_prefers_clients_whose_memory_holds_the_workload():
    a = ask(12, 3, [1.0] * 12, round_=1, seed=5)
    memory = a.memory_bytes(np.arange(12))
    assert memory.tolist() == a.pool.states(np.arange(12), 1).memory_bytes.tolist()  # as the round's draws
    top3 = sorted(np.argsort(-memory)[:3].tolist())
    k = Known.empty(12)
    # exactly three hold the need: they are the picks
    exact = pick("memory_fit", ask(12, 3, [1.0] * 12, round_=1, seed=5, need=float(np.sort(memory)[-3])), k)
    assert exact.clients.tolist() == top3 and exact.reason == ["fits"] * 3
    # none holds it: the nearest misses, by available / needed
    short = pick("memory_fit", ask(12, 3, [1.0] * 12, round_=1, seed=5, need=float(memory.max()) * 10), k)
    assert short.clients.tolist() == top3 and short.reason == ["short of memory"] * 3
    assert short.utility.tolist() == pytest.approx((memory[top3] / (memory.max() * 10)).tolist())
    # all hold it: a seeded uniform draw, every ratio at least 1
    loose = pick("memory_fit", ask(12, 3, [1.0] * 12, round_=1, seed=5, need=1.0), k)
    assert (loose.utility >= 1).all() and len(set(loose.clients.tolist())) == 3


@pytest.mark.parametrize("policy", ["uniform", "oort", "power_of_choice", "memory_fit"])
def test_selection_is_seeded(policy):
    k = known(list(np.linspace(0.1, 2, 50)), list(np.linspace(1, 50, 50)), [0] * 25 + [-1] * 25)
    sizes = list(range(1, 51))
    one, again = (pick(policy, ask(50, 10, sizes, seed=3, need=3e8), k) for _ in range(2))
    other = [pick(policy, ask(50, 10, sizes, seed=s, need=3e8), k).clients.tolist() for s in (4, 5, 6)]
    assert one.clients.tolist() == again.clients.tolist() and one.reason == again.reason
    assert any(o != one.clients.tolist() for o in other)
    assert len(one.clients) == 10 and list(one.clients) == sorted(set(one.clients.tolist()))


def test_uniform_is_the_pools_draw():
    a = ask(30, 7, [1.0] * 30, round_=4, seed=9)
    assert pick("uniform", a, Known.empty(30)).clients.tolist() == a.pool.sampled(4).tolist()


def test_a_bad_policy_is_one_line(tmp_path):
    with pytest.raises(EdgeflError) as err:
        load_scenario(QUICKSTART, ["selection.policy=fastest"])
    assert err.value.key == "selection.policy" and "oort" in err.value.fix
    with pytest.raises(EdgeflError) as err:
        # fewer candidates than the 10 clients picked
        load_scenario(QUICKSTART, ['selection.policy="power_of_choice"', "power_of_choice.d=3"])
    assert err.value.key == "power_of_choice.d"


SMALL = ["rounds=4", "fleet.clients=6", "training.local_iters=4", "attack.steps=2", "evaluation.steps=1",
         "data.test_samples=16", "threads=1", 'selection.policy="oort"', "oort.epsilon=0.5",
         "oort.epsilon_min=0.3"]


def run_args(out: Path) -> list[str]:
    return ["run", str(QUICKSTART), *[a for s in SMALL for a in ("--set", s)], "--out", str(out), "--quiet"]


@pytest.mark.slow
def test_selection_state_survives_resume(tmp_path):
    """Oort's picks depend on the losses and durations of past rounds: a run that dies after round 2's
    checkpoint and resumes picks the same clients, for the same reasons, as one that never stopped."""
    whole = tmp_path / "whole"
    assert main(run_args(whole)) == 0
    out = tmp_path / "late"
    with dies_before_checkpoint(3):
        assert main(run_args(out)) == 130
    assert main(["run", "--resume", str(out), "--quiet"]) == 0

    def picks(run: Path) -> list[list[str]]:
        lines = (run / "clients.csv").read_text().splitlines()
        return [[row.split(",")[1], row.split(",", 18)[-1]] for row in lines]

    assert picks(out) == picks(whole)
    assert any("exploit" in r[1] for r in picks(whole)[-3:])


def test_a_client_cut_short_shows_the_selection_its_whole_priced_work() -> None:
    """Oort's t_i of a client stopped at a deadline after 15 s of 280 s of priced work is 280 s,
    not the 15 s it ran: download 2 + data 3 + compute 270 + upload 5. A completed client shows the
    time it ran (here 12 s, its upload slowed on shared links beyond its priced 10 s); an offline
    one that ran longer than its priced 8 s (its download slowed on the links) shows what it ran."""
    from edgefl.experiment.rounds import seen_duration
    from edgefl.sim.clients import COMPLETED, LATE, OFFLINE
    from edgefl.sim.cost import ClientCost, Costs

    costs = Costs.of([ClientCost(270.0, 3.0, 2.0, 5.0, 1.0, False),
                      ClientCost(5.0, 1.0, 2.0, 2.0, 1.0, False),
                      ClientCost(4.0, 1.0, 2.0, 1.0, 1.0, False)])
    seen = seen_duration(np.array([15.0, 12.0, 9.0]), np.array([LATE, COMPLETED, OFFLINE]), costs)
    assert seen.tolist() == [280.0, 12.0, 9.0]
