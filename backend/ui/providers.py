"""Totals only a driver knows, for the dashboard (DESIGN.md §10): the provider interface and one per driver.

A provider is any callable returning a dict (every key optional; the page shows "n/a" for a missing one):

* ``samples``: readings taken over the window, i.e. the uplinks send-everything would have sent;
* ``deadband``: an estimate of plain deadband's messages over the same window;
* ``ours``: our messages over that window (default: uplinks + downlinks the dashboard saw on the broker);
* ``window``: what the window is, in words; ``driver``: who answers; ``extra``: {label: value} to show;
* ``security``: the coordinator's counters of refused input (``SECURITY``: refused sources, conflicts, bad
  messages, quarantines and the messages they dropped, implausible times, non-finite values) and
  ``offenders`` {device: {counter: n}} (``backend.coordinator.core.admission``); the page shows them under
  the totals.

The dashboard calls it from its own refresher thread every ``backend.ui.server.PROVIDER_EVERY`` seconds,
never from a request, so a slow provider (the demo replays deadband) does not slow the page; an
exception is shown on the page, not raised.
"""
import math
import time


# counter -> label on the page (backend.coordinator.core.admission.COUNTERS, plus the flood's drops)
SECURITY = {"refused": "refused sources", "conflicts": "source conflicts", "bad_messages": "bad messages",
            "quarantined": "quarantines (flood)", "flooded": "messages dropped in quarantine",
            "stamps": "implausible times", "values": "non-finite values"}


def security(stats, offenders):
    """The ``security`` part of a provider's answer from coordinator counters and per-device findings."""
    out = {k: stats.get(k, 0) for k in SECURITY}
    out["offenders"] = offenders
    return out


def security_extra(sec):
    """The non-zero security counters as ``extra`` rows, and the worst offenders."""
    rows = {label: sec[k] for k, label in SECURITY.items() if sec.get(k)}
    if sec.get("offenders"):
        rows["offending devices"] = ", ".join(list(sec["offenders"])[:5])
    return rows


class CoordinatorTotals:
    """The live coordinator's counters; with an ``adaptive`` protocol its online estimate of what uniform
    deadband would have sent (``precision.estimate``: reports worth their width ratio) against what it
    spent (reports and its own downlinks), counted over the same reports."""

    def __init__(self, live):
        self.live = live

    def __call__(self):
        live = self.live
        proto = live.host.coord.protocol
        out = {"driver": "live coordinator (%s)" % live.host.settings["protocol"],
               "extra": {"uplinks received": live.stats["uplinks"], "downlinks sent": live.stats["downlinks"],
                         "answer changes": live.stats["answers"], "sources known": len(live.host.coord.cache.sources)}}
        coord = live.host.coord
        flagged = coord.admission.devices
        worst = sorted(flagged, key=lambda k: (-sum(flagged[k].values()), k))[:20]
        out["security"] = security(coord.stats, {d: dict(flagged[d]) for d in worst})
        out["extra"].update(security_extra(out["security"]))
        static, spent = getattr(proto, "static", None), getattr(proto, "spent", None)
        if isinstance(static, float) and isinstance(spent, float) and math.isfinite(static) and static > 0:
            out.update(deadband=round(static, 1), ours=round(spent, 1),
                       window="the adaptive rule's reports since its first (its deadband estimate)")
        return out


class BackendTotals:
    """The Spark backend's ``status.json`` (``backend.spark.service.Backend.status``): batches and records."""

    def __init__(self, backend):
        self.backend = backend

    def __call__(self):
        st = self.backend.status() or {}
        groups = st.get("groups") or {}
        records = sum(g.get("records", 0) for g in groups.values())
        late = sum((g.get("stats") or {}).get("late", 0) for g in groups.values())
        stats, offenders = {}, {}
        for g in groups.values():
            for k in SECURITY:
                stats[k] = stats.get(k, 0) + (g.get("stats") or {}).get(k, 0)
            offenders.update(g.get("offenders") or {})
        sec = security(stats, offenders)
        extra = {"batch": st.get("batch"), "records applied": records, "groups": len(groups), "late reports": late}
        extra.update(security_extra(sec))
        return {"driver": "Spark backend (%s)" % self.backend.settings.get("protocol"), "extra": extra,
                "security": sec}


class DemoTotals:
    """The live demo's figures, as its closing table counts them: from when every filter was installed
    (``start(t)``) on, the readings the agents logged (send-everything), plain deadband replayed offline
    over those readings and queries (``backend.live.checker.deadband_reports``), and the uplinks and controls
    the demo's observer counted."""

    def __init__(self, observer, devices, queries=None, every=3.0, clock=time.monotonic):
        self.observer = observer
        self.devices = devices          # backend.fleet.Device list (their ground-truth logs)
        self.queries = queries
        self.t0 = None
        self.every, self.clock = every, clock
        self._at, self._last = -math.inf, {}

    def start(self, t0, queries):
        self.t0, self.queries = t0, queries

    def __call__(self):
        if self.t0 is None:
            return {"driver": "demo (Spark backend)", "window": "filters installing: figures start when they are in"}
        if self.clock() - self._at < self.every:
            return self._last
        from backend.live.checker import deadband_reports
        readings = [r for d in list(self.devices) for r in d.readings()]
        window = [r for r in readings if r[0] >= self.t0]
        dead, dead_ctl = deadband_reports(self.queries, readings, self.t0) if readings else (0, 0)
        c = self.observer.counts
        self._last = {"driver": "demo (Spark backend)", "samples": len(window), "deadband": dead + dead_ctl,
                      "ours": c["up"] + c["ctl"], "window": "since every filter was installed",
                      "extra": {"uplinks": c["up"], "controls": c["ctl"]}}
        self._at = self.clock()
        return self._last
