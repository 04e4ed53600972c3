"""A device's uplink delivery (DESIGN.md §3 sequence numbers and heartbeat, §4 bounded withdrawal): numbers,
marks, and ack mode's resend buffer.

Every uplink takes the next 32-bit sequence number (a birth too), so the backend finds a lost one by its
gap. A device silent for the heartbeat B (the backend's ``config.beat``) sends a ``mark``: the latest
number already used, stamped with the time through which its data is complete. A mark takes no number,
so a lost mark is never a gap; the backend finds a lost last report from the mark's number, and a device
gone quiet from the missing marks. On a lossy link the backend turns ack mode on (``link`` with a resend
timeout rto > 0): every numbered uplink is kept until an ``ack`` covers its number and is sent again
unchanged (its original number and stamp) when unacknowledged for rto, then 2·rto and 4·rto, then every
4·rto; one followed by a later uplink first at 3·rto (the backend sees its gap from the later number and
asks for it sooner with a ``nack``, which resends it at once; it acknowledges only once the device is
quiet, ``backend.coordinator.core.acks``); so a loss costs a round trip or a resend delay, not a
resynchronisation. At most ``size`` are kept (a few on a board), and ``budget`` bytes unless one alone is
more: the oldest goes first, and the backend then sees its gap. A birth supersedes what is kept. One
resent ``TRIES`` times is given up (the backend acknowledges what it refuses too, so only an uplink it
never hears gets there): the marks its resends held back go out again and show the backend its number
missing, a lost uplink it resynchronises with a birth.
Each boot numbers from its own start, boot·SPREAD mod 2**30 (boot 0 from 0; below 2**30, a 32-bit board's numbers
stay small ints): boot ids differ, so a reboot's numbers lie far from the last boot's (uplinks carry no boot), and a
reboot whose birth the backend missed shows as numbers far outside its window, never as the old boot's next ones.
Sans-IO, portable, float32-safe: times are the caller's clock (integer ms on a board, ``unit`` 1000).
"""
from edge.core import codec

CAP = 4         # the longest resend wait, in rto
TRIES = 64      # resends of one uplink at most (about 250·rto)
SPREAD = 0x278DDE6D     # 2**30 / golden ratio (odd): consecutive boots start about 0.38·2**30 apart


class Delivery:
    def __init__(self, size, budget=None, boot=0):
        if size < 1:
            raise ValueError("a resend buffer holds at least 1 message")
        self.size = size
        self.budget = budget    # bytes kept at most, unless the newest alone is more (None: no byte bound)
        self.seq = (boot * SPREAD) & 0x3FFFFFFF     # the latest number used
        self.beat = 0           # B in clock units (0: no marks)
        self.rto = 0            # resend timeout in clock units (0: ack mode off)
        self.last = None        # clock time of the latest uplink sent (a mark or a resend too)
        self.held = []          # [seq, payload, due, tries, last sent] not acknowledged yet, oldest first
        self.stats = {"resent": 0, "overflow": 0, "marks": 0, "given_up": 0}

    def number(self, now, kind, fields, keep=True):
        """The payload of uplink ``kind`` with the next number; kept for resending in ack mode."""
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        fields["seq"] = self.seq
        payload = codec.encode(kind, fields)
        self.last = now
        if self.rto and keep:
            held = self.held
            for e in held:              # followed by this one: its gap shows (a nack asks for it)
                if e[3] == 0 and e[2] < e[4] + 3 * self.rto:
                    e[2] = e[4] + 3 * self.rto
            held.append([self.seq, payload, now + self.rto, 0, now])
            n = 0
            for e in held:
                n += len(e[1])
            while len(held) > 1 and (len(held) > self.size or self.budget and n > self.budget):
                n -= len(held.pop(0)[1])
                self.stats["overflow"] += 1
        return payload

    def born(self, now):
        """A birth went out: it supersedes everything kept."""
        self.held = []
        self.last = now

    def shed(self):
        """The heap ran out: drop the older half of what is kept and skip a number, so whatever was being sent
        shows the backend a gap."""
        for _ in range((len(self.held) + 1) // 2):
            self.held.pop(0)
        self.seq = (self.seq + 1) & 0xFFFFFFFF

    def link(self, rto):
        """Ack mode with resend timeout ``rto`` (clock units); 0 turns it off."""
        self.rto = rto
        if not rto:
            self.held = []

    def acked(self, upto):
        """The backend has every uplink numbered up to ``upto`` (32-bit serial order)."""
        held = self.held
        while held and not 0 < (held[0][0] - upto) & 0xFFFFFFFF < 0x80000000:
            held.pop(0)

    def nacked(self, now, upto, miss):
        """The backend has every uplink through ``upto`` and misses ``miss``: its payload to resend now (none
        if it is not kept, was given up, or was sent less than rto/2 ago: a copy of the nack)."""
        self.acked(upto)
        for e in self.held:
            if e[0] == miss and e[3] < TRIES and 2 * (now - e[4]) >= self.rto:
                e[3] += 1
                e[2] = now + self.rto       # (known missing: again after rto if this one is lost too)
                e[4] = now
                self.stats["resent"] += 1
                self.last = now
                return [e[1]]
        return []

    def deadline(self):
        """Clock time of the next resend or mark; None when none is due ever."""
        t = None
        for e in self.held:
            if t is None or e[2] < t:
                t = e[2]
        if self.beat > 0 and self.last is not None:
            b = self.last + self.beat
            if t is None or b < t:
                t = b
        return t

    def due(self, now, busy, complete):
        """Payloads to send at ``now``: resends due, or a mark stamped ``complete`` (the time through which
        the device's data is sent) when it has been silent for B and ``busy`` (it sent something else now)
        is false."""
        out, gone = [], 0
        for e in self.held:
            if e[2] > now:
                continue
            if e[3] >= TRIES:           # its last resend unacknowledged too: given up
                e[3] = TRIES + 1
                gone += 1
                continue
            e[3] += 1
            e[2] = now + self.rto * (1 << e[3] if e[3] < 2 else CAP)
            e[4] = now
            out.append(e[1])
            self.stats["resent"] += 1
        if gone:
            self.held = [e for e in self.held if e[3] <= TRIES]
            self.stats["given_up"] += gone
        if out:
            self.last = now
        elif self.beat > 0 and self.last is not None and now >= self.last + self.beat and not busy:
            self.last = now
            self.stats["marks"] += 1
            out.append(codec.encode("mark", {"seq": self.seq, "t": complete}))
        return out
