"""The PySpark Structured Streaming backend (DESIGN.md §6): spool -> coordinator per query group -> MQTT and Parquet.

Plan of one micro-batch::

    qfspool source (offset range) or Spark's Kafka source (kafkalog.Topic)  ->  key = query group  ->  transformWithStateInPandas(CoordinatorProcessor,
    RocksDB state store)  ->  foreachBatch(Sink): ctl downlinks (QoS 1), answers (retained QoS 0),
    Parquet answer table, status.json

``CoordinatorProcessor`` is a thin adapter: it takes the group's ``backend.host.Host`` (which owns the
unchanged ``Coordinator`` and the spec inbox every driver shares) from ``state.GroupState`` (kept live
in the Python worker, durable as a snapshot plus a journal of records), feeds it the batch's records
in offset order (``run_batch``) and appends them to the journal. The host is not decomposed into
per-source state: its protocols keep cross-source state (allocations, queues, the serialising heap)
that only the object itself knows how to keep consistent, and the ``Host`` runs the very object the
simulator runs. RocksDB versions the state per batch, so a batch that is replayed after a crash
starts from the state of the batch before it (and ``GroupState`` rebuilds rather than trusting its
cache); the ``Host`` is deterministic in its records (its clock is the records' arrival time), so the
replay produces the same actions, with the same downlink sequence numbers, which agents drop as
duplicates.

The sink is idempotent per batch id: a batch's answers are written atomically to the answer table
(``answers.Table``) under its batch id (a replay overwrites them with the same rows), retained
answers are last-writer-wins, and ``sink.committed`` records the last batch delivered in full so a
replayed batch that was already delivered is not published again. After each delivered batch the
sink compacts the answer table and trims the spool behind Spark's commits (``retention``).

Query groups: by default every record is keyed by its fleet (one group per fleet). With ``groups``
the source routes every record on the driver to its query group (``backend.spark.groups``: connected
components of devices, sources and queries, a device wholly in one group since its sequence numbers
and downlink need a single owner), one ``Host`` per group, so independent groups run in parallel on
every core and executor; a merge retires the younger group's key and its devices re-birth into the
older one. Rows are ordered by the spool offset of the record that caused them (``at``), then group.

Kafka (``--ingest kafka``, ``backend.spark.kafkalog``): the bridge numbers the records as the spool does,
routes them (by fleet, or by query group with the same ``Router``) and produces each row keyed by its
group; ``source`` reads them with Spark's Kafka source into the spool source's columns, and everything
after it is shared. Spark's checkpoint holds the Kafka offsets of every planned batch, so a replayed
batch reads the same rows: exactly once as on the spool.
"""
import json
import logging
import math
import os
import sys
import time

from backend import host as hostmod
from backend.answers import answer_json, error_record, guarantee, strict
from backend.spark import quickack, state, zipcache
from backend.spark.answers import Table, read_answers  # noqa: F401 (read_answers: the job's reader)
from backend.spark.publish import Publisher  # noqa: F401 (the job's publisher)
from backend.spark.retention import Retention
from edge.core import topics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
log = logging.getLogger("quietfleet.backend")
OUTPUT_SCHEMA = ("grp string, seq int, at long, kind string, target string, payload binary, body string, "
                 "time double, lo double, hi double, degraded boolean, guarantee string, final boolean")
COLUMNS = ("kind", "target", "payload", "body", "time", "lo", "hi", "degraded", "guarantee", "final")


class Rows:
    """The sink a batch's actions are dispatched to (``host.dispatch``): one output row per action."""

    def __init__(self, host):
        self.host = host
        self.cols = {c: [] for c in COLUMNS}
        self.cols["at"] = []
        self.at = None          # spool offset of the record being applied (orders rows across groups)

    def row(self, kind, target=None, payload=None, body=None, a=None):
        cols = self.cols
        cols["at"].append(self.at)
        cols["kind"].append(kind)
        cols["target"].append(target)
        cols["payload"].append(payload)
        cols["body"].append(body)
        cols["time"].append(a["time"] if a else None)
        cols["lo"].append(float(a["lo"]) if a and "lo" in a else None)
        cols["hi"].append(float(a["hi"]) if a and "hi" in a else None)
        cols["degraded"].append(bool(a["degraded"]) if a else None)
        cols["guarantee"].append(guarantee(a) if a else None)
        cols["final"].append(bool(a.get("final")) if a else None)

    def down(self, device, payload):
        self.row("down", device, payload=payload)

    def answer(self, change):
        self.row("answer", change["query"], body=json.dumps(change), a=change)

    def error(self, qid, message):
        self.row("error", qid, body=json.dumps(error_record(qid, message, self.host.now)))

    def retract(self, qid):
        self.row("retract", qid)


def run_batch(host, records, status_sources=False, extra=None, offsets=None):
    """Feed ``records`` ``(arrival, device, channel, payload, retained)`` (in offset order, their spool
    ``offsets`` if given) to ``host``; returns the output columns, the group's status row (plus ``extra``) last."""
    sink = Rows(host)
    first, last = math.inf, -math.inf
    for i, (arrival, device, channel, payload, retained) in enumerate(records):
        sink.at = offsets[i] if offsets is not None else None
        hostmod.dispatch(host.record(arrival, device, channel, payload, retained), sink)
        first, last = min(first, arrival), max(last, arrival)
    status = hostmod.digest(host, status_sources, status_sources)
    status.update(extra or {}, batch_records=len(records), first_arrival=first if records else None, last_arrival=last)
    sink.at = None
    sink.row("status", body=json.dumps(status))
    return sink.cols


def _processor_class():
    """The StatefulProcessor subclass (built lazily so importing this module needs no pyspark)."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class CoordinatorProcessor(StatefulProcessor):
        """One ``Host`` per query group, kept in the worker and made durable as snapshot + journal."""

        def __init__(self, settings, status_sources=False, snapshot_records=state.SNAPSHOT_RECORDS,
                     snapshot_seconds=state.SNAPSHOT_SECONDS, snapshot_dir=None):
            self.settings = settings
            self.status_sources = status_sources
            self.snapshot = (snapshot_records, snapshot_seconds)
            self.snapshot_dir = snapshot_dir        # None: the job's (``plan``)

        def init(self, handle):
            zipcache.install()      # this worker's later tasks skip re-reading PySpark's archives
            quickack.install(handle)        # state calls' replies without delayed-ACK stalls
            self.state = state.GroupState(handle, self.settings, self.snapshot_dir, *self.snapshot)

        def handleInputRows(self, key, rows, timerValues):
            pdf = pd.concat(list(rows), ignore_index=True)
            pdf = pdf.sort_values(["offset", "sub"] if "sub" in pdf else "offset", kind="stable")
            host, journal, rebuilt = self.state.load(key[0])
            records = list(zip(pdf["arrival"].tolist(), pdf["device"].tolist(), pdf["channel"].tolist(),
                               pdf["payload"].tolist(), pdf["retained"].tolist()))
            offsets = pdf["offset"].tolist()
            # a group merged into an older one (backend.spark.groups) is retired: its state is dropped
            retire = next((i for i, r in enumerate(records) if r[2] == "retire"), None)
            records = records[:retire]
            t, cpu = time.perf_counter(), time.thread_time()      # (CPU apart: the cores are shared)
            cols = run_batch(host, records, self.status_sources, {"rebuilt": rebuilt, "retired": retire is not None,
                                                                   "last_offset": offsets[-1]}, offsets)
            t1, cpu = time.perf_counter(), time.thread_time() - cpu
            if retire is None:
                self.state.store(key[0], host, records, journal)
            else:
                self.state.drop(key[0])
            status = json.loads(cols["body"][-1])
            status.update(host_s=t1 - t, host_cpu_s=cpu, store_s=time.perf_counter() - t1, snapshot_bytes=self.state.snapshot_bytes)
            cols["body"][-1] = json.dumps(status)
            cols["grp"] = key[0]
            cols["seq"] = range(len(cols["kind"]))
            yield pd.DataFrame(cols)

        def close(self):
            pass

    return CoordinatorProcessor


def environment():
    """What local Spark needs (DESIGN.md §9): loopback address, our interpreter, our packages."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    path = os.environ.get("PYTHONPATH", "")
    if ROOT not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, path) if p)


GROUP_SNAPSHOT_RECORDS = 2000   # journal records per group snapshot when keyed by query group
RETAIN_BATCHES = 20     # checkpoint history kept (offset/commit logs, state versions): bounded disk
# Spark's default checkpoint file manager (Hadoop FileContext) renames every offset, commit and state changelog
# file with overwrite, and Hadoop's local file system, without its native library, asks a forked ``readlink``
# process whether the target is a symlink: ~4 processes of ~10 ms per file, ~110 ms a batch on the stream's
# critical path (walCommit, commitOffsets, the state commit; seen with JFR). The FileSystem one renames with
# ``File.renameTo`` (POSIX rename: atomic, replaces the target): the checkpoint is a local path (or a mount).
CHECKPOINT_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager"


def session(master="local[*]", app="quietfleet-backend", partitions=1, retain_batches=RETAIN_BATCHES):
    """A SparkSession configured for the job (RocksDB state store, changelog checkpointing, the last
    ``retain_batches`` batches of checkpoint history kept)."""
    environment()
    from pyspark.sql import SparkSession
    from backend.spark.source import SpoolDataSource
    spark = (SparkSession.builder.master(master).appName(app)
             .config("spark.sql.shuffle.partitions", str(partitions))
             .config("spark.ui.enabled", "false")
             # the stream thread's stop path ran java.util.regex out of the default 1 MB stack
             .config("spark.driver.extraJavaOptions", "-Xss16m")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.streaming.stateStore.providerClass",
                     "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
             .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
             # counting rows reads a key's whole merged value before each merge: a ListState append cost
             # the list's size (a 1M-source snapshot's chunks, quadratically; the journal, growing per batch)
             .config("spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows", "false")
             .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
             .config("spark.sql.streaming.minBatchesToRetain", str(retain_batches))
             .config("spark.sql.streaming.checkpointFileManagerClass", CHECKPOINT_FILE_MANAGER)
             .config("spark.sql.execution.arrow.pyspark.enabled", "true"))
    jars = _kafka_jars()
    if jars:        # Spark's Kafka source (``--ingest kafka``), fetched by scripts/setup.sh: no network at run time
        spark = spark.config("spark.jars", ",".join(jars))
    spark = spark.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if not master.startswith("local"):
        spark.sparkContext.addPyFile(_package_zip())
    spark.dataSource.register(SpoolDataSource)
    return spark


def _kafka_jars():
    """The jars of Spark's Kafka source in ``.cache/kafka/spark`` ([] if not fetched: the spool still works)."""
    from backend.spark import kafkabroker
    return kafkabroker.jars("spark") if kafkabroker.available() else []


def _package_zip():
    """``edge`` and ``backend`` zipped for a cluster's executors."""
    import tempfile
    import zipfile
    path = os.path.join(tempfile.mkdtemp(prefix="qf-pyfiles-"), "quietfleet.zip")
    with zipfile.ZipFile(path, "w") as z:
        for pkg in ("edge", "backend"):
            for base, _, files in os.walk(os.path.join(ROOT, pkg)):
                for f in files:
                    if f.endswith(".py"):
                        full = os.path.join(base, f)
                        z.write(full, os.path.relpath(full, ROOT))
    return path


def plan(spark, spool, fleet, settings, status_sources=False, source_options=None, processor=None, groups=None,
         snapshots=None):
    """The streaming DataFrame of actions for ``fleet`` read from ``spool``: the spool directory, or a
    ``kafkalog.Topic`` (Spark's Kafka source; the bridge routed the records already). Everything after
    the source is the same for both (``processor``: another StatefulProcessor with the same output, e.g.
    the benchmark's no-op floor). ``groups``: a directory for the spool source's routing journal, keying
    the state by query group (``backend.spark.groups``); None keys the whole fleet as one group.
    ``snapshots``: the directory the Python workers' snapshot children write to (``backend.spark.state``)."""
    df = source(spark, spool, fleet, source_options, groups)
    # keyed by group, a group's tasks may land on another Python worker (a Host left behind there catches
    # up from the journal, or rebuilds): group snapshots come often enough that a rebuild replays little
    # (still at least one record per source)
    processor = processor or _processor_class()(hostmod.settings(settings), status_sources,
                                                **({"snapshot_records": GROUP_SNAPSHOT_RECORDS} if groups else {}))
    if getattr(processor, "snapshot_dir", False) is None:
        processor.snapshot_dir = snapshots
    return (df.select("grp", "offset", "sub", "arrival", "device", "channel", "payload", "retained")
            .groupBy("grp")
            .transformWithStateInPandas(processor, OUTPUT_SCHEMA, "Append", "None"))


def source(spark, spool, fleet, options=None, groups=None):
    """The ingest DataFrame (``grp, offset, sub, arrival, device, channel, payload, retained``, ordered by
    ``offset`` then ``sub`` within a group) of the spool directory ``spool`` or of a ``kafkalog.Topic``."""
    from backend.spark import kafkalog
    if isinstance(spool, kafkalog.Topic):
        return kafkalog.read(spark, spool.bootstrap, spool.topic, dict(spool.options, **(options or {})))
    from pyspark.sql import functions as F
    reader = spark.readStream.format("qfspool").option("path", str(spool))
    for k, v in dict(options or {}, **({"groups": groups} if groups else {})).items():
        reader = reader.option(k, str(v))
    df = reader.load()
    if not groups:
        df = df.withColumn("grp", F.lit(fleet)).withColumn("sub", F.lit(0))
    return df


class Sink:
    """foreachBatch target: publish a batch's actions and append its answers, once per batch id."""

    def __init__(self, out_dir, fleet, publisher=None, on_batch=None, spool=None, on_publish=None):
        self.out_dir = out_dir
        self.fleet = fleet
        self.publisher = publisher
        self.on_publish = on_publish      # called before a batch's controls are published (``Bridge.sent``)
        self.on_batch = on_batch          # callback(batch_id, status, answers (Arrow table), published_at)
        self.table = Table(os.path.join(out_dir, "answers"))
        self.marker = os.path.join(out_dir, "sink.committed")
        # after each delivered batch: compact answers, trim the spool writer ``spool`` (None: not ours)
        self.retention = Retention(os.path.join(out_dir, "checkpoint"), self.table, spool)

    def committed(self):
        try:
            with open(self.marker) as f:
                return int(f.read().strip())
        except (FileNotFoundError, ValueError):
            return -1

    def __call__(self, df, batch_id):
        import pyarrow.compute as pc
        table = df.toArrow()
        table = table.sort_by([("at", "ascending"), ("grp", "ascending"), ("seq", "ascending")])
        if batch_id <= self.committed():
            return                        # delivered in full before a restart
        kinds = table.column("kind").to_pylist()
        targets = table.column("target").to_pylist()
        bodies = table.column("body")
        latest, status = {}, {}
        finals = table.column("final").to_pylist()
        for i, (kind, target) in enumerate(zip(kinds, targets)):
            if kind == "answer" or kind == "error":
                latest[(target, "final" if finals[i] else "answer")] = i
                if kind == "error":     # a refused spec is an error; one waiting for its sources is news
                    message = json.loads(bodies[i].as_py()).get("error", "")
                    (log.info if message.startswith(hostmod.WAITING) else log.error)("query %s: %s", target, message)
            elif kind == "retract":
                latest[(target, "answer")] = latest[(target, "final")] = None
            elif kind == "status":
                status[table.column("grp")[i].as_py()] = json.loads(bodies[i].as_py())
        answers = table.filter(pc.equal(table.column("kind"), "answer"))
        self.write_answers(batch_id, answers)
        if self.publisher is not None:
            payloads = table.column("payload")
            if self.on_publish is not None and "down" in kinds:
                self.on_publish()
            for i, kind in enumerate(kinds):
                if kind == "down":
                    self.publisher.publish(topics.device(self.fleet, targets[i], "ctl"), payloads[i].as_py(), qos=1)
            for (qid, ch), i in sorted(latest.items()):      # provisional on .../answer, final on .../final
                body = b"" if i is None else answer_json(json.loads(bodies[i].as_py())).encode()
                self.publisher.publish(topics.query(self.fleet, qid, ch), body, qos=0, retain=True)
            self.publisher.flush()
        published_at = time.time()
        self._replace(os.path.join(self.out_dir, "status.json"),
                      json.dumps(strict({"batch": batch_id, "published_at": published_at, "groups": status,
                                                   "retention": self.retention.stats}),
                                 indent=1).encode())
        self._replace(self.marker, b"%d\n" % batch_id)
        self.retention(batch_id)
        if self.on_batch is not None:
            self.on_batch(batch_id, status, answers, published_at)

    def write_answers(self, batch_id, answers):
        """Every answer change of the batch as one file of the answer table (atomic, replay-safe)."""
        if answers.num_rows == 0:
            return
        import pyarrow as pa
        n = answers.num_rows
        self.table.write(batch_id, pa.table({
            "batch": pa.array([batch_id] * n, pa.int64()), "seq": pa.array(range(n), pa.int32()),
            "time": answers.column("time"), "query": answers.column("target"), "lo": answers.column("lo"),
            "hi": answers.column("hi"), "degraded": answers.column("degraded"),
            "guarantee": answers.column("guarantee"),
            "final": answers.column("final"), "fields": answers.column("body")}))

    @staticmethod
    def _replace(path, data):
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)


def check_settings(out_dir, settings, groups=False, ingest=None):
    """Refuse to resume a checkpoint under different coordinator settings (its state holds them), another
    keying (``groups``) or another ingest (``ingest``: ``"kafka"``; None: the spool); a setting added since
    the checkpoint was made reads as its default."""
    path = os.path.join(out_dir, "settings.json")
    settings = json.loads(json.dumps(dict(hostmod.settings(settings), **({"groups": True} if groups else {}),
                                          **({"ingest": ingest} if ingest else {}))))
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        # a key this version added resumes a checkpoint made before it, at the default it had then
        fresh = json.loads(json.dumps(hostmod.settings({})))
        old = dict({k: fresh[k] for k in settings if k not in old and k in fresh}, **old)
        if old != settings:
            raise ValueError("checkpoint in %s was made with settings %s, not %s: use a new --dir" % (out_dir, old, settings))
        return
    os.makedirs(out_dir, exist_ok=True)
    with open(path, "w") as f:
        json.dump(settings, f)


def start(spark, spool, out_dir, fleet, settings, publisher=None, trigger=0.25, available_now=False,
          status_sources=False, on_batch=None, sink=None, source_options=None, processor=None, writer=None, groups=False, on_publish=None):
    """Start the streaming query over ``spool`` (a spool directory, or a ``kafkalog.Topic``); checkpoint and answer table live under ``out_dir``; ``writer``: the spool's writer (a ``Spool``),
    trimmed behind Spark's commits; ``groups``: one state key per query group (``backend.spark.groups``; the spool source's routing journal in ``out_dir/groups``, the Kafka bridge's wherever
    it runs) instead of one per fleet; ``on_publish``: called before each batch's controls are published (the bridge's ``sent``)."""
    from backend.spark import kafkalog
    kafka = isinstance(spool, kafkalog.Topic)
    check_settings(out_dir, settings, groups, "kafka" if kafka else None)
    sink = sink or Sink(out_dir, fleet, publisher, on_batch, spool=None if kafka else writer, on_publish=on_publish)
    # the spool source routes on the driver (journal in out_dir/groups); on Kafka the bridge routed already
    routing = os.path.join(out_dir, "groups") if groups and not kafka else None
    if processor is None and groups:
        processor = _processor_class()(hostmod.settings(settings), status_sources,
                                       snapshot_records=GROUP_SNAPSHOT_RECORDS)
    w = (plan(spark, spool, fleet, settings, status_sources, source_options, processor, routing,
              os.path.join(os.path.abspath(out_dir), "snapshots")).writeStream
         .foreachBatch(sink).option("checkpointLocation", os.path.join(out_dir, "checkpoint"))
         .queryName("quietfleet-%s" % fleet))
    w = w.trigger(availableNow=True) if available_now else w.trigger(processingTime="%d milliseconds" % int(trigger * 1000))
    return w.start()
