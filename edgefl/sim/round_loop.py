"""The compiled event loop of a living fleet's sync or deadline round (edgefl.sim.living_round,
which says what it plays and how it is tested): a link's water-filling (edgefl.sim.links; the
reference's `Sharing`, tests/simpy_clients.py) on arrays, and
the round's clients, their meters and battery watchers (the reference's `Meter`, `_watch`:
tests/simpy_clients.py), compiled by Numba; with `Stream`, an async run's clients, which start and
end one by one (edgefl.sim.fedbuff). `ready` loads the compiled loop from Numba's cache, or compiles it
first where the cache does not hold it (a minute or more, once: said in one line, and stopped at once by
SIGTERM or Ctrl-C)."""

from __future__ import annotations

import heapq
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from edgefl.sim.clients import COMPLETED, DROPPED, LATE, OFFLINE, Drains, Transfers

DONE_S = 1e-9  # a transfer with at most this many seconds of bytes left is through (float rounding)
BOUNDS = 8  # a shared transfer's lower bounds on the empty moment before following its every pace (`_watch`)

INF = math.inf

# the event kinds; SimPy's priorities (an interrupt goes before the other events of its instant)
TIMEOUT, WAKE, UNPLUG, WATCH, CLOSE, INTERRUPT, CHANGED, RATES, START, ENDED, TIMER, CUT = range(12)
URGENT, NORMAL = range(2)
LOW, HIGH, CAPPED_ENDS, SHARED_ENDS = range(4)  # a link's heaps (4 x link + one of these)

# The loop's state is five arrays and two lists (few objects: each is reference-counted at every
# call). cf, ci: a row per client, its inputs (`play_round`'s columns) and its state: its phase
# and transfer, its battery's meter (tests/simpy_clients.py `Meter`) and watcher (`_watch`), its
# place on each link's Sharing; gf, gi: each link's Sharing and its wake-up (LF floats, LI ints a
# link) and the round's; heaps: each link's four heaps; events: the events due (`_pop`); listeners (an
# array): each link's watchers that follow its rates.
(PHASES, OFF, BYTES, BPS, LATENCY, HELD, WATTS, SPREAD, PER_BYTE, FROM, UNTIL, BEGIN, STOP, M_BASE, M_SINCE,
 M_WATTS, M_LUMP, M_END, W_AT, TRANSFER_S, T_CAP, T_KEY, START_S) = (
    0, 4, 5, 7, 9, 10, 11, 15, 19, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 33, 35, 37)
CF = 38  # cf's columns; BYTES, BPS, PER_BYTE, TRANSFER_S, T_CAP and T_KEY are two, by link
INPUTS = BEGIN  # cf's first columns, a client's inputs: `Stream.start` writes them
(ALIVE, STATUS, PHASE, SUB, TOKEN, M_PHASE, M_LINK, M_PROG, W_BOUNDS, W_GEN, W_DONE, W_EXACT, W_TOLD, BATTERY,
 T_CAPPED, T_SERIAL, OUT, RUN) = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16, 18, 19)
CI = 20  # ci's columns; T_CAPPED and T_SERIAL are two, by link; RUN: the row's client, counted
F_CAPACITY, F_NOW, F_V, F_LEVEL, F_CSUM, F_WAKE_AT, F_SLOT_AT = range(7)  # gf[LF x link + one of these]
LF = 7
I_SHARED, I_COUNT, I_SERIAL, I_WAKE, I_SLOT_SEQ = range(5)  # gi[LI x link + one of these]
LI = 5
G_NOW = 2 * LF  # gf's last: the clock
G_COUNTED, G_ALIVE, G_ENOUGH, G_SEQ, G_TARGET, G_NET, G_CLOSING, G_HEARD = range(2 * LI, 2 * LI + 8)
G_HEADS = 2 * LI + 9  # two: the queues' heads
G_STREAM = 2 * LI + 11  # clients come and go (`Stream`), instead of a round's all starting at once
G = 2 * LI + 12  # gi's length: G_HEARD and G_HEADS are two


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
    gf, gi = _clock(start, net, False)
    ready()
    next(_loop(cf, ci, gf, gi, np.array(capacity, dtype=np.float64), int(target), float(deadline_s),
               np.zeros(1, dtype=np.int64), np.zeros(1)))
    return ci[:, STATUS].copy(), cf[:, STOP].copy(), cf[:, TRANSFER_S:TRANSFER_S + 2].copy(), float(gf[G_NOW])


def _clock(now: float, net: bool, stream: bool) -> tuple[np.ndarray, np.ndarray]:
    """The loop's state of its links and its own (gf, gi) at `now`."""
    gf, gi = np.zeros(2 * LF + 1), np.zeros(G, dtype=np.int64)
    gf[G_NOW], gi[G_NET], gi[G_STREAM] = now, net, stream
    return gf, gi


PREPARING = "edgefl: preparing the round engine, once: a minute or more"
_COMPILE = ("import sys; sys.path.insert(0, sys.argv[1]); from edgefl.sim import round_loop; "
            "round_loop._loop.compile(round_loop.signature())")


def ready() -> None:
    """The loop compiled in this process. Numba's cache holds it once compiled (a fraction of a second
    to load); a cold cache (a fresh install, this file edited) compiles it first: a minute or more in
    LLVM, said in one line, in a child process. SIGTERM or Ctrl-C met in LLVM would reach Python in a
    ctypes callback of llvmlite, which prints it and compiles on; this process, waiting on the child,
    stops at once instead (the child killed, nothing cached)."""
    sig = signature()
    if sig in _loop.overloads:
        return
    if _loop._cache.load_overload(sig, _loop.targetctx) is None:  # type: ignore[attr-defined]  # compile's check
        # the child started before the line: a signal after the line finds it to kill (one met while
        # Popen starts it would leave it compiling on); this edgefl's, whatever the current folder holds
        command = [sys.executable, "-P", "-c", _COMPILE, str(Path(__file__).resolve().parents[2])]
        with subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) as child:
            try:  # the line inside: a signal met right after it (before the wait) also kills the child
                print(PREPARING, file=sys.stderr, flush=True)
                child.wait()
            except BaseException:
                child.kill()
                raise
    _loop.compile(sig)  # from the cache the child wrote (compiled here where it wrote none)


def signature() -> tuple[Any, ...]:
    """The loop's argument types as `play` and `Stream` call it."""
    return tuple(_loop.typeof_pyval(a) for a in (np.zeros((1, CF)), np.zeros((1, CI), dtype=np.int64),
                                                  *_clock(0.0, False, False), np.zeros(2), 1, INF,
                                                  np.zeros(1, dtype=np.int64), np.zeros(1)))


class Stream:
    """Clients that start when the caller says and run until they end, each in a row of its own
    (an async run's slots, edgefl.sim.fedbuff `Buffered`), played by the round's loop: `start` a
    client in a row, or a `timer`, then `step` to the next client that ends or timer that fires."""

    def __init__(self, rows: int, capacity: tuple[float, float], net: bool, now: float) -> None:
        self.cf, self.ci = np.zeros((rows, CF)), np.zeros((rows, CI), dtype=np.int64)
        self.gf, gi = _clock(now, net, True)
        orders = 2 * rows + 3  # at most, between two steps: a start or timer a row, the server's, a cut a row
        self.mail, self.delays = np.zeros(2 * orders + 1, dtype=np.int64), np.zeros(orders)
        ready()
        self._steps = _loop(self.cf, self.ci, self.gf, gi, np.array(capacity, dtype=np.float64), rows + 1,
                            INF, self.mail, self.delays)

    @property
    def now(self) -> float:
        return float(self.gf[G_NOW])

    def start(self, row: int, inputs: list[float], battery: bool) -> None:
        """A client starts in `row` now: its phases (4), offline moment, bytes (2), bandwidths (2),
        latency, and its battery's (`Drain`: held, watts (4), spread (4), per byte (2), from, until),
        followed where `battery`."""
        self.cf[row, :INPUTS] = inputs
        self.cf[row, TRANSFER_S:TRANSFER_S + 2] = np.nan  # none through yet (`ended` before it plays)
        self.ci[row, BATTERY] = battery
        self._order(START, row, 0.0)

    def cut(self, row: int) -> None:
        """The row's client, if still working, stops now as a round's close stops those still working
        (`_interrupt`: a transfer under way notes the seconds it would take at its pace), its status
        completed; played at the next `step`, whose report (its end) the caller need not hear."""
        self._order(CUT, row, 0.0)

    def timer(self, delay_s: float, key: int) -> None:
        """A timer that fires `delay_s` from now (`step` gives TIMER, key)."""
        self._order(TIMER, key, delay_s)

    def _order(self, kind: int, arg: int, delay_s: float) -> None:
        j = int(self.mail[0])
        self.mail[1 + 2 * j], self.mail[2 + 2 * j], self.delays[j] = kind, arg, delay_s
        self.mail[0] = j + 1

    def step(self) -> tuple[bool, int] | None:
        """Play on to the next report: (True, row) where the row's client ended, (False, key) where
        the timer `key` fired; None where nothing is left to play."""
        kind, arg = next(self._steps)
        return None if kind < 0 else (kind == ENDED, int(arg))

    def ended(self, row: int) -> tuple[int, float, float, float]:
        """The row's client's status, stop, and its transfers' seconds (download, upload; NaN: not
        through)."""
        cf = self.cf[row]
        return int(self.ci[row, STATUS]), float(cf[STOP]), float(cf[TRANSFER_S]), float(cf[TRANSFER_S + 1])


# --- a link's water-filling (the reference's Sharing), its transfers named by client --------------
# Compiled with no CPython wrapper: only the loop (`_loop`) is called from Python, and a wrapper
# cannot take the lists of lists it passes on. Every function but the four largest (`_settle`,
# `_schedule`, `_interrupt`, `_begin`, each called from several places) is inlined (Numba's IR
# inlining): a call passes seven arrays and lists. At 100,000 devices a living-digits round plays
# 16-18 % faster than with none inlined; the first compile takes 43-48 s (72 s with `_begin`
# inlined too, for no gain measured), once per machine (Numba's cache); inlining all would make a
# round 24 % faster than none, for a first compile of 4 minutes.
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
    priority = URGENT if kind in (INTERRUPT, START, CUT) else NORMAL
    item = (at, priority, gi[G_SEQ], kind, a, b)
    if at == gf[G_NOW]:
        events[1 + priority].append(item)
    else:
        heapq.heappush(events[0], item)
    gi[G_SEQ] += 1


@_inlined
def _kill(ci, gf, gi, events, i, cause):  # type: ignore[no-untyped-def]
    """Client i is interrupted now, with status `cause` (SimPy's Interruption: urgent; it names the
    row's client, so a row taken by the next one is not stopped by the interrupt of the last)."""
    _event(gf, gi, events, gf[G_NOW], INTERRUPT, i, cause + 4 * ci[i, RUN])


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
    """Work out client i's empty moment afresh and wait for it (tests/simpy_clients.py `_watch`)."""
    if not ci[i, ALIVE] or ci[i, W_DONE]:
        return
    now = gf[G_NOW]
    listening = ci[i, W_BOUNDS] >= BOUNDS
    on = ci[i, M_LINK] >= 0
    exact = not on or listening
    at = _moment(cf, ci, gf, i, exact)
    plugged = cf[i, START_S] + cf[i, UNTIL]
    ci[i, W_GEN] += 1
    if at <= now:
        ci[i, W_DONE] = 1
        if at < plugged:
            _kill(ci, gf, gi, events, i, OFFLINE)
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
    if cf[i, W_AT] < cf[i, START_S] + cf[i, UNTIL]:
        _kill(ci, gf, gi, events, i, OFFLINE)


@_inlined
def _moment(cf, ci, gf, i, exact):  # type: ignore[no-untyped-def]
    """When client i's battery is empty, spending from now at its pace now (`exact`; else at its
    most costly), moved into its window (not before `from_s`, not after its plugging in)."""
    now = gf[G_NOW]
    left = cf[i, HELD] - _spent(cf, ci, gf, i, now)
    rate = _pace(cf, ci, gf, i, now, not exact)
    eta = 0.0 if left <= 0 else (left / rate if rate > 0 else INF)
    return min(max(now + eta, cf[i, START_S] + cf[i, FROM]), cf[i, START_S] + cf[i, UNTIL])


@_compiled
def _schedule(cf, ci, gf, gi, heaps, events, listeners, link):  # type: ignore[no-untyped-def]
    """The reference's SharedLink._schedule: the transfers through end, the next wake-up is set,
    and the watchers following the link's rates, once this step is done, work their moments out
    afresh. A watcher
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
    return min(max(now + eta, cf[i, START_S] + cf[i, FROM]), cf[i, START_S] + cf[i, UNTIL])


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
        if gi[G_STREAM]:  # its process ends: its slot hears of it once this step is done
            _event(gf, gi, events, now, ENDED, i, 0)
        elif gi[G_COUNTED] >= gi[G_TARGET]:  # beyond the target: not needed
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
    """Client i stops now with status `cause`; a transfer under way leaves its link (`_cut`)."""
    if not ci[i, ALIVE]:
        return
    ci[i, ALIVE] = 0
    ci[i, TOKEN] += 1
    ci[i, STATUS] = cause
    cf[i, STOP] = gf[G_NOW]
    gi[G_ALIVE] -= 1
    if gi[G_NET] and (ci[i, PHASE] == 0 or ci[i, PHASE] == 3):
        _cut(cf, ci, gf, gi, heaps, events, listeners, i)
    if gi[G_STREAM]:
        _event(gf, gi, events, gf[G_NOW], ENDED, i, 0)


@_inlined
def _cut(cf, ci, gf, gi, heaps, events, listeners, i):  # type: ignore[no-untyped-def]
    """Client i's transfer stopped now: it leaves its link, the seconds it would have taken at its
    pace noted (tests/simpy_clients.py `_send`)."""
    now, begin, link = gf[G_NOW], cf[i, BEGIN], 0 if ci[i, PHASE] == 0 else 1
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


@_compiled
def _begin(cf, ci, gf, gi, heaps, events, listeners, i, closes):  # type: ignore[no-untyped-def]
    """Client i (its inputs in its row) starts its work now: its process, the interrupt of its
    device going offline before it would finish or the round `closes`, and its battery's watcher
    (tests/simpy_clients.py `start_client`)."""
    now = gf[G_NOW]
    ci[i, ALIVE], ci[i, STATUS], ci[i, RUN] = 1, COMPLETED, ci[i, RUN] + 1
    ci[i, TOKEN] += 1  # the last client's events in this row are void
    ci[i, W_GEN] += 1
    ci[i, W_DONE], ci[i, W_TOLD], ci[i, W_BOUNDS] = 1, -1, 0  # no watcher until it has started
    ci[i, T_SERIAL], ci[i, T_SERIAL + 1], ci[i, M_LINK], ci[i, M_PROG] = -1, -1, -1, 0
    cf[i, BEGIN:] = 0.0
    cf[i, TRANSFER_S], cf[i, TRANSFER_S + 1], cf[i, START_S] = np.nan, np.nan, now
    gi[G_ALIVE] += 1
    _phase(cf, ci, gf, gi, heaps, events, listeners, i, 0)
    end = closes
    if not gi[G_NET]:
        end = min(end, now + cf[i, PHASES] + cf[i, PHASES + 1] + cf[i, PHASES + 2] + cf[i, PHASES + 3])
    if cf[i, OFF] < end:
        _event(gf, gi, events, now + (cf[i, OFF] - now), UNPLUG, i, ci[i, RUN])
    if ci[i, BATTERY]:
        ci[i, W_DONE] = 0
        _watch(cf, ci, gf, gi, events, listeners, i)


@_inlined
def _mail(gf, gi, events, mail, delays):  # type: ignore[no-untyped-def]
    """`Stream`'s orders since the last step, in order: a client to start (its process: urgent) or
    to stop (its interrupt: urgent, `Stream.cut`), a timer (a slot's or the server's) to fire after
    its delay."""
    for j in range(mail[0]):
        kind, arg = mail[1 + 2 * j], mail[2 + 2 * j]
        _event(gf, gi, events, gf[G_NOW] + (delays[j] if kind == TIMER else 0.0), kind, arg, 0)
    mail[0] = 0


@njit(cache=True, nogil=True)  # a log is written meanwhile (edgefl.runlog `ParquetLog`)
def _loop(cf, ci, gf, gi, capacity, target, deadline_s, mail, delays):  # type: ignore[no-untyped-def]
    """Play the clients of `cf` and `ci` from gf's clock: a round's (all start now; yields once,
    when it has closed: at gf's clock, their statuses, stops and transfer seconds in the arrays), or
    with gi[G_STREAM] those `mail` starts (yields (ENDED, row) when one ends, (TIMER, key) when a
    timer fires, (-1, 0) when nothing is left to play, and reads `mail` when resumed)."""
    n, start = cf.shape[0], gf[G_NOW]
    for link in range(2):
        gf[LF * link + F_CAPACITY] = capacity[link]
        gf[LF * link + F_NOW] = start
        gf[LF * link + F_LEVEL] = INF
        gf[LF * link + F_WAKE_AT] = np.nan
        gi[LI * link + I_SLOT_SEQ] = -1
    gi[G_TARGET] = target
    heaps = [[(0.0, 0, 0)] for _ in range(8)]
    for heap in heaps:
        heap.pop()
    events = [[(0.0, 0, 0, 0, 0, 0)] for _ in range(3)]  # a heap; this instant's urgent and normal ones
    for queue in events:
        queue.pop()
    listeners = np.zeros((2, 2 * n + 16, 2), dtype=np.int64)  # (client, its wait) by link, gi[G_HEARD]
    if math.isfinite(deadline_s):  # scheduled before the clients' first events (SimPy: created first)
        _event(gf, gi, events, start + deadline_s, CLOSE, LATE, 0)
    stream = gi[G_STREAM]
    if not stream:
        for i in range(n):
            _begin(cf, ci, gf, gi, heaps, events, listeners, i, start + deadline_s)
    closed = n == 0 and not stream
    _mail(gf, gi, events, mail, delays)
    while not closed:
        source, (at, _, _, kind, a, b) = _pop(gf, gi, events)
        if source < 0:
            if not stream:
                break
            yield -1, 0
            _mail(gf, gi, events, mail, delays)
            continue
        gf[G_NOW] = at
        if kind == TIMEOUT:
            _timeout(cf, ci, gf, gi, heaps, events, listeners, a, b)
        elif kind == WAKE:
            _woken(cf, ci, gf, gi, heaps, events, listeners, a, b)
        elif kind == UNPLUG:
            if ci[a, RUN] == b:
                _kill(ci, gf, gi, events, a, OFFLINE)
        elif kind == INTERRUPT:
            if ci[a, RUN] == b // 4:
                _interrupt(cf, ci, gf, gi, heaps, events, listeners, a, b % 4)
        elif kind == WATCH:
            _timer(cf, ci, gf, gi, events, listeners, a, b)
        elif kind in (CHANGED, RATES):
            if ci[a, W_GEN] == b:
                if kind == CHANGED:
                    ci[a, W_BOUNDS] = 0
                _watch(cf, ci, gf, gi, events, listeners, a)
        elif kind == START:
            _begin(cf, ci, gf, gi, heaps, events, listeners, a, INF)
        elif kind == CUT:  # the row's client, whichever it is now (one ordered since started)
            _interrupt(cf, ci, gf, gi, heaps, events, listeners, a, COMPLETED)
        elif kind in (ENDED, TIMER):
            yield kind, a
            _mail(gf, gi, events, mail, delays)
        else:
            closed = True
        if not stream and not gi[G_CLOSING] and (gi[G_ENOUGH] or gi[G_ALIVE] == 0):  # it closes now
            gi[G_CLOSING] = 1
            _event(gf, gi, events, gf[G_NOW], CLOSE, 0, 0)
    cause = DROPPED if gi[G_ENOUGH] else LATE
    for i in range(n):
        if ci[i, ALIVE]:
            _interrupt(cf, ci, gf, gi, heaps, events, listeners, i, cause)
    yield -1, 0
