"""Regression for the test_live_job violation (DESIGN.md §3 reconnect): controls in flight while the
device reboots reached it after its new birth, and the fresh device (epoch 0) took them as new. Every
downlink now names the birth it answers (``to``) and the backend run (``inc``): the device drops them,
its filter is the one the backend's mirror rebuilt from the birth until the resync arrives, and the
mirror holds the device's value throughout (the oracle). A device without those checks takes them."""
from backend.host import Host
from edge.agent import Agent
from edge.core import codec


def deliver(agent, h, now, acts, held=None):
    """Controls to the device (or into ``held``), its uplinks back to the host, until quiet."""
    while acts:
        nxt = []
        for a in acts:
            if a[0] != "down":
                continue
            if held is not None:
                held.append(a[2])
                continue
            for ch, payload in agent.handle_message(now, a[2]):
                nxt += h.record(now, "d1", ch, payload)
        acts = nxt


def scenario(obey_token=True):
    """Returns the (time, value, mirror lo, hi) where the mirror missed the device's value, and the agent."""
    h = Host(protocol="deadband", period=5.0, shrink=0.0, latency=0.0, t0=0.0)
    h.spec(0.0, "q", {"kind": "sum", "sources": ["x"], "precision": 2.0})
    a = Agent("d1", ["x"], boot=1, width=2.0)
    a.handle_sample(0.0, 0, 10.0)
    deliver(a, h, 0.0, h.record(0.0, "d1", "state", a.start(0.0)[0][1]))
    held = []
    deliver(a, h, 1.0, h.spec(1.0, "q", {"kind": "sum", "sources": ["x"], "precision": 40.0}), held)
    assert {codec.decode(p)[0] for p in held} == {"width"}         # widening (to 40 at last), in flight
    a = Agent("d1", ["x"], boot=2, width=2.0)                       # the device reboots: epoch 0, new boot
    a.handle_sample(2.0, 0, 10.0)
    resync = []
    deliver(a, h, 2.0, h.record(2.0, "d1", "state", a.start(2.0)[0][1]), resync)
    for stale in held:                                              # arrives after the new birth
        if not obey_token:      # a device without birth token and incarnation checks takes it
            kind, m = codec.decode(stale)
            stale, a.inc = codec.encode(kind, dict(m, to=a.token)), m["inc"]
        for ch, payload in a.handle_message(2.1, stale):
            h.record(2.1, "d1", ch, payload)
    taken = a.filters[0].width        # the device's width between the stale controls and the resync
    missed = []
    for k in range(1, 40):      # the value moves inside the stale width before the resync arrives
        t, v = 2.1 + k * 0.01, 10.0 + 0.4 * k
        for ch, payload in a.handle_sample(t, 0, v):
            h.record(t, "d1", ch, payload)
        h.timer(t)
        lo, hi = h.coord.cache.known("x")
        if not lo <= v <= hi:
            missed.append((t, v, lo, hi))
    deliver(a, h, 3.0, [("down", "d1", p) for p in resync])
    return missed, a, h, taken


def test_a_control_from_before_a_reboot_is_dropped_and_the_mirror_holds():
    missed, a, h, taken = scenario()
    assert missed == [] and a.stats["stale"] == 2 and taken == 2.0
    s = h.coord.cache.sources["x"]
    assert (a.filters[0].width, a.filters[0].epoch) == (s.filt.width, s.filt.epoch) == (40.0, s.filt.epoch)


def test_a_device_without_the_checks_takes_the_stale_width():
    missed, a, h, taken = scenario(obey_token=False)
    assert a.stats["stale"] == 0 and taken == 40.0
