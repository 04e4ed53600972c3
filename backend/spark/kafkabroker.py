"""A Kafka broker in KRaft mode (no ZooKeeper), started by the project (DESIGN.md §6 Ingest).

``KafkaBroker(workdir).start()`` runs one combined broker + controller process from the Maven Central
jars that ``scripts/kafka/fetch.sh`` (called by ``scripts/setup.sh``) put in ``.cache/kafka/broker``:
it formats the KRaft storage once (``kafka.tools.StorageTool format``), writes ``server.properties``
with free loopback ports, starts ``java -cp ... kafka.Kafka server.properties`` in its own process
group, and returns once the broker answers metadata requests. ``stop()`` ends it cleanly (SIGTERM, then
SIGKILL after ``timeout``); ``kill()`` is SIGKILL (a crash); ``start()`` again restarts it on the same
ports and data, so clients that know ``bootstrap`` reconnect by themselves. ``create_topic`` makes a
fleet's topic. The same class serves tests, benchmarks and ``quietfleet backend --ingest kafka``.

On several machines, ``python -m backend.spark.kafkabroker --dir DIR --host ADDRESS --port 9092`` runs the
same broker on the Kafka machine's address until SIGTERM (or run any Kafka cluster you have), and
``quietfleet backend --ingest kafka --kafka ADDRESS:9092`` produces to it.
"""
import atexit
import base64
import glob
import os
import signal
import subprocess
import time
import uuid

from backend.live.broker import Service, free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FETCH = os.path.join(ROOT, "scripts", "kafka", "fetch.sh")
MAX_MESSAGE = 8 << 20      # bytes: a record carries one MQTT message (at most the spool's 1 MB) as base64 JSON


class KafkaError(RuntimeError):
    pass


def cache_dir():
    return os.environ.get("QF_KAFKA_CACHE") or os.path.join(ROOT, ".cache", "kafka")


def jars(part):
    """The jars of ``part`` (``broker`` or ``spark``) fetched by ``scripts/kafka/fetch.sh``."""
    found = sorted(glob.glob(os.path.join(cache_dir(), part, "*.jar")))
    if not found:
        raise KafkaError("no Kafka jars in %s: run scripts/setup.sh (or bash %s)" % (os.path.join(cache_dir(), part), FETCH))
    return found


def available():
    """Whether the fetched jars are there (tests skip without them)."""
    return all(glob.glob(os.path.join(cache_dir(), p, "*.jar")) for p in ("broker", "spark"))


def ensure_jars():
    """Fetch the jars if they are missing (what ``scripts/setup.sh`` does; fast when they are there)."""
    if not available():
        subprocess.run(["bash", FETCH], check=True)


def _die_with_parent():
    """In the child before exec: SIGTERM when the thread that started the broker ends, the process too
    even by SIGKILL (Linux ``PR_SET_PDEATHSIG``), so no broker is left holding the ports: start it from a
    thread that lives as long as it should (the main thread)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _java():
    home = os.environ.get("JAVA_HOME")
    return os.path.join(home, "bin", "java") if home else "java"


class KafkaBroker(Service):
    """One KRaft broker+controller on 127.0.0.1 with its data under ``workdir``."""

    def __init__(self, workdir, partitions=2, heap="512m", timeout=90.0, port=None, host="127.0.0.1",
                 controller_port=None):
        self.workdir = os.path.abspath(workdir)
        self.host = host                      # the address it listens on and advertises
        self.partitions = partitions          # default partitions of a new topic
        self.heap = heap
        self.timeout = timeout
        self.port = port or free_port()
        self.controller_port = controller_port or free_port(taken=(self.port,))
        self.bootstrap = "%s:%d" % (host, self.port)
        self.proc = None
        self.log_path = os.path.join(self.workdir, "server.log")

    # -- files ------------------------------------------------------------------------------------
    def _properties(self):
        data = os.path.join(self.workdir, "data")
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": "1@127.0.0.1:%d" % self.controller_port,
            "listeners": "PLAINTEXT://%s:%d,CONTROLLER://127.0.0.1:%d" % (self.host, self.port, self.controller_port),
            "advertised.listeners": "PLAINTEXT://%s:%d" % (self.host, self.port),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": data,
            "num.partitions": str(self.partitions),
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "message.max.bytes": str(MAX_MESSAGE),
            "num.network.threads": "2",
            "num.io.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "background.threads": "2",
            "log.retention.hours": "168",
            "log.segment.bytes": str(64 << 20),
        }
        return "".join("%s=%s\n" % kv for kv in props.items())

    def _write(self):
        os.makedirs(self.workdir, exist_ok=True)
        self.config = os.path.join(self.workdir, "server.properties")
        with open(self.config, "w") as f:
            f.write(self._properties())
        self.log4j = os.path.join(self.workdir, "log4j2.properties")
        with open(self.log4j, "w") as f:
            f.write("status = error\nappender.f.type = File\nappender.f.name = F\nappender.f.fileName = %s\n"
                    "appender.f.layout.type = PatternLayout\nappender.f.layout.pattern = [%%d] %%p %%m (%%c)%%n\n"
                    "rootLogger.level = INFO\nrootLogger.appenderRef.f.ref = F\n"
                    "logger.kafka.name = kafka\nlogger.kafka.level = INFO\n"
                    "logger.org.name = org.apache.kafka\nlogger.org.level = WARN\n" % self.log_path)

    def _cmd(self, main, *args):
        return [_java(), "-Xmx" + self.heap, "-Xms64m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                "-XX:TieredStopAtLevel=1" if main != "kafka.Kafka" else "-XX:+UseStringDeduplication",
                "-Djava.awt.headless=true", "-Dlog4j2.configurationFile=" + self.log4j,
                "-cp", os.path.join(cache_dir(), "broker", "*"), main] + list(args)

    def _format(self):
        """Format the KRaft storage once (a restart keeps the data)."""
        if os.path.exists(os.path.join(self.workdir, "data", "meta.properties")):
            return
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        p = subprocess.run(self._cmd("kafka.tools.StorageTool", "format", "--cluster-id=" + cluster, "--config=" + self.config,
                                     "--ignore-formatted"), capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise KafkaError("formatting the KRaft storage failed: %s" % (p.stderr or p.stdout)[-2000:])

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self):
        jars("broker")
        self._write()
        self._format()
        out = open(os.path.join(self.workdir, "stdout.log"), "ab")
        self.proc = subprocess.Popen(self._cmd("kafka.Kafka", self.config), stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.workdir,
                                     preexec_fn=_die_with_parent)
        out.close()
        atexit.register(self.stop)
        self._wait_ready()
        return self

    def _wait_ready(self):
        from confluent_kafka.admin import AdminClient
        end = time.monotonic() + self.timeout
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 2000, "log_level": 0})
        while True:
            if self.proc.poll() is not None:
                raise KafkaError("the Kafka broker exited with %s; see %s" % (self.proc.returncode, self.workdir))
            try:
                md = admin.list_topics(timeout=1.0)
                if md.brokers:
                    return
            except Exception:       # not up yet (KafkaException: transport or timeout)
                pass
            if time.monotonic() > end:
                self.stop()
                raise KafkaError("the Kafka broker did not come up within %.0f s; see %s" % (self.timeout, self.workdir))
            time.sleep(0.2)

    def create_topic(self, topic, partitions=None, **config):
        """Create ``topic`` (no error if it exists) and wait until its partitions have leaders."""
        from confluent_kafka.admin import AdminClient
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        return create_topic(admin, topic, partitions or self.partitions, config, self.timeout)

    def stop(self, timeout=30.0):
        """SIGTERM (a controlled shutdown), SIGKILL if it takes longer than ``timeout``."""
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        except ProcessLookupError:
            pass

    def kill(self):
        """SIGKILL: a broker crash (the data stays; ``start()`` recovers it)."""
        p, self.proc = self.proc, None
        if p is not None and p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def create_topic(admin, topic, partitions, config=None, timeout=60.0):
    """Create ``topic`` with ``partitions`` partitions through ``admin`` (an existing one is kept) and
    wait for its leaders; returns its partition count."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic
    fut = admin.create_topics([NewTopic(topic, partitions, 1, config=dict(
        {"max.message.bytes": str(MAX_MESSAGE)}, **(config or {})))])[topic]
    try:
        fut.result(timeout)
    except KafkaException as e:
        if "TOPIC_ALREADY_EXISTS" not in str(e) and "already exists" not in str(e):
            raise
    end = time.monotonic() + timeout
    while True:
        t = admin.list_topics(topic, timeout=5.0).topics.get(topic)
        if t is not None and t.error is None and t.partitions and all(p.leader >= 0 for p in t.partitions.values()):
            return len(t.partitions)
        if time.monotonic() > end:
            raise KafkaError("topic %s has no leaders after %.0f s" % (topic, timeout))
        time.sleep(0.1)


def main(argv=None):
    """``python -m backend.spark.kafkabroker --dir DIR [--host ADDRESS] [--port 9092]``: run a broker until SIGTERM."""
    import argparse
    import threading
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--dir", required=True, help="data, logs and server.properties (kept across restarts)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on and advertise to clients")
    ap.add_argument("--port", type=int, default=9092)
    ap.add_argument("--controller-port", type=int, default=9093, help="KRaft controller port (on loopback)")
    ap.add_argument("--partitions", type=int, default=2, help="partitions of a new topic")
    args = ap.parse_args(argv)
    ensure_jars()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    b = KafkaBroker(args.dir, args.partitions, port=args.port, host=args.host,
                    controller_port=args.controller_port).start()
    print("kafka: KRaft broker at %s, data in %s" % (b.bootstrap, b.workdir), flush=True)
    try:
        while not stop.wait(1.0):
            if b.proc is None or b.proc.poll() is not None:
                print("kafka: the broker exited; see %s" % b.log_path)
                return 1
    finally:
        b.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
