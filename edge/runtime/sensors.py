"""Portable sensor inputs for the live runtimes (DESIGN.md §7): seeded random walk and CSV replay.

An input has ``next_time()`` (device time of its next reading, or None when exhausted) and
``poll(now)`` (the ``(source, value)`` readings due by ``now``). Runs on MicroPython and CPython;
the walk uses its own xorshift32 so a seed gives the same stream on both interpreters. Times are in
the runtime's clock units: ``unit`` 1 (float seconds) or 1000 (integer milliseconds, a board).
"""


def span(seconds, unit):
    """A duration in clock units: integer milliseconds when ``unit`` is 1000."""
    return seconds if unit == 1 else int(seconds * unit + 0.5)


class Periodic:
    """A reading of ``source`` every ``period`` seconds from ``t0``; subclasses supply ``read(now)``
    (None skips). After a stall the missed ticks are skipped and the grid is kept."""

    def __init__(self, source, t0, period):
        self.source = source
        self.period = period
        self.t = t0

    def next_time(self):
        return self.t

    def poll(self, now):
        if now < self.t:
            return ()
        self.t += self.period
        if self.t <= now:
            self.t += ((now - self.t) // self.period + 1) * self.period
        v = self.read(now)
        return () if v is None else ((self.source, v),)


class RandomWalk(Periodic):
    """One source stepping uniformly in [-step, step] every ``period`` seconds from ``start``."""

    def __init__(self, source, t0, period, start=0.0, step=1.0, seed=1):
        Periodic.__init__(self, source, t0, period)
        self.value = float(start)
        self.step = step
        self.s = (seed * 2654435761 + 1) & 0xFFFFFFFF or 1

    def _uniform(self):
        s = self.s
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        self.s = s
        return s / 4294967296.0

    def read(self, now):
        self.value += (2 * self._uniform() - 1) * self.step
        return self.value


class CsvReplay:
    """Rows ``time,source,value`` of a trace, replayed relative to ``t0`` at ``speed``× real time.

    Only rows of ``sources`` are kept (None keeps all); a header line and blank lines are skipped.
    The file is read one line at a time so a long trace costs no memory.
    """

    def __init__(self, path, t0, speed=1.0, sources=None, unit=1):
        self.f = open(path)
        self.t0 = t0
        self.unit = unit
        self.speed = speed
        self.sources = sources
        self.base = None
        self.row = None
        self._advance()

    def _advance(self):
        self.row = None
        while self.row is None:
            line = self.f.readline()
            if not line:
                self.f.close()
                return
            parts = line.strip().split(",")
            if len(parts) != 3:
                continue
            try:
                t = float(parts[0])
                v = float(parts[2])
            except ValueError:
                continue                 # header or a malformed line
            if self.sources is not None and parts[1] not in self.sources:
                continue
            if self.base is None:
                self.base = t
            self.row = (self.t0 + span((t - self.base) / self.speed, self.unit), parts[1], v)

    def next_time(self):
        return None if self.row is None else self.row[0]

    def poll(self, now):
        out = []
        while self.row is not None and self.row[0] <= now:
            out.append((self.row[1], self.row[2]))
            self._advance()
        return out


def make_inputs(specs, sources, t0, period, unit=1):
    """Inputs for ``{source: spec}`` where spec ``kind`` is ``walk`` or ``csv``; csv files are shared;
    ``t0`` is in clock units, ``period`` (and a spec's) in seconds.

    Returns ``(inputs, unknown)``: the built inputs and the ``(source, spec)`` pairs of other kinds,
    which a runtime may build itself (serial ports, user functions).
    """
    inputs = []
    csvs = {}
    unknown = []
    for name in sources:
        spec = specs[name]
        kind = spec.get("kind", "walk")
        if kind == "walk":
            inputs.append(RandomWalk(name, t0, span(spec.get("period", period), unit), spec.get("start", 0.0),
                                     spec.get("step", 1.0), spec.get("seed", 1)))
        elif kind == "csv":
            key = (spec["path"], spec.get("speed", 1.0))
            if key not in csvs:
                csvs[key] = []
            csvs[key].append(name)
        else:
            unknown.append((name, spec))
    for key in csvs:
        inputs.append(CsvReplay(key[0], t0, key[1], csvs[key], unit))
    return inputs, unknown
