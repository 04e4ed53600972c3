"""An uplink the backend refuses (admission: a stamp or value that cannot be true) is acknowledged, counted and
stated as lost (DESIGN.md §4 bounded withdrawal): the device in ack mode stops resending it at once, the answers
over it are withdrawn and degraded until a birth restates the device, never silently wrong. Oracles: the
simulator's ground truth (every provisional and final answer), and a device that behaves."""
import math

import pytest

from backend.bench.births import pump
from backend.coordinator.core import admission
from backend.host import Host
from backend.sim import engine
from edge.core import codec
from edge.core.delivery import Delivery

from hostkit import answers, born

SUM = {"id": "q", "kind": "sum", "sources": ["t1"], "precision": 1.0}
NUMBER = Delivery(1, None, 1).seq + 5    # the number of boot 1's first report after it is in ack mode (birth the
#                                          first number, reports the next 3)


def _never_takes(monkeypatch, device, refuse):
    """Admission refuses every report of ``device`` whose number ``refuse`` picks (by content: a resend too), as a
    rule the device cannot know of would (a value the backend will never take)."""
    values = admission.Admission.values

    def check(self, now, dev, kind, m, unit=1):
        if dev == device and kind in ("report", "line") and refuse(m["seq"]):
            self.note(now, dev, admission.VALUE, "refused by the test")
            return False
        return values(self, now, dev, kind, m, unit)
    monkeypatch.setattr(admission.Admission, "values", check)


class _Link:
    """One agent and the host, messages delivered at once both ways (acks, links, rebirths reach it)."""

    def __init__(self, h, agent, device):
        self.h, self.agent, self.device = h, agent, device
        self.up = 0                 # uplinks the agent sent

    def send(self, now, acts):
        out = []
        for ch, p in acts:
            if ch in ("up", "state"):
                self.up += 1
                out += pump(self.h, {self.device: self.agent}, now, self.h.uplink(now, self.device, p))
        return out

    def run(self, t0, t1, step=0.05):
        """Timers of both sides from ``t0`` to ``t1``; the host's output."""
        out, t = [], t0
        while t < t1:
            out += pump(self.h, {self.device: self.agent}, t, self.h.timer(t))
            out += self.send(t, self.agent.handle_timer(t))
            t = round(t + step, 6)
        return out


def _ack_mode(monkeypatch=None):
    """A device ``bad`` (source t1) born and switched to ack mode (another device's gap turned it on)."""
    if monkeypatch is not None:
        _never_takes(monkeypatch, "bad", lambda seq: seq == NUMBER)
    h = Host(protocol="deadband", period=10.0, shrink=0.0)
    h.spec(0.0, "q", SUM)
    bad, bb = born("bad", ["t1"], [20.0], 1.0)
    link = _Link(h, bad, "bad")
    pump(h, {"bad": bad}, 1.0, h.uplink(1.0, "bad", bb))
    h.coord.integrity.news["link"] += h.coord.integrity.links.switch_on("bad", 1.0)    # as a gap on a lossy link
    link.send(1.5, bad.handle_sample(1.5, 0, 30.0))     # (the link goes out after its next uplink)
    assert bad.delivery.rto > 0 and bad.delivery.held == []
    return h, bad, link


def test_a_refused_report_is_acknowledged_not_resent_for_ever_and_stated_as_lost(monkeypatch):
    h, bad, link = _ack_mode(monkeypatch)       # its next report is refused, nothing after
    assert bad.delivery.seq + 1 == NUMBER
    out = link.send(2.0, bad.handle_sample(2.0, 0, 90.0))      # the value moved out of its bound: refused
    assert bad.delivery.held == []                              # acknowledged at once: nothing to resend
    assert h.coord.stats["values"] == 1 and h.coord.integrity.stats["refused"] == 1
    out += link.run(2.0, 3602.0, step=0.5)                      # an hour on
    assert bad.delivery.stats["resent"] == 0 and h.coord.stats["values"] == 1
    # its data is lost to the backend: the answers since the uplink before it are withdrawn, degraded until the
    # birth the backend asked for restates the source (90), then right again
    a = answers(out)
    assert any(x.get("revoked") and x["revoked"][0] <= 1.5 for x in a)
    wrong = [x for x in a if not x["degraded"] and not x["lo"] <= 90.0 <= x["hi"] and x["time"] >= 2.0]
    assert all(any(r[0] <= x["time"] <= r[1] for y in a for r in [y.get("revoked") or (math.inf, -math.inf)])
               for x in wrong)
    assert h.coord.cache.sources["t1"].value == 90.0 and not a[-1]["degraded"] and a[-1]["lo"] <= 90.0 <= a[-1]["hi"]
    assert "bad" not in h.coord.integrity.suspect and h.coord.integrity.stats["lost"] == 1


def test_a_refusal_whose_ack_is_lost_is_acknowledged_again_on_its_resend(monkeypatch):
    h, bad, _ = _ack_mode(monkeypatch)
    (ch, p), = bad.handle_sample(2.0, 0, 90.0)
    h.uplink(2.0, "bad", p)                                     # its ack is lost
    assert len(bad.delivery.held) == 1
    (ch2, again), = bad.handle_timer(bad.next_deadline())       # resent unchanged
    assert again == p
    acks = [codec.decode(x[2])[1] for x in h.uplink(2.5, "bad", again) if x[0] == "down"
            and codec.decode(x[2])[0] == "ack"]
    assert acks and acks[-1]["upto"] == codec.decode(p)[1]["seq"]
    assert h.coord.stats["values"] == 2 and h.coord.integrity.stats["refused"] == 2


def test_a_refused_number_does_not_hold_back_the_ack_of_what_follows_it(monkeypatch):
    h, bad, link = _ack_mode(monkeypatch)
    s = bad.delivery.seq
    ups = [p for t, v in ((2.0, 90.0), (2.1, 40.0), (2.2, 95.0)) for ch, p in bad.handle_sample(t, 0, v)]
    h.uplink(2.2, "bad", ups[1])                                 # s + 2 first (reordered): s + 1 is a gap
    assert h.coord.integrity.upto("bad") == s
    h.uplink(2.3, "bad", ups[0])                                 # s + 1 refused: no longer held back
    assert h.coord.integrity.upto("bad") == s + 2
    h.uplink(2.4, "bad", ups[2])
    assert h.coord.integrity.upto("bad") == s + 3
    ig = h.coord.integrity
    assert ig.refused("bad", 2.5, (s + 3 + 300) & 0xFFFFFFFF) is False     # far ahead: not the device's
    assert ig.upto("bad") == s + 3


WORKLOAD = {"name": "refuse", "duration": 600, "protocol": "adaptive",
            "sources": {"generator": "random_walk", "count": 6, "per_device": 1, "start": [40, 60],
                        "step": [0.5, 2.0], "interval": 1},
            "queries": [{"id": "total", "kind": "sum", "sources": "all", "precision": 20},
                        {"id": "top", "kind": "max", "sources": ["s0", "s1", "s2"], "precision": 6}],
            "network": {"delay": 0.1, "jitter": 0.05, "loss": 0.02}}


@pytest.mark.parametrize("seed", [11, 12])
def test_a_simulated_device_whose_reports_are_refused_costs_no_resends_and_no_wrong_answer(monkeypatch, seed):
    _never_takes(monkeypatch, "d0", lambda seq: seq % 7 == 3)      # a seventh of d0's reports: never taken
    sim = engine.simulation(dict(WORKLOAD, seed=seed))
    res = sim.run()
    refused, resent = sim.coord.stats["values"], sim.agents["d0"].delivery.stats["resent"]
    others = max(a.delivery.stats["resent"] for d, a in sim.agents.items() if d != "d0")
    print("seed %d: %d reports refused, d0 resent %d (the others at most %d), %d violations" % (
        seed, refused, resent, others, res["violations"]))
    assert res["network"]["lost"] > 0 and res["by_kind"]["ack"] > 0        # ack mode on
    assert refused >= 5 and sim.coord.integrity.stats["refused"] == refused
    assert resent <= others + 5                     # a refusal costs no resend (it cost 117 on seed 11)
    assert res["violations"] == 0 and res["precision_misses"] == 0     # provisional and final answers, truth
