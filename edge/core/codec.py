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


NO_VALUE = float("inf")     # value field of a birth/reply when a source has no reading yet


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

# Field types: B u8, H u16, I u32, d f64, s short utf-8 string (u8 length), y byte blob (u16 length),
# and * a list (u8 count) of records whose fields are all the remaining ones of the schema.
# kind name -> (code, direction, types, names): one struct-like type string and one space-separated
# names string per kind, split only while a message is coded (a table of tuples cost ~10 KB of
# MicroPython heap).
SCHEMAS = {
    # uplink: device -> backend
    "report": (1, "up", "BHIddB", "src epoch seq t v why"),
    "reply": (2, "up", "BHIddH", "src epoch seq t v probe"),
    "beat": (3, "up", "Id", "seq t"),
    "birth": (4, "up", "IdIsB*sHdd", "seq t boot fw caps sources name epoch width v"),
    "gone": (5, "up", "I", "boot"),
    "blob": (6, "up", "BIdBy", "src seq t tag data"),
    # downlink: backend -> device
    "width": (16, "down", "BHIIdB", "src epoch seq period width ack"),
    "bound": (17, "down", "BHIddB", "src epoch seq lo hi ack"),
    "filter": (18, "down", "BHIdB*dd", "src epoch seq width ack cons l u"),
    "probe": (19, "down", "BIH", "src seq probe"),
    "config": (20, "down", "Idddd", "seq period shrink beat t0"),
    "rebirth": (21, "down", "I", "seq"),
    # SWAT summary replication (Bulut & Singh 2003 §3): window 0 drops the tree; subs/read are segment masks
    "summary": (22, "down", "BIHBII*Bd", "src seq window k subs read pad seg w"),
    # querying-metadata for relay nodes (Zhang et al. 2005 §3.2): op 1 add / 0 remove, agg 0 count / 1 sum
    "moq": (30, "down", "IBsddBd", "seq op qid tb te agg eta"),
}

NAMES = {}
for _name in SCHEMAS:
    NAMES[SCHEMAS[_name][0]] = _name


def _put(out, types, names, rec):
    for i in range(len(types)):
        t = types[i]
        name = names[i]
        if name not in rec:
            raise CodecError("field %s missing" % name)
        v = rec[name]
        if t == "*":
            if not isinstance(v, (list, tuple)) or len(v) > MAX_LIST:
                raise CodecError("field %s: expected a list of at most %d records" % (name, MAX_LIST))
            out.append(bytes((len(v),)))
            for sub in v:
                if not isinstance(sub, dict):
                    raise CodecError("field %s: records must be dicts" % name)
                _put(out, types[i + 1:], names[i + 1:], sub)
            return
        if t == "s" or t == "y":
            ok = isinstance(v, str) if t == "s" else isinstance(v, (bytes, bytearray))
            if ok:
                v = v.encode() if t == "s" else bytes(v)
                ok = len(v) <= (MAX_STR if t == "s" else MAX_BLOB)
                out.append(struct.pack("<B" if t == "s" else "<H", len(v)))
                t = "%ds" % len(v)
        elif t == "d":
            ok = isinstance(v, (int, float)) and v == v
        else:
            ok = isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 8 * struct.calcsize(t)
        if not ok:
            raise CodecError("field %s: bad value %r" % (name, v))
        out.append(struct.pack("<" + t, v))


def encode(kind, fields):
    """Encode message ``kind`` with the dict ``fields``; raises CodecError on bad fields."""
    spec = SCHEMAS.get(kind) if isinstance(kind, str) else None
    if spec is None:
        raise CodecError("unknown message kind %r" % (kind,))
    out = [bytes((VERSION, spec[0]))]
    _put(out, spec[2], spec[3].split(), fields)
    data = b"".join(out)
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
    fields = {}
    pos = _take(payload, 2, spec[2], spec[3].split(), fields)
    if pos != len(payload):
        raise CodecError("%d trailing bytes after %s message" % (len(payload) - pos, kind))
    return kind, fields
