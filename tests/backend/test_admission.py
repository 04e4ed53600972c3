"""Bounded input at the coordinator (backend/coordinator/core/admission.py, DESIGN.md §10): ownership of sources,
floods, implausible stamps and values, and the operator's warnings. Oracle: a second device that behaves
must keep exactly the answers it has when the offender is absent."""
import json
import math

from edge.agent import Agent
from edge.core import codec
from backend.bench.births import pump
from backend.coordinator.core import admission
from backend.host import Host

from hostkit import answers, born

SUM = {"id": "q", "kind": "sum", "sources": ["t1"], "precision": 1.0}


def _host(tmp_path=None, sources=None, **kw):
    registry = None
    if sources is not None:
        registry = str(tmp_path / "credentials.json")
        with open(registry, "w") as f:
            json.dump({"sources": sources}, f)
    return Host(protocol="deadband", period=10.0, shrink=0.0, registry=registry, **kw)


def _last(h, qid="q"):
    return h.coord.last.get(qid)


def _report(agent, now, i, v):
    return [a[1] for a in agent.handle_sample(now, i, v) if a[0] == "up"]


def test_a_foreign_birth_is_refused_logged_and_never_displaces_the_owner(tmp_path):
    h = _host(tmp_path, {"dev1": ["t1"], "dev2": ["t2"]})
    h.spec(0.0, "q", SUM)
    _, b2 = born("dev2", ["t1", "t2"], [500.0, 7.0], 1.0)       # dev2 names dev1's t1 before dev1 starts
    h.uplink(1.0, "dev2", b2)
    assert "t1" not in h.coord.cache.sources and h.coord.cache.sources["t2"].device == "dev2"
    assert h.coord.stats["refused"] == 1
    lines = h.alerts()
    assert lines == ["device dev2: refused source: birth names t1, provisioned for dev1"]
    assert "q" in h.pending                     # t1 unclaimed: the query waits, it never answers [-inf, inf]
    a1, b1 = born("dev1", ["t1"], [20.0], 2.0)       # its config delivered: a bound, not "no bound yet"
    out = pump(h, {"dev1": a1}, 2.0, h.uplink(2.0, "dev1", b1)) + h.timer(3.0)
    assert h.coord.cache.sources["t1"].device == "dev1"
    a = answers(out)[-1]
    assert a["lo"] <= 20.0 <= a["hi"] and not a["degraded"]
    h.uplink(4.0, "dev2", born("dev2", ["t1"], [900.0], 4.0, boot=2)[1])     # and again, later: still refused
    assert h.coord.cache.sources["t1"].device == "dev1" and h.coord.stats["refused"] == 2
    # a provisioned device naming a source nobody was given is refused too
    h.uplink(5.0, "dev1", born("dev1", ["t1", "x9"], [20.0, 1.0], 5.0, boot=3)[1])
    assert "x9" not in h.coord.cache.sources and h.coord.stats["refused"] == 3


def test_without_a_registry_a_contested_source_degrades_its_queries_with_the_reason():
    h = _host()
    _, b2 = born("dev2", ["t1"], [math.inf], 1.0)               # no value yet: the bound is [-inf, inf]
    h.uplink(1.0, "dev2", b2)
    h.spec(1.0, "q", SUM)
    h.timer(1.5)
    a = _last(h)                                # unbounded, and it says why
    assert a["lo"] == -math.inf and a["degraded"] and a["reason"] == "no bound yet: waiting for t1", a
    _, b1 = born("dev1", ["t1"], [20.0], 2.0)
    out = h.uplink(2.0, "dev1", b1) + h.timer(3.0)
    a = _last(h)
    assert a["degraded"] and a["reason"] == "contested: t1 claimed by dev2 and dev1", a
    assert h.coord.cache.sources["t1"].device == "dev2"         # first come keeps it
    assert h.coord.stats["conflicts"] == 1
    assert h.alerts() == ["device dev1: conflict: birth names t1, which dev2 owns"]
    assert answers(out)
    # dev1's next birth names other sources only: the contest is over
    h.uplink(4.0, "dev1", born("dev1", ["u1"], [20.0], 4.0, boot=2)[1])
    h.timer(5.0)
    assert not h.coord.admission.contested and _last(h)["reason"] == "no bound yet: waiting for t1"     # dev2's, still unread


def _pair(h, t=1.0):
    """Two devices: good (source g) and bad (source t1); a sum over g alone."""
    good, bg = born("good", ["g"], [10.0], t)
    bad, bb = born("bad", ["t1"], [20.0], t)
    h.spec(0.0, "g", {"id": "g", "kind": "sum", "sources": ["g"], "precision": 1.0})
    h.spec(0.0, "q", SUM)
    pump(h, {"good": good, "bad": bad}, t, h.uplink(t, "good", bg) + h.uplink(t, "bad", bb))   # bounds
    h.timer(t + 1)
    return good, bad


def test_one_bad_stamp_is_dropped_alone_and_does_not_skew_the_device_for_good():
    h = _host()
    good, bad = _pair(h)
    forged = dict(codec.decode(_report(bad, 3.0, 0, 50.0)[0])[1], t=3.0 + 86400.0)   # a day ahead
    out = h.uplink(3.0, "bad", codec.encode("report", forged))
    assert h.coord.stats["stamps"] == 1 and h.coord.integrity.stats["skewed"] == 0
    assert h.alerts() == ["device bad: implausible time: stamped 86400.000s after its arrival"]
    for a in _report(bad, 4.0, 0, 80.0):       # its next report shows the number it used: a lost uplink
        out += h.uplink(4.0, "bad", a)
    for t in (4.5, 5.0, 6.0):
        out += h.timer(t)
    # the dropped report is a lost uplink: degraded until the birth asked for, revoked from the device's last
    # uplink before it (its birth at 1.0), never back to the coordinator's start (t0 = 0) as a skew was
    assert h.coord.t0 == 0.0 and all(a.get("revoked", [math.inf])[0] >= 1.0 for a in answers(out))
    assert h.coord.integrity.suspect.get("bad") in (None, "lost uplink")
    rebirth = bad.handle_message(6.0, next(a[2] for a in out if a[0] == "down" and a[1] == "bad"
                                           and codec.decode(a[2])[0] == "rebirth"))
    for a in rebirth:
        if a[0] == "state":
            h.uplink(6.5, "bad", a[1])
    h.timer(8.0)
    assert "bad" not in h.coord.integrity.suspect and not _last(h)["degraded"]
    assert not _last(h, "g")["degraded"]


def test_non_finite_values_are_dropped_and_counted():
    h = _host()
    good, bad = _pair(h)
    forged = dict(codec.decode(_report(bad, 3.0, 0, 50.0)[0])[1], v=-math.inf)
    h.uplink(3.0, "bad", codec.encode("report", forged))
    line = dict(forged, v=60.0, slope=math.inf, gap=1.0, seq=forged["seq"] + 1)
    h.uplink(3.0, "bad", codec.encode("line", line))
    nan = codec.encode("report", dict(forged, v=0.0, seq=forged["seq"] + 2))[:-9] + b"\x00" * 6 + b"\xf8\x7f" + b"\x00"
    h.uplink(3.0, "bad", nan)                   # NaN: the codec refuses it
    h.timer(4.0)
    assert h.coord.stats["values"] == 2 and h.coord.stats["bad_messages"] == 1
    assert h.coord.cache.sources["t1"].value == 20.0 and h.coord.admission.devices["bad"] == {"values": 2, "bad_messages": 1}
    assert h.alerts() == ["device bad: non-finite value: a report with a value that is not a finite number "
                          "(or a line's gap out of range)",
                          "device bad: bad message: field v is NaN"]


def test_a_flood_quarantines_the_device_alone_and_warnings_are_rate_limited():
    h = _host()
    good, bad = _pair(h)
    junk = b"\x02\x01junk"
    for i in range(3000):                       # 3,000 messages within a millisecond: over the burst
        h.uplink(3.0 + i * 1e-7, "bad", junk)
    st = h.coord.stats
    assert st["quarantined"] == 1 and st["bad_messages"] == admission.BURST and st["flooded"] == 3000 - admission.BURST
    lines = h.alerts()
    assert len(lines) == 2 and lines[0].startswith("device bad: bad message") and "quarantined for 30s" in lines[1]
    h.timer(4.0)
    assert _last(h)["degraded"] and "quarantined (flood)" in _last(h)["reason"]
    assert not _last(h, "g")["degraded"]
    for t in range(5, 40):                      # the good device talks on; it never hears of the flood
        for a in _report(good, float(t), 0, 10.0 + (t % 3) * 2):
            h.uplink(float(t) + 0.01, "good", a)
        h.timer(float(t) + 0.5)
        assert not _last(h, "g")["degraded"]
    h.uplink(40.0, "bad", junk)                 # after the quarantine: bad messages again, one warning
    h.uplink(40.5, "bad", junk)
    assert h.alerts() == ["device bad: bad message: truncated in field seq "
                          "(%d more since the last warning)" % (admission.BURST - 1)]
    assert h.coord.admission.devices["bad"]["bad_messages"] == admission.BURST + 2


def test_a_line_whose_gap_is_below_its_clocks_resolution_is_dropped_not_a_hang():
    """Found by the live hostile-device fuzz: a line report with a gap of 1e-300 s rescheduled its restatement at
    the same instant forever (BoundCache.refresh), and the coordinator stopped answering everything."""
    import time
    h = _host()
    good, bad = _pair(h)
    forged = dict(codec.decode(_report(bad, 3.0, 0, 50.0)[0])[1])
    line = dict(forged, slope=0.5, gap=1e-300)
    started = time.monotonic()
    h.uplink(3.0, "bad", codec.encode("line", line))
    h.timer(4.0)
    assert time.monotonic() - started < 1.0 and h.coord.stats["values"] == 1
    s = h.coord.cache.sources["t1"]             # and the cache itself always moves on
    s.filt.gap, s.filt.slope, s.unit = 1e-300, 0.5, 1
    h.coord.cache.refresh(s, 1795700000.0)
    assert s.due > 1795700000.0


def test_a_metered_line_whose_origin_is_not_finite_is_dropped_not_a_crash():
    """A metered line report (mline, edge.core.meter) carries its line's origin ``o``; on a board counting integer
    ms the coordinator makes it an int, which an infinite origin would raise on: it is dropped and counted."""
    h = _host()
    h.spec(0.0, "g", {"id": "g", "kind": "sum", "sources": ["g"], "precision": 1.0})
    h.spec(0.0, "q", SUM)
    good, bg = born("good", ["g"], [10.0], 1.0)
    bad = Agent("bad", ["t1"], boot=1, unit=1000, lines=True)
    bad.handle_sample(1000, 0, 20.0)
    pump(h, {"good": good}, 1.0, h.uplink(1.0, "good", bg))     # g's bound: good takes its filter (as in _pair)
    h.uplink(1.0, "bad", bad.start(1000)[0][1])
    h.timer(2.0)
    assert h.coord.cache.known("g") != (-math.inf, math.inf)
    assert h.coord.devices["bad"]["meter"] and h.coord.unit["bad"] == 1000
    forged = dict(codec.decode(_report(bad, 3000, 0, 50.0)[0])[1])
    forged.update(slope=0.5, gap=1000, o=math.inf, n=1, k=2)
    h.uplink(3.0, "bad", codec.encode("mline", {k: forged[k] for k in codec.SCHEMAS["mline"][3].split()}))
    h.timer(4.0)
    assert h.coord.stats["values"] == 1 and h.coord.cache.sources["t1"].value == 20.0
    assert h.alerts() == ["device bad: non-finite value: a line with a value that is not a finite number "
                          "(or a line's gap out of range)"]
    assert not _last(h, "g")["degraded"]
    forged.update(o=2000, seq=forged["seq"] + 1)  # a finite origin (a SYNC's acknowledgement) is taken
    h.uplink(4.5, "bad", codec.encode("mline", {k: forged[k] for k in codec.SCHEMAS["mline"][3].split()}))
    h.timer(5.0)
    assert h.coord.cache.sources["t1"].value == 50.0 and h.coord.cache.sources["t1"].filt.t0 == 2000


def test_a_source_refused_at_birth_leaves_the_others_their_own_numbers(tmp_path):
    """dev2 names dev1's t1 before its own t2: t1 is refused, and t2 keeps its number 1 (its reports and the
    backend's controls go by it): the oracle is t2's true reading, which each answer over t2 must hold, not
    degraded; a report dev2 makes for t1 (number 0) is never taken as t2's."""
    h = _host(tmp_path, {"dev1": ["t1"], "dev2": ["t2"]})
    h.spec(0.0, "q", {"id": "q", "kind": "sum", "sources": ["t2"], "precision": 1.0})
    a2, b2 = born("dev2", ["t1", "t2"], [500.0, 7.0], 1.0)
    pump(h, {"dev2": a2}, 1.0, h.uplink(1.0, "dev2", b2))
    h.timer(2.0)
    assert h.coord.cache.sources["t2"].index == 1
    for t, i, v, truth in ((3.0, 1, 40.0, 40.0), (5.0, 0, 900.0, 40.0), (7.0, 1, 12.0, 12.0)):
        for p in _report(a2, t, i, v):
            pump(h, {"dev2": a2}, t, h.uplink(t, "dev2", p))
        h.timer(t + 1.0)
        a = _last(h)
        assert a["lo"] <= truth <= a["hi"] and not a["degraded"], (t, a)
    assert h.coord.stats["bad_messages"] == 1       # the t1 report: not one dev2 owns


def test_a_reboot_that_names_its_sources_in_another_order_is_read_by_its_new_numbers():
    """Oracle: the readings the device reports; after a reboot naming [b, a] (was [a, b]), number 0 is b."""
    h = _host()
    h.spec(0.0, "q", {"id": "q", "kind": "sum", "sources": ["b"], "precision": 1.0})
    d1, b1 = born("dev", ["a", "b"], [1.0, 2.0], 1.0)
    pump(h, {"dev": d1}, 1.0, h.uplink(1.0, "dev", b1))
    d2, b2 = born("dev", ["b", "a"], [2.0, 1.0], 3.0, boot=2)
    pump(h, {"dev": d2}, 3.0, h.uplink(3.0, "dev", b2))
    assert (h.coord.cache.sources["b"].index, h.coord.cache.sources["a"].index) == (0, 1)
    for t, i, v, truth in ((5.0, 0, 30.0, 30.0), (7.0, 1, 90.0, 30.0)):
        for p in _report(d2, t, i, v):
            pump(h, {"dev": d2}, t, h.uplink(t, "dev", p))
        h.timer(t + 1.0)
        a = _last(h)
        assert a["lo"] <= truth <= a["hi"] and not a["degraded"], (t, a)
