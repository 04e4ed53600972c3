"""One micro:bit behind a gateway (DESIGN.md §3, §7): its UART frames to codec messages and back, sans-IO.

The sensor (firmware/microbit) speaks framed lines ``BODY|FLETCHER16`` of integers: values in 1/1024
units, time in 30-bit ``ticks_ms``. ``Bridge`` gives it an MQTT identity of its own: births, reports and
probe replies become ``edge.core.codec`` messages (version 2) with the sensor's sequence numbers, wall-clock
stamps in integer ms (ticks unwrapped and mapped by the recent least-delayed frames, detrended by the board's
rate: ``wall``; birth capability CAP_MS) and values ``k/1024`` (exact in double: no CAP_F32, the backend
mirrors the board in double, which contains the board's integer filter); downlinks (width, bound, filter,
probe, config, rebirth) become device frames, sent one at a time until acknowledged. As in ``edge.agent``, a control whose ``to`` is not the token of the latest
birth, or whose ``inc`` is not that of the backend run that configured the sensor since (a config of a
later run is adopted: ``edge.core.window.current``), is dropped, and duplicates by the same anti-replay window. A config's integer-ms schedule and its ``tick`` (periods the
backend has applied) set the board's shrink count and next shrink tick; a config repeating the schedule the
board already runs is not forwarded (the board's own count is never behind the backend's). Conversions
round toward the device: a bound ``[lo, hi]`` becomes ``[ceil, floor]`` of its ends in device units, a
width ``W`` the half-width ``floor(W·512)``, so the device is never wider than the backend's double mirror.
A checksum failure or a sequence gap from the device (a report may be lost) skips an uplink sequence
number, so the backend sees the loss as its own, and asks the device for a fresh birth. The MQTT side's
numbering, heartbeat marks and ack mode's resends are the agent's (``edge.core.delivery``): the gateway keeps
the sensor's unacknowledged uplinks, so the UART framing is unchanged. Every call takes ``now`` (wall
seconds) and returns actions ``(kind, ...)``.
"""
import math

from edge.core.window import current, fresh
from edge.core import codec
from edge.core.codec import NO_VALUE, CAP_MS
from edge.core.delivery import Delivery

FIRMWARE = "qf-microbit-0.2"
SCALE = 1024
BIG = 1 << 29               # the device's ±infinity
WRAP = 1 << 30              # ticks_ms period on the board
BLOCK = 0.25                # s of arrivals whose least-delayed frame is a point of the tick-to-wall envelope
SPAN = 3                    # blocks before the current one: the envelope's points, and the rate's baseline
RATE = 0.03                 # the most a board's clock is taken to run slow or fast (QEMU: 0.3-1 % slow)
RESEND = 0.3                # s without an acknowledgement before a frame is sent again
_MAX_FRAME = 110


def checksum(data):
    """Fletcher-16 of ``data`` (bytes), as the device computes it."""
    x = y = 0
    for c in data:
        x = (x + c) % 255
        y = (y + x) % 255
    return y << 8 | x


def frame(body):
    data = body.encode("ascii")
    return data + b"|%04x\n" % checksum(data)


def unframe(line):
    """The body of a framed line (bytes, no newline) as a list of tokens, or None if it fails its check."""
    line = line.strip()
    i = line.rfind(b"|")
    if i < 0 or len(line) != i + 5:
        return None
    try:
        if int(line[i + 1:], 16) != checksum(line[:i]):
            return None
        return line[:i].decode("ascii").split()
    except ValueError:
        return None


def _dev(x, up):
    """Value ``x`` in device units rounded toward the inside (``up``: ceil), infinities to ±BIG."""
    if x == math.inf:
        return BIG
    if x == -math.inf:
        return -BIG
    k = math.ceil(x * SCALE) if up else math.floor(x * SCALE)
    return max(-BIG, min(BIG, k))


def half(width):
    """The device's half-width for a backend width: floor(W·512), -1 for infinite (or wider than any value)."""
    if width == math.inf or width * (SCALE // 2) >= BIG:
        return -1
    return max(0, math.floor(width * (SCALE // 2)))


class Bridge:
    def __init__(self, source, boot):
        self.source = source
        self.boot = boot & 0xFFFFFFFF
        self.delivery = Delivery(16, None, self.boot)    # uplink numbers on MQTT (the sensor's identity), marks, resends
        self.g = 0                  # downlink frame number on the UART
        self.queue = []             # frames waiting for the device's acknowledgement
        self.sent_at = None
        self.token = None           # boot ^ seq of the latest birth: every downlink must carry it
        self.inc = None             # incarnation of the backend run that configured us after that birth
        self.top = None             # anti-replay window over downlink sequence numbers (edge.core.window.fresh)
        self.seen = 0
        self.offset = None          # wall seconds at tick 0 (this boot), at the latest tick mapped (``ref``)
        self.ref = 0.0              # the latest tick mapped (s, unwrapped)
        self.rate = 0.0             # d(arrival - tick)/d(tick): how much slower than the host the board's clock runs
        self.lows = []              # (block, tick s, arrival - tick) of each block's least-delayed frame, oldest first
        self.last_t = None
        self.dseq = None            # last device frame number
        self.last_rx = None
        self.pending = False        # a config waits for the first tick
        self.period = None          # (T ms, S, t0 ms, tick) of the backend's config, for the device's shrink grid
        self.applied = None         # (T, S, t0) the board runs since it booted
        self.stats = {"frames": 0, "bad_frames": 0, "gaps": 0, "reports": 0, "samples": 0, "down": 0,
                      "bad_messages": 0, "resent": 0, "device_errors": 0, "free": None, "min_free": None,
                      "device_samples": 0, "noise": 0, "stale": 0}

    # -- time ------------------------------------------------------------------------
    def wall(self, now, tick):
        """Wall time of device tick ``tick`` (30-bit, unwrapped near the expected value): the lower envelope of
        the frames' ``arrival - tick`` offsets, detrended by the board's rate. Each ``BLOCK`` of arrivals keeps
        its least-delayed frame; the rate is the median slope between the successive complete blocks of the last
        ``SPAN`` (a QEMU board's ``ticks_ms`` runs 0.3-1 % slow and changes with the host's load: an undetrended
        minimum over 10 s lagged real time by up to 0.2 s, and the backend follows a clock's drift at 20 ppm
        only); the stamp is the least of every kept frame's offset carried to ``tick`` at that rate, and never
        after ``now`` (a sample precedes its frame). Mapped times never go backwards; frames of one tick share
        one stamp."""
        if self.offset is None:
            self.offset = now - tick / 1000.0
            self.lows = []
            self.rate = 0.0
            self.last_t = None
        ext = tick + WRAP * round(((now - self.offset) * 1000.0 - tick) / WRAP)
        x = ext / 1000.0
        if x == self.ref and self.last_t is not None:
            return self.last_t          # a sample's frames (V, then R) carry its tick: one stamp for all of them
        o = now - x
        lows, b = self.lows, int(now // BLOCK)
        if lows and lows[-1][0] == b:
            if o < lows[-1][2]:
                lows[-1] = (b, x, o)
        else:
            lows.append((b, x, o))
            while lows[0][0] < b - SPAN:
                lows.pop(0)
        if len(lows) > 2:       # the median of the complete blocks' successive slopes: a step is one of them
            k = sorted((q[2] - p[2]) / (q[1] - p[1]) for p, q in zip(lows[:-2], lows[1:-1]) if q[1] > p[1])
            self.rate = max(-RATE, min(RATE, k[len(k) // 2])) if k else 0.0
        off = o
        for _, xj, oj in lows:
            off = min(off, oj + self.rate * (x - xj))
        self.offset, self.ref = off, x
        # whole milliseconds, as the report carries it (CAP_MS), so ground truth and report agree exactly
        t = round((off + x) * 1000) / 1000
        if self.last_t is not None and t < self.last_t:
            t = self.last_t
        self.last_t = t
        return t

    def tick_of(self, t):
        """The device tick at wall time ``t`` (the inverse of ``wall`` at the board's current rate)."""
        x = self.ref + (t - self.offset - self.ref) / (1 + self.rate)
        return int(round(x * 1000.0)) % WRAP

    # -- device -> backend --------------------------------------------------------------
    def _up(self, now, channel, kind, fields):
        fields["t"] = int(round(fields["t"] * 1000))       # CAP_MS: integer milliseconds
        return (channel, self.delivery.number(now, kind, fields, channel == "up"))

    def _lost(self, now):
        """A device frame was lost or damaged (a report, perhaps): skip an uplink sequence number, so the
        backend sees a lost uplink (it degrades the sensor and revokes its answers since), and ask the
        device for a fresh birth to resynchronise."""
        self.delivery.seq = (self.delivery.seq + 1) & 0xFFFFFFFF
        return self.rebirth(now)

    def from_device(self, now, line):
        """One line from the UART; returns actions."""
        f = unframe(line)
        if f is None:
            if b"|" in line:
                self.stats["bad_frames"] += 1
                return self._lost(now)
            self.stats["noise"] += 1 if line.strip() else 0
            return [("noise", line)] if line.strip() else []
        self.stats["frames"] += 1
        self.last_rx = now
        try:
            kind, n, a = f[0], int(f[1]), f[2:]
            out = self._device(now, kind, n, a)
            if self.pending and self.offset is not None:
                out += self._config(now)
            return out
        except (ValueError, IndexError, codec.CodecError):
            self.stats["bad_frames"] += 1
            return []

    def _device(self, now, kind, n, a):
        out = []
        if kind == "B" and n == 1:          # the device (re)booted: new tick origin
            self.offset = None
            self.queue = []
            self.applied = None
        elif self.dseq is not None and n != (self.dseq + 1) & 0xFFFF and kind != "B":
            self.stats["gaps"] += 1
            out += self._lost(now)
        self.dseq = n
        if kind == "B":
            ep, h = int(a[0]), int(a[1])
            v = NO_VALUE if a[2] == "-" else int(a[2]) / SCALE
            rec = {"name": self.source, "epoch": ep, "width": math.inf if h < 0 else 2 * h / SCALE, "v": v}
            # stamped as of the latest frame it follows (the state it carries is the board's after that sample):
            # an uplink right behind it, of a sample taken before the birth frame arrived, is mapped earlier
            # than ``now``, and a stamp before its birth's reads as sent before it (the backend drops it)
            t = now if self.offset is None or self.last_t is None else min(now, self.last_t)
            out.append(self._up(now, "state", "birth", {"t": t, "boot": self.boot, "fw": FIRMWARE, "caps": CAP_MS,
                                                        "first": 0, "sources": [rec]}))
            self.token = (self.boot ^ self.delivery.seq) & 0xFFFFFFFF
            self.delivery.born(now)
            self.inc = self.top = None
            self.seen = 0
        elif kind == "R":
            self.stats["reports"] += 1
            out.append(self._up(now, "up", "report", {"src": 0, "epoch": int(a[1]), "t": self.wall(now, int(a[0])),
                                                      "v": int(a[2]) / SCALE, "why": int(a[3])}))
        elif kind == "A":
            v = NO_VALUE if a[2] == "-" else int(a[2]) / SCALE
            out.append(self._up(now, "up", "reply", {"src": 0, "epoch": int(a[1]), "t": self.wall(now, int(a[0])),
                                                     "v": v, "probe": int(a[3])}))
        elif kind == "V":
            self.stats["samples"] += 1
            out.append(("sample", self.wall(now, int(a[0])), int(a[1])))
        elif kind == "S":
            self.wall(now, int(a[0]))
            self.stats["device_samples"], self.stats["free"] = int(a[1]), int(a[2])
            m = int(a[3])
            self.stats["min_free"] = m if self.stats["min_free"] is None else min(m, self.stats["min_free"])
            self.stats["device_errors"] = int(a[4])
        elif kind == "K":
            if self.queue and self.queue[0][0] == int(a[0]):
                self.queue.pop(0)
                self.sent_at = None
                out += self.poll(now)
        elif kind == "E":
            self.sent_at = None                 # the device saw a damaged frame: send it again now
            out += self.poll(now)
        elif kind == "G":
            out.append(("state", codec.encode("gone", {"boot": self.boot})))
        return out

    # -- backend -> device ----------------------------------------------------------------
    def _send(self, now, kind, *args):
        self.g = (self.g + 1) % 100000
        body = " ".join([kind, str(self.g)] + [str(x) for x in args])
        if len(body) > _MAX_FRAME:
            raise ValueError("frame too long for the device")
        self.queue.append((self.g, frame(body)))
        return self.poll(now)

    def rebirth(self, now):
        """Ask the device for a fresh birth (at gateway start and after anything was lost)."""
        return self._send(now, "Q")

    def poll(self, now):
        """Send the head frame when nothing is in flight or its acknowledgement is overdue; resends and marks."""
        out = []
        if self.queue and (self.sent_at is None or now - self.sent_at >= RESEND):
            if self.sent_at is not None:
                self.stats["resent"] += 1
            self.sent_at = now
            out.append(("tx", self.queue[0][1]))
        for payload in self.delivery.due(now, False, int(round(now * 1000))):
            out.append(("up", payload))
        return out

    def _config(self, now):
        T, shrink, t0, tick = self.period
        if self.offset is None:             # no tick seen yet: sent with the first one
            self.pending = True
            return []
        self.pending = False
        if self.applied == (T, shrink, t0):
            return []                       # the board counts this schedule's periods itself
        self.applied = (T, shrink, t0)
        if T <= 0 or shrink <= 0:
            return self._send(now, "C", 0, 1024, 0, 0)
        k = tick + 1                        # the next shrink: boundaries already passed are applied at once
        return self._send(now, "C", T, int(math.floor((1 - shrink) * SCALE)), k, self.tick_of((t0 + k * T) / 1000))

    def from_backend(self, now, payload):
        """One ``ctl`` payload for this sensor; returns actions (frames for the device)."""
        try:
            kind, m = codec.decode(payload)
            if codec.SCHEMAS[kind][1] != "down":
                raise codec.CodecError("not a control message")
            if kind == "rebirth":
                self.stats["down"] += 1
                return self._send(now, "Q")
            if m["to"] != self.token or not current(self.inc, kind, m["inc"]):
                self.stats["stale"] += 1    # sent before the latest birth, or by an earlier backend run
                return []
            if kind == "config" and m["inc"] != self.inc:
                self.inc, self.top, self.seen = m["inc"], None, 0
            ok, self.top, self.seen = fresh(self.top, self.seen, m["seq"])
            if not ok:
                return []
            self.stats["down"] += 1
            if kind == "config":
                if not 0 <= m["shrink"] < 1:
                    raise ValueError("bad config")
                self.delivery.beat = codec.beat_ms(m["beat"]) / 1000
                self.period = (m["period"], m["shrink"], m["t0"], m["tick"])
                return self._config(now)
            if kind == "nack":
                return [("up", p) for p in self.delivery.nacked(now, m["upto"], m["miss"])]
            if kind == "ack" or kind == "link":
                if kind == "ack":
                    self.delivery.acked(m["upto"])
                else:       # (no guard: the backend states the sensor's whole band while its time is unsure)
                    self.delivery.link(m["rto"] / 1000)
                return []
            if kind in ("summary", "moq", "segment") or m["src"] != 0:
                raise ValueError("the sensor has one source and no summaries or segments")
            if kind == "probe":
                return self._send(now, "P", m["probe"])
            ep = m["epoch"]
            if kind == "width":
                return self._send(now, "W", ep, half(m["width"]), m["ack"], m["period"])
            if kind == "bound":
                h = -1 if m["lo"] == -math.inf or m["hi"] == math.inf else half(m["hi"] - m["lo"])
                return self._send(now, "L", ep, h, m["ack"], _dev(m["lo"], True), _dev(m["hi"], False))
            cons = []
            for c in m["cons"]:
                cons += [_dev(c["l"], True), _dev(c["u"], False)]
            return self._send(now, "F", ep, half(m["width"]), m["ack"], *cons)
        except (codec.CodecError, ValueError, KeyError):
            self.stats["bad_messages"] += 1
            return []
