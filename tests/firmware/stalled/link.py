"""A broker that stalls, standing in for edge/runtime/micropython/link.py (tests/firmware/test_small_heap.py).

Connected for ``stall[0]`` ms (the first birth gets a config, segment mode on every source and ack mode, which
no ack then follows), unreachable for ``stall[1]`` ms, then connected again. Every uplink it takes is written to
``uplinks`` as "<ms since start> <hex>". MicroPython only (ticks_ms, sleep_ms).
"""
import time
from binascii import hexlify

from edge.core import codec

INC = 7


class Link:
    def __init__(self, cfg, will):
        self.stall = cfg["stall"]
        self.start = time.ticks_ms()
        self.out = open(cfg["uplinks"], "w")
        self.lag, self.width, self.n = cfg["seg_lag"], cfg["seg_width"], len(cfg["sources"])
        self.inbox = []
        self.overflows = 0
        self.failures = 0
        self.connected = False
        self.births = 0

    def _ms(self):
        return time.ticks_diff(time.ticks_ms(), self.start)

    def _stalled(self):
        return self.stall[0] <= self._ms() < self.stall[0] + self.stall[1]

    def up(self):
        if self.connected or self._stalled():
            return False
        self.connected = True
        return True

    def send(self, channel, payload):
        if self._stalled() and self.connected:
            self.connected = False
            self.failures += 1
        if not self.connected:
            return False
        self.out.write("%d " % self._ms())
        for k in range(0, len(payload), 32):        # a piece at a time: the log asks no large block of the agent's heap
            self.out.write(hexlify(payload[k:k + 32]))
        self.out.write("\n")
        if channel == "state" and not self.births:
            m = codec.decode(payload)[1]
            to = (m["boot"] ^ m["seq"]) & 0xFFFFFFFF
            self.inbox.append((0, codec.encode("config", {"seq": 1, "inc": INC, "to": to, "period": 0, "shrink": 0.0,
                                                          "beat": 0, "t0": 0, "now": 0, "tick": 0})))
            self.inbox.append((0, codec.encode("link", {"seq": 2, "inc": INC, "to": to, "rto": 1000, "guard": 0})))
            for i in range(self.n):
                self.inbox.append((0, codec.encode("segment", {"seq": 3 + i, "inc": INC, "to": to, "src": i,
                                                               "lag": self.lag, "model": 1, "width": self.width})))
        if channel == "state":
            self.births += 1
        return True

    def take(self):
        return self.inbox.pop(0)

    def ack(self, pid):
        pass

    def wait(self, ms):
        time.sleep_ms(ms)

    def close(self, payload):
        self.out.close()
