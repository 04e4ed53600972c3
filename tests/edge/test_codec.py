"""Codec: every kind round-trips; every malformed input raises CodecError and nothing else."""
from edge.core import codec
from edge.core.codec import CodecError, encode, decode
from portable import Rng, raises, MICROPYTHON

F32 = 1.0 + 2.0 ** -30 == 1.0

INF = float("inf")

SAMPLES = {
    "report": {"src": 3, "epoch": 65535, "seq": 4294967295, "t": 12.5, "v": -1.25, "why": codec.WHY_EXIT},
    "reply": {"src": 0, "epoch": 1, "seq": 7, "t": 0.0, "v": 1e300, "probe": 9},
    "mark": {"seq": 1, "t": 99.0},
    "birth": {"seq": 2, "t": 1.0, "boot": 77, "fw": "qf-0.1", "caps": 1, "first": 0,
              "sources": [{"name": "temp", "epoch": 4, "width": INF, "v": 21.5},
                          {"name": "hum\u00e9", "epoch": 0, "width": 0.5, "v": INF}]},
    "gone": {"boot": 5},
    "blob": {"src": 1, "seq": 3, "t": 2.0, "tag": 7, "data": b"\x00\x01\xff"},
    "line": {"src": 3, "epoch": 2, "seq": 5, "t": 1700000000123, "v": -1.25, "why": codec.WHY_EXIT,
             "slope": -0.0625, "gap": 2000},
    "mreport": {"src": 3, "epoch": 7, "seq": 9, "t": 12.5, "v": -1.25, "why": codec.WHY_SYNC, "n": 65535, "k": 0},
    "mline": {"src": 3, "epoch": 2, "seq": 5, "t": 1700000000123, "v": -1.25, "why": codec.WHY_EXIT,
              "slope": -0.0625, "gap": 2000, "n": 1, "k": 65535, "o": 1700000000000},
    "width": {"src": 2, "epoch": 9, "seq": 10, "inc": 1, "to": 2, "period": 123, "width": 3.5, "ack": 0},
    "bound": {"src": 2, "epoch": 10, "seq": 11, "inc": 1, "to": 2, "lo": -INF, "hi": 4.0, "ack": 1},
    "filter": {"src": 1, "epoch": 2, "seq": 12, "inc": 1, "to": 2, "width": INF, "ack": 1,
               "cons": [{"l": 400.0, "u": 600.0}, {"l": INF, "u": INF}]},
    "probe": {"src": 0, "seq": 13, "inc": 1, "to": 2, "probe": 65535},
    "config": {"seq": 14, "inc": 4294967295, "to": 2, "period": 10000, "shrink": 0.25, "beat": 60000, "t0": -5,
               "now": 1700000000123, "tick": 3},
    "rebirth": {"seq": 15, "inc": 1, "to": 0},
    "summary": {"src": 0, "seq": 17, "inc": 1, "to": 2, "window": 1024, "k": 2, "subs": 0b1010, "read": 1,
                "pad": [{"seg": 1, "w": 0.5}, {"seg": 3, "w": 2.0}]},
    "setup": {"seq": 18, "inc": 1, "to": 2, "period": 10000, "shrink": 0.0, "beat": 0, "t0": 0, "now": 5, "tick": 0,
              "allow": 3},
    "segs": {"seq": 18, "t": 5000, "segs": [{"src": 0, "epoch": 3, "a": 1000, "e": 5000, "v": 20.5, "s": -0.25,
                                              "w": 1.0, "f": 0},
                                             {"src": 0, "epoch": 3, "a": 5000, "e": 5000, "v": 21.5, "s": 0.0,
                                              "w": 1.0, "f": 1}]},
    "segment": {"src": 1, "seq": 19, "inc": 1, "to": 2, "lag": 9500, "model": 1, "width": 0.5},
    "ack": {"seq": 20, "inc": 1, "to": 2, "upto": 4294967295, "now": 1700000000123},
    "link": {"seq": 21, "inc": 1, "to": 2, "rto": 450, "guard": 600},
    "nack": {"seq": 22, "inc": 1, "to": 2, "upto": 4294967295, "miss": 0},
    "rsegs": {"src": 1, "epoch": 3, "seq": 20, "t": 5000, "v": 21.5, "why": codec.WHY_EXIT,
              "segs": [{"src": 0, "epoch": 3, "a": 1000, "e": 5000, "v": 20.5, "s": -0.25, "w": 1.0, "f": 0},
                       {"src": 1, "epoch": 3, "a": 5000, "e": 5000, "v": 21.5, "s": 0.0, "w": 1.0, "f": 1}]},
    "moq": {"seq": 16, "inc": 1, "to": 2, "op": 1, "qid": "c1", "tb": 0.0, "te": 5000.0, "agg": 0, "eta": 0.01},
}


def test_every_kind_round_trips():
    assert sorted(SAMPLES) == sorted(codec.SCHEMAS)
    for kind in SAMPLES:
        data = encode(kind, SAMPLES[kind])
        k, fields = decode(data)
        assert k == kind and fields == SAMPLES[kind], kind
    assert len(encode("report", SAMPLES["report"])) == 26


def test_every_truncation_and_extension_is_rejected():
    for kind in SAMPLES:
        data = encode(kind, SAMPLES[kind])
        for n in range(len(data)):
            raises(CodecError, decode, data[:n])
        raises(CodecError, decode, data + b"\x00")


def test_bad_headers_and_sizes():
    data = encode("mark", SAMPLES["mark"])
    raises(CodecError, decode, b"\x01" + data[1:])       # version 1: before device times and sessions
    raises(CodecError, decode, data[:1] + b"\xee" + data[2:])
    raises(CodecError, decode, b"\x01" * (codec.MAX_PAYLOAD + 1))
    raises(CodecError, decode, "not bytes")
    raises(CodecError, decode, None)
    nan = encode("mark", {"seq": 1, "t": 0.0})[:-8] + b"\x00\x00\x00\x00\x00\x00\xf8\x7f"
    raises(CodecError, decode, nan)


def test_encoder_rejects_bad_fields():
    raises(CodecError, encode, "nope", {})
    raises(CodecError, encode, "mark", {"seq": 1})
    raises(CodecError, encode, "mark", {"seq": -1, "t": 0.0})
    raises(CodecError, encode, "mark", {"seq": 2 ** 32, "t": 0.0})
    raises(CodecError, encode, "mark", {"seq": 1, "t": float("nan")})
    raises(CodecError, encode, "mark", {"seq": True, "t": 0.0})
    raises(CodecError, encode, "gone", {"boot": "x"})
    b = dict(SAMPLES["birth"])
    b["fw"] = "x" * 65
    raises(CodecError, encode, "birth", b)
    b["fw"] = "ok"
    b["sources"] = [{"name": "a"}]
    raises(CodecError, encode, "birth", b)
    blob = dict(SAMPLES["blob"])
    blob["data"] = b"x" * (codec.MAX_BLOB + 1)
    raises(CodecError, encode, "blob", blob)


def _fuzz(count, seed):
    r = Rng(seed)
    seeds = [encode(k, SAMPLES[k]) for k in sorted(SAMPLES)]
    ok = bad = 0
    for i in range(count):
        if i % 2:
            data = bytearray(r.choice(seeds))
            for _ in range(1 + r.below(4)):
                op = r.below(4)
                pos = r.below(len(data) + 1)
                if op == 0 and len(data):
                    data[pos % len(data)] = r.below(256)
                elif op == 1:
                    data = data[:pos]
                elif op == 2:
                    data = data[:pos] + bytes([r.below(256)]) + data[pos:]
                else:
                    data = data[:pos] + data[pos + 1:]
            if r.below(8) == 0 and len(data) > 1:
                data[0] = codec.VERSION
        else:
            n = r.below(80)
            data = bytes([codec.VERSION, r.choice((1, 2, 3, 4, 5, 6, 16, 17, 18, 19, 20, 21))]) + bytes([r.below(256) for _ in range(n)])
        try:
            kind, fields = decode(bytes(data))
            assert decode(encode(kind, fields)) == (kind, fields)
            ok += 1
        except CodecError:
            bad += 1
    return ok, bad


def test_fuzz_random_and_mutated_payloads():
    count = 20000 if MICROPYTHON else 100000
    ok, bad = _fuzz(count, 1)
    assert ok + bad == count and ok > count // 100 and bad > count // 2


WIRE = {   # version 2 bytes: floats in a T (time) field are the doubles version 1 wrote
    "report": "020103ffffffffffff0000000000002940000000000000f4bf00",
    "birth": "020402000000000000000000f03f4d0000000671662d302e310100020474656d700400000000000000f07f00000000"
             "008035400568756dc3a90000000000000000e03f000000000000f07f",
    "filter": "02120102000c0000000100000002000000000000000000f07f010200000000000079400000000000c08240000000"
              "000000f07f000000000000f07f",
    "blob": "0206010300000000000000000000400703000001ff",
    "config": "02140e000000ffffffff0200000010270000000000000000d03f60ea0000fbffffffffffffff7b68e5cf8b01000003"
              "000000",
}


def test_wire_format_is_pinned():
    import binascii
    for kind in WIRE:
        assert binascii.hexlify(encode(kind, SAMPLES[kind])).decode() == WIRE[kind], kind
        assert decode(binascii.unhexlify(WIRE[kind])) == (kind, SAMPLES[kind])
    assert codec.SCHEMAS["report"][1] == "up" and codec.SCHEMAS["probe"][1] == "down"
    assert codec.NAMES[1] == "report" and codec.NAMES[21] == "rebirth"


def test_integer_times_go_on_the_wire_as_exact_doubles():
    # A float32 board cannot hold 1.7e9 s to the millisecond (one float32 step is 128 s there), nor
    # pack such a value with struct 'd'; its integer milliseconds are written as the exact double.
    import binascii
    for n, bits in ((0, "0000000000000000"), (1, "000000000000f03f"), (-1, "000000000000f0bf"),
                    (999, "0000000000388f40"), (1700000000123, "00b08756febc7842"),
                    (-1700000000123, "00b08756febc78c2"), (2 ** 53 - 1, "ffffffffffff3f43"),
                    (2 ** 30 + 7, "0000c0010000d041"), (2 ** 52 + 1, "0100000000003043")):
        data = encode("mark", {"seq": 1, "t": n})
        assert binascii.hexlify(data[-8:]).decode() == bits, n
        if not F32:                     # a float32 interpreter reads it back rounded: devices never do
            assert decode(data)[1]["t"] == float(n)
    raises(CodecError, encode, "mark", {"seq": 1, "t": 2 ** 53})
    raises(CodecError, encode, "config", dict(SAMPLES["config"], now=1.5))     # downlink times are integers


def test_a_heartbeat_past_24_days_goes_in_whole_seconds_and_a_device_keeps_it():
    from edge.agent import Agent
    for s in (0.5, 4.0, 2147483.0, 2147484.0, 4.0 * 2 ** 22, 4.0 * 2 ** 28):
        f = codec.beat_field(s)
        assert 0 <= f < 1 << 32 and codec.beat_ms(f) == round(s * 1000)
        m = dict(SAMPLES["config"], beat=f)
        assert decode(encode("config", m)) == ("config", m)
    assert codec.beat_field(2147483.647) == 2147483647                 # the last one in ms
    # a device in ms and one in seconds both wait a year's heartbeat (not the 24.8 days its ms field would say)
    year = 4.0 * 2 ** 23
    for unit in (1000, 1):
        a = Agent("d", ["x"], unit=unit)
        birth = a.start(0)
        assert birth
        to = a.token
        a.handle_message(0, encode("config", dict(SAMPLES["config"], inc=1, to=to, beat=codec.beat_field(year))))
        assert a.delivery.beat == year * unit


def test_a_list_record_may_be_a_tuple_in_schema_order():
    rec = {"src": 1, "epoch": 2, "a": 1000, "e": 2500, "v": 0.5, "s": -0.25, "w": 1.0, "f": 1}
    row = (1, 2, 1000, 2500, 0.5, -0.25, 1.0, 1)
    assert codec.encode("segs", {"seq": 3, "t": 9, "segs": [row, rec]}) == \
        codec.encode("segs", {"seq": 3, "t": 9, "segs": [rec, rec]})
    assert codec.decode(codec.encode("segs", {"seq": 3, "t": 9, "segs": [row]}))[1]["segs"] == [rec]
    raises(codec.CodecError, codec.encode, "segs", {"seq": 3, "t": 9, "segs": [row[:-1]]})
    raises(codec.CodecError, codec.encode, "segs", {"seq": 3, "t": 9, "segs": [list(row)]})
