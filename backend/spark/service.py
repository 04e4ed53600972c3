"""The running backend (DESIGN.md §6): MQTT bridge -> spool -> Spark job -> MQTT, as one service.

``quietfleet backend --broker-dir DIR`` reads the broker's ``credentials.json`` (see
``quietfleet broker``); ``--dir`` holds the spool, the checkpoint, the answer table (Parquet) and
``status.json``. Restarting with the same ``--dir`` resumes: the broker kept the bridge's
persistent session, the spool kept what was appended, the checkpoint says what was applied.
Each start is a new backend incarnation (``host.new_incarnation``, later than the one in
``<dir>/incarnation``), appended to the spool as a ``qf/<fleet>/inc`` record: batches replayed from
before it republish the same bytes, and devices drop what the earlier run may still deliver.
"""
import json
import logging
import os
import signal
import sys
import threading
import time

from backend import host as hostmod
from backend.spark import job
from backend.spark.bridge import Bridge
from backend.spark.publish import Publisher
from backend.spark.spool import Spool
from edge.core import topics

log = logging.getLogger("quietfleet.backend")
GROUP_PARTITIONS = 8    # shuffle partitions when keyed by query group (fixed by the checkpoint at the first run)


class Backend:
    def __init__(self, directory, fleet, host, port, password, settings, master="local[*]", trigger=0.25,
                 tick=0.1, status_sources=False, on_batch=None, spark=None, user="backend", groups=False):
        self.directory = os.path.abspath(directory)
        self.fleet = fleet
        self.host, self.port, self.user, self.password = host, port, user, password
        # the bridge spools every control as the broker passes it on: the job times round trips from there
        self.settings = hostmod.settings(settings, echo=True)
        self.master = master
        self.trigger = trigger
        self.tick = tick
        self.status_sources = status_sources
        self.on_batch = on_batch
        self.spark = spark
        self.groups = groups            # one state key per query group (backend.spark.groups)
        self.spool = self.bridge = self.publisher = self.query = None
        self.incarnation = None

    def start(self):
        os.makedirs(self.directory, exist_ok=True)
        self.spool = Spool(os.path.join(self.directory, "spool"), fsync="always")
        self.incarnation = self._incarnation()
        self.spool.append([(time.time(), topics.spool(self.fleet, "inc"), b"%d" % self.incarnation)])
        self.bridge = Bridge(self.spool, self.fleet, self.host, self.port, self.user, self.password,
                             tick_seconds=self.tick).start()
        if self.spark is None:
            self.spark = job.session(self.master, app="quietfleet-%s" % self.fleet,
                                     partitions=GROUP_PARTITIONS if self.groups else 1)
        self.publisher = Publisher(self.host, self.port, self.user, self.password, "qf-job-%s" % self.fleet)
        self.query = job.start(self.spark, self.spool.path, self.directory, self.fleet, self.settings,
                               publisher=self.publisher, trigger=self.trigger,
                               status_sources=self.status_sources, on_batch=self.on_batch, writer=self.spool,
                               groups=self.groups)
        return self

    def _incarnation(self):
        """A new incarnation, later than the last run's (kept in ``<dir>/incarnation``)."""
        path = os.path.join(self.directory, "incarnation")
        try:
            with open(path) as f:
                previous = int(f.read())
        except (FileNotFoundError, ValueError):
            previous = None
        inc = hostmod.new_incarnation(time.time(), previous)
        with open(path + ".tmp", "w") as f:
            f.write("%d\n" % inc)
        os.replace(path + ".tmp", path)
        return inc

    def status(self):
        try:
            with open(os.path.join(self.directory, "status.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def drain(self, timeout=30.0):
        """Wait until the job has applied everything the bridge spooled so far."""
        target = self.spool.latest_offset()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status()
            group = st and st["groups"].get(self.fleet)
            if group and group["records"] >= target:
                return True
            self.raise_if_failed()
            time.sleep(0.05)
        return False

    def raise_if_failed(self):
        if self.query is not None and not self.query.isActive and self.query.exception() is not None:
            raise RuntimeError("the Spark job failed: %s" % self.query.exception())

    def stop(self):
        if self.bridge is not None:
            self.bridge.stop()
            self.bridge = None
        if self.publisher is not None:     # first: a batch waiting for acks fails now (and is replayed)
            self.publisher.close()
            self.publisher = None
        if self.query is not None:
            self.query.stop()
            self.query = None
        if self.spool is not None:
            self.spool.close()
            self.spool = None


def parse_params(items):
    """``["k=v", ...]`` -> dict, values parsed as JSON when they are JSON."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError("--param wants KEY=VALUE, got %r" % item)
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def connection(args):
    """(host, port, password) of the backend user from ``--broker-dir`` or the explicit options."""
    host, port, password = args.host, args.port, args.password
    if args.broker_dir:
        with open(os.path.join(args.broker_dir, "credentials.json")) as f:
            cred = json.load(f)
        host, port = host or cred["host"], port or cred["port"]
        password = password or cred["users"]["backend"]
        args.fleet = args.fleet or cred["fleet"]
    if not args.fleet:
        raise ValueError("give --fleet (or --broker-dir)")
    if not port or password is None:
        raise ValueError("give --broker-dir (the broker's folder) or --port and --password")
    return host or "127.0.0.1", port, password


def backend_main(args):
    """``quietfleet backend``: run bridge and Spark job until SIGINT/SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        host, port, password = connection(args)
        registry = os.path.abspath(os.path.join(args.broker_dir, "credentials.json")) if args.broker_dir else None
        settings = hostmod.from_args(args, params=parse_params(args.param), registry=registry)
        hostmod.build(settings)         # a bad protocol or parameter is refused here, not in a Spark worker
    except (ValueError, OSError, KeyError, TypeError) as e:
        print("quietfleet backend: %s" % e, file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    b = Backend(args.dir, args.fleet, host, port, password, settings, master=args.master, trigger=args.trigger,
                groups=args.groups)
    ui = None                                   # --ui: the dashboard (backend/ui)
    try:
        b.start()
        print("quietfleet backend: fleet %s, protocol %s, Spark %s, state in %s" % (
            args.fleet, settings["protocol"], args.master, b.directory), flush=True)
        from backend.ui import hooks as ui_hooks                                    # --ui
        ui = ui_hooks.backend(args, b, host, port, password)                        # --ui
        while not stop.wait(1.0):
            b.raise_if_failed()
    except (RuntimeError, ValueError) as e:
        print("quietfleet backend: %s" % e, file=sys.stderr)
        return 1
    finally:
        if ui is not None:                      # --ui
            ui.stop()                           # --ui
        b.stop()
        if b.spark is not None:
            b.spark.stop()
    return 0
