"""Device clock offsets (backend/coordinator/core/offsets.py) against the true lead of a simulated clock:
the bounds always hold it, they narrow to the round trip, no single message moves them for good, a stepped
clock is followed, and the prior ±σ holds until the bounds say more."""
import math
import random

from backend.coordinator.core.offsets import JUMPED, Offsets


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
