"""The dashboard's sans-IO state model (backend/ui/state.py): fed broker messages, asserted through /api/state."""
import json
import time

from backend.ui.state import HISTORY, MAX_LIMIT, DashboardState
from edge.agent import Agent
from edge.core import codec

F = "t"
T0 = 1_800_000_000.0


def birth(dev, sources, t=T0, first=0, caps=0, boot=1):
    return codec.encode("birth", {"seq": 1, "t": t, "boot": boot, "fw": "qf-test", "caps": caps, "first": first,
                                  "sources": [{"name": s, "epoch": 0, "width": 1.0, "v": 0.0} for s in sources]})


def gone(boot=1):
    return codec.encode("gone", {"boot": boot})


def report(src, kind="report"):
    f = {"src": src, "epoch": 0, "seq": 1, "t": T0, "v": 1.0, "why": 0}
    if kind == "line":
        f.update(slope=0.5, gap=1.5)
    return codec.encode(kind, f)


def answer(qid, t, lo, hi, **kw):
    return json.dumps(dict({"query": qid, "time": t, "lo": lo, "hi": hi, "degraded": False, "guarantee": "interval",
                            "final": False}, **kw)).encode()


def test_births_wills_and_counts():
    s = DashboardState(F)
    s.message(T0, "qf/t/d/A/state", birth("A", ["a0", "a1"]))
    s.message(T0, "qf/t/d/B/state", birth("B", ["b0"]))
    st = s.state(T0 + 1)
    assert st["device_counts"] == {"total": 2, "online": 2, "offline": 0, "version": 2}
    assert [d["id"] for d in st["devices"]] == ["A", "B"]
    a = st["devices"][0]
    assert a["online"] is True and a["sources"] == ["a0", "a1"] and a["last_seen"] == T0 and a["births"] == 1
    s.message(T0 + 2, "qf/t/d/A/state", gone())             # its Last Will
    st = s.state(T0 + 3)
    assert st["device_counts"]["online"] == 1 and st["device_counts"]["offline"] == 1
    assert st["devices"][0]["online"] is False and st["devices"][0]["last_seen"] == T0 + 2
    s.message(T0 + 4, "qf/t/d/A/state", birth("A", ["a0", "a1"]))   # back
    assert s.device_counts()["online"] == 2 and s.devices["A"].births == 2


def test_birth_in_parts_and_retained_times():
    s = DashboardState(F)
    s.message(T0, "qf/t/d/G/state", birth("G", ["s0", "s1"]))
    s.message(T0, "qf/t/d/G/state", birth("G", ["s2"], first=2))
    assert s.devices["G"].sources == ["s0", "s1", "s2"] and s.devices["G"].births == 1
    # a retained birth was sent before we subscribed: its own time if plausible (a board's is in ms)
    s.message(T0 + 100, "qf/t/d/R/state", birth("R", ["r"], t=T0 + 50), retained=True)
    s.message(T0 + 100, "qf/t/d/M/state", birth("M", ["m"], t=int((T0 + 40) * 1000), caps=codec.CAP_MS), retained=True)
    s.message(T0 + 100, "qf/t/d/X/state", birth("X", ["x"], t=12.5), retained=True)   # a board's uptime
    assert s.devices["R"].last_seen == T0 + 50 and s.devices["M"].last_seen == T0 + 40
    assert s.devices["X"].last_seen is None and s.devices["X"].online is True


def test_uplinks_count_and_tell_the_model():
    s = DashboardState(F)
    s.message(T0, "qf/t/d/A/state", birth("A", ["a0", "a1"]))
    s.message(T0 + 1, "qf/t/d/A/up", report(0))
    assert s.devices["A"].row()["model"] == "constant"
    s.message(T0 + 2, "qf/t/d/A/up", report(1, "line"))
    s.message(T0 + 3, "qf/t/d/A/up", codec.encode("mark", {"seq": 3, "t": T0}))
    row = s.devices_page()["items"][0]
    assert row["model"] == "constant+linear" and row["messages"] == 3 and row["last_seen"] == T0 + 3
    segs = codec.encode("segs", {"seq": 4, "t": T0, "segs": [
        {"src": 0, "epoch": 0, "a": T0, "e": T0 + 1, "v": 1.0, "s": 0.0, "w": 1.0, "f": 1},
        {"src": 1, "epoch": 0, "a": T0, "e": T0 + 1, "v": 1.0, "s": 0.0, "w": 1.0, "f": 1}]})
    s.message(T0 + 4, "qf/t/d/A/up", segs)
    assert s.devices["A"].row()["model"] == "segment"
    s.message(T0 + 4, "qf/t/d/A/up", report(0, "report"))
    assert s.devices["A"].row()["model"] == "constant+segment"
    s.message(T0 + 4, "qf/t/d/A/up", codec.encode("rsegs", {"src": 0, "epoch": 0, "seq": 5, "t": T0, "v": 1.0,
                                                             "why": 0, "segs": []}))      # a segment source's report
    assert s.devices["A"].row()["model"] == "segment" and s.devices["A"].messages == 6
    s.message(T0 + 5, "qf/t/d/A/up", b"\x09\x01junk")
    s.message(T0 + 5, "qf/t/d/A/ctl", b"whatever")
    t = s.state(T0 + 6)["totals"]
    assert t["uplink"] == 7 and t["downlink"] == 1 and t["bad"] == 1
    assert t["samples"] is None and t["deadband"] is None and t["saved_vs_samples"] is None
    s.message(T0 + 6, "qf/other/d/A/up", report(0))          # another fleet: not ours
    assert s.counts["up"] == 7


def test_answers_specs_history_and_errors():
    spec = {"id": "tot", "kind": "sum", "sources": ["a0", "b0"], "precision": 4.0}
    s = DashboardState(F, specs=[spec])
    s.message(T0, "qf/t/q/tot/answer", answer("tot", T0, 10.0, 13.5))
    s.message(T0 + 1, "qf/t/q/tot/answer", answer("tot", T0 + 1, 11.0, 14.0))
    s.message(T0 + 1.5, "qf/t/q/tot/answer", answer("tot", T0 + 1, 11.0, 14.0))   # the same again: no change
    s.message(T0 + 2, "qf/t/q/tot/answer", answer("tot", T0 + 2, "-inf", 14.0, degraded=True, guarantee="degraded",
                                                   reason="offline: a0"))
    s.message(T0 + 2, "qf/t/q/avg/spec", json.dumps({"kind": "avg", "sources": "all", "precision": 0.5}).encode())
    s.message(T0 + 3, "qf/t/q/avg/answer", answer("avg", T0 + 2.5, 1.0, 1.5, final=True))
    s.message(T0 + 3, "qf/t/q/bad/answer", json.dumps({"query": "bad", "error": "unknown kind median",
                                                       "time": T0 + 3}).encode())
    st = s.state(T0 + 4, since={})
    q = {r["id"]: r for r in st["queries"]}
    assert list(q) == ["avg", "bad", "tot"]
    tot = q["tot"]
    assert (tot["kind"], tot["precision"], tot["sources"]) == ("sum", 4.0, 2)
    assert tot["lo"] == "-inf" and tot["hi"] == 14.0 and tot["degraded"] is True and tot["reason"] == "offline: a0"
    assert tot["guarantee"] == "degraded" and tot["final"] is False and tot["time"] == T0 + 2
    assert tot["history"] == [[T0, 10.0, 13.5, False, False], [T0 + 1, 11.0, 14.0, False, False],
                              [T0 + 2, None, 14.0, False, True]]
    assert q["avg"]["final"] is True and q["avg"]["sources"] == "all" and q["avg"]["history"][0][3] is True
    assert q["bad"]["error"] == "unknown kind median" and q["bad"]["history"] == []
    json.dumps(st, allow_nan=False)                          # strict JSON
    s.message(T0 + 5, "qf/t/q/tot/answer", b"")               # retracted
    assert [r["id"] for r in s.state(T0 + 5)["queries"]] == ["avg", "bad"]


def test_history_is_bounded_and_sent_past_a_cursor():
    s = DashboardState(F, history=10)
    for i in range(4):
        s.message(T0 + i, "qf/t/q/q/answer", answer("q", T0 + i, i, i + 1))
    row = s.query_rows({})[0]
    assert len(row["history"]) == 4 and row["cursor"] == 4 and row["reset"] is True
    s.message(T0 + 4, "qf/t/q/q/answer", answer("q", T0 + 4, 4, 5))
    row = s.query_rows({"q": 4})[0]
    assert row["history"] == [[T0 + 4, 4.0, 5.0, False, False]] and row["reset"] is False
    assert s.query_rows({"q": 5})[0]["history"] == []
    for i in range(5, 30):
        s.message(T0 + i, "qf/t/q/q/answer", answer("q", T0 + i, i, i + 1))
    row = s.query_rows({"q": 5})[0]                            # fell behind: the whole bounded history again
    assert row["reset"] is True and len(row["history"]) == 10 and row["history"][-1][0] == T0 + 29
    assert s.query_rows(None)[0].get("history") is None and HISTORY >= 100


def test_paging_and_search():
    s = DashboardState(F)
    for i in reversed(range(120)):                            # born out of order: pages are in id order
        s.message(T0, "qf/t/d/dev%03d/state" % i, birth("dev%03d" % i, ["temp%d" % i, "hum%d" % i]))
    for i in range(0, 120, 3):
        s.message(T0 + 1, "qf/t/d/dev%03d/state" % i, gone())
    p = s.devices_page(offset=100, limit=50)
    assert p["total"] == 120 and p["matched"] == 120 and [d["id"] for d in p["items"]] == ["dev%03d" % i for i in range(100, 120)]
    p = s.devices_page(q="DEV01")
    assert [d["id"] for d in p["items"]] == ["dev%03d" % i for i in range(10, 20)]
    assert [d["id"] for d in s.devices_page(q="hum77")["items"]] == ["dev077"]       # a source name matches too
    off = s.devices_page(status="offline", limit=5)
    assert off["matched"] == 40 and [d["id"] for d in off["items"]] == ["dev000", "dev003", "dev006", "dev009", "dev012"]
    assert s.devices_page(status="online", q="dev00")["matched"] == 6
    s.message(T0 + 2, "qf/t/d/dev003/state", birth("dev003", ["temp3"]))         # the cached search follows
    assert s.devices_page(status="offline")["matched"] == 39
    assert s.devices_page(limit=10 ** 6)["limit"] == MAX_LIMIT
    assert s.devices_page(offset=500)["items"] == []


def test_totals_from_a_provider():
    s = DashboardState(F)
    s.message(T0, "qf/t/d/A/up", report(0))
    t = s.totals({"samples": 1000, "deadband": 40, "ours": 30, "window": "w", "driver": "demo", "extra": {"x": 1}})
    assert t["saved_vs_samples"] == 0.97 and t["vs_deadband"] == 0.75 and t["extra"] == {"x": 1}
    t = s.totals({"samples": 100})
    assert t["ours"] == 1 and t["saved_vs_samples"] == 0.99


def test_a_real_agents_messages():
    """What edge/agent.py sends: a birth, reports, a Last Will."""
    s = DashboardState(F)
    now = time.time()
    a = Agent("A", ["x", "y"], boot=5, width=1.0)
    a.handle_sample(now, 0, 1.0)
    a.handle_sample(now, 1, 2.0)
    for ch, payload in a.start(now):
        s.message(now, "qf/t/d/A/%s" % ch, payload)
    s.message(now + 1, "qf/t/d/A/state", a.will())
    d = s.devices_page()["items"][0]
    assert d["sources"] == ["x", "y"] and d["online"] is False and d["fw"]


def test_answers_are_stale_while_the_backends_state_says_offline():
    """The backend's state topic (backend/live/presence.py): online, then its Last Will, then online again."""
    from backend.live import presence
    from edge.core import topics
    s = DashboardState(F)
    s.message(T0, "qf/t/q/tot/answer", answer("tot", T0, 10.0, 13.5))
    s.message(T0, "qf/t/q/new/spec", json.dumps({"kind": "sum", "sources": ["a0"], "precision": 1}).encode())
    assert s.state(T0)["backend"] is None and {r["id"]: r["stale"] for r in s.state(T0)["queries"]} == \
        {"new": None, "tot": None}                      # no state at all: nothing to say (an older backend)
    assert topics.parse(topics.backend(F)) == (F, "backend", None, "state")
    s.message(T0 + 1, topics.backend(F), presence.online("coordinator", "adaptive", ["sum", "avg"], T0 + 1, "c1"))
    st = s.state(T0 + 1)
    assert st["backend"] == {"state": "online", "driver": "coordinator", "protocol": "adaptive", "kinds": ["avg", "sum"],
                             "since": T0 + 1, "client": "c1", "received": T0 + 1}
    assert [r["stale"] for r in st["queries"]] == [None, None]
    s.message(T0 + 2, topics.backend(F), presence.offline("coordinator", "connection lost", client="c1"))
    q = {r["id"]: r for r in s.state(T0 + 2)["queries"]}
    assert q["tot"]["stale"] == "backend offline (connection lost)" and q["tot"]["degraded"] is False
    assert q["new"]["stale"] is None                    # no answer to be stale
    s.message(T0 + 3, topics.backend(F), presence.online("coordinator", "adaptive", ["sum"], T0 + 3))
    assert all(r["stale"] is None for r in s.state(T0 + 3)["queries"])
    s.message(T0 + 4, topics.backend(F), b"not json")   # garbage: counted, the state forgotten
    assert s.state(T0 + 4)["backend"] is None and s.counts["bad"] == 1
    s.message(T0 + 5, "qf/other/backend/state", presence.offline("spark", "stopped"))     # another fleet's
    assert s.state(T0 + 5)["backend"] is None
