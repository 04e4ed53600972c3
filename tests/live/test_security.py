"""Broker security (DESIGN.md §3, §9): own topics only, no retained leaks, passwords enforced.

MQTT 3.1.1 drops a denied publish silently (the publisher still gets its PUBACK), so each test
sends a permitted marker after the forbidden message and shows only the marker arrives.
"""
import time

import paho.mqtt.client as mqtt

from helpers import client, close, connected, subscribe
from edge.core import topics

WAIT = 0.5


def _topics(c, wait=WAIT):
    deadline = time.monotonic() + wait
    seen = []
    while time.monotonic() < deadline:
        try:
            seen.append(c.inbox.get(timeout=max(deadline - time.monotonic(), 0.01))[:2])
        except Exception:
            pass
    return seen


def test_device_cannot_publish_on_another_devices_topics(broker):
    be = client(broker, "backend")
    a = client(broker, "A")
    assert connected(be)[0] and connected(a)[0]
    subscribe(be, topics.fleet_all("t"))
    for topic in (topics.device("t", "B", "up"), topics.device("t", "B", "state"), topics.device("t", "A", "ctl"),
                  topics.query("t", "x", "spec"), topics.query("t", "x", "answer"), topics.device("other", "A", "up")):
        info = a.publish(topic, b"spoof", qos=1)
        info.wait_for_publish(2)
        assert info.is_published()              # acknowledged, yet dropped by the broker
    a.publish(topics.device("t", "A", "up"), b"marker", qos=1).wait_for_publish(2)
    a.publish(topics.device("t", "A", "state"), b"alive", qos=1).wait_for_publish(2)
    seen = _topics(be)
    assert (topics.device("t", "A", "up"), b"marker") in seen and (topics.device("t", "A", "state"), b"alive") in seen
    assert not [s for s in seen if s[1] == b"spoof"]
    close(a)
    close(be)


def test_device_cannot_read_another_devices_control(broker):
    be = client(broker, "backend")
    a = client(broker, "A")
    assert connected(be)[0] and connected(a)[0]
    # Mosquitto 2.0 grants these subscriptions (SUBACK QoS 1) and filters at delivery time.
    for topic in (topics.device("t", "B", "ctl"), topics.fleet_all("t"), "#", topics.device("t", "A", "ctl")):
        subscribe(a, topic)
    be.publish(topics.device("t", "B", "ctl"), b"for-B", qos=1).wait_for_publish(2)
    be.publish(topics.device("t", "B", "up"), b"B-report", qos=1).wait_for_publish(2)
    be.publish(topics.device("t", "A", "ctl"), b"for-A", qos=1).wait_for_publish(2)
    seen = _topics(a)
    assert seen and all(s == (topics.device("t", "A", "ctl"), b"for-A") for s in seen)
    close(a)
    close(be)


def test_retained_state_of_another_device_is_not_leaked(broker):
    b = client(broker, "B")
    assert connected(b)[0]
    b.publish(topics.device("t", "B", "state"), b"B-birth", qos=1, retain=True).wait_for_publish(2)
    close(b)
    a = client(broker, "A")
    assert connected(a)[0]
    for topic in (topics.device("t", "B", "state"), topics.device("t", "+", "state"), topics.fleet_all("t"), "#"):
        subscribe(a, topic)
    assert _topics(a) == []
    be = client(broker, "backend")               # the backend does see it, retained
    assert connected(be)[0]
    subscribe(be, topics.device("t", "+", "state"))
    assert be.inbox.get(timeout=2) == (topics.device("t", "B", "state"), b"B-birth", True)
    close(a)
    close(be)


def test_wrong_password_unknown_user_and_anonymous_are_refused(broker):
    for user, password in (("A", "wrong"), ("A", broker.credentials("B")[1]), ("nobody", "x"), ("", "")):
        c = client(broker, user, password)
        ok, rc = connected(c)
        assert not ok, (user, rc)
        close(c)
    anon = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    refused = []
    anon.on_connect = lambda cl, u, f, rc, p: refused.append(rc.is_failure)
    anon.connect(broker.host, broker.port)
    deadline = time.monotonic() + 3
    while not refused and time.monotonic() < deadline:
        anon.loop(0.1)
    assert refused == [True]
    anon.disconnect()


def test_gateway_has_exactly_its_sensors_topics(tmp_path):
    """A gateway publishes for its own sensors only (and reads only their ctl); not for another gateway's
    sensor nor for a device; sensors behind a gateway have no login of their own."""
    from backend.live.broker import Broker
    with Broker(tmp_path / "gwbroker", "t", ["A"], gateways={"G": ["S1", "S2"], "H": ["S3"]}) as b:
        assert "S1" not in b.passwords and "G" in b.passwords
        be = client(b, "backend")
        g = client(b, "G")
        assert connected(be)[0] and connected(g)[0]
        subscribe(be, "qf/t/#")
        for topic in ("qf/t/d/S1/ctl", "qf/t/d/S3/ctl", "qf/t/d/A/ctl"):
            subscribe(g, topic)
        for topic in ("qf/t/d/S3/up", "qf/t/d/S3/state", "qf/t/d/A/up", "qf/t/d/S1/ctl", "qf/t/q/x/spec"):
            g.publish(topic, b"spoof", qos=1).wait_for_publish(2)
        for topic in ("qf/t/d/S1/up", "qf/t/d/S2/state", "qf/t/d/G/up"):
            g.publish(topic, b"ok", qos=1).wait_for_publish(2)
        for topic in ("qf/t/d/S1/ctl", "qf/t/d/S3/ctl", "qf/t/d/A/ctl"):
            be.publish(topic, b"ctl-" + topic.encode(), qos=1).wait_for_publish(2)
        seen = _topics(be)
        assert {("qf/t/d/S1/up", b"ok"), ("qf/t/d/S2/state", b"ok"), ("qf/t/d/G/up", b"ok")} <= set(seen)
        assert not [s for s in seen if s[1] == b"spoof"]
        got = _topics(g)
        assert got == [("qf/t/d/S1/ctl", b"ctl-qf/t/d/S1/ctl")], got
        close(g)
        close(be)
