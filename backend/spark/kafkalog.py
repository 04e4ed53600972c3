"""The fleet's log on Kafka (DESIGN.md §6 Ingest): what the spool is on one machine, for many.

Writer: ``KafkaLog(bootstrap, topic, fleet, groups=DIR)`` has the spool writer's interface (``append``,
``latest_offset``, ``close``), so the MQTT bridge (``backend.spark.bridge``) produces to it exactly as it
appends to a ``Spool``: uplinks, births, Last Wills, downlink echoes, specs, ticks, link and incarnation
records. Every record gets the next number of the fleet's log (``offset``: 0, 1, 2, ... over all
partitions, as a spool offset) and becomes one Kafka record per row it routes to:

* keyed by fleet (default) every record is one row of the fleet's group;
* keyed by query group (``groups``: a directory for the routing journal) the bridge routes each record
  with the very ``Router`` the spool source runs on the driver (``backend.spark.groups``; ticks and link
  records to every group holding a query, ``inc`` to every group, merges and splits as retire/adopt
  rows), journalled in ``DIR/journal`` so a restarted bridge has the same table.

A row's Kafka key is its group and its partition ``crc32(group) mod partitions``, so a group's rows stay
in order in one partition whatever the topic's size. The value is the MQTT payload itself, untouched (as
the MQTT brokers' Kafka bridges produce it); one record header ``qf`` carries the rest as text,
``offset NUL sub NUL arrival NUL device NUL channel NUL retained`` (device and channel empty for the
log's own records: a QuietFleet topic never has an empty level), which Spark splits with SQL functions,
no Python (``read``).

Delivery: an idempotent producer (``enable.idempotence``: acks from all in-sync replicas, retries
without duplicates or reordering) with no delivery time-out, and ``append`` returns only once Kafka
acknowledged every row, so the bridge acknowledges an MQTT message only after Kafka has it (as with
the spool's fsync). A broker that is down holds ``append`` up (and with it the MQTT acknowledgements,
so the MQTT broker keeps the messages) until it is back. A restarted writer continues the numbering
after the highest offset in the topic (and in the journal).

Reader: ``read(spark, bootstrap, topic)`` is the streaming DataFrame the job consumes through Spark's
own Kafka source (``spark-sql-kafka-0-10``, jars from ``.cache/kafka/spark``, checkpointed offsets),
with the spool source's columns: ``grp, offset, sub, arrival, device, channel, payload, retained``.
"""
import logging
import math
import os
import time
import zlib

from backend.spark.groups import Journal
from backend.spark.source import parse_topic, route, RETAINED

log = logging.getLogger("quietfleet.kafka")

HEADER = "qf"
# The consumer of Spark's Kafka source (DESIGN.md §6, measured in backend.spark.bench_job): the source seeks
# before every poll, so a task reads its offset range in one fetch per max.poll.records (Kafka's default 500
# made a 2,800-record batch 6 polls, 540 ms at load 5) and per max.partition.fetch.bytes (default 1 MB); and
# a poll after a seek first waits for the fetch the consumer sent ahead past the end of the log, which the
# broker holds for fetch.max.wait.ms (default 500 ms) when no new record comes: 10 ms keeps that off a batch
# (an idle consumer is not polled, so it costs no busy fetching)
CONSUMER = {"kafka.max.poll.records": 1000000, "kafka.max.partition.fetch.bytes": 16 << 20, "kafka.fetch.max.wait.ms": 10}


def topic_name(fleet):
    """The fleet's Kafka topic (``qf.<fleet>``: Kafka topics take no ``/``)."""
    return "qf." + fleet


def partition_of(group, partitions):
    return zlib.crc32(group.encode()) % partitions


def header(offset, sub, arrival, device, channel, retained):
    """The ``qf`` header of a row (``repr`` of the arrival: Spark's cast to double reads it back exactly)."""
    return ("%d\0%d\0%r\0%s\0%s\0%d" % (offset, sub, arrival, device or "", channel or "", 1 if retained else 0)).encode()


def decode(value, headers):
    """``(offset, sub, arrival, device, channel, payload, retained)`` of a Kafka record."""
    meta = dict(headers or ())[HEADER].decode().split("\0")
    return (int(meta[0]), int(meta[1]), float(meta[2]), meta[3] or None, meta[4] or None, value, meta[5] == "1")


class KafkaLogError(OSError):
    """Kafka refused a record (the bridge retries its batch: at least once)."""


class KafkaLog:
    """Producer of a fleet's log records to ``topic`` (created with ``partitions`` if missing)."""

    def __init__(self, bootstrap, topic, fleet, groups=None, partitions=2, linger_ms=5):
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient
        from backend.spark.kafkabroker import MAX_MESSAGE, create_topic
        self.bootstrap, self.topic, self.fleet = bootstrap, topic, fleet
        self.path = "kafka://%s/%s" % (bootstrap, topic)
        quiet = logging.getLogger("quietfleet.kafka.client")
        self.partitions = create_topic(AdminClient({"bootstrap.servers": bootstrap, "logger": quiet}), topic, partitions)
        self.journal = Journal(groups) if groups else None
        self.router = self.journal.router(math.inf) if groups else None
        self._errors = []
        self._closing = False
        self._config = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                        "message.timeout.ms": 0, "linger.ms": linger_ms, "reconnect.backoff.max.ms": 1000,
                        "message.max.bytes": MAX_MESSAGE, "logger": quiet, "error_cb": self._error}
        self.producer = Producer(self._config)
        # records that route to no group (a tick before any query) leave no row: their numbers are kept in
        # DIR/next (not fsynced: after a machine crash numbering resumes at the tail, reusing only numbers
        # that no row carries)
        self._next_path = os.path.join(groups, "next") if groups else None
        self.next = max(self._tail(), self._journalled(), self._saved() - 1) + 1
        self.stats = {"records": 0, "rows": 0, "batches": 0}

    def _error(self, err):
        if err.fatal():
            self._errors.append(err)
        else:
            log.debug("kafka: %s", err)

    def _saved(self):
        try:
            with open(self._next_path) as f:
                return int(f.read())
        except (TypeError, OSError, ValueError):
            return 0

    def _journalled(self):
        if self.journal is None:
            return -1
        entries, _ = self.journal._entries()
        return max((e[0] for e in entries), default=-1)

    def _tail(self, timeout=30.0):
        """The highest log offset already in the topic (-1 if none): the last record of each partition."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "qf-tail", "enable.auto.commit": False,
                      "logger": logging.getLogger("quietfleet.kafka.client")})
        try:
            best = -1
            for p in range(self.partitions):
                end = time.monotonic() + timeout
                while True:
                    try:    # a topic just created may answer "not leader" for a moment
                        lo, hi = c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=timeout)
                        break
                    except KafkaException:
                        if time.monotonic() > end:
                            raise
                        time.sleep(0.2)
                if hi <= lo:
                    continue
                c.assign([TopicPartition(self.topic, p, hi - 1)])
                end = time.monotonic() + timeout
                while True:
                    m = c.poll(1.0)
                    if m is not None and not m.error():
                        best = max(best, decode(m.value(), m.headers())[0])
                        break
                    if time.monotonic() > end:
                        raise KafkaLogError("could not read the tail of %s partition %d" % (self.topic, p))
            return best
        finally:
            c.close()

    def latest_offset(self):
        """One past the last record appended (the spool's ``latest_offset``)."""
        return self.next

    def append(self, records):
        """Produce ``(arrival, topic, payload)`` records; return once Kafka acknowledged all of them."""
        rows, entries = [], []
        for arrival, topic, payload in records:
            offset, self.next = self.next, self.next + 1
            if self.router is not None:
                entry = route(self.router, offset, arrival, topic, payload, rows)
                if entry is not None:
                    entries.append(entry)
            else:
                device, channel = parse_topic(topic)
                rows.append((self.fleet, 0, offset, arrival, topic, device, channel, payload, topic.endswith(RETAINED)))
        failed = []

        def delivered(err, msg):
            if err is not None:
                failed.append(err)
        produce, topic, partitions = self.producer.produce, self.topic, self.partitions
        for grp, sub, offset, arrival, _topic, device, channel, payload, retained in rows:
            meta = [(HEADER, header(offset, sub, arrival, device, channel, retained))]
            while True:
                try:
                    produce(topic, payload, grp, partition=partition_of(grp, partitions), headers=meta,
                            on_delivery=delivered)
                    break
                except BufferError:         # the local queue is full: let deliveries drain it
                    self.producer.poll(0.05)
        while len(self.producer) > 0:
            self.producer.flush(0.2)
            if self._errors or self._closing:
                break
        if self._errors or failed or self._closing:
            # a fatal error ends the idempotent producer's session: start a new one, and let the caller
            # (the bridge) append the batch again; rows the old session did deliver are then in the log
            # twice, under new numbers (at least once: the coordinator drops an uplink it has seen)
            errors, self._errors = self._errors or failed or ["closing"], []
            if not self._closing:
                from confluent_kafka import Producer
                self.producer = Producer(self._config)
            raise KafkaLogError("kafka producer: %s" % errors[0])
        if self.journal is not None:
            self.journal.append(entries)
            with open(self._next_path + ".tmp", "w") as f:
                f.write("%d\n" % self.next)
            os.replace(self._next_path + ".tmp", self._next_path)
        self.stats["records"] += len(records)
        self.stats["rows"] += len(rows)
        self.stats["batches"] += 1
        return len(rows)

    def trim(self, below):
        """Nothing to do: Kafka's retention (``retention.ms``) reclaims the log (the spool's ``trim``)."""

    def close(self):
        self._closing = True
        self.producer.flush(5.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Topic:
    """Where the job reads the fleet's log: ``job.start(spark, Topic(bootstrap, topic), ...)`` in place of
    a spool directory. ``options``: more options of Spark's Kafka source (e.g. ``maxOffsetsPerTrigger``)."""

    def __init__(self, bootstrap, topic, **options):
        self.bootstrap, self.topic, self.options = bootstrap, topic, options

    def __repr__(self):
        return "kafka://%s/%s" % (self.bootstrap, self.topic)


def read(spark, bootstrap, topic, options=None):
    """The streaming DataFrame of the fleet's log on Kafka, with the spool source's columns (grouped
    schema): ``grp, offset, sub, arrival, device, channel, payload, retained``."""
    from pyspark.sql import functions as F
    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest").option("failOnDataLoss", "true"))
    for k, v in dict(CONSUMER, **(options or {})).items():
        reader = reader.option(k, str(v))
    reader = reader.option("includeHeaders", "true")
    meta = F.split(F.element_at("headers", 1).getField("value").cast("string"), "\u0000")
    return (reader.load().select(F.col("key").cast("string").alias("grp"), meta.alias("m"), F.col("value"))
            .select("grp", F.col("m")[0].cast("long").alias("offset"), F.col("m")[1].cast("int").alias("sub"),
                    F.col("m")[2].cast("double").alias("arrival"), F.expr("nullif(m[3], '')").alias("device"),
                    F.expr("nullif(m[4], '')").alias("channel"), F.col("value").alias("payload"),
                    (F.col("m")[5] == "1").alias("retained")))
