"""Transport-independent loop body of the live agents (DESIGN.md §3 reconnect, §7 devices).

Feeds sensor readings, timers and control messages into ``edge.agent.Agent`` and hands what it
returns to ``send(channel, payload) -> bool`` (False: not delivered). Uplink messages that cannot be
delivered wait in a bounded ``Outbox``; births are never queued, since ``online`` sends a fresh one
after every (re)connect. ``skew`` (clock units) emulates a device clock that far ahead of the host's
(negative: behind): the agent reads the host clock plus it, the ground truth stays on the host clock.
A MemoryError that reaches a runtime's loop goes to ``oom``: the agent runs on (DESIGN.md §9), and owes a birth,
sent at most one per heartbeat B (``SPACING`` seconds when the backend set none) after the birth before it: a heap
that keeps running out costs a birth a heartbeat, not one a loop pass (the backend, which sees the gap, degrades the
device meanwhile and asks for a birth itself). Sans-IO and portable: both runtimes wrap this object.
"""

SPACING = 10            # s between births owed to MemoryErrors when the device has no heartbeat


class Pump:
    def __init__(self, agent, inputs, outbox, send, truth=None, skew=0):
        self.agent = agent
        self.inputs = inputs
        self.outbox = outbox
        self.send = send
        self.truth = truth       # optional writable file: every sample as "time,source,value"
        self.skew = skew
        self.ooms = 0            # MemoryErrors survived
        self.owed = False        # a birth is owed (the heap ran out): sent by a ``poll`` B after the birth before
        self.born = None         # when the latest birth went out (any: on reconnecting, asked for, owed)

    def _emit(self, now, out):
        for channel, payload in out:
            if channel == "state":          # a birth: it settles one owed
                self.send(channel, payload)
                self.owed, self.born = False, now
            elif len(self.outbox) or not self.send(channel, payload):
                self.outbox.push(payload)

    def online(self, now):
        """Just (re)connected: deliver what waited, then a birth that re-centres every source."""
        while len(self.outbox):
            if not self.send("up", self.outbox.peek()):
                return
            self.outbox.pop()
        self._emit(now, self.agent.start(now + self.skew))

    def message(self, now, payload):
        self._emit(now, self.agent.handle_message(now + self.skew, payload))

    def poll(self, now):
        """Take every reading due by ``now`` and fire the agent's timer if it is due."""
        if self.owed and (self.born is None or now - self.born >= self.spacing()):
            self._emit(now, self.agent.start(now + self.skew))
        for inp in self.inputs:
            for source, value in inp.poll(now):
                if self.truth is not None:
                    self.truth.write("%s,%s,%r\n" % (self.agent.stamp(now), source, value))
                self._emit(now, self.agent.handle_sample(now + self.skew, source, value))
        deadline = self.agent.next_deadline()
        if deadline is not None and deadline <= now + self.skew:
            self._emit(now, self.agent.handle_timer(now + self.skew))

    def spacing(self):
        """The least time between a birth and one owed to a MemoryError: the heartbeat B, or SPACING seconds."""
        return self.agent.delivery.beat or SPACING * self.agent.unit

    def wake(self):
        """Host time of the next reading, timer or owed birth; None when nothing is scheduled."""
        t = self.agent.next_deadline()
        if t is not None:
            t -= self.skew
        if self.owed:
            b = 0 if self.born is None else self.born + self.spacing()     # (0: at once)
            if t is None or b < t:
                t = b
        for inp in self.inputs:
            n = inp.next_time()
            if n is not None and (t is None or n < t):
                t = n
        return t

    def oom(self):
        """The heap ran out mid-step: free the older half of what is kept (the outbox, ack mode's resend buffer)
        and skip a sequence number. Whatever the step was sending (a report, segments already taken from their
        segmenter, a birth after reconnecting) may be lost and a filter recentred on it: the skipped number shows the
        backend a gap (it degrades the device's stretch), and the birth a ``poll`` sends (at most one a heartbeat)
        resynchronises every source; never a silent hole."""
        self.ooms += 1
        self.owed = True
        if len(self.outbox):
            self.outbox.shed()
        self.agent.delivery.shed()
