"""Relay node (Zhang et al. 2005 §3.3, §4.2-4.3, Algorithms 1-4): FDI, forecast and correct bodies, sans-IO.

A relay (e.g. a Raspberry Pi gateway) receives raw items ``<k, t>`` from many sensors. Each FDI
lifetime Tp = (tb, te] ends at the next querying-metadata boundary (a query's window start or end,
sent by the controller as ``moq`` messages) or at the next multiple of ``span``. At the start of a
lifetime (Generate-Prb) the relay runs eFreq on the hCount sketch of the previous lifetime Th, keeps
at most ``fdi`` frequent items k with a forecast ``f_e = round(|Tp|·F(k)/|Th|)`` and sends their
forecast bodies (k, Tp, f_e). During Tp (Processing-within-Tp) a frequent item only increments its
true count ``f_r`` (and C_f, S_f); every other item is forwarded raw. At the end (Generate-Crb) it
sends a correct body (k, Tp, f_r - f_e) for each k with ``|f_e - f_r| > δ·f_r``, where
``δ = min(delta, η_c·C_r/C_f, η_s·S_r/S_f)`` over the queries overlapping Tp (Theorems 1 and 2),
then closes the lifetime. Lifetimes close at ``te + lag`` so items delayed on the sensor hop by up to
``lag`` are still counted in their lifetime; later items are forwarded raw.

Bodies travel as codec ``blob`` messages; ``tag`` names the body type (``encode_*``/``decode_body``
are the one definition of their layout, used by the backend too). Every call takes ``now`` and
returns ``[(channel, payload)]``. Bad items and messages are counted, never raised. Portable.
"""
import struct

from edge.core import codec
from edge.core.delivery import Delivery
from edge.core.sketch import HCount, check_item

INF = float("inf")
FIRMWARE = "qf-relay-0.1"
CAP_RELAY = codec.CAP_RELAY    # birth capability bit: this device is a relay node

TAG_RAW = 1              # one raw item: "<I" k; blob t = the item's timestamp
TAG_PRB = 2              # forecast bodies: "<d" te, records "<Ii" (k, f_e); blob t = tb
TAG_CRB = 3              # correct bodies and end of lifetime: "<ddB" tb, δ, last; records "<Ii" (k, f_r - f_e); blob t = te
_PRB_HEAD = 8
_CRB_HEAD = 17
_REC = 8


def encode_raw(k):
    return struct.pack("<I", k)


def encode_bodies(tag, head, recs):
    """Blob data chunks for ``recs`` [(k, count)] under ``head`` (te for PRB, (tb, δ) for CRB)."""
    hsize = _PRB_HEAD if tag == TAG_PRB else _CRB_HEAD
    per = (codec.MAX_BLOB - hsize) // _REC
    chunks = []
    i = 0
    while True:
        part = recs[i:i + per]
        i += per
        last = i >= len(recs)
        if tag == TAG_PRB:
            buf = [struct.pack("<d", head)]
        else:
            buf = [struct.pack("<ddB", head[0], head[1], 1 if last else 0)]
        for k, c in part:
            buf.append(struct.pack("<Ii", k, c))
        chunks.append(b"".join(buf))
        if last:
            return chunks


def decode_body(tag, data):
    """``("raw", k)``, ``("prb", te, recs)`` or ``("crb", tb, δ, last, recs)``; CodecError if malformed."""
    n = len(data)
    if tag == TAG_RAW:
        if n != 4:
            raise codec.CodecError("raw body must be 4 bytes, got %d" % n)
        return ("raw", struct.unpack("<I", data)[0])
    if tag == TAG_PRB:
        hsize = _PRB_HEAD
    elif tag == TAG_CRB:
        hsize = _CRB_HEAD
    else:
        raise codec.CodecError("unknown relay body tag %d" % tag)
    if n < hsize or (n - hsize) % _REC:
        raise codec.CodecError("relay body of %d bytes does not fit its layout" % n)
    recs = []
    for pos in range(hsize, n, _REC):
        k, c = struct.unpack_from("<Ii", data, pos)
        if tag == TAG_PRB and c <= 0:
            raise codec.CodecError("forecast count must be positive")
        recs.append((k, c))
    if tag == TAG_PRB:
        te = struct.unpack_from("<d", data, 0)[0]
        if te != te:
            raise codec.CodecError("forecast lifetime end is NaN")
        return ("prb", te, recs)
    tb, delta, last = struct.unpack_from("<ddB", data, 0)
    if tb != tb or delta != delta or delta < 0 or last > 1:
        raise codec.CodecError("bad correct-body header")
    return ("crb", tb, delta, last == 1, recs)


def _int(v, name, lo):
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ValueError("relay %s must be an integer >= %d, got %r" % (name, lo, v))
    return v


def _num(v, name):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0 or v == INF:
        raise ValueError("relay %s must be a finite number >= 0, got %r" % (name, v))
    return float(v)


class RelayNode:
    def __init__(self, device, h=30, m=30, seed=1, support=0.005, domain=(0, 65535), fdi=300,
                 delta=0.1, span=0.0, lag=0.0, sum_rule="derived", boot=0):
        self.device = device
        self.sketch = HCount(_int(h, "h", 1), _int(m, "m", 1), _int(seed, "seed", 0))
        self.support = _num(support, "support")
        if self.support > 1:
            raise ValueError("relay support must be in [0, 1], got %r" % (support,))
        if not isinstance(domain, (list, tuple)) or len(domain) != 2:
            raise ValueError("relay domain must be [lo, hi]")
        check_item(domain[0])
        check_item(domain[1])
        if domain[1] < domain[0]:
            raise ValueError("relay domain needs lo <= hi")
        self.lo, self.hi = domain[0], domain[1]
        self.cap = _int(fdi, "fdi", 0)
        self.delta = _num(delta, "delta")
        self.span = _num(span, "span")
        self.lag = _num(lag, "lag")
        if sum_rule not in ("derived", "paper"):
            raise ValueError("relay sum_rule must be 'derived' (η·S_r/S_f) or 'paper' (η·S_f/S_r)")
        self.sum_rule = sum_rule
        self.boot = boot
        self.delivery = Delivery(16, None, boot)    # numbers, heartbeat marks (config.beat), ack mode (edge.core.delivery)
        self.queries = {}               # querying-metadata: qid -> (tb, te, agg, η)
        self.fdi = {}                   # k -> [f_e, f_r]
        self.t0 = self.tb = self.te = None
        self.th = None                  # start of the sketch's valid-statistical-interval Th
        self.cr = self.cf = self.sr = self.sf = 0
        self.max_t = -INF
        self.stats = {"items": 0, "raw": 0, "filtered": 0, "prb": 0, "crb": 0, "lifetimes": 0,
                      "late": 0, "bad_items": 0, "bad_messages": 0}

    # -- outgoing -------------------------------------------------------------------
    def _blob(self, now, t, tag, data):
        """A body stamped ``t`` sent at ``now`` (the delivery's clock: heartbeat and resend times)."""
        return ("up", self.delivery.number(now, "blob", {"src": 0, "t": t, "tag": tag, "data": data}))

    def _birth(self, now):
        out = ("state", self.delivery.number(now, "birth", {
            "t": now, "boot": self.boot, "fw": FIRMWARE, "caps": CAP_RELAY, "first": 0,
            "sources": [{"name": self.device, "epoch": 0, "width": INF, "v": INF}]}, False))
        self.delivery.born(now)
        return out

    def start(self, now):
        self.t0 = self.tb = self.th = now
        self.max_t = now
        self.te = self._next_end(now)
        return [self._birth(now)]

    # -- lifetimes -------------------------------------------------------------------
    def _next_end(self, after):
        """The first querying-metadata boundary (or multiple of ``span``) after ``after``."""
        end = INF
        for tb, te, _, _ in self.queries.values():
            for b in (tb, te):
                if after < b < end:
                    end = b
        if self.span > 0:
            n = int((after - self.t0) // self.span) + 1
            b = self.t0 + n * self.span
            if b <= after:
                b += self.span
            if b < end:
                end = b
        return end

    def next_deadline(self):
        t = self.delivery.deadline()
        if self.te is None or self.te == INF:
            return t
        return self.te + self.lag if t is None else min(t, self.te + self.lag)

    def handle_timer(self, now):
        out = []
        while self.te is not None and self.te != INF and now >= self.te + self.lag:
            out.extend(self._close(now))
        # a mark proves the data complete through the last closed lifetime (frequent items are only counted
        # until their correct body) and, for items forwarded raw, through now − lag (the sensor hop's delay)
        done = now - self.lag if self.tb is None or not self.fdi else min(self.tb, now - self.lag)
        return out + [("up", p) for p in self.delivery.due(now, bool(out), done)]

    def correct_factor(self, tb, te):
        """δ for the lifetime (tb, te]: Theorem 1 (COUNT) and Theorem 2 (SUM) for each overlapping query."""
        d = self.delta
        for qtb, qte, agg, eta in self.queries.values():
            if qtb < te and qte > tb:
                if agg == 0 and self.cf > 0:
                    d = min(d, eta * self.cr / self.cf)
                elif agg == 1 and self.sf > 0 and self.sr > 0:
                    d = min(d, eta * (self.sr / self.sf if self.sum_rule == "derived" else self.sf / self.sr))
        return d

    def _close(self, now):
        tb, te = self.tb, self.te
        # Generate-Crb (Algorithm 3)
        delta = self.correct_factor(tb, te)
        recs = []
        for k in sorted(self.fdi):
            fe, fr = self.fdi[k]
            if abs(fe - fr) > delta * fr:
                recs.append((k, fr - fe))
        out = [self._blob(now, te, TAG_CRB, d) for d in encode_bodies(TAG_CRB, (tb, delta), recs)]
        self.stats["crb"] += len(recs)
        self.stats["lifetimes"] += 1
        for qid in [q for q, v in self.queries.items() if v[1] <= te]:
            del self.queries[qid]
        # Generate-Prb (Algorithm 1) for the next lifetime, from the sketch of this one
        nxt = self._next_end(te)
        self.fdi = {}
        if nxt != INF and self.cap > 0 and te > self.th:
            scale = (nxt - te) / (te - self.th)
            prb = []
            for k, f in self.sketch.frequent(self.lo, self.hi, self.support, self.cap):
                c = int(f * scale + 0.5)
                if c > 0:
                    self.fdi[k] = [c, 0]
                    prb.append((k, c))
            if prb:
                out.extend(self._blob(now, te, TAG_PRB, d) for d in encode_bodies(TAG_PRB, nxt, prb))
                self.stats["prb"] += len(prb)
        # Processing-within-Tp (Algorithm 2) starts afresh
        self.sketch.clear()
        self.th = self.tb = te
        self.te = nxt
        self.cr = self.cf = self.sr = self.sf = 0
        self.max_t = te
        return out

    # -- incoming -------------------------------------------------------------------
    def handle_item(self, now, k, t=None):
        """A raw item ``k`` stamped ``t`` (default ``now``) from a sensor."""
        if t is None:
            t = now
        if (isinstance(k, bool) or not isinstance(k, int) or not self.lo <= k <= self.hi
                or isinstance(t, bool) or not isinstance(t, (int, float)) or t != t or t in (INF, -INF)):
            self.stats["bad_items"] += 1
            return []
        if self.tb is None:
            self.stats["bad_items"] += 1        # not started
            return []
        self.stats["items"] += 1
        if t <= self.tb:
            self.stats["late"] += 1             # its lifetime is closed: forward it raw
        else:
            self.sketch.add(k)
            if t <= self.te:
                self.cr += 1
                self.sr += k
                if t > self.max_t:
                    self.max_t = t
                e = self.fdi.get(k)
                if e is not None:
                    e[1] += 1
                    self.cf += 1
                    self.sf += k
                    self.stats["filtered"] += 1
                    return []
        self.stats["raw"] += 1
        return [self._blob(now, t, TAG_RAW, encode_raw(k))]

    def handle_sensor(self, now, payload):
        """A sensor's uplink payload: a ``blob`` carrying one raw item body."""
        try:
            kind, m = codec.decode(payload)
            if kind != "blob":
                raise codec.CodecError("a sensor sends blob messages, got %s" % kind)
            body = decode_body(m["tag"], m["data"])
            if body[0] != "raw":
                raise codec.CodecError("a sensor sends raw items only")
        except codec.CodecError:
            self.stats["bad_messages"] += 1
            return []
        return self.handle_item(now, body[1], m["t"])

    def handle_message(self, now, payload):
        """A downlink payload from the controller (querying-metadata, rebirth)."""
        try:
            kind, m = codec.decode(payload)
        except codec.CodecError:
            self.stats["bad_messages"] += 1
            return []
        if kind == "rebirth":
            return [self._birth(now)]
        if kind == "config" or kind == "setup":
            self.delivery.beat = codec.beat_ms(m["beat"]) / 1000
        elif kind == "link":
            self.delivery.link(m["rto"] / 1000)
        elif kind == "ack":
            self.delivery.acked(m["upto"])
        elif kind == "nack":
            return [("up", p) for p in self.delivery.nacked(now, m["upto"], m["miss"])]
        if kind != "moq":
            return []                           # widths and the like do not concern a relay
        if m["op"] == 0:
            self.queries.pop(m["qid"], None)
            return []
        if m["te"] < m["tb"] or m["agg"] > 1 or m["eta"] < 0 or m["op"] != 1:
            self.stats["bad_messages"] += 1
            return []
        self.queries[m["qid"]] = (m["tb"], m["te"], m["agg"], m["eta"])
        # a new boundary inside the current lifetime ends it early when no item has passed it yet
        if self.te is not None:
            for b in (m["tb"], m["te"]):
                if max(self.tb, self.max_t) < b < self.te and b + self.lag >= now:
                    self.te = b
        return self.handle_timer(now)
