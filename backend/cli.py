"""The ``quietfleet`` command: simulator, demos, devices and fleets, broker, Spark backend, queries, experiments, benchmarks."""
import argparse
import os
import sys

_IDS = ["s%d" % i for i in range(40)]
SIM_DEMO = [
    ("Aggregates with interval guarantees (Olston et al. 2003)", {
        "seed": 7, "duration": 1200,
        "sources": {"generator": "random_walk", "count": 40, "per_device": 2, "start": [90, 110],
                    "step": [0.05, 3.0], "interval": 1.0},
        "queries": [{"id": "q%d" % j, "kind": "avg", "sources": _IDS[j * 6: j * 6 + 16], "precision": p}
                    for j, p in enumerate([12.0, 3.0, 16.0, 6.0, 9.0])]
        + [{"id": "diff", "kind": "sum", "sources": ["s1", "s2"], "weights": [1, -1], "precision": 6.0},
           {"id": "in_band", "kind": "count", "sources": "all", "range": [95, 105]}],
        "params": {"period": 10, "shrink": 0.05}},
     ["naive", "deadband", "adaptive"]),
    ("Entity queries with fraction and rank tolerance (Cheng et al. 2005)", {
        "seed": 7, "duration": 400,
        "sources": {"generator": "random_walk", "count": 300, "start": [0, 1000], "step": 20, "steps": "normal",
                    "arrival": "exponential", "interval": 20},
        "queries": [{"id": "mid", "kind": "range", "range": [400, 600], "fp_tolerance": 0.2, "fn_tolerance": 0.2},
                    {"id": "near", "kind": "knn", "k": 20, "point": 500, "fp_tolerance": 0.2, "fn_tolerance": 0.2}]},
     ["nofilter", "zt-nrp", "ft-nrp", "zt-rp", "ft-rp"]),
]


class Parser(argparse.ArgumentParser):
    """argparse with a usage error on one line (``quietfleet agent: the following arguments are required:
    --config (see quietfleet agent --help)``), exit status 2."""

    def error(self, message):
        self.exit(2, "%s: %s (see %s --help)\n" % (self.prog, message, self.prog))


def fail(command, error):
    """A refused input: one line on stderr naming the command, exit status 2."""
    print("quietfleet %s: %s" % (command, error), file=sys.stderr)
    return 2


def _progress(i, n):
    print("  ... %d/%d samples (%d%%)" % (i, n, 100 * i // max(n, 1)), file=sys.stderr)


def cmd_sim(args):
    """``quietfleet sim WORKLOAD``: a fleet, relay or summary workload through the one simulator loop."""
    from backend.sim import engine, result
    from backend.sim.workload import WorkloadError, load
    try:
        w = load(args.workload)
        if args.protocol or args.seed is not None:
            raw = dict(w.raw)
            if args.protocol:
                raw["protocol"] = args.protocol
            if args.seed is not None:
                raw["seed"] = args.seed
            if w.kind == "fleet":
                raw["sources"] = _abs_trace(w)
            w = load(raw)
        for path in (args.out, args.answers):     # refuse an unwritable output before the run, not after
            if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
                raise WorkloadError("cannot write %s: no folder %s" % (path, os.path.dirname(os.path.abspath(path))))
        res = engine.run(w, out=args.out, answers=args.answers, progress=None if args.quiet else _progress)
    except (WorkloadError, OSError) as e:         # a query the protocol refuses while running is a WorkloadError
        return fail("sim", e)
    print(result.headline(res))
    return 0 if res["violations"] == 0 and not res.get("theorem_misses") else 1


def _abs_trace(w):
    src = dict(w.sources)
    if "trace" in src and not os.path.isabs(src["trace"]):
        src["trace"] = os.path.join(w.base_dir, src["trace"])
    return src


def cmd_demo(args):
    if not args.sim:
        from backend.live.demo import main as live_demo
        return live_demo(args)
    import shutil
    import tempfile
    from backend.live import demo
    from backend.coordinator.protocols import PROTOCOLS
    from backend.sim.engine import run
    bad = 0
    folder = tempfile.mkdtemp(prefix="quietfleet-demo-sim-")
    site = demo.site_workload(folder)
    sections = [("The live demo's site (%s rooms, temperature and humidity each), its readings replayed" % len(demo.ROOMS),
                 site, ["naive", "deadband", "adaptive"])] + SIM_DEMO
    try:
        for title, workload, protocols in sections:
            rows = []
            for name in protocols:
                kinds = PROTOCOLS[name].kinds
                spec = dict(workload, protocol=name, queries=[q for q in workload["queries"] if q["kind"] in kinds])
                print("  running %s ..." % name, file=sys.stderr)
                rows.append(run(spec))
            print("%s: %d simulated sources, %d continuous queries, %d s" % (
                title, rows[0]["sources"], len(rows[0]["queries"]), workload["duration"]))
            bad += _demo_table(rows)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print("Every answer was checked against ground truth at every instant: %s." % (
        "all guarantees held" if bad == 0 else "%d VIOLATIONS" % bad))
    return 0 if bad == 0 else 1


def _demo_table(rows):
    """Messages per protocol, saved against the first (send-everything) and as a ratio to plain deadband
    (uplink + downlink); returns the violations."""
    total = lambda r: r["messages"]["up"] + r["messages"]["down"]
    dead = next((total(r) for r in rows if r["protocol"] == "deadband"), None)
    print()
    print("| protocol | queries | uplink msgs | downlink msgs | bytes | saved vs %s | vs deadband | violations |"
          % rows[0]["protocol"])
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    bad = 0
    for r in rows:
        print("| %s | %d | %d | %d | %d | %.1f%% | %s | %d |" % (
            r["protocol"], len(r["queries"]), r["messages"]["up"], r["messages"]["down"],
            r["bytes"]["up"] + r["bytes"]["down"], 100.0 * (1 - total(r) / total(rows[0])),
            "%.2f×" % (total(r) / dead) if dead else "-", r["violations"]))
        bad += r["violations"]
    print()
    return bad


def cmd_agent(args):
    from edge.runtime.cpython.runtime import run_agent
    return run_agent(args.config)


def cmd_broker(args):
    from backend.live.broker import broker_main
    devices = args.devices
    if devices.isdigit():
        devices = int(devices)
    else:
        devices = [d for d in devices.split(",") if d]
    args.devices = devices
    return broker_main(args)


def cmd_backend(args):
    from backend.spark.service import backend_main
    return backend_main(args)


def cmd_query(args):
    from backend.live.queryctl import query_main
    return query_main(args)


def _broker_options(p):
    """Where the broker is and how to log in: ``quietfleet broker``'s credentials or your own broker's."""
    from backend.live.access import add_options
    add_options(p.add_argument_group("broker (quietfleet broker's credentials, or your own broker: README, "
                                     "Your own broker)"))


def _coordinator_options(p):
    """The coordinator settings of the live drivers; unset ones take ``backend.host``'s defaults."""
    from backend.host import DEFAULT_MODELS, LIVE_BEAT, LIVE_LATENCY, LIVE_SKEW, MODELS, SETTINGS
    p.add_argument("--protocol", help="coordinator protocol, see backend/coordinator/protocols.py (default %s, "
                   "the product; deadband is the plain baseline)" % SETTINGS["protocol"])
    p.add_argument("--period", type=float, help="adjustment period T in seconds (default %g)" % SETTINGS["period"])
    p.add_argument("--shrink", type=float, help="shrink fraction S per period, shrinking protocols (default %g)"
                   % SETTINGS["shrink"])
    p.add_argument("--latency", type=float, default=LIVE_LATENCY, help="latency tolerance λ in seconds (default %(default)s)")
    p.add_argument("--models", choices=sorted(MODELS), help="filter models devices may use (default %s)" % DEFAULT_MODELS)
    p.add_argument("--beat", type=float, default=LIVE_BEAT,
                   help="device heartbeat B in seconds for every device: a device silent past B + λ + margin is "
                        "degraded (default: per device, from λ and its uplink rate; 0: off)")
    p.add_argument("--skew", type=float, default=LIVE_SKEW,
                   help="device clock offset σ covered without an alarm, in seconds (default %(default)s)")
    p.add_argument("--ack-delay", type=float, dest="ack_delay",
                   help="ack mode: seconds a device is quiet before its uplinks are acknowledged (default %g: at "
                        "once; longer sends fewer acks, resends later)" % SETTINGS["ack_delay"])


def cmd_experiment(args):
    import importlib
    try:
        mod = importlib.import_module("backend.experiments." + args.name)
    except ModuleNotFoundError:
        print("quietfleet experiment: no experiment %r (have: %s)" % (args.name, ", ".join(_experiments())),
              file=sys.stderr)
        return 2
    out = args.out or os.path.join("results", args.name)
    os.makedirs(out, exist_ok=True)
    return mod.main(out, quick=args.quick)


def cmd_bench(args):
    from backend.bench.report import main as bench_main
    return bench_main(args.out, quick=args.quick, smoke=args.smoke)


def _experiments():
    import pkgutil
    import backend.experiments as pkg
    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))


# -- devices: flash boards / Pis, emulated fleets, live coordinator (firmware/, backend/live/fleet.py, backend/live/coordinator.py)
def _add_device_commands(sub):
    f = sub.add_parser("flash", help="deploy the agent to a MicroPython board (mpremote) or a Raspberry Pi (systemd)")
    f.add_argument("--port", help="serial port of the board, e.g. /dev/ttyUSB0 (default: the only one present)")
    f.add_argument("--board", default="esp32", help="esp32 | rp2 | pico_w (checks the config's board) | microbit (the UART sensor agent)")
    f.add_argument("--config", help="board: device JSON (firmware/boards/*.json); --pi: device.toml")
    f.add_argument("--pi", metavar="USER@HOST", help="install the CPython agent as a systemd service on a Pi")
    f.add_argument("--out", help="build folder (default build/firmware, or pi-bundle with --pi)")
    f.add_argument("--build-only", action="store_true", help="build the deploy folder / Pi bundle, do not deploy")
    f.add_argument("--source", action="store_true", help="deploy .py sources instead of precompiled .mpy")
    f.set_defaults(fn=lambda a: __import__("firmware.flash", fromlist=["flash_main"]).flash_main(a))
    g = sub.add_parser("fleet", help="run an emulated fleet: micro:bits (QEMU), MicroPython unix-port, CPython and "
                                     "ARM64 (QEMU) agents, with a live coordinator")
    g.add_argument("--microbit", type=int, default=0, help="BBC micro:bits under qemu-system-arm behind gateways")
    g.add_argument("--gateway", choices=("cpython", "arm64"), default="cpython",
                   help="run the micro:bits' gateways natively or on arm64 under qemu-user (Pi class)")
    g.add_argument("--micropython", type=int, default=0, help="heap-limited MicroPython unix-port agents")
    g.add_argument("--cpython", type=int, default=0, help="CPython agents")
    g.add_argument("--arm64", type=int, default=0, help="CPython agents on arm64 under qemu-user (Pi class)")
    g.add_argument("--dir", default="fleet", help="folder for broker, configs, logs and ground truth")
    g.add_argument("--fleet", default="demo")
    g.add_argument("--port", type=int, default=None, help="broker port (default: free port)")
    g.add_argument("--heap", default="96k", help="MicroPython heap per agent (-X heapsize, default 96k = backend.live.fleet.HEAP)")
    g.add_argument("--period", type=float, default=1.0, help="sample period (s)")
    g.add_argument("--trace", help="CSV trace (time,source,value) with sources s_<device> instead of random walks")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--duration", type=float, default=0, help="stop after this many seconds (default: Ctrl-C)")
    g.add_argument("--out", help="write the result (agents, messages up/down, violations) as JSON here")
    g.add_argument("--protocol", help="the --out coordinator's protocol (default: the live drivers', adaptive)")
    g.set_defaults(fn=lambda a: __import__("backend.live.fleet", fromlist=["fleet_main"]).fleet_main(a))
    c = sub.add_parser("coordinator", help="run the live coordinator against a broker (answers on MQTT)")
    c.add_argument("--query", action="append", metavar="JSON",
                   help='a query spec with its id, e.g. \'{"id":"t","kind":"sum","sources":"all","precision":1}\'; '
                        'repeat for more; each is published retained on its spec topic, so `quietfleet query '
                        'list/remove` see it like any other')
    _broker_options(c)
    _coordinator_options(c)
    c.add_argument("--answers", help="also append answers here as JSON lines")
    c.add_argument("--status", help="keep this JSON file up to date (every second) with the counters: messages, "
                   "refused sources, conflicts, bad messages, quarantines, offenders")
    __import__("backend.ui.hooks", fromlist=["add_option"]).add_option(c)      # --ui: the dashboard (backend/ui)
    c.set_defaults(fn=lambda a: __import__("backend.live.coordinator", fromlist=["coordinator_main"]).coordinator_main(a))


def parser():
    """The ``quietfleet`` command line."""
    p = Parser(prog="quietfleet", description="Quiet sensor fleets with guaranteed answers.")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sim", help="run a workload in the discrete-event simulator")
    s.add_argument("workload", help="workload file (JSON or YAML)")
    s.add_argument("--out", help="write RESULT.json here")
    s.add_argument("--answers", help="write ANSWERS.jsonl here")
    s.add_argument("--protocol", help="override the workload's protocol (a workload naming none runs deadband, "
                   "the papers' baseline: a workload file is an experiment record and keeps its meaning; the live "
                   "drivers default to adaptive)")
    s.add_argument("--seed", type=int, help="override the workload's seed")
    s.add_argument("--quiet", action="store_true", help="no progress output")
    s.set_defaults(fn=cmd_sim)
    from backend.host import LIVE_LATENCY
    d = sub.add_parser("demo", help="live demo: broker, Spark job and an emulated fleet; messages saved, guarantees held")
    d.add_argument("--sim", action="store_true", help="the simulator-only demo instead (every protocol, no Spark)")
    d.add_argument("--duration", type=float, default=75.0, help="seconds of live queries (default 75)")
    d.add_argument("--cpython", type=int, default=6, help="CPython agents (default 6)")
    d.add_argument("--micropython", type=int, default=3, help="MicroPython agents (default 3)")
    d.add_argument("--protocol", help="coordinator protocol (default adaptive, as every live driver)")
    d.add_argument("--latency", type=float, help="latency tolerance λ in seconds (default %g)" % LIVE_LATENCY)
    d.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    __import__("backend.ui.hooks", fromlist=["add_option"]).add_option(d)      # --ui: the dashboard (backend/ui)
    d.set_defaults(fn=cmd_demo)
    k = sub.add_parser("backend", help="run the Spark Structured Streaming backend (bridge + job) for a fleet")
    _broker_options(k)
    k.add_argument("--dir", default="backend-state", help="spool, checkpoint, answer table (Parquet), status.json")
    _coordinator_options(k)
    k.add_argument("--param", action="append", help="protocol parameter KEY=VALUE (repeatable)")
    k.add_argument("--trigger", type=float, default=0.25, help="micro-batch trigger interval in seconds")
    k.add_argument("--master", default="local[*]", help="Spark master URL, e.g. spark://host:7077")
    k.add_argument("--groups", action="store_true",
                   help="one state key per query group, so independent groups use every core (new --dir only)")
    k.add_argument("--ingest", choices=("spool", "kafka"), default="spool",
                   help="spool (default: files under --dir) or kafka (the bridge produces to Kafka, the job reads "
                        "Spark's Kafka source; a KRaft broker is started under --dir unless --kafka is given)")
    k.add_argument("--kafka", help="bootstrap HOST:PORT of an existing Kafka cluster (with --ingest kafka)")
    k.add_argument("--kafka-partitions", type=int, default=None, help="partitions of a new fleet topic (default 2, 8 with --groups)")
    __import__("backend.ui.hooks", fromlist=["add_option"]).add_option(k)      # --ui: the dashboard (backend/ui)
    k.set_defaults(fn=cmd_backend)
    qy = sub.add_parser("query", help="add, list or remove continuous queries (retained specs)",
                        description="add: check the spec against the running backend's protocol, register it (or "
                                    "say what it replaces) and show its first answer; list: the backend's state and "
                                    "every query with its latest answer (STALE while the backend is offline); "
                                    "remove: withdraw a registered query (an unknown id is an error)")
    qy.add_argument("action", choices=["add", "list", "remove"])
    qy.add_argument("id", nargs="?", help="query id")
    qy.add_argument("spec", nargs="?", help="JSON spec for add (default: read stdin)")
    qy.add_argument("--wait", type=float, default=3.0,
                    help="seconds add/remove wait for the running backend's answer (default %(default)s)")
    _broker_options(qy)
    qy.set_defaults(fn=cmd_query)
    a = sub.add_parser("agent", help="run a CPython device agent (Raspberry Pi class) from device.toml")
    a.add_argument("--config", required=True, help="device.toml")
    a.set_defaults(fn=cmd_agent)
    b = sub.add_parser("broker", help="run Mosquitto with generated per-device passwords and ACL")
    b.add_argument("--dir", default="broker", help="directory for config, passwords, ACL, credentials.json")
    b.add_argument("--fleet", default="demo")
    b.add_argument("--devices", default="4", help="a count (dev1..devN) or a comma-separated list of device ids")
    b.add_argument("--port", type=int, default=None, help="the backend's listener (default: a free port)")
    b.add_argument("--device-port", type=int, default=None, help="the devices' listener (default: a free port)")
    b.add_argument("--source", action="append", metavar="DEVICE=SOURCE[,SOURCE...]",
                   help="provision sources for a device (repeatable): a birth naming another's is refused")
    b.add_argument("--tls", action="store_true", help="also listen with TLS (generated CA and server certificate)")
    b.set_defaults(fn=cmd_broker)
    e = sub.add_parser("experiment", help="reproduce a paper's experiments: tables and plots under results/")
    e.add_argument("name", help="olston, cheng, relay, brownian, swat")
    e.add_argument("--out", help="results folder (default results/NAME)")
    e.add_argument("--quick", action="store_true", help="smaller runs for a fast look")
    e.set_defaults(fn=cmd_experiment)
    bn = sub.add_parser("bench", help="measure messages, limits, violations and throughput; write a report")
    bn.add_argument("--out", default=os.path.join("results", "bench"))
    bn.add_argument("--quick", action="store_true", help="a few minutes instead of up to an hour")
    bn.add_argument("--smoke", action="store_true", help="a tiny run for the test suite")
    bn.set_defaults(fn=cmd_bench)
    _add_device_commands(sub)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
