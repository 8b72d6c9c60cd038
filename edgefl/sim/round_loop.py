"""The compiled event loop of a living fleet's sync or deadline round (edgefl.sim.living_round,
which says what it plays and how it is tested): a link's Sharing (edgefl.sim.links) on arrays, and
the round's clients, their meters and battery watchers (edgefl.sim.processes `Meter`, `_watch`),
compiled by Numba."""

from __future__ import annotations

import heapq
import math

import numpy as np
from numba import njit

from edgefl.sim.links import DONE_S
from edgefl.sim.processes import BOUNDS, COMPLETED, DROPPED, LATE, OFFLINE, Drains, Transfers

INF = math.inf

# the event kinds; SimPy's priorities (an interrupt goes before the other events of its instant)
TIMEOUT, WAKE, UNPLUG, WATCH, CLOSE, INTERRUPT, CHANGED, RATES = range(8)
URGENT, NORMAL = range(2)
LOW, HIGH, CAPPED_ENDS, SHARED_ENDS = range(4)  # a link's heaps (4 x link + one of these)

# The loop's state is five arrays and two lists (few objects: each is reference-counted at every
# call). cf, ci: a row per client, its inputs (`play_round`'s columns) and its state: its phase
# and transfer, its battery's meter (edgefl.sim.processes `Meter`) and watcher (`_watch`), its
# place on each link's Sharing; gf, gi: each link's Sharing and its wake-up (LF floats, LI ints a
# link) and the round's; heaps: each link's four heaps; events: the events due (`_pop`); listeners (an
# array): each link's watchers that follow its rates.
(PHASES, OFF, BYTES, BPS, LATENCY, HELD, WATTS, SPREAD, PER_BYTE, FROM, UNTIL, BEGIN, STOP, M_BASE, M_SINCE,
 M_WATTS, M_LUMP, M_END, W_AT, TRANSFER_S, T_CAP, T_KEY) = (0, 4, 5, 7, 9, 10, 11, 15, 19, 21, 22, 23, 24, 25,
                                                            26, 27, 28, 29, 30, 31, 33, 35)
CF = 37  # cf's columns; BYTES, BPS, PER_BYTE, TRANSFER_S, T_CAP and T_KEY are two, by link
(ALIVE, STATUS, PHASE, SUB, TOKEN, M_PHASE, M_LINK, M_PROG, W_BOUNDS, W_GEN, W_DONE, W_EXACT, W_TOLD, BATTERY,
 T_CAPPED, T_SERIAL, OUT) = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16, 18)
CI = 19  # ci's columns; T_CAPPED and T_SERIAL are two, by link
F_CAPACITY, F_NOW, F_V, F_LEVEL, F_CSUM, F_WAKE_AT, F_SLOT_AT = range(7)  # gf[LF x link + one of these]
LF = 7
I_SHARED, I_COUNT, I_SERIAL, I_WAKE, I_SLOT_SEQ = range(5)  # gi[LI x link + one of these]
LI = 5
G_NOW, G_START = 2 * LF, 2 * LF + 1
G_COUNTED, G_ALIVE, G_ENOUGH, G_SEQ, G_TARGET, G_NET, G_CLOSING, G_HEARD = range(2 * LI, 2 * LI + 8)
G_HEADS = 2 * LI + 9  # two: the queues' heads
G = 2 * LI + 11  # gi's length: G_HEARD and G_HEADS are two


def play(phases: np.ndarray, off: np.ndarray, t: Transfers, b: Drains, capacity: tuple[float, float],
         net: bool, start: float, target: int, deadline_s: float
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The round's clients' statuses, stops and transfer seconds (n, 2), and its close."""
    n = len(phases)
    cf, ci = np.zeros((n, CF)), np.zeros((n, CI), dtype=np.int64)
    for column, values in ((PHASES, phases), (OFF, off), (BYTES, t.nbytes), (BPS, t.bps),
                           (LATENCY, t.latency_s), (HELD, b.held_j), (WATTS, b.watts), (SPREAD, b.spread),
                           (PER_BYTE, b.per_byte), (FROM, b.from_s), (UNTIL, b.until_s)):
        values = np.asarray(values, dtype=np.float64).reshape(n, -1)
        cf[:, column:column + values.shape[1]] = values
    ci[:, BATTERY] = b.on
    close = _play(cf, ci, np.array(capacity, dtype=np.float64), net, float(start), int(target),
                  float(deadline_s))
    return ci[:, STATUS].copy(), cf[:, STOP].copy(), cf[:, TRANSFER_S:TRANSFER_S + 2].copy(), float(close)


# --- a link's Sharing (edgefl.sim.links), its transfers named by client ---------------------------
# Compiled with no CPython wrapper: only the loop (`_play`) is called from Python, and a wrapper
# cannot take the lists of lists it passes on. Every function but the three largest (`_settle`,
# `_schedule`, `_interrupt`, each called from several places) is inlined (Numba's IR inlining): a
# call passes seven arrays and lists. At 100,000 devices a living-digits round plays 16-18 % faster
# than with none inlined, for a first compile of 36-39 s instead of 15 s; inlining those three too
# would make it 24 %, for a first compile of 4 minutes.
_compiled = njit(cache=True, no_cpython_wrapper=True)  # type: ignore[call-overload]
_inlined = njit(cache=True, no_cpython_wrapper=True, inline="always")  # type: ignore[call-overload]


@_inlined
def _top(ci, heaps, h, link):  # type: ignore[no-untyped-def]
    """The heap's smallest key, stale entries (of a transfer since moved or ended) dropped."""
    heap = heaps[h]
    while len(heap) and ci[heap[0][2], T_SERIAL + link] != heap[0][1]:
        heapq.heappop(heap)
    return heap[0][0] if len(heap) else INF


@_inlined
def _level(gf, gi, link):  # type: ignore[no-untyped-def]
    shared = gi[LI * link + I_SHARED]
    return (gf[LF * link + F_CAPACITY] - gf[LF * link + F_CSUM]) / shared if shared else INF


@_inlined
def _place(cf, ci, gf, gi, heaps, link, i, left, capped):  # type: ignore[no-untyped-def]
    serial = gi[LI * link + I_SERIAL]
    gi[LI * link + I_SERIAL] += 1
    ci[i, T_SERIAL + link] = serial
    ci[i, T_CAPPED + link] = capped
    cap = cf[i, T_CAP + link]
    if capped:
        cf[i, T_KEY + link] = gf[LF * link + F_NOW] + left / cap
        gf[LF * link + F_CSUM] += cap
        heapq.heappush(heaps[4 * link + HIGH], (-cap, serial, i))
        heapq.heappush(heaps[4 * link + CAPPED_ENDS], (cf[i, T_KEY + link], serial, i))
    else:
        cf[i, T_KEY + link] = gf[LF * link + F_V] + left
        gi[LI * link + I_SHARED] += 1
        heapq.heappush(heaps[4 * link + LOW], (cap, serial, i))
        heapq.heappush(heaps[4 * link + SHARED_ENDS], (cf[i, T_KEY + link], serial, i))


@_inlined
def _detach(cf, ci, gf, gi, link, i):  # type: ignore[no-untyped-def]
    if ci[i, T_CAPPED + link]:
        gf[LF * link + F_CSUM] -= cf[i, T_CAP + link]
    else:
        gi[LI * link + I_SHARED] -= 1


@_inlined
def _remove(cf, ci, gf, gi, link, i):  # type: ignore[no-untyped-def]
    _detach(cf, ci, gf, gi, link, i)
    ci[i, T_SERIAL + link] = -1
    gi[LI * link + I_COUNT] -= 1
    if gi[LI * link + I_SHARED] == gi[LI * link + I_COUNT]:  # none capped: the sum is 0, without its rounding
        gf[LF * link + F_CSUM] = 0.0


@_inlined
def _left(cf, ci, gf, link, i):  # type: ignore[no-untyped-def]
    if ci[i, T_CAPPED + link]:
        return (cf[i, T_KEY + link] - gf[LF * link + F_NOW]) * cf[i, T_CAP + link]
    return cf[i, T_KEY + link] - gf[LF * link + F_V]


@_inlined
def _move(cf, ci, gf, gi, heaps, link, i):  # type: ignore[no-untyped-def]
    left = _left(cf, ci, gf, link, i)
    _detach(cf, ci, gf, gi, link, i)
    _place(cf, ci, gf, gi, heaps, link, i, left, not ci[i, T_CAPPED + link])


@_compiled
def _settle(cf, ci, gf, gi, heaps, link):  # type: ignore[no-untyped-def]
    high, low = 4 * link + HIGH, 4 * link + LOW
    while math.isfinite(_top(ci, heaps, high, link)) and -heaps[high][0][0] > _level(gf, gi, link):
        _move(cf, ci, gf, gi, heaps, link, heaps[high][0][2])
    while gi[LI * link + I_SHARED] and _top(ci, heaps, low, link) <= _level(gf, gi, link):
        _move(cf, ci, gf, gi, heaps, link, heaps[low][0][2])
    gf[LF * link + F_LEVEL] = _level(gf, gi, link)


@_inlined
def _advance(gf, gi, link, now):  # type: ignore[no-untyped-def]
    if gi[LI * link + I_SHARED]:
        gf[LF * link + F_V] += gf[LF * link + F_LEVEL] * (now - gf[LF * link + F_NOW])
    gf[LF * link + F_NOW] = now


@_inlined
def _next_end(ci, gf, heaps, link):  # type: ignore[no-untyped-def]
    key = _top(ci, heaps, 4 * link + SHARED_ENDS, link)
    v, level = gf[LF * link + F_V], gf[LF * link + F_LEVEL]
    shared = gf[LF * link + F_NOW] + (key - v) / level if math.isfinite(key) else INF
    return min(_top(ci, heaps, 4 * link + CAPPED_ENDS, link), shared)


@_inlined
def _through(now, rest_s):  # type: ignore[no-untyped-def]
    return rest_s <= DONE_S or now + rest_s == now


@_inlined
def _ended(cf, ci, gf, gi, heaps, link):  # type: ignore[no-untyped-def]
    """How many transfers are through by now, removed (their clients in ci's OUT column): the capped
    ones, then the shared ones."""
    now, v, level = gf[LF * link + F_NOW], gf[LF * link + F_V], gf[LF * link + F_LEVEL]
    found = 0
    for h in (4 * link + CAPPED_ENDS, 4 * link + SHARED_ENDS):
        while True:
            key = _top(ci, heaps, h, link)
            rest = key - now if h % 4 == CAPPED_ENDS else (key - v) / level
            if not (math.isfinite(key) and _through(now, rest)):
                break
            i = heaps[h][0][2]
            _remove(cf, ci, gf, gi, link, i)
            ci[found, OUT] = i
            found += 1
    if found:
        _settle(cf, ci, gf, gi, heaps, link)
    return found


@_inlined
def _rate(cf, ci, gf, link, i):  # type: ignore[no-untyped-def]
    if ci[i, T_SERIAL + link] < 0:
        return 0.0
    return cf[i, T_CAP + link] if ci[i, T_CAPPED + link] else gf[LF * link + F_LEVEL]


@_inlined
def _left_at(cf, ci, gf, link, i, now):  # type: ignore[no-untyped-def]
    if ci[i, T_SERIAL + link] < 0:
        return 0.0
    if ci[i, T_CAPPED + link]:
        return max((cf[i, T_KEY + link] - now) * cf[i, T_CAP + link], 0.0)
    v = gf[LF * link + F_V] + gf[LF * link + F_LEVEL] * (now - gf[LF * link + F_NOW])
    return max(cf[i, T_KEY + link] - v, 0.0)


# --- the round ------------------------------------------------------------------------------------


@_inlined
def _event(gf, gi, events, at, kind, a, b):  # type: ignore[no-untyped-def]
    """An event at `at` (now: in its priority's queue, after the others of this instant there)."""
    priority = URGENT if kind == INTERRUPT else NORMAL
    item = (at, priority, gi[G_SEQ], kind, a, b)
    if at == gf[G_NOW]:
        events[1 + priority].append(item)
    else:
        heapq.heappush(events[0], item)
    gi[G_SEQ] += 1


@_inlined
def _pop(gf, gi, events):  # type: ignore[no-untyped-def]
    """The next event (its source; -1: none is left), the least (time, priority, number) of the
    heap's, the two queues of this instant's and the links' wake-ups."""
    source, best = -1, (INF, NORMAL, 0, 0, 0, 0)
    if len(events[0]):
        source, best = 0, events[0][0]
    for q in range(1, 3):
        head = gi[G_HEADS + q - 1]
        if head < len(events[q]) and (source < 0 or events[q][head] < best):
            source, best = q, events[q][head]
    for link in range(2):
        seq = gi[LI * link + I_SLOT_SEQ]
        if seq >= 0:
            wake = (gf[LF * link + F_SLOT_AT], NORMAL, seq, WAKE, link, gi[LI * link + I_WAKE])
            if source < 0 or wake < best:
                source, best = 3 + link, wake
    if source == 0:
        heapq.heappop(events[0])
    elif 0 < source < 3:
        gi[G_HEADS + source - 1] += 1
        if gi[G_HEADS + source - 1] == len(events[source]):
            events[source].clear()
            gi[G_HEADS + source - 1] = 0
    elif source >= 3:
        gi[LI * (source - 3) + I_SLOT_SEQ] = -1
    return source, best


@_inlined
def _sent(cf, ci, gf, i, now):  # type: ignore[no-untyped-def]
    """The bytes through so far of the transfer client i's meter follows."""
    link = ci[i, M_LINK]
    nbytes = cf[i, BYTES + link]
    if math.isinf(gf[LF * link + F_CAPACITY]):
        return min(nbytes, (now - cf[i, BEGIN]) * cf[i, BPS + link])
    return nbytes - _left_at(cf, ci, gf, link, i, now)


@_inlined
def _spent(cf, ci, gf, i, now):  # type: ignore[no-untyped-def]
    joules = cf[i, M_BASE] + cf[i, M_WATTS] * (now - cf[i, M_SINCE])
    if ci[i, M_PROG]:
        joules += cf[i, PER_BYTE + ci[i, M_PHASE] // 3] * _sent(cf, ci, gf, i, now)
    return joules


@_inlined
def _pace(cf, ci, gf, i, now, peak):  # type: ignore[no-untyped-def]
    """The meter's joules per second now (`peak`: the most they can be until its next phase)."""
    if not ci[i, M_PROG]:
        return cf[i, M_WATTS]
    link = ci[i, M_LINK]
    bps = cf[i, BPS + link]
    if math.isinf(gf[LF * link + F_CAPACITY]):
        rate = bps if peak or now < cf[i, BEGIN] + cf[i, BYTES + link] / bps else 0.0
    elif peak:
        rate = min(bps, gf[LF * link + F_CAPACITY])
    else:
        rate = _rate(cf, ci, gf, link, i)
    return cf[i, M_WATTS] + cf[i, PER_BYTE + ci[i, M_PHASE] // 3] * rate


@_inlined
def _restart(cf, ci, gf, i):  # type: ignore[no-untyped-def]
    now = gf[G_NOW]
    cf[i, M_BASE] = _spent(cf, ci, gf, i, now)
    cf[i, M_SINCE] = now
    ci[i, M_LINK] = -1
    ci[i, M_PROG] = 0


@_inlined
def _changed(ci, gf, gi, events, i):  # type: ignore[no-untyped-def]
    """Client i's meter changed: its watcher, once this step is done, starts its bounds afresh (as
    SimPy resumes a process waiting on an event: later in the same instant)."""
    if not ci[i, W_DONE] and ci[i, W_TOLD] != ci[i, W_GEN]:  # once a wait: a second would find it over
        ci[i, W_TOLD] = ci[i, W_GEN]
        _event(gf, gi, events, gf[G_NOW], CHANGED, i, ci[i, W_GEN])


@_inlined
def _enter(cf, ci, gf, gi, events, i, phase, seconds):  # type: ignore[no-untyped-def]
    """The meter enters `phase`, `seconds` long alone (Meter.enter)."""
    _restart(cf, ci, gf, i)
    ci[i, M_PHASE] = phase
    cf[i, M_WATTS] = cf[i, WATTS + phase]
    cf[i, M_END] = cf[i, M_SINCE] + seconds
    cf[i, M_LUMP] = 0.0 if seconds > 0 else cf[i, SPREAD + phase]
    if seconds > 0:
        cf[i, M_WATTS] += cf[i, SPREAD + phase] / seconds
    cf[i, M_BASE] += cf[i, M_LUMP]
    _changed(ci, gf, gi, events, i)


@_inlined
def _on(cf, ci, gf, gi, events, i, link):  # type: ignore[no-untyped-def]
    """The meter follows a transfer on `link` (-1: its bytes are through; Meter.on)."""
    _restart(cf, ci, gf, i)
    if link >= 0:
        cf[i, M_BASE] -= cf[i, M_LUMP]
        cf[i, M_LUMP] = 0.0
        ci[i, M_LINK] = link
        ci[i, M_PROG] = 1
    cf[i, M_WATTS] = cf[i, WATTS + ci[i, M_PHASE]]
    cf[i, M_END] = INF
    _changed(ci, gf, gi, events, i)


@_inlined
def _watch(cf, ci, gf, gi, events, listeners, i):  # type: ignore[no-untyped-def]
    """Work out client i's empty moment afresh and wait for it (edgefl.sim.processes `_watch`)."""
    if not ci[i, ALIVE] or ci[i, W_DONE]:
        return
    now = gf[G_NOW]
    listening = ci[i, W_BOUNDS] >= BOUNDS
    on = ci[i, M_LINK] >= 0
    exact = not on or listening
    at = _moment(cf, ci, gf, i, exact)
    plugged = gf[G_START] + cf[i, UNTIL]
    ci[i, W_GEN] += 1
    if at <= now:
        ci[i, W_DONE] = 1
        if at < plugged:
            _event(gf, gi, events, now, INTERRUPT, i, OFFLINE)
        return
    ci[i, W_EXACT] = exact
    cf[i, W_AT] = at
    if listening and on:
        _listen(ci, gi, listeners, ci[i, M_LINK], i)
    if at < cf[i, M_END] and math.isfinite(at):
        _event(gf, gi, events, now + (at - now), WATCH, i, ci[i, W_GEN])


@_inlined
def _timer(cf, ci, gf, gi, events, listeners, i, gen):  # type: ignore[no-untyped-def]
    """Client i's watcher's moment came: a bound (the next one follows) or its battery is empty."""
    if ci[i, W_GEN] != gen or not ci[i, ALIVE] or ci[i, W_DONE]:
        return
    if not ci[i, W_EXACT]:
        ci[i, W_BOUNDS] += 1
        _watch(cf, ci, gf, gi, events, listeners, i)
        return
    ci[i, W_GEN] += 1
    ci[i, W_DONE] = 1
    if cf[i, W_AT] < gf[G_START] + cf[i, UNTIL]:
        _event(gf, gi, events, gf[G_NOW], INTERRUPT, i, OFFLINE)


@_inlined
def _moment(cf, ci, gf, i, exact):  # type: ignore[no-untyped-def]
    """When client i's battery is empty, spending from now at its pace now (`exact`; else at its
    most costly), moved into its window (not before `from_s`, not after its plugging in)."""
    now = gf[G_NOW]
    left = cf[i, HELD] - _spent(cf, ci, gf, i, now)
    rate = _pace(cf, ci, gf, i, now, not exact)
    eta = 0.0 if left <= 0 else (left / rate if rate > 0 else INF)
    return min(max(now + eta, gf[G_START] + cf[i, FROM]), gf[G_START] + cf[i, UNTIL])


@_compiled
def _schedule(cf, ci, gf, gi, heaps, events, listeners, link):  # type: ignore[no-untyped-def]
    """SharedLink._schedule: the transfers through end, the next wake-up is set, and the watchers
    following the link's rates, once this step is done, work their moments out afresh. A watcher
    whose moment, worked out now, falls after the link's next wake-up is not woken: the link's
    rates stay as they are until its next change, which comes by that wake-up and looks at the
    watcher again, so the timer it would set could never fire; it keeps following the link, its
    wait renewed (its timer, of a moment worked out before, void)."""
    for k in range(_ended(cf, ci, gf, gi, heaps, link)):
        _transferred(cf, ci, gf, gi, events, ci[k, OUT])
    at = _next_end(ci, gf, heaps, link)
    if gi[LI * link + I_COUNT] and at != gf[LF * link + F_WAKE_AT]:
        gi[LI * link + I_WAKE] += 1
        gf[LF * link + F_WAKE_AT] = at
        now = gf[G_NOW]  # due in its slot with its number now (`_pop` looks between steps: one
        gf[LF * link + F_SLOT_AT] = now + max(at - now, 0.0)  # superseded within a step is never due)
        gi[LI * link + I_SLOT_SEQ] = gi[G_SEQ]
        gi[G_SEQ] += 1
    now, wake = gf[G_NOW], gf[LF * link + F_SLOT_AT] if gi[LI * link + I_COUNT] else -INF
    kept = 0
    for k in range(gi[G_HEARD + link]):
        i, gen = listeners[link, k, 0], listeners[link, k, 1]
        if ci[i, W_GEN] != gen:
            continue
        on = ci[i, ALIVE] and not ci[i, W_DONE] and ci[i, M_LINK] == link
        if on and now + (_moment_on(cf, ci, gf, link, i) - now) > wake:
            ci[i, W_GEN] += 1
            listeners[link, kept, 0], listeners[link, kept, 1] = i, gen + 1
            kept += 1
        else:
            _event(gf, gi, events, now, RATES, i, gen)
    gi[G_HEARD + link] = kept


@_inlined
def _moment_on(cf, ci, gf, link, i):  # type: ignore[no-untyped-def]
    """`_moment(cf, ci, gf, i, True)` of a client whose meter follows its transfer on the finite
    `link`, in one body (the same operations: it is asked of every listener at every change)."""
    now = gf[G_NOW]
    pace = cf[i, PER_BYTE + ci[i, M_PHASE] // 3]
    left_at, rate = 0.0, 0.0
    if ci[i, T_SERIAL + link] >= 0:
        if ci[i, T_CAPPED + link]:
            left_at, rate = max((cf[i, T_KEY + link] - now) * cf[i, T_CAP + link], 0.0), cf[i, T_CAP + link]
        else:
            v = gf[LF * link + F_V] + gf[LF * link + F_LEVEL] * (now - gf[LF * link + F_NOW])
            left_at, rate = max(cf[i, T_KEY + link] - v, 0.0), gf[LF * link + F_LEVEL]
    spent = cf[i, M_BASE] + cf[i, M_WATTS] * (now - cf[i, M_SINCE]) + pace * (cf[i, BYTES + link] - left_at)
    left = cf[i, HELD] - spent
    power = cf[i, M_WATTS] + pace * rate
    eta = 0.0 if left <= 0 else (left / power if power > 0 else INF)
    return min(max(now + eta, gf[G_START] + cf[i, FROM]), gf[G_START] + cf[i, UNTIL])


@_inlined
def _listen(ci, gi, listeners, link, i):  # type: ignore[no-untyped-def]
    """Client i's watcher follows `link`'s rates (until the link's next change: `_schedule`)."""
    k = gi[G_HEARD + link]
    if k == listeners.shape[1]:  # full of waits since renewed: the current ones kept
        kept = 0
        for j in range(k):
            if ci[listeners[link, j, 0], W_GEN] == listeners[link, j, 1]:
                listeners[link, kept] = listeners[link, j]
                kept += 1
        k = kept
    listeners[link, k, 0], listeners[link, k, 1] = i, ci[i, W_GEN]
    gi[G_HEARD + link] = k + 1


@_inlined
def _woken(cf, ci, gf, gi, heaps, events, listeners, link, wake):  # type: ignore[no-untyped-def]
    if wake == gi[LI * link + I_WAKE]:
        gf[LF * link + F_WAKE_AT] = np.nan
        _advance(gf, gi, link, gf[G_NOW])
        _schedule(cf, ci, gf, gi, heaps, events, listeners, link)


@_inlined
def _send(cf, ci, gf, gi, heaps, events, listeners, i, link):  # type: ignore[no-untyped-def]
    """Client i's transfer on `link` starts now."""
    now = gf[G_NOW]
    cf[i, BEGIN] = now
    nbytes, bps = cf[i, BYTES + link], cf[i, BPS + link]
    if math.isinf(gf[LF * link + F_CAPACITY]):
        if ci[i, BATTERY] and nbytes > 0 and math.isfinite(bps):
            _on(cf, ci, gf, gi, events, i, link)
        _event(gf, gi, events, now + nbytes / bps, TIMEOUT, i, ci[i, TOKEN])
        return
    _advance(gf, gi, link, now)
    cf[i, T_CAP + link] = bps
    gi[LI * link + I_COUNT] += 1
    _place(cf, ci, gf, gi, heaps, link, i, nbytes, False)
    _settle(cf, ci, gf, gi, heaps, link)
    if ci[i, BATTERY]:
        _on(cf, ci, gf, gi, events, i, link)
    _schedule(cf, ci, gf, gi, heaps, events, listeners, link)


@_inlined
def _transferred(cf, ci, gf, gi, events, i):  # type: ignore[no-untyped-def]
    """Client i's bytes are through: its latency follows."""
    ci[i, SUB] = 1
    if ci[i, BATTERY]:
        _on(cf, ci, gf, gi, events, i, -1)
    _event(gf, gi, events, gf[G_NOW] + cf[i, LATENCY], TIMEOUT, i, ci[i, TOKEN])


@_inlined
def _phase(cf, ci, gf, gi, heaps, events, listeners, i, phase):  # type: ignore[no-untyped-def]
    """Client i starts `phase` now (after its last: it has uploaded)."""
    now = gf[G_NOW]
    if phase == 4:
        ci[i, ALIVE] = 0
        gi[G_ALIVE] -= 1
        cf[i, STOP] = now
        if gi[G_COUNTED] >= gi[G_TARGET]:  # beyond the target: not needed
            ci[i, STATUS] = DROPPED
        else:
            gi[G_COUNTED] += 1
            if gi[G_COUNTED] == gi[G_TARGET]:
                gi[G_ENOUGH] = 1
        return
    ci[i, PHASE], ci[i, SUB] = phase, 0
    seconds = cf[i, PHASES + phase]
    if ci[i, BATTERY]:
        _enter(cf, ci, gf, gi, events, i, phase, seconds)
    if gi[G_NET] and (phase == 0 or phase == 3):
        _send(cf, ci, gf, gi, heaps, events, listeners, i, 0 if phase == 0 else 1)
    else:
        _event(gf, gi, events, now + seconds, TIMEOUT, i, ci[i, TOKEN])


@_inlined
def _timeout(cf, ci, gf, gi, heaps, events, listeners, i, token):  # type: ignore[no-untyped-def]
    """Client i's timeout: its phase, its transfer alone (an unlimited link) or its latency ends."""
    if ci[i, TOKEN] != token or not ci[i, ALIVE]:
        return
    phase = ci[i, PHASE]
    if gi[G_NET] and (phase == 0 or phase == 3):
        if ci[i, SUB] == 0:  # the bytes of a transfer alone
            _transferred(cf, ci, gf, gi, events, i)
            return
        cf[i, TRANSFER_S + (0 if phase == 0 else 1)] = gf[G_NOW] - cf[i, BEGIN]
    _phase(cf, ci, gf, gi, heaps, events, listeners, i, phase + 1)


@_compiled
def _interrupt(cf, ci, gf, gi, heaps, events, listeners, i, cause):  # type: ignore[no-untyped-def]
    """Client i stops now with status `cause`; a transfer under way leaves its link, the seconds it
    would have taken at its pace noted (edgefl.sim.processes `_send`)."""
    if not ci[i, ALIVE]:
        return
    now, phase, begin = gf[G_NOW], ci[i, PHASE], cf[i, BEGIN]
    ci[i, ALIVE] = 0
    ci[i, TOKEN] += 1
    ci[i, STATUS] = cause
    cf[i, STOP] = now
    gi[G_ALIVE] -= 1
    if not gi[G_NET] or not (phase == 0 or phase == 3):
        return
    link = 0 if phase == 0 else 1
    nbytes = cf[i, BYTES + link]
    if ci[i, SUB] == 1:  # in its latency: its bytes all sent
        cf[i, TRANSFER_S + link] = now - begin
        return
    if math.isinf(gf[LF * link + F_CAPACITY]):
        share = min((now - begin) * cf[i, BPS + link] / nbytes, 1.0) if nbytes > 0 else 1.0
    else:
        left = 0.0
        if ci[i, T_SERIAL + link] >= 0:  # (not through at this same instant)
            _advance(gf, gi, link, now)
            left = max(_left(cf, ci, gf, link, i), 0.0)
            _remove(cf, ci, gf, gi, link, i)
            _settle(cf, ci, gf, gi, heaps, link)
            _schedule(cf, ci, gf, gi, heaps, events, listeners, link)
        share = 1.0 - left / nbytes if nbytes > 0 else 1.0
    if share > 0 and now > begin:
        cf[i, TRANSFER_S + link] = (now - begin) / share


@njit(cache=True, nogil=True)  # a log is written meanwhile (edgefl.runlog `ParquetLog`)
def _play(cf, ci, capacity, net, start, target, deadline_s):  # type: ignore[no-untyped-def]
    """Play the round of `cf` and `ci`'s clients (`play_round`): their statuses, stops and transfer
    seconds in the arrays; the round's close returned."""
    n = cf.shape[0]
    gf = np.zeros(2 * LF + 2)
    gi = np.zeros(G, dtype=np.int64)
    for link in range(2):
        gf[LF * link + F_CAPACITY] = capacity[link]
        gf[LF * link + F_NOW] = start
        gf[LF * link + F_LEVEL] = INF
        gf[LF * link + F_WAKE_AT] = np.nan
        gi[LI * link + I_SLOT_SEQ] = -1
    gf[G_NOW] = gf[G_START] = start
    gi[G_ALIVE], gi[G_TARGET], gi[G_NET] = n, target, net
    ci[:, ALIVE] = 1
    ci[:, STATUS] = COMPLETED
    ci[:, W_DONE] = 1  # no watcher until its client has started
    ci[:, W_TOLD] = -1
    ci[:, T_SERIAL], ci[:, T_SERIAL + 1] = -1, -1
    cf[:, TRANSFER_S], cf[:, TRANSFER_S + 1] = np.nan, np.nan
    heaps = [[(0.0, 0, 0)] for _ in range(8)]
    for heap in heaps:
        heap.pop()
    events = [[(0.0, 0, 0, 0, 0, 0)] for _ in range(3)]  # a heap; this instant's urgent and normal ones
    for queue in events:
        queue.pop()
    listeners = np.zeros((2, 2 * n + 16, 2), dtype=np.int64)  # (client, its wait) by link, gi[G_HEARD]
    if math.isfinite(deadline_s):  # scheduled before the clients' first events (SimPy: created first)
        _event(gf, gi, events, start + deadline_s, CLOSE, LATE, 0)
    closes = start + deadline_s  # no interrupt for a device going offline once the round has closed
    for i in range(n):
        _phase(cf, ci, gf, gi, heaps, events, listeners, i, 0)
        end = closes
        if not net:
            end = min(end, start + cf[i, PHASES] + cf[i, PHASES + 1] + cf[i, PHASES + 2] + cf[i, PHASES + 3])
        if cf[i, OFF] < end:
            _event(gf, gi, events, start + (cf[i, OFF] - start), UNPLUG, i, 0)
        if ci[i, BATTERY]:
            ci[i, W_DONE] = 0
            _watch(cf, ci, gf, gi, events, listeners, i)
    closed = n == 0
    while not closed:
        source, (at, _, _, kind, a, b) = _pop(gf, gi, events)
        if source < 0:
            break
        gf[G_NOW] = at
        if kind == TIMEOUT:
            _timeout(cf, ci, gf, gi, heaps, events, listeners, a, b)
        elif kind == WAKE:
            _woken(cf, ci, gf, gi, heaps, events, listeners, a, b)
        elif kind == UNPLUG:
            _event(gf, gi, events, at, INTERRUPT, a, OFFLINE)
        elif kind == INTERRUPT:
            _interrupt(cf, ci, gf, gi, heaps, events, listeners, a, b)
        elif kind == WATCH:
            _timer(cf, ci, gf, gi, events, listeners, a, b)
        elif kind in (CHANGED, RATES):
            if ci[a, W_GEN] == b:
                if kind == CHANGED:
                    ci[a, W_BOUNDS] = 0
                _watch(cf, ci, gf, gi, events, listeners, a)
        else:
            closed = True
        if not gi[G_CLOSING] and (gi[G_ENOUGH] or gi[G_ALIVE] == 0):  # the round closes at this instant
            gi[G_CLOSING] = 1
            _event(gf, gi, events, gf[G_NOW], CLOSE, 0, 0)
    cause = DROPPED if gi[G_ENOUGH] else LATE
    for i in range(n):
        if ci[i, ALIVE]:
            _interrupt(cf, ci, gf, gi, heaps, events, listeners, i, cause)
    return gf[G_NOW]
