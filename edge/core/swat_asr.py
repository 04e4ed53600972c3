"""SWAT-ASR's source site on the device (Bulut & Singh 2003 §3, Fig. 8a), portable to MicroPython.

``Replicator`` keeps one SWAT tree (``swat.py``) and pushes a replicated segment's range when the one
the backend holds no longer encloses it, or answers a forwarded read; ``configure`` and ``ship`` are the
agent's ``summary`` control and its ``blob`` uplink. ``pack_segments``/``unpack_segments`` are the rows'
compact encoding (codec ``blob``, tag ``TAG``), bounds rounded outward to float32.
"""
import struct

from edge.core.swat import Swat

INF = float("inf")  # not a literal: 1e300 overflows a float32 board's frozen constants


def encloses(old, lo, hi):
    """Whether the replica range ``old`` = (lo, hi) still holds [lo, hi] (Fig. 8a's enclosure test)."""
    return old is not None and old[0] <= lo and hi <= old[1]


class Replicator:
    """The source site of SWAT-ASR (§3, Fig. 8a) on the device: one SWAT tree and, per segment the
    backend replicates (bit s of ``subs``), the range last shipped. A new reading pushes every
    replicated segment whose new range the shipped one no longer encloses; a forwarded read (mask
    ``read``) is answered with the current rows, and again if a reading arrives at the same instant
    so the reply covers every reading stamped up to its time. ``pads`` widen shipped ranges (the
    baselines' cache widths). Rows are (segment, lo, hi, mean)."""

    def __init__(self, window, k=1):
        self.tree = Swat(window, k)
        self.subs = 0
        self.pads = {}
        self.sent = {}          # segment -> (lo, hi) the backend holds
        self.read = 0           # segments of a forwarded read still owed
        self.read_t = None      # time of the last read reply

    def _row(self, s):
        r = self.tree.segment(s)
        if r is None:
            return None
        if (self.subs >> s) & 1:
            p = self.pads.get(s, 0.0)
            r = (r[0] - p, r[1] + p, r[2])
            self.sent[s] = (r[0], r[1])
        return (s, r[0], r[1], r[2])

    def _rows(self, mask):
        out = []
        for s in range(self.tree.n):
            if (mask >> s) & 1:
                r = self._row(s)
                if r is None:
                    return None
                out.append(r)
        return out

    def control(self, now, subs, read, pads):
        """Apply a summary control; returns the rows to ship now (new subscriptions, the read)."""
        if subs >> self.tree.n or read >> self.tree.n:
            raise ValueError("segment mask beyond the window's %d segments" % self.tree.n)
        for s in pads:
            if not 0 <= pads[s] < INF:
                raise ValueError("segment pads must be finite and >= 0")
        for s in list(self.sent):
            if not (subs >> s) & 1:
                del self.sent[s]
        new = subs & ~self.subs
        self.subs = subs
        self.pads = pads
        out = []
        for s in range(self.tree.n):
            if (new >> s) & 1 and not (read >> s) & 1:
                r = self._row(s)
                if r is not None:
                    out.append(r)
        if read or self.read_t is not None:
            self.read = read            # (a control without a read keeps one still owed)
        return out + self._answer(now)

    def _answer(self, now):
        rows = self._rows(self.read) if self.read else None
        self.read_t = now if rows else None
        return rows or []

    def sample(self, now, v):
        """Take a reading; returns the rows to push (and a read reply still owed or due again)."""
        self.tree.update(v)
        out = []
        if self.read:
            if self.read_t is None or self.read_t == now:
                out = self._answer(now)
            else:
                self.read = 0           # the reply of an earlier instant stands
        done = 0
        for r in out:
            done |= 1 << r[0]
        for s in range(self.tree.n):
            if (self.subs >> s) & 1 and not (done >> s) & 1:
                r = self.tree.segment(s)
                if r is not None and not encloses(self.sent.get(s), r[0], r[1]):
                    out.append(self._row(s))
        return out


def ship(agent, now, i, rows):
    """The agent's uplink for SWAT rows of its source ``i``: one blob tagged TAG (or nothing)."""
    if not rows:
        return []
    return [agent._up(now, "blob", {"src": i, "t": now, "tag": TAG,
                                    "data": pack_segments(agent.summaries[i].tree.count, rows)})]


def configure(agent, now, i, m):
    """Apply a ``summary`` control to ``agent`` (allocating its tree on first use; window 0 frees it)."""
    if m["window"] == 0:
        if agent.summaries is not None:
            agent.summaries.pop(i, None)
        return []
    r = agent.summaries.get(i) if agent.summaries is not None else None
    if r is None or r.tree.window != m["window"] or r.tree.k != m["k"]:
        r = Replicator(m["window"], m["k"])
        if agent.summaries is None:
            agent.summaries = {}
        agent.summaries[i] = r
    pads = {}
    for p in m["pad"]:
        pads[p["seg"]] = p["w"]
    return ship(agent, now, i, r.control(now, m["subs"], m["read"], pads))


# -- compact blob encoding of segment approximations (codec "blob", tag TAG) ----------------------
TAG = 0x53          # 'S'
_HEAD = "<IB"       # readings seen, number of entries
_ENTRY = "<Bfff"    # segment id, lo (rounded down), hi (rounded up), mean (float32)
_F32 = 2.0 ** -23


def _f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _down(x):
    y = _f32(x)
    while y > x:
        y = _f32(y - abs(y) * _F32 - 1e-38)
    return y


def _up(x):
    y = _f32(x)
    while y < x:
        y = _f32(y + abs(y) * _F32 + 1e-38)
    return y


def pack_segments(count, entries):
    """Encode [(segment id, lo, hi, mean)] in 1 + 13 bytes each; bounds are rounded outward so
    the float32 interval still contains the exact readings."""
    if len(entries) > 255:
        raise ValueError("at most 255 segments per blob")
    out = [struct.pack(_HEAD, count & 0xFFFFFFFF, len(entries))]
    for sid, lo, hi, mean in entries:
        out.append(struct.pack(_ENTRY, sid, _down(lo), _up(hi), mean))
    return b"".join(out)


def unpack_segments(data):
    """Inverse of pack_segments; raises ValueError on anything malformed."""
    if len(data) < 5:
        raise ValueError("segment blob too short")
    count, n = struct.unpack_from(_HEAD, data, 0)
    if len(data) != 5 + 13 * n:
        raise ValueError("segment blob length does not match its %d entries" % n)
    entries = []
    for j in range(n):
        sid, lo, hi, mean = struct.unpack_from(_ENTRY, data, 5 + 13 * j)
        if not lo <= hi:
            raise ValueError("segment %d has lo > hi or a NaN bound" % sid)
        entries.append((sid, lo, hi, mean))
    return count, entries
