"""DevicePool: seeded device assignment, per-round states, client sampling and network draws."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from edgefl.config import FleetConfig
from edgefl.devices.catalog import Catalog, load_catalog
from edgefl.devices.pool import DevicePool, device_weights, truncated_normal
from edgefl.devices.profile import AppProfile, DeviceProfile, NetworkProfile

# REFERENCE.md pool "low": (peak FLOP/s, memory bytes).
LOW = {
    "gtx_1650m": (3.103e12, 4e9),
    "tx2": (1.3e12, 4e9),
    "kcu1500": (2e11, 2e9),
    "vc709": (1.02e11, 2e9),
    "radeon_hd_6870": (2.72e12, 1e9),
    "quadro_m2200": (2.122e12, 4e9),
    "a12_gpu": (4.88e11, 4e9),
    "geforce_750": (1.11e12, 1e9),
    "grid_k240q": (2.289e12, 1e9),
    "radeon_rx_6300m": (3.686e12, 2e9),
}

# REFERENCE.md networks: up / down Mbit/s, latency ms.
NETWORKS = {
    "dsl": ((1, 20), (3, 145), (11, 40)),
    "cable": ((1, 50), (25, 1000), (13, 27)),
    "4g": ((1, 30), (9, 60), (30, 50)),
    "5g": ((24, 58), (501, 635), (4, 10)),
    "wifi": ((1, 50), (25, 300), (10, 50)),
    "fiber": ((250, 1000), (30, 5000), (10, 12)),
    "satellite": ((3, 5), (12, 350), (594, 624)),
}


def device(name: str, gflops: float, memory_mb: float,
           networks: tuple[str, ...] = ("wifi",)) -> DeviceProfile:
    return DeviceProfile(name=name, description=name, source="test", memory_mb=memory_mb,
                         compute_gflops=gflops, storage_read_mb_s=100.0,
                         storage_write_mb_s=100.0, storage_latency_ms=0.1, pools=["test"],
                         networks=list(networks))


def app(name: str, perf_left: float, memory_left: float) -> AppProfile:
    return AppProfile(name=name, description=name, source="test", perf_left=perf_left,
                      memory_left=memory_left)


def network(name: str) -> NetworkProfile:
    up, down, latency = NETWORKS[name]
    return NetworkProfile(name=name, description=name, source="test", up_mbit_s=list(up),
                          down_mbit_s=list(down), latency_ms=list(latency))


def made_up_catalog(*devices: DeviceProfile, apps: tuple[AppProfile, ...] = ()) -> Catalog:
    return Catalog(
        devices={d.name: d for d in devices},
        apps={a.name: a for a in apps or (app("idle", 1.0, 1.0),)},
        networks={n: network(n) for n in NETWORKS},
    )


def names(pool: DevicePool) -> list[str]:
    return [d.name for d in pool.devices]


# seeding -----------------------------------------------------------------------------------------


def test_same_seed_same_assignment_and_states() -> None:
    fleet = FleetConfig(clients=30, pool="low", sample_fraction=0.3)
    a, b = DevicePool(load_catalog(), fleet, 7), DevicePool(load_catalog(), fleet, 7)
    assert names(a) == names(b)
    for t in range(3):
        assert a.sampled(t).tolist() == b.sampled(t).tolist()
        for k in range(fleet.clients):
            assert a.state(k, t) == b.state(k, t)


def test_different_seed_differs() -> None:
    fleet = FleetConfig(clients=30, pool="low", sample_fraction=0.3)
    a, b = DevicePool(load_catalog(), fleet, 0), DevicePool(load_catalog(), fleet, 1)
    assert names(a) != names(b)
    assert [a.sampled(t).tolist() for t in range(3)] != [b.sampled(t).tolist() for t in range(3)]
    assert [a.state(k, 0).memory_bytes for k in range(10)] != [
        b.state(k, 0).memory_bytes for k in range(10)]


def test_rounds_draw_different_states() -> None:
    pool = DevicePool(load_catalog(), FleetConfig(clients=5, pool="low"), 0)
    assert len({pool.state(0, t).memory_bytes for t in range(5)}) == 5


def test_state_does_not_depend_on_call_order() -> None:
    fleet = FleetConfig(clients=12, pool="low")
    first = DevicePool(load_catalog(), fleet, 3)
    wanted = first.state(5, 4)
    other = DevicePool(load_catalog(), fleet, 3)
    for t in reversed(range(6)):
        other.sampled(t).tolist()
        for k in reversed(range(fleet.clients)):
            if (k, t) != (5, 4):
                other.state(k, t)
    assert other.state(5, 4) == wanted
    assert first.state(5, 4) == wanted  # asking twice gives the same draw


def test_explicit_device_list_overrides_pool() -> None:
    fleet = FleetConfig(clients=50, pool="low", devices=["tesla_v100", "rtx_3090"])
    assert set(names(DevicePool(load_catalog(), fleet, 0))) == {"tesla_v100", "rtx_3090"}


def test_pool_assigns_only_pool_devices() -> None:
    pool = DevicePool(load_catalog(), FleetConfig(clients=200, pool="low"), 0)
    assert set(names(pool)) == set(LOW)


# device weights ----------------------------------------------------------------------------------

# FLOP/s x memory: a = 1e9 x 1e6 = 1e15, b = 2e15, c = 4e15.
ABC = [device("a", 1.0, 1.0), device("b", 2.0, 1.0), device("c", 1.0, 4.0)]


def test_weights_balanced_are_uniform() -> None:
    assert device_weights(ABC, 0.0) == pytest.approx([1 / 3, 1 / 3, 1 / 3])


def test_weights_unbalanced_favour_small_devices() -> None:
    # (f x m)^-1 ~ 1, 1/2, 1/4 -> 4/7, 2/7, 1/7
    assert device_weights(ABC, -1.0) == pytest.approx([4 / 7, 2 / 7, 1 / 7])


def test_weights_positive_s_favour_large_devices() -> None:
    assert device_weights(ABC, 1.0) == pytest.approx([1 / 7, 2 / 7, 4 / 7])
    # ^-2: 1, 1/4, 1/16 -> 16/21, 4/21, 1/21
    assert device_weights(ABC, -2.0) == pytest.approx([16 / 21, 4 / 21, 1 / 21])


def test_weights_on_reference_pool_do_not_underflow() -> None:
    devices = [load_catalog().devices[n] for n in LOW]
    w = device_weights(devices, -1.0)
    inv = np.array([1 / (f * m) for f, m in LOW.values()])
    assert w == pytest.approx(inv / inv.sum())
    assert w.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("s", [0.0, -1.0])
def test_assignment_frequencies_match_weights(s: float) -> None:
    clients = 20000
    pool = DevicePool(load_catalog(), FleetConfig(clients=clients, pool="low", balance_s=s), 11)
    counts = Counter(names(pool))
    raw = {n: (f * m) ** s for n, (f, m) in LOW.items()}
    total = sum(raw.values())
    for name, weight in raw.items():
        p = weight / total  # each client draws this device with probability p: binomial counts
        assert counts[name] > 0, name
        assert counts[name] / clients == pytest.approx(p, abs=5 * math.sqrt(p * (1 - p) / clients)), name


def test_unbalanced_pool_favours_the_smallest_device() -> None:
    pool = DevicePool(load_catalog(), FleetConfig(clients=2000, pool="low", balance_s=-1.0), 0)
    counts = Counter(names(pool))
    # vc709 has the smallest FLOP/s x memory (2.04e20), gtx_1650m the largest (1.24e22).
    assert counts.most_common(1)[0][0] == "vc709"
    assert counts["vc709"] > 10 * counts["gtx_1650m"] > 0


# client sampling ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("clients", "fraction", "n"), [(20, 0.3, 6), (100, 0.1, 10), (7, 1.0, 7),
                                                        (40, 0.26, 10), (20, 0.01, 1)])
def test_sampled(clients: int, fraction: float, n: int) -> None:
    pool = DevicePool(load_catalog(),
                      FleetConfig(clients=clients, pool="low", sample_fraction=fraction), 0)
    for t in range(5):
        picked = pool.sampled(t).tolist()
        assert len(picked) == n
        assert len(set(picked)) == n
        assert picked == sorted(picked)
        assert all(isinstance(k, int) and 0 <= k < clients for k in picked)


def test_sampled_changes_with_round() -> None:
    pool = DevicePool(load_catalog(),
                      FleetConfig(clients=100, pool="low", sample_fraction=0.1), 0)
    assert len({tuple(pool.sampled(t).tolist()) for t in range(10)}) > 1


# available memory and performance ----------------------------------------------------------------


def test_memory_between_reserved_and_high_fraction() -> None:
    # tiny has less memory than R_min (1 MB): it always gets all of it.
    tiny, big = device("tiny", 1.0, 0.5), device("big", 10.0, 1000.0)
    fleet = FleetConfig(clients=20, devices=["tiny", "big"], app_memory=False,
                        memory_fraction=[0.0, 0.2], reserved_memory_mb=1.0)
    pool = DevicePool(made_up_catalog(tiny, big), fleet, 0)
    above = 0
    for t in range(10):
        for k in range(fleet.clients):
            st = pool.state(k, t)
            if st.device.name == "tiny":
                assert st.memory_bytes == pytest.approx(0.5e6)
            else:
                assert 1e6 <= st.memory_bytes <= 0.2 * 1000e6
                above += st.memory_bytes > 1e6
    assert above > 0


def test_memory_never_below_reserved_on_real_pools() -> None:
    fleet = FleetConfig(clients=40, pool="edge", reserved_memory_mb=1.0)
    pool = DevicePool(load_catalog(), fleet, 2)
    for t in range(5):
        for k in range(fleet.clients):
            st = pool.state(k, t)
            floor = min(st.device.memory_bytes, 1e6)
            assert st.memory_bytes >= floor
            assert st.memory_bytes <= st.device.memory_bytes
            if st.memory_bytes > floor:
                assert st.memory_bytes <= 0.2 * st.device.memory_bytes


def test_reserved_bytes() -> None:
    pool = DevicePool(made_up_catalog(ABC[0]), FleetConfig(clients=1, devices=["a"],
                                                           reserved_memory_mb=60.0), 0)
    assert pool.reserved_bytes(device("x", 1.0, 4000.0)) == 60e6
    assert pool.reserved_bytes(device("y", 1.0, 8.5)) == 8.5e6


@pytest.mark.parametrize(("app_memory", "low", "high"), [(True, 50e6, 100e6),
                                                         (False, 100e6, 200e6)])
def test_app_memory_left_multiplies(app_memory: bool, low: float, high: float) -> None:
    # 1000 MB x U(0.1, 0.2), times the app's memory_left 0.5 when app_memory is on.
    big = device("big", 10.0, 1000.0)
    catalog = made_up_catalog(big, apps=(app("half", 0.5, 0.5),))
    fleet = FleetConfig(clients=10, devices=["big"], app_memory=app_memory,
                        memory_fraction=[0.1, 0.2], reserved_memory_mb=1.0)
    pool = DevicePool(catalog, fleet, 0)
    for t in range(10):
        for k in range(fleet.clients):
            st = pool.state(k, t)
            assert st.app == "half"
            assert low <= st.memory_bytes <= high
            assert st.flops == pytest.approx(10e9 * 0.5)


def test_fixed_memory_fraction_is_exact() -> None:
    big = device("big", 10.0, 1000.0)
    catalog = made_up_catalog(big, apps=(app("quarter", 0.25, 0.25),))
    fleet = FleetConfig(clients=3, devices=["big"], memory_fraction=[0.2, 0.2],
                        reserved_memory_mb=1.0)
    st = DevicePool(catalog, fleet, 0).state(1, 2)
    assert st.memory_bytes == pytest.approx(1000e6 * 0.2 * 0.25)
    assert st.flops == pytest.approx(10e9 * 0.25)


def test_performance_is_peak_times_app_share() -> None:
    catalog = load_catalog()
    fleet = FleetConfig(clients=20, pool="low")
    pool = DevicePool(catalog, fleet, 4)
    perf_left = {"idle": 1.0, "video_1080p": 0.735, "video_4k": 0.459, "inference": 0.524,
                 "object_detection": 0.167, "web_browsing": 0.231}
    seen = set()
    for t in range(10):
        for k in range(fleet.clients):
            st = pool.state(k, t)
            assert st.flops == pytest.approx(LOW[st.device.name][0] * perf_left[st.app])
            seen.add(st.app)
    assert seen == set(perf_left)


def test_apps_restricted_by_fleet() -> None:
    fleet = FleetConfig(clients=10, pool="low", apps=["video_4k"])
    pool = DevicePool(load_catalog(), fleet, 0)
    assert {pool.state(k, t).app for k in range(10) for t in range(3)} == {"video_4k"}


# networks ----------------------------------------------------------------------------------------


def test_network_draws_inside_ranges() -> None:
    fleet = FleetConfig(clients=40, pool="low")
    pool = DevicePool(load_catalog(), fleet, 5)
    seen = set()
    for t in range(10):
        for k in range(fleet.clients):
            st = pool.state(k, t)
            assert st.network in st.device.networks
            (ul, uh), (dl, dh), (ll, lh) = NETWORKS[st.network]
            assert ul * 1e6 / 8 <= st.up_bps <= uh * 1e6 / 8
            assert dl * 1e6 / 8 <= st.down_bps <= dh * 1e6 / 8
            assert ll / 1e3 <= st.latency_s <= lh / 1e3
            seen.add(st.network)
    assert seen == set(NETWORKS)


def test_network_drawn_from_the_device_list() -> None:
    sat = device("sat", 1.0, 100.0, networks=("satellite",))
    pool = DevicePool(made_up_catalog(sat), FleetConfig(clients=5, devices=["sat"]), 0)
    for t in range(5):
        for k in range(5):
            st = pool.state(k, t)
            assert st.network == "satellite"
            assert 0.594 <= st.latency_s <= 0.624
            assert 3e6 / 8 <= st.up_bps <= 5e6 / 8


@pytest.mark.parametrize(("low", "high"), [(1.0, 20.0), (594.0, 624.0), (30.0, 5000.0),
                                           (24.0, 58.0), (0.5, 0.6)])
def test_truncated_normal_stays_in_range(low: float, high: float) -> None:
    u = np.random.default_rng(0).uniform(size=300)
    draws = truncated_normal(np.full(300, low), np.full(300, high), u)
    assert ((low <= draws) & (draws <= high)).all()
    assert len(set(draws.tolist())) > 250
    # the inverse CDF: u = 0 is the low end, u = 1/2 the mean (the range is symmetric about it)
    ends = truncated_normal(np.array([low, low]), np.array([high, high]), np.array([0.0, 0.5]))
    assert ends == pytest.approx([low, (low + high) / 2])


def test_truncated_normal_degenerate_range() -> None:
    assert truncated_normal(np.array([7.0]), np.array([7.0]), np.array([0.3])).tolist() == [7.0]
