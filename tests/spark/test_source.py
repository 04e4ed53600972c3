"""qfspool streaming source on a real local SparkSession: exactly once, in offset order, across restarts."""
import os
import sys
import time

import pytest

from backend.spark.spool import Spool
from backend.spark.source import SpoolDataSource, SpoolStreamReader, parse_topic
from edge.core import topics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def spark():
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    from pyspark.sql import SparkSession
    session = (SparkSession.builder.master("local[2]").appName("qf-test-source")
               .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
               .config("spark.sql.streaming.noDataMicroBatches.enabled", "false").getOrCreate())
    session.dataSource.register(SpoolDataSource)
    yield session
    session.stop()


def fill(spool, start, n):
    names = [topics.device("f1", "dev%d" % (start % 3), "up"), topics.device("f1", "dev9", "state"),
             topics.query("f1", "q1", "spec"), "junk/topic"]
    spool.append([(1000.0 + i, names[i % 4], b"\x01\x03" + i.to_bytes(4, "little")) for i in range(start, start + n)])


def collector():
    rows = []

    def each(df, batch_id):
        rows.extend(tuple(r) for r in df.select("offset", "arrival", "topic", "device", "channel", "payload").collect())
    return rows, each


def run_available_now(spark, path, checkpoint, **options):
    rows, each = collector()
    reader = spark.readStream.format("qfspool").option("path", str(path))
    for k, v in options.items():
        reader = reader.option(k, v)
    q = (reader.load().writeStream.foreachBatch(each).option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(90), "availableNow query did not finish"
    assert q.exception() is None
    return rows


def test_parse_topic():
    assert parse_topic("qf/f1/d/dev7/up") == ("dev7", "up")
    assert parse_topic("qf/f1/d/dev7/state") == ("dev7", "state")
    assert parse_topic("qf/f1/q/hot/spec") == ("hot", "spec")
    assert parse_topic("qf/f1/d/dev7/ctl") == ("dev7", "ctl")     # a downlink's echo (echo mode)
    for bad in ("qf/f1/q/hot/answer", "qf/f1/d//up", "x/f1/d/a/up", "qf/f1/d/a/up/x", ""):
        assert parse_topic(bad) == (None, None)


def test_partitions_cover_the_range_without_overlap(tmp_path):
    reader = SpoolStreamReader({"path": str(tmp_path), "maxPartitions": "3", "minPartitionRecords": "10"})
    parts = reader.partitions({"offset": 5}, {"offset": 105})
    assert [(p.start, p.end) for p in parts] == [(5, 38), (38, 71), (71, 105)]
    assert [(p.start, p.end) for p in reader.partitions({"offset": 5}, {"offset": 20})] == [(5, 20)]
    assert reader.partitions({"offset": 7}, {"offset": 7}) == []
    with pytest.raises(ValueError, match="path"):
        SpoolStreamReader({})
    with pytest.raises(ValueError, match="maxPartitions"):
        SpoolStreamReader({"path": "x", "maxPartitions": "zero"})


def test_every_record_once_in_offset_order_then_only_new_ones_after_restart(spark, tmp_path):
    spool_dir, ckpt = tmp_path / "spool", tmp_path / "ckpt"
    with Spool(spool_dir, fsync="never", segment_bytes=4096) as spool:
        fill(spool, 0, 3000)
        rows = run_available_now(spark, spool_dir, ckpt, minPartitionRecords="100")
        assert [r[0] for r in rows] == list(range(3000))
        assert rows[0] == (0, 1000.0, topics.device("f1", "dev0", "up"), "dev0", "up", b"\x01\x03\x00\x00\x00\x00")
        assert rows[2][3:5] == ("q1", "spec") and rows[3][3:5] == (None, None)
        assert [r for r in rows if r[0] == 2999][0][5] == b"\x01\x03" + (2999).to_bytes(4, "little")

        fill(spool, 3000, 500)
        again = run_available_now(spark, spool_dir, ckpt)
        assert [r[0] for r in again] == list(range(3000, 3500))
        assert run_available_now(spark, spool_dir, ckpt) == []


def test_running_query_picks_up_appends_exactly_once(spark, tmp_path):
    spool_dir = tmp_path / "spool"
    with Spool(spool_dir, fsync="never") as spool:
        fill(spool, 0, 10)
        rows, each = collector()
        q = (spark.readStream.format("qfspool").option("path", str(spool_dir)).load().writeStream.foreachBatch(each).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="200 milliseconds").start())
        try:
            deadline = time.monotonic() + 60
            while len(rows) < 10 and time.monotonic() < deadline:
                time.sleep(0.05)
            for burst in range(3):
                fill(spool, 10 + 100 * burst, 100)
                time.sleep(0.3)
            while len(rows) < 300 and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            q.stop()
        assert [r[0] for r in rows] == list(range(310))


def test_latest_skips_what_is_already_spooled(spark, tmp_path):
    with Spool(tmp_path / "spool", fsync="never") as spool:
        fill(spool, 0, 20)
    assert run_available_now(spark, tmp_path / "spool", tmp_path / "ckpt", startingOffsets="latest") == []
