"""Device clock in integer milliseconds (DESIGN.md §2: float32-safe time on a board).

``ticks_ms`` differences (``ticks_diff`` handles the wrap, 2**30 ms on most ports) are added to an
integer count of milliseconds: nothing is ever added to a large float. The count starts at the wall
clock when the board has one (NTP or an RTC: later than 2017, MicroPython's 2000 epoch accounted
for), read before the ticks and less one ms, so it never leads the wall clock: the floors of the two
reads put it up to a ms ahead (0.907 ms measured under the unix port), and a stamp ahead of its arrival
reads as clock skew where the backend takes clocks as exact (σ = 0). Otherwise it starts at 0, unsynced,
and the agent takes the backend's time from its config.
Portable: ``time`` is the interpreter's module or a stand-in with the same four functions.
"""
EPOCH_2000 = 946684800          # seconds from 1970 to 2000, the epoch of MicroPython's embedded ports
SET_AFTER = 1500000000          # a wall clock earlier than 2017 was never set


def wall_ms(time):
    """Unix time in integer ms from ``time`` (``time_ns`` where there is one), or None when unset."""
    if hasattr(time, "time_ns"):
        ms = time.time_ns() // 1000000
    else:
        ms = int(time.time()) * 1000
    if time.gmtime(0)[0] == 2000:
        ms += EPOCH_2000 * 1000
    return ms if ms >= SET_AFTER * 1000 else None


class Clock:
    def __init__(self, time):
        self.time = time
        ms = wall_ms(time)
        self.last = time.ticks_ms()
        self.synced = ms is not None
        self.ms = ms - 1 if self.synced else 0

    def __call__(self):
        t = self.time.ticks_ms()
        self.ms += self.time.ticks_diff(t, self.last)
        self.last = t
        return self.ms
