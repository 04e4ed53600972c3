"""Live faults that can show a stale window (DESIGN.md §3, §5): real agent processes keep sampling and
logging their ground truth through every fault, and every answer is checked against those logs with
the demo's checker. A non-degraded answer must contain the truth; the time answers spend degraded is
printed next to the time the fault lasted.

* a network cut between the agents and Mosquitto (``backend/live/netfault.py`` proxy: bytes dropped both
  ways, connections left open) longer than the keepalive and λ, caught by the heartbeat watchdog;
* Mosquitto SIGKILLed (no clean save) and restarted on the same port: nothing it acknowledged is lost;
* an agent killed right after the backend sent it a width change, restarted: the control answers a
  birth that no longer exists, so the device drops it, and the backend resynchronises it.
"""
import collections
import json
import os
import threading
import time

import pytest

from backend.live.broker import Broker
from backend.live.fleet import Fleet, walk_source
from backend.host import Host
from backend.live.coordinator import LiveCoordinator
from backend.live.netfault import Proxy
from edge.core import codec, topics
import fleetcheck as fc
from helpers import client, close, connected, subscribe

BEAT = 1.0              # device heartbeat B (s)
LATENCY = 2.0           # λ >= B + 2m with a margin m = 0.5 s for delay and scheduling under load
KEEPALIVE = 2           # MQTT keepalive of the agents (s): the broker gives up after 3 s


class Via:
    """The broker as a client sees it through the fault proxy."""

    def __init__(self, broker, proxy):
        self.broker, self.fleet, self.host, self.port = broker, broker.fleet, proxy.host, proxy.port
        self.device_port = proxy.port

    def credentials(self, device):
        return self.broker.credentials(device)


@pytest.fixture
def env(mosquitto, tmp_path):
    made = {}

    def make(nm, nc, proxy=False, step=0.5, beat=BEAT, latency=LATENCY):
        """A broker, a live coordinator and ``nm`` MicroPython + ``nc`` CPython agents; ``proxy``: the
        agents (``"agents"``) or the coordinator (``"backend"``) reach the broker through a fault proxy."""
        names = Fleet.names(nm, nc)
        broker = made["broker"] = Broker(str(tmp_path / "broker"), "t", [n for _, n in names]).start()
        if proxy:
            made["proxy"] = Proxy((broker.host, broker.device_port if proxy == "agents" else broker.port))
        specs = fc.queries(["s_" + n for _, n in names])
        host = Host(protocol="deadband", period=fc.PERIOD, shrink=0.0, latency=latency, beat=beat, t0=time.time(),
                    declared=[s for q in specs for s in q["sources"]])
        answers = []
        via = Via(broker, made["proxy"]) if proxy else broker
        to = via if proxy == "backend" else broker
        live = made["live"] = LiveCoordinator(host, "t", to.host, to.port, broker.credentials("backend")[1],
                                              queries=specs, answers=answers)
        obs = made["obs"] = client(broker, "backend", client_id="observer", clean_session=False)
        assert connected(obs)[0]
        subscribe(obs, topics.device("t", "+", "up"))
        made["thread"] = live.start_thread()
        fleet = made["fleet"] = Fleet(via if proxy == "agents" else broker, str(tmp_path / "fleet"), width=4.0,
                                      keepalive=KEEPALIVE)
        fleet.start_all(nm, nc, seed=11, step=step)
        fc.wait(lambda: fc.all_online(live, [n for _, n in names]), 30, "every device's birth",
                lambda: fc.offline(live, fleet, broker, [n for _, n in names]))
        return broker, live, answers, specs, fleet, obs, made.get("proxy")

    yield make
    if "fleet" in made:
        for d in made["fleet"].devices.values():
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()
    if "live" in made:
        made["live"].stop()
        made["thread"].join(5)
    if "obs" in made:
        close(made["obs"])
    if "proxy" in made:
        made["proxy"].close()
    if "broker" in made:
        made["broker"].stop()


def _recovered_after(live, answers, names, t):
    return fc.all_online(live, names) and any(not a["degraded"] for a in list(answers) if a["time"] >= t)


def _logs(fleet):
    out = {}
    for name in fleet.devices:
        path = os.path.join(fleet.folder, "%s.log" % name)
        if os.path.exists(path):
            out[name] = open(path).read()[-600:]
    return out


def _finish(live, answers, specs, fleet, settle=3.0):
    """Run ``settle`` more seconds, stop the agents; returns (checked, end, rows, stats)."""
    time.sleep(settle)
    end = time.time() - 2 * live.coord.latency  # answers up to here are final
    stats = fleet.stop_all()
    assert all(s is not None for n, s in stats.items()), {n: fleet.devices[n].output for n, s in stats.items()}
    assert live.coord.stats["bad_messages"] == 0 and live.stats["errors"] == 0
    rows = fleet.truth_rows()
    return fc.violations(rows, answers, specs, end), end, rows, stats


def _share(answers, checked, end, fault, recovered):
    """A line: per query the degraded seconds and share of the checked span, next to the share of the
    fault itself and of the fault until every device was back."""
    start = min(a["time"] for a in answers)
    span = end - start
    return "fault %.2fs (share %.3f), until recovered %.2fs (%.3f); degraded %s of %.1fs" % (
        fault, fault / span, recovered, recovered / span,
        ", ".join("%s %.2fs (%.3f)" % (q, dt, dt / span) for q, (v, dt, n) in sorted(checked.items())), span)


def test_network_cut_while_agents_keep_sampling(env):
    broker, live, answers, specs, fleet, obs, proxy = env(2, 2, proxy="agents", step=1.5)   # sources leave bounds
    names = list(fleet.devices)
    t_begin = time.monotonic()
    time.sleep(4.0)
    cut = time.time()
    proxy.cut()
    # longer than the keepalive (the broker drops the agents after 1.5 keepalives) and than λ
    fc.wait(lambda: any(a["degraded"] for a in list(answers) if a["time"] >= cut - LATENCY), 15,
          "degraded answers during the cut")
    time.sleep(max(0.0, cut + 3 * KEEPALIVE + LATENCY - time.time()))
    proxy.heal()
    healed = time.time()
    fc.wait(lambda: _recovered_after(live, answers, names, healed), 40, "every agent back after the cut",
          lambda: (live.coord.devices, answers[-4:], proxy.stats, _logs(fleet)))
    recovered = time.time()
    checked, end, rows, stats = _finish(live, answers, specs, fleet)
    print("\nnetwork cut: %s; violations %s; watchdog %d; %.1fs" % (
        _share(answers, checked, end, healed - cut, recovered - cut), {q: c[0] for q, c in checked.items()},
        live.coord.integrity.stats["silent"], time.monotonic() - t_begin))
    assert proxy.stats["dropped"] > 0 and live.coord.integrity.stats["silent"] >= 1
    for qid, (v, dt, n) in checked.items():
        assert v == 0 and dt >= 0.5 * (healed - cut), (qid, checked)
    # the oracle can fail: the stale bounds kept through the cut, not flagged, miss the truth
    assert sum(v for v, _, _ in fc.violations(rows, _stale(answers), specs, end).values()) > 0


def _stale(answers):
    """The answers with every degraded one replaced by the query's last certain bounds, unflagged."""
    last, out = {}, []
    for a in (a for a in answers if not a.get("final")):     # (provisional ones: those the checker revokes)
        if not a["degraded"]:
            last[a["query"]] = a
        out.append(dict(last.get(a["query"], a), time=a["time"], degraded=False))
    return out


def _uplinks(c):
    """{device: {seq: (kind, device time in s)}} of the numbered uplinks and births an observer saw (births
    first: they say whether a device counts in integer ms), and {device: [device time of each mark seen]}."""
    msgs, ms = [], {}
    while not c.inbox.empty():
        topic, payload, retained = c.inbox.get()
        try:
            kind, m = codec.decode(payload)
        except codec.CodecError:
            continue
        if "seq" in m and not retained:
            msgs.append((topic.split("/")[3], kind, m))
            if kind == "birth":
                ms[msgs[-1][0]] = bool(m["caps"] & codec.CAP_MS)
    seen, marks = collections.defaultdict(dict), collections.defaultdict(list)
    for device, kind, m in msgs:
        t = m["t"] / 1000 if ms[device] else m["t"]
        if kind == "mark":          # a heartbeat mark repeats the latest number used: it takes none
            marks[device].append(t)
        else:
            seen[device][m["seq"]] = (kind, t)
    return seen, marks


def test_broker_sigkill_loses_no_acknowledged_report(env):
    """Mosquitto saves after every change (backend/live/broker.py), but in its main loop, after the PUBACKs
    of that loop went out: only what it acknowledged in its last loop before a SIGKILL can be lost, and
    the coordinator's link loss covers that instant (gone from λ before it) until every device's new
    birth. An observer with a persistent session is away for the last seconds before the kill, so what
    it later receives came from the broker's saved queue."""
    broker, live, answers, specs, fleet, obs, _ = env(2, 2)
    subscribe(obs, topics.device("t", "+", "state"))
    names = list(fleet.devices)
    t_begin = time.monotonic()
    time.sleep(2.0)
    close(obs)                  # its session (subscriptions, queued QoS 1 messages) stays in the broker
    away = time.time()
    time.sleep(4.0)
    killed = time.time()
    broker.proc.kill()          # SIGKILL: no clean save
    broker.proc.wait()
    broker.start()              # same directory, same port
    back = time.time()
    obs = client(broker, "backend", client_id="observer", clean_session=False)
    assert connected(obs)[0]
    fc.wait(lambda: _recovered_after(live, answers, names, back), 40, "every agent back after the broker restart",
          lambda: (live.coord.devices, answers[-2:], _logs(fleet)))
    recovered = time.time()
    checked, end, rows, stats = _finish(live, answers, specs, fleet)
    time.sleep(0.5)
    seen, marks = _uplinks(obs)
    close(obs)
    lost = {}
    for name in names:          # a gap in a device's sequence numbers (uplinks and births) is a lost message
        seqs = seen[name]
        assert stats[name]["outbox_dropped"] == 0 and len(seqs) + len(marks[name]) > 5, (name, stats[name], seqs)
        lost[name] = [(s, seqs[max(k for k in seqs if k < s)]) for s in range(min(seqs), max(seqs)) if s not in seqs]
    print("\nbroker SIGKILL: %s; violations %s; lost %s; %.1fs" % (
        _share(answers, checked, end, back - killed, recovered - killed), {q: c[0] for q, c in checked.items()},
        {n: len(v) for n, v in lost.items()}, time.monotonic() - t_begin))
    queued = sum(1 for seqs in seen.values() for _, t in seqs.values() if away + 0.5 < t < killed - 0.5) \
        + sum(1 for ts in marks.values() for t in ts if away + 0.5 < t < killed - 0.5)
    assert queued >= 2 * len(names)     # held only in the broker's saved queue when it was killed (B = 1 s)
    for name, gaps in lost.items():     # nothing acknowledged before the broker's last loop is lost
        assert all(t >= killed - 0.5 for _, (_, t) in gaps), (name, gaps, killed)
    for qid, (v, dt, n) in checked.items():
        assert v == 0 and dt > 0, (qid, checked)


def test_agent_reboot_with_a_control_in_flight(env):
    """The coordinator's link is held (proxy delay) from the moment it sends m0 a width change; m0 is
    SIGKILLed and restarted (a new boot) before the held control reaches the broker. The control answers
    the old birth: the new m0 drops it (birth token ``to``), and the coordinator, on the new birth,
    resynchronises m0 from its own state and re-sends the width it wants under a newer epoch."""
    broker, live, answers, specs, fleet, obs, proxy = env(2, 1, proxy="backend", beat=0.0, latency=3.0)
    subscribe(obs, topics.device("t", "m0", "state"))
    t_begin = time.monotonic()
    time.sleep(2.0)
    sent, wanted = threading.Event(), []
    plain = live.sink.down

    def down(device, payload):
        if device == "m0" and not sent.is_set() and codec.decode(payload)[0] == "width":
            proxy.delay(60)             # held from here on, this control first
            wanted.append(codec.decode(payload)[1]["width"])
            sent.set()
        plain(device, payload)

    live.sink.down = down               # runs in the coordinator's thread
    old = live.coord.devices["m0"]["boot"]
    mean = dict(specs[1], precision=specs[1]["precision"] / 2)      # narrower: new widths for m0 and m1
    obs.publish(topics.query("t", "mean", "spec"), json.dumps(mean), qos=1, retain=True)
    fc.wait(sent.is_set, 10, "a width change to m0")
    killed = time.time()
    fleet.devices["m0"].proc.kill()
    fleet.devices["m0"].proc.wait()
    fleet.start("micropython", "m0", walk_source("s_m0", 11000, step=0.5, period=fleet.period))
    fc.wait(lambda: _born(obs, "m0", old), 20, "m0's new birth at the broker")
    proxy.delay(0)                      # the stale control goes out now, after the new birth
    back = time.time()
    fc.wait(lambda: _recovered_after(live, answers, list(fleet.devices), back), 30, "m0 resynchronised")
    recovered = time.time()
    checked, end, rows, stats = _finish(live, answers, specs, fleet)
    print("\nagent reboot with a control in flight: %s; violations %s; m0 dropped %d stale; %.1fs" % (
        _share(answers, checked, end, back - killed, recovered - killed), {q: c[0] for q, c in checked.items()},
        stats["m0"]["stale"], time.monotonic() - t_begin))
    assert stats["m0"]["stale"] >= 1 and live.coord.devices["m0"]["boot"] != old
    for qid, (v, dt, n) in checked.items():
        assert v == 0 and dt > 0, (qid, checked)
    assert live.coord.cache.sources["s_m0"].filt.width == wanted[0]     # re-sent after the new birth


def _born(c, device, old):
    """Whether ``c`` saw a fresh (not retained) birth of ``device`` with a boot other than ``old``."""
    while not c.inbox.empty():
        topic, payload, retained = c.inbox.get()
        if topic == topics.device("t", device, "state") and not retained:
            kind, m = codec.decode(payload)
            if kind == "birth" and m["boot"] != old:
                return True
    return False
