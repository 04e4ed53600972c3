"""Shared machinery of the end-to-end fleet tests: a broker, a live coordinator, ground-truth checks."""
import os
import signal
import time

from backend.live import checker
from backend.host import Host
from backend.live.fleet import write_trace
from backend.live.coordinator import LiveCoordinator
from backend.sim.engine import run as sim_run
from helpers import close

PERIOD = 2.0            # coordinator adjustment period T (s)
LATENCY = 0.5           # λ: loopback delay plus clock skew between processes


def queries(sources, precision_per_source=4.0):
    half = sources[: max(1, len(sources) // 2)]
    return [{"id": "total", "kind": "sum", "sources": list(sources), "precision": precision_per_source * len(sources)},
            {"id": "mean", "kind": "avg", "sources": half, "precision": precision_per_source}]


def coordinator(broker, specs, protocol="deadband", t0=None, skew=0.0):
    """A live coordinator over ``specs``; σ = ``skew`` (0: clocks taken as exact, as the simulator replay is)."""
    t0 = time.time() if t0 is None else t0
    host = Host(protocol=protocol, period=PERIOD, shrink=0.0, latency=LATENCY, t0=t0, skew=skew,
                declared=[s for q in specs for s in q["sources"]])
    answers = []
    live = LiveCoordinator(host, broker.fleet, broker.host, broker.port, broker.credentials("backend")[1],
                           queries=specs, answers=answers)
    return live, answers, t0


def violations(rows, answers, specs, end):
    """Check every answer against the agents' ground truth (the demo's checker); returns
    {query: (violations, degraded_time, answers checked)}."""
    checked = checker.violations(specs, [r for r in rows if r[0] <= end], answers, end)   # answers after end are cut
    return {qid: (v, dt, sum(1 for a in answers if a["query"] == qid and a["time"] <= end))
            for qid, (v, _, dt) in checked.items()}


def simulate(rows, specs, folder, t0, end, protocol="deadband"):
    """Replay the ground truth as a CSV trace workload through the simulator; returns its result."""
    path = write_trace([r for r in rows if r[0] <= end], os.path.join(folder, "trace.csv"), base=t0)
    w = {"name": "live-replay", "duration": end - t0, "protocol": protocol, "sources": {"trace": path},
         "queries": specs, "params": {"period": PERIOD, "shrink": 0.0}, "network": {"latency_tolerance": LATENCY}}
    return sim_run(w)


def wait(pred, timeout, what, why=lambda: ""):
    """Poll ``pred`` until true; fail after ``timeout`` seconds saying ``what`` (and ``why()``)."""
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for %s %s" % (what, why()))
        time.sleep(0.05)


def all_online(live, names):
    """Whether the live coordinator holds every device of ``names`` online."""
    devs = dict(live.coord.devices)
    return all(n in devs and devs[n]["online"] for n in names)


def offline(live, fleet, broker, names):
    """Why ``all_online`` is false: each device not online, the coordinator's record of it, whether
    its process runs and the tail of its output (read without stopping it)."""
    devs = dict(live.coord.devices)
    out = []
    for n in names:
        if n in devs and devs[n]["online"]:
            continue
        d = fleet.devices[n]
        rec = {k: devs[n][k] for k in ("boot", "seq", "online", "asked", "inc")} if n in devs else None
        with open(broker.log, "rb") as f:
            seen = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if " %s " % n in ln + " "]
        out.append("%s: record %s, process %s, log %r, broker %r" % (
            n, rec, "running" if d.proc.poll() is None else "exited %s" % d.proc.returncode, fleet.tail(n),
            seen[-6:]))
    return "; ".join(out) + "; coordinator stats %s" % (dict(live.coord.stats),)


def teardown(broker, live, thread, fleet, obs):
    """Stop what a live test started, whatever state a failure left it in: every agent still running (a frozen
    one is woken first, so that it dies), the coordinator and its thread, the observer, the broker."""
    for d in fleet.devices.values():
        if d.proc.poll() is None:
            d.proc.send_signal(signal.SIGCONT)
            d.proc.kill()
            d.proc.wait()
    live.stop()
    thread.join(5)
    close(obs)
    broker.stop()
