"""backend/live/broker.py: generated ACL and config, persistence across restarts, TLS, missing Mosquitto."""
import json
import ssl

import paho.mqtt.client as mqtt
import pytest

from backend.live import broker as brokermod
from backend.live.broker import Broker, BrokerError
from helpers import client, close, connected, subscribe
from edge.core import topics


def test_acl_is_exactly_the_design():
    lines = [l for l in brokermod.acl_text("f").splitlines() if l]
    assert lines == ["pattern write qf/f/d/%u/up", "pattern write qf/f/d/%u/state", "pattern read qf/f/d/%u/ctl"]
    assert [l for l in brokermod.backend_acl_text("f").splitlines() if l] == ["user backend", "topic readwrite qf/f/#"]


def test_generated_files_and_credentials(broker):
    conf = open(broker.conf).read()
    for line in ("listener %d 127.0.0.1" % broker.port, "listener %d 127.0.0.1" % broker.device_port,
                 "allow_anonymous false", "persistence true", "per_listener_settings true",
                 "use_username_as_clientid true", "max_packet_size %d" % brokermod.MAX_PACKET):
        assert line in conf
    # the client id is bound to the login on the devices' listener only (the backend's components share a login)
    backend_part = conf[conf.index("listener %d " % broker.port):conf.index("listener %d " % broker.device_port)]
    assert "use_username_as_clientid" not in backend_part and "passwd-backend" in backend_part
    info = json.load(open(broker.credentials_file))
    assert set(info["users"]) == {"backend", "A", "B", "C", "M"} and info["port"] == broker.port
    assert info["device_port"] == broker.device_port and brokermod.endpoint(info, "A") == ("127.0.0.1", broker.device_port)
    for name in ("devices", "backend"):
        text = open(broker.directory + "/passwd-" + name).read()
        assert "A:" + broker.credentials("A")[1] not in text     # hashed
        assert ("A:" in text) == (name == "devices") and ("backend:" in text) == (name == "backend")


def test_retained_messages_survive_a_restart_on_the_same_port(broker):
    port = broker.port
    a = client(broker, "A")
    assert connected(a)[0]
    a.publish(topics.device("t", "A", "state"), b"birth", qos=1, retain=True).wait_for_publish(2)
    close(a)
    broker.restart()
    assert broker.port == port and broker.running()
    be = client(broker, "backend")
    assert connected(be)[0]
    subscribe(be, topics.device("t", "A", "state"))
    assert be.inbox.get(timeout=2) == (topics.device("t", "A", "state"), b"birth", True)
    close(be)


def test_tls_listener_with_generated_ca(tmp_path):
    with Broker(tmp_path, "t", ["A"], tls=True) as b:
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
        c.username_pw_set(*b.credentials("A"))
        c.tls_set(ca_certs=b.ca_file, tls_version=ssl.PROTOCOL_TLS_CLIENT)
        results = []
        c.on_connect = lambda cl, u, f, rc, p: results.append(rc.is_failure)
        c.connect("127.0.0.1", b.tls_port)                  # a device listener: client id = login
        for _ in range(30):
            c.loop(0.1)
            if results:
                break
        assert results == [False]
        c.disconnect()


def test_missing_mosquitto_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(brokermod.shutil, "which", lambda name, path=None: None)
    with pytest.raises(BrokerError, match="apt-get install mosquitto"):
        Broker(tmp_path, "t", ["A"]).start()


def test_a_fleet_with_no_devices_yet_starts(mosquitto, tmp_path):
    # the Spark bench registers its devices after the broker is up: an empty devices' password file
    with Broker(tmp_path / "broker", "f", []) as b:
        c = client(b, "backend")
        ok, rc = connected(c)
        close(c)
        assert ok, rc


def test_a_timed_autosave_still_keeps_retained_messages_over_a_clean_restart(mosquitto, tmp_path):
    """``autosave`` s (the bench's broker: the file holds every retained answer, so saving it per change is
    O(queries) each) saves on that timer and on SIGTERM; a bad value is refused before anything is written."""
    with pytest.raises(ValueError, match="autosave"):
        Broker(tmp_path / "bad", "t", ["A"], autosave=0)
    with Broker(tmp_path / "b", "t", ["A"], autosave=60) as b:
        conf = open(b.conf).read()
        assert "autosave_on_changes false" in conf and "autosave_interval 60" in conf
        a = client(b, "A")
        assert connected(a)[0]
        a.publish(topics.device("t", "A", "state"), b"birth", qos=1, retain=True).wait_for_publish(2)
        close(a)
        b.restart()
        be = client(b, "backend")
        assert connected(be)[0]
        subscribe(be, topics.device("t", "A", "state"))
        assert be.inbox.get(timeout=2) == (topics.device("t", "A", "state"), b"birth", True)
        close(be)


def test_a_broker_never_gets_one_port_twice(monkeypatch, tmp_path):
    """The OS may hand a just-closed port out again: the backend and device listeners must still differ
    (before: mosquitto failed with 'Address already in use' on its own second listener)."""
    ports = iter([53065, 53065, 53065, 53066])

    class Sock:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def bind(self, addr):
            self.port = next(ports)

        def getsockname(self):
            return ("127.0.0.1", self.port)
    monkeypatch.setattr(brokermod.socket, "socket", lambda *a, **k: Sock())
    b = Broker(str(tmp_path / "b"), "t", ["d1"])
    b.generate()
    assert (b.port, b.device_port) == (53065, 53066)
