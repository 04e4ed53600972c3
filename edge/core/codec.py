"""Versioned compact wire format shared by devices and backend (DESIGN.md §3).

Every payload is ``VERSION, KIND, fields...`` in little-endian binary. Each kind has a fixed
schema in ``SCHEMAS``; ``encode(kind, fields)`` and ``decode(payload)`` are the only entry points.
Anything malformed, truncated, oversized, of an unknown version or kind, or carrying NaN raises
``CodecError`` and nothing else. Portable: runs unchanged on MicroPython and CPython.
"""
import struct

VERSION = 1
MAX_PAYLOAD = 4096
MAX_STR = 64
MAX_LIST = 255
MAX_BLOB = 3072


class CodecError(ValueError):
    """The one error type the decoder (and encoder) raises for bad input."""


# Report reasons ("why" field of a report).
WHY_EXIT = 0      # the reading left its bound or changed constraint membership
WHY_SHRINK = 1    # re-check after the periodic shrink found the value outside
WHY_ASSIGN = 2    # re-check (or acknowledgement) after a bound/width/filter assignment
WHY_RESYNC = 3    # first report of a source after start or reconnect
WHY_FIRST = 4     # first reading of a source

# Field types: B u8, H u16, I u32, d f64, s short utf-8 string, y byte blob,
# and a tuple (list of records with that sub-schema, u8 count).
_SIZES = {"B": 1, "H": 2, "I": 4, "d": 8}

# kind name -> (code, direction, schema)
SCHEMAS = {
    # uplink: device -> backend
    "report": (1, "up", (("src", "B"), ("epoch", "H"), ("seq", "I"), ("t", "d"), ("v", "d"), ("why", "B"))),
    "reply": (2, "up", (("src", "B"), ("epoch", "H"), ("seq", "I"), ("t", "d"), ("v", "d"), ("probe", "H"))),
    "beat": (3, "up", (("seq", "I"), ("t", "d"))),
    "birth": (4, "up", (("seq", "I"), ("t", "d"), ("boot", "I"), ("fw", "s"), ("caps", "B"),
                        ("sources", (("name", "s"), ("epoch", "H"), ("width", "d"), ("v", "d"))))),
    "gone": (5, "up", (("boot", "I"),)),
    "blob": (6, "up", (("src", "B"), ("seq", "I"), ("t", "d"), ("tag", "B"), ("data", "y"))),
    # downlink: backend -> device
    "width": (16, "down", (("src", "B"), ("epoch", "H"), ("seq", "I"), ("period", "I"), ("width", "d"), ("ack", "B"))),
    "bound": (17, "down", (("src", "B"), ("epoch", "H"), ("seq", "I"), ("lo", "d"), ("hi", "d"), ("ack", "B"))),
    "filter": (18, "down", (("src", "B"), ("epoch", "H"), ("seq", "I"), ("width", "d"), ("ack", "B"),
                            ("cons", (("l", "d"), ("u", "d"))))),
    "probe": (19, "down", (("src", "B"), ("seq", "I"), ("probe", "H"))),
    "config": (20, "down", (("seq", "I"), ("period", "d"), ("shrink", "d"), ("beat", "d"), ("t0", "d"))),
    "rebirth": (21, "down", (("seq", "I"),)),
    # querying-metadata for relay nodes (Zhang et al. 2005 §3.2): op 1 add / 0 remove, agg 0 count / 1 sum
    # SWAT summary replication (Bulut & Singh 2003 §3): window 0 drops the tree; subs/read are segment masks
    "summary": (22, "down", (("src", "B"), ("seq", "I"), ("window", "H"), ("k", "B"), ("subs", "I"), ("read", "I"),
                             ("pad", (("seg", "B"), ("w", "d"))))),
    "moq": (30, "down", (("seq", "I"), ("op", "B"), ("qid", "s"), ("tb", "d"), ("te", "d"), ("agg", "B"), ("eta", "d"))),
}

NAMES = {}
for _name in SCHEMAS:
    NAMES[SCHEMAS[_name][0]] = _name

_LIMITS = {"B": 0xFF, "H": 0xFFFF, "I": 0xFFFFFFFF}


def _put(out, ftype, value, name):
    if isinstance(ftype, tuple):
        if not isinstance(value, (list, tuple)) or len(value) > MAX_LIST:
            raise CodecError("field %s: expected a list of at most %d records" % (name, MAX_LIST))
        out.append(struct.pack("<B", len(value)))
        for rec in value:
            if not isinstance(rec, dict):
                raise CodecError("field %s: records must be dicts" % name)
            for sub, stype in ftype:
                if sub not in rec:
                    raise CodecError("field %s: record lacks %s" % (name, sub))
                _put(out, stype, rec[sub], name + "." + sub)
    elif ftype == "d":
        if not isinstance(value, (int, float)) or value != value:
            raise CodecError("field %s: expected a number, got %r" % (name, value))
        out.append(struct.pack("<d", value))
    elif ftype == "s":
        if not isinstance(value, str):
            raise CodecError("field %s: expected a string" % name)
        raw = value.encode()
        if len(raw) > MAX_STR:
            raise CodecError("field %s: string longer than %d bytes" % (name, MAX_STR))
        out.append(struct.pack("<B", len(raw)))
        out.append(raw)
    elif ftype == "y":
        if not isinstance(value, (bytes, bytearray)) or len(value) > MAX_BLOB:
            raise CodecError("field %s: expected bytes of at most %d" % (name, MAX_BLOB))
        out.append(struct.pack("<H", len(value)))
        out.append(bytes(value))
    else:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value > _LIMITS[ftype]:
            raise CodecError("field %s: expected an integer in 0..%d, got %r" % (name, _LIMITS[ftype], value))
        out.append(struct.pack("<" + ftype, value))


def encode(kind, fields):
    """Encode message ``kind`` with the dict ``fields``; raises CodecError on bad fields."""
    spec = SCHEMAS.get(kind)
    if spec is None:
        raise CodecError("unknown message kind %r" % (kind,))
    out = [struct.pack("<BB", VERSION, spec[0])]
    for name, ftype in spec[2]:
        if name not in fields:
            raise CodecError("%s message lacks field %s" % (kind, name))
        _put(out, ftype, fields[name], name)
    data = b"".join(out)
    if len(data) > MAX_PAYLOAD:
        raise CodecError("%s message of %d bytes exceeds %d" % (kind, len(data), MAX_PAYLOAD))
    return data


def _take(buf, pos, ftype, name):
    if isinstance(ftype, tuple):
        n, pos = _take(buf, pos, "B", name)
        recs = []
        for _ in range(n):
            rec = {}
            for sub, stype in ftype:
                rec[sub], pos = _take(buf, pos, stype, name)
            recs.append(rec)
        return recs, pos
    if ftype == "s" or ftype == "y":
        n, pos = _take(buf, pos, "B" if ftype == "s" else "H", name)
        if pos + n > len(buf):
            raise CodecError("truncated in field %s" % name)
        raw = bytes(buf[pos:pos + n])
        if ftype == "y":
            return raw, pos + n
        try:
            return raw.decode(), pos + n
        except Exception:
            raise CodecError("field %s is not valid utf-8" % name)
    size = _SIZES[ftype]
    if pos + size > len(buf):
        raise CodecError("truncated in field %s" % name)
    value = struct.unpack_from("<" + ftype, buf, pos)[0]
    if ftype == "d" and value != value:
        raise CodecError("field %s is NaN" % name)
    return value, pos + size


def decode(payload):
    """Decode a payload into ``(kind, fields)``; raises CodecError for anything malformed."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise CodecError("payload must be bytes")
    if len(payload) > MAX_PAYLOAD:
        raise CodecError("payload of %d bytes exceeds %d" % (len(payload), MAX_PAYLOAD))
    if len(payload) < 2:
        raise CodecError("payload too short")
    if payload[0] != VERSION:
        raise CodecError("unknown version %d" % payload[0])
    kind = NAMES.get(payload[1])
    if kind is None:
        raise CodecError("unknown message kind code %d" % payload[1])
    fields = {}
    pos = 2
    for name, ftype in SCHEMAS[kind][2]:
        fields[name], pos = _take(payload, pos, ftype, name)
    if pos != len(payload):
        raise CodecError("%d trailing bytes after %s message" % (len(payload) - pos, kind))
    return kind, fields
