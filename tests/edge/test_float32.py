"""Float32-safe device: integer-ms clock across tick wrap, no NTP, and the agent in emulated float32.

Portable (pytest and MicroPython). ``f32`` rounds every filter operation to float32 as a single-
precision board does; the clock is driven by a stand-in ``time`` whose ticks wrap at 2**30 ms.
"""
from edge.agent import Agent
from edge.core import codec
from edge.core.float32 import f32
from edge.runtime.clock import Clock, EPOCH_2000
from portable import PERIOD, Rng, Ticks, ctl, session


def test_clock_is_exact_integer_ms_across_tick_wrap_near_1_7e9():
    t = Ticks(1700000000, PERIOD - 5000)
    c = Clock(t)
    start = c()
    assert c.synced and start == 1700000000 * 1000 - 1 and isinstance(start, int)     # (a ms below: never ahead)
    for step in (1, 999, 4000, 7, PERIOD // 2 - 1, 12345):   # across the wrap, and a long stall
        t.ms += step
        start += step
        assert c() == start
    b = Ticks(1700000000 - EPOCH_2000, 0, epoch=2000)         # MicroPython's 2000 epoch
    assert Clock(b)() == 1700000000 * 1000 - 1


class _Board:
    """A board's ``time`` on a true clock in ns that moves on ``gap`` ns at every read: the wall clock exact
    (``time_ns``), ``ticks_ms`` the floor of a counter started ``phase`` ns into its ms."""

    def __init__(self, phase, gap):
        self.ns, self.phase, self.gap = 1700000000123456789, phase, gap

    def _read(self):
        self.ns += self.gap
        return self.ns

    def time_ns(self):
        return self._read()

    def ticks_ms(self):
        return ((self._read() - 1700000000000000000 + self.phase) // 1000000) % PERIOD

    def ticks_diff(self, a, b):
        return ((a - b + PERIOD // 2) % PERIOD) - PERIOD // 2

    def gmtime(self, t):
        return (1970, 1, 1, 0, 0, 0, 0, 1)


def test_a_synced_clock_never_leads_the_wall_clock():
    # oracle: the true time at each read. Started at the wall clock as read, the floors of the wall and of the
    # ticks put a count up to a ms ahead (the unix port's led by up to 0.907 ms; at σ = 0 a stamp ahead of its
    # arrival is clock skew): every phase of the ticks against the wall, reads 0-0.6 ms apart, 40 reads each
    worst = 0
    for phase in range(0, 1000000, 31250):
        for gap in (0, 1000, 250000, 600000):
            b = _Board(phase, gap)
            c = Clock(b)
            for _ in range(40):
                got = c()
                true = b.ns // 1000000      # (after the read: the stamp is of no later instant)
                assert got <= true, (phase, gap, got, true)
                worst = max(worst, true - got)
    assert worst <= 3, worst        # and never far behind


def test_board_without_clock_starts_unsynced_at_zero():
    t = Ticks(3, 123)                   # no RTC, no NTP: a few seconds after 1970 (or 2000)
    c = Clock(t)
    assert not c.synced and c() == 0
    t.ms += 1500
    assert c() == 1500


def _config(a, seq, now_ms, tick, period=10000, shrink=0.5):
    return ctl(a, "config", seq=seq, period=period, shrink=shrink, beat=0, t0=0, now=now_ms, tick=tick)


def test_unsynced_board_takes_backend_time_and_shrinks_at_its_instants():
    backend = 1700000000000                     # ms
    a = Agent("d", ["x"], width=8.0, unit=1000, synced=False, rnd=f32)
    local = 40                                  # the board's own clock: ticks since boot
    a.start(local)
    a.handle_sample(local, "x", 20.0)
    tick = backend // 10000
    a.handle_message(local, _config(a, 1, backend, tick))
    assert a.offset == backend - local and a.period == tick
    due = a.next_deadline()                     # in the board's own clock
    assert isinstance(due, int) and due + a.offset == (tick + 1) * 10000
    a.handle_sample(due - 1, "x", 22.5)         # inside [16, 24]: quiet
    out = a.handle_timer(due)                   # width 4: [18, 22] excludes 22.5
    k, m = codec.decode(out[0][1])
    assert (k, m["why"], m["t"]) == ("report", codec.WHY_SHRINK, float((tick + 1) * 10000))
    out = a.handle_sample(due + 3, "x", 30.0)
    assert codec.decode(out[0][1])[1]["t"] == float((tick + 1) * 10000 + 3)   # exact ms at 1.7e12
    assert a.stamp(due + 3) == "%d.003" % ((tick + 1) * 10)


def test_synced_board_keeps_its_clock_and_counts_the_backends_periods():
    a = Agent("d", ["x"], width=8.0, unit=1000, synced=True, rnd=f32)
    now = 1700000004321
    session(a, now=now, seq=1, period=10000, shrink=0.5, clock=now - 250, tick=170000000)
    assert a.offset == 0 and a.period == 170000000       # not recomputed from the board's wall clock
    assert a.next_deadline() == 1700000010000


def test_float_seconds_agent_runs_the_same_code():
    a = Agent("d", ["x"], width=8.0)
    session(a, period=10000, shrink=0.5)
    a.handle_sample(0.5, "x", 0.0)
    a.handle_sample(1.0, "x", 3.0)
    assert a.next_deadline() == 10.0
    k, m = codec.decode(a.handle_timer(10.0)[0][1])
    assert (m["why"], m["t"]) == (codec.WHY_SHRINK, 10.0)


def test_emulated_float32_rounds_readings_and_widths_like_a_board():
    a = Agent("d", ["x"], width=0.1, unit=1000, rnd=f32)
    assert a.caps & codec.CAP_F32 and a.caps & codec.CAP_MS
    a.handle_sample(0, "x", 0.1)
    f = a.filters[0]
    assert a.values[0] == f32(0.1) and f.width == f32(0.1) and f.lo == f32(f32(0.1) - f32(0.1) / 2)
    assert a.handle_sample(1, "x", 1e300) == [] and a.stats["bad_samples"] == 1   # overflows a float32


def test_long_run_no_ntp_tick_wrap_float32_reports_follow_the_backend_clock():
    r = Rng(3)
    t = Ticks(0, PERIOD - 20000)
    clock = Clock(t)
    a = Agent("d", ["x", "y"], width=2.0, unit=1000, synced=clock.synced, rnd=f32)
    backend = 1700000000000 + 777
    a.start(clock())
    a.handle_message(clock(), _config(a, 1, backend, backend // 1000, period=1000, shrink=0.05))
    vals = [100.0, -5.0]
    last_t = 0
    for step in range(3000):
        dt = 1 + r.below(900)
        t.ms += dt
        backend += dt
        now = clock()
        out = a.handle_timer(now) if a.next_deadline() <= now else []
        i = r.below(2)
        vals[i] += r.uniform(-0.3, 0.3)
        out += a.handle_sample(now, i, vals[i])
        for _, p in out:
            m = codec.decode(p)[1]
            assert m["t"] == int(m["t"]) and abs(m["t"] - backend) <= 1000   # exact ms, on the backend's clock
            assert m["t"] >= last_t
            last_t = m["t"]
    assert a.period >= backend // 1000 - 1


def test_backend_changes_period_and_shrink_online_by_a_config():
    a = Agent("d", ["x"], width=8.0, unit=1000)
    session(a, now=55000, period=10000, shrink=0.5, tick=5)
    assert a.next_deadline() == 60000
    a.handle_sample(55000, "x", 0.0)
    # the backend moves to T = 4 s from its tick at 58 s (a new origin, counting from 0), S = 0.25
    a.handle_message(58500, ctl(a, "config", seq=2, period=4000, shrink=0.25, beat=0, t0=58000, now=0, tick=0))
    assert (a.period, a.next_deadline()) == (0, 62000)
    a.handle_timer(62000)
    assert a.filters[0].width == 6.0 and a.period == 1
    a.handle_message(62100, ctl(a, "config", seq=3, period=4000, shrink=0.25, beat=0, t0=58000, now=0, tick=0))
    assert a.period == 1                    # a late copy of the same schedule never repeats a shrink


def test_a_clock_far_ahead_of_the_schedule_jumps_to_width_zero_not_a_million_shrinks():
    a = Agent("d", ["x"], width=8.0, unit=1000)
    session(a, now=1700000000000, period=1000, shrink=0.1, t0=0, tick=0)    # a backend that sent tick 0
    a.handle_sample(1700000000000, "x", 1.0)
    a.handle_sample(1700000000001, "x", 1.5)
    out = a.handle_timer(1700000000001)
    assert a.period == 1700000000 and a.filters[0].width == 0.0
    assert len(out) <= 64 and a.next_deadline() == 1700000001000
    assert a.handle_sample(1700000000002, "x", 1.5000001) != []      # width 0: every change is reported
