"""Device-side meter of plain deadband (Olston et al. 2003 §1.2 uniform allocation, our no-regret guard): a shadow per moved source.

A metered device (birth capability CAP_METER) counts, per source, the reports the plain ``deadband``
protocol would have made it send on the same readings: its uniform width and range constraints, a
constant filter (the baseline users compare with: no model chooser). The backend flags METER exactly the
controls that install deadband's filter. While a source's real filter is deadband's (a *twin*: it never
got anything else since the meter began, or was synced back), its reports are deadband's and count as
they go. A control without METER that changes its filter (a move: a width from the adaptive rule, a MIN/MAX
cut) forks a *shadow* first: a constant copy of the filter that goes on as deadband would: every reading,
every METER control (deadband's acknowledgement rule: a narrowing or a constraint change is acknowledged
with the reading; else the reading is checked again), the recentring of a birth; each report it would
send is counted. A SYNC control (METER | SYNC) makes the shadow the real filter again, and the device
acknowledges with the centre taken: a twin from then on, so the two counts can never part (but by a
departure).

A twin's device may also *depart* on its own: at a report where its model chooser (``edge.core.predict``)
takes a line or a lead, a shadow forks as for a move. The device guards a departure itself, so the backend
need not know of it: ``debt``, its real reports less its shadow's while departed, summed since the meter
began, and the exit that would bring it to ``OWE`` goes back to the shadow instead (the shadow's centre,
WHY_SYNC), so a source sends at most ``OWE`` reports beyond plain deadband's by departing (beside the
backend's loan: precision.regret) but for acknowledgements while departed (deadband's device sends them
too, at its own readings), and departs again only while its departures have not lost (``debt`` <= 0).
``OWE`` = 2 kept most of what the lead saves on the dev traces (weather-nyc 0.946× deadband; 1.0003× at 1).

The count ``n`` and the source's reading count ``k`` ride in every report (codec kinds ``mreport`` /
``mline``, modulo 2^16): the backend weighs real messages against deadband's exactly (precision.regret).
Only reports are metered: delivery traffic (marks, resends: edge.core.delivery) is left out on both sides
(precision.regret). A report is guarded as deadband's device would guard it (``link``'s guard time: a reading
that leaves the hull of the bound before a report and its value within the guard is reported too), on the
shadow as on the real filter, and a SYNC hands the shadow's guard over with its filter. Portable
(MicroPython, CPython), float32-safe (a shadow is a copy: it rounds as the real filter does).
"""
from edge.core.codec import ACK, METER, SYNC, WHY_METER, WHY_SYNC
from edge.core.guard import guarded
from edge.core.interval import INF

_M16 = 0xFFFF
EVERY = 8           # a moved source reports (WHY_METER) once its shadow has counted this many since its last report,
MOST = 1 << 14      # twice as many after each such report (up to this: far from 2^16, so n never wraps unseen)
OWE = 2             # reports a source's departures may send beyond its shadow's, summed since the meter began


def modelled(f):
    """Whether filter ``f`` is off deadband's constant (a line's slope or a lead's offset)."""
    return getattr(f, "slope", 0.0) or getattr(f, "led", 0)


class Meter:
    def __init__(self, n):
        self.shadows = [None] * n       # per source: None (a twin), or deadband's constant filter
        self.n = [0] * n                # reports deadband would have sent, modulo 2^16
        self.k = [0] * n                # readings, modulo 2^16
        self.sent = [0] * n             # n as the source's latest report carried it
        self.every = [EVERY] * n        # unseen counts that make a moved source report
        self.departed = [False] * n     # shadows forked by the device's own model choice (not a move)
        self.debt = [0] * n             # real reports less the shadow's while departed, since the meter began
        self.guards = {}                # per moved source: its shadow's guard (until, lo, hi), as ``Agent.guards``

    def count(self, i):
        self.n[i] = (self.n[i] + 1) & _M16

    def fork(self, agent, i, departed=False):
        """Source ``i``'s real filter is about to leave deadband's (``departed``: by its own model choice): a
        shadow carries on from here (constant at its latest report, should the real filter be a model)."""
        g = agent.filters[i].copy()
        if modelled(g):
            g.recenter(g.v0)
        self.shadows[i] = g
        self.every[i] = EVERY
        self.departed[i] = departed
        if i in agent.guards:
            self.guards[i] = agent.guards[i]

    def free(self, i):
        """Whether source ``i``'s real filter may take the chooser's models: moved or departed, or a twin whose
        departures have not lost."""
        return self.shadows[i] is not None or self.debt[i] <= 0

    def owes(self, i):
        """A real report of departed source ``i``: whether it brings its debt to ``OWE``."""
        self.debt[i] += 1
        return self.debt[i] >= OWE

    def adopt(self, agent, i, epoch):
        """The shadow of source ``i`` becomes its real filter (under ``epoch``): a twin."""
        g = self.shadows[i]
        g.epoch = epoch
        agent.filters[i] = g
        self.shadows[i] = None
        self.departed[i] = False
        agent.guards.pop(i, None)
        if i in self.guards:
            agent.guards[i] = self.guards.pop(i)

    def _report(self, agent, i, g, t):
        self.count(i)
        if self.departed[i]:
            self.debt[i] -= 1
        v = agent.values[i]
        if agent.guard and g.center is not None and g.lo != -INF:      # (as ``Agent._report``)
            self.guards[i] = (t + agent.guard, min(g.lo, v), max(g.hi, v))
        g.recenter(v)

    def sample(self, agent, i, t, v):
        """A reading of source ``i`` at device time ``t`` (before the real filter's report)."""
        self.k[i] = (self.k[i] + 1) & _M16
        g = self.shadows[i]
        if g is not None and (g.center is None or g.check(v) or (i in self.guards and guarded(self.guards, i, t, v))):
            self._report(agent, i, g, t)

    def due(self, i):
        """Whether moved source ``i`` should report for its count alone: its shadow counted ``every`` reports
        the backend has not heard of (a silent source's saving would stay unseen). ``every`` doubles with each
        such report since the source moved: the backend always knows at least about half of what the move has
        saved, at a cost logarithmic in the saving."""
        return self.shadows[i] is not None and not self.departed[i] and (self.n[i] - self.sent[i]) & _M16 >= self.every[i]

    def seen(self, i, count):
        """``count`` readings of source ``i`` that changed nothing (a simulator hands them over late)."""
        self.k[i] = (self.k[i] + count) & _M16

    def take(self, agent, i, t, kind, m):
        """Deadband's control ``m`` (a ``width`` or ``filter``) for the shadow of source ``i``."""
        g = self.shadows[i]
        if kind == "filter":
            cons = [(c["l"], c["u"]) for c in m["cons"]]
            ack = g._cons(cons) != g.cons or g._r(m["width"]) < g.width
            g.set_filter(m["width"], cons, g.epoch)
        else:
            ack = g._r(m["width"]) < g.width
            g.set_width(m["width"], g.epoch)
        if agent.values[i] is not None and (ack or g.check(agent.values[i])):
            self._report(agent, i, g, t)

    def birth(self, values):
        """A birth recentres every filter on its source's latest reading (``Agent.start``): shadows too."""
        self.guards = {}
        for i, g in enumerate(self.shadows):
            if g is not None and values[i] is not None:
                g.recenter(values[i])

    def stamp(self, i, fields, kind):
        """Add the counts to a report's ``fields``; the metered kind of ``kind`` (report or line)."""
        fields["n"] = self.sent[i] = self.n[i]
        fields["k"] = self.k[i]
        if fields["why"] == WHY_METER:
            self.every[i] = min(2 * self.every[i], MOST)
        if kind == "line":
            fields["o"] = fields["t"]
            return "mline"
        return "mreport"


def control(agent, now, i, kind, m):
    """A ``width``/``filter``/``bound`` control for source ``i`` of a metered device, or one flagged METER
    (which starts the meter). Returns the acknowledgement of a SYNC, else None (the real filter then applies
    the control as usual)."""
    mt = agent.meter
    if mt is None:
        mt = agent.meter = Meter(len(agent.filters))
        for j, f in enumerate(agent.filters):       # (a model taken before the meter began: a departure)
            if modelled(f):
                mt.fork(agent, j, True)
    flags = m["ack"]
    f = agent.filters[i]
    move = kind == "bound" or not flags & METER and (f._r(m["width"]) != f.width or kind == "filter" and
                                                     f._cons([(c["l"], c["u"]) for c in m["cons"]]) != f.cons)
    if move or flags & SYNC:
        mt.departed[i] = False          # (a departure moved or synced: the backend's to guard from now on)
    if mt.shadows[i] is None:
        if not move and not flags & SYNC:
            return None                 # deadband's own control (or one sent again): the twin takes it
        mt.fork(agent, i)               # deadband's filter goes on in the shadow
        if move:
            return None
    if flags & METER:
        mt.take(agent, i, now, kind, m)
    if not flags & SYNC:
        return None
    if mt.shadows[i] is not None:       # the shadow becomes the real filter (a constant one: a twin)
        mt.adopt(agent, i, m["epoch"])
    g = agent.filters[i]
    if g.center is None or not flags & ACK:
        return []
    if agent.segs and i in agent.segs:  # segment mode (outside the backend's ledger): the segments ride along
        return agent._exit(now, i, WHY_SYNC, ACK)
    return [synced(agent, now, i)]


def back(agent, now, i):
    """Departed source ``i`` goes back to deadband's filter instead of a report that would leave it owing."""
    agent.meter.adopt(agent, i, agent.filters[i].epoch)
    return synced(agent, now, i)


def synced(agent, now, i):
    """The report of a source synced to its shadow: the centre taken."""
    agent.stats["reports"] += 1
    fields = {"src": i, "epoch": agent.filters[i].epoch, "t": now, "v": agent.filters[i].center, "why": WHY_SYNC}
    return agent._up(now, agent.meter.stamp(i, fields, "report"), fields)
