"""Bridge against a real Mosquitto: QoS 1 messages land in the spool, and none are lost while it is down."""
import os
import shutil
import socket
import subprocess
import time

import paho.mqtt.client as mqtt
import pytest

from backend.spark.bridge import Bridge
from backend.spark.spool import Spool
from edge.core import topics

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
pytestmark = pytest.mark.skipif(not os.path.exists(MOSQUITTO), reason="mosquitto is not installed")
FLEET = "f1"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    def __init__(self, workdir):
        self.port = free_port()
        self.conf = workdir / "mosquitto.conf"
        (workdir / "data").mkdir()
        self.conf.write_text("listener %d 127.0.0.1\nallow_anonymous true\npersistence true\n"
                             "persistence_location %s/\nuser root\nlog_dest stderr\n"
                             % (self.port, workdir / "data"))
        self.log = open(workdir / "mosquitto.log", "ab")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "mosquitto exited; see its log"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("mosquitto did not listen within 10 s")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()       # SIGTERM: mosquitto saves its persistence file on the way out
            self.proc.wait(timeout=10)


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path)
    b.start()
    yield b
    b.stop()
    b.log.close()


def publish(port, messages):
    """Publish ``(topic, payload, retain)`` at QoS 1 and wait until the broker acknowledged each."""
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="pub-%d" % time.monotonic_ns(),
                    protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        infos = [c.publish(t, p, qos=1, retain=r) for t, p, r in messages]
        for info in infos:
            info.wait_for_publish(timeout=10)
            assert info.is_published()
    finally:
        c.disconnect()
        c.loop_stop()


def wait_spooled(spool, n, timeout=15):
    deadline = time.monotonic() + timeout
    while spool.latest_offset() < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return spool.read(0, 10 ** 9)


def start_bridge(spool, port):
    bridge = Bridge(spool, FLEET, port=port, batch_messages=16, batch_seconds=0.01).start()
    assert bridge.subscribed.wait(10), "bridge did not subscribe within 10 s"
    return bridge


def up(device, i):
    return (topics.device(FLEET, device, "up"), b"\x01\x01" + i.to_bytes(4, "little"), False)


def test_messages_land_in_the_spool_and_none_are_lost_while_the_bridge_is_down(broker, tmp_path):
    spool = Spool(tmp_path / "spool")
    bridge = start_bridge(spool, broker.port)
    first = [up("dev1", i) for i in range(40)] + [
        (topics.device(FLEET, "dev2", "state"), b"\x01\x04birth", True),
        (topics.query(FLEET, "hot", "spec"), b'{"agg": "max"}', True),
        (topics.device(FLEET, "dev2", "up"), b"\xff\x00 not a codec payload", False),
        (topics.device(FLEET, "dev2", "ctl"), b"a downlink's echo", False),   # spooled (echo mode)
        (topics.device("other", "dev3", "up"), b"another fleet", False),
    ]
    try:
        publish(broker.port, first)
        wait_spooled(spool, 44)
        time.sleep(0.2)                      # nothing else may arrive
        got = spool.read(0, 10 ** 9)
        assert [(r.topic, r.payload) for r in got] == [(t, p) for t, p, _ in first[:44]]
        assert all(abs(r.arrival - time.time()) < 60 for r in got)
    finally:
        bridge.stop()
    assert bridge.stats["acked"] == 44 and bridge.stats["spooled"] == 44

    # While the bridge is away its persistent session queues QoS 1 messages, even across a broker restart.
    second = [up("dev1", 100 + i) for i in range(30)]
    publish(broker.port, second)
    broker.stop()
    broker.start()
    spool.close()
    spool = Spool(tmp_path / "spool")
    bridge = start_bridge(spool, broker.port)
    try:
        wait_spooled(spool, 74)
        time.sleep(0.2)
        got = spool.read(0, 10 ** 9)
        assert [(r.topic, r.payload) for r in got[44:]] == [(t, p) for t, p, _ in second]
        assert len(got) == 74                # no retained state/spec replayed: the session was resumed
        assert bridge.stats["resumed_sessions"] == 1
    finally:
        bridge.stop()
        spool.close()


def test_oversized_message_is_acknowledged_and_counted_not_spooled(broker, tmp_path):
    with Spool(tmp_path / "spool") as spool:
        bridge = start_bridge(spool, broker.port)
        try:
            publish(broker.port, [(topics.device(FLEET, "big", "up"), b"x" * (1 << 20), False), up("dev1", 1)])
            got = wait_spooled(spool, 1)
            deadline = time.monotonic() + 10
            while bridge.stats["oversized"] < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            bridge.stop()
        assert [r.payload for r in got] == [up("dev1", 1)[1]]
        assert bridge.stats["oversized"] == 1 and bridge.stats["acked"] == 2


class FullDisk:
    """A spool whose appends fail, as on a full disk."""

    def append(self, records):
        raise OSError(28, "No space left on device")


def test_nothing_is_acknowledged_before_it_is_spooled(broker, tmp_path):
    bridge = start_bridge(FullDisk(), broker.port)
    msgs = [up("dev1", i) for i in range(5)]
    try:
        publish(broker.port, msgs)
        deadline = time.monotonic() + 10
        while bridge.stats["spool_errors"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        bridge.stop()
    assert bridge.stats["spool_errors"] >= 1 and bridge.stats["acked"] == 0
    with Spool(tmp_path / "spool") as spool:      # the broker redelivers the unacknowledged messages
        bridge = start_bridge(spool, broker.port)
        try:
            got = wait_spooled(spool, 5)
        finally:
            bridge.stop()
        assert [(r.topic, r.payload) for r in got] == [(t, p) for t, p, _ in msgs]


def test_a_lost_link_is_spooled_and_time_keeps_moving_until_it_is_restored(broker, tmp_path):
    """What the live coordinator sees of its broker link, the job sees in the spool: ``lost`` after
    every message received before it, ticks while away, ``restored`` once subscribed again."""
    spool = Spool(tmp_path / "spool")
    bridge = Bridge(spool, FLEET, port=broker.port, batch_messages=16, batch_seconds=0.01, tick_seconds=0.1,
                    keepalive=2).start()
    link = topics.spool(FLEET, "link")
    try:
        assert bridge.subscribed.wait(10)
        publish(broker.port, [up("dev1", i) for i in range(5)])
        wait_spooled(spool, 5)
        broker.stop()
        deadline = time.monotonic() + 15
        while not bridge.lost and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)                      # away for a while: the bridge keeps ticking
        broker.start()
        assert bridge.subscribed.wait(15) and not bridge.lost
        publish(broker.port, [up("dev1", 100)])
        got = [r for r in wait_spooled(spool, 10 ** 9, timeout=2)]
    finally:
        bridge.stop()
        spool.close()
    kinds = [r.payload if r.topic == link else r.topic.rsplit("/", 1)[-1] for r in got]
    lost, restored = kinds.index(b"lost"), kinds.index(b"restored")
    assert kinds[:5] == ["up"] * 5 and 5 <= lost < restored and kinds.count(b"lost") == 1
    assert kinds.count(b"restored") == 1 and "up" in kinds[restored:]
    away = got[lost + 1:restored]
    assert len(away) >= 5 and {r.topic for r in away} == {topics.tick(FLEET)}
    assert all(a.arrival <= b.arrival for a, b in zip(got, got[1:]))
    assert bridge.stats["links_lost"] == 1


def test_publisher_waits_once_per_batch_and_loses_nothing_while_the_broker_is_away(broker, tmp_path):
    """QoS 1 downlinks handed over while the broker is down are sent on reconnect and acknowledged
    before ``flush`` returns; retained answers dropped meanwhile are published again; a small window
    makes ``publish`` wait for acknowledgements instead of queueing without bound."""
    import threading
    from backend.spark.publish import Publisher
    got = []
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="sub-ctl", protocol=mqtt.MQTTv311,
                      clean_session=False)
    sub.on_message = lambda c, u, m: got.append((m.topic, m.payload))
    sub.on_connect = lambda c, u, f, rc, p: c.subscribe(topics.device(FLEET, "+", "ctl"), qos=1)
    sub.reconnect_delay_set(0.1, 0.5)
    sub.connect("127.0.0.1", broker.port)
    sub.loop_start()
    pub = Publisher("127.0.0.1", broker.port, None, None, "qf-pub-test", window=8)
    try:
        deadline = time.monotonic() + 10
        while not (pub.connects and sub.is_connected()) and time.monotonic() < deadline:
            time.sleep(0.05)
        for i in range(100):
            pub.publish(topics.device(FLEET, "d%d" % (i % 3), "ctl"), b"c%d" % i, qos=1)
        pub.flush(timeout=20)
        assert pub.stats["window_waits"] > 0
        broker.stop()
        deadline = time.monotonic() + 10
        while pub.client.is_connected() and time.monotonic() < deadline:
            time.sleep(0.05)
        answer = topics.query(FLEET, "q1", "answer")

        def batch():                         # a batch while the broker is away
            pub.publish(answer, b'{"lo": 1}', qos=0, retain=True)
            pub.publish(answer, b'{"lo": 2}', qos=0, retain=True)
            for i in range(100, 150):        # the window fills: publish waits (bounded memory)
                pub.publish(topics.device(FLEET, "d0", "ctl"), b"c%d" % i, qos=1)
            pub.flush(timeout=60)
            done.set()
        done = threading.Event()
        threading.Thread(target=batch, daemon=True).start()
        assert not done.wait(1.0)            # not acknowledged while the broker is away: still waiting
        broker.start()
        assert done.wait(60)
        deadline = time.monotonic() + 20
        while len({p for _, p in got}) < 150 and time.monotonic() < deadline:
            time.sleep(0.05)
        retained = []
        probe = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="probe", protocol=mqtt.MQTTv311)
        probe.on_message = lambda c, u, m: retained.append(m.payload)
        probe.connect("127.0.0.1", broker.port)
        probe.subscribe(answer)
        probe.loop_start()
        deadline = time.monotonic() + 10
        while not retained and time.monotonic() < deadline:
            time.sleep(0.05)
        probe.loop_stop()
    finally:
        pub.close()
        sub.loop_stop()
    assert {p for _, p in got} == {b"c%d" % i for i in range(150)}
    assert retained == [b'{"lo": 2}'] and pub.stats["republished"] >= 1
