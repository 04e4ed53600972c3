"""A fleet booting into an ``"all"`` query (Olston et al. 2003 §1.2 uniform and §3 adaptive widths): downlinks and time.

``python -m backend.bench.births [--n 2000] [--precision 0.1]`` registers one AVG over ``"all"``, then
births ``n`` one-source devices 1 ms apart through ``backend.host.Host``; each device is a real
``edge.agent.Agent`` whose acknowledgements reach the host at once, after every 10 births, or never
(a fleet booting faster than its acknowledgements come back, as inside one Spark micro-batch). It
prints the downlinks sent and the process time. A birth should cost its own device a constant number
of messages; anything growing with the fleet shows as downlinks per birth growing with ``n``.
"""
import argparse
import time

from backend.host import Host
from edge.agent import Agent

LAGS = ((1, "at once"), (10, "every 10 births"), (0, "never"))


def run(protocol, n, precision, lag):
    """(downlinks, process seconds) of ``n`` births acknowledged every ``lag`` births (0: never)."""
    h = Host(protocol=protocol, beat=0.0, t0=0.0)     # (agents run no timers here: no marks, no watchdog)
    h.spec(0.5, "all", {"kind": "avg", "sources": "all", "precision": precision})
    agents, held, down = {}, [], 0
    start = time.process_time()
    for k in range(n):
        dev, now = "d%d" % k, 1.0 + k * 0.001
        agents[dev] = Agent(dev, ["s%d" % k], boot=1)
        agents[dev].handle_sample(now, 0, float(k % 7))
        held += h.record(now, dev, "state", agents[dev].start(now)[0][1])
        if lag and (k + 1) % lag == 0:
            down += sum(1 for a in pump(h, agents, now, held) if a[0] == "down")
            held = []
    down += sum(1 for a in held if a[0] == "down")
    return down, time.process_time() - start


def pump(h, agents, now, out):
    """Deliver the host's downlinks in ``out`` to the agents and their replies back, until quiet; every
    output (the tests drive births through this too)."""
    seen, queue = list(out), list(out)
    while queue:
        act = queue.pop(0)
        if act[0] == "down" and act[1] in agents:
            for _, payload in agents[act[1]].handle_message(now, act[2]):
                more = h.record(now, act[1], "up", payload)
                seen += more
                queue += more
    return seen


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m backend.bench.births", description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="devices born (default 2000)")
    ap.add_argument("--precision", type=float, default=0.1, help="δ of the AVG (default 0.1)")
    ap.add_argument("--protocols", nargs="+", default=["deadband", "adaptive"])
    args = ap.parse_args(argv)
    print("| protocol | acknowledged | births | downlinks | per birth | process s |")
    print("|---|---|---:|---:|---:|---:|")
    for protocol in args.protocols:
        for lag, label in LAGS:
            down, secs = run(protocol, args.n, args.precision, lag)
            print("| %s | %s | %d | %d | %.2f | %.1f |" % (protocol, label, args.n, down, down / args.n, secs),
                  flush=True)


if __name__ == "__main__":
    main()
