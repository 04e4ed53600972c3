"""An operator's own broker (README "Your own broker"): a Mosquitto configured here, not by ``quietfleet broker``,
that listens only with TLS, asks every client for a certificate, and has its own users and the README's ACL
with names of the operator's choosing. The real commands run through it end to end: ``quietfleet coordinator``
with a ``--query``, a CPython agent from a ``device.toml`` naming its user, client id and TLS files, and
``quietfleet query`` (list, add, remove). Answers are checked against the agent's ground truth; the
coordinator's Last Will turns every answer stale when it is killed; the Spark backend's MQTT clients (bridge
and publisher) connect with the same options; a wrong password or a missing client certificate is refused."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from backend.live import access, checker, presence
from backend.live.broker import find_mosquitto, free_port, make_certificates
from edge.core import topics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLEET = "plant"
USERS = {"ops-core": "core-secret", "kitchen-pi": "kitchen-secret", "viewer": "viewer-secret"}
# the README's ACL recipe, with the operator's user names: backend, one device, a read-only dashboard user
ACL = """user ops-core
topic readwrite qf/plant/#

user kitchen-pi
topic write qf/plant/d/kitchen/up
topic write qf/plant/d/kitchen/state
topic read qf/plant/d/kitchen/ctl
"""


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def client_certificate(folder, name):
    """A client certificate for ``name`` signed by the CA ``make_certificates`` made in ``folder``."""
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=%s" % name, "-keyout", name + ".key",
             "-out", name + ".csr", cwd=folder)
    _openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "30", "-out", name + ".crt", cwd=folder)
    return os.path.join(folder, name + ".crt"), os.path.join(folder, name + ".key")


@pytest.fixture
def own(mosquitto, tmp_path):
    """The operator's Mosquitto: TLS only, client certificates required, own passwords and ACL."""
    mosq, passwd = find_mosquitto()
    d = tmp_path / "ops"
    d.mkdir()
    make_certificates(str(d))
    certs = {u: client_certificate(str(d), u) for u in USERS}
    (d / "passwd").write_text("".join("%s:%s\n" % kv for kv in USERS.items()))
    subprocess.run([passwd, "-U", str(d / "passwd")], check=True, capture_output=True)
    (d / "acl").write_text(ACL)
    port = free_port()
    (d / "mosquitto.conf").write_text("\n".join([
        "per_listener_settings false", "allow_anonymous false", "password_file %s" % (d / "passwd"),
        "acl_file %s" % (d / "acl"), "persistence false", "log_dest stderr", "log_type all",
        "listener %d 127.0.0.1" % port, "cafile %s" % (d / "ca.crt"), "certfile %s" % (d / "server.crt"),
        "keyfile %s" % (d / "server.key"), "require_certificate true", "tls_version tlsv1.2"]
        + (["user root"] if os.geteuid() == 0 else [])) + "\n")
    log = open(d / "mosquitto.log", "wb")
    proc = subprocess.Popen([mosq, "-c", str(d / "mosquitto.conf")], stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: _listening(port) or proc.poll() is not None, 10, "mosquitto")
        assert proc.poll() is None, (d / "mosquitto.log").read_text()
        yield {"dir": d, "port": port, "ca": str(d / "ca.crt"), "certs": certs}
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def _listening(port):
    import socket
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def _wait(pred, timeout, what):
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out waiting for %s" % what
        time.sleep(0.05)


def _broker_args(own, user="ops-core", password=None, cert=True):
    args = ["--host", "127.0.0.1", "--port", str(own["port"]), "--fleet", FLEET, "--user", user,
            "--password", password or USERS[user], "--tls-ca", own["ca"]]
    if cert:
        args += ["--tls-cert", own["certs"][user][0], "--tls-key", own["certs"][user][1]]
    return args


def _cli(argv, timeout=60):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "backend.cli"] + argv, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _device_toml(own, folder):
    crt, key = own["certs"]["kitchen-pi"]
    text = "\n".join([
        'fleet = "plant"', 'device = "kitchen"', 'password = "%s"' % USERS["kitchen-pi"], "period = 0.05",
        "width = 1.0", 'ground_truth = "truth.csv"', "",
        "[broker]", 'host = "127.0.0.1"', "port = %d" % own["port"], 'user = "kitchen-pi"',
        'client_id = "kitchen-sensor-01"', "tls = true", 'ca = "%s"' % own["ca"], 'cert = "%s"' % crt,
        'key = "%s"' % key, "keepalive = 5", "",
        "[sources.temp]", 'kind = "walk"', "start = 20.0", "step = 0.3", "seed = 4", ""])
    path = os.path.join(folder, "device.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def test_coordinator_agent_and_queries_through_an_operators_tls_broker(own, tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    answers_path = str(tmp_path / "answers.jsonl")
    spec = {"id": "kitchen", "kind": "avg", "sources": ["temp"], "precision": 2.0}
    coord = subprocess.Popen([sys.executable, "-m", "backend.cli", "coordinator", "--client-id", "plant-core",
                              "--query", json.dumps(spec), "--answers", answers_path] + _broker_args(own),
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    agent = subprocess.Popen([sys.executable, "-m", "edge.runtime.cpython.runtime", _device_toml(own, str(tmp_path))],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: os.path.exists(answers_path) and sum(1 for _ in open(answers_path)) >= 5, 40,
              "answers through the TLS broker")
        # query: list sees the --query spec and its answer, add validates and registers, remove refuses an unknown id
        r = _cli(["query", "list"] + _broker_args(own))
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].startswith("backend: online (coordinator, protocol adaptive"), r.stdout
        assert lines[1].startswith("kitchen  ") and json.loads(lines[1].split("  ", 1)[1]) == \
            {k: v for k, v in spec.items() if k != "id"}
        assert '"lo"' in lines[2] and "STALE" not in lines[2], r.stdout
        r = _cli(["query", "add", "hot", '{"kind": "count", "sources": ["temp"], "range": [25, 100]}']
                 + _broker_args(own))
        assert r.returncode == 0 and r.stdout.startswith("query hot registered\n    answer: {"), (r.stdout, r.stderr)
        r = _cli(["query", "add", "hot", '{"kind": "count", "sources": ["temp"], "range": [30, 100]}']
                 + _broker_args(own))
        assert r.returncode == 0 and "replaces the earlier spec" in r.stdout, (r.stdout, r.stderr)
        r = _cli(["query", "add", "wide", '{"kind": "range", "sources": ["temp"], "range": [0, 1]}'] + _broker_args(own))
        assert r.returncode == 2 and "protocol adaptive" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
        r = _cli(["query", "remove", "nosuch"] + _broker_args(own))
        assert r.returncode == 2 and "no query nosuch" in r.stderr and "hot, kitchen" in r.stderr, r.stderr
        r = _cli(["query", "remove", "hot"] + _broker_args(own))
        assert r.returncode == 0 and r.stdout.strip() == "query hot removed", (r.stdout, r.stderr)
        # a wrong password and a missing client certificate: one line naming the broker, exit 2
        r = _cli(["query", "list"] + _broker_args(own, password="wrong"))
        assert r.returncode == 2 and r.stderr.strip() == "quietfleet query: the broker at 127.0.0.1:%d refused user " \
            "ops-core: Not authorized" % own["port"], r.stderr
        r = _cli(["query", "list"] + _broker_args(own, cert=False))
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "broker at 127.0.0.1:%d" % own["port"] in \
            r.stderr, r.stderr
        # the coordinator dies: its Last Will marks every retained answer stale
        killed = time.time()
        coord.send_signal(signal.SIGKILL)
        coord.wait(10)
        r = _cli(["query", "list"] + _broker_args(own))
        assert r.returncode == 0 and r.stdout.startswith("backend: OFFLINE (connection lost)"), r.stdout
        assert "[STALE: backend offline (connection lost)]" in r.stdout.splitlines()[2], r.stdout
    finally:
        for p in (coord, agent):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(15)
    out = agent.stdout.read()
    assert '"stats"' in out, agent.stderr.read()
    rows = []
    with open(tmp_path / "truth.csv") as f:
        for line in f:
            t, s, v = line.strip().split(",")
            rows.append((float(t), s, float(v)))
    answers = [json.loads(line) for line in open(answers_path)]
    kitchen = [dict(a, lo=float(a["lo"]), hi=float(a["hi"])) for a in answers if a["query"] == "kitchen" and "lo" in a]
    end = killed - 1.0          # the last answer holds until the coordinator died (strict JSON: "inf" is a string)
    checked = checker.violations([spec], [r for r in rows if r[0] <= end], [a for a in kitchen if a["time"] <= end], end)
    assert len(kitchen) >= 5 and checked["kitchen"][0] == 0, checked
    assert any(not a["degraded"] for a in kitchen)


def test_the_spark_backends_mqtt_clients_use_the_operators_login(own, tmp_path):
    """Bridge (spool) and publisher (answers, the backend's state and its Will) through the TLS broker."""
    from backend.spark.bridge import Bridge
    from backend.spark.publish import Publisher
    from backend.spark.spool import Spool
    acc = access.Access("127.0.0.1", own["port"], "ops-core", USERS["ops-core"],
                        {"ca": own["ca"], "cert": own["certs"]["ops-core"][0], "key": own["certs"]["ops-core"][1]},
                        "plant-spark", FLEET)
    watcher = acc.client("plant-watch")
    seen = {}
    watcher.on_message = lambda c, u, m: seen.__setitem__(m.topic, presence.parse(m.payload))
    watcher.connect(acc.host, acc.port)
    watcher.subscribe(topics.backend(FLEET), 1)
    watcher.loop_start()
    spool = Spool(str(tmp_path / "spool"))
    bridge = Bridge(spool, FLEET, acc.host, acc.port, acc.user, acc.password, client_id=acc.client_id, tls=acc.tls).start()
    state = (topics.backend(FLEET), presence.online("spark", "adaptive", ["avg"], 1.0, "plant-spark-pub"),
             presence.offline("spark", "connection lost", client="plant-spark-pub"))
    pub = Publisher(acc.host, acc.port, acc.user, acc.password, "plant-spark-pub", tls=acc.tls, state=state)
    try:
        _wait(lambda: bridge.subscribed.is_set(), 10, "the bridge's subscription")
        _wait(lambda: (seen.get(topics.backend(FLEET)) or {}).get("state") == "online", 10, "the online state")
        pub.publish(topics.query(FLEET, "q", "spec"), b'{"kind": "avg", "sources": ["temp"], "precision": 1}', qos=1,
                    retain=True)
        pub.flush(10)
        _wait(lambda: spool.latest_offset() >= 1, 10, "the spec in the spool")
        pub.close(presence.offline("spark", "stopped", 2.0))
        pub = None
        _wait(lambda: (seen.get(topics.backend(FLEET)) or {}).get("reason") == "stopped", 10, "the offline state")
    finally:
        if pub is not None:
            pub.close()
        bridge.stop()
        spool.close()
        watcher.disconnect()
        watcher.loop_stop()
    assert bridge.stats["connects"] >= 1 and bridge.stats["spooled"] >= 1
