"""Float32 boards without NTP against the real coordinator: integer-ms device time, backend time from
the config, shrinks at the backend's instants, tick wrap, a reboot with controls in flight, births in
parts, epochs. Oracle: every source's ground truth (logged in device time) lies inside the bound the
backend states for it at its event clock, whenever the source is online."""
import bisect
import heapq
import os
import sys

import pytest

from backend.coordinator.core.boundcache import BoundCache
from backend.coordinator.core.coordinator import Coordinator
from backend.coordinator.protocols import make
from edge.agent import Agent
from edge.core import codec
from edge.core.float32 import f32
from edge.runtime.clock import Clock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "edge"))
from portable import PERIOD as WRAP, Ticks  # noqa: E402  (the board's time stand-in of the edge tests)


class Rig:
    """Devices and a coordinator joined by a FIFO network with fixed delays (seconds)."""

    def __init__(self, n, t0=1700000000.0, up=0.1, down=0.1, latency=0.6, seed=1, models=1, drift=0.0, rule="shrink",
                 **params):
        # A board takes the backend's clock at the config's arrival, so it runs behind by the downlink
        # delay (plus the rig's step): λ must cover both delays and that. Olston's §3.2 rule shrinks every
        # period; the default rule shrinks nothing (as the host runs it) and meters deadband on the boards.
        import random
        self.rng = random.Random(seed)
        self.now = t0
        self.coord = Coordinator(make("adaptive", rule=rule, **params), period=1.0, latency=latency, incarnation=77,
                                 shrink=0.05 if rule == "shrink" else 0.0, t0=t0 - 0.5, models=models)
        self.drift = drift                  # per reading, with sign alternating by source
        names = ["s%d" % i for i in range(2 * n)]
        self.query = {"id": "q", "kind": "sum", "sources": names, "precision": 4.0}
        self.delay = {"up": up, "down": down}
        self.net = []
        self.n = 0
        self.boards, self.agents, self.clocks = {}, {}, {}
        self.truth = {k: ([], []) for k in names}       # key -> (device times, values)
        self.vals = {k: 20.0 + i for i, k in enumerate(names)}
        self.violations = 0
        self.checked = 0
        for d in range(n):
            self.boot("d%d" % d, WRAP - 30000 - 7 * d, d + 1)

    def boot(self, dev, ticks, boot):
        i = int(dev[1:])
        board = self.boards[dev] = Ticks(2, ticks, epoch=2000)     # no RTC, NTP failed
        clock = self.clocks[dev] = Clock(board)
        a = self.agents[dev] = Agent(dev, ["s%d" % (2 * i), "s%d" % (2 * i + 1)], boot=boot, width=1.0,
                                     unit=1000, synced=clock.synced, rnd=f32)
        self._send("up", dev, a.start(clock()))

    def _send(self, direction, dev, payloads):
        for p in payloads:
            if direction == "up":
                p = p[1]                        # (channel, payload) from the agent
            self.n += 1
            heapq.heappush(self.net, (self.now + self.delay[direction], self.n, direction, dev, p))

    def _coord(self, acts):
        if self.query and len(self.coord.cache.sources) == len(self.truth):
            acts += self.coord.add_query(self.query, self.now)       # once every source is born
            self.query = None
        for act in acts:
            if act[0] == "down":
                self._send("down", act[1], [act[2]])
        self._check()

    def _check(self):
        c = self.coord.clock
        for key, s in self.coord.cache.sources.items():
            times, vals = self.truth[key]       # (device stamps: placed as the backend places them, at the
            # earliest their clock's measured lead allows; a board behind the backend's clock shows a lead < 0)
            j = bisect.bisect_right(times, c + self.coord.integrity.offsets.bounds(s.device, self.now)[1]) - 1
            if not s.online or j < 0 or c < self.settled:
                continue
            lo, hi = self.coord.cache.known(key)
            self.checked += 1
            if not lo <= vals[j] <= hi:
                self.violations += 1

    def run(self, seconds, dt_ms=(1, 120), reboot_at=None, script=()):
        """``script``: [(time, action(rig))] run once the rig's clock reaches each time."""
        end = self.now + seconds
        self.settled = self.now + 2.0        # births before the first config are stamped near 0: late
        script = sorted(script, key=lambda x: x[0])
        while self.now < end:
            while script and self.now >= script[0][0]:
                script.pop(0)[1](self)
                self._coord(self.coord._flush(None))
            dt = self.rng.randint(*dt_ms)
            self.now += dt / 1000
            for b in self.boards.values():
                b.ms += dt
            if reboot_at is not None and self.now >= reboot_at:
                reboot_at = None
                self.coord.assign_width("s0", 0.01)     # a narrowing still in flight at the reboot
                self._coord(self.coord.handle_timer(self.now))
                self._send("up", "d0", [("state", self.agents["d0"].will())])
                self.boot("d0", 5, 99)          # back with epoch 0, a new boot id, a fresh clock
                self.settled = self.now + 2.0
            while self.net and self.net[0][0] <= self.now:
                _, _, direction, dev, p = heapq.heappop(self.net)
                if direction == "up":
                    self._coord(self.coord.handle_uplink(self.now, dev, p))
                else:
                    self._send("up", dev, self.agents[dev].handle_message(self.clocks[dev](), p))
            for dev, a in self.agents.items():
                now = self.clocks[dev]()
                due = a.next_deadline()
                if due is not None and due <= now:
                    self._send("up", dev, a.handle_timer(now))
                i = self.rng.randrange(len(a.names))
                key = a.names[i]
                self.vals[key] += self.rng.uniform(-0.4, 0.4) if not self.drift else \
                    self.drift * (1 - 2 * (i & 1)) + self.rng.uniform(-0.02, 0.02)
                t = float(a.stamp(now))
                self.truth[key][0].append(t)
                self.truth[key][1].append(f32(self.vals[key]))
                self._send("up", dev, a.handle_sample(now, i, self.vals[key]))
            self._coord(self.coord.handle_timer(self.now))


def test_float32_boards_without_ntp_across_tick_wrap_hold_every_bound():
    rig = Rig(3)
    rig.run(90.0)
    a = rig.agents["d0"]
    assert rig.violations == 0 and rig.checked > 10000
    assert a.period >= 85 and a.offset > 1600000000000      # shrinks at the backend's ticks
    assert rig.boards["d0"].ms > WRAP and rig.coord.stats["late"] <= 6      # ticks wrapped; late only before the config
    assert all(s.filt.rnd is f32 and s.filt.pad for s in rig.coord.cache.sources.values())


@pytest.mark.parametrize("rule", ["shrink", "estimate"])
def test_reboot_with_controls_in_flight_keeps_epochs_moving_and_bounds_true(rule):
    rig = Rig(2, down=0.25, latency=0.8, rule=rule)
    rig.run(30.0, reboot_at=rig.now + 15.0)
    a = rig.agents["d0"]
    s = rig.coord.cache.sources["s0"]
    assert a.stats["stale"] > 0                         # controls to the old boot arrived and were dropped
    assert a.filters[0].epoch == s.filt.epoch and s.old == []      # the device follows the new epochs
    assert rig.violations == 0 and rig.checked > 1500


def test_stale_high_epoch_is_no_confirmation_of_a_narrowing():
    cache = BoundCache()
    cache.add("k", "d", 0, 10.0, 3, 0.0)
    cache.sources["k"].filt.set_width(10.0, 3)
    cache.set_width("k", 2.0)                   # narrowing under epoch 4: the wide mirror is kept
    cache.report("k", 9, 1.0, 0.5)              # an epoch the backend never assigned (before a reboot)
    assert cache.known("k") == (-4.5, 5.5)
    cache.report("k", 4, 2.0, 0.5)
    assert cache.known("k") == (-0.5, 1.5)


def test_birth_of_200_sources_registers_every_source():
    names = ["source-with-a-long-name-%03d" % i for i in range(200)]
    c = Coordinator(make("deadband"), period=10.0)
    a = Agent("big", names, boot=5, width=1.0)
    a.handle_sample(0.0, 199, 4.0)
    for _, p in a.start(0.0):
        c.handle_uplink(0.0, "big", p)
    assert c.devices["big"]["keys"] == names and c.cache.sources[names[199]].index == 199
    assert c.cache.sources[names[199]].value == 4.0 and c.stats["late"] == 0


@pytest.mark.parametrize("rule", ["shrink", "estimate"])
def test_float32_boards_on_lines_hold_every_bound_at_every_event(rule):
    """Linear dual prediction (edge.core.predict) on float32 boards with integer-ms clocks: the cache's
    time-aware statement contains the truth at every event, and lines carry most of the reports (the
    default rule's included: moves fork the boards' constant deadband meters and free the sources to take
    lines, syncs make them deadband's constant twins again)."""
    rig = Rig(3, models=2, drift=0.02, rule=rule, **({"guard": 1e6} if rule == "estimate" else {}))
    lines = []
    up = rig.coord.handle_uplink

    def spy(now, dev, p, retained=False):
        kind, m = codec.decode(p)
        if codec.PLAIN.get(kind, kind) == "line":
            lines.append(m["slope"])
        return up(now, dev, p, retained)
    rig.coord.handle_uplink = spy
    p = rig.coord.protocol

    def move(r):        # as a reallocation would: half the sources narrowed, the other half widened
        for i, key in enumerate(sorted(p.rows.of)):
            p._send(r.coord, key, p._width(r.coord.cache.sources[key]) * (0.5 if i % 2 else 1.4))
    shadows = []
    look = lambda r: shadows.extend(sh for a in r.agents.values() for sh in a.meter.shadows if sh and not sh.slope)
    script = [(rig.now + 12.0, move), (rig.now + 30.0, look),
              (rig.now + 35.0, lambda r: p._revert(r.coord, r.coord.clock, True))]
    rig.run(60.0, script=script if rule == "estimate" else ())
    assert rig.violations == 0 and rig.checked > 5000
    # lines in use (irregular readings force gap reports too); under the default rule only while moved (12-35 s)
    assert sum(1 for s in lines if s) > (100 if rule == "shrink" else 30)
    if rule == "estimate":      # the moves forked constant deadband shadows; the syncs made twins again
        assert shadows and p.stats["syncs"] == 6 and all(a.meter.shadows == [None, None] for a in rig.agents.values())
