"""Helpers for tests that run under both CPython (pytest) and MicroPython (mp_runner)."""
import sys

MICROPYTHON = sys.implementation.name == "micropython"


def raises(exc, fn, *args):
    """Assert that ``fn(*args)`` raises ``exc``; return the exception."""
    try:
        fn(*args)
    except exc as e:
        return e
    raise AssertionError("%s not raised" % exc.__name__)


class Rng:
    """Deterministic xorshift32 generator: the same stream on both interpreters."""

    def __init__(self, seed):
        self.s = (seed * 2654435761 + 1) & 0xFFFFFFFF or 1

    def u32(self):
        s = self.s
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        self.s = s
        return s

    def random(self):
        return self.u32() / 4294967296.0

    def uniform(self, a, b):
        return a + (b - a) * self.random()

    def below(self, n):
        return self.u32() % n

    def choice(self, seq):
        return seq[self.below(len(seq))]


INC = 7     # backend incarnation used by the tests' control messages


def ctl(agent, kind, **fields):
    """A control message addressed to ``agent``'s latest birth, from backend run INC."""
    from edge.core import codec
    fields.setdefault("inc", INC)
    fields.setdefault("to", agent.token)
    return codec.encode(kind, fields)


def session(agent, now=0.0, seq=1, period=0, shrink=0.0, beat=0, t0=0, clock=0, tick=0):
    """Birth plus a config (times in integer ms): afterwards ``ctl`` messages reach the agent."""
    out = agent.start(now)
    out += agent.handle_message(now, ctl(agent, "config", seq=seq, period=period, shrink=shrink, beat=beat,
                                         t0=t0, now=clock, tick=tick))
    return out


PERIOD = 1 << 30        # ticks_ms wraps here on most MicroPython ports


class Ticks:
    """A board's ``time`` module: ``ticks_ms`` wrapping at 2**30 and a wall clock in seconds that may
    be unset (near 0); ``ms`` is the true elapsed time, advanced by the test."""

    def __init__(self, wall_s, start_ticks, epoch=1970):
        self.ms = start_ticks
        self.wall_s = wall_s
        self.epoch = epoch

    def ticks_ms(self):
        return self.ms % PERIOD

    def ticks_diff(self, a, b):
        return ((a - b + PERIOD // 2) % PERIOD) - PERIOD // 2

    def time(self):
        return self.wall_s

    def gmtime(self, t):
        return (self.epoch, 1, 1, 0, 0, 0, 0, 1)
