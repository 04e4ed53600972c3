"""Sequence tracking with heartbeat marks, ack mode and the per-device watermark (integrity.py, heartbeat.py),
against a device's own uplink history: a mark takes no number, so a lost mark is never a gap; a mark shows
a lost last report; the watermark is the latest stamp with nothing missing before it; an ack covers what
is contiguous; a gap turns ack mode on and is then waited for a resend."""
import math
import random

from backend.coordinator.core.heartbeat import TRIES
from backend.coordinator.core.integrity import Integrity


def ig(latency=0.5, beat=None):
    return Integrity(latency, beat=beat, skew=0.0, net=latency)


def test_a_lost_mark_is_no_gap_and_a_mark_shows_a_lost_last_report():
    i = ig()
    assert i.accept(0.0, "d", 1, 1, 0.0, birth=True)
    assert i.accept(1.0, "d", 1, 2, 1.0)
    assert i.accept(9.0, "d", 1, 2, 9.0, mark=True)         # the mark before it was lost: nothing missing
    assert i.dev["d"]["missing"] == {} and i.watermark("d") == 9.0 and i.upto("d") == 2
    # report 3 is lost; the next mark repeats number 3: it is missing, and the watermark stays
    assert i.accept(20.0, "d", 1, 3, 20.0, mark=True)
    assert list(i.dev["d"]["missing"]) == [3] and i.watermark("d") == 9.0 and i.upto("d") == 2
    assert i.news["link"] == ["d"]                           # the first gap turns ack mode on
    assert i.accept(20.4, "d", 1, 3, 12.0)                  # resent, with its own stamp
    assert i.dev["d"]["missing"] == {} and i.watermark("d") == 20.0 and i.upto("d") == 3
    assert not i.accept(20.5, "d", 1, 3, 12.0)              # a duplicate


def test_the_watermark_is_the_latest_stamp_with_nothing_missing_before_it_on_every_prefix():
    for seed in range(30):
        rng = random.Random(seed)
        i = ig()
        i.accept(0.0, "d", 1, 1, 0.0, birth=True)
        got, heard = {1}, [(1, 0.0)]         # numbers received; (number, stamp) of what was heard (a mark: its number)
        seq, t = 1, 0.0
        for k in range(120):
            t += rng.uniform(0.1, 2.0)
            mark = rng.random() < 0.3
            if not mark:
                seq += 1
            if rng.random() < 0.15:
                continue                                     # lost
            i.accept(t + 0.1, "d", 1, seq, t, mark=mark)
            if not mark:
                got.add(seq)
            heard.append((seq, t))
            # oracle: the latest stamp of what was heard whose number and every one before it were received
            complete = [tt for s, tt in heard if all(n in got for n in range(1, s + 1))]
            assert i.watermark("d") == max(complete), (seed, k)


def test_a_gap_is_waited_for_longer_once_the_device_resends():
    i = ig(latency=0.5)
    i.accept(0.0, "d", 1, 1, 0.0, birth=True)
    i.accept(1.0, "d", 1, 3, 1.0)                           # 2 missing: ack mode from now, but 2 was not kept
    assert i.dev["d"]["missing"][2][0] == 1.0 + 0.5 and i.links.rto == 2 * 0.5 + 0.05
    i.accept(5.0, "d", 1, 4, 5.0)
    i.accept(10.0, "d", 1, 6, 10.0)                         # 5 missing, sent after 4: well after the link
    assert i.dev["d"]["missing"][5][0] == 10.0 + 0.5 + TRIES * i.links.rto
    new, ask, _ = i.due(1.6)
    assert [n[:2] for n in new] == [("d", "lost uplink")] and ask == ["d"]


def test_heartbeat_follows_the_uplink_rate_and_is_told_on_a_2x_move():
    i = ig(latency=0.2)
    assert i.links.first() == 32.0
    i.accept(0.0, "d", 1, 1, 0.0, birth=True)
    t, k, told = 0.0, 1, []
    for _ in range(38):                                     # it talks every second on a clean network:
        t, k = t + 1.0, k + 1                               # a shorter B is not worth a downlink
        i.accept(t, "d", 1, k, t)
        told += i.news["beat"]
        i.news["beat"] = []
    assert told == [] and i.links.told("d") == 32.0
    t, k = t + 1.0, k + 2                                   # a gap: the network loses, a loss is to be found sooner
    i.accept(t, "d", 1, k, t)
    assert i.news["beat"] == ["d"] and i.links.told("d") == 4.0     # 4 × 1 s, a power of 2, told once
    i.news["beat"] = []
    for _ in range(20):                                     # then it goes quiet: marks only
        t += i.links.told("d")
        i.accept(t, "d", 1, k, t, mark=True)
    assert i.links.told("d") > 4.0 and set(i.news["beat"]) == {"d"} and i.stats["silent"] == 0


def test_a_device_silent_past_its_heartbeat_is_found():
    i = ig(latency=0.5, beat=2.0)
    i.accept(0.0, "d", 1, 1, 0.0, birth=True)
    assert i.due(2.9) == ([], [], [])
    new, ask, _ = i.due(3.0 + 1e-9)
    assert new == [("d", "silent", 0.0)] and ask == ["d"]


def test_a_device_reporting_every_few_weeks_sends_fewer_marks_than_reports():
    # B = 4 x the mean interval between uplinks; a cap of a week made a device reporting every two weeks send
    # a mark every 6 days of its silences, more marks than reports; the cap is now 48.5 days
    from backend.coordinator.core.heartbeat import MOST, _pow2
    from backend.sim import engine
    from edge.core import codec
    codec.encode("config", {"seq": 1, "inc": 1, "to": 1, "period": 0, "shrink": 0.0, "beat": round(_pow2(1e12) * 1000),
                            "t0": 0, "now": 0, "tick": 0})
    assert _pow2(1e12) <= MOST
    w = {"name": "slow", "seed": 5, "duration": 3 * 365 * 86400, "protocol": "deadband",
         "sources": {"generator": "random_walk", "count": 2, "per_device": 1, "start": [90, 110], "step": [0.1, 2.0],
                     "interval": 86400},
         "queries": [{"id": "q", "kind": "avg", "sources": "all", "precision": 8.0}]}
    r = engine.run(w)
    assert r["violations"] == 0 and 0 < r["by_kind"]["mark"] < r["by_kind"]["report"], r["by_kind"]


def test_a_monthly_device_gets_the_longest_heartbeat():
    # 4 x 30 days is past the cap, which is exactly twice the power of 2 below it: 'more than twice' never
    # moved B there, so a monthly device stayed at 24 days and sent a mark before every reading
    from backend.coordinator.core.heartbeat import MOST, Heartbeats
    h = Heartbeats(None, 0.5, 0.5, 0.1)
    h.heard("d", 0.0, True)                     # its birth, then marks as B grows (a simulator run's times)
    for t in (32, 160, 672, 2720, 10912, 43680, 174752, 699040, 2796192):
        h.heard("d", float(t), False)
    for k in range(2, 40):                      # then a reading a month
        h.heard("d", k * 30 * 86400.0, True)
    assert h.told("d") == MOST


def _logged(w):
    """Run workload ``w``; with its result, each device's marks and the B its configs told, from the downlink log."""
    from backend.sim import engine
    from edge.core import codec
    sim = engine.Simulation(w)
    marks, told, send = {}, {}, sim.send

    def record(now, hop, end, payload, link=None):
        kind, m = codec.decode(payload)
        if kind == "mark":
            marks.setdefault(end, []).append(now)
        if kind in ("config", "setup"):
            told.setdefault(end, []).append((now, codec.beat_ms(m["beat"]) / 1000))
        return send(now, hop, end, payload, link)
    sim.send = record
    return sim, sim.run(), marks, told


def test_a_device_serving_lag_queries_alone_waits_up_to_its_lag_and_its_finals_hold():
    # monthly readings, a lag of 400 days: a device whose sources serve the lag query alone may stay silent
    # up to D (its finals are due no sooner; the config says it in whole seconds past 24.8 days), told at its
    # first mark; one a real-time query reads keeps B <= 48.5 days; when a real-time query comes to the first,
    # so does its B
    from backend.coordinator.core.heartbeat import MOST
    day = 86400.0
    w = {"seed": 3, "duration": 40 * 365 * day, "protocol": "deadband",
         "sources": {"generator": "random_walk", "count": 4, "per_device": 2, "start": [90, 110], "step": [0.1, 2.0],
                     "interval": 30 * day},
         "queries": [{"id": "lag", "kind": "avg", "sources": ["s0", "s1"], "precision": 8.0, "lag": 400 * day},
                     {"id": "now", "kind": "max", "sources": ["s2"], "precision": 4.0}],
         "events": [{"time": 30 * 365 * day, "add_query": {"id": "now2", "kind": "sum", "sources": ["s1"],
                                                            "precision": 4.0}}]}
    sim, r, marks, told = _logged(w)
    assert r["violations"] == 0
    lagged, live = told["d0"], told["d1"]
    d = 400 * day - sim.coord.latency
    before = [b for t, b in lagged if t < 30 * 365 * day]
    assert MOST < max(before) <= d and max(b for t, b in live) <= MOST
    # no ramp: its first mark (silent a whole B) takes it to D at once, where x4 per mark took 10 marks and configs
    assert len(before) == 2 and d / 2 < before[1] <= d and lagged[1][0] - marks["d0"][0] < 1.0
    assert lagged[-1][1] <= MOST and lagged[-1][0] >= 30 * 365 * day      # told a B within the cap again
    # d0 sends marks at most every B it was told (the ground truth of its own log), never every 48.5 days
    quiet = [t for t in marks.get("d0", ()) if t < 30 * 365 * day]
    assert len(quiet) < 30 * 365 * day / (2 * MOST)
    finals = [a for a in sim.answers if a.get("final") and a["query"] == "lag"]
    assert finals and finals[-1]["time"] > 30 * 365 * day


def test_a_device_no_query_reads_waits_for_ever_and_a_query_brings_its_b_down_at_once():
    # idle, its first mark takes B to the longest a config carries; a query's control acknowledged, B falls
    # within the cap and is waited at once: a device that says nothing more (dead, or its config lost) is
    # found silent within the new B, where waiting the old one until it surely had the config took 34 years
    from backend.coordinator.core.heartbeat import LONGEST, MOST
    def idle():
        i = ig(latency=0.5)
        i.capped("d", math.inf, 0.0)
        i.accept(0.0, "d", 1, 1, 0.0, birth=True)
        i.accept(32.0, "d", 1, 1, 32.0, mark=True)
        assert i.news["beat"] == ["d"] and i.links.told("d") == i.links.beat("d") == LONGEST
        i.news["beat"] = []
        assert i.capped("d", None, 1000.0) == LONGEST       # a lag-free query reads it now: waited at once
        assert i.links.beat("d") == MOST and i.due(1e6) == ([], [], [])
        return i
    i = idle()
    i.accept(1000.5, "d", 1, 2, 1000.5)                     # its reply to the query's control
    b = i.links.told("d")
    assert i.news["beat"] == ["d"] and b <= MOST and i.links.beat("d") == b
    assert i.due(1000.5 + b) == ([], [], [])
    new, ask, _ = i.due(1000.5 + b + 0.5 + i.margin + 1e-6)
    assert new == [("d", "silent", 1000.5)] and ask == ["d"]
    i = idle()                                              # gone before the query came: no reply ever
    assert i.due(1000.0 + MOST) == ([], [], [])
    new, ask, _ = i.due(1000.0 + MOST + 0.5 + i.margin + 1e-6)
    assert new == [("d", "silent", 32.0)] and ask == ["d"]


def test_devices_no_query_reads_stay_quiet_and_one_a_query_comes_to_is_watched_at_its_new_b():
    # 40 years of monthly readings, a real-time MAX over s0; s1 and s2 are read by no query and s3 only from
    # year 30: the idle devices' marks (the run's own log) are a handful in 40 years where the 48.5-day cap
    # made one every 48.5 days (~300 each); s3's answers never state a withdrawal bound past the cap's
    from backend.coordinator.core.heartbeat import MOST
    day, year = 86400.0, 365 * 86400.0
    w = {"seed": 4, "duration": 40 * year, "protocol": "deadband",
         "sources": {"generator": "random_walk", "count": 4, "per_device": 1, "start": [90, 110], "step": [0.1, 2.0],
                     "interval": 30 * day},
         "queries": [{"id": "now", "kind": "max", "sources": ["s0"], "precision": 4.0}],
         "events": [{"time": 30 * year, "add_query": {"id": "late", "kind": "sum", "sources": ["s3"], "precision": 4.0}}]}
    sim, r, marks, told = _logged(w)
    assert r["violations"] == 0
    assert len(marks.get("d1", ())) <= 3 and len(marks.get("d2", ())) <= 3, marks
    assert len(marks["d0"]) > 40 * year / (2 * MOST)                  # the queried one keeps its cap
    after = [(t, b) for t, b in told["d3"] if t >= 30 * year]
    assert after and after[0][0] - 30 * year < 1.0 and after[0][1] <= MOST     # told with its reply to the query
    bound = sim.coord.integrity.links.bound(MOST)
    late = [a for a in sim.answers if a["query"] == "late" and not a.get("final")]
    assert late and all(a["withdraw_within"] <= bound for a in late), [(a["time"], a["lo"], a["withdraw_within"]) for a in late if a["withdraw_within"] > bound]
