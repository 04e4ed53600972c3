"""Lazy ticking: a coordinator that skips idle adjustment ticks in O(1) against one that ticks every period.

The oracle (``lazy=False``) is woken at every deadline it asks for; the lazy one only at its own (queue
heads). Both see the same uplinks, births, Last Wills and query changes, with gaps of up to thousands of
periods; after every input their outputs so far and their whole mirrored state must be identical.
"""
import random

import pytest

from backend.coordinator.core.coordinator import Coordinator
from backend.coordinator.protocols import make
from edge.agent import Agent


def _state(c):
    srcs = [(k, s.filt.width, s.filt.epoch, s.filt.center, s.reports, s.online, len(s.old))
            for k, s in sorted(c.cache.sources.items())]
    return c.tick, c.clock, srcs, sorted(c.last.items()), sorted(c.queue), c.stats


class _Pair:
    def __init__(self, protocol, params, latency, shrink, seed):
        self.lazy = Coordinator(make(protocol, **params), period=10.0, shrink=shrink, latency=latency)
        self.oracle = Coordinator(make(protocol, **params), period=10.0, shrink=shrink, latency=latency, lazy=False)
        self.acts = {"lazy": [], "oracle": []}
        self.agents = {"d0": Agent("d0", ["a", "b"], boot=1), "d1": Agent("d1", ["c"], boot=1)}
        self.down = set()
        self.delayed = []               # (arrival, n, device, payload): uplinks the network holds back
        self.oracle_timers = self.lazy_timers = 0
        self.outbox = []                # (t, actions) of the lazy coordinator's timers, to deliver
        for c in (self.lazy, self.oracle):
            c.declare_sources(["a", "b", "c"])

    def both(self, call, *args):
        a = getattr(self.lazy, call)(*args)
        o = getattr(self.oracle, call)(*args)
        self.acts["lazy"] += a
        self.acts["oracle"] += o
        assert self.acts["lazy"] == self.acts["oracle"], call
        assert _state(self.lazy) == _state(self.oracle), call
        return a

    def wake(self, now):
        """Every due timer of the oracle, the lazy coordinator's and the agents', in time order."""
        while True:
            # at one instant the coordinators' ticks go first: a lazy coordinator catches up the ticks up to
            # an uplink's time inclusive, so the oracle has run its tick at that instant too (a config says it)
            due = [(self.oracle.next_deadline(), 0, "oracle"), (self.lazy.next_deadline(), 0, "lazy")]
            due += [(a.next_deadline(), 1, d) for d, a in sorted(self.agents.items()) if a.next_deadline() is not None]
            if self.delayed:
                due.append((self.delayed[0][0], 1, "net"))
            t, _, who = min(due)
            if self.outbox and (t > self.outbox[0][0] or t > now):
                # the lazy coordinator's timer controls, once both coordinators have passed their instant
                when, acts = self.outbox.pop(0)
                self.deliver(when, acts)
                continue
            if t > now:
                return
            if who == "net":
                _, _, device, payload = self.delayed.pop(0)
                self.send(t, device, [("up", payload)])
            elif who == "oracle":
                self.oracle_timers += 1
                self.acts["oracle"] += self.oracle.handle_timer(t)
            elif who == "lazy":
                self.lazy_timers += 1
                acts = self.lazy.handle_timer(t)
                self.acts["lazy"] += acts
                self.outbox.append((t, acts))   # a control never delivered is one the backend finds lost
            else:
                self.send(t, who, self.agents[who].handle_timer(t))

    def send(self, now, device, out):
        while out:
            down = []
            for _, payload in out:
                if device in self.down:
                    continue
                for act in self.both("handle_uplink", now, device, payload):
                    if act[0] == "down":
                        down.append(act)
            out = []
            self.deliver(now, down)

    def deliver(self, now, acts):
        """The downlinks among ``acts`` to their agents (unless down), and what the agents answer."""
        for act in acts:
            if act[0] == "down" and act[1] not in self.down:
                self.send(now, act[1], self.agents[act[1]].handle_message(now, act[2]))


def _run(protocol, params, latency, shrink, seed, events=160):
    r = random.Random(seed)
    p = _Pair(protocol, params, latency, shrink, seed)
    p.both("add_query", {"id": "s", "kind": "sum", "sources": ["a", "b", "c"], "precision": 3.0}, 0.0)
    p.both("add_query", {"id": "m", "kind": "max", "sources": ["a", "c"], "precision": 2.0}, 0.0)
    now = 0.0
    for dev, a in sorted(p.agents.items()):
        p.send(now, dev, a.start(now))
    vals = {"a": 20.0, "b": 50.0, "c": 0.0}
    for _ in range(events):
        gap = r.choice([r.uniform(0.05, 3.0), r.uniform(5.0, 40.0), r.uniform(1000.0, 50000.0)])
        now += r.uniform(0.05, 40.0) if p.down else gap    # offline widening ticks every period: back soon
        p.wake(now)
        x = 0.85 if p.down else r.random()
        if x < 0.8:
            src = r.choice("abc")
            vals[src] += r.gauss(0.0, 1.5)
            dev = "d1" if src == "c" else "d0"
            out = p.agents[dev].handle_sample(now, src, vals[src])
            if out and r.random() < 0.3:    # held back, sometimes for longer than λ (a late report)
                p.delayed.append((now + r.uniform(0.0, 2.0 * latency + 1.0), len(p.delayed), dev, out[0][1]))
                p.delayed.sort()
            else:
                p.send(now, dev, out)
        elif x < 0.87:
            dev = r.choice(["d0", "d1"])
            if dev in p.down:
                p.down.discard(dev)
                p.send(now, dev, p.agents[dev].start(now))
            else:
                p.send(now, dev, [("up", p.agents[dev].will())])
                p.down.add(dev)
        elif x < 0.94:
            p.both("set_precision", "s", round(r.uniform(0.5, 6.0), 3), now)
        else:
            p.both("handle_timer", now)
    p.wake(now + 100.0)
    p.both("handle_timer", now + 100.0)
    return p


@pytest.mark.parametrize("protocol,params,shrink", [
    ("deadband", {}, 0.0), ("adaptive", {}, 0.0), ("adaptive", {"every": 3}, 0.0),
    ("optimal_static", {"steps": {"a": 1.0, "b": 2.0, "c": 0.5}}, 0.0),
])
@pytest.mark.parametrize("latency", [0.0, 0.7])
def test_skipping_idle_ticks_equals_ticking_every_period(protocol, params, shrink, latency):
    late = 0
    for seed in range(3):
        p = _run(protocol, params, latency, shrink, seed)
        # the oracle was woken for every tick, the lazy coordinator only for queued uplinks
        assert p.oracle.tick == p.lazy.tick > 1000
        assert p.lazy_timers * 20 < p.oracle_timers
        # held-back reports came late, or after their resend (ack mode, once a gap was seen) as duplicates
        late += p.lazy.stats["late"] + p.lazy.stats["duplicates"]
    assert late > 0

def test_a_shrinking_protocol_is_never_skipped():
    p = _run("adaptive", {"rule": "shrink"}, 0.3, 0.05, 7, events=40)
    assert not p.lazy.idle() and p.oracle.tick == p.lazy.tick
    assert p.lazy_timers == p.oracle_timers
