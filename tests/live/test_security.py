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


def test_gateway_sensors_have_logins_of_their_own_and_the_gateway_only_its_own_topics(tmp_path):
    """A sensor behind a gateway logs in as itself (its password only in its gateway's config): each of
    the gateway's MQTT sessions has its own login, hence its own client id on a listener that binds them.
    The gateway's login publishes its own topics only, never a sensor's or another gateway's."""
    from backend.live.broker import Broker
    with Broker(tmp_path / "gwbroker", "t", ["A"], gateways={"G": ["S1", "S2"], "H": ["S3"]}) as b:
        assert {"G", "H", "S1", "S2", "S3"} <= set(b.passwords)
        be = client(b, "backend")
        g, s1 = client(b, "G"), client(b, "S1")
        assert connected(be)[0] and connected(g)[0] and connected(s1)[0]
        subscribe(be, "qf/t/#")
        subscribe(s1, "qf/t/d/+/ctl")
        for topic in ("qf/t/d/S1/up", "qf/t/d/S3/state", "qf/t/d/A/up", "qf/t/d/S1/ctl", "qf/t/q/x/spec"):
            g.publish(topic, b"spoof", qos=1).wait_for_publish(2)
        for topic in ("qf/t/d/S2/up", "qf/t/d/G/up"):
            s1.publish(topic, b"spoof", qos=1).wait_for_publish(2)
        s1.publish("qf/t/d/S1/up", b"ok", qos=1).wait_for_publish(2)
        g.publish("qf/t/d/G/up", b"ok", qos=1).wait_for_publish(2)
        for topic in ("qf/t/d/S1/ctl", "qf/t/d/S2/ctl"):
            be.publish(topic, b"ctl-" + topic.encode(), qos=1).wait_for_publish(2)
        seen = _topics(be)
        assert {("qf/t/d/S1/up", b"ok"), ("qf/t/d/G/up", b"ok")} <= set(seen)
        assert not [s for s in seen if s[1] == b"spoof"]
        assert _topics(s1) == [("qf/t/d/S1/ctl", b"ctl-qf/t/d/S1/ctl")]
        for c in (g, s1, be):
            close(c)


def _drops(c):
    c.drops = []
    c.on_disconnect = lambda cl, u, f, rc, p: c.drops.append(rc)
    return c


def test_a_device_cannot_take_another_devices_client_id(broker):
    """The issue's attack: dev1's login with dev2's client id knocked dev2 off (and each kicked the other every
    second). On the devices' listener the client id is the login, so the intruder is just dev1."""
    b = _drops(client(broker, "B", client_id="qf-t-B"))
    assert connected(b)[0]
    subscribe(b, topics.device("t", "B", "ctl"))
    intruders = [_drops(client(broker, "A", client_id=cid)) for cid in ("qf-t-B", "B")]
    assert all(connected(c)[0] for c in intruders)
    be = client(broker, "backend")
    assert connected(be)[0]
    time.sleep(1.5)
    be.publish(topics.device("t", "B", "ctl"), b"for-B", qos=1).wait_for_publish(2)
    assert b.inbox.get(timeout=2)[:2] == (topics.device("t", "B", "ctl"), b"for-B")
    assert b.drops == [] and b.is_connected()
    log = open(broker.log).read()
    assert "Client B already connected" not in log      # (the two intruders, both A now, knock each other off)
    for c in intruders + [b, be]:
        close(c)


def test_devices_cannot_log_in_on_the_backend_listener_where_client_ids_are_free(broker):
    import paho.mqtt.client as mqtt_
    c = mqtt_.Client(mqtt_.CallbackAPIVersion.VERSION2, client_id="qf-t-coordinator", protocol=mqtt_.MQTTv311)
    c.username_pw_set(*broker.credentials("A"))
    c.connack = []
    c.on_connect = lambda cl, u, f, rc, p: c.connack.append(rc.is_failure)
    c.connect(broker.host, broker.port)
    deadline = time.monotonic() + 3
    while not c.connack and time.monotonic() < deadline:
        c.loop(0.1)
    assert c.connack == [True]
    c.disconnect()
    # the backend's components (coordinator, bridge, dashboard, query tool) share its login, each its own id
    comps = [client(broker, "backend", client_id=cid) for cid in ("qf-t-coordinator", "qf-bridge-t", "qf-t-ui-1")]
    assert all(connected(x)[0] for x in comps)
    for x in comps:
        subscribe(x, topics.device("t", "+", "up"))
    a = client(broker, "A")
    assert connected(a)[0]
    a.publish(topics.device("t", "A", "up"), b"hello", qos=1).wait_for_publish(2)
    assert all(x.inbox.get(timeout=2)[1] == b"hello" for x in comps)
    for x in comps + [a]:
        close(x)


def test_a_packet_over_the_limit_disconnects_its_sender_and_never_arrives(broker):
    from backend.live.broker import MAX_PACKET
    from edge.core.codec import MAX_PAYLOAD
    be = client(broker, "backend")
    assert connected(be)[0]
    subscribe(be, topics.device("t", "+", "up"))
    a = _drops(client(broker, "A"))
    assert connected(a)[0]
    a.publish(topics.device("t", "A", "up"), b"x" * MAX_PAYLOAD, qos=1).wait_for_publish(2)   # the largest legit
    assert be.inbox.get(timeout=2)[1] == b"x" * MAX_PAYLOAD
    a.publish(topics.device("t", "A", "up"), b"y" * (1 << 20), qos=1)        # the 1 MB uplink
    deadline = time.monotonic() + 3
    while not a.drops and time.monotonic() < deadline:
        time.sleep(0.05)
    assert a.drops and MAX_PACKET < (1 << 20)
    assert [m for m in _topics(be, 1.0) if len(m[1]) > MAX_PAYLOAD] == []
    close(a)
    close(be)
