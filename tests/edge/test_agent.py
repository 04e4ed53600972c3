"""Agent state machine through the codec: reports, shrink timer, controls, epochs, probes, bad input."""
from edge.agent import Agent
from edge.core.codec import NO_VALUE, newer
from edge.core import codec
from edge.core.interval import IntervalFilter, INF
from portable import INC, Rng, ctl, session


def _kinds(out):
    return [codec.decode(p)[0] for _, p in out]


def test_first_sample_reported_then_only_exits():
    a = Agent("d1", ["t"], width=2.0)
    out = a.handle_sample(0.0, "t", 10.0)
    assert _kinds(out) == ["report"]
    assert a.handle_sample(1.0, "t", 10.9) == []
    out = a.handle_sample(2.0, 0, 11.5)
    k, m = codec.decode(out[0][1])
    assert (k, m["v"], m["t"], m["why"], m["seq"]) == ("report", 11.5, 2.0, codec.WHY_EXIT, 2)


def test_bad_samples_and_messages_are_counted_not_raised():
    a = Agent("d1", ["t"])
    for bad in (float("nan"), INF, "x", None, True):
        assert a.handle_sample(0.0, "t", bad) == []
    assert a.handle_sample(0.0, "nope", 1.0) == [] and a.handle_sample(0.0, 5, 1.0) == []
    session(a)
    for payload in (b"", b"\x01", b"garbage", codec.encode("mark", {"seq": 1, "t": 0.0}), ctl(a, "probe", src=9, seq=2, probe=1)):
        assert a.handle_message(0.0, payload) == []
    assert a.stats["bad_samples"] == 7 and a.stats["bad_messages"] == 5


def test_shrink_timer_rechecks_and_stamps_the_shrink_instant():
    a = Agent("d1", ["t"], width=10.0)
    session(a, period=10000, shrink=0.5)
    a.handle_sample(0.5, "t", 0.0)
    a.handle_sample(1.0, "t", 3.0)          # inside [-5, 5]
    assert a.next_deadline() == 10.0
    out = a.handle_timer(10.2)               # width 5: [-2.5, 2.5] excludes 3
    k, m = codec.decode(out[0][1])
    assert (k, m["why"], m["t"], m["v"]) == ("report", codec.WHY_SHRINK, 10.0, 3.0)
    assert a.next_deadline() == 20.0 and a.filters[0].width == 5.0


def test_width_control_catches_up_on_missed_shrinks_and_ignores_stale_epochs():
    a = Agent("d1", ["t"], width=1.0)
    session(a, period=10000, shrink=0.5)
    a.handle_sample(0.0, "t", 0.0)
    a.handle_timer(30.0)                     # three shrinks
    assert a.period == 3
    a.handle_message(31.0, ctl(a, "width", src=0, epoch=1, seq=2, period=1, width=8.0, ack=0))
    assert a.filters[0].width == 2.0         # 8 * 0.5 * 0.5, as the backend mirror has it now
    a.handle_message(31.0, ctl(a, "width", src=0, epoch=1, seq=3, period=3, width=100.0, ack=0))
    assert a.filters[0].width == 2.0         # same epoch again: ignored
    a.handle_message(31.0, ctl(a, "width", src=0, epoch=2, seq=2, period=3, width=100.0, ack=0))
    assert a.filters[0].width == 2.0         # duplicate downlink sequence number: ignored
    assert newer(1, 65535) and not newer(65535, 1) and not newer(5, 5)


def test_assignments_recheck_and_ack():
    a = Agent("d1", ["t"], width=INF)
    session(a, seq=0)
    a.handle_sample(0.0, "t", 500.0)
    assert a.handle_sample(0.5, "t", 50.0) == []          # width inf: silent
    out = a.handle_message(1.0, ctl(a, "filter", src=0, epoch=1, seq=1, width=INF, ack=0, cons=[{"l": 0.0, "u": 100.0}]))
    assert _kinds(out) == ["report"]          # 50 is inside [0,100], the last reported 500 was not
    out = a.handle_message(2.0, ctl(a, "bound", src=0, epoch=2, seq=2, lo=400.0, hi=600.0, ack=1))
    k, m = codec.decode(out[0][1])
    assert (k, m["why"], m["epoch"]) == ("report", codec.WHY_ASSIGN, 2)
    out = a.handle_message(3.0, ctl(a, "filter", src=0, epoch=3, seq=3, width=INF, ack=0, cons=[{"l": INF, "u": INF}]))
    assert out == [] and a.handle_sample(4.0, "t", -1e9) == []   # shut down


def test_probe_reply_and_birth_and_heartbeat():
    a = Agent("d1", ["a", "b"], boot=42)
    session(a, beat=30000)
    out = a.handle_message(0.0, ctl(a, "probe", src=1, seq=2, probe=7))
    k, m = codec.decode(out[0][1])
    assert (k, m["v"], m["probe"]) == ("reply", NO_VALUE, 7)
    a.handle_sample(1.0, "b", 2.5)
    birth = a.start(5.0)
    k, m = codec.decode(birth[0][1])
    assert birth[0][0] == "state" and k == "birth" and m["boot"] == 42
    assert [s["name"] for s in m["sources"]] == ["a", "b"] and m["sources"][1]["v"] == 2.5
    assert a.next_deadline() == 35.0
    mark = a.handle_timer(35.0)
    assert _kinds(mark) == ["mark"] and codec.decode(mark[0][1])[1] == {"seq": m["seq"], "t": 35.0}
    assert codec.decode(a.will()) == ("gone", {"boot": 42})
    again = a.handle_message(40.0, ctl(a, "rebirth", seq=3))
    assert again[0][0] == "state" and codec.decode(again[0][1])[0] == "birth"


def _mirror_run(seed):
    """Random samples, shrinks and delayed width controls; a mirror fed the decoded uplink holds the truth."""
    r = Rng(seed)
    n = 3
    a = Agent("d", ["s%d" % i for i in range(n)], width=r.uniform(0, 4))
    mirrors = [IntervalFilter(a.filters[i].width) for i in range(n)]
    S = r.choice([0.0, 0.05, 0.2])
    session(a, period=5000, shrink=S)
    vals = [r.uniform(-10, 10) for _ in range(n)]
    pending = []   # (deliver_at, payload)
    epoch = [0] * n
    seq = 1
    period = 0
    t = 0.0
    for step in range(300):
        t += r.uniform(0.1, 1.5)
        out = []
        due = a.next_deadline()
        if due is not None and due <= t:
            while (period + 1) * 5.0 <= t:       # backend mirrors shrink at the same instants
                period += 1
                for m in mirrors:
                    m.shrink(S)
            out += a.handle_timer(t)
        for d in [p for p in pending if p[0] <= t]:
            pending.remove(d)
            out += a.handle_message(t, d[1])
        i = r.below(n)
        vals[i] += r.uniform(-2, 2)
        out += a.handle_sample(t, i, vals[i])
        for ch, p in out:
            k, m = codec.decode(p)
            mirrors[m["src"]].recenter(m["v"])
        if r.below(10) == 0:                     # backend grows a width now, device gets it later
            j = r.below(n)
            epoch[j] += 1
            seq += 1
            w = mirrors[j].width + r.uniform(0, 3)
            mirrors[j].set_width(w, epoch[j])
            pending.append((t + r.uniform(0, 4), ctl(a, "width", src=j, epoch=epoch[j], seq=seq, period=period, width=w, ack=0)))
        for j in range(n):
            if a.values[j] is not None:
                lo, hi = mirrors[j].known()
                assert lo <= a.values[j] <= hi, (seed, step, j)


def test_mirror_of_decoded_uplink_contains_truth():
    for seed in range(25):
        _mirror_run(seed)


def test_control_from_before_a_reboot_cannot_lock_out_new_epochs():
    old = Agent("d1", ["t"], boot=1, width=1.0)
    session(old, seq=0)
    stale = ctl(old, "width", src=0, epoch=51, seq=9, period=0, width=100.0, ack=0)  # in flight at the reboot
    a = Agent("d1", ["t"], boot=2, width=1.0)        # rebooted: epoch 0, a new boot id
    session(a, seq=0)
    a.handle_sample(0.0, "t", 5.0)
    assert a.handle_message(1.0, stale) == [] and a.filters[0].width == 1.0 and a.stats["stale"] == 1
    a.handle_message(2.0, ctl(a, "width", src=0, epoch=1, seq=1, period=0, width=3.0, ack=0))
    assert (a.filters[0].width, a.filters[0].epoch) == (3.0, 1)     # the backend's new epochs apply


def test_control_from_before_the_latest_birth_or_another_backend_run_is_dropped():
    a = Agent("d1", ["t"], width=1.0)
    session(a, seq=0)
    before = ctl(a, "width", src=0, epoch=5, seq=1, period=0, width=9.0, ack=0)
    a.start(1.0)                                         # reconnect: a new birth, same boot
    other_run = ctl(a, "width", src=0, epoch=5, seq=1, period=0, width=9.0, ack=0, inc=8)
    for m in (before, other_run):
        assert a.handle_message(2.0, m) == []
    assert a.filters[0].width == 1.0 and a.stats["stale"] == 2
    a.handle_message(3.0, ctl(a, "config", seq=0, period=0, shrink=0.0, beat=0, t0=0, now=0, tick=0, inc=8))
    a.handle_message(3.0, other_run)                     # the new run has configured us: now it applies
    assert a.filters[0].width == 9.0


def test_a_replayed_config_of_an_earlier_backend_run_is_dropped():
    """A backend restart takes a later incarnation; controls (configs too) of the run before it, replayed
    or redelivered after the new run configured the device, are dropped, across the 32-bit wrap."""
    a = Agent("d1", ["t"], width=1.0)
    session(a, seq=0)                                   # configured by run INC
    prev = INC
    for inc in (INC + 1, 0x80000000, 0xFFFFFFF0, 4):    # later runs, the last one past the wrap
        a.handle_message(1.0, ctl(a, "config", seq=1, period=0, shrink=0.0, beat=0, t0=0, now=0, tick=0, inc=inc))
        a.handle_message(1.0, ctl(a, "width", src=0, epoch=a.filters[0].epoch + 1, seq=2, period=0,
                                  width=float(inc % 100), ack=0, inc=inc))
        assert a.inc == inc and a.filters[0].width == float(inc % 100)
        stale = a.stats["stale"]
        for m in (ctl(a, "config", seq=7, period=0, shrink=0.0, beat=0, t0=0, now=0, tick=0, inc=prev),
                  ctl(a, "width", src=0, epoch=a.filters[0].epoch + 1, seq=8, period=0, width=0.5, ack=0, inc=prev)):
            assert a.handle_message(2.0, m) == []       # the earlier run's replay: nothing changes
        assert a.inc == inc and a.filters[0].width == float(inc % 100) and a.stats["stale"] == stale + 2
        prev = inc


def test_duplicates_are_dropped_long_after_and_reordering_is_tolerated():
    a = Agent("d1", ["t"], width=1.0)
    session(a, seq=0)
    a.handle_sample(0.0, "t", 1.0)
    probe = ctl(a, "probe", src=0, seq=1, probe=1)
    assert len(a.handle_message(1.0, probe)) == 1
    for seq in (5, 3, 4, 2, 12, 9, 10, 11, 8, 7, 6, 13):   # out of order, all new
        assert len(a.handle_message(1.0, ctl(a, "probe", src=0, seq=seq, probe=seq))) == 1, seq
    for seq in (1, 5, 13, 2):                               # redelivered long after: never twice
        assert a.handle_message(2.0, ctl(a, "probe", src=0, seq=seq, probe=seq)) == [], seq
    a.handle_message(2.0, ctl(a, "probe", src=0, seq=200, probe=0))
    assert a.handle_message(2.0, ctl(a, "probe", src=0, seq=150, probe=0)) == []   # beyond the window
    assert a.stats["probes"] == 14


def test_birth_of_200_sources_is_split_into_parts_that_fit():
    names = ["source-with-a-long-name-%03d" % i for i in range(200)]
    a = Agent("d1", names, width=0.5)
    a.handle_sample(0.0, 7, 3.0)
    out = a.start(1.0)
    assert len(out) > 1
    got = []
    for ch, p in out:
        assert ch == "state" and len(p) <= codec.MAX_PAYLOAD
        k, m = codec.decode(p)
        assert k == "birth" and m["first"] == len(got)
        got += m["sources"]
    assert [s["name"] for s in got] == names and got[7]["v"] == 3.0
    assert a.token == (a.boot ^ codec.decode(out[0][1])[1]["seq"])


def test_bad_source_names_are_a_clear_error():
    for names in (["x" * 65], [""], [3]):
        try:
            Agent("d", names)
        except ValueError as e:
            assert "source names" in str(e)
        else:
            raise AssertionError("accepted %r" % (names,))
