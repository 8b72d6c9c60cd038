"""A sync or deadline round on a living fleet, played in columns by one compiled event loop.

The round's clients run their phases back to back (download, data access, compute, upload; on the
server's shared links, each transfer's bytes then its latency) from the round's start. A client
stops where its device goes offline, where its battery runs out, or when the round closes: at
`deadline_s` (FedScale's deadline, Lai et al., OSDI 2021; the clients still working are `late`),
once `target` clients have uploaded (the rest `dropped`: over-commitment), or once every client has
stopped. The server's links share their bandwidth by water-filling among the transfers under way
(max-min fairness, Bertsekas & Gallager, "Data Networks", 1992, §6.5.2), played as edgefl.sim.links
`Sharing` plays it (the same arithmetic, O(log n) an event: a virtual clock for the transfers at the
level, heaps by cap and by end). A battery is followed as edgefl.sim.processes `_watch` follows it:
its empty moment is worked out at every change of phase, on a shared link first bounded from below
by the transfer's most costly pace `BOUNDS` times, then at every change of the link's rates.

`play_round` is the implementation: every clock value is worked out as SimPy's clock adds it (an
event `d` seconds after `now` falls at `now + d`), and events at one instant run in the order SimPy
runs them (an interrupt first, then in the order they were scheduled; a watcher hears of a change
once the step that made it is done). Instead of one SimPy process, an offline interrupt and a
battery watcher per client (edgefl.sim.processes, which async rounds still play), the round is one
loop over a heap of events, compiled by Numba (its first call in a fresh checkout compiles it, about
25 s, then cached): a round of 65,000 clients of living-digits takes about 1.5 s on this 2-core
machine, against about 40 s as SimPy processes. The reference that plays the round as SimPy
processes, against which it is tested to the bit (random rounds, and whole runs of the bundled
living scenarios), is in the tests (tests/living_rounds.py `simpy_round`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numba import njit

from edgefl.sim.availability import Availability
from edgefl.sim.engine import Federation
from edgefl.sim.links import DONE_S, Links
from edgefl.sim.processes import BOUNDS, COMPLETED, DROPPED, LATE, OFFLINE, Drains, Transfers

INF = math.inf

# the event kinds, and the heaps of a link's Sharing (h = 4 x link + one of these)
TIMEOUT, WAKE, UNPLUG, WATCH, CLOSE, INTERRUPT, CHANGED, RATES = range(8)
URGENT, NORMAL = range(2)  # SimPy's priorities: an interrupt goes before the other events of its instant
LOW, HIGH, CAPPED_ENDS, SHARED_ENDS = range(4)
# a link's floats and ints (Sharing's fields; SharedLink's wake-up)
F_CAPACITY, F_NOW, F_V, F_LEVEL, F_CSUM, F_WAKE_AT = range(6)
I_SHARED, I_COUNT, I_SERIAL, I_WAKE = range(4)


@dataclass(frozen=True)
class LiveRound:
    """How a round went: when it started, closed (before the server's time) and ended; each client's
    status (edgefl.sim.processes STATUSES) and stop (its upload's end, or its interrupt), and its
    transfers' seconds on the shared links (n, 2: down, up; NaN where it has none: never started,
    or the links not shared)."""

    start_s: float
    close_s: float
    end_s: float
    status: np.ndarray
    stop_s: np.ndarray
    transfer_s: np.ndarray


def play_round(fed: Federation, clients: np.ndarray, phases: np.ndarray, avail: Availability, target: int,
               deadline_s: float, server_s: float | Callable[[np.ndarray], float],
               shared: tuple[Links, Transfers] | None = None, drains: Drains | None = None) -> LiveRound:
    """One round of `clients` (their phase seconds alone, (n, 4)) from now: closed at `deadline_s`
    (inf: none), once `target` clients have uploaded, or once every client has stopped; then the
    server spends `server_s` (or `server_s(the clients whose uploads count)`, asked at the close).
    With `shared` (the server's links, the clients' transfers) downloads and uploads share the
    links; with `drains`, a client whose battery runs out stops there."""
    n, start = len(clients), fed.now
    off = avail.offline_many(np.asarray(clients, dtype=np.int64), start)
    t = shared[1] if shared is not None else Transfers(np.zeros((n, 2)), np.ones((n, 2)), np.zeros(n))
    b = drains if drains is not None else Drains(np.zeros(n, dtype=bool), np.zeros(n), np.zeros((n, 4)),
                                                 np.zeros((n, 4)), np.zeros((n, 2)), np.zeros(n),
                                                 np.full(n, INF))
    capacity = (shared[0].down_bps, shared[0].up_bps) if shared is not None else (INF, INF)
    def f(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a, dtype=np.float64)

    status, stop, transfer, close = _play(
        f(phases), f(off), shared is not None, np.array(capacity, dtype=np.float64), f(t.nbytes), f(t.bps),
        f(t.latency_s), np.ascontiguousarray(b.on, dtype=np.bool_), f(b.held_j), f(b.watts), f(b.spread),
        f(b.per_byte), f(b.from_s), f(b.until_s), float(start), int(target), float(deadline_s))
    fed.reach(float(close))
    counted = np.asarray(clients)[status == COMPLETED]
    fed.env.run(until=fed.env.timeout(server_s(counted) if callable(server_s) else server_s))
    return LiveRound(start, float(close), fed.now, status, stop, transfer)


# --- a link's Sharing (edgefl.sim.links), its transfers named by client ---------------------------
# Compiled with no CPython wrapper: only the loop (`_play`) is called from Python, and a wrapper
# cannot take the lists inside the state's tuples.
_compiled = njit(cache=True, no_cpython_wrapper=True)  # type: ignore[call-overload]


@_compiled
def _push(heaps, h, key, serial, i):  # type: ignore[no-untyped-def]
    heapq.heappush(heaps[h], (key, serial, i))


@_compiled
def _top(heaps, h, tser, link):  # type: ignore[no-untyped-def]
    """The heap's smallest key, stale entries (of a transfer since moved or ended) dropped."""
    heap = heaps[h]
    while len(heap) and tser[link, heap[0][2]] != heap[0][1]:
        heapq.heappop(heap)
    return heap[0][0] if len(heap) else INF


@_compiled
def _level(lf, li, link):  # type: ignore[no-untyped-def]
    if li[link, I_SHARED]:
        return (lf[link, F_CAPACITY] - lf[link, F_CSUM]) / li[link, I_SHARED]
    return INF


@_compiled
def _place(lf, li, heaps, tcap, tkey, tcapped, tser, link, i, left, capped):  # type: ignore[no-untyped-def]
    serial = li[link, I_SERIAL]
    li[link, I_SERIAL] += 1
    tser[link, i] = serial
    tcapped[link, i] = capped
    if capped:
        tkey[link, i] = lf[link, F_NOW] + left / tcap[link, i]
        lf[link, F_CSUM] += tcap[link, i]
        _push(heaps, 4 * link + HIGH, -tcap[link, i], serial, i)
        _push(heaps, 4 * link + CAPPED_ENDS, tkey[link, i], serial, i)
    else:
        tkey[link, i] = lf[link, F_V] + left
        li[link, I_SHARED] += 1
        _push(heaps, 4 * link + LOW, tcap[link, i], serial, i)
        _push(heaps, 4 * link + SHARED_ENDS, tkey[link, i], serial, i)


@_compiled
def _detach(lf, li, tcap, tcapped, link, i):  # type: ignore[no-untyped-def]
    if tcapped[link, i]:
        lf[link, F_CSUM] -= tcap[link, i]
    else:
        li[link, I_SHARED] -= 1


@_compiled
def _remove(lf, li, tcap, tcapped, tser, link, i):  # type: ignore[no-untyped-def]
    _detach(lf, li, tcap, tcapped, link, i)
    tser[link, i] = -1
    li[link, I_COUNT] -= 1
    if li[link, I_SHARED] == li[link, I_COUNT]:  # none capped: the sum is 0, without its rounding
        lf[link, F_CSUM] = 0.0


@_compiled
def _left(lf, tcap, tkey, tcapped, link, i):  # type: ignore[no-untyped-def]
    if tcapped[link, i]:
        return (tkey[link, i] - lf[link, F_NOW]) * tcap[link, i]
    return tkey[link, i] - lf[link, F_V]


@_compiled
def _move(lf, li, heaps, tcap, tkey, tcapped, tser, link, i):  # type: ignore[no-untyped-def]
    left = _left(lf, tcap, tkey, tcapped, link, i)
    _detach(lf, li, tcap, tcapped, link, i)
    _place(lf, li, heaps, tcap, tkey, tcapped, tser, link, i, left, not tcapped[link, i])


@_compiled
def _settle(lf, li, heaps, tcap, tkey, tcapped, tser, link):  # type: ignore[no-untyped-def]
    high, low = 4 * link + HIGH, 4 * link + LOW
    while math.isfinite(_top(heaps, high, tser, link)) and -heaps[high][0][0] > _level(lf, li, link):
        _move(lf, li, heaps, tcap, tkey, tcapped, tser, link, heaps[high][0][2])
    while li[link, I_SHARED] and _top(heaps, low, tser, link) <= _level(lf, li, link):
        _move(lf, li, heaps, tcap, tkey, tcapped, tser, link, heaps[low][0][2])
    lf[link, F_LEVEL] = _level(lf, li, link)


@_compiled
def _advance(lf, li, link, now):  # type: ignore[no-untyped-def]
    if li[link, I_SHARED]:
        lf[link, F_V] += lf[link, F_LEVEL] * (now - lf[link, F_NOW])
    lf[link, F_NOW] = now


@_compiled
def _next_end(lf, heaps, tser, link):  # type: ignore[no-untyped-def]
    key = _top(heaps, 4 * link + SHARED_ENDS, tser, link)
    shared = lf[link, F_NOW] + (key - lf[link, F_V]) / lf[link, F_LEVEL] if math.isfinite(key) else INF
    return min(_top(heaps, 4 * link + CAPPED_ENDS, tser, link), shared)


@_compiled
def _through(now, rest_s):  # type: ignore[no-untyped-def]
    return rest_s <= DONE_S or now + rest_s == now


@_compiled
def _ended(lf, li, heaps, tcap, tkey, tcapped, tser, link, out):  # type: ignore[no-untyped-def]
    """The transfers through by now, removed (into `out`): the capped ones, then the shared ones."""
    capped, shared, now = 4 * link + CAPPED_ENDS, 4 * link + SHARED_ENDS, lf[link, F_NOW]
    found = False
    while True:
        end = _top(heaps, capped, tser, link)
        if not (math.isfinite(end) and _through(now, end - now)):
            break
        i = heaps[capped][0][2]
        _remove(lf, li, tcap, tcapped, tser, link, i)
        out.append(i)
        found = True
    while True:
        key = _top(heaps, shared, tser, link)
        if not (math.isfinite(key) and _through(now, (key - lf[link, F_V]) / lf[link, F_LEVEL])):
            break
        i = heaps[shared][0][2]
        _remove(lf, li, tcap, tcapped, tser, link, i)
        out.append(i)
        found = True
    if found:
        _settle(lf, li, heaps, tcap, tkey, tcapped, tser, link)


@_compiled
def _rate(lf, tcap, tcapped, tser, link, i):  # type: ignore[no-untyped-def]
    if tser[link, i] < 0:
        return 0.0
    return tcap[link, i] if tcapped[link, i] else lf[link, F_LEVEL]


@_compiled
def _left_at(lf, tcap, tkey, tcapped, tser, link, i, now):  # type: ignore[no-untyped-def]
    if tser[link, i] < 0:
        return 0.0
    if tcapped[link, i]:
        return max((tkey[link, i] - now) * tcap[link, i], 0.0)
    return max(tkey[link, i] - (lf[link, F_V] + lf[link, F_LEVEL] * (now - lf[link, F_NOW])), 0.0)


# --- the round ------------------------------------------------------------------------------------
# The round's state S = (cf, ci, g, gi, events, listeners, transfer): each client's floats and ints
# (its phase and transfer, its battery's meter, edgefl.sim.processes `Meter`, and watcher,
# `_watch`), the round's, the event heap, each link's watchers following its rates, and each
# client's transfer seconds (the output). The inputs x = (phases, off, nbytes, bps, latency,
# battery, held, watts, spread, per_byte, from_s, until_s), as `Round`; L, the links' Sharing.
C_BEGIN, C_STOP, M_BASE, M_SINCE, M_WATTS, M_LUMP, M_END, W_AT = range(8)
(C_ALIVE, C_STATUS, C_PHASE, C_SUB, C_TOKEN, M_PHASE, M_LINK, M_PROG, W_BOUNDS, W_GEN, W_DONE,
 W_EXACT) = range(12)
G_NOW, G_START = range(2)
G_COUNTED, G_ALIVE, G_ENOUGH, G_SEQ, G_TARGET, G_NET, G_CLOSING = range(7)
(X_PHASES, X_OFF, X_BYTES, X_BPS, X_LATENCY, X_BATTERY, X_HELD, X_WATTS, X_SPREAD, X_PER_BYTE, X_FROM,
 X_UNTIL) = range(12)


@_compiled
def _event(S, at, kind, a, b):  # type: ignore[no-untyped-def]
    gi, events = S[3], S[4]
    heapq.heappush(events, (at, URGENT if kind == INTERRUPT else NORMAL, gi[G_SEQ], kind, a, b))
    gi[G_SEQ] += 1


@_compiled
def _sent(x, L, S, i, now):  # type: ignore[no-untyped-def]
    """The bytes through so far of the transfer client i's meter follows."""
    lf, tcap, tkey, tcapped, tser = L[0], L[3], L[4], L[5], L[6]
    cf, ci = S[0], S[1]
    link = ci[i, M_LINK]
    nbytes, bps = x[X_BYTES][i, link], x[X_BPS][i, link]
    if math.isinf(lf[link, F_CAPACITY]):
        return min(nbytes, (now - cf[i, C_BEGIN]) * bps)
    return nbytes - _left_at(lf, tcap, tkey, tcapped, tser, link, i, now)


@_compiled
def _spent(x, L, S, i, now):  # type: ignore[no-untyped-def]
    cf, ci = S[0], S[1]
    joules = cf[i, M_BASE] + cf[i, M_WATTS] * (now - cf[i, M_SINCE])
    if ci[i, M_PROG]:
        joules += x[X_PER_BYTE][i, ci[i, M_PHASE] // 3] * _sent(x, L, S, i, now)
    return joules


@_compiled
def _pace(x, L, S, i, now, peak):  # type: ignore[no-untyped-def]
    """The meter's joules per second now (`peak`: the most they can be until its next phase)."""
    cf, ci = S[0], S[1]
    if not ci[i, M_PROG]:
        return cf[i, M_WATTS]
    lf, tcap, tcapped, tser = L[0], L[3], L[5], L[6]
    link = ci[i, M_LINK]
    bps = x[X_BPS][i, link]
    if math.isinf(lf[link, F_CAPACITY]):
        done_s = cf[i, C_BEGIN] + x[X_BYTES][i, link] / bps
        rate = bps if peak or now < done_s else 0.0
    elif peak:
        rate = min(bps, lf[link, F_CAPACITY])
    else:
        rate = _rate(lf, tcap, tcapped, tser, link, i)
    return cf[i, M_WATTS] + x[X_PER_BYTE][i, ci[i, M_PHASE] // 3] * rate


@_compiled
def _restart(x, L, S, i, now):  # type: ignore[no-untyped-def]
    cf, ci = S[0], S[1]
    cf[i, M_BASE] = _spent(x, L, S, i, now)
    cf[i, M_SINCE] = now
    ci[i, M_LINK] = -1
    ci[i, M_PROG] = 0


@_compiled
def _enter(x, L, S, i, phase, seconds):  # type: ignore[no-untyped-def]
    """The meter enters `phase`, `seconds` long alone (Meter.enter); its watcher starts afresh."""
    cf, ci = S[0], S[1]
    _restart(x, L, S, i, S[2][G_NOW])
    ci[i, M_PHASE] = phase
    cf[i, M_WATTS] = x[X_WATTS][i, phase]
    cf[i, M_END] = cf[i, M_SINCE] + seconds
    cf[i, M_LUMP] = 0.0 if seconds > 0 else x[X_SPREAD][i, phase]
    if seconds > 0:
        cf[i, M_WATTS] += x[X_SPREAD][i, phase] / seconds
    cf[i, M_BASE] += cf[i, M_LUMP]
    _changed(x, L, S, i)


@_compiled
def _on(x, L, S, i, link):  # type: ignore[no-untyped-def]
    """The meter follows a transfer on `link` (-1: its bytes are through; Meter.on)."""
    cf, ci = S[0], S[1]
    _restart(x, L, S, i, S[2][G_NOW])
    if link >= 0:
        cf[i, M_BASE] -= cf[i, M_LUMP]
        cf[i, M_LUMP] = 0.0
        ci[i, M_LINK] = link
        ci[i, M_PROG] = 1
    cf[i, M_WATTS] = x[X_WATTS][i, ci[i, M_PHASE]]
    cf[i, M_END] = INF
    _changed(x, L, S, i)


@_compiled
def _changed(x, L, S, i):  # type: ignore[no-untyped-def]
    """Client i's meter changed: its watcher, once this step is done, starts its bounds afresh (as
    SimPy resumes a process waiting on an event: later in the same instant)."""
    if not S[1][i, W_DONE]:
        _event(S, S[2][G_NOW], CHANGED, i, S[1][i, W_GEN])


@_compiled
def _watch(x, L, S, i):  # type: ignore[no-untyped-def]
    """Work out client i's empty moment afresh and wait for it (edgefl.sim.processes `_watch`)."""
    cf, ci, g = S[0], S[1], S[2]
    if not ci[i, C_ALIVE] or ci[i, W_DONE]:
        return
    now = g[G_NOW]
    listening = ci[i, W_BOUNDS] >= BOUNDS
    left = x[X_HELD][i] - _spent(x, L, S, i, now)
    on = ci[i, M_LINK] >= 0
    exact = not on or listening
    rate = _pace(x, L, S, i, now, not exact)
    eta = 0.0 if left <= 0 else (left / rate if rate > 0 else INF)
    plugged = g[G_START] + x[X_UNTIL][i]
    at = min(max(now + eta, g[G_START] + x[X_FROM][i]), plugged)
    ci[i, W_GEN] += 1
    if at <= now:
        ci[i, W_DONE] = 1
        if at < plugged:
            _event(S, now, INTERRUPT, i, OFFLINE)
        return
    ci[i, W_EXACT] = exact
    cf[i, W_AT] = at
    if listening and on:
        S[5][ci[i, M_LINK]].append((i, ci[i, W_GEN]))
    if at < cf[i, M_END] and math.isfinite(at):
        _event(S, now + (at - now), WATCH, i, ci[i, W_GEN])


@_compiled
def _timer(x, L, S, i, gen):  # type: ignore[no-untyped-def]
    """Client i's watcher's moment came: a bound (the next one follows) or its battery is empty."""
    ci = S[1]
    if ci[i, W_GEN] != gen or not ci[i, C_ALIVE] or ci[i, W_DONE]:
        return
    if not ci[i, W_EXACT]:
        ci[i, W_BOUNDS] += 1
        _watch(x, L, S, i)
        return
    ci[i, W_GEN] += 1
    ci[i, W_DONE] = 1
    if S[0][i, W_AT] < S[2][G_START] + x[X_UNTIL][i]:
        _event(S, S[2][G_NOW], INTERRUPT, i, OFFLINE)


@_compiled
def _schedule(x, L, S, link):  # type: ignore[no-untyped-def]
    """SharedLink._schedule: the transfers through end, the next wake-up is set, and the watchers
    following the link's rates work their moments out afresh."""
    lf, li, heaps, tcap, tkey, tcapped, tser = L
    ci, listeners = S[1], S[5]
    heard = listeners[link].copy()
    listeners[link].clear()
    out = [0]
    out.pop()
    _ended(lf, li, heaps, tcap, tkey, tcapped, tser, link, out)
    for i in out:
        _transferred(x, L, S, i)
    at = _next_end(lf, heaps, tser, link)
    if li[link, I_COUNT] and at != lf[link, F_WAKE_AT]:
        li[link, I_WAKE] += 1
        lf[link, F_WAKE_AT] = at
        now = S[2][G_NOW]
        _event(S, now + max(at - now, 0.0), WAKE, link, li[link, I_WAKE])
    for i, gen in heard:
        if ci[i, W_GEN] == gen:
            _event(S, S[2][G_NOW], RATES, i, gen)


@_compiled
def _woken(x, L, S, link, wake):  # type: ignore[no-untyped-def]
    lf, li = L[0], L[1]
    if wake == li[link, I_WAKE]:
        lf[link, F_WAKE_AT] = np.nan
        _advance(lf, li, link, S[2][G_NOW])
        _schedule(x, L, S, link)


@_compiled
def _send(x, L, S, i, link):  # type: ignore[no-untyped-def]
    """Client i's transfer on `link` starts now."""
    lf, li, heaps, tcap, tkey, tcapped, tser = L
    cf, ci = S[0], S[1]
    now = S[2][G_NOW]
    cf[i, C_BEGIN] = now
    nbytes, bps = x[X_BYTES][i, link], x[X_BPS][i, link]
    battery = x[X_BATTERY][i]
    if math.isinf(lf[link, F_CAPACITY]):
        if battery and nbytes > 0 and math.isfinite(bps):
            _on(x, L, S, i, link)
        _event(S, now + nbytes / bps, TIMEOUT, i, ci[i, C_TOKEN])
        return
    _advance(lf, li, link, now)
    tcap[link, i] = bps
    li[link, I_COUNT] += 1
    _place(lf, li, heaps, tcap, tkey, tcapped, tser, link, i, nbytes, False)
    _settle(lf, li, heaps, tcap, tkey, tcapped, tser, link)
    if battery:
        _on(x, L, S, i, link)
    _schedule(x, L, S, link)


@_compiled
def _transferred(x, L, S, i):  # type: ignore[no-untyped-def]
    """Client i's bytes are through: its latency follows."""
    S[1][i, C_SUB] = 1
    if x[X_BATTERY][i]:
        _on(x, L, S, i, -1)
    _event(S, S[2][G_NOW] + x[X_LATENCY][i], TIMEOUT, i, S[1][i, C_TOKEN])


@_compiled
def _phase(x, L, S, i, phase):  # type: ignore[no-untyped-def]
    """Client i starts `phase` now (after its last: it has uploaded)."""
    cf, ci, gi = S[0], S[1], S[3]
    now = S[2][G_NOW]
    if phase == 4:
        ci[i, C_ALIVE] = 0
        gi[G_ALIVE] -= 1
        cf[i, C_STOP] = now
        if gi[G_COUNTED] >= gi[G_TARGET]:  # beyond the target: not needed
            ci[i, C_STATUS] = DROPPED
        else:
            gi[G_COUNTED] += 1
            if gi[G_COUNTED] == gi[G_TARGET]:
                gi[G_ENOUGH] = 1
        return
    ci[i, C_PHASE], ci[i, C_SUB] = phase, 0
    seconds = x[X_PHASES][i, phase]
    if x[X_BATTERY][i]:
        _enter(x, L, S, i, phase, seconds)
    if gi[G_NET] and (phase == 0 or phase == 3):
        _send(x, L, S, i, 0 if phase == 0 else 1)
    else:
        _event(S, now + seconds, TIMEOUT, i, ci[i, C_TOKEN])


@_compiled
def _timeout(x, L, S, i, token):  # type: ignore[no-untyped-def]
    """Client i's timeout: its phase, its transfer alone (an unlimited link) or its latency ends."""
    cf, ci = S[0], S[1]
    if ci[i, C_TOKEN] != token or not ci[i, C_ALIVE]:
        return
    phase = ci[i, C_PHASE]
    if S[3][G_NET] and (phase == 0 or phase == 3):
        if ci[i, C_SUB] == 0:  # the bytes of a transfer alone
            _transferred(x, L, S, i)
            return
        S[6][i, 0 if phase == 0 else 1] = S[2][G_NOW] - cf[i, C_BEGIN]
    _phase(x, L, S, i, phase + 1)


@_compiled
def _interrupt(x, L, S, i, cause):  # type: ignore[no-untyped-def]
    """Client i stops now with status `cause`; a transfer under way leaves its link, the seconds it
    would have taken at its pace noted (edgefl.sim.processes `_send`)."""
    lf, li, heaps, tcap, tkey, tcapped, tser = L
    cf, ci, gi, transfer = S[0], S[1], S[3], S[6]
    if not ci[i, C_ALIVE]:
        return
    now, phase, begin = S[2][G_NOW], ci[i, C_PHASE], cf[i, C_BEGIN]
    ci[i, C_ALIVE] = 0
    ci[i, C_TOKEN] += 1
    ci[i, C_STATUS] = cause
    cf[i, C_STOP] = now
    gi[G_ALIVE] -= 1
    if not gi[G_NET] or not (phase == 0 or phase == 3):
        return
    link = 0 if phase == 0 else 1
    nbytes = x[X_BYTES][i, link]
    if ci[i, C_SUB] == 1:  # in its latency: its bytes all sent
        transfer[i, link] = now - begin
        return
    if math.isinf(lf[link, F_CAPACITY]):
        share = min((now - begin) * x[X_BPS][i, link] / nbytes, 1.0) if nbytes > 0 else 1.0
    else:
        left = 0.0
        if tser[link, i] >= 0:  # (not through at this same instant)
            _advance(lf, li, link, now)
            left = max(_left(lf, tcap, tkey, tcapped, link, i), 0.0)
            _remove(lf, li, tcap, tcapped, tser, link, i)
            _settle(lf, li, heaps, tcap, tkey, tcapped, tser, link)
            _schedule(x, L, S, link)
        share = 1.0 - left / nbytes if nbytes > 0 else 1.0
    if share > 0 and now > begin:
        transfer[i, link] = (now - begin) / share


@njit(cache=True)
def _play(phases, off, net, capacity, nbytes, bps, latency, battery, held, watts, spread, per_byte,  # type: ignore[no-untyped-def]
          from_s, until_s, start, target, deadline_s):
    n = phases.shape[0]
    x = (phases, off, nbytes, bps, latency, battery, held, watts, spread, per_byte, from_s, until_s)
    lf = np.zeros((2, 6))
    lf[:, F_CAPACITY] = capacity
    lf[:, F_NOW] = start
    lf[:, F_LEVEL] = INF
    lf[:, F_WAKE_AT] = np.nan
    li = np.zeros((2, 4), dtype=np.int64)
    heaps = [[(0.0, 0, 0)] for _ in range(8)]
    for heap in heaps:
        heap.pop()
    L = (lf, li, heaps, np.zeros((2, n)), np.zeros((2, n)), np.zeros((2, n), dtype=np.bool_),
         np.full((2, n), -1, dtype=np.int64))
    cf = np.zeros((n, 8))
    ci = np.zeros((n, 12), dtype=np.int64)
    ci[:, C_ALIVE] = 1
    ci[:, C_STATUS] = COMPLETED
    ci[:, W_DONE] = 1  # no watcher until its client has started
    g = np.array([start, start])
    gi = np.array([0, n, 0, 0, target, 1 if net else 0, 0], dtype=np.int64)
    events = [(0.0, 0, 0, 0, 0, 0)]
    events.pop()
    listeners = [[(0, 0)] for _ in range(2)]
    for heard in listeners:
        heard.pop()
    S = (cf, ci, g, gi, events, listeners, np.full((n, 2), np.nan))
    if math.isfinite(deadline_s):  # scheduled before the clients' first events (SimPy: created first)
        _event(S, start + deadline_s, CLOSE, LATE, 0)
    closes = start + deadline_s  # no interrupt for a device going offline once the round has closed
    for i in range(n):
        _phase(x, L, S, i, 0)
        end = closes
        if not net:
            end = min(end, start + phases[i, 0] + phases[i, 1] + phases[i, 2] + phases[i, 3])
        if off[i] < end:
            _event(S, start + (off[i] - start), UNPLUG, i, 0)
        if battery[i]:
            ci[i, W_DONE] = 0
            _watch(x, L, S, i)
    closed = n == 0
    while not closed and len(events):
        at, _, _, kind, a, b = heapq.heappop(events)
        g[G_NOW] = at
        if kind == TIMEOUT:
            _timeout(x, L, S, a, b)
        elif kind == WAKE:
            _woken(x, L, S, a, b)
        elif kind == UNPLUG:
            _event(S, at, INTERRUPT, a, OFFLINE)
        elif kind == INTERRUPT:
            _interrupt(x, L, S, a, b)
        elif kind == WATCH:
            _timer(x, L, S, a, b)
        elif kind in (CHANGED, RATES):
            if ci[a, W_GEN] == b:
                if kind == CHANGED:
                    ci[a, W_BOUNDS] = 0
                _watch(x, L, S, a)
        else:
            closed = True
        if not gi[G_CLOSING] and (gi[G_ENOUGH] or gi[G_ALIVE] == 0):  # the round closes at this instant
            gi[G_CLOSING] = 1
            _event(S, g[G_NOW], CLOSE, 0, 0)
    cause = DROPPED if gi[G_ENOUGH] else LATE
    for i in range(n):
        if ci[i, C_ALIVE]:
            _interrupt(x, L, S, i, cause)
    return ci[:, C_STATUS].copy(), cf[:, C_STOP].copy(), S[6], g[G_NOW]
