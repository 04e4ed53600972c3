"""``quietfleet demo``: the live main job (DESIGN.md §1): broker, bridge, Spark job and an emulated fleet.

Starts Mosquitto with per-device credentials, the backend (bridge + Spark Structured Streaming job,
``local[*]``), CPython and MicroPython agents on random-walk temperature and humidity signals,
registers example queries on their retained ``spec`` topics, shows the answers as they are
published with their guarantees, and ends with the messages sent against send-everything and plain
deadband (replayed offline over the very same readings) and the violations against the agents'
ground-truth logs. Everything it starts is stopped and its temporary folder removed.
"""
import json
import math
import os
import queue
import shutil
import signal
import sys
import tempfile
import time

from backend import host
from backend.live.broker import Broker, BrokerError, find_mosquitto
from backend.live.checker import deadband_reports, explain, time_of, violations
from backend.live.fleet import HEAP, Fleet, micropython_available
from edge.core import codec, topics

FLEET = "demo"


# The rooms of a small site (temperature °C, its step per 0.1 s reading, humidity %RH, its step): offices
# that differ by orientation and occupancy, and the technical rooms every site has. Room dynamics differ
# (a server room swings with load, a cold store with its door), which a uniform deadband cannot use.
ROOMS = [("office-north", 20.5, 0.03, 45.0, 0.15), ("office-south", 22.5, 0.09, 41.0, 0.35),
         ("meeting", 21.5, 0.12, 48.0, 0.45), ("office-east", 21.0, 0.05, 52.0, 0.2),
         ("office-west", 22.0, 0.07, 44.0, 0.25), ("reception", 20.0, 0.04, 50.0, 0.1),
         ("server-room", 27.0, 0.1, 30.0, 0.1), ("cold-store", 4.0, 0.08, 80.0, 0.3),
         ("workshop", 15.0, 0.06, 60.0, 0.3)]
QUIET = 1.5         # s without a control message after which the filters count as installed
SETTLE_MAX = 60.0   # s after registration at which counting starts regardless
STALL = 180         # s without a new batch or a newly known source after which the fleet did not come up
OFFICES = 6         # the first six rooms are where people work


def fleet_plan(cpython, micropython, seed=11):
    """[(kind, device, sources)]: device i sits in room i (``ROOMS``, repeated beyond nine devices) with a
    temperature ``t<i>`` and a humidity ``h<i>`` source (a micro:bit, added by ``run``, carries one
    temperature-like walk ``s_<name>``)."""
    plan = []
    for i in range(cpython + micropython):
        kind = "cpython" if i < cpython else "micropython"
        name = "%s%d" % ("pi" if kind == "cpython" else "mcu", i)
        _, temp, t_step, hum, h_step = ROOMS[i % len(ROOMS)]
        plan.append((kind, name, [
            {"name": "t%d" % i, "kind": "walk", "start": temp, "step": t_step, "seed": seed + 2 * i},
            {"name": "h%d" % i, "kind": "walk", "start": hum, "step": h_step, "seed": seed + 2 * i + 1}]))
    return plan


def example_queries(n, bits=()):
    """A site's standing queries: comfort in the offices, alarms over every room, humidity, one gradient."""
    temps, hums = ["t%d" % i for i in range(n)], ["h%d" % i for i in range(n)]
    offices = [t for i, t in enumerate(temps) if i % len(ROOMS) < OFFICES]
    extra = [{"id": "microbits", "kind": "avg", "sources": ["s_" + b for b in bits], "precision": 1.0}] if bits else []
    return extra + [
        {"id": "office_temp", "kind": "avg", "sources": offices, "precision": 0.4},
        {"id": "hottest", "kind": "max", "sources": temps, "precision": 0.8},
        {"id": "coldest", "kind": "min", "sources": temps, "precision": 0.8},
        {"id": "total_humidity", "kind": "sum", "sources": hums, "precision": 4.0 * n ** 0.5},
        {"id": "gradient", "kind": "sum", "sources": temps[:2], "weights": [1, -1], "precision": 0.4},
        {"id": "comfortable", "kind": "count", "sources": hums, "range": [40, 60], "precision": 0},
    ]


def site_workload(folder, duration=90.0, cpython=6, micropython=3, rate=10.0):
    """The live demo's rooms and queries as a simulator workload: each source's readings from the agents'
    own walk (``edge.runtime.sensors.RandomWalk``, same seeds) written to ``folder``/site.csv, the
    queries registered one after another as the demo does, a LAN's delays."""
    from edge.runtime.sensors import RandomWalk
    plan = fleet_plan(cpython, micropython)
    rows = []
    for _, _, sources in plan:
        for s in sources:
            walk = RandomWalk(s["name"], 0.0, 1.0 / rate, s["start"], s["step"], s["seed"])
            rows += [(k / rate, s["name"], walk.read(0)) for k in range(int(duration * rate) + 1)]
    rows.sort(key=lambda r: (r[0], r[1]))
    path = os.path.join(folder, "site.csv")
    with open(path, "w") as fh:
        fh.write("time,source,value\n")
        fh.writelines("%r,%s,%r\n" % r for r in rows)
    queries = example_queries(len(plan))
    return {"seed": 1, "duration": duration, "sources": {"trace": path, "per_device": 2}, "queries": [],
            "events": [{"time": 1.0 + 0.05 * j, "add_query": q} for j, q in enumerate(queries)],
            "network": {"delay": 0.05, "jitter": 0.05}, "params": {"period": 5, "shrink": 0.05}}


class Observer:
    """A backend-side MQTT client that counts uplink/ctl messages and keeps the latest answers."""

    def __init__(self, broker):
        import paho.mqtt.client as mqtt
        self.counts = {"up": 0, "ctl": 0, "state": 0, "answer": 0}
        self.kinds = {}         # control messages by kind (width, ack, probe, ...)
        self.answers = {}
        self.last_ctl = time.monotonic()        # when the latest control message was seen
        self.inbox = queue.Queue()
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="qf-demo-observer", protocol=mqtt.MQTTv311)
        c.username_pw_set(*broker.credentials("backend"))
        c.on_connect = lambda cl, u, f, rc, p: cl.subscribe(topics.fleet_all(broker.fleet), qos=1)
        c.on_message = lambda cl, u, m: self.inbox.put((m.topic, m.payload))
        c.connect(broker.host, broker.port, keepalive=30)
        c.loop_start()
        self.client = c

    def pump(self):
        while True:
            try:
                topic, payload = self.inbox.get_nowait()
            except queue.Empty:
                return
            t = topics.parse(topic)
            kind = t[3] if t else None
            if kind in self.counts:
                self.counts[kind] += 1
            if kind == "ctl":
                self.last_ctl = time.monotonic()
                try:
                    what = codec.decode(payload)[0]
                except codec.CodecError:
                    what = "malformed"
                self.kinds[what] = self.kinds.get(what, 0) + 1
            if kind == "answer" and payload:
                self.answers[t[2]] = json.loads(payload)

    def publish_spec(self, spec):
        body = {k: v for k, v in spec.items() if k != "id"}
        return self.client.publish(topics.query(FLEET, spec["id"], "spec"), json.dumps(body), qos=1, retain=True)

    def close(self):
        self.client.disconnect()
        self.client.loop_stop()


def _fmt(a):
    if a is None:
        return "-"
    if "error" in a:
        return "(%s)" % a["error"]
    lo, hi = (float(x) if x in ("inf", "-inf") else x for x in (a.get("lo"), a.get("hi")))    # strict JSON
    g = a.get("guarantee", "")
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
        return "[%.2f, %.2f] %s" % (lo, hi, g)
    return "%s %s" % ({k: v for k, v in a.items() if k not in ("query", "time", "guarantee")}, g)


def microbits_available():
    """True when QEMU and the micro:bit firmware are installed (the demo then adds micro:bits)."""
    from firmware.microbit import build, qemu
    try:
        qemu.qemu()
        return True
    except build.MicrobitError:
        return False


def run(duration=90.0, cpython=6, micropython=3, microbit=2, protocol=None, latency=host.LIVE_LATENCY, period=5.0, shrink=0.05,
        trigger=0.25, master="local[*]", workdir=None, spark=None, out=print, show_every=5.0, settle=5.0,
        ui=None):
    """Run the live demo; returns a result dict (messages, violations, answers, the work folder). Messages
    are counted from when the queries' filters have reached the devices (at least ``settle`` s after the
    queries were registered, every query answered, no control message for ``QUIET`` s): the registration transient (every reading reported until then) is the same for any
    protocol, and the offline deadband replay cannot reproduce it."""
    protocol = protocol or host.SETTINGS["protocol"]
    find_mosquitto()
    if micropython and not micropython_available():
        out("MicroPython unix port not found: running CPython agents only")
        cpython, micropython = cpython + micropython, 0
    own = workdir is None
    workdir = os.path.abspath(workdir or tempfile.mkdtemp(prefix="quietfleet-demo-"))
    plan = fleet_plan(cpython, micropython)
    if microbit and not microbits_available():
        out("qemu-system-arm or the micro:bit firmware not found: no micro:bits (scripts/setup.sh installs them)")
        microbit = 0
    bits = ["b%d" % i for i in range(microbit)]
    gateways = {"g0": bits} if bits else {}
    devices, backend, broker, observer, fleet = [], None, None, None, None
    dash = None         # --ui: the dashboard (backend/ui), on [HOST:]PORT ``ui``
    from backend.spark.service import Backend
    from backend.spark import job
    try:
        sources = dict({name: [src["name"] for src in srcs] for _, name, srcs in plan},
                       **{b: ["s_" + b] for b in bits})
        broker = Broker(os.path.join(workdir, "broker"), FLEET, [name for _, name, _ in plan],
                        gateways=gateways, sources=sources).start()
        out("broker: mosquitto on %s:%d (devices), %d device logins, ACL per login, client id bound to its login, "
            "sources provisioned per device" % (broker.host, broker.device_port, len(plan) + len(bits)))
        observer = Observer(broker)
        from backend.ui import hooks as ui_hooks                                # --ui
        dash = ui_hooks.demo(ui, broker, observer, devices, out)                # --ui
        settings = host.settings(protocol=protocol, period=period, shrink=shrink, latency=latency, beat=host.LIVE_BEAT,
                                 skew=host.LIVE_SKEW, registry=broker.credentials_file)
        out("backend: bridge -> spool -> Spark Structured Streaming (%s, transformWithStateInPandas, RocksDB), "
            "protocol %s, latency tolerance %.2fs, trigger %.2fs" % (master, protocol, latency, trigger))
        t0 = time.monotonic()
        backend = Backend(os.path.join(workdir, "backend"), FLEET, broker.host, broker.port,
                          broker.credentials("backend")[1], settings, master=master, trigger=trigger,
                          spark=spark).start()
        out("backend: Spark up in %.1fs" % (time.monotonic() - t0))
        fleet = Fleet(broker, os.path.join(workdir, "fleet"), heap=HEAP, width=0.0, period=0.1)
        for kind, name, sources in plan:
            devices.append(fleet.start(kind, name, sources))
        if bits:
            devices += fleet.start_microbits(bits, seed=7)
        out("fleet: %d CPython agents (paho) + %d MicroPython agents (umqtt, %s heap) + %d micro:bits (QEMU, "
            "behind a gateway), %d sources at 10 Hz" % (cpython, micropython, HEAP, len(bits), 2 * len(plan) + len(bits)))
        n_sources = 2 * len(plan) + len(bits)
        # wait for every source's birth; a loaded machine's first batches (Python workers starting) can take
        # minutes, so give up only after STALL s without a new batch or a newly known source
        seen, moved, told = None, time.monotonic(), time.monotonic()
        while True:
            st = backend.status()
            g = st and st["groups"].get(FLEET)
            if g and g["sources_known"] >= n_sources:
                break
            backend.raise_if_failed()
            dead = [d for d in fleet.devices.values() if d.proc.poll() is not None]
            if dead:
                raise RuntimeError("agent %s exited (log in %s)" % (dead[0].name, fleet.folder))
            now = time.monotonic()
            mark = (st and st.get("batch"), g and g["sources_known"])
            if mark != seen:
                seen, moved = mark, now
            elif now - moved > STALL:
                raise RuntimeError("agents did not come up: %s of %d sources known, no progress for %ds"
                                   % (mark[1] or 0, n_sources, STALL))
            if now - told >= 15:
                told = now
                out("waiting for the agents' births: %s of %d sources known, batch %s"
                    % (mark[1] or 0, n_sources, mark[0]))
            time.sleep(0.2)
        queries = example_queries(len(plan), bits)
        for q in queries:
            observer.publish_spec(q).wait_for_publish(5)
        out("queries: %s registered on %s (retained)" % (", ".join(q["id"] for q in queries),
                                                          topics.query(FLEET, "<id>", "spec")))
        # count from the moment every filter is installed: at least ``settle`` s, every query answered
        # and no control message for QUIET s (the install burst can outlast ``settle`` on a loaded machine)
        registered = time.monotonic()
        while True:
            time.sleep(0.2)
            observer.pump()
            now = time.monotonic()
            installed = (now - registered >= settle and now - observer.last_ctl >= QUIET
                         and all(q["id"] in observer.answers for q in queries))
            if installed or now - registered > SETTLE_MAX:
                break
        settle = time.monotonic() - registered
        t_reg = time.time()
        if dash is not None:                    # --ui: totals from here on, as the closing table counts
            dash.provider.start(t_reg, queries)     # --ui
        observer.counts = dict.fromkeys(observer.counts, 0)   # compare from the installed filters on
        observer.kinds = {}
        start = time.monotonic()
        next_show = start + show_every
        while time.monotonic() - start < duration:
            time.sleep(0.2)
            backend.raise_if_failed()
            observer.pump()
            if time.monotonic() >= next_show:
                next_show += show_every
                st = backend.status() or {"groups": {}}
                g = st["groups"].get(FLEET, {})
                out("[%5.1fs] batch %s, %d records applied, uplink %d, ctl %d, late %s, online %s/%d" % (
                    time.monotonic() - start, st.get("batch"), g.get("records", 0), observer.counts["up"],
                    observer.counts["ctl"], g.get("stats", {}).get("late"), g.get("online"), n_sources))
                for q in queries:
                    out("    %-15s %s" % (q["id"], _fmt(observer.answers.get(q["id"]))))
        out("stopping the fleet ...")
        fleet.stop_all()
        backend.drain(30)
        observer.pump()
        readings = [r for d in devices for r in d.readings()]
        window = [r for r in readings if r[0] >= t_reg]
        answers = job.read_answers(backend.directory)
        status = backend.status()["groups"][FLEET]
        end = min(max(r[0] for r in d.readings()) for d in devices)
        wrong, finals = {}, {}
        checked = violations(queries, readings, answers, end, wrong, finals)
        explain(queries, readings, answers, wrong, out)
        result = {"protocol": protocol, "dir": workdir, "samples": len(window), "uplink": observer.counts["up"],
                  "ctl": observer.counts["ctl"], "ctl_kinds": observer.kinds, "deadband": deadband_reports(queries, readings, t_reg),
                  "violations": sum(v for v, _, _ in checked.values()) + sum(f["final_violations"] for f in finals.values()),
                  "per_query": checked, "finals": finals,
                  "late": status["stats"]["late"], "settle": settle, "answers": len(answers), "queries": queries,
                  "agents": {d.name: d.stats for d in devices}}
        _table(result, out)
        return result
    finally:
        if dash is not None:        # --ui
            dash.stop()             # --ui
        if fleet is not None:
            fleet.stop_all()
        if observer is not None:
            observer.close()
        if backend is not None:
            backend.stop()
            if spark is None and backend.spark is not None:
                backend.spark.stop()
        if broker is not None:
            broker.stop()
        if own:
            shutil.rmtree(workdir, ignore_errors=True)


def _table(r, out):
    """The closing table: QuietFleet against plain deadband on the same readings, uplink and in total."""
    (dead, dead_ctl), ours = r["deadband"], r["uplink"]
    dead_total, ours_total = dead + dead_ctl, r["uplink"] + r["ctl"]
    out("")
    out("Messages from %.1f s after query registration (every filter installed) to the end of the run:" % r["settle"])
    out("| | uplink | vs plain deadband | uplink + control | vs plain deadband |")
    out("|---|---:|---:|---:|---:|")
    out("| send-everything (every reading) | %d | %.2f | %d | %.2f |" % (
        r["samples"], r["samples"] / max(dead, 1), r["samples"], r["samples"] / max(dead_total, 1)))
    out("| plain deadband (same readings and queries, replayed offline) | %d | 1.00 | %d | 1.00 |" % (
        dead, dead_total))
    out("| QuietFleet %s, live over MQTT | %d | %.2f | %d | %.2f |" % (
        r["protocol"], ours, ours / max(dead, 1), ours_total, ours_total / max(dead_total, 1)))
    out("")
    out("control messages sent by the backend %d (%s), answer changes %d, late reports %d"
        % (r["ctl"], ", ".join("%s %d" % kv for kv in sorted(r["ctl_kinds"].items(), key=lambda kv: -kv[1])) or "none",
           r["answers"], r["late"]))
    out("| query | violations | violation s | degraded s | final answers (degraded) | final violations |")
    out("|---|---:|---:|---:|---:|---:|")
    for qid, (v, vt, dt) in r["per_query"].items():
        f = r["finals"].get(qid) or {"finals": 0, "final_degraded": 0, "final_violations": 0}
        out("| %s | %d | %.3f | %.1f | %d (%d) | %d |" % (qid, v, vt, dt, f["finals"], f["final_degraded"],
                                                        f["final_violations"]))
    out("Guarantees against the agents' ground truth: %s." % (
        "all held (0 violations)" if r["violations"] == 0 else "%d VIOLATIONS" % r["violations"]))


def _interrupt(*_):
    raise KeyboardInterrupt


def main(args):
    """Run the demo with Spark's own console chatter (its JVM and Python workers write to the
    inherited stdout/stderr) sent to a log file that is kept only if something fails."""
    console = os.fdopen(os.dup(1), "w", buffering=1)
    saved_err = os.dup(2)
    fd, log = tempfile.mkstemp(prefix="quietfleet-demo-spark-", suffix=".log")
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    code = 1
    signal.signal(signal.SIGTERM, _interrupt)       # SIGTERM stops the demo as Ctrl-C does: children too
    try:
        r = run(duration=args.duration, cpython=args.cpython, micropython=args.micropython,
                protocol=args.protocol, latency=host.LIVE_LATENCY if args.latency is None else args.latency,
                master=args.master, ui=getattr(args, "ui", None),      # --ui
                out=lambda line: console.write(line + "\n"))
        code = 0 if r["violations"] == 0 else 1
    except BrokerError as e:
        console.write("quietfleet demo: %s\n" % e)
        code = 2
    except RuntimeError as e:
        console.write("quietfleet demo: %s\n" % e)
    except KeyboardInterrupt:
        console.write("quietfleet demo: stopped\n")
        code = 130
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(console.fileno(), 1)
        os.dup2(saved_err, 2)
        os.close(saved_err)
        if code == 0:
            os.remove(log)
        else:
            console.write("Spark and agent log: %s\n" % log)
        console.close()
    return code
