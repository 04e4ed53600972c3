"""Bounded disk: the sink trims the spool behind Spark's commits and compacts the answer table, Spark
keeps a bounded checkpoint history, and a crash after a trim still replays to the reference's answers."""
import os
import random

import pytest

from backend.spark.retention import committed_offset
from backend.spark.spool import Spool
from recorded import FLEET, record
from test_job import CrashingSink, FakePublisher, compare, downlinks, feed_in_cuts, run_until_done

RETAIN = 3


@pytest.fixture
def short_history(job_spark):
    old = job_spark.conf.get("spark.sql.streaming.minBatchesToRetain")
    job_spark.conf.set("spark.sql.streaming.minBatchesToRetain", str(RETAIN))
    yield job_spark
    job_spark.conf.set("spark.sql.streaming.minBatchesToRetain", old)


def test_many_batches_keep_disk_bounded_and_a_restart_after_trim_replays(short_history, tmp_path):
    settings = {"protocol": "deadband", "period": 5.0}
    records, ref = record(settings, duration=30.0)
    spool, out = str(tmp_path / "spool"), str(tmp_path / "out")
    statuses = []
    pub = FakePublisher()
    with Spool(spool, fsync="never", segment_bytes=2048) as sp:
        sink = CrashingSink(out, FLEET, pub, on_batch=lambda b, status, a, t: statuses.append(b), spool=sp)
        sink.table.fan = 2
        sink.crash_at = 7                     # after delivering (and trimming behind) batch 6, before its commit
        feeder = feed_in_cuts(sp, records, random.Random(11), cuts=12, delivered=statuses)
        try:
            crashes = run_until_done(short_history, spool, out, settings, sink, len(records), timeout=500)
        finally:
            feeder.join()
        earliest = sp.earliest_offset()
        segments = [n for n in os.listdir(spool) if n.endswith(".seg")]
    assert crashes == 1
    compare(out, ref, len(records))                     # nothing lost or repeated across the trimmed restart
    assert downlinks(pub.sent) == ref["downs"]
    batches = max(statuses) + 1
    assert batches >= 12
    # the spool holds only what a restart needs: below the last committed end offset, at most the active segment
    end = committed_offset(os.path.join(out, "checkpoint"))
    assert 0 < earliest <= end
    total = sum(len(t) + len(p) + 30 for _, t, p in records)
    assert len(segments) * 2048 < total / 3, (len(segments), total)
    # answer files: at most fan per level, far fewer than batches with answers
    files = sink.table.files()
    assert len(files) <= 2 * 4 and len(os.listdir(sink.table.dir)) == len(files)
    # Spark's checkpoint history: the last RETAIN batches (plus the one in flight when it purged)
    for log in ("offsets", "commits"):
        kept = [n for n in os.listdir(os.path.join(out, "checkpoint", log)) if n.isdigit()]
        assert len(kept) <= RETAIN + 2, (log, sorted(kept, key=int))


def test_committed_offset_reads_the_last_committed_batch(tmp_path):
    cp = tmp_path / "cp"
    assert committed_offset(str(cp)) is None
    (cp / "offsets").mkdir(parents=True)
    (cp / "commits").mkdir()
    for b, off in ((3, 40), (4, 55), (5, 70)):
        (cp / "offsets" / str(b)).write_text('v1\n{"batchWatermarkMs":0}\n{"offset": %d}' % off)
    for b in (3, 4):
        (cp / "commits" / str(b)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    assert committed_offset(str(cp)) == 55           # batch 5 is planned, not committed: it may be replayed
