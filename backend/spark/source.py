"""Spark streaming source ``qfspool``: the ingest spool read by deterministic offset ranges (DESIGN.md §6 Ingest).

Usage::

    spark.dataSource.register(SpoolDataSource)
    df = spark.readStream.format("qfspool").option("path", SPOOL_DIR).load()

Offsets are ``{"offset": N}`` (one past the last record of a batch), so a restart from a checkpoint
re-reads exactly the ranges Spark planned: nothing lost, nothing repeated. Options: ``path``
(required), ``startingOffsets`` (``earliest`` | ``latest``, for a query without a checkpoint),
``maxPartitions`` (default 2), ``minPartitionRecords`` (default 4096; smaller batches are not
split) and ``groups`` (a directory: route every record to its query group(s) on the driver with
``backend.spark.groups.Router``, journalled there; the rows gain ``grp`` and ``sub``). ``commit`` is the base class's no-op: Spark's checkpoint holds the progress and
``Spool.trim`` (by the spool's writer) reclaims space. Payloads are passed on undecoded; a topic that is not one of ours yields null
``device``/``channel`` so the job can count it, never a failure.
"""
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from backend.spark.groups import Journal
from backend.spark.spool import Spool, SpoolError
from edge.core import topics

SCHEMA = ("offset long, arrival double, topic string, device string, channel string, payload binary, "
          "retained boolean")
# with option ``groups`` (a directory for the routing journal): the rows of every record routed to its
# query group(s) (``backend.spark.groups``), ``sub`` ordering the rows one record yields
GROUPED_SCHEMA = "grp string, sub int, " + SCHEMA
ARROW_SCHEMA = pa.schema([("offset", pa.int64()), ("arrival", pa.float64()), ("topic", pa.string()),
                          ("device", pa.string()), ("channel", pa.string()), ("payload", pa.binary()),
                          ("retained", pa.bool_())])
GROUPED_ARROW = pa.schema([("grp", pa.string()), ("sub", pa.int32())] + list(ARROW_SCHEMA))
BATCH_ROWS = 8192
_CHANNELS = {("d", "up"), ("d", "state"), ("d", "ctl"), ("q", "spec")}
RETAINED = "#retained"   # suffix the bridge gives the topic of a message delivered as retained


def parse_topic(topic):
    """``qf/<fleet>/d/<device>/up|state|ctl`` or ``qf/<fleet>/q/<query>/spec`` -> ``(id, channel)``.

    The id is the device for ``up``/``state``/``ctl`` (a downlink's echo) and the query for ``spec``; the spool's own records
    ``qf/<fleet>/tick|link|inc`` give ``(None, "tick")`` etc.; anything else gives ``(None, None)``.
    A ``RETAINED`` suffix is ignored here (see ``retained``).
    """
    if topic.endswith(RETAINED):
        topic = topic[:-len(RETAINED)]
    t = topics.parse(topic)
    if t is not None and t[1] in topics.SPOOL_CHANNELS and t[0]:
        return None, t[1]
    if t is not None and (t[1], t[3]) in _CHANNELS:
        return t[2], t[3]
    return None, None


def route(router, offset, arrival, topic, payload, rows):
    """Route one log record through ``router`` (``backend.spark.groups.Router``), appending its rows
    ``(grp, sub, offset, arrival, topic, device, channel, payload, retained)`` to ``rows``; returns the
    journal entry ``(offset, device, channel, payload)`` if the record may have changed the table, else
    None. The spool source routes on the driver with it, the Kafka bridge (``kafkalog``) before producing."""
    device, channel = parse_topic(topic)
    out, changed = router.route(device, channel, payload)
    retained = topic.endswith(RETAINED)
    for sub, (grp, name, chan, body) in enumerate(out):
        if grp is not None:
            own = chan == channel and name == device
            rows.append((grp, sub, offset, arrival, topic if own else None, name, chan, body, retained and own))
    return (offset, device, channel, payload) if changed else None


def _batch(cols):
    return pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, ARROW_SCHEMA)],
                                      schema=ARROW_SCHEMA)


class SpoolRange(InputPartition):
    """Offsets ``start <= offset < end`` of one Spark task."""

    def __init__(self, start, end):
        self.start = start
        self.end = end


def _int_option(options, name, default, least):
    raw = options.get(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        value = least - 1
    if value < least:
        raise ValueError("qfspool option %s must be an integer >= %d, got %r" % (name, least, raw))
    return value


class RoutedRows(InputPartition):
    """Rows already routed by the driver (option ``groups``): ``(grp, sub, offset, arrival, topic,
    device, channel, payload, retained)``."""

    def __init__(self, rows):
        self.rows = rows


class SpoolStreamReader(DataSourceStreamReader):
    def __init__(self, options):
        self.path = options.get("path")
        if not self.path:
            raise ValueError("qfspool needs .option('path', SPOOL_DIRECTORY)")
        self.starting = options.get("startingOffsets", "earliest")
        if self.starting not in ("earliest", "latest"):
            raise ValueError("qfspool startingOffsets must be 'earliest' or 'latest', got %r" % self.starting)
        self.max_partitions = _int_option(options, "maxPartitions", 2, 1)
        self.min_records = _int_option(options, "minPartitionRecords", 4096, 1)
        self.groups = options.get("groups")
        self.router, self.pos = None, None     # the routing table as of spool offset ``pos``

    def initialOffset(self):
        spool = Spool(self.path, readonly=True)
        return {"offset": spool.earliest_offset() if self.starting == "earliest" else spool.latest_offset()}

    def latestOffset(self):
        return {"offset": Spool(self.path, readonly=True).latest_offset()}

    def partitions(self, start, end):
        lo, hi = start["offset"], end["offset"]
        if hi <= lo:
            return []
        n = max(1, min(self.max_partitions, (hi - lo) // self.min_records))
        if self.groups:
            rows = self._route(lo, hi)
            return [RoutedRows(rows[len(rows) * i // n:len(rows) * (i + 1) // n]) for i in range(n)]
        cuts = [lo + (hi - lo) * i // n for i in range(n + 1)]
        return [SpoolRange(a, b) for a, b in zip(cuts, cuts[1:])]

    def _route(self, lo, hi):
        """Route offsets [lo, hi) on the driver, journalling what changed the table (so a restart at
        any planned offset rebuilds the same table)."""
        journal = Journal(self.groups)
        if self.pos != lo:
            self.router = journal.router(lo)
        rows, entries = [], []
        for rec in self._scan(lo, hi):
            entry = route(self.router, rec.offset, rec.arrival, rec.topic, rec.payload, rows)
            if entry is not None:
                entries.append(entry)
        journal.append(entries)
        self.pos = hi
        return rows

    def _scan(self, lo, hi):
        count = 0
        for rec in Spool(self.path, readonly=True).scan(lo, hi):
            count += 1
            yield rec
        if count != hi - lo:
            raise SpoolError("spool %s holds only %d of offsets [%d, %d): was it replaced or rolled back?"
                             % (self.path, count, lo, hi))

    def read(self, partition):
        if isinstance(partition, RoutedRows):
            if partition.rows:
                yield pa.RecordBatch.from_arrays(
                    [pa.array(c, type=f.type) for c, f in zip(zip(*partition.rows), GROUPED_ARROW)],
                    schema=GROUPED_ARROW)
            return
        cols = ([], [], [], [], [], [], [])
        for rec in self._scan(partition.start, partition.end):
            device, channel = parse_topic(rec.topic)
            row = (rec.offset, rec.arrival, rec.topic, device, channel, rec.payload, rec.topic.endswith(RETAINED))
            for col, value in zip(cols, row):
                col.append(value)
            if len(cols[0]) == BATCH_ROWS:
                yield _batch(cols)
                cols = ([], [], [], [], [], [], [])
        if cols[0]:
            yield _batch(cols)


class SpoolDataSource(DataSource):
    @classmethod
    def name(cls):
        return "qfspool"

    def schema(self):
        return GROUPED_SCHEMA if self.options.get("groups") else SCHEMA

    def streamReader(self, schema):
        return SpoolStreamReader(self.options)
