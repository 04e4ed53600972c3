"""SIGTERM stops every long-running command cleanly (DESIGN.md §10): each is started as a user would (a
subprocess), its process tree and the TCP ports it listens on are read from /proc once it is up, then one
SIGTERM: the command exits, no process of its tree is left, and every port it held can be bound again."""
import json
import os
import pty
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from backend.live.broker import Broker, free_port
from helpers import ROOT, client, connected, subscribe

CLI = [sys.executable, "-m", "backend.cli"]


def _children():
    """{pid: parent pid} of every process on the machine."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z":
                out[int(name)] = int(fields[1])
    return out


def tree(pid):
    """``pid`` and every live descendant of it."""
    parents = _children()
    found, todo = {pid}, [pid]
    while todo:
        p = todo.pop()
        for child, parent in parents.items():
            if parent == p and child not in found:
                found.add(child)
                todo.append(child)
    return {p for p in found if p in parents}


def listening(pids):
    """TCP ports in LISTEN held by ``pids`` (their socket inodes in /proc/net/tcp and tcp6)."""
    inodes = set()
    for p in pids:
        try:
            for fd in os.listdir("/proc/%d/fd" % p):
                try:
                    target = os.readlink("/proc/%d/fd/%s" % (p, fd))
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def listened():
    """Every TCP port something listens on (an orphaned connection's port, FIN_WAIT, is no listener)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            ports.update(int(l.split()[1].rsplit(":", 1)[1], 16) for l in f.readlines()[1:] if l.split()[3] == "0A")
    return ports


def holders(ports):
    """(pid, command line) of every process listening on one of ``ports`` (a failed test says who)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and listening([int(name)]) & set(ports):
            try:
                out.append((int(name), open("/proc/%s/cmdline" % name).read().replace("\0", " ")[:200]))
            except OSError:
                pass
    return out


def bindable(port):
    for family, host in ((socket.AF_INET, "127.0.0.1"),):
        with socket.socket(family) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def start(cmd, ready, timeout=120.0, cwd=None, env=None, session=False):
    """Start ``cmd`` (``session``: in a process group of its own, as a terminal's job); wait for a line of its
    output containing ``ready``; return the process and its output."""
    env = dict(os.environ if env is None else env, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, cwd=cwd or ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=session)
    lines = []
    threading.Thread(target=lambda: [lines.append(l) for l in proc.stdout], daemon=True).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if any(ready in l for l in list(lines)):
            return proc, lines
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("%s never printed %r: %s" % (cmd[2:5], ready, "".join(lines)[-2000:]))


def sigterm_leaves_nothing(proc, settle=1.0, timeout=60.0, ports=(), ctrl_c=False):
    """SIGTERM ``proc`` (``ctrl_c``: SIGINT to its whole process group, what a terminal's Ctrl-C does): it
    exits, its process tree is gone, nothing listens on a port it listened on, and ``ports`` (the ones a
    user gave it, which a restart must get again) can be bound again."""
    time.sleep(settle)
    procs = tree(proc.pid)
    held = listening(procs) | set(ports)
    if ctrl_c:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        for p in tree(proc.pid):
            os.kill(p, signal.SIGKILL)
        raise AssertionError("still running %.0fs after SIGTERM" % timeout)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (tree_alive(procs) or held & listened() or not all(map(bindable, ports))):
        time.sleep(0.2)
    left = tree_alive(procs)
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, "processes left after SIGTERM: %s" % left
    still = [p for p in held if p in listened()] + [p for p in ports if not bindable(p)]
    assert not still, "ports still held: %s by %s" % (still, holders(still))
    return code, procs, held


def tree_alive(pids):
    alive = _children()
    return sorted(p for p in pids if p in alive)


@pytest.fixture
def live_broker(mosquitto, tmp_path):
    with Broker(tmp_path / "broker", "t", ["dev1", "dev2"], sources={"dev1": ["t1"], "dev2": ["t2"]}) as b:
        yield b


def test_broker(mosquitto, tmp_path):
    proc, out = start(CLI + ["broker", "--dir", str(tmp_path / "b"), "--devices", "2", "--fleet", "t"], "credentials:")
    cred = json.load(open(tmp_path / "b" / "credentials.json"))
    code, procs, held = sigterm_leaves_nothing(proc, ports=(cred["port"], cred["device_port"]))
    assert code == 0 and len(procs) == 2 and {cred["port"], cred["device_port"]} <= held


def test_coordinator(live_broker, tmp_path):
    ui = free_port()
    proc, _ = start(CLI + ["coordinator", "--credentials", live_broker.credentials_file, "--ui", str(ui),
                           "--status", str(tmp_path / "status.json")], "coordinator for fleet")
    code, _, held = sigterm_leaves_nothing(proc, ports=(ui,))
    assert code == 0 and ui in held
    assert "refused" in json.load(open(tmp_path / "status.json"))["coordinator"]


def test_agent(live_broker, tmp_path):
    from helpers import start_cpython_agent
    be = client(live_broker, "backend")
    assert connected(be)[0]
    subscribe(be, "qf/t/d/dev1/state")
    proc = start_cpython_agent(str(tmp_path), live_broker, "dev1", [("t1", {"kind": "walk", "start": 20.0, "step": 0.5})])
    assert be.inbox.get(timeout=10)[0] == "qf/t/d/dev1/state"       # its birth: it is up
    code, procs, held = sigterm_leaves_nothing(proc)
    assert code == 0 and procs == {proc.pid} and not held
    be.disconnect()


def test_gateway(live_broker, tmp_path):
    master, slave = pty.openpty()
    b = Broker(tmp_path / "gwb", "t", [], gateways={"g0": ["b0"]}).start()
    try:
        cfg = {"fleet": "t", "gateway": "g0", "password": b.credentials("g0")[1], "port": b.device_port,
               "sensors": [{"name": "b0", "port": os.ttyname(slave), "password": b.credentials("b0")[1]}]}
        path = tmp_path / "gw.json"
        path.write_text(json.dumps(cfg))
        be = client(b, "backend")
        assert connected(be)[0]
        subscribe(be, "qf/t/d/b0/state")
        proc = subprocess.Popen([sys.executable, "-m", "edge.runtime.gateway.gateway", str(path)], cwd=ROOT,
                                env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "as b0 (p2, c0, k10, u'b0')" not in open(b.log).read():
            time.sleep(0.1)
        assert "as b0 (p2, c0, k10, u'b0')" in open(b.log).read()         # the sensor's session, under its own login and id
        code, procs, held = sigterm_leaves_nothing(proc)
        assert code == 0 and procs == {proc.pid} and not held
        be.disconnect()
    finally:
        b.stop()
        os.close(master)
        os.close(slave)


def test_fleet(mosquitto, tmp_path):
    from backend.live.fleet import micropython_available
    mp = ["--micropython", "1"] if micropython_available() else []
    proc, _ = start(CLI + ["fleet", "--cpython", "1", "--dir", str(tmp_path / "f"), "--fleet", "t"] + mp, "fleet t:")
    cred = json.load(open(tmp_path / "f" / "broker" / "credentials.json"))
    assert cred["sources"] == {n: ["s_" + n] for n in cred["sources"]} and cred["sources"]
    code, procs, held = sigterm_leaves_nothing(proc, settle=2.0, ports=(cred["port"], cred["device_port"]))
    assert len(procs) >= 3 and {cred["port"], cred["device_port"]} <= held      # mosquitto and the agents


def test_backend(live_broker, tmp_path):
    ui = free_port()
    proc, _ = start(CLI + ["backend", "--broker-dir", live_broker.directory, "--dir", str(tmp_path / "state"),
                           "--master", "local[1]", "--ui", str(ui)], "quietfleet backend: fleet", timeout=180)
    code, procs, held = sigterm_leaves_nothing(proc, settle=2.0, timeout=90, ports=(ui,))
    assert code == 0 and len(procs) >= 2 and ui in held        # the Spark JVM (and its Python workers) too


def test_backend_ctrl_c(live_broker, tmp_path):
    proc, out = start(CLI + ["backend", "--broker-dir", live_broker.directory, "--dir", str(tmp_path / "state"),
                             "--master", "local[1]"], "quietfleet backend: fleet", timeout=180, session=True)
    code, _, _ = sigterm_leaves_nothing(proc, settle=2.0, timeout=90, ctrl_c=True)
    time.sleep(0.5)
    assert code == 0 and not any("KeyboardInterrupt" in line for line in out), "".join(out)[-3000:]


def test_demo(mosquitto, tmp_path):
    ui = free_port()
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc, _ = start(CLI + ["demo", "--duration", "120", "--cpython", "1", "--micropython", "1", "--master", "local[1]",
                           "--ui", str(ui)], "queries:", timeout=240, env=env)
    code, procs, held = sigterm_leaves_nothing(proc, settle=2.0, timeout=120, ports=(ui,))
    assert len(procs) >= 4 and ui in held       # mosquitto, agents, the Spark JVM
