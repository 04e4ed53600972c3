"""Device clock offsets (backend/coordinator/core/offsets.py) against the true lead of a simulated clock:
the bounds always hold it, they narrow to the round trip, no single message moves them for good, a stepped
clock is followed, and the prior ±σ holds until the bounds say more."""
import math
import random

from backend.coordinator.core.coordinator import Coordinator
from backend.coordinator.core.offsets import JUMPED, Offsets
from backend.coordinator.protocols import make
from edge.core import codec
from edge.core.codec import CAP_MS


def exchange(o, rng, lead, t, down=True, delay=(0.05, 0.2)):
    """One uplink sent at true time ``t`` (and, with ``down``, a downlink it echoes); returns its arrival."""
    sent = t
    arrive = sent + rng.uniform(*delay)
    o.heard("d", sent + lead, arrive)
    if down:
        s = t - rng.uniform(*delay) - 0.01     # a downlink left at s, arrived before the device sent at t
        o.echoed("d", t + lead, s)
    return arrive


def test_the_bounds_always_hold_the_true_lead_and_narrow_to_the_round_trip():
    for seed in range(200):
        rng = random.Random(seed)
        sigma = rng.choice([0.0, 0.05, 0.3, 1.0])
        lead = rng.uniform(-2 * sigma - 0.5, 2 * sigma + 0.5)
        o = Offsets(sigma)
        t = 0.0
        for k in range(40):
            t += rng.uniform(0.1, 5.0)
            now = exchange(o, rng, lead, t, down=rng.random() < 0.3)
            lo, hi = o.measured("d", now)
            assert lo <= lead + 1e-9 and lead <= hi + 1e-9, (seed, k, lo, lead, hi)
            if o.highs.get("d"):
                blo, bhi = o.bounds("d", now)
                assert blo <= lead + 1e-9 <= bhi + 2e-9 or abs(lead) > sigma
        if o.highs.get("d") and len(o.lows["d"]) >= 10:
            lo, hi = o.measured("d", t + 1)
            assert hi - lo < 0.45, (seed, hi - lo)      # about the best up plus the best down delay


def test_no_sample_keeps_the_prior_and_an_offset_within_it_is_no_alarm():
    o = Offsets(0.1)
    assert o.bounds("d", 0.0) == (-0.1, 0.1) and not o.uncertain("d", 0.0)
    assert o.heard("d", 10.02, 10.0)                # 20 ms ahead, heard at once: fine
    lo, hi = o.bounds("d", 10.0)
    assert math.isclose(lo, 0.02) and hi == 0.1 and not o.uncertain("d", 10.0)
    assert o.stats["implausible"] == 0


def test_one_bogus_stamp_is_dropped_for_that_message_alone():
    o = Offsets(0.3)
    rng = random.Random(1)
    for k in range(10):
        exchange(o, rng, 0.1, 10.0 * k)
    before = o.bounds("d", 100.0)
    assert not o.heard("d", 100.0 + 3600.0, 100.0)          # an hour ahead: implausible, counted
    assert o.stats["implausible"] == 1 and o.bounds("d", 100.0) == before
    assert o.heard("d", 101.1, 101.05) and o.bounds("d", 101.05)[0] >= before[0]


def test_a_stepped_clock_is_followed_after_a_few_stamps_and_an_echo():
    o = Offsets(0.3)
    rng = random.Random(2)
    for k in range(10):
        exchange(o, rng, 0.0, 10.0 * k)
    lead = 5.0                                      # NTP stepped it 5 s ahead
    for k in range(JUMPED):
        ok = o.heard("d", 200.0 + k + lead, 200.05 + k)
        assert ok == (k == JUMPED - 1)
    assert o.stats["resets"] == 1 and o.uncertain("d", 203.0)       # no upper bound for it yet
    lo, hi = o.bounds("d", 203.0)
    assert lo <= lead <= hi
    o.echoed("d", 204.0 + lead, 203.9)
    lo, hi = o.bounds("d", 205.0)
    assert lo <= lead <= hi and hi - lo < 0.2 and not o.uncertain("d", 205.0)


def test_old_bounds_loosen_with_their_age():
    o = Offsets(1.0)
    o.heard("d", 10.0, 10.0)
    o.echoed("d", 10.0, 10.0)
    assert o.measured("d", 10.0) == (0.0, 0.0)
    lo, hi = o.measured("d", 10010.0)
    assert math.isclose(-lo, hi) and 0.1 < hi < 1.0


def test_a_clock_of_whole_ms_places_every_stamp_within_its_bounds():
    """Issue #30: a board's clock counts whole ms (``edge.runtime.clock``: it reads ⌊T + b⌋ at true time T), so
    the lead its stamps show wobbles by up to 1 ms. With a fast echo (the reply in the same ms as the downlink) the
    upper bound was that echo's lead, and a stamp taken in the first fraction of a later ms was placed after it was
    taken: live, a report 0.12 ms late made a MAX final answer miss the truth. Oracle: every stamp's true instant
    lies in [t - hi, t - lo] (its event time and hull end, ``integrity.event``/``cover``) for ms boards, and the
    bounds of an exact clock are its lead's."""
    floor_ms = lambda x: math.floor(x * 1000) / 1000
    for seed in range(300):
        rng = random.Random(seed)
        sigma = rng.choice([0.05, 0.1, 0.3])
        b = rng.uniform(-sigma, sigma)          # the clock reads ⌊T + b⌋: its lead wobbles in (b − 1 ms, b]
        clock = lambda T: floor_ms(T + b)
        o = Offsets(sigma)
        o.ticks = {"d": 0.001}                 # (what a birth saying CAP_MS sets)
        T = 100.0
        for k in range(30):
            T += rng.uniform(0.05, 2.0)
            if rng.random() < 0.4:             # an echo: the device stamps its reply to a downlink sent at T
                o.echoed("d", clock(T + rng.uniform(0.0, 0.0008)), T)
            o.heard("d", clock(T), T + rng.uniform(0.0, 0.0008))   # an uplink taken at T, heard at once
            for _ in range(20):                 # any stamp taken about now: placed within its bounds
                at = T + rng.uniform(-0.5, 0.5)
                lo, hi = o.bounds("d", T)
                assert clock(at) - hi <= at <= clock(at) - lo, (seed, k, at - (clock(at) - hi))
    exact = Offsets(0.1)
    exact.echoed("d", 5.0 + 0.02, 5.0)
    exact.heard("d", 6.0 + 0.02, 6.0)
    lo, hi = exact.bounds("d", 6.0)
    assert 0.0199 < lo <= 0.02 <= hi < 0.0201, (lo, hi)     # (no tick: an exact clock's bounds are its lead's)


def test_a_birth_says_whether_its_clock_counts_whole_ms():
    """The coordinator learns a device's tick from its birth (CAP_MS: integer ms): its reports' event times are
    placed a tick earlier and their hulls end a tick later than an exact clock's."""
    out = {}
    for caps, unit in ((CAP_MS, 1000), (0, 1)):
        c = Coordinator(make("adaptive"), period=10.0, latency=0.1, skew=0.05)
        c.handle_uplink(1.0, "d", codec.encode("birth", {"seq": 1, "t": unit, "boot": 1, "fw": "x", "caps": caps,
                                                         "first": 0, "sources": [{"name": "x", "epoch": 0,
                                                                                  "width": 1.0, "v": 1.0}]}))
        ig = c.integrity
        out[unit] = (ig.offsets.ticks["d"], ig.event("d", 2.0), ig.cover("d", 2.0))
    assert out[1000][0] == 0.001 and out[1][0] == 0.0
    assert math.isclose(out[1000][1], out[1][1] - 0.001) and math.isclose(out[1000][2], out[1][2] + 0.001), out


def test_measured_once_per_uplink_answers_as_a_fresh_computation_on_every_call():
    """The memo of ``measured`` (an uplink asks it some six times at one instant) against a recomputation from
    the bounds kept, bit for bit, after every kind of change: a lower bound, an echo, a reset, a stepped clock
    (implausible stamps in a row) and the contradiction ``bounds`` settles by dropping the older kind."""
    def fresh(o, device, now):
        lo = max([b - 2e-5 * (now - at) for at, b in o.lows.get(device, ())] or [-math.inf])
        hi = min([b + 2e-5 * (now - at) for at, b in o.highs.get(device, ())] or [math.inf])
        return lo, hi

    hits = 0
    for seed in range(100):
        rng = random.Random(seed)
        o = Offsets(rng.choice([0.0, 0.05, 0.3]))
        now = 0.0
        for _ in range(300):
            device = rng.choice("abc")
            now += rng.choice([0.0, 0.0, rng.uniform(0.001, 2.0)])
            op = rng.random()
            if op < 0.3:
                o.heard(device, now + rng.choice([0.0, rng.uniform(-0.5, 0.5), rng.uniform(1.0, 5.0)]), now)
            elif op < 0.45:
                o.echoed(device, now + rng.uniform(-1.0, 1.0), now - rng.uniform(0.0, 0.3))
            elif op < 0.5:
                o.reset(device)
            elif op < 0.75:
                o.bounds(device, now)
            for _ in range(3):
                want = fresh(o, device, now)
                hits += o.last is not None and o.last[:2] == (device, now)
                assert o.measured(device, now) == want, (seed, device, now)
                assert [(x).hex() for x in o.measured(device, now)] == [x.hex() for x in want]
    assert hits > 1000      # (the memo answered most repeated questions)
