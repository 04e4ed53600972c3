"""What a device keeps while its broker is slow, bounded in bytes (edge.runtime.outbox, ack mode's resend buffer in
edge.core.delivery) and a MemoryError survived (edge.runtime.pump): on every prefix of a random stream, under
CPython and MicroPython."""
from edge.agent import Agent
from edge.core import codec, segment
from edge.core.delivery import Delivery
from edge.runtime.outbox import Outbox
from edge.runtime.pump import SPACING, Pump
from portable import Rng, ctl, raises, session


def _report(src, seq):
    return codec.encode("report", {"src": src, "epoch": 0, "seq": seq, "t": 0, "v": 1.0, "why": 0})


def _segs(seq, n):
    recs = [{"src": 0, "epoch": 0, "a": k, "e": k + 1, "v": 1.0, "s": 0.0, "w": 1.0, "f": 0} for k in range(n)]
    return codec.encode("segs", {"seq": seq, "t": n, "segs": recs})


def _seq(payload):
    return codec.decode(payload)[1]["seq"]


def test_the_byte_budget_drops_superseded_reports_first():
    n = len(_report(0, 1))
    box = Outbox(100, 3 * n)
    for seq, src in ((1, 0), (2, 1), (3, 0), (4, 0), (5, 2)):
        box.push(_report(src, seq))
    assert [_seq(p) for _, p in box.items] == [2, 4, 5] and box.dropped == 2 and box.bytes == 3 * n
    raises(ValueError, Outbox, 4, 0)


def test_a_batch_larger_than_the_budget_is_dropped_whole():
    box = Outbox(10, 500)
    box.push(_report(0, 1))
    big = _segs(2, 40)
    assert len(big) > 500
    box.push(big)
    assert [_seq(p) for _, p in box.items] == [1] and box.dropped == 1 and box.bytes == len(_report(0, 1))


def test_the_outbox_holds_its_bounds_on_every_prefix_and_drops_only_what_is_superseded_while_it_can():
    rng = Rng(11)
    for size, budget in ((8, 100000), (1000, 900), (6, 1500)):
        box = Outbox(size, budget)
        pushed = []
        newest = {}                 # key -> seq of its newest message pushed
        for seq in range(1, 400):
            if rng.below(4):
                p = _report(rng.below(4), seq)
                key = ("report", codec.decode(p)[1]["src"])
            else:
                p, key = _segs(seq, 1 + rng.below(30)), ("segs", None)
            before = [_seq(q) for _, q in box.items]
            box.push(p)
            pushed.append(seq)
            newest[key] = seq
            kept = [_seq(q) for _, q in box.items]
            assert len(kept) <= size and box.bytes <= budget
            assert box.bytes == sum([len(q) for _, q in box.items])
            assert kept == sorted(kept) and len(kept) + box.dropped == len(pushed)
            gone = [s for s in before + ([seq] if len(p) <= budget else []) if s not in kept]
            keys = [k for k, _ in box.items]
            if [s for s in gone if s in newest.values()]:     # a key's newest went: nothing superseded was left
                assert len(keys) == len(set(keys)), (size, budget, seq)


def test_shed_frees_the_older_half():
    box = Outbox(10)
    for seq in range(1, 6):
        box.push(_report(seq, seq))
    box.shed()
    assert [_seq(p) for _, p in box.items] == [4, 5] and box.dropped == 3
    assert box.bytes == 2 * len(_report(0, 1))


def test_the_resend_buffer_is_bounded_in_bytes_oldest_first():
    d = Delivery(8, 1000)
    d.link(100)
    sizes = []
    for k in range(30):
        recs = [{"src": 0, "epoch": 0, "a": j, "e": j + 1, "v": 1.0, "s": 0.0, "w": 1.0, "f": 0} for j in range(k % 7)]
        d.number(k, "segs", {"t": k, "segs": recs})
        sizes.append(len(d.held[-1][1]))
        seqs = [e[0] for e in d.held]
        held = sum([len(e[1]) for e in d.held])
        assert seqs == list(range(d.seq - len(seqs) + 1, d.seq + 1)) and len(seqs) <= 8
        assert held <= 1000 or len(seqs) == 1
        # the oracle: the longest suffix of what was numbered that fits (the newest always kept)
        n, total = 0, 0
        while n < len(sizes) and n < 8 and (n == 0 or total + sizes[-1 - n] <= 1000):
            total += sizes[-1 - n]
            n += 1
        assert len(seqs) == n, (k, seqs, sizes[-9:])
    assert d.stats["overflow"] == 30 - len(d.held)


class _Down:
    def __init__(self):
        self.ok = False
        self.sent = []

    def send(self, channel, payload):
        if self.ok:
            self.sent.append(payload)
        return self.ok


def _segment_agent():
    a = Agent("d", ["x", "y"], width=1.0, unit=1000)
    session(a, 0)
    for i in (0, 1):
        a.handle_message(0, ctl(a, "segment", src=i, seq=2 + i, lag=2000, model=segment.LINE, width=0.1))
    return a


def test_a_slow_broker_keeps_segment_batches_within_the_budget_and_every_loss_is_a_gap():
    a = _segment_agent()
    link = _Down()
    box = Outbox(32, 6000)
    pump = Pump(a, [], box, link.send)
    offered = []
    rng = Rng(5)
    for k in range(1, 3000):
        t = 10 * k
        out = a.handle_sample(t, k % 2, 3.0 * (k // 500) + rng.uniform(-0.2, 0.2))   # segments; rarely a report
        if a.next_deadline() is not None and a.next_deadline() <= t:
            out += a.handle_timer(t)
        offered += [p for _, p in out]
        pump._emit(t, out)
        assert box.bytes <= 6000 and len(box) <= 32
    ups = offered
    assert box.dropped > 0 and max([len(p) for p in ups]) <= codec.MAX_PAYLOAD
    numbered = sorted([_seq(p) for p in ups])
    assert numbered == list(range(numbered[0], numbered[-1] + 1))      # every uplink numbered: a drop is a gap
    link.ok = True
    pump.online(30000)
    got = [_seq(p) for p in link.sent if codec.decode(p)[0] != "birth"]
    assert got == sorted(got) and len(got) == len(numbered) - box.dropped and len(box) == 0
    assert codec.decode(link.sent[-1])[0] == "birth"        # then the birth resynchronises every source


def test_out_of_memory_frees_what_is_kept_and_skips_a_number():
    a = _segment_agent()
    link = _Down()
    pump = Pump(a, [], Outbox(32), link.send)
    a.delivery.link(1000)
    rng = Rng(8)
    for k in range(1, 400):
        pump._emit(10 * k, a.handle_sample(10 * k, 0, rng.uniform(-5.0, 5.0)))
    kept, held, seq = len(pump.outbox), len(a.delivery.held), a.delivery.seq
    assert kept > 2 and held > 2
    pump.oom()
    assert len(pump.outbox) == kept // 2 and len(a.delivery.held) == held // 2 and pump.ooms == 1
    out = a.handle_sample(4000, 0, 100.0)                     # leaves the filter: reported
    assert [_seq(p) for _, p in out] == [seq + 2]            # seq + 1 is the gap the backend resynchronises


class _Clocked:
    """A link that takes everything and notes when (``now``, set by the test) each payload went."""
    def __init__(self):
        self.now = 0
        self.sent = []

    def send(self, channel, payload):
        self.sent.append((self.now, codec.decode(payload)[0]))
        return True


def test_births_owed_to_memory_errors_go_at_most_one_a_heartbeat_and_as_soon_as_one_may():
    for beat in (0, 3000):          # ms; 0: no heartbeat, SPACING seconds
        a = Agent("d", ["x"], width=1.0, unit=1000)
        link = _Clocked()
        pump = Pump(a, [], Outbox(8), link.send)
        pump.online(0)
        a.handle_message(0, ctl(a, "config", seq=1, period=0, shrink=0.0, beat=beat, t0=0, now=0, tick=0))
        gap = beat or SPACING * 1000
        assert pump.spacing() == gap
        for t in range(100, 60001, 100):       # the heap runs out on every loop pass for a minute
            link.now = t
            pump.oom()
            assert pump.wake() <= pump.born + gap          # the runtime's wait ends by the owed birth's time
            pump.poll(t)
        births = [t for t, kind in link.sent if kind == "birth"]
        # the oracle: a birth at 0 (online), then the owed one each time B has passed since the one before
        want = list(range(0, 60001, gap))
        assert births == want, (beat, births[:12], want[:12])
        assert pump.ooms == 600
    pump.oom()
    link.now = 60050
    pump.message(60050, ctl(a, "rebirth", seq=9))              # a birth the backend asked for settles the one owed
    assert not pump.owed and link.sent[-1] == (60050, "birth") and pump.born == 60050
    link.now = 63050
    pump.poll(63050)                                            # (a mark: B silent) and no birth
    assert [x for x in link.sent if x[1] == "birth"][-1] == (60050, "birth") and link.sent[-1] == (63050, "mark")
