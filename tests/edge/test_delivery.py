"""Uplink delivery (edge/core/delivery.py): heartbeat marks take no sequence number; in ack mode every
numbered uplink is sent again, unchanged, until acknowledged or resent TRIES times (one followed by a later
uplink first at 3·rto, at once when a nack names it); the buffer is bounded and a birth clears it."""
from edge.agent import Agent
from edge.core import codec
from edge.core.delivery import Delivery, TRIES, CAP
from portable import ctl, session


def _up(out):
    return [codec.decode(p) for ch, p in out if ch == "up"]


def test_a_mark_repeats_the_latest_number_and_is_stamped_when_data_is_complete():
    a = Agent("d", ["x"], width=1.0)
    session(a, beat=5000)
    birth_seq = a.delivery.seq
    assert _up(a.handle_timer(5.0)) == [("mark", {"seq": birth_seq, "t": 5.0})]
    r = _up(a.handle_sample(6.0, "x", 3.0))         # the first reading: a report takes the next number
    assert r[0][0] == "report" and r[0][1]["seq"] == birth_seq + 1
    assert a.next_deadline() == 11.0                  # silent for B after its last uplink
    assert _up(a.handle_timer(10.9)) == []
    assert _up(a.handle_timer(11.0)) == [("mark", {"seq": birth_seq + 1, "t": 11.0})]
    assert _up(a.handle_timer(16.0)) == [("mark", {"seq": birth_seq + 1, "t": 16.0})]    # marks take none
    assert a.delivery.stats["marks"] == 3


def test_ack_mode_resends_the_same_bytes_with_backoff_until_acknowledged():
    a = Agent("d", ["x"], width=1.0)
    session(a)
    a.handle_message(0.0, ctl(a, "link", seq=2, rto=500, guard=0))
    first = a.handle_sample(1.0, "x", 0.0)
    assert a.next_deadline() == 1.5
    assert a.handle_timer(1.5) == first               # original seq and stamp, byte for byte
    second = a.handle_sample(2.0, "x", 5.0)
    assert a.next_deadline() == 2.5                   # the first's second try (2 rto) and the second's first
    assert a.handle_timer(2.5) == first + second
    assert [e[2] for e in a.delivery.held] == [4.5, 3.5]     # then 4 rto (the cap) and 2 rto
    s1 = codec.decode(first[0][1])[1]["seq"]
    a.handle_message(3.0, ctl(a, "ack", seq=3, upto=s1, now=3000))
    assert [e[0] for e in a.delivery.held] == [s1 + 1]
    a.handle_message(3.1, ctl(a, "ack", seq=4, upto=s1 + 1, now=3100))
    assert a.delivery.held == [] and a.next_deadline() is None
    a.handle_sample(4.0, "x", 9.0)
    a.handle_message(4.1, ctl(a, "link", seq=5, rto=0, guard=0))     # ack mode off: nothing kept any more
    assert a.delivery.held == [] and _up(a.handle_sample(5.0, "x", 20.0)) and a.delivery.held == []


def test_the_buffer_keeps_the_newest_and_a_birth_supersedes_it():
    d = Delivery(3)
    d.link(1)
    for k in range(5):
        d.number(k, "report", {"src": 0, "epoch": 0, "t": float(k), "v": 1.0, "why": 0})
    assert [e[0] for e in d.held] == [3, 4, 5] and d.stats["overflow"] == 2
    d.acked(0xFFFFFFFF)                                # serial order: before 3, acknowledges nothing
    assert len(d.held) == 3
    d.born(9)
    assert d.held == [] and d.last == 9
    d.seq = 0xFFFFFFFF                                  # numbers wrap in 32-bit serial order
    d.number(10, "mark", {"t": 10.0})
    d.acked(0xFFFFFFFF)
    assert [e[0] for e in d.held] == [0]
    d.acked(0)
    assert d.held == []


def test_an_uplink_never_acknowledged_is_given_up_after_its_tries_and_the_marks_then_show_its_number():
    d = Delivery(4)
    d.beat, d.last = 1000, 0
    d.link(2)
    p = d.number(0, "report", {"src": 0, "epoch": 0, "t": 0.0, "v": 1.0, "why": 0})
    sent, now, waits = [], 0, []
    while d.deadline() is not None and now < 100000:     # (the oracle: the schedule rto, 2·rto, then CAP·rto)
        t = d.deadline()
        waits.append(t - now)
        now = t
        out = d.due(now, False, now)
        sent += out
        if out and codec.decode(out[0])[0] == "mark":
            break
    assert sent[:-1] == [p] * TRIES and d.stats["resent"] == TRIES and d.stats["given_up"] == 1
    assert waits == [2, 4] + [2 * CAP] * (TRIES - 1) + [1000 - 2 * CAP]    # the last resend's wait too
    # the mark B after the last resend shows the backend the number it never heard (a lost uplink)
    assert d.held == [] and codec.decode(sent[-1]) == ("mark", {"seq": 1, "t": now}) and d.deadline() == now + 1000


def test_marks_wait_while_something_else_goes_out_and_resends_are_heard_as_uplinks():
    d = Delivery(4)
    d.beat, d.last = 10, 0
    assert d.due(10, True, 10) == []                   # busy: the other message shows it alive
    assert [codec.decode(p)[0] for p in d.due(10, False, 7)] == ["mark"]
    d.link(2)
    p = d.number(11, "report", {"src": 0, "epoch": 0, "t": 11.0, "v": 1.0, "why": 0})
    assert d.due(13, False, 13) == [p] and d.last == 13 and d.deadline() == 17


def test_a_guard_reports_what_leaves_the_hull_of_the_bound_before_and_the_value():
    a = Agent("d", ["x"], width=2.0)
    session(a)
    a.handle_message(0.0, ctl(a, "link", seq=2, rto=0, guard=300))     # 0.3 s
    a.handle_sample(0.0, "x", 10.0)                      # first report: bound [9, 11], no guard yet
    out = _up(a.handle_sample(1.0, "x", 11.5))           # leaves it: guarded; the backend states [9, 11.5]
    assert out[0][1]["why"] == codec.WHY_EXIT | codec.GUARDED and a.guards[0] == (1.3, 9.0, 11.5)
    assert a.handle_sample(1.1, "x", 11.0) == []         # inside the band [10.5, 12.5] and the hull
    assert not a.filters[0].check(12.0)                  # inside the band, outside the hull: reported
    assert _up(a.handle_sample(1.2, "x", 12.0))[0][1]["why"] == codec.WHY_EXIT | codec.GUARDED
    # from its bound [10.5, 12.5] (what the backend states includes it: BoundCache.hold), not the guard before
    assert a.guards[0] == (1.5, 10.5, 12.5)
    assert not a.filters[0].check(12.7) and _up(a.handle_sample(1.3, "x", 12.7))     # in the band, not the hull
    assert a.guards[0] == (1.6, 11.0, 13.0)
    assert a.handle_sample(1.7, "x", 12.4) == [] and 0 not in a.guards       # past the guard: the band only


def test_without_a_guard_reports_are_not_flagged():
    a = Agent("d", ["x"], width=2.0)
    session(a)
    a.handle_sample(0.0, "x", 10.0)
    out = _up(a.handle_sample(1.0, "x", 11.5))
    assert out[0][1]["why"] == codec.WHY_EXIT and a.guards == {}


def _schedule(d, until):
    """Every payload the resend timer sends until ``until`` (clock units), with its time."""
    out = []
    while d.deadline() is not None and d.deadline() <= until:
        now = d.deadline()
        out += [(now, p) for p in d.due(now, False, now)]
    return out


def test_an_uplink_followed_by_a_later_one_is_resent_at_3_rto_or_at_once_when_nacked():
    d = Delivery(8)                                     # integer ms, as on a board
    d.link(500)
    rep = lambda t: d.number(t, "report", {"src": 0, "epoch": 0, "t": t / 1000, "v": 1.0, "why": 0})
    p1, p2 = rep(1000), rep(1200)                       # numbers 1 and 2: the backend sees 1's gap from 2
    assert [e[2] for e in d.held] == [2500, 1700]       # 1 at 3·rto (its nack asks sooner), 2 at rto
    assert _schedule(d, 2500) == [(1700, p2), (2500, p1)]
    d2 = Delivery(8)
    d2.link(500)
    q1 = d2.number(1000, "report", {"src": 0, "epoch": 0, "t": 1.0, "v": 1.0, "why": 0})
    d2.number(1200, "report", {"src": 0, "epoch": 0, "t": 1.2, "v": 2.0, "why": 0})
    assert d2.nacked(1400, 0, 1) == [q1] and d2.stats["resent"] == 1     # at once, the same bytes
    assert d2.held[0][2:4] == [1900, 1]                 # known missing: again after rto if lost too
    assert d2.nacked(1450, 1, 2) != [] and [e[0] for e in d2.held] == [2]     # upto frees 1; 2 resent
    assert d2.nacked(1500, 1, 7) == [] and d2.stats["resent"] == 2      # a number not kept: nothing


def test_a_nack_never_resends_an_uplink_past_its_tries():
    d = Delivery(4)
    d.link(100)
    p = d.number(0, "report", {"src": 0, "epoch": 0, "t": 0.0, "v": 1.0, "why": 0})
    for k in range(TRIES):
        assert d.nacked(100 * k + 50, 0, 1) == [p]
        assert d.nacked(100 * k + 99, 0, 1) == []        # a copy of the nack within rto/2: nothing more
    assert d.nacked(100 * TRIES + 50, 0, 1) == [] and d.stats["resent"] == TRIES


def test_an_agent_resends_what_a_nack_names_and_ignores_a_stale_one():
    a = Agent("d", ["x"], width=1.0)
    session(a)
    a.handle_message(0.0, ctl(a, "link", seq=2, rto=500, guard=0))
    first = a.handle_sample(1.0, "x", 0.0)
    a.handle_sample(2.0, "x", 5.0)
    s1 = codec.decode(first[0][1])[1]["seq"]
    assert a.handle_message(2.1, ctl(a, "nack", seq=3, upto=s1 - 1, miss=s1)) == first
    assert a.handle_message(2.2, ctl(a, "nack", seq=3, upto=s1 - 1, miss=s1)) == []     # a duplicate downlink


def test_each_boot_numbers_from_its_own_start_far_from_other_boots():
    # uplinks carry no boot: a reboot whose birth is lost must not read as the old boot going on (the backend finds
    # a number far outside its window: backend.coordinator.core.integrity)
    assert Delivery(1).seq == 0
    starts = [Delivery(1, None, b).seq for b in range(1, 65)] + [Delivery(1, None, 0xFFFFFFFF).seq]
    for i, a in enumerate(starts):
        assert 0 <= a < 1 << 30         # (a 32-bit board's numbers stay small ints)
        for b in starts[:i]:
            assert min((a - b) & 0xFFFFFFFF, (b - a) & 0xFFFFFFFF) > 1 << 16, (a, b)
    old, new = Agent("d", ["x"], boot=1), Agent("d", ["x"], boot=2)
    s1, s2 = [codec.decode(a.start(0.0)[0][1])[1]["seq"] for a in (old, new)]
    assert s1 == starts[0] + 1 and s2 == starts[1] + 1
