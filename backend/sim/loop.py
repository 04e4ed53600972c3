"""The one discrete-event loop of the simulator (DESIGN.md §5): event heap, per-event dispatch, host, agents.

Every simulation is a topology that subclasses ``Loop``: a fleet of filter agents
(``backend.sim.engine``), sensors behind relay nodes (``backend.sim.relay``, Zhang et al. 2005) and
a tree of summary sites (``backend.sim.summary``, Bulut & Singh 2003). The loop owns the heap of
timed events, hands each to its handler, moves payloads over the ``Network``, arms the agents' and
the coordinator's timers, and talks to the coordinator only through ``backend.host.Host`` (the same
adapter the live coordinator and the Spark job use), acting as the host's action sink. Work is done
per event and per reading instant, never per silent period.

A topology sets ``ORDER`` (event kind -> rank among events of the same instant), registers its own
kinds' handlers, and implements ``start`` (schedule what is known up front), optionally
``next_sample``/``samples`` (a stream of readings consumed in time order beside the heap) and
``result``.
"""
import heapq
import math
import time as _time

from backend import host as host_mod
from backend.sim.spec import WorkloadError

UP, DOWN, TIMER, COORD = "up", "down", "timer", "coord"   # the kinds every topology has


class Loop:
    ORDER = {UP: 0, DOWN: 1, TIMER: 2, COORD: 3}

    def __init__(self, network=None, host=None):
        self.net = network                # None: a topology that sends nothing over a network
        self.host = host
        self.coord = host.coord if host is not None else None
        self.heap = []
        self.n = 0
        self.agents = {}
        self.offset = {}                  # device -> its clock's fixed offset from true time (skew)
        self.timer_at = {}
        self.answers = []
        self.emitted = []             # the clock each answer was issued at
        self.now = 0.0
        self.end = math.inf           # events after this time are not run
        self.watch = None             # watch(now, device, payload, arrivals) of every uplink sent
        self.handlers = {UP: self.deliver_up, DOWN: self.deliver_down, TIMER: self.agent_timer,
                         COORD: self.coord_timer}

    # -- the heap ------------------------------------------------------------------------
    def push(self, t, kind, data):
        self.n += 1
        heapq.heappush(self.heap, (t, self.ORDER[kind], self.n, kind, data))

    def send(self, now, hop, end, payload, link=None):
        """Put ``payload`` on ``hop`` towards (or from) ``end``; it arrives as a ``hop`` event."""
        arrivals = self.net.arrivals(now, hop, end if link is None else link, payload)
        if self.watch is not None and hop == UP:
            self.watch(now, end, payload, arrivals)
        for at in arrivals:
            self.push(at, hop, (end, payload))

    def arm(self, who, t):
        """(Re)arm the timer of agent ``who`` (None: the coordinator) for time ``t``."""
        if t is not None and self.timer_at.get(who) != t:
            self.timer_at[who] = t
            self.push(t, COORD if who is None else TIMER, who)

    # -- agents ----------------------------------------------------------------------------
    def agent(self, device):
        return self.agents[device]

    def from_agent(self, now, device, out):
        for _, payload in out:
            self.send(now, UP, device, payload)
        deadline = self.agents[device].next_deadline()
        if deadline is not None and device in self.offset:     # the true time the device's clock reads it
            off = self.offset[device]
            at = deadline - off
            while at + off < deadline:
                at = math.nextafter(at, math.inf)
            deadline = at
        self.arm(device, deadline)

    def deliver_down(self, t, data):
        dev = data[0]
        self.from_agent(t, dev, self.agent(dev).handle_message(t + self.offset.get(dev, 0.0), data[1]))

    def agent_timer(self, t, device):
        if self.timer_at.get(device) == t:
            del self.timer_at[device]
            a = self.agent(device)
            due = a.next_deadline()
            now = t + self.offset.get(device, 0.0)
            if due is not None and due > now + 1e-6:    # readings moved its deadline on: re-arm there
                self.from_agent(t, device, [])
                return
            # the device's clock reads at least its deadline (skew rounding)
            self.from_agent(t, device, a.handle_timer(now if due is None else max(now, due)))

    # -- the coordinator, through the host --------------------------------------------------
    def from_host(self, now, actions):
        self.now = now
        host_mod.dispatch(actions, self)
        self.arm(None, self.host.next_deadline())

    def deliver_up(self, t, data):
        self.from_host(t, self.host.uplink(t, data[0], data[1]))

    def coord_timer(self, t, _):
        if self.timer_at.get(None) == t:
            del self.timer_at[None]
            self.from_host(t, self.host.timer(t))

    # the host's action sink
    def down(self, device, payload):
        self.send(self.now, DOWN, device, payload)

    def answer(self, change):
        self.answers.append(change)
        self.emitted.append(self.now)

    def error(self, qid, message):
        raise WorkloadError("query %s: %s" % (qid, message))

    def retract(self, qid):
        pass

    # -- running --------------------------------------------------------------------------------
    def start(self):
        raise NotImplementedError

    def next_sample(self):
        return math.inf

    def samples(self, t):
        raise NotImplementedError

    def finish(self):
        """After the last event: let the coordinator release everything up to the end."""
        if self.host is not None:
            self.from_host(self.end, self.host.timer(self.end))

    def run(self):
        wall = _time.perf_counter()
        self.start()
        heap, handlers = self.heap, self.handlers
        end = self.end
        while True:
            st = self.next_sample()
            if heap and heap[0][0] <= st:
                t, _, _, kind, data = heapq.heappop(heap)
                if t > end:
                    break
                handlers[kind](t, data)
                continue
            if st == math.inf:
                break
            self.samples(st)
        self.finish()
        return self.result(_time.perf_counter() - wall)

    def result(self, elapsed):
        raise NotImplementedError
