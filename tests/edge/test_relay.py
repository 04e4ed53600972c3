"""Relay node: bodies replayed against an exact counter; constraint (1), Theorems 1-2 and raw forwarding hold."""
import gc

from edge.core import codec
from edge.core.relay import (RelayNode, TAG_RAW, TAG_PRB, TAG_CRB, decode_body, encode_bodies,
                             encode_raw)
from portable import raises
from test_sketch import zipf_stream

INF = float("inf")


def moq(qid, tb, te, agg, eta, op=1, seq=1):
    return codec.encode("moq", {"seq": seq, "inc": 0, "to": 0, "op": op, "qid": qid, "tb": tb, "te": te, "agg": agg, "eta": eta})


def run_relay(relay, items, queries=()):
    """Feed items stamped 1..n; return the decoded uplink [(t, body)] in send order."""
    gc.collect()
    sent = []

    def take(out):
        for ch, payload in out:
            kind, m = codec.decode(payload)
            if kind == "blob":
                sent.append((m["t"], decode_body(m["tag"], m["data"])))

    take(relay.start(0.0))
    for q in queries:
        take(relay.handle_message(0.0, moq(*q)))
    for i, k in enumerate(items):
        t = float(i + 1)
        take(relay.handle_item(t, k, t))
        take(relay.handle_timer(t))
    return sent


def check_lifetimes(items, sent, etas):
    """Replay bodies against exact counts; return a list of broken guarantees (empty when all hold)."""
    gc.collect()
    bad = []
    prb = {}
    raw = []
    lifetimes = 0
    for t, body in sent:
        if body[0] == "raw":
            raw.append((t, body[1]))
        elif body[0] == "prb":
            prb.setdefault(t, []).extend(body[2])
        else:
            _, tb, delta, last, recs = body
            te = t
            lifetimes += 1
            exact = {}
            cr = sr = 0
            for i, k in enumerate(items):
                if tb < i + 1 <= te:
                    exact[k] = exact.get(k, 0) + 1
                    cr += 1
                    sr += k
            fcst = dict(prb.get(tb, []))
            corr = dict(recs)
            raw_here = {}
            for rt, k in raw:
                if tb < rt <= te:
                    raw_here[k] = raw_here.get(k, 0) + 1
            for k, n in exact.items():       # an FDI item is never forwarded, anything else always is
                if raw_here.get(k, 0) != (0 if k in fcst else n):
                    bad.append(("raw", te, k))
            cf = sum(exact.get(k, 0) for k in fcst)
            sf = sum(k * exact.get(k, 0) for k in fcst)
            err_c = err_s = 0
            for k, fe in fcst.items():
                fr = exact.get(k, 0)
                if k in corr:
                    if fe + corr[k] != fr:
                        bad.append(("correct", te, k))
                else:
                    if abs(fe - fr) > delta * fr:
                        bad.append(("constraint1", te, k))
                    err_c += fe - fr
                    err_s += k * (fe - fr)
            eta_c, eta_s = etas
            if eta_c is not None and abs(err_c) > eta_c * cr + 1e-9:
                bad.append(("theorem1", te))
            if eta_s is not None and abs(err_s) > eta_s * sr + 1e-9:
                bad.append(("theorem2", te))
            if eta_c is not None and cf and delta > eta_c * cr / cf + 1e-12:
                bad.append(("delta_c", te))
            if eta_s is not None and sf and delta > eta_s * sr / sf + 1e-12:
                bad.append(("delta_s", te))
    return bad, lifetimes, len(raw)


def _blob(out):
    m = codec.decode(out[1])[1]
    return m["tag"], m["data"]


def test_bodies_round_trip_and_split():
    assert decode_body(TAG_RAW, encode_raw(77)) == ("raw", 77)
    recs = [(k, k + 1) for k in range(1000)]
    chunks = encode_bodies(TAG_PRB, 5000.0, recs)
    assert len(chunks) == 3 and all(len(c) <= codec.MAX_BLOB for c in chunks)
    got = []
    for c in chunks:
        kind, te, part = decode_body(TAG_PRB, c)
        assert kind == "prb" and te == 5000.0
        got.extend(part)
    assert got == recs
    chunks = encode_bodies(TAG_CRB, (10.0, 0.25), [(3, -4), (9, 2)])
    assert decode_body(TAG_CRB, chunks[0]) == ("crb", 10.0, 0.25, True, [(3, -4), (9, 2)])
    assert decode_body(TAG_CRB, encode_bodies(TAG_CRB, (1.0, 0.0), [])[0])[3] is True
    raises(codec.CodecError, decode_body, TAG_RAW, b"\x00")
    raises(codec.CodecError, decode_body, TAG_PRB, b"\x00" * 9)
    raises(codec.CodecError, decode_body, 9, b"")
    raises(codec.CodecError, decode_body, TAG_PRB, encode_bodies(TAG_PRB, 1.0, [(1, 0)])[0])


def test_relay_bodies_hold_every_guarantee_against_exact_counts():
    items = zipf_stream(11, 1500, 200)
    for eta_c, eta_s in ((0.02, None), (None, 0.02), (0.005, 0.05)):
        relay = RelayNode("r0", h=8, m=40, support=0.01, domain=(1, 200), fdi=25, delta=0.5, span=250.0)
        qs = []
        if eta_c is not None:
            qs.append(("c", 0.0, 1500.0, 0, eta_c))
        if eta_s is not None:
            qs.append(("s", 0.0, 1500.0, 1, eta_s))
        sent = run_relay(relay, items, qs)
        bad, lifetimes, nraw = check_lifetimes(items, sent, (eta_c, eta_s))
        assert bad == [], bad[:5]
        assert lifetimes == 6 and relay.stats["lifetimes"] == 6
        assert relay.stats["filtered"] > 0.4 * len(items)           # the skew is filtered at the relay
        assert nraw == relay.stats["raw"] == len(items) - relay.stats["filtered"]
        assert 0 < relay.stats["prb"] <= 25 * 6        # the close at 1500 forecasts the next lifetime


def test_checker_catches_a_relay_that_skips_corrections():
    items = zipf_stream(12, 750, 200)
    relay = RelayNode("r0", h=8, m=40, support=0.01, domain=(1, 200), fdi=25, delta=0.5, span=250.0)
    relay.correct_factor = lambda tb, te: 10.0       # ignores the queries' requested error
    sent = run_relay(relay, items, [("c", 0.0, 750.0, 0, 0.001)])
    bad, _, _ = check_lifetimes(items, sent, (0.001, None))
    assert [b for b in bad if b[0] in ("theorem1", "delta_c")]


def test_lifetimes_follow_querying_metadata_and_zero_delta_is_exact():
    items = zipf_stream(13, 1200, 100)
    relay = RelayNode("r0", h=6, m=30, support=0.02, domain=(1, 100), fdi=10, delta=0.0)
    sent = run_relay(relay, items, [("a", 0.0, 400.0, 0, 0.5), ("b", 0.0, 1000.0, 0, 0.5)])
    closes = [(t, b[1]) for t, b in sent if b[0] == "crb"]
    assert closes == [(400.0, 0.0), (1000.0, 400.0)]           # lifetimes end at MoQ ends only
    assert relay.next_deadline() is None and relay.queries == {}
    bad, _, _ = check_lifetimes(items[:1000], sent, (0.0, None))
    assert bad == []
    fc = dict((k, c) for t, b in sent if b[0] == "prb" for k, c in b[2])
    assert fc                                                   # the second lifetime had forecasts


def test_new_boundary_shortens_the_open_lifetime_and_late_items_go_raw():
    relay = RelayNode("r0", h=4, m=20, support=0.1, domain=(0, 50), span=100.0, lag=5.0)
    relay.start(0.0)
    assert relay.next_deadline() == 105.0
    relay.handle_item(10.0, 3, 10.0)
    relay.handle_message(12.0, moq("q", 0.0, 40.0, 0, 0.1))
    assert relay.next_deadline() == 45.0
    relay.handle_message(12.0, moq("q2", 5.0, 8.0, 0, 0.1))      # 8 < an item already counted: kept
    assert relay.next_deadline() == 45.0
    out = relay.handle_timer(45.0)
    assert decode_body(*_blob(out[0])) [0] == "crb" and relay.tb == 40.0
    out = relay.handle_item(46.0, 7, 39.0)                         # its lifetime closed: forwarded raw
    assert relay.stats["late"] == 1 and len(out) == 1
    relay.handle_message(46.0, moq("q", 0, 0, 0, 0, op=0))
    assert "q" not in relay.queries


def test_bad_input_is_counted_not_raised():
    relay = RelayNode("r0", domain=(1, 10))
    assert relay.handle_item(0.0, 1) == []                        # not started yet
    relay.start(0.0)
    for k, t in ((0, 1.0), (11, 1.0), (1.5, 1.0), (True, 1.0), (2, INF), (2, float("nan"))):
        assert relay.handle_item(1.0, k, t) == []
    assert relay.stats["bad_items"] == 7
    assert relay.handle_message(1.0, b"\x01") == []
    assert relay.handle_message(1.0, moq("q", 5.0, 1.0, 0, 0.1)) == []
    assert relay.handle_sensor(1.0, codec.encode("mark", {"seq": 1, "t": 1.0})) == []
    assert relay.stats["bad_messages"] == 3
    out = relay.handle_sensor(2.0, codec.encode("blob", {"src": 0, "seq": 1, "t": 2.0, "tag": TAG_RAW,
                                                         "data": encode_raw(4)}))
    assert len(out) == 1 and relay.stats["raw"] == 1
    assert relay.handle_message(3.0, codec.encode("rebirth", {"seq": 2, "inc": 0, "to": 0}))[0][0] == "state"
    raises(ValueError, RelayNode, "r", 30, 30, 1, 2.0)
    raises(ValueError, RelayNode, "r", 30, 30, 1, 0.1, (5, 1))
    raises(ValueError, RelayNode, "r", 30, 30, 1, 0.1, (0, 9), -1)
    raises(ValueError, RelayNode, "r", 30, 30, 1, 0.1, (0, 9), 10, 0.1, 0.0, 0.0, "other")


def test_the_relay_resends_at_once_what_a_nack_names():
    relay = RelayNode("r0", domain=(1, 10), span=10.0, lag=1.0)
    birth = codec.decode(relay.start(0.0)[0][1])[1]
    relay.handle_message(0.0, codec.encode("link", {"seq": 1, "inc": 0, "to": 0, "rto": 500, "guard": 0}))
    sent = relay.handle_item(1.0, 4, 1.0)[0][1]
    nack = codec.encode("nack", {"seq": 2, "inc": 0, "to": 0, "upto": birth["seq"], "miss": codec.decode(sent)[1]["seq"]})
    assert [p for _, p in relay.handle_message(1.3, nack)] == [sent]        # the same bytes, before its rto
    assert relay.handle_message(1.4, nack) == [] and relay.delivery.stats["resent"] == 1    # (a stale copy)


def test_the_relay_numbers_its_uplinks_marks_its_silence_and_resends_in_ack_mode():
    relay = RelayNode("r0", domain=(1, 10), span=10.0, lag=1.0)
    birth = codec.decode(relay.start(0.0)[0][1])[1]
    relay.handle_message(0.0, codec.encode("config", {"seq": 1, "inc": 0, "to": 0, "period": 0, "shrink": 0.0,
                                                      "beat": 4000, "t0": 0, "now": 0, "tick": 0}))
    assert relay.next_deadline() == 4.0                       # silent since its birth: a mark is due at B
    mark = [codec.decode(p) for _, p in relay.handle_timer(4.0)]
    assert mark == [("mark", {"seq": birth["seq"], "t": 3.0})]           # raw items complete through now − lag
    raw = relay.handle_item(5.0, 3, 4.5)                      # an item stamped 4.5 arriving at 5: numbered
    m = codec.decode(raw[0][1])[1]
    assert m["seq"] == birth["seq"] + 1 and m["t"] == 4.5 and relay.next_deadline() == 9.0
    relay.handle_message(5.0, codec.encode("link", {"seq": 2, "inc": 0, "to": 0, "rto": 500, "guard": 0}))
    sent = relay.handle_item(6.0, 4, 6.0)[0][1]
    assert relay.next_deadline() == 6.5                       # resend timeout from the sending time
    assert [p for _, p in relay.handle_timer(6.5)] == [sent]  # the same bytes: its number and stamp
    assert relay.next_deadline() == 7.5                       # then after 2·rto
    relay.handle_message(7.0, codec.encode("ack", {"seq": 3, "inc": 0, "to": 0,
                                                   "upto": codec.decode(sent)[1]["seq"], "now": 7000}))
    seq = codec.decode(sent)[1]["seq"]
    relay.handle_message(7.0, codec.encode("link", {"seq": 4, "inc": 0, "to": 0, "rto": 0, "guard": 0}))
    assert relay.delivery.held == [] and relay.next_deadline() == 10.5            # B after the resend
    assert [codec.decode(p) for _, p in relay.handle_timer(10.5)] == [("mark", {"seq": seq, "t": 9.5})]
    out = [codec.decode(p) for _, p in relay.handle_timer(11.0)]                 # closed at te + lag
    assert [(k, m["tag"], m["t"]) for k, m in out] == [("blob", TAG_CRB, 10.0), ("blob", TAG_PRB, 10.0)]
    assert relay.fdi and [codec.decode(p)[1] for _, p in relay.handle_timer(15.0)] == [
        {"seq": seq + 2, "t": 10.0}]        # frequent items are only counted: complete through the lifetime's start
    assert relay.delivery.stats == {"resent": 1, "overflow": 0, "marks": 3, "given_up": 0}
