"""Portable runtime pieces: bounded outbox, pump (agent + inputs + transport), walk and CSV inputs."""
from edge.agent import Agent
from edge.core import codec
from edge.runtime.outbox import Outbox
from edge.runtime.pump import Pump
from edge.runtime.sensors import CsvReplay, RandomWalk, make_inputs
from portable import raises, ctl

CSV = "/tmp/qf-test-runtime.csv"


def _report(src, seq):
    return codec.encode("report", {"src": src, "epoch": 0, "seq": seq, "t": 0.0, "v": 1.0, "why": 0})


def test_outbox_keeps_newest_per_source_then_drops_oldest():
    box = Outbox(3)
    for seq, src in ((1, 0), (2, 1), (3, 0), (4, 0), (5, 2)):
        box.push(_report(src, seq))
    seqs = [codec.decode(p)[1]["seq"] for _, p in box.items]
    assert seqs == [2, 4, 5] and box.dropped == 2       # 4 replaced 1 (same source), 5 then pushed out 3
    assert codec.decode(box.peek())[1]["seq"] == 2 and len(box) == 3
    raises(ValueError, Outbox, 0)


class _Link:
    def __init__(self):
        self.ok = False
        self.sent = []

    def send(self, channel, payload):
        if self.ok:
            self.sent.append((channel, codec.decode(payload)[0]))
        return self.ok


class _Feed:
    def __init__(self, rows):
        self.rows = rows

    def next_time(self):
        return self.rows[0][0] if self.rows else None

    def poll(self, now):
        out = []
        while self.rows and self.rows[0][0] <= now:
            out.append(self.rows.pop(0)[1:])
        return out


class _Log:
    def __init__(self):
        self.lines = []

    def write(self, s):
        self.lines.append(s)


def test_pump_holds_reports_offline_then_flushes_before_a_birth():
    link = _Link()
    log = _Log()
    agent = Agent("d", ["a"], width=1.0)
    pump = Pump(agent, [_Feed([(1.0, "a", 0.0), (2.0, "a", 5.0), (3.0, "a", 5.2)])], Outbox(4), link.send, log)
    assert pump.wake() == 1.0
    pump.poll(2.5)
    assert len(pump.outbox) == 2 and link.sent == [] and len(log.lines) == 2
    link.ok = True
    pump.online(2.6)
    assert link.sent == [("up", "report"), ("up", "report"), ("state", "birth")]
    pump.poll(3.0)                                        # 5.2 is inside [4.5, 5.5]: quiet
    assert len(link.sent) == 3 and pump.wake() is None
    pump.message(3.1, ctl(agent, "config", seq=1, period=0, shrink=0.0, beat=0, t0=0, now=0, tick=0))
    pump.message(3.1, ctl(agent, "probe", src=0, seq=2, probe=9))
    pump.message(3.1, b"junk")
    assert link.sent[-1] == ("up", "reply") and agent.stats["bad_messages"] == 1
    assert log.lines[0] == "%r,a,%r\n" % (2.5, 0.0)      # stamped when polled


def test_random_walk_is_seeded_and_keeps_its_grid():
    a = RandomWalk("x", 10.0, 0.5, start=3.0, step=0.25, seed=7)
    b = RandomWalk("x", 10.0, 0.5, start=3.0, step=0.25, seed=7)
    assert a.poll(9.9) == ()
    va = [a.poll(10.0 + 0.5 * i)[0][1] for i in range(20)]
    vb = [b.poll(10.0 + 0.5 * i)[0][1] for i in range(20)]
    assert va == vb and all(abs(va[i + 1] - va[i]) <= 0.25 for i in range(19))
    a.poll(30.2)                                          # a stall skips missed ticks
    assert a.next_time() == 30.5


def test_csv_replay_filters_sources_and_shares_the_file():
    with open(CSV, "w") as f:
        f.write("time,source,value\n100,a,1.5\n100.5,b,2\nbad line\n101,a,3\n")
    r = CsvReplay(CSV, 0.0, speed=2.0, sources=["a"])
    assert r.next_time() == 0.0 and r.poll(0.0) == [("a", 1.5)]
    assert r.next_time() == 0.5 and r.poll(9.0) == [("a", 3.0)] and r.next_time() is None
    inputs, rest = make_inputs({"a": {"kind": "csv", "path": CSV}, "b": {"kind": "csv", "path": CSV},
                                "w": {"kind": "walk"}, "s": {"kind": "serial"}}, ["a", "b", "w", "s"], 0.0, 1.0)
    assert len(inputs) == 2 and rest == [("s", {"kind": "serial"})]
    assert inputs[1].poll(1.0) == [("a", 1.5), ("b", 2.0), ("a", 3.0)]
