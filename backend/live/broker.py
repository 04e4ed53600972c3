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
# The broker's limits (mosquitto.conf(5)); README "Security" says why each number.
# max_packet_size: the largest legitimate message is the backend's (an answer or a spec naming sources,
# about 70 bytes a source name at most); a device's is at most codec.MAX_PAYLOAD (4096) bytes plus its
# topic. A client sending a larger packet is disconnected.
MAX_PACKET = 256 * 1024
MAX_INFLIGHT = 20           # QoS 1 messages in flight to one client (Mosquitto's default)
# QoS 1 messages queued for one client beyond those: the backend's session holds the whole fleet's uplinks
# while it reconnects, and a device's its controls while it is offline
MAX_QUEUED = 20000


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


def free_port(host="127.0.0.1", taken=()):
    """A port free on ``host`` now, none of ``taken`` (the OS may hand a just-closed port out again)."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in taken:
            return port


class Service:
    """A process ``start()`` launches (returning the service) and ``stop()`` ends; as a context manager it is
    stopped when the block ends and also when its start fails half-way (no process is left behind)."""

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()


def acl_text(fleet):
    """The device listener's ACL: a login (a device, a gateway, a sensor behind a gateway) writes only its
    own up/state and reads only its own ctl."""
    return "\n".join([
        "pattern write %s" % topics.device(fleet, "%u", "up"),
        "pattern write %s" % topics.device(fleet, "%u", "state"),
        "pattern read %s" % topics.device(fleet, "%u", "ctl"),
        "",
    ])


def backend_acl_text(fleet):
    """The backend listener's ACL: the backend reads and writes the whole fleet."""
    return "\n".join(["user %s" % BACKEND_USER, "topic readwrite %s" % topics.fleet_all(fleet), ""])


def endpoint(cred, user=BACKEND_USER):
    """``(host, port)`` where ``user`` connects, from a credentials.json: the backend listener for the
    backend, the device listener for everyone else (one ``port`` for both on a broker of one's own)."""
    return cred["host"], cred["port"] if user == BACKEND_USER else cred.get("device_port") or cred["port"]


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


class Broker(Service):
    """A Mosquitto process for one fleet: ``with Broker(dir, "f1", ["d1", "d2"]) as b: b.credentials("d1")``."""

    def __init__(self, directory, fleet, devices, port=None, tls=False, host="127.0.0.1", verbose=False,
                 gateways=None, sources=None, device_port=None, max_packet=MAX_PACKET, autosave=None):
        self.directory = os.path.abspath(directory)
        self.fleet = fleet
        # gateway -> its sensors; each sensor has a login of its own, which only its gateway holds
        self.gateways = {g: list(s) for g, s in (gateways or {}).items()}
        self.devices = list(devices) + [g for g in sorted(self.gateways) if g not in devices]
        self.sources = {d: list(v) for d, v in (sources or {}).items()}   # the registry: device -> its sources
        self.host = host
        self.port = port                    # the backend listener: the backend's login only, any client id
        self.device_port = device_port      # devices, gateways, sensors: client id = login (no takeover)
        self.max_packet = max_packet
        # None: the persistence file is saved after every change (crash-safe, as below); a number: every that
        # many seconds (the file holds every retained answer, so saving it per change costs O(queries) each:
        # ~80 saves/s with 10,000 retained answers, the bench's limit at 50,000 devices)
        if autosave is not None and not (isinstance(autosave, (int, float)) and not isinstance(autosave, bool)
                                         and autosave > 0):
            raise ValueError("autosave must be a number of seconds > 0 or None, got %r" % (autosave,))
        self.autosave = autosave
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
        sensors = [s for g in sorted(self.gateways) for s in self.gateways[g]]
        logins = self.devices + [s for s in sensors if s not in self.devices]
        for d in logins + list(self.sources):
            if d == BACKEND_USER or "/" in d or "+" in d or "#" in d or ":" in d or not d:
                raise ValueError("invalid device name %r" % d)
        unknown = [d for d in self.sources if d not in logins]
        if unknown:
            raise ValueError("sources given for %s, which %s no login here" % (", ".join(unknown),
                                                                             "has" if len(unknown) == 1 else "have"))
        for u in [BACKEND_USER] + logins:
            self.passwords[u] = old.get("users", {}).get(u) or secrets.token_urlsafe(18)
        if self.port is None:
            self.port = old.get("port") or free_port(self.host)
        if self.device_port is None:
            self.device_port = old.get("device_port") or free_port(self.host, (self.port,))
        if self.tls and self.tls_port is None:
            self.tls_port = old.get("tls_port") or free_port(self.host, (self.port, self.device_port))
        files = {}
        for name, users, acl in (("backend", [BACKEND_USER], backend_acl_text(self.fleet)),
                                 ("devices", logins, acl_text(self.fleet))):
            pw = files[name] = os.path.join(self.directory, "passwd-" + name), os.path.join(self.directory, "acl-" + name)
            fd = os.open(pw[0], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.writelines("%s:%s\n" % (u, self.passwords[u]) for u in users)
            if users:       # (mosquitto_passwd refuses an empty file: a fleet whose devices are registered later)
                subprocess.run([passwd, "-U", pw[0]], check=True, capture_output=True)   # hash in place
            with open(pw[1], "w") as f:
                f.write(acl)
        lines = [
            "# generated by backend/live/broker.py for fleet %s" % self.fleet,
            # Each listener has its own logins: devices cannot log in on the backend's, where client ids are
            # free (the backend's components each have their own); on the devices' a client id is its login,
            # so no device can take another's id and knock it off (mosquitto.conf(5) use_username_as_clientid)
            "per_listener_settings true",
            "max_packet_size %d" % self.max_packet,
            "max_inflight_messages %d" % MAX_INFLIGHT,
            "max_queued_messages %d" % MAX_QUEUED,
            "persistence true",
            "persistence_location %s/" % os.path.join(self.directory, "db"),
            # save after every change (queued QoS 1 message, retained message, subscription). Mosquitto
            # saves at the end of its main loop, after that loop's PUBACKs went out (no setting saves
            # before acknowledging), so a SIGKILL loses at most what it acknowledged in its last loop:
            # that instant lies in the live coordinator's link loss (gone from λ before it) and every device
            # re-centres with its birth after the restart (tests/live/test_live_faults.py)
            "autosave_on_changes %s" % ("true" if self.autosave is None else "false"),
            "autosave_interval %d" % (1 if self.autosave is None else max(1, round(self.autosave))),
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
        def listener(port, name):
            out = ["", "listener %d %s" % (port, self.host), "allow_anonymous false",
                   "password_file %s" % files[name][0], "acl_file %s" % files[name][1]]
            return out + (["use_username_as_clientid true"] if name == "devices" else [])
        lines += listener(self.port, "backend") + listener(self.device_port, "devices")
        if self.tls:
            certs = os.path.join(self.directory, "certs")
            if not os.path.exists(os.path.join(certs, "server.crt")):
                os.makedirs(certs, exist_ok=True)
                make_certificates(certs)
            lines += listener(self.tls_port, "devices") + [
                "cafile %s" % os.path.join(certs, "ca.crt"),
                "certfile %s" % os.path.join(certs, "server.crt"),
                "keyfile %s" % os.path.join(certs, "server.key"),
                "tls_version tlsv1.2"]
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        info = {"fleet": self.fleet, "host": self.host, "port": self.port, "device_port": self.device_port,
                "tls_port": self.tls_port, "ca": self.ca_file if self.tls else None, "users": self.passwords,
                "sources": self.sources, "gateways": self.gateways, "max_packet": self.max_packet}
        fd = os.open(self.credentials_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(info, f, indent=1)

    @property
    def ca_file(self):
        return os.path.join(self.directory, "certs", "ca.crt")

    def credentials(self, device):
        """``(username, password)`` of a device, or of the backend with ``BACKEND_USER``."""
        return device, self.passwords[device]

    def port_for(self, user):
        """The listener ``user`` logs in on: the backend's for the backend, the devices' for everyone else."""
        return self.port if user == BACKEND_USER else self.device_port

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
        ports = [p for p in (self.port, self.device_port, self.tls_port) if p]
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


def parse_sources(items):
    """``["dev1=t1,t2", ...]`` (``--source``) -> ``{"dev1": ["t1", "t2"]}``."""
    out = {}
    for item in items or []:
        device, sep, names = item.partition("=")
        names = [n for n in names.split(",") if n]
        if not sep or not device or not names:
            raise ValueError("--source wants DEVICE=SOURCE[,SOURCE...], got %r" % item)
        out.setdefault(device, []).extend(names)
    return out


def broker_main(args):
    """``quietfleet broker``: run Mosquitto in the foreground for a fleet until SIGINT/SIGTERM, which stop
    it (its port free again). ``args`` has ``dir``, ``fleet``, ``devices`` (a count or a list of names), and
    optional ``port``, ``device_port``, ``tls``, ``source`` (the registry: ``DEVICE=SOURCE,...`` items)."""
    import signal
    devices = args.devices
    if isinstance(devices, int):
        devices = ["dev%d" % i for i in range(1, devices + 1)]
    try:
        broker = Broker(args.dir, args.fleet, devices, port=getattr(args, "port", None),
                        device_port=getattr(args, "device_port", None), tls=getattr(args, "tls", False),
                        sources=parse_sources(getattr(args, "source", None)))
        broker.generate()
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        signal.signal(signal.SIGINT, lambda *_: stop.append(1))
        broker.start()
    except (BrokerError, ValueError, OSError) as e:
        print("quietfleet broker: %s" % e, file=sys.stderr)
        return 2
    print("mosquitto for fleet %s: devices on %s:%d%s, backend on %s:%d" % (
        broker.fleet, broker.host, broker.device_port, " (TLS on %d)" % broker.tls_port if broker.tls else "",
        broker.host, broker.port))
    print("credentials: %s (log: %s)" % (broker.credentials_file, broker.log))
    sys.stdout.flush()
    while not stop and broker.running():
        time.sleep(0.1)
    code = broker.proc.returncode if not stop else 0
    broker.stop()
    return code or 0
