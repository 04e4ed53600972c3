"""Versioned compact wire format shared by devices and backend (DESIGN.md §3).

Every payload is ``VERSION, KIND, fields...`` in little-endian binary. Each kind has a fixed
schema in ``SCHEMAS``; ``encode(kind, fields)`` and ``decode(payload)`` are the only entry points.
Anything malformed, truncated, oversized, of an unknown version or kind, or carrying NaN raises
``CodecError`` and nothing else. Portable: runs unchanged on MicroPython and CPython.
"""
import struct

VERSION = 2          # 2: device times (T), integer-ms downlink times, incarnation and birth token on downlinks, birth parts
# New kinds (segs 8, mark 9, mreport 11, mline 12, rsegs 13, segment 23, ack 26, link 27; beat 3 is gone) extend
# version 2 backwards-compatibly: an older peer drops them as unknown kinds.
MAX_PAYLOAD = 4096
MAX_STR = 64
MAX_LIST = 255
MAX_BLOB = 3072


NO_VALUE = float("inf")     # value field of a birth/reply when a source has no reading yet


CAP_RELAY = 2       # birth capability bits: this device is a relay node (edge.core.relay)
CAP_F32 = 4         # the device computes in single-precision floats: the backend mirrors it in float32, padded
CAP_MS = 8          # the device's times are integer milliseconds (``t`` fields hold ms, not seconds)
CAP_LINE = 16       # the device understands ``setup`` and may send ``line`` reports (edge.core.predict)
CAP_METER = 32      # the device meters plain deadband (edge.core.meter): its reports are ``mreport``/``mline``

# Bits of the ``ack`` field of ``width``/``filter`` controls: ACK asks for the acknowledging report; METER
# (only to a CAP_METER device) says the filter is also plain deadband's, for the device's meter; SYNC
# makes the device adopt its meter's filter and acknowledge with its centre (edge.core.meter).
ACK = 1
METER = 2
SYNC = 4


BEAT_S = 1 << 31    # a config's ``beat`` at or above this is BEAT_S + whole seconds (a device older than that
                    # reads it as ms: it sends marks more often than asked, never fewer)


def beat_field(seconds):
    """A heartbeat of ``seconds`` as a config's ``beat``: ms below BEAT_S, else BEAT_S + whole seconds."""
    ms = round(seconds * 1000)
    return ms if ms < BEAT_S else BEAT_S + min(round(seconds), BEAT_S - 1)


def beat_ms(field):
    """A config's ``beat`` in ms (``beat_field``)."""
    return field if field < BEAT_S else (field - BEAT_S) * 1000


def newer(a, b):
    """Serial-number order of 16-bit epochs (RFC 1982): True when ``a`` is after ``b``."""
    d = (a - b) & 0xFFFF
    return 0 < d < 0x8000


class CodecError(ValueError):
    """The one error type the decoder (and encoder) raises for bad input."""


# Report reasons ("why" field of a report).
WHY_EXIT = 0      # the reading left its bound or changed constraint membership
WHY_SHRINK = 1    # re-check after the periodic shrink found the value outside
WHY_ASSIGN = 2    # re-check (or acknowledgement) after a bound/width/filter assignment
WHY_RESYNC = 3    # first report of a source after start or reconnect
WHY_FIRST = 4     # first reading of a source
WHY_GAP = 5       # a line's source had no reading for its gap bound: its last reading, as a constant
WHY_SYNC = 6      # the source adopted its meter's filter (a SYNC control, a departure that lost): v is its centre
WHY_METER = 7     # a moved source's deadband meter counted reports the backend has not heard of (edge.core.meter)
# (0x40, 0x20: flags of a lead, edge.core.predict LEAD_UP and LEAD_DOWN, defined there: boards without lines load none)
GUARDED = 0x80    # flag on ``why``: the device reports any reading within its guard time after this report
#                   that leaves the hull of its bound before it and this value (``link``; the backend strips it)

# Field types: B u8, H u16, I u32, q signed 64-bit integer, d f64, s short utf-8 string (u8 length),
# y byte blob (u16 length), T a device time: an IEEE double on the wire, which a device holding integer
# milliseconds builds exactly from the integer's bits (a float32 board's struct 'd' would pack a float32
# value: 128 s steps near 1.7e9), and * a list (u8 count) of records whose fields are all the remaining
# ones of the schema. Downlink times are integer milliseconds (q), which a float32 device reads exactly.
# kind name -> (code, direction, types, names): one struct-like type string and one space-separated
# names string per kind, split only while a message is coded (a table of tuples cost ~10 KB of
# MicroPython heap).
SCHEMAS = {
    # uplink: device -> backend. A birth too large for one payload is sent in parts; ``first`` is the
    # index of the part's first source.
    "report": (1, "up", "BHITdB", "src epoch seq t v why"),
    "reply": (2, "up", "BHITdH", "src epoch seq t v probe"),
    "birth": (4, "up", "ITIsBB*sHdd", "seq t boot fw caps first sources name epoch width v"),
    "gone": (5, "up", "I", "boot"),
    "blob": (6, "up", "BITBy", "src seq t tag data"),
    # a report that starts a line (edge.core.predict): slope per device time unit, gap in device time
    # units (a slope of 0 is read as a constant report, which devices send as ``report``). Sent only by a
    # device the backend allowed lines (``setup``).
    "line": (7, "up", "BHITdBdT", "src epoch seq t v why slope gap"),
    # segment mode (edge.core.segment): line v + s·(τ − a) ± w/2 over [a, e); f bit 0: committed, goes on past e
    "segs": (8, "up", "IT*BHTTdddB", "seq t segs src epoch a e v s w f"),
    # a report / line report of a metered device (CAP_METER, edge.core.meter): n = the reports plain deadband
    # would have sent for this source so far, k = the source's readings so far (both modulo 2^16); a line's
    # origin o (= t, but for the acknowledgement of a SYNC, which takes a line begun earlier)
    "mreport": (11, "up", "BHITdBHH", "src epoch seq t v why n k"),
    "mline": (12, "up", "BHITdBdTHHT", "src epoch seq t v why slope gap n k o"),
    # the heartbeat (edge.core.delivery): ``seq`` is the latest uplink number already used (a mark takes
    # none, so a lost mark is never a gap); the device's data is complete through its time ``t``
    "mark": (9, "up", "IT", "seq t"),
    # a report (as ``report``) of a source in segment mode whose real-time filter it left, carrying the
    # device's pending segment records (as ``segs``, any of its sources): lagged data rides along for free
    "rsegs": (13, "up", "BHITdB*BHTTdddB", "src epoch seq t v why segs src epoch a e v s w f"),
    # downlink: backend -> device. Every one carries the backend's incarnation ``inc`` (one per backend
    # run) and ``to``, the token of the device birth it answers (boot ^ the birth's seq): a device drops
    # a control message from before its latest birth or from another backend run.
    "width": (16, "down", "BHIIIIdB", "src epoch seq inc to period width ack"),
    "bound": (17, "down", "BHIIIddB", "src epoch seq inc to lo hi ack"),
    "filter": (18, "down", "BHIIIdB*dd", "src epoch seq inc to width ack cons l u"),
    "probe": (19, "down", "BIIIH", "src seq inc to probe"),
    # times in integer ms: period T, beat, the tick origin t0 and the backend's clock now; tick = the
    # number of adjustment periods (shrinks) the backend has applied, so both sides count the same periods.
    # ``beat`` over 2^31 ms (24.8 days) is whole seconds with the top bit set (``beat_field``, ``beat_ms``)
    "config": (20, "down", "IIIIdIqqI", "seq inc to period shrink beat t0 now tick"),
    "rebirth": (21, "down", "III", "seq inc to"),
    # segment mode for source src: send data of time τ by τ + lag (ms); model 1 line, 2 constant, 0 off;
    # segments within ±width/2 (the lag queries' width; the source's filter keeps the real-time queries')
    "segment": (23, "down", "BIIIqBd", "src seq inc to lag model width"),
    # SWAT summary replication (Bulut & Singh 2003 §3): window 0 drops the tree; subs/read are segment masks
    "summary": (22, "down", "BIIIHBII*Bd", "src seq inc to window k subs read pad seg w"),
    # querying-metadata for relay nodes (Zhang et al. 2005 §3.2): op 1 add / 0 remove, agg 0 count / 1 sum
    # a config plus the filter models the device may use (edge.core.predict bits: 1 constant, 2 linear),
    # sent instead of ``config`` to a device whose birth says CAP_LINE
    "setup": (24, "down", "IIIIdIqqIB", "seq inc to period shrink beat t0 now tick allow"),
    # ack mode (edge.core.delivery): the backend has every uplink of this birth numbered up to ``upto``
    # (serial order); ``now`` its clock (ms) when sent. ``link``: resend timeout ``rto`` in ms (0: ack mode off)
    # and ``guard`` in ms (0: none), the time after a report within which readings are guarded (GUARDED)
    "ack": (26, "down", "IIIIq", "seq inc to upto now"),
    "link": (27, "down", "IIIII", "seq inc to rto guard"),
    # a gap: the backend has every uplink through ``upto`` and misses ``miss`` (a later number came): resend it now
    "nack": (28, "down", "IIIII", "seq inc to upto miss"),
    "moq": (30, "down", "IIIBsddBd", "seq inc to op qid tb te agg eta"),
}

_M52 = (1 << 52) - 1


def _time_bits(n):
    """The IEEE-754 double bits of the integer ``n`` (|n| < 2**53), computed with integers only."""
    if n == 0:
        return 0
    sign = 0
    if n < 0:
        sign, n = 1 << 63, -n
    e = 0                        # floor(log2 n), allocating nothing (``bin`` made a string on a board's heap)
    for k in (32, 16, 8, 4, 2, 1):
        if n >> (e + k):
            e += k
    return sign | (1023 + e) << 52 | ((n << (52 - e)) & _M52)


def record_size(rec):
    """Encoded size of one birth source record (name epoch width v)."""
    return 19 + len(rec["name"].encode())


PLAIN = {"mreport": "report", "mline": "line"}     # the metered kinds read as the plain ones, n and k besides

NAMES = {}
for _name in SCHEMAS:
    NAMES[SCHEMAS[_name][0]] = _name

# The fast path of kinds whose fields all have a fixed size (no string, blob or list): kind -> (one struct
# format for every field, a T as a double; names; types; the payload's size), built on first use (a few
# small entries on a device's heap), or False for the other kinds.
_FIXED = {}
_ROWS = {}              # the same for a list's records: record types -> format, or False
_QFMT = {}              # such a format -> the same with its times (T) as integer ms, a double's bits
_LIMIT = {"B": 1 << 8, "H": 1 << 16, "I": 1 << 32}


def _fixed(kind, spec):
    p = _FIXED.get(kind)
    if p is None:
        types = spec[2]
        p = False
        if "*" not in types and "s" not in types and "y" not in types:
            fmt = "<" + types.replace("T", "d")
            p = (fmt, spec[3].split(), types, 2 + struct.calcsize(fmt))
        _FIXED[kind] = p
    return p


def _pack(code, plan, rec):
    """A fixed-size kind's payload in one ``struct.pack``, or None when a field is not plainly valid
    (``_put`` then says which, or packs what it accepts beyond these: a bool or an int as a double)."""
    b = _row(plan[0], plan[1], plan[2], rec)
    return None if b is None else bytes((VERSION, code)) + b


def _records(types):
    """The fast path of a list's records of fixed size: their struct format (a T as a double), or False."""
    p = _ROWS.get(types)
    if p is None:
        p = "*" not in types and "s" not in types and "y" not in types and "<" + types.replace("T", "d")
        _ROWS[types] = p
    return p


def _row(fmt, names, types, rec):
    """The fields of ``rec`` (a dict, or a tuple in schema order) in one ``struct.pack``, or None when a field is
    not plainly valid. A list's records go this way too: a board's heap gets one piece per record, not per field."""
    vals = []
    row = type(rec) is tuple
    i = ms = floats = 0
    for t in types:
        v = rec[i] if row else rec.get(names[i])
        i += 1
        if t == "d":
            if type(v) is not float or v != v:
                return None
        elif t == "T":
            if type(v) is int and -(1 << 53) < v < 1 << 53:     # integer ms: their exact double's bits
                v = _time_bits(v)
                ms += 1
            elif type(v) is not float or v != v:
                return None
            else:
                floats += 1
        elif type(v) is not int or not (-(1 << 63) <= v < 1 << 63 if t == "q" else 0 <= v < _LIMIT[t]):
            return None
        vals.append(v)
    if ms:
        if floats:
            return None         # times of both kinds in one message (``_put`` packs each)
        q = _QFMT.get(fmt)
        if q is None:
            q = _QFMT[fmt] = fmt[0] + "".join(["Q" if t == "T" else c for t, c in zip(types, fmt[1:])])
        fmt = q
    return struct.pack(fmt, *vals)


def _put(out, types, names, rec):
    row = type(rec) is tuple        # a list's record in schema order: a board builds no dict per record
    if row and len(rec) != len(types):
        raise CodecError("a record of %d fields, not %d" % (len(rec), len(types)))
    for i in range(len(types)):
        t = types[i]
        name = names[i]
        if row:
            v = rec[i]
        elif name not in rec:
            raise CodecError("field %s missing" % name)
        else:
            v = rec[name]
        if t == "*":
            if not isinstance(v, (list, tuple)) or len(v) > MAX_LIST:
                raise CodecError("field %s: expected a list of at most %d records" % (name, MAX_LIST))
            out.append(len(v))
            types, names = types[i + 1:], names[i + 1:]
            fast = _records(types)
            for sub in v:
                if not isinstance(sub, dict) and type(sub) is not tuple:
                    raise CodecError("field %s: records must be dicts or tuples" % name)
                b = _row(fast, names, types, sub) if fast and len(sub) == len(types) else None
                if b is None:
                    _put(out, types, names, sub)    # says what is wrong, or packs what it accepts beyond
                else:
                    out.extend(b)
            return
        if t == "s" or t == "y":
            ok = isinstance(v, str) if t == "s" else isinstance(v, (bytes, bytearray))
            if ok:
                v = v.encode() if t == "s" else bytes(v)
                ok = len(v) <= (MAX_STR if t == "s" else MAX_BLOB)
                out.extend(struct.pack("<B" if t == "s" else "<H", len(v)))
                t = "%ds" % len(v)
        elif t == "d":
            ok = isinstance(v, (int, float)) and v == v
        elif t == "T":
            ok = not isinstance(v, bool) and (isinstance(v, float) and v == v or isinstance(v, int) and -(1 << 53) < v < 1 << 53)
            if ok and isinstance(v, int):
                t, v = "Q", _time_bits(v)
            else:
                t = "d"
        elif t == "q":
            ok = isinstance(v, int) and not isinstance(v, bool) and -(1 << 63) <= v < 1 << 63
        else:
            ok = isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 8 * struct.calcsize(t)
        if not ok:
            raise CodecError("field %s: bad value %r" % (name, v))
        out.extend(struct.pack("<" + t, v))


def encode(kind, fields):
    """Encode message ``kind`` with the dict ``fields``; raises CodecError on bad fields."""
    spec = SCHEMAS.get(kind) if isinstance(kind, str) else None
    if spec is None:
        raise CodecError("unknown message kind %r" % (kind,))
    plan = _fixed(kind, spec) if type(fields) is dict else False
    data = _pack(spec[0], plan, fields) if plan else None
    if data is None:
        out = bytearray((VERSION, spec[0]))     # one buffer: a board's heap holds no piece per field
        _put(out, spec[2], spec[3].split(), fields)
        data = bytes(out)
    if len(data) > MAX_PAYLOAD:
        raise CodecError("message of %d bytes exceeds %d" % (len(data), MAX_PAYLOAD))
    return data


def _take(buf, pos, types, names, rec):
    for i in range(len(types)):
        t = types[i]
        name = names[i]
        if t == "*" or t == "s" or t == "y":
            n = 2 if t == "y" else 1
            if pos + n > len(buf):
                raise CodecError("truncated in field %s" % name)
            n, pos = buf[pos] | (buf[pos + 1] << 8 if n == 2 else 0), pos + n
            if t == "*":
                recs = []
                for _ in range(n):
                    sub = {}
                    pos = _take(buf, pos, types[i + 1:], names[i + 1:], sub)
                    recs.append(sub)
                rec[name] = recs
                return pos
            t = "%ds" % n
        if t == "T":
            t = "d"
        size = struct.calcsize(t)
        if pos + size > len(buf):
            raise CodecError("truncated in field %s" % name)
        v = struct.unpack_from("<" + t, buf, pos)[0]
        pos += size
        if v != v:
            raise CodecError("field %s is NaN" % name)
        if types[i] == "s":
            try:
                v = str(v, "utf-8")
            except Exception:
                raise CodecError("field %s is not valid utf-8" % name)
        rec[name] = v
    return pos


def decode(payload):
    """Decode a payload into ``(kind, fields)``; raises CodecError for anything malformed."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise CodecError("payload must be bytes")
    if len(payload) > MAX_PAYLOAD or len(payload) < 2 or payload[0] != VERSION:
        raise CodecError("payload too long, too short or of another version")
    kind = NAMES.get(payload[1])
    if kind is None:
        raise CodecError("unknown message kind code %d" % payload[1])
    spec = SCHEMAS[kind]
    plan = _fixed(kind, spec)
    if plan and len(payload) == plan[3]:
        vals = struct.unpack_from(plan[0], payload, 2)
        for v in vals:
            if v != v:
                break       # NaN: ``_take`` says which field
        else:
            return kind, dict(zip(plan[1], vals))
    fields = {}
    pos = _take(payload, 2, spec[2], spec[3].split(), fields)
    if pos != len(payload):
        raise CodecError("%d trailing bytes after %s message" % (len(payload) - pos, kind))
    return kind, fields
