"""The running backend (DESIGN.md §6): MQTT bridge -> spool -> Spark job -> MQTT, as one service.

``quietfleet backend --broker-dir DIR`` reads the broker's ``credentials.json`` (see
``quietfleet broker``), or takes your own broker's address, login, TLS files and client id
(``backend.live.access``); ``--dir`` holds the spool, the checkpoint, the answer table (Parquet) and
``status.json``. Restarting with the same ``--dir`` resumes: the broker kept the bridge's
persistent session, the spool kept what was appended, the checkpoint says what was applied.
With ``ingest="kafka"`` (``--ingest kafka``) the bridge produces to the fleet's Kafka topic
(``backend.spark.kafkalog``: routed by query group with ``--groups``, the routing journal in
``<dir>/groups``) and the job reads Spark's Kafka source; ``--kafka HOST:PORT`` names a Kafka cluster,
otherwise a KRaft broker is started on loopback with its data in ``<dir>/kafka`` (``kafkabroker``).
Each start is a new backend incarnation (``host.new_incarnation``, later than the one in
``<dir>/incarnation``), appended to the spool as a ``qf/<fleet>/inc`` record: batches replayed from
before it republish the same bytes, and devices drop what the earlier run may still deliver.
The publisher carries the backend's state (``backend.live.presence``): online while it runs, its Last
Will if the process dies, offline when it stops; the bridge's client id is ``--client-id`` (default
``qf-bridge-<fleet>``), the publisher's that plus ``-pub`` (default ``qf-job-<fleet>``).
"""
import json
import logging
import os
import signal
import sys
import threading
import time

from backend import host as hostmod
from backend.live import access, presence
from backend.spark import job
from backend.spark.bridge import Bridge
from backend.spark.publish import Publisher
from backend.spark.spool import Spool
from edge.core import topics

log = logging.getLogger("quietfleet.backend")
GROUP_PARTITIONS = 8    # shuffle partitions when keyed by query group (fixed by the checkpoint at the first run)


class Backend:
    def __init__(self, directory, fleet, host, port, password, settings, master="local[*]", trigger=0.25,
                 tick=0.1, status_sources=False, on_batch=None, spark=None, user="backend", groups=False,
                 ingest="spool", kafka=None, kafka_partitions=None, tls=None, client_id=None):
        self.directory = os.path.abspath(directory)
        self.fleet = fleet
        self.host, self.port, self.user, self.password = host, port, user, password
        self.tls, self.client_id = tls, client_id      # backend.live.access
        # the bridge spools every control as the broker passes it on: the job times round trips from there
        self.settings = hostmod.settings(settings, echo=True)
        self.master = master
        self.trigger = trigger
        self.tick = tick
        self.status_sources = status_sources
        self.on_batch = on_batch
        self.spark = spark
        self.groups = groups            # one state key per query group (backend.spark.groups)
        self.ingest = ingest            # "spool" or "kafka"
        self.kafka = kafka              # bootstrap of a Kafka cluster (None: start a broker under directory)
        self.kafka_partitions = kafka_partitions or (GROUP_PARTITIONS if groups else 2)
        self.spool = self.bridge = self.publisher = self.query = self.broker = None
        self.incarnation = None

    def _log(self):
        """The bridge's log and where the job reads it: the spool, or the fleet's Kafka topic."""
        if self.ingest != "kafka":
            spool = Spool(os.path.join(self.directory, "spool"), fsync="always")
            return spool, spool.path
        from backend.spark import kafkabroker, kafkalog
        if self.kafka is None:
            port, controller = self._kafka_ports()
            self.broker = kafkabroker.KafkaBroker(os.path.join(self.directory, "kafka"), partitions=self.kafka_partitions,
                                                  port=port, controller_port=controller).start()
            bootstrap = self.broker.bootstrap
        else:
            bootstrap = self.kafka
        topic = kafkalog.topic_name(self.fleet)
        log = kafkalog.KafkaLog(bootstrap, topic, self.fleet, partitions=self.kafka_partitions,
                                groups=os.path.join(self.directory, "groups") if self.groups else None)
        return log, kafkalog.Topic(bootstrap, topic)

    def _kafka_ports(self):
        """The ports of our broker's last run (the restarted job's checkpoint names its bootstrap), else free ones."""
        path = os.path.join(self.directory, "kafka", "ports")
        try:
            with open(path) as f:
                port, controller = map(int, f.read().split())
            return port, controller
        except (OSError, ValueError):
            from backend.live.broker import free_port
            os.makedirs(os.path.dirname(path), exist_ok=True)
            port = free_port()
            controller = free_port(taken=(port,))
            with open(path, "w") as f:
                f.write("%d %d\n" % (port, controller))
            return port, controller

    def start(self):
        os.makedirs(self.directory, exist_ok=True)
        self.spool, source = self._log()
        self.incarnation = self._incarnation()
        self.spool.append([(time.time(), topics.spool(self.fleet, "inc"), b"%d" % self.incarnation)])
        self.bridge = Bridge(self.spool, self.fleet, self.host, self.port, self.user, self.password,
                             tick_seconds=self.tick, tls=self.tls, client_id=self.client_id).start()
        if self.spark is None:
            self.spark = job.session(self.master, app="quietfleet-%s" % self.fleet,
                                     partitions=GROUP_PARTITIONS if self.groups else 1)
        self.pub_id = pub_id = self.client_id + "-pub" if self.client_id else "qf-job-%s" % self.fleet
        kinds = hostmod.build(self.settings).protocol.kinds
        state = (topics.backend(self.fleet), presence.online("spark", self.settings["protocol"], kinds, time.time(), pub_id),
                 presence.offline("spark", "connection lost", client=pub_id))
        self.publisher = Publisher(self.host, self.port, self.user, self.password, pub_id, tls=self.tls, state=state)
        self.query = job.start(self.spark, source, self.directory, self.fleet, self.settings,
                               publisher=self.publisher, trigger=self.trigger,
                               status_sources=self.status_sources, on_batch=self.on_batch, writer=self.spool,
                               groups=self.groups, on_publish=self.bridge.sent)
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
            self.publisher.close(presence.offline("spark", "stopped", time.time(), self.pub_id))
            self.publisher = None
        if self.query is not None:
            self.query.stop()
            self.query = None
        if self.spool is not None:
            self.spool.close()
            self.spool = None
        if self.broker is not None:
            self.broker.stop()
            self.broker = None


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


def backend_main(args):
    """``quietfleet backend``: run bridge and Spark job until SIGINT/SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        acc = access.from_args(args)
        settings = hostmod.from_args(args, params=parse_params(args.param), registry=acc.registry)
        hostmod.build(settings)         # a bad protocol or parameter is refused here, not in a Spark worker
    except KeyError as e:
        print("quietfleet backend: %s lacks %s (write it with quietfleet broker)"
              % (args.credentials or os.path.join(args.broker_dir, "credentials.json"), e), file=sys.stderr)
        return 2
    except (ValueError, OSError, TypeError) as e:
        print("quietfleet backend: %s" % e, file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signals():
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())

    on_signals()
    b = Backend(args.dir, args.fleet, acc.host, acc.port, acc.password, settings, master=args.master,
                trigger=args.trigger, groups=args.groups, user=acc.user, tls=acc.tls, client_id=acc.client_id,
                ingest=getattr(args, "ingest", "spool"), kafka=getattr(args, "kafka", None),
                kafka_partitions=getattr(args, "kafka_partitions", None))
    ui = None                                   # --ui: the dashboard (backend/ui)
    try:
        b.start()
        on_signals()        # SparkContext put its own SIGINT handler in (it cancels jobs, raises a traceback)
        print("quietfleet backend: fleet %s, broker %s, protocol %s, Spark %s, ingest %s, state in %s" % (
            args.fleet, acc.where(), settings["protocol"], args.master, b.spool.path, b.directory), flush=True)
        from backend.ui import hooks as ui_hooks                                    # --ui
        ui = ui_hooks.backend(args, b, acc)                                         # --ui
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
