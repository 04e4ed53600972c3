"""The hostile network of the simulator (issue #20): loss, duplicates, reordering, skew, reboots, partitions."""
import math
import random

import pytest

from backend.sim import engine
from backend.sim.network import Network
from backend.sim.workload import WorkloadError, load


def fleet(seed=3, protocol="deadband", **net):
    network = {"delay": 0.2, "jitter": 0.1}
    network.update(net)
    return {"name": "faults", "seed": seed, "duration": 200, "protocol": protocol,
            "sources": {"generator": "random_walk", "count": 8, "per_device": 2, "start": [90, 110],
                        "step": [0.1, 3.0], "interval": 1.0},
            "queries": [{"id": "q", "kind": "sum", "sources": "all", "precision": 6.0}],
            "network": network, "params": {"period": 10, "shrink": 0.05}}


def test_a_clean_network_counts_no_faults():
    res = engine.run(fleet())
    assert res["network"] == {"lost": 0, "duplicated": 0, "reordered": 0, "partitioned": 0, "reboots": 0}
    assert res["violations"] == 0


def test_faults_are_counted_and_seeded():
    w = fleet(loss=0.05, duplicate=0.05, reorder=0.2, skew=0.3, reboots=30, partitions=[[50, 80, ["d1"]]])
    a, b = engine.run(w), engine.run(w)
    assert a["network"] == b["network"] and a["messages"] == b["messages"]
    assert all(a["network"][k] > 0 for k in ("lost", "duplicated", "reordered", "partitioned", "reboots"))
    c = engine.run(dict(w, seed=4))
    assert c["network"] != a["network"]


def test_faults_apply_in_both_directions():
    net = Network({"up": {"delay": 0.1, "jitter": 0.0}, "down": {"delay": 0.1, "jitter": 0.0}},
                  1, faults={"loss": 0.5})
    got = {h: sum(len(net.arrivals(0.0, h, "d0", b"\x01\x01")) for _ in range(400)) for h in ("up", "down")}
    assert all(120 < n < 280 for n in got.values()), got


def test_a_partition_drops_everything_to_and_from_its_devices_only():
    net = Network({"up": {"delay": 0.1, "jitter": 0.0}, "down": {"delay": 0.1, "jitter": 0.0}},
                  1, faults={"partitions": [(10.0, 20.0, frozenset(["d0"]))]})
    assert net.arrivals(15.0, "up", "d0", b"\x01\x01") == [] and net.arrivals(15.0, "down", "d0", b"\x01\x01") == []
    assert net.arrivals(15.0, "up", "d1", b"\x01\x01") == [15.1]
    assert net.arrivals(20.0, "up", "d0", b"\x01\x01") == [20.1]
    assert net.counts["partitioned"] == 2


def test_reordering_lets_later_messages_overtake_and_duplicates_arrive_twice():
    net = Network({"up": {"delay": 1.0, "jitter": 0.5}}, 1, faults={"reorder": 0.3, "duplicate": 0.3})
    times = [net.arrivals(i * 0.1, "up", "d0", b"\x01\x01") for i in range(300)]
    firsts = [t[0] for t in times]
    assert any(b < a for a, b in zip(firsts, firsts[1:]))         # overtaken
    assert sum(len(t) == 2 for t in times) == net.counts["duplicated"] > 0


@pytest.mark.parametrize("protocol", ["deadband", "adaptive"])
def test_lost_duplicated_and_reordered_uplinks_are_flagged_never_silently_wrong(protocol):
    """Integrity (gaps, revoked answers, resync): 0 violations outside degraded windows, and the
    faults do show up as degraded time."""
    res = engine.run(fleet(protocol=protocol, loss=0.05, duplicate=0.05, reorder=0.2))
    assert res["network"]["lost"] > 0 and res["network"]["reordered"] > 0
    assert res["violations"] == 0
    assert res["queries"]["q"]["degraded_time"] > 0


@pytest.mark.parametrize("net, msg", [
    ({"loss": 1.0}, "network.loss"),
    ({"reorder": -0.1}, "network.reorder"),
    ({"partitions": [[5, 1, "all"]]}, "ends before it starts"),
    ({"partitions": [[1, 5, ["nope"]]]}, "unknown device 'nope'"),
    ({"partitions": [[1, 5]]}, "network.partitions[0]"),
    ({"skew": "x"}, "network.skew"),
    ({"lose": 0.1}, "lose"),
])
def test_bad_fault_settings_are_explained(net, msg):
    with pytest.raises(WorkloadError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        load(fleet(**net))


def test_forced_time_spans_a_lost_report_until_the_next_one_and_a_late_one_until_lambda_before_it():
    from backend.sim.forced import Forced
    from edge.core import codec
    rep = lambda src, seq, t: codec.encode("report", {"src": src, "epoch": 0, "seq": seq, "t": t, "v": 1.0, "why": 0})
    f = Forced(0.5, 100.0, {"d0": ["a", "b"]})
    f.uplink(10.0, "d0", rep(0, 1, 10.0), [])               # lost: a unknowable from 10
    f.uplink(12.0, "d0", rep(1, 2, 12.0), [12.1])           # b on time: nothing
    f.uplink(15.0, "d0", rep(0, 3, 15.0), [15.2])           # a again: known from 15
    f.uplink(20.0, "d0", rep(1, 4, 20.0), [23.0])           # b late: unknowable 20 .. 22.5
    f.uplink(30.0, "d0", codec.encode("mark", {"seq": 5, "t": 30.0}), [])   # a lost mark forces nothing
    assert f.time(["a"]) == 5.0 and f.time(["b"]) == 2.5 and f.time(["a", "b"]) == 7.5
    f.uplink(90.0, "d0", rep(1, 6, 90.0), [])               # lost and never followed: until the end
    assert f.time(["b"]) == 12.5


def test_a_birth_older_than_what_a_suspicion_waits_for_asks_again_instead_of_waiting_forever():
    from backend.coordinator.core.integrity import Integrity
    ig = Integrity(latency=0.5)
    ig.accept(0.0, "d", 1, 1, 0.0, birth=True)
    for now, seq, t in ((0.1, 2, 0.1), (0.3, 4, 0.3), (0.35, 6, 0.35)):    # 3 and 5 missing
        ig.accept(now, "d", 1, seq, t)
    ig.accept(0.4, "d", 1, 5, 0.34, birth=True)      # the birth, overtaken by 6: 3 is gone, 6 awaited
    assert ig.suspect.get("d") == "lost uplink" and not ig.resynced("d", 0.4, 5, 1)
    assert "d" in ig.due(1.0)[1]                     # asked for a newer birth (it used to wait forever)


def test_a_birth_of_the_old_boot_applied_after_a_reboot_was_heard_does_not_resync_the_device():
    # boot 2's birth came first (a report of boot 1 sent before the reboot may follow it, superseded): boot 1's
    # birth, released later at its earlier event time, must not clear the suspicion (numbers of two boots are not
    # comparable), and the final mirror's watermark waits at boot 1's latest uplink until boot 2's birth is taken
    from backend.coordinator.core.integrity import Integrity, REBOOTED
    ig = Integrity(latency=0.5)
    ig.accept(0.0, "d", 1, 663608980, 0.0, birth=True)
    ig.accept(0.3, "d", 2, 253476059, 0.2, birth=True)
    assert ig.suspect.get("d") == REBOOTED and ig.skipped["d"] == (2, 253476059)
    assert not ig.resynced("d", 0.1, 663608980, 1) and ig.suspect.get("d") == REBOOTED
    assert ig.resynced("d", 0.3, 253476059, 2) and "d" not in ig.suspect

def test_count_membership_holds_the_state_before_a_report_from_a_skewed_clock():
    # a report stamped by a clock within ±σ is applied at t − σ; until t − lo the source may still have
    # been inside: COUNT's membership must say "maybe" as the bound's hull does (it said "surely outside")
    from backend.coordinator.core.boundcache import BoundCache
    c = BoundCache()
    c.add("x", "d", 0, 2.0, 0, 100.0)
    e = c.set_filter("x", 2.0, [(95.0, 105.0)], keep_old=False)
    c.report("x", e, 1.0, 100.0)
    assert c.member("x", (95.0, 105.0)) == (1, 1)
    c.hold("x", 2.0)
    c.report("x", e, 1.5, 106.0)
    assert c.member("x", (95.0, 105.0)) == (0, 1) and c.known("x") == (99.0, 107.0)
    c.release("x", 2.5)
    assert c.member("x", (95.0, 105.0)) == (0, 0)


def test_a_periodic_shrink_leaves_the_state_before_a_skewed_report_unshrunk():
    # a device whose clock is 0.25 s behind reads 11.5 at 20.1 (its clock 19.85), outside [9, 11], and reports;
    # it shrinks at its clock's 20.0 (20.25), after that report. The backend (lead within ±0.3) places the report
    # at 19.55 and keeps the bound before it until 20.15; its tick at 20.0 keeps the bounds before the shrink until
    # 20.3. Until 20.1 the device still holds 9.2 (read before, inside its unshrunk [9, 11]): the mirror must
    # state it. Shrinking the state held from before the report too (to [9.5, 10.5]) stated [9.5, 12.5]
    from backend.coordinator.core.boundcache import BoundCache
    c = BoundCache()
    c.add("x", "d", 0, 2.0, 0, 10.0)
    c.now = 19.55
    c.hold("x", 20.15)
    c.report("x", 0, 19.55, 11.5)
    c.now = 20.0
    c.shrink(0.5, {"x": 20.3})
    assert c.known("x") == (9.0, 12.5)          # the device's states: [9, 11] until its report, then [10.5, 12.5]
    c.release("x", 20.15)
    assert c.known("x") == (10.5, 12.5)         # ... until it shrinks
    c.release("x", 20.3)
    assert c.known("x") == (11.0, 12.0)


def test_a_reboot_whose_birth_and_next_report_are_lost_is_never_read_as_the_old_boot():
    """Boot 2 of d1 (epoch 0 like boot 1, which never took a control) loses its birth and first report; its next
    report carries no boot. Its number lies far from boot 1's (edge.core.delivery: each boot numbers from its own
    start), so the backend drops it, says the device rebooted and asks for a birth; the final answers until that
    birth can have been sent are unknown, never the old boot's bound. Oracle: the device's readings."""
    from backend.host import Host
    from backend.sim.final_truth import check_final
    from edge.agent import Agent
    from edge.core import codec

    h = Host(protocol="deadband", period=5.0, shrink=0.0, latency=0.0, t0=0.0)
    truth, finals, provisional = [], [], []

    def deliver(now, agent, acts):
        """Host actions: answers kept, downlinks to ``agent`` (None: lost), its uplinks back to the host."""
        while acts:
            nxt = []
            for a in acts:
                if a[0] == "answer" and a[1].get("query") == "q" and "lo" in a[1]:
                    (finals if a[1].get("final") else provisional).append(a[1])
                elif a[0] == "down" and agent is not None:
                    for _, p in agent.handle_message(now, a[2]):
                        nxt += h.uplink(now, "d1", p)
            acts = nxt

    def read(now, agent, v, up=True):
        truth.append((now, v, abs(v)))
        out = agent.handle_sample(now, 0, v)
        for _, p in out:
            if up:
                deliver(now, agent, h.uplink(now, "d1", p))
        return out

    old = Agent("d1", ["x"], boot=1, width=2.0)
    read(0.0, old, 10.0, up=False)
    deliver(0.0, None, h.uplink(0.0, "d1", old.start(0.0)[0][1]))    # (controls to boot 1 lost: epoch 0)
    deliver(0.0, None, h.spec(0.0, "q", {"kind": "sum", "sources": ["x"], "precision": 40.0}))
    assert read(1.0, old, 13.0)                                  # a report of boot 1
    new = Agent("d1", ["x"], boot=2, width=2.0)                  # rebooted at 2.0: its birth lost
    read(2.0, new, 30.0, up=False)
    assert new.start(2.0) and read(3.0, new, 40.0, up=False)      # and its first report
    assert new.filters[0].epoch == old.filters[0].epoch == 0
    deliver(4.0, new, h.timer(4.0))
    reports = read(4.0, new, 45.0, up=False)
    seq = codec.decode(reports[0][1])[1]["seq"]
    before = new.delivery.seq
    deliver(4.0, new, h.uplink(4.0, "d1", reports[0][1]))        # dropped; a birth asked for and sent
    asked = new.delivery.seq - before      # (the birth asked for at once)
    for k in range(5, 12):
        read(float(k), new, 45.0 + 3 * k)
        deliver(float(k), new, h.timer(float(k)))
    assert any("rebooted: d1" in (a.get("reason") or "") for a in provisional)
    rows = [(a["time"], a["lo"], a["hi"], a.get("dlo", 0.0), a.get("dhi", 0.0), a["degraded"], 0) for a in finals]
    horizon = h.coord.finals.horizon("q")
    assert horizon is not None and horizon >= 6.0, horizon
    res = check_final(truth, rows, horizon, [(0.0, 40.0)])
    assert res["final_violations"] == 0 and res["final_precision_misses"] == 0, (res, rows)
    assert any(a["degraded"] and a["hi"] - a["lo"] == math.inf and a["time"] <= 3.0 for a in finals), rows
    assert any(not a["degraded"] and a["time"] >= 4.0 for a in finals), rows
    assert asked == 1 and 256 < (seq - old.delivery.seq) & 0xFFFFFFFF < 0xFFFFFF00     # (numbered far from boot 1)


def test_a_reboot_withdraws_only_what_the_old_boot_sent_after_its_latest_uplink_heard():
    """20 walks, 30 reboots per device-hour, no other fault and exact clocks: a reboot withdraws the answers over
    its device from that device's latest uplink heard before it (what the old boot sent after it may be lost),
    not from its previous birth: a boot's numbers start far from any other's, so what it was heard to send is its
    own. Withdrawing from the birth left the SUM over all 20 withdrawn or degraded at every instant (6 reboots per
    device-hour: 0.99 of them). Oracle: ground truth (no violation outside what is withdrawn or degraded) and the
    devices' own sends."""
    from backend.bench import faults
    from backend.sim import engine

    w = dict(faults.FINAL, seed=5001, duration=200, name="r", protocol="deadband",
             network=dict(faults.FINAL["network"], reboots=30.0))
    sim = engine.simulation(w)
    sent, boots, reboot = {}, [], sim.handlers[engine.REBOOT]

    def watch(now, end, payload, arrivals):
        sent.setdefault(end, []).append(now)

    def rebooted(t, dev):
        boots.append((t, dev, max([s for s in sent.get(dev, ()) if s <= t], default=None)))
        return reboot(t, dev)
    sim.watch, sim.handlers[engine.REBOOT] = watch, rebooted
    res = sim.run()
    assert res["violations"] == 0 and len(boots) > 20
    checked = wider = 0
    for a in sim.answers:
        why = a.get("reason") or ""
        if "revoked" not in a or why.count("rebooted: ") != 1:
            continue
        dev = why.split("rebooted: ")[1].split(";")[0]
        if "," in dev:
            continue
        t, _, last = min(b for b in boots if b[1] == dev and b[0] >= a["revoked"][0])   # the reboot it is for
        assert abs(a["revoked"][0] - last) < 1e-9, (a, last)    # from the old boot's latest uplink, not before
        births = [0.0] + [b[0] for b in boots if b[1] == dev and b[0] < t]
        wider += last > max(births) + 1.0         # (withdrawn from its previous birth: at least 1 s more)
        checked += 1
    assert checked > 10 and wider > 10
    assert res["faults"]["degraded_or_withdrawn"] < 0.6
