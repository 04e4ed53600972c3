"""The dashboard server (backend/ui/server.py) against Mosquitto: /api/state, /api/devices paging and
search (with a 50,000-device figure), the event stream, a failing totals provider, a clean stop."""
import json
import socket
import time
import urllib.request

import pytest

from backend.ui import server as uiserver
from backend.ui.server import Dashboard, parse_ui
from edge.core import codec, topics
from helpers import client, close, connected

F = "t"


def get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type"), r.read()


def api(dash, path):
    status, ctype, body = get(dash.url + path.lstrip("/"))
    assert status == 200 and ctype.startswith("application/json")
    return json.loads(body)


def until(pred, timeout=10.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("%s not met within %.0fs" % (what, timeout))


def birth(sources, t=None):
    return codec.encode("birth", {"seq": 1, "t": t or time.time(), "boot": 1, "fw": "qf-test", "caps": 0, "first": 0,
                                  "sources": [{"name": s, "epoch": 0, "width": 1.0, "v": 0.0} for s in sources]})


def refused(port):
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
    except ConnectionRefusedError:
        return True
    finally:
        s.close()
    return False


def test_parse_ui():
    assert parse_ui("8080") == ("127.0.0.1", 8080)
    assert parse_ui("0.0.0.0:9000") == ("0.0.0.0", 9000)
    with pytest.raises(ValueError):
        parse_ui("http")


def test_state_devices_events_and_stop(broker):
    calls = []

    def provider():
        calls.append(1)
        return {"samples": 1000, "deadband": 100, "ours": 25, "driver": "test driver", "window": "the test"}

    dash = Dashboard(F, broker.host, broker.port, broker.credentials("backend")[1], provider=provider,
                     specs=[{"id": "cli", "kind": "max", "sources": ["a0"], "precision": 1.0}]).start()
    port = dash.url.rsplit(":", 1)[1].rstrip("/")
    try:
        status, ctype, page = get(dash.url)
        assert status == 200 and ctype.startswith("text/html") and b"uPlot.iife.min.js" in page
        for asset in ("static/app.js", "static/vendor/uplot/uPlot.iife.min.js", "static/vendor/uplot/LICENSE"):
            assert get(dash.url + asset)[0] == 200
        be = client(broker, "backend")
        assert connected(be)[0]
        dev = client(broker, "A")
        assert connected(dev)[0]
        be.publish(topics.query(F, "tot", "spec"), json.dumps({"kind": "sum", "sources": ["a0", "a1"], "precision": 2.0}),
                   qos=1, retain=True).wait_for_publish(2)
        now = time.time()
        for i, (lo, hi) in enumerate([(9.0, 11.0), (10.0, 12.0)]):
            be.publish(topics.query(F, "tot", "answer"), json.dumps({
                "query": "tot", "time": now + i, "lo": lo, "hi": hi, "degraded": False, "guarantee": "interval",
                "final": False}), qos=1, retain=True).wait_for_publish(2)
        dev.publish(topics.device(F, "A", "state"), birth(["a0", "a1"]), qos=1, retain=True).wait_for_publish(2)
        dev.publish(topics.device(F, "A", "up"), codec.encode("report", {"src": 0, "epoch": 0, "seq": 1, "t": now,
                                                                          "v": 1.0, "why": 0}), qos=1).wait_for_publish(2)
        st = until(lambda: (lambda s: s if s["totals"]["uplink"] == 1 and s["queries"][-1].get("time") == now + 1
                            and s["device_counts"]["online"] == 1 else None)(api(dash, "/api/state")),
                   what="state with the answer, the birth and the uplink")
        q = {r["id"]: r for r in st["queries"]}
        assert set(q) == {"cli", "tot"} and q["cli"]["kind"] == "max" and q["cli"]["lo"] is None
        tot = q["tot"]
        for k in ("id", "kind", "precision", "lo", "hi", "degraded", "reason", "final", "guarantee", "time"):
            assert k in tot
        assert (tot["kind"], tot["precision"], tot["lo"], tot["hi"], tot["guarantee"]) == ("sum", 2.0, 10.0, 12.0, "interval")
        assert [p[1:3] for p in tot["history"]] == [[9.0, 11.0], [10.0, 12.0]]
        d = st["devices"][0]
        for k in ("id", "online", "last_seen", "sources", "model", "messages"):
            assert k in d
        assert (d["id"], d["online"], d["sources"], d["model"], d["messages"]) == ("A", True, ["a0", "a1"], "constant", 1)
        t = until(lambda: (lambda t: t if t["samples"] else None)(api(dash, "/api/state")["totals"]), what="totals")
        assert t["samples"] == 1000 and t["vs_deadband"] == 0.25 and t["saved_vs_samples"] == 0.975
        assert t["driver"] == "test driver"
        assert "history" not in api(dash, "/api/state?history=0")["queries"][0]
        page = api(dash, "/api/devices?offset=0&limit=1&q=a1")
        assert page["matched"] == 1 and page["items"][0]["id"] == "A"
        # the event stream: one state event at once, without device rows
        with urllib.request.urlopen(dash.url + "api/events", timeout=5) as r:
            assert r.headers.get("Content-Type").startswith("text/event-stream")
            lines = []
            while not any(line.startswith(b"data: ") for line in lines):
                lines.append(r.readline())
        ev = json.loads([line for line in lines if line.startswith(b"data: ")][0][6:])
        assert b"event: state\n" in lines and "devices" not in ev and ev["device_counts"]["online"] == 1
        assert {r["id"]: len(r["history"]) for r in ev["queries"]} == {"cli": 0, "tot": 2}
        # a Last Will turns the device offline
        dev.publish(topics.device(F, "A", "state"), codec.encode("gone", {"boot": 1}), qos=1, retain=True).wait_for_publish(2)
        until(lambda: api(dash, "/api/devices?status=offline")["matched"] == 1, what="device offline")
        close(be)
        close(dev)
    finally:
        dash.stop()
    assert refused(int(port)), "the dashboard's port is still open after stop()"
    assert not dash.client.is_connected()
    dash.stop()                                    # idempotent


def test_bad_request_and_failing_provider(broker):
    def provider():
        raise RuntimeError("no figures")

    with Dashboard(F, broker.host, broker.port, broker.credentials("backend")[1], provider=provider) as dash:
        with pytest.raises(urllib.error.HTTPError) as e:
            get(dash.url + "api/devices?offset=x")
        assert e.value.code == 400
        t = until(lambda: (lambda t: t if t["error"] else None)(api(dash, "/api/state")["totals"]), what="provider error")
        assert "no figures" in t["error"] and t["samples"] is None
    with pytest.raises(OSError):                    # the port is refused once stopped, and can be bound again
        socket.create_connection(("127.0.0.1", dash.port), timeout=1).close()
    again = Dashboard(F, broker.host, broker.port, broker.credentials("backend")[1], port=dash.port).start()
    again.stop()


def test_paging_at_50000_devices(broker, capsys):
    """A fleet of 50,000 devices: every page and search is answered by the server in a bounded document.
    Prints the figures (a benchmark, not a timed assertion)."""
    n = 50_000
    dash = Dashboard(F, broker.host, broker.port, broker.credentials("backend")[1]).start()
    try:
        now = time.time()
        t = time.perf_counter()
        for i in range(n):
            dev = "dev%05d" % ((i * 7919) % n)                 # born out of order
            dash.feed(now, topics.device(F, dev, "state"), birth(["t%d" % i, "h%d" % i], now))
        for i in range(0, n, 10):
            dash.feed(now + 1, topics.device(F, "dev%05d" % i, "state"), codec.encode("gone", {"boot": 1}))
        fed = time.perf_counter() - t
        figures = {}
        for j, (label, path) in enumerate([("first page", "/api/devices?offset=0&limit=50"),
                            ("deep page", "/api/devices?offset=49950&limit=50"),
                            ("search 'dev4999'", "/api/devices?q=dev4999&limit=50"),
                            ("search a source 'h1234'", "/api/devices?q=h1234&limit=50"),
                            ("offline filter", "/api/devices?status=offline&offset=2500&limit=50"),
                            ("/api/state", "/api/state?limit=50")]):
            t = time.perf_counter()
            doc = api(dash, path)
            cold = time.perf_counter() - t
            born, same = [], []
            for k in range(3):              # a new device invalidates cached searches and the id order
                dash.feed(now + 2, topics.device(F, "zz%d-%d" % (j, k), "state"), birth(["z"], now))
                t = time.perf_counter()
                api(dash, path)
                born.append(time.perf_counter() - t)
            for k in range(3):
                t = time.perf_counter()
                api(dash, path)
                same.append(time.perf_counter() - t)
            figures[label] = (cold, sorted(born)[1], sorted(same)[1], len(json.dumps(doc)))
        page = api(dash, "/api/devices?offset=49950&limit=50")
        assert page["total"] == n + 18 and [d["id"] for d in page["items"]][:2] == ["dev49950", "dev49951"]
        assert api(dash, "/api/devices?q=dev4999&limit=50")["matched"] == 10
        off = api(dash, "/api/devices?status=offline&offset=0&limit=50")
        assert off["matched"] == n // 10 and all(d["online"] is False for d in off["items"])
        st = api(dash, "/api/state?limit=50")
        assert len(st["devices"]) == 50 and st["device_counts"]["offline"] == n // 10
    finally:
        dash.stop()
    with capsys.disabled():
        print("\n[dashboard] %d devices fed in %.2f s (%.1f µs per birth)" % (n, fed, fed / n * 1e6))
        print("[dashboard] HTTP round trip per request (ms): first / after a new device (median of 3) / "
              "unchanged fleet (median of 3); response size")
        for label, (cold, born, same, size) in figures.items():
            print("[dashboard] %-26s %6.1f / %6.1f / %6.1f ms, %5d bytes" % (label, cold * 1e3, born * 1e3,
                                                                               same * 1e3, size))
    assert uiserver.PAGE == 50


def test_coordinator_command_serves_the_dashboard(broker, tmp_path):
    """``quietfleet coordinator --ui 127.0.0.1:0``: the page comes up with the --query spec, and stops with the
    command (SIGINT), leaving its port closed."""
    import os
    import re
    import signal
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    spec = json.dumps({"id": "tot", "kind": "sum", "sources": ["a0"], "precision": 1.0})
    p = subprocess.Popen([sys.executable, "-m", "backend.cli", "coordinator", "--credentials", broker.credentials_file,
                          "--query", spec, "--ui", "127.0.0.1:0"], cwd=root, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        m = re.match(r"dashboard: (http://127\.0\.0\.1:(\d+)/)", line)
        assert m, (line, p.stderr.read() if p.poll() is not None else "")
        url, port = m.group(1), int(m.group(2))
        doc = json.loads(get(url + "api/state")[2])
        assert doc["queries"][0]["id"] == "tot" and doc["queries"][0]["kind"] == "sum"
        assert doc["totals"]["driver"] is None or "coordinator" in doc["totals"]["driver"]
        until(lambda: json.loads(get(url + "api/state")[2])["totals"]["driver"], what="coordinator totals")
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=15)
        assert p.returncode == 0, err
        assert '{"stats"' in out
        assert refused(port)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
