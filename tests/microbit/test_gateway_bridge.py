"""The gateway's translation of micro:bit frames (edge/runtime/gateway/bridge.py) against the device's own
filter code (firmware/microbit/qff.py, plain Python) and the backend's double-precision mirror."""
import math
import os
import random
import sys

from edge.core import codec
from edge.core.interval import IntervalFilter
from edge.runtime.gateway import bridge as br

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "firmware", "microbit"))
import qff  # noqa: E402


def _apply(dev, frame_bytes, out, mirror):
    """Apply a gateway frame on the device; a report it makes recentres the mirror, as on the backend."""
    toks = br.unframe(frame_bytes.rstrip(b"\n"))
    n = len(out)
    dev.apply(toks[0], [int(x) for x in toks[2:]], 0)
    if len(out) > n:
        mirror.recenter(dev.v / 1024)


INC = 7


def _born(b, now=0.0):
    """The device's birth through the bridge, then the backend's config answering it (shrink 0); returns the
    birth message."""
    acts = b.from_device(now, br.frame("B 1 0 -1 -").rstrip(b"\n"))
    _, m = codec.decode(acts[0][1])
    b.from_backend(now, _ctl(b, "config", {"seq": 1, "period": 1000, "shrink": 0.0, "beat": 0, "t0": 0,
                                           "now": int(now * 1000), "tick": 0}))
    b.queue, b.sent_at = [], None
    return m


def _ctl(b, kind, fields, inc=INC, to=None):
    """A downlink answering the bridge's latest birth (``to``) from backend run ``inc``."""
    fields.update({"inc": inc, "to": b.token if to is None else to})
    return codec.encode(kind, fields)


def test_frames_round_trip_and_damage_is_caught():
    f = br.frame("R 7 123 1 20480 0")
    assert br.unframe(f.rstrip(b"\n")) == ["R", "7", "123", "1", "20480", "0"]
    bad = bytearray(f)
    bad[3] ^= 1
    assert br.unframe(bytes(bad).rstrip(b"\n")) is None
    assert br.unframe(b"garbage") is None and br.unframe(b"x|zzzz") is None


def test_device_is_never_wider_than_the_backend_mirror():
    """Random widths, bounds and shrinks: whenever the device stays silent, the backend's double mirror
    (IntervalFilter) contains the value (exactly, values k/1024)."""
    rnd = random.Random(5)
    for trial in range(300):
        out = []
        dev = qff.A(out.append)
        b = br.Bridge("s", 1)
        _born(b)
        b.offset = 0.0
        mirror = IntervalFilter(math.inf)
        v = rnd.randrange(-5000, 5000)
        dev.v = v
        dev.report(0, 4)
        mirror.recenter(v / 1024)
        shrink = rnd.choice([0.05, 0.1, 0.3, 1 / 3])
        dev.P, dev.Q = 1000, math.floor((1 - shrink) * 1024)
        ep = 0
        for step in range(20):
            r = rnd.random()
            if r < 0.3:
                ep += 1
                w = rnd.uniform(0, 20)
                acts = b.from_backend(0, _ctl(b, "width", {"src": 0, "epoch": ep, "seq": 2 * ep, "period": dev.per,
                                                          "width": w, "ack": 0}))
                b.queue, b.sent_at = [], None
                mirror.set_width(w, ep)
                _apply(dev, acts[0][1], out, mirror)
            elif r < 0.4:
                ep += 1
                lo = rnd.uniform(-8, 3)
                hi = lo + rnd.uniform(0, 9)
                acts = b.from_backend(0, _ctl(b, "bound", {"src": 0, "epoch": ep, "seq": 2 * ep, "lo": lo, "hi": hi,
                                                          "ack": 0}))
                b.queue, b.sent_at = [], None
                mirror.set_bound(lo, hi, ep)
                _apply(dev, acts[0][1], out, mirror)
            elif r < 0.7:
                dev.per += 1
                dev.shrink()
                mirror.shrink(shrink)
            for _ in range(5):
                v += rnd.randrange(-300, 301)
                dev.v = v
                if dev.out(v):
                    dev.report(0, 0)
                    mirror.recenter(v / 1024)
                assert mirror.lo <= v / 1024 <= mirror.hi, (trial, step, v, mirror.lo, mirror.hi, dev.lo, dev.hi)


def test_reports_births_and_downlinks_translate():
    b = br.Bridge("s_b0", 9)
    acts = b.from_device(100.0, br.frame("B 1 0 -1 -").rstrip(b"\n"))
    kind, m = codec.decode(acts[0][1])
    assert acts[0][0] == "state" and kind == "birth" and m["sources"][0]["v"] == codec.NO_VALUE
    assert m["first"] == 0 and m["caps"] == codec.CAP_MS and m["t"] == 100000     # integer ms, double mirror
    acts = b.from_device(100.5, br.frame("R 2 5000 0 20992 4").rstrip(b"\n"))
    kind, m = codec.decode(acts[0][1])
    assert kind == "report" and m["v"] == 20.5 and m["why"] == 4 and m["t"] == 100500
    # a lost frame (sequence gap) asks the device for a birth
    acts = b.from_device(101.0, br.frame("R 4 5500 0 21000 0").rstrip(b"\n"))
    assert b.stats["gaps"] == 1 and any(a[0] == "tx" and a[1].startswith(b"Q ") for a in acts)
    # ticks wrap at 2**30 ms: time keeps going forward
    b2 = br.Bridge("s", 1)
    b2.from_device(10.0, br.frame("S 1 %d 0 4000 3000 0" % (br.WRAP - 500)).rstrip(b"\n"))
    acts = b2.from_device(11.0, br.frame("R 2 500 0 1024 0").rstrip(b"\n"))
    assert codec.decode(acts[0][1])[1]["t"] == 11000
    # unsupported downlinks are counted, not crashed on
    assert b.from_backend(0, b"\x01\x63junk") == [] and b.stats["bad_messages"] == 1


def test_shrinking_a_bound_with_fractional_ends_stays_inside_the_mirror():
    """Every integer value the device would keep silent on lies in the backend's mirror, for bounds whose ends
    fall between device units (the device's centre is then off by up to half a unit) and many shrinks."""
    rnd = random.Random(11)
    for trial in range(200):
        out = []
        dev = qff.A(out.append)
        b = br.Bridge("s", 1)
        _born(b)
        shrink = rnd.choice([0.05, 0.2, 0.5])
        dev.P, dev.Q = 1000, math.floor((1 - shrink) * 1024)
        lo = rnd.uniform(-3, 3)
        hi = lo + rnd.uniform(0.001, 4)
        acts = b.from_backend(0, _ctl(b, "bound", {"src": 0, "epoch": 1, "seq": 2, "lo": lo, "hi": hi, "ack": 0}))
        _apply(dev, acts[0][1], out, IntervalFilter(math.inf))
        mirror = IntervalFilter(math.inf)
        mirror.set_bound(lo, hi, 1)
        for step in range(12):
            for v in range(dev.lo - 3, dev.hi + 4):
                if not dev.out(v):
                    assert mirror.lo <= v / 1024 <= mirror.hi, (trial, step, v, lo, hi, dev.lo, dev.hi)
            dev.shrink()
            mirror.shrink(shrink)


def test_time_mapping_follows_a_drifting_board_clock():
    """A board clock 0.5 % slow, frames delayed by 0-80 ms: stamps stay within the delay of their arrival (the
    coordinator would otherwise count every report late after a few minutes), and never go backwards."""
    rnd = random.Random(3)
    b = br.Bridge("s", 1)
    last = None
    for i in range(6000):                        # 10 minutes at 10 Hz
        true_t = 1.7e9 + i * 0.1
        tick = int(i * 100 * 0.995) % br.WRAP
        now = true_t + rnd.uniform(0, 0.08)
        t = b.wall(now, tick)
        assert -0.001 <= now - t <= 0.2, (i, now - t)
        assert last is None or t >= last
        last = t


def test_config_sets_the_boards_shrink_count_from_the_backends_tick():
    """The config's integer-ms schedule and tick: the board's count is the backend's, its next shrink the
    backend's next tick (t0 + (tick+1)·T) in board ticks; the same schedule again is not re-sent."""
    b = br.Bridge("s", 1)
    b.from_device(100.0, br.frame("B 1 0 -1 -").rstrip(b"\n"))
    acts = b.from_device(100.0, br.frame("S 2 40000 0 4000 3000 0").rstrip(b"\n"))     # board tick 40000 at 100 s
    acts = b.from_backend(100.0, _ctl(b, "config", {"seq": 1, "period": 500, "shrink": 0.25, "beat": 2000,
                                                    "t0": 90000, "now": 100000, "tick": 19}))
    toks = br.unframe(acts[0][1].rstrip(b"\n"))
    assert toks[0] == "C" and [int(x) for x in toks[2:]] == [500, 768, 20, 40000] and b.delivery.beat == 2.0
    b.queue, b.sent_at = [], None
    assert b.from_backend(100.2, _ctl(b, "config", {"seq": 2, "period": 500, "shrink": 0.25, "beat": 2000,
                                                    "t0": 90000, "now": 100200, "tick": 19})) == []


def test_stale_control_across_a_rebirth_is_rejected():
    """Like edge.agent: a control answering an earlier birth (its token), or sent by another backend run than
    the one that configured the sensor since its latest birth, never reaches the board; a duplicate neither."""
    b = br.Bridge("s", 5)
    old = _born(b)
    width = {"src": 0, "epoch": 1, "seq": 2, "period": 0, "width": 1.0, "ack": 0}
    assert b.from_backend(0, _ctl(b, "width", dict(width), inc=INC + 1)) == []          # another backend run
    assert b.stats["stale"] == 1
    acts = b.from_backend(0, _ctl(b, "width", dict(width)))
    assert acts and acts[0][1].startswith(b"W ")
    b.queue, b.sent_at = [], None
    assert b.from_backend(0, _ctl(b, "width", dict(width))) == []                       # duplicate
    b.from_device(1.0, br.frame("A 2 0 0 - 0").rstrip(b"\n"))
    acts = b.from_device(1.0, br.frame("B 3 0 -1 -").rstrip(b"\n"))                   # re-birth (no reboot)
    new = codec.decode(acts[0][1])[1]
    assert new["seq"] != old["seq"] and b.token == (5 ^ new["seq"]) & 0xFFFFFFFF
    stale = _ctl(b, "bound", {"src": 0, "epoch": 2, "seq": 3, "lo": 0.0, "hi": 1.0, "ack": 0},
                 to=(5 ^ old["seq"]) & 0xFFFFFFFF)
    assert b.from_backend(1.0, stale) == [] and b.stats["stale"] == 2
    # the same backend run, not yet heard from since the re-birth: its controls wait for its config
    assert b.from_backend(1.0, _ctl(b, "probe", {"src": 0, "seq": 4, "probe": 1})) == [] and b.stats["stale"] == 3
    b.from_backend(1.0, _ctl(b, "config", {"seq": 5, "period": 1000, "shrink": 0.0, "beat": 0, "t0": 0,
                                           "now": 1000, "tick": 0}))
    b.queue, b.sent_at = [], None
    acts = b.from_backend(1.0, _ctl(b, "probe", {"src": 0, "seq": 6, "probe": 1}))
    assert acts and acts[0][1].startswith(b"P ")
    b.queue, b.sent_at = [], None
    assert b.from_backend(1.0, _ctl(b, "rebirth", {"seq": 7}, to=0))[0][1].startswith(b"Q ")


def test_the_gateway_keeps_the_sensors_uplinks_in_ack_mode_and_marks_its_silence():
    """The MQTT side of a micro:bit is the gateway's (edge.core.delivery): a ``link`` turns ack mode on without a
    frame to the board, unacknowledged reports are sent again unchanged, an ``ack`` drops them, and a silent
    sensor gets a heartbeat mark repeating its latest number."""
    b = br.Bridge("s", 1)
    born = _born(b)
    assert b.from_backend(0.1, _ctl(b, "link", {"seq": 2, "rto": 500, "guard": 0})) == [] and b.queue == []
    b.from_device(1.0, br.frame("S 2 1000 0 4000 3000 0").rstrip(b"\n"))       # ticks map to wall time
    rep = [a for a in b.from_device(1.0, br.frame("R 3 1000 0 20480 0").rstrip(b"\n")) if a[0] == "up"]
    k, m = codec.decode(rep[0][1])
    assert k == "report" and m["seq"] == born["seq"] + 1
    assert [a for a in b.poll(1.4) if a[0] == "up"] == [] and [a for a in b.poll(1.5) if a[0] == "up"] == rep
    assert b.from_backend(1.6, _ctl(b, "ack", {"seq": 3, "upto": m["seq"], "now": 1600})) == []
    assert b.delivery.held == [] and [a for a in b.poll(3.0) if a[0] == "up"] == []
    b.from_backend(1.7, _ctl(b, "config", {"seq": 4, "period": 1000, "shrink": 0.0, "beat": 5000, "t0": 0,
                                           "now": 1700, "tick": 0}))
    marks = [codec.decode(a[1]) for a in b.poll(6.6) if a[0] == "up"]
    assert marks == [("mark", {"seq": m["seq"], "t": 6600})]


def test_the_gateway_resends_at_once_what_a_nack_names():
    b = br.Bridge("s", 1)
    born = _born(b)
    b.from_backend(0.1, _ctl(b, "link", {"seq": 2, "rto": 500, "guard": 0}))
    b.from_device(1.0, br.frame("S 2 1000 0 4000 3000 0").rstrip(b"\n"))
    rep = [a for a in b.from_device(1.0, br.frame("R 3 1000 0 20480 0").rstrip(b"\n")) if a[0] == "up"]
    m = codec.decode(rep[0][1])[1]
    nack = _ctl(b, "nack", {"seq": 3, "upto": born["seq"], "miss": m["seq"]})
    assert b.from_backend(1.3, nack) == rep and b.delivery.stats["resent"] == 1      # at once, the same bytes
    assert b.from_backend(1.3, _ctl(b, "nack", {"seq": 4, "upto": m["seq"], "miss": m["seq"] + 1})) == []
    assert b.delivery.held == []                        # its upto acknowledged it


def test_a_rebirth_is_stamped_no_later_than_the_uplinks_behind_it():
    """A birth the backend asked for arrives between a sample's frames: the report of a sample taken before the
    birth frame arrived is numbered after the birth and its stamp is the board's tick mapped by the least-
    delayed frame, so a birth stamped with its arrival came after it and the coordinator dropped the report
    as sent before its birth, nacked it and asked for births again (the live demo's micro:bits, which
    switched the whole fleet to ack mode). Against the coordinator: every report behind the birth is admitted."""
    from backend.host import Host
    rnd = random.Random(8)
    h = Host(protocol="adaptive", period=5.0, latency=0.5, t0=0.0)
    b = br.Bridge("s_b0", 9)
    n, t0 = 1, 1.7e9
    seqs = []

    def feed(now, body):
        for act in b.from_device(now, br.frame(body).rstrip(b"\n")):
            if act[0] in ("up", "state"):
                kind, m = codec.decode(act[1])
                seqs.append((kind, m["seq"], m["t"]))
                h.record(now, "s_b0", act[0], act[1])

    feed(t0, "B 1 0 -1 -")
    for i in range(1, 400):
        tick = i * 100
        now = t0 + i * 0.1 + rnd.uniform(0.0, 0.08)
        n += 1
        if i % 50 == 25:                          # a birth the backend asked for, then the next sample's report
            feed(now - 0.01, "B %d 0 -1 %d" % (n, 20 * 1024))
            n += 1
        feed(now, "R %d %d 0 %d 0" % (n, tick, (20 + i % 7) * 1024))
    births = [i for i, (kind, _, _) in enumerate(seqs) if kind == "birth"][1:]
    assert len(births) == 8
    for i in births:
        assert seqs[i][2] <= seqs[i + 1][2], (seqs[i], seqs[i + 1])      # main before: up to 42 ms later
    d = h.coord.integrity.dev["s_b0"]
    assert d["high"] == seqs[-1][1] and not d["missing"], d["missing"]    # main before: the report after
                                                                          # the last birth missing
