"""Answers a user can trust, live (DESIGN.md §4; issue [final]): real CPython and MicroPython agents through
Mosquitto, every answer checked against the agents' ground truth logs.

* Agent clocks off by +20 ms and −50 ms (``edge.runtime.pump`` skew: the agent reads the host clock plus it,
  its ground truth stays on the host clock) under the live coordinator's defaults (σ = LIVE_SKEW): once
  every source has a bound nothing says "clock skew" or "offline" and nothing is revoked; each clock's
  measured bounds hold its offset; no answer misses the truth or is wider than its precision unflagged.
  (A report's instant is uncertain by the round trip to its device whatever its offset, a clock off by 0
  too: an answer during that is wider than the widths by the reading's overshoot, and says so until the
  query's reserve has learned it; the share is printed.)
* A hostile network between the coordinator and Mosquitto (``backend/live/netfault.py``: device messages
  lost, duplicated and reordered at the MQTT packet level, both ways) with the same skewed agents: no
  answer wrong unless degraded or withdrawn, none wider than its precision, every wrong provisional
  answer withdrawn within 5 s, losses resent in ack mode; every final answer contains the truth, is never wider
  than its precision unflagged and never withdrawn (a wrong one is dumped with the truth and uplinks around it, and
  the run pickled for an offline replay: ``QF_DUMP`` names the folder).
"""
import os
import pickle
import time

import pytest

from backend import host as hostmod
from backend.host import Host
from backend.live import checker
from backend.live.broker import Broker
from backend.live.coordinator import LiveCoordinator
from backend.live.fleet import Fleet, walk_source
from backend.live.netfault import Proxy
from backend.sim import truth as truth_mod
from backend.sim.withdrawal import provisional
import fleetcheck as fc

SKEWS = {"m0": 0.02, "c0": -0.05, "m1": -0.05, "c1": 0.02, "c2": 0.0}


class Via:
    """The broker as the coordinator sees it through the fault proxy."""

    def __init__(self, broker, proxy):
        self.fleet, self.host, self.port = broker.fleet, proxy.host, proxy.port


def run(tmp_path, seconds, faults=None):
    """The skewed fleet for ``seconds`` under the live defaults (``faults``: the proxy's ``lossy``); returns
    (answers, specs, truth rows, end, live coordinator, proxy stats)."""
    names = sorted(SKEWS)
    broker = Broker(str(tmp_path / "broker"), "t", names).start()
    proxy = Proxy((broker.host, broker.port)) if faults else None
    fleet = live = thread = None
    try:
        specs = [{"id": "total", "kind": "sum", "sources": ["s_" + n for n in names], "precision": 2.0 * len(names)},
                 {"id": "top", "kind": "max", "sources": ["s_m0", "s_c0"], "precision": 1.0}]
        host = Host(protocol="adaptive", period=fc.PERIOD, latency=hostmod.LIVE_LATENCY, skew=hostmod.LIVE_SKEW,
                    t0=time.time(), declared=[s for q in specs for s in q["sources"]])
        answers = []
        to = Via(broker, proxy) if proxy else broker
        live = LiveCoordinator(host, "t", to.host, to.port, broker.credentials("backend")[1], queries=specs,
                               answers=answers)
        live.calls = record_calls(live)
        thread = live.start_thread()
        fleet = Fleet(broker, str(tmp_path / "fleet"), width=2.0, keepalive=5)
        for i, n in enumerate(names):
            fleet.start("micropython" if n[0] == "m" else "cpython", n, walk_source("s_" + n, 50 + i, step=0.5),
                        skew=SKEWS[n])
        fc.wait(lambda: fc.all_online(live, names), 30, "every device's birth",
                lambda: fc.offline(live, fleet, broker, names))
        if proxy:
            proxy.lossy(**faults)
        time.sleep(seconds)
        if proxy:
            proxy.lossy()
        time.sleep(3.0)
        end = time.time() - 2 * live.coord.latency
        stats = fleet.stop_all()
        assert all(s is not None for s in stats.values()), stats
        assert live.coord.stats["bad_messages"] == 0 and live.stats["errors"] == 0
        return answers, specs, fleet.truth_rows(), end, live, dict(proxy.stats) if proxy else None
    finally:
        if fleet is not None:
            for d in fleet.devices.values():
                if d.proc.poll() is None:
                    d.proc.kill()
                    d.proc.wait()
        if live is not None:
            live.stop()
            thread.join(5)
        if proxy is not None:
            proxy.close()
        broker.stop()


def record_calls(live):
    """Every call the live coordinator makes into its host, in order (``(name, args)``): replayed through a new
    ``Host`` with the same settings, they give the same answers (what a wrong final needs to be diagnosed offline)."""
    calls, act = [], live._act

    def logged(call, *args):
        calls.append((call.__name__, args))
        act(call, *args)
    live._act = logged
    return calls


def dump_wrong_finals(wrong, specs, rows, answers, live, tmp_path, around=1.5):
    """Print each final answer that missed the truth with the truth, the uplinks of its sources' devices and the
    final answers around it; pickle the run (host settings, calls, truth) so it replays offline."""
    from edge.core.codec import decode
    path = os.path.join(os.environ.get("QF_DUMP", str(tmp_path)), "hostile-%d.pickle" % os.getpid())
    with open(path, "wb") as f:
        pickle.dump({"settings": live.host.settings, "declared": list(live.host.coord.declared),
                     "calls": live.calls, "rows": rows, "answers": answers, "specs": specs}, f)
    print("\nWRONG FINALS (the run is pickled in %s)" % path)
    for qid, bad in wrong.items():
        srcs = set(next(q for q in specs if q["id"] == qid)["sources"])
        for rec, tau, x, lo, hi in bad[:3]:
            print("FINAL %s %r misses truth %r at %.3f: [%r, %r]" % (qid, rec, x, tau, lo, hi))
            for r in rows:
                if abs(r[0] - tau) <= around and r[1] in srcs:
                    print("    truth  %.3f %s %r" % r)
            for name, args in live.calls:
                if name == "record" and args[2] in ("up", "state") and abs(args[0] - tau) <= 2 * around and \
                        "s_" + args[1] in srcs:
                    try:
                        m = decode(bytes(args[3]))
                    except ValueError as e:
                        m = e
                    print("    uplink at %.3f %s %r" % (args[0], args[1], m))
            for a in answers:
                if a["query"] == qid and a.get("final") and abs(a["time"] - tau) <= around:
                    print("    final  %r" % a)


def bounded_from(answers, qid):
    """The time of ``qid``'s first answer not degraded (start-up: every source born, reported and settled)."""
    return min(a["time"] for a in answers if a["query"] == qid and not a["degraded"])


def figures(answers, specs, rows, end):
    """Per query: the simulator's provisional figures (backend/sim/withdrawal.py) and precision misses."""
    out = {}
    rows = [r for r in rows if r[0] <= end]         # (the answers after ``end`` are not checked)
    checked = checker.violations(specs, rows, answers, end)
    for q in specs:
        mine = [a for a in answers if a["query"] == q["id"] and a["time"] <= end]
        pub = [(a["time"], a["lo"], a["hi"], a["degraded"]) for a in mine]
        revs = [(a["revoked"][0], a["revoked"][1], a["time"]) for a in mine if "revoked" in a]
        truth = truth_mod.Truth(sorted({r[1] for r in rows}))
        tl = _timeline(truth, q, rows)
        f = provisional(tl, pub, revs, end)
        misses = truth_mod.check(tl, truth_mod.revoke(pub, [r[:2] for r in revs]), q["precision"], end)[2]
        out[q["id"]] = dict(f, violations=checked[q["id"]][0], precision_misses=misses)
    return out


def _timeline(truth, q, rows):
    from backend.coordinator.core.queries import parse_query
    pq = parse_query(q, set(truth.index))
    truth.add_query(pq, float("-inf"))
    for t, s, v in sorted(rows, key=lambda r: r[0]):
        truth.update(truth.index[s], v)
        truth.flush(t)
    return truth.tracks[q["id"]].timeline


def test_clocks_off_by_tens_of_ms_degrade_nothing(mosquitto, tmp_path):
    answers, specs, rows, end, live, _ = run(tmp_path, 20.0)
    figs = figures(answers, specs, rows, end)
    print("\nskewed clocks: %s; offsets %s" % (
        {q: {k: f[k] for k in ("instants", "degraded_share", "withdrawn_share", "violations")} for q, f in figs.items()},
        {d: tuple(round(x * 1000, 1) for x in live.coord.integrity.offsets.bounds(d, time.time())) for d in SKEWS}))
    for q in specs:
        after = [a for a in answers if a["query"] == q["id"] and bounded_from(answers, q["id"]) < a["time"] <= end
                 and not a.get("final")]    # (the provisional stream: finals lag, and the fleet's stop ends them)
        bad = [a["reason"] for a in after if a["degraded"] and not a["reason"].startswith("wider than precision")]
        wide = sum(a["degraded"] for a in after) / len(after)
        print("%s: %.3f of the answers after start-up wider than δ while a report time was uncertain" % (q["id"], wide))
        # flagged, never called offline or skewed, and rare: the reserve (core/reserve.py) budgets the skew
        # (0.000 and 0.013 at a load of 6; 0.17-0.38 before the reserve learned from both answer streams)
        assert after and not bad and wide <= 0.15, (bad[:5], wide)
        assert not any("revoked" in a for a in answers if a["query"] == q["id"])
        assert figs[q["id"]]["violations"] == 0 and figs[q["id"]]["precision_misses"] == 0
    for d, skew in SKEWS.items():           # each clock's bounds hold its lead
        lo, hi = live.coord.integrity.offsets.bounds(d, time.time())
        assert lo - 0.005 <= skew <= hi + 0.005, (d, skew, lo, hi)


def test_a_hostile_network_between_coordinator_and_broker(mosquitto, tmp_path):
    faults = {"loss": 0.05, "duplicate": 0.05, "reorder": 0.2, "hold": 0.3, "seed": 3}
    answers, specs, rows, end, live, pstats = run(tmp_path, 40.0, faults)
    figs = figures(answers, specs, rows, end)
    finals, wrong = {}, {}
    checker.violations(specs, [r for r in rows if r[0] <= end], answers, end, finals=finals, wrong_finals=wrong)
    if wrong:
        dump_wrong_finals(wrong, specs, rows, answers, live, tmp_path)
    ig = live.coord.integrity
    print("\nhostile network %s: proxy %s; %s; finals %s; integrity %s" % (faults, pstats, figs, finals,
                                                                        dict(ig.stats, **ig.links.stats)))

    assert pstats["lost"] > 10 and pstats["reordered"] > 10 and pstats["duplicated"] > 5
    for q, f in finals.items():     # (issue #30: a board's ms clock placed a report up to 1 ms late; offsets.py)
        assert f["finals"] > 0 and not (f["final_violations"] or f["final_precision_misses"] or f["final_revoked"]), \
            (q, f, wrong.get(q, [])[:3])
    for q, f in figs.items():
        assert f["violations"] == 0 and f["precision_misses"] == 0, (q, f)
        assert f["withdraw_delay_max"] is None or f["withdraw_delay_max"] <= 5.0, (q, f)
        assert f["degraded_share"] + f["withdrawn_share"] <= 0.35, (q, f)
    assert ig.links.lossy is not None and ig.links.stats["acked"] > 0
    assert not any(a.get("reason", "").startswith("clock skew: ") or "; clock skew: " in a.get("reason", "")
                   for a in answers)          # (the alarm: a clock known less well than ±σ)
