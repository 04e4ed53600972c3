"""The live coordinator's own state (backend/live/presence.py) and its ``--query`` specs against Mosquitto: online on
connect, the specs it was given published retained on their topics and registered once (their echo changes
nothing), offline ``stopped`` on a clean stop; a login the broker refuses stops the loop instead of retrying."""
import json
import time

from backend.host import Host
from backend.live import presence
from backend.live.coordinator import LiveCoordinator
from edge.core import topics
from helpers import client, close, connected, subscribe

FLEET = "t"


def _next(c, topic, seen, timeout=5.0):
    """The next payload on ``topic``; every message taken meanwhile is appended to ``seen``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            t, payload, retain = c.inbox.get(timeout=0.2)
        except Exception:
            continue
        seen.append((t, payload))
        if t == topic:
            return payload
    raise AssertionError("nothing on %s" % topic)


def test_online_specs_published_once_and_offline_when_stopped(broker):
    spec = {"id": "tot", "kind": "sum", "sources": ["a"], "precision": 2.0}
    host = Host(protocol="adaptive", latency=0.2)
    live = LiveCoordinator(host, FLEET, broker.host, broker.port, broker.credentials("backend")[1],
                           queries=[spec], announce=[spec], client_id="ops-c1")
    watcher = client(broker, "backend")
    assert connected(watcher)[0]
    subscribe(watcher, topics.backend(FLEET))
    subscribe(watcher, topics.query(FLEET, "tot", "spec"))
    subscribe(watcher, topics.query(FLEET, "tot", "answer"))
    thread, seen = live.start_thread(), []
    try:
        state = presence.parse(_next(watcher, topics.backend(FLEET), seen))
        assert state["state"] == "online" and state["driver"] == "coordinator" and state["protocol"] == "adaptive"
        assert state["client"] == "ops-c1" and "sum" in state["kinds"] and "range" not in state["kinds"]
        assert json.loads(_next(watcher, topics.query(FLEET, "tot", "spec"), seen)) == {k: v for k, v in spec.items()
                                                                                   if k != "id"}
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and host.records < 1:
            time.sleep(0.05)
        time.sleep(0.3)
        assert host.records >= 1 and host.stats["bad_specs"] == 0 and list(host.pending) == ["tot"]
        while not watcher.inbox.empty():
            seen.append(watcher.inbox.get()[:2])
        # what the answer topic got: one "waiting for sources" record, not one per delivery of the spec
        said = [json.loads(p)["error"] for t, p in seen if t == topics.query(FLEET, "tot", "answer")]
        assert said == ["waiting for sources a to be born"], said
        assert live.stats["errors"] == 0
    finally:
        live.stop()
        thread.join(10)
    state = presence.parse(_next(watcher, topics.backend(FLEET), seen))
    assert state["state"] == "offline" and state["reason"] == "stopped" and state["since"] > 1e9
    close(watcher)


def test_a_refused_login_stops_the_coordinator(broker):
    live = LiveCoordinator(Host(protocol="adaptive"), FLEET, broker.host, broker.port, "not-the-password")
    thread = live.start_thread()
    thread.join(10)
    assert not thread.is_alive() and live.refused and not live.linked
