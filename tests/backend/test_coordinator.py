"""Coordinator edge cases through real agents: duplicates, garbage, late reports, outages, resync."""
import math

from backend.coordinator.protocols import make
from backend.coordinator.core.coordinator import Coordinator
from backend.coordinator.core.uplink import EARLY
from edge.agent import Agent
from edge.core import codec


def _pair(protocol="deadband", latency=0.0, shrink=0.0):
    c = Coordinator(make(protocol), period=10.0, shrink=shrink, latency=latency)
    c.declare_sources(["a", "b"])
    c.add_query({"id": "s", "kind": "sum", "sources": ["a", "b"], "precision": 4.0}, 0.0)
    a = Agent("d", ["a", "b"], boot=1)
    return c, a


def _deliver(c, a, now, out):
    """Uplink ``out`` to the coordinator, downlink its controls back; return the answers."""
    answers = []
    while out:
        acts = []
        for _, p in out:
            acts += c.handle_uplink(now, "d", p)
        out = []
        for act in acts:
            if act[0] == "down":
                out += a.handle_message(now, act[2])
            else:
                answers.append(act[1])
    return answers


def test_birth_assigns_uniform_widths_and_answers_hold():
    c, a = _pair()
    _deliver(c, a, 0.0, a.start(0.0))
    assert [f.width for f in a.filters] == [2.0, 2.0]
    ans = _deliver(c, a, 0.0, a.handle_sample(0.0, "a", 1.0) + a.handle_sample(0.0, "b", 2.0))
    assert abs(ans[-1]["lo"] - 1.0) < 1e-9 and abs(ans[-1]["hi"] - 5.0) < 1e-9


def test_duplicates_garbage_and_downlink_kinds_are_counted_and_dropped():
    c, a = _pair()
    _deliver(c, a, 0.0, a.start(0.0))
    rep = a.handle_sample(0.0, "a", 1.0)
    _deliver(c, a, 0.0, rep)
    before = c.cache.sources["a"].reports
    _deliver(c, a, 0.0, rep)                      # QoS 1 redelivery
    assert c.stats["duplicates"] == 1 and c.cache.sources["a"].reports == before
    for junk in (b"", b"\x01\x01", b"\x07\x01abc", codec.encode("probe", {"src": 0, "seq": 1, "inc": 0, "to": 0, "probe": 1})):
        c.handle_uplink(0.0, "d", junk)
    assert c.stats["bad_messages"] == 4


def test_unknown_device_and_retained_birth_trigger_a_rebirth():
    c, a = _pair()
    acts = c.handle_uplink(0.0, "d", a.handle_sample(0.0, "a", 1.0)[0][1])
    assert [x for x in acts if x[0] == "down"] == []        # its birth may be right behind: wait λ + 1 s
    acts = c.handle_uplink(c.latency + 1.0, "d", a.handle_sample(0.5, "a", 9.0)[0][1])
    assert [codec.decode(x[2])[0] for x in acts if x[0] == "down"] == ["rebirth"]
    assert c.stats["unknown_device"] == 2
    stale = a.start(0.0)[0][1]
    c2, _ = _pair()
    acts = c2.handle_uplink(5.0, "d", stale, retained=True)
    assert [codec.decode(x[2])[0] for x in acts if x[0] == "down"] == ["rebirth"]
    assert "a" not in c2.cache.sources                 # nothing trusted from a retained birth


def _overtaken(n):
    """A birth a reordering network delivers behind the ``n`` reports its device sent after it (0.1 s apart,
    value k at the k-th); the coordinator's downlinks and stats once every gap wait is over."""
    c, a = _pair(latency=0.2)
    birth = a.start(0.0)
    reports = [a.handle_sample(0.1 * k, "a", float(k))[0][1] for k in range(1, n + 1)]
    acts = []
    for k, p in enumerate(reports):
        acts += c.handle_uplink(0.1 * k + 0.15, "d", p)
    acts += c.handle_uplink(0.1 * n + 0.2, "d", birth[0][1])
    acts += c.handle_timer(0.1 * n + 5.0)
    return c, [codec.decode(x[2])[0] for x in acts if x[0] == "down"]


def test_reports_that_overtook_their_devices_birth_are_applied_after_it_not_lost():
    # seed 7 of the [final] workload on a network that only reorders (0.2): 6 of 20 births arrived behind their
    # device's first report, which was dropped, then found missing by the birth: 6 lost uplinks, 6 rebirths,
    # and ack mode switched on for the whole fleet (8,661 acks) on a network that loses nothing
    c, downs = _overtaken(3)
    assert c.integrity.stats["lost"] == 0 and "rebirth" not in downs
    assert c.cache.sources["a"].value == 3.0        # the latest report, applied after the birth
    assert c.stats["unknown_device"] == 3 and not c.early


def test_reports_before_a_birth_beyond_what_is_kept_are_lost_and_a_birth_asked_for():
    c, downs = _overtaken(EARLY + 2)                # the two oldest are forgotten: missing once the birth is in
    assert c.integrity.stats["lost"] == 1 and "rebirth" in downs
    assert c.cache.sources["a"].value == EARLY + 2.0


def test_gone_marks_answers_degraded_until_the_device_returns():
    c, a = _pair()
    _deliver(c, a, 0.0, a.start(0.0))
    _deliver(c, a, 0.0, a.handle_sample(0.0, "a", 1.0) + a.handle_sample(0.0, "b", 2.0))
    ans = [x[1] for x in c.handle_uplink(1.0, "d", a.will()) if x[0] == "answer"]
    assert ans and ans[-1]["degraded"]
    ans = _deliver(c, a, 2.0, a.start(2.0))
    assert ans and not ans[-1]["degraded"]


def test_reports_are_released_in_event_time_after_latency():
    c, a = _pair(latency=1.0)
    _deliver(c, a, 0.0, a.start(0.0))
    out = a.handle_sample(0.0, "a", 1.0) + a.handle_sample(0.0, "b", 2.0)
    assert _deliver(c, a, 0.5, out) == []           # held in the serialising queue
    assert c.next_deadline() == 1.0
    ans = [x[1] for x in c.handle_timer(1.0) if x[0] == "answer"]
    assert ans[-1]["time"] == 0.0 and abs(ans[-1]["hi"] - 5.0) < 1e-9
    c.handle_timer(11.0)                              # the tick at 10 moves the clock to 10
    late = a.handle_sample(0.2, "a", 9.0)            # stamped before the clock: late, still applied
    c.handle_uplink(11.0, "d", late[0][1])
    assert c.stats["late"] == 1 and c.cache.sources["a"].value == 9.0


def test_narrowing_keeps_the_old_bound_until_the_device_confirms():
    c, a = _pair()
    _deliver(c, a, 0.0, a.start(0.0))
    _deliver(c, a, 0.0, a.handle_sample(0.0, "a", 0.0) + a.handle_sample(0.0, "b", 0.0))
    a.handle_sample(1.0, "a", 0.9)                   # inside [-1, 1]: silent
    acts = c.set_precision("s", 1.0, 2.0)            # widths 2 -> 0.5
    assert c.cache.known("a") == (-1.0, 1.0)         # the device may not have narrowed yet
    out = []
    for act in acts:
        if act[0] == "down":
            out += a.handle_message(2.0, act[2])
    assert len(out) == 2                              # both sources acknowledge with their value
    _deliver(c, a, 2.0, out)
    assert c.cache.known("a") == (0.9 - 0.25, 0.9 + 0.25)
