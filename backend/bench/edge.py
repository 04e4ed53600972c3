"""Edge cost benchmark (DESIGN.md §8): µs per sample and memory of the filter core and the agent, per agent kind.

Kinds: CPython, the MicroPython unix port (precompiled .mpy), and CPython on arm64 under QEMU
user-mode emulation (Raspberry Pi class, when scripts/setup_arm64.sh has built the root). The same
portable timing script runs in each interpreter. Then the smallest MicroPython heap at which the
agent still runs its live scenario (birth, reports, config/filter/probe control traffic against
Mosquitto; its filters include deadband's, a move that forks the deadband meter's shadow and a SYNC back,
edge.core.meter) is found by bisection. ``metered_us``: a metered agent whose source was moved (its
deadband shadow checks every reading as well). ``python -m backend.bench.edge [--quick]`` prints the figures
next to the DESIGN targets.

The unix port is 64-bit: every object there is about twice its size on a board. The 32-bit figure
comes from a 32-bit, single-precision build of the same MicroPython (``scripts/build_mp32.sh``): the
agent's live heap after a collection and the smallest ``-X heapsize`` it runs in, loading the agent
as .mpy (a board's filesystem) and frozen into the image (firmware/manifest.py). There the agent
runs offline (its broker refuses it), so its outbox fills: the state is at its largest.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from backend.live import fleet as fleet_mod
from edge.core import topics
from firmware.build import MODULES, compile_modules

ROOT = fleet_mod.ROOT
TARGETS = {"filter_us": {"cpython": 5.0, "micropython": 50.0}, "heap": 32 * 1024}
MP32 = os.path.join(ROOT, "build", "mp32")
OFFLINE = {"fleet": "bench", "device": "m0", "password": "x", "host": "127.0.0.1", "port": 9, "period": 0.01,
           "width": 1.0, "outbox": 32, "run_for": 2, "sources": [{"name": "x", "kind": "walk", "step": 0.5, "seed": 3}]}

# Portable: runs unchanged under CPython and MicroPython. N samples of a seeded walk.
SCRIPT = r"""
import sys, gc, json
from array import array
try:
    from time import ticks_us, ticks_diff
except ImportError:
    from time import perf_counter
    def ticks_us():
        return int(perf_counter() * 1000000)
    def ticks_diff(a, b):
        return a - b
N = %d
if sys.implementation.name == "micropython":
    gc.collect(); m0 = gc.mem_alloc()
    import qfagent
    gc.collect(); mem = {"heap_agent_code": gc.mem_alloc() - m0}
else:
    import edge.runtime.cpython.runtime
    mem = {}
from edge.core.interval import IntervalFilter
from edge.agent import Agent
vals = array("d")
s = 12345
v = 0.0
for i in range(N):
    s ^= (s << 13) & 0xFFFFFFFF
    s ^= s >> 17
    s ^= (s << 5) & 0xFFFFFFFF
    v += (s / 4294967296.0 - 0.5)
    vals.append(v)
f = IntervalFilter(4.0)
f.recenter(0.0)
t = ticks_us()
for x in vals:
    if f.check(x):
        f.recenter(x)
filt = ticks_diff(ticks_us(), t) / N
gc.collect()
m1 = gc.mem_alloc() if sys.implementation.name == "micropython" else 0
a = Agent("d", ["x"], 1, 0, 4.0, 1000)     # a board's clock: integer milliseconds
a.start(0)
if m1:
    gc.collect()
    mem["heap_agent_state"] = gc.mem_alloc() - m1
t = ticks_us()
now = 1700000000000
for x in vals:
    now += 10
    a.handle_sample(now, 0, x)
agent = ticks_diff(ticks_us(), t) / N
# a metered agent (edge.core.meter) whose source was moved: its deadband shadow sees every reading too
from edge.core.meter import Meter
gc.collect()
m2 = gc.mem_alloc() if sys.implementation.name == "micropython" else 0
b = Agent("m", ["x"], 1, 0, 4.0, 1000)
b.start(0)
b.meter = Meter(1)
b.meter.fork(b, 0)
b.filters[0].set_width(6.0, 1)
if m2:
    gc.collect()
    mem["heap_metered_state"] = gc.mem_alloc() - m2
t = ticks_us()
now = 1700000000000
for x in vals:
    now += 10
    b.handle_sample(now, 0, x)
metered = ticks_diff(ticks_us(), t) / N
if sys.implementation.name != "micropython":
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            mem["rss_kb"] = int(line.split()[1])
print("QFBENCH" + json.dumps({"filter_us": filt, "agent_us": agent, "metered_us": metered, "reports": a.stats["reports"],
                              "mem": mem}))
"""


def _run(cmd, env, timeout=300):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    for line in r.stdout.splitlines():
        if line.startswith("QFBENCH"):
            return json.loads(line[7:])
    raise RuntimeError("%s failed: %s" % (cmd[0], (r.stderr or r.stdout)[-500:]))


def per_kind(n, mpy, arm64=True):
    out = {}
    env = dict(os.environ, PYTHONPATH=ROOT)
    out["cpython"] = _run([sys.executable, "-c", SCRIPT % n], env)
    out["micropython"] = _run([fleet_mod.micropython_binary(), "-X", "heapsize=16m", "-c", SCRIPT % n],
                              dict(os.environ, MICROPYPATH=mpy))
    if arm64:
        try:
            root = fleet_mod.arm64_root()
            lib = fleet_mod._arm64_pylib(tempfile.mkdtemp(prefix="qf-bench-"))
            env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + lib, PYTHONDONTWRITEBYTECODE="1")
            out["arm64 (qemu)"] = _run(["qemu-aarch64-static", "-L", root, os.path.join(root, "usr/bin/python3"),
                                        "-c", SCRIPT % max(n // 10, 1000)], env)
        except fleet_mod.FleetError as e:
            out["arm64 (qemu)"] = {"skipped": str(e)}
    return out


def _scenario(broker, folder, heap, mpy, seconds=3.0):
    """Run one heap-limited MicroPython agent through birth, reports and control traffic; its stats or None."""
    from edge.core import codec
    import paho.mqtt.client as mqtt
    fl = fleet_mod.Fleet(broker, folder, heap=heap, period=0.05, width=1.0)
    fl.mpy = mpy
    be = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-be", protocol=mqtt.MQTTv311)
    be.username_pw_set(*broker.credentials("backend"))
    births = []         # tokens of the device's births: controls must answer the latest

    def on_message(client, userdata, msg):
        try:
            kind, m = codec.decode(msg.payload)
        except codec.CodecError:
            return
        if kind == "birth" and m["first"] == 0:
            births.append((m["boot"] ^ m["seq"]) & 0xFFFFFFFF)
    be.on_message = on_message
    be.connect(broker.host, broker.port)
    be.subscribe("qf/%s/d/m0/state" % broker.fleet, qos=1)
    be.loop_start()
    d = fl.start("micropython", "m0", {"name": "x", "kind": "walk", "step": 0.5, "seed": 3, "period": 0.05})
    time.sleep(0.8)
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end and d.proc.poll() is None:
        i += 1
        to = births[-1] if births else 0
        for kind, fields in (
                ("config", {"seq": 3 * i, "inc": 1, "to": to, "period": 1000, "shrink": 0.1, "beat": 5000, "t0": 0,
                            "now": int(time.time() * 1000), "tick": int(time.time())}),
                # deadband's filter (METER), a move away from it (a deadband shadow forks), a SYNC back
                ("filter", {"src": 0, "epoch": i, "seq": 3 * i + 1, "inc": 1, "to": to, "width": 2.0 + (i % 3 == 1),
                            "ack": 1 | (0 if i % 3 == 1 else codec.METER) | (codec.SYNC if i % 3 == 0 else 0),
                            "cons": [{"l": 1.0, "u": 2.0}]}),
                ("probe", {"src": 0, "seq": 3 * i + 2, "inc": 1, "to": to, "probe": i})):
            be.publish(topics.device(broker.fleet, "m0", "ctl"), codec.encode(kind, fields), qos=1)
        time.sleep(0.1)
    stats = fl.stop("m0", signal.SIGINT)
    be.loop_stop()
    be.disconnect()
    return stats if stats and stats["reports"] > 0 and stats["probes"] > 0 else None


def smallest_heap(mpy, lo=24, hi=96, step=2):
    """Bisect the smallest ``-X heapsize`` (KB, multiple of ``step``) at which the scenario passes."""
    from backend.live.broker import Broker
    with tempfile.TemporaryDirectory() as tmp, Broker(os.path.join(tmp, "b"), "bench", ["m0"]) as broker:
        ok = _scenario(broker, os.path.join(tmp, "f%d" % hi), "%dk" % hi, mpy)
        if ok is None:
            return None, None
        best = (hi, ok)
        while hi - lo > step:
            mid = (lo + hi) // 2 // step * step
            st = _scenario(broker, os.path.join(tmp, "f%d" % mid), "%dk" % mid, mpy)
            if st is None:
                lo = mid
            else:
                hi, best = mid, (mid, st)
        return best


def _offline(binary, path, heap_kb):
    """Stats of the offline agent on ``binary`` with ``heap_kb`` KB, or None when it does not run."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "qf.json")
        with open(cfg, "w") as f:
            json.dump(OFFLINE, f)
        r = subprocess.run([binary, "-X", "heapsize=%dk" % heap_kb, "-m", "qfagent", cfg], cwd=tmp, timeout=60,
                           env=dict(os.environ, MICROPYPATH=path or ".frozen"), capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if line.startswith('{"stats"'):
            return json.loads(line)["stats"]
    return None


def heap_32bit(mpy):
    """Rows for the 32-bit single-precision port: ``{mode: (live heap B, smallest heap KB)}``."""
    out = {}
    for mode, binary, path in ((".mpy", "micropython-f32", mpy), ("frozen", "micropython-f32-frozen", None)):
        binary = os.path.join(MP32, binary)
        if not os.path.exists(binary):
            out[mode] = None
            continue
        st = _offline(binary, path, 256)
        lo, hi = 4, 96
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if _offline(binary, path, mid) is None:
                lo = mid
            else:
                hi = mid
        out[mode] = (st["heap_peak"] if st else None, hi)
    return out


def figures(quick=True, arm64=True):
    """Rows for the bench report: per agent kind µs/sample and memory, then the smallest heap."""
    n = 20000 if quick else 200000
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        mpy = compile_modules(os.path.join(tmp, "mpy"), [m for m in MODULES if m[0] != "qfboard.py"])
        for kind, r in per_kind(n, mpy, arm64=arm64).items():
            if "skipped" in r:
                rows.append({"agent kind": kind, "samples": n, "filter_us": "-", "agent_us": "-", "metered_us": "-",
                             "target_filter_us": "-", "memory": "skipped: %s" % r["skipped"]})
                continue
            tgt = TARGETS["filter_us"].get(kind)
            rows.append({"agent kind": kind, "samples": n, "filter_us": round(r["filter_us"], 2),
                         "agent_us": round(r["agent_us"], 2), "metered_us": round(r["metered_us"], 2),
                         "target_filter_us": "≤ %g" % tgt if tgt else "-",
                         "memory": ", ".join("%s=%s" % kv for kv in sorted(r["mem"].items()))})
        heap, st = smallest_heap(mpy)
        rows.append({"agent kind": "micropython smallest heap", "samples": "-", "filter_us": "-", "agent_us": "-",
                     "metered_us": "-",
                     "target_filter_us": "≤ %d KB" % (TARGETS["heap"] // 1024),
                     "memory": "failed even at 96 KB" if heap is None else
                     "%d KB (live heap after collection %d B)" % (heap, st["heap_peak"])})
        for mode, got in heap_32bit(mpy).items():
            rows.append({"agent kind": "micropython 32-bit float32 (%s)" % mode, "samples": "-", "filter_us": "-",
                         "agent_us": "-", "metered_us": "-", "target_filter_us": "≤ %d KB" % (TARGETS["heap"] // 1024),
                         "memory": "skipped: run scripts/build_mp32.sh" if got is None else
                         "smallest heap %d KB (live heap after collection %s B)" % (got[1], got[0])})
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m backend.bench.edge", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer samples")
    p.add_argument("--no-arm64", action="store_true", help="skip the QEMU ARM64 interpreter")
    a = p.parse_args(argv)
    rows = figures(quick=a.quick, arm64=not a.no_arm64)
    print("Edge cost per sample (random walk, width 4; agent = Agent.handle_sample; 64-bit unix port)")
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
