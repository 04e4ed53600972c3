"""Run a private Mosquitto broker with per-device credentials and the ACL of DESIGN.md §3 and §9.

The product ships Mosquitto, not an embedded fallback: amqtt leaked retained messages across its
ACL (§9). ``Broker`` generates config, password file, ACL and (optionally) a TLS CA and server
certificate into one directory, runs ``mosquitto -c`` on a loopback port and stops it again.
"""
import atexit
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time

from edge.core import topics

INSTALL_HINT = "Mosquitto is required: install it with `apt-get install mosquitto` (Debian/Ubuntu)."
BACKEND_USER = "backend"


class BrokerError(RuntimeError):
    """Mosquitto is missing, or did not start."""


def _find(name):
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/sbin")
    if path is None:
        raise BrokerError("%s not found. %s" % (name, INSTALL_HINT))
    return path


def find_mosquitto():
    """Paths of ``mosquitto`` and ``mosquitto_passwd``; BrokerError saying how to install if absent."""
    return _find("mosquitto"), _find("mosquitto_passwd")


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def acl_text(fleet, gateways=None):
    """ACL: a device writes only its own up/state and reads only its own ctl; backend reads/writes the fleet;
    a gateway (``gateways``: {gateway: [sensor, ...]}) also has exactly those rights on each of its sensors."""
    lines = ["user %s" % BACKEND_USER, "topic readwrite %s" % topics.fleet_all(fleet), ""]
    for gw in sorted(gateways or {}):
        lines.append("user %s" % gw)
        for s in gateways[gw]:
            lines += ["topic write %s" % topics.device(fleet, s, "up"), "topic write %s" % topics.device(fleet, s, "state"),
                      "topic read %s" % topics.device(fleet, s, "ctl")]
        lines.append("")
    return "\n".join(lines + [
        "pattern write %s" % topics.device(fleet, "%u", "up"),
        "pattern write %s" % topics.device(fleet, "%u", "state"),
        "pattern read %s" % topics.device(fleet, "%u", "ctl"),
        "",
    ])


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(directory, days=825):
    """CA and a server certificate for 127.0.0.1/localhost, made with the openssl command line."""
    _find("openssl")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", str(days), "-subj", "/CN=QuietFleet CA",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=directory)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
             "-keyout", "server.key", "-out", "server.csr", cwd=directory)
    with open(os.path.join(directory, "server.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", str(days), "-extfile", "server.ext", "-out", "server.crt", cwd=directory)
    return {name: os.path.join(directory, name + ".crt") for name in ("ca", "server")}


class Broker:
    """A Mosquitto process for one fleet: ``with Broker(dir, "f1", ["d1", "d2"]) as b: b.credentials("d1")``."""

    def __init__(self, directory, fleet, devices, port=None, tls=False, host="127.0.0.1", verbose=False,
                 gateways=None):
        self.directory = os.path.abspath(directory)
        self.fleet = fleet
        self.gateways = {g: list(s) for g, s in (gateways or {}).items()}   # gateway -> its sensors (no login)
        self.devices = list(devices) + [g for g in sorted(self.gateways) if g not in devices]
        self.host = host
        self.port = port
        self.tls = tls
        self.tls_port = None
        self.verbose = verbose
        self.proc = None
        self.passwords = {}
        self.conf = os.path.join(self.directory, "mosquitto.conf")
        self.log = os.path.join(self.directory, "mosquitto.log")
        self.credentials_file = os.path.join(self.directory, "credentials.json")

    # -- generation -------------------------------------------------------------
    def generate(self):
        """Write config, passwords, ACL (and certificates); reuse passwords and ports already on disk."""
        _, passwd = find_mosquitto()
        os.makedirs(os.path.join(self.directory, "db"), exist_ok=True)
        old = {}
        if os.path.exists(self.credentials_file):
            with open(self.credentials_file) as f:
                old = json.load(f)
        users = {BACKEND_USER: None}
        for d in self.devices + [s for g in self.gateways.values() for s in g]:
            if d == BACKEND_USER or "/" in d or "+" in d or "#" in d or ":" in d or not d:
                raise ValueError("invalid device name %r" % d)
        for d in self.devices:
            users[d] = None
        for u in users:
            self.passwords[u] = old.get("users", {}).get(u) or secrets.token_urlsafe(18)
        if self.port is None:
            self.port = old.get("port") or free_port(self.host)
        if self.tls and self.tls_port is None:
            self.tls_port = old.get("tls_port") or free_port(self.host)
        pwfile = os.path.join(self.directory, "passwd")
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.writelines("%s:%s\n" % (u, p) for u, p in self.passwords.items())
        subprocess.run([passwd, "-U", pwfile], check=True, capture_output=True)   # hash in place
        with open(os.path.join(self.directory, "acl"), "w") as f:
            f.write(acl_text(self.fleet, self.gateways))
        lines = [
            "# generated by backend/live/broker.py for fleet %s" % self.fleet,
            "per_listener_settings false",
            "allow_anonymous false",
            "password_file %s" % pwfile,
            "acl_file %s" % os.path.join(self.directory, "acl"),
            "persistence true",
            "persistence_location %s/" % os.path.join(self.directory, "db"),
            # save after every change (queued QoS 1 message, retained message, subscription). Mosquitto
            # saves at the end of its main loop, after that loop's PUBACKs went out (no setting saves
            # before acknowledging), so a SIGKILL loses at most what it acknowledged in its last loop:
            # that instant lies in the live coordinator's link loss (gone from λ before it) and every device
            # re-centres with its birth after the restart (tests/live/test_live_faults.py)
            "autosave_on_changes true",
            "autosave_interval 1",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
            "connection_messages true",
            "log_timestamp true",
        ]
        if self.verbose:
            lines.append("log_type all")
        if os.geteuid() == 0:
            # As root mosquitto drops to the `mosquitto` user, which cannot read files under a
            # private (0700) directory such as a test's tmp_path; stay root for this local broker.
            lines.append("user root")
        lines += ["", "listener %d %s" % (self.port, self.host)]
        if self.tls:
            certs = os.path.join(self.directory, "certs")
            if not os.path.exists(os.path.join(certs, "server.crt")):
                os.makedirs(certs, exist_ok=True)
                make_certificates(certs)
            lines += ["", "listener %d %s" % (self.tls_port, self.host),
                      "cafile %s" % os.path.join(certs, "ca.crt"),
                      "certfile %s" % os.path.join(certs, "server.crt"),
                      "keyfile %s" % os.path.join(certs, "server.key"),
                      "tls_version tlsv1.2"]
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        info = {"fleet": self.fleet, "host": self.host, "port": self.port, "tls_port": self.tls_port,
                "ca": self.ca_file if self.tls else None, "users": self.passwords}
        fd = os.open(self.credentials_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(info, f, indent=1)

    @property
    def ca_file(self):
        return os.path.join(self.directory, "certs", "ca.crt")

    def credentials(self, device):
        """``(username, password)`` of a device, or of the backend with ``BACKEND_USER``."""
        return device, self.passwords[device]

    # -- process ----------------------------------------------------------------
    def start(self, timeout=10.0):
        mosquitto, _ = find_mosquitto()
        if not self.passwords:
            self.generate()
        logf = open(self.log, "ab")
        self.proc = subprocess.Popen([mosquitto, "-c", self.conf], stdout=logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        logf.close()
        atexit.register(self.stop)      # never leave a broker behind when the caller crashes
        deadline = time.monotonic() + timeout
        ports = [p for p in (self.port, self.tls_port) if p]
        while ports:
            if self.proc.poll() is not None:
                raise BrokerError("mosquitto exited with %s: %s" % (self.proc.returncode, self._log_tail()))
            try:
                socket.create_connection((self.host, ports[0]), timeout=0.2).close()
                ports.pop(0)
                continue
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError("mosquitto did not listen on %s within %.0fs: %s"
                                  % (ports[0], timeout, self._log_tail()))
            time.sleep(0.02)
        return self

    def _log_tail(self, n=800):
        try:
            with open(self.log, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout=5.0):
        """SIGTERM (mosquitto saves its persistence file), then SIGKILL if it lingers."""
        if self.proc is None:
            return
        atexit.unregister(self.stop)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self):
        """Stop and start on the same ports; retained messages and persistent sessions survive."""
        self.stop()
        return self.start()

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def broker_main(args):
    """``quietfleet broker``: run Mosquitto in the foreground for a fleet. ``args`` has
    ``dir``, ``fleet``, ``devices`` (a count or a list of names), and optional ``port``, ``tls``."""
    devices = args.devices
    if isinstance(devices, int):
        devices = ["dev%d" % i for i in range(1, devices + 1)]
    try:
        broker = Broker(args.dir, args.fleet, devices, port=getattr(args, "port", None),
                        tls=getattr(args, "tls", False))
        broker.generate()
    except BrokerError as e:
        print(e, file=sys.stderr)
        return 2
    print("mosquitto for fleet %s on %s:%d%s" % (broker.fleet, broker.host, broker.port,
                                                   " (TLS on %d)" % broker.tls_port if broker.tls else ""))
    print("credentials: %s" % broker.credentials_file)
    sys.stdout.flush()
    mosquitto, _ = find_mosquitto()
    try:
        return subprocess.call([mosquitto, "-c", broker.conf])
    except KeyboardInterrupt:
        return 0
