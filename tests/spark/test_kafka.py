"""The job reading Spark's own Kafka source (``--ingest kafka``): the same answers, downlinks and state
as a plain coordinator fed the recorded stream, keyed by fleet or by query group, across a Kafka broker
crash mid-run (DESIGN.md §6 Ingest: MQTT -> Kafka -> Spark, exactly once)."""
import json
import os
import random
import threading
import time

from backend.spark import job, kafkalog
from recorded import FLEET, record, record_groups
from test_groups_job import JOIN, SETTINGS as GROUP_SETTINGS, per_device, per_query
from test_job import FakePublisher, compare, downlinks


def _log(broker, name, groups=None):
    topic = "qf.%s.%s" % (FLEET, name)
    return kafkalog.KafkaLog(broker.bootstrap, topic, FLEET, groups=groups, partitions=2), kafkalog.Topic(broker.bootstrap, topic)


def _status(out):
    try:
        with open(os.path.join(out, "status.json")) as f:
            return json.load(f)["groups"]
    except (OSError, ValueError):
        return {}


def test_the_kafka_log_keeps_a_groups_rows_in_one_partition_in_order(kafka_broker, tmp_path):
    """Records numbered densely across partitions; a group's rows in one partition in offset order; a
    restarted writer numbers on after the topic's tail."""
    from confluent_kafka import Consumer, TopicPartition
    records, _ = record_groups(GROUP_SETTINGS, duration=15.0)
    assert len(records) > 150
    log, topic = _log(kafka_broker, "order", groups=str(tmp_path / "groups"))
    log.append(records[:100])
    log.close()
    log, _ = _log(kafka_broker, "order", groups=str(tmp_path / "groups"))
    assert log.latest_offset() == 100 and log.router.info       # numbering and routing table resumed
    log.append(records[100:])
    log.close()
    c = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": "t", "enable.auto.commit": False})
    seen = {}
    for p in range(2):
        lo, hi = c.get_watermark_offsets(TopicPartition(topic.topic, p))
        c.assign([TopicPartition(topic.topic, p, lo)])
        got = 0
        while got < hi - lo:
            m = c.poll(5.0)
            assert m is not None and not m.error()
            got += 1
            grp = m.key().decode()
            assert kafkalog.partition_of(grp, 2) == p
            seen.setdefault(grp, []).append(kafkalog.decode(m.value(), m.headers())[:2])
    c.close()
    assert len(seen) >= 3
    assert all(rows == sorted(rows) for rows in seen.values())
    assert {o for rows in seen.values() for o, _ in rows} <= set(range(len(records)))


def test_the_job_on_kafka_equals_a_plain_coordinator(job_spark, kafka_broker, tmp_path):
    settings = {"protocol": "deadband", "period": 5.0}
    records, ref = record(settings, duration=20.0)
    log, topic = _log(kafka_broker, "plain")
    out, pub = str(tmp_path / "out"), FakePublisher()
    rng = random.Random(4)
    ends = sorted(rng.sample(range(1, len(records)), 2)) + [len(records)]
    done = 0
    for end in ends:            # three appends, three runs from the checkpoint
        log.append(records[done:end])
        done = end
        q = job.start(job_spark, topic, out, FLEET, settings, publisher=pub, available_now=True, status_sources=True)
        q.awaitTermination(120)
        assert q.exception() is None
    log.close()
    compare(out, ref, len(records))
    assert downlinks(pub.sent) == ref["downs"]


def test_query_groups_on_kafka_merge_and_split_as_on_the_spool(job_spark, kafka_broker, tmp_path):
    """Keyed by query group, the bridge routes (journal under its directory): a join at 10 s merges two
    groups, its removal at 20 s splits them; answers and downlinks equal the in-process group run's."""
    records, ref = record_groups(GROUP_SETTINGS, later=[(10.0, JOIN), (20.0, {"id": "join", "remove": True})])
    log, topic = _log(kafka_broker, "groups", groups=str(tmp_path / "bridge-groups"))
    out, pub = str(tmp_path / "out"), FakePublisher()
    before = job_spark.conf.get("spark.sql.shuffle.partitions")
    job_spark.conf.set("spark.sql.shuffle.partitions", "2")
    try:
        cut = next(i for i, r in enumerate(records) if r[0] > 15.0)
        for part in (records[:cut], records[cut:]):
            log.append(part)
            q = job.start(job_spark, topic, out, FLEET, GROUP_SETTINGS, publisher=pub, available_now=True, groups=True)
            q.awaitTermination(180)
            assert q.exception() is None
    finally:
        job_spark.conf.set("spark.sql.shuffle.partitions", before)
    log.close()
    assert per_query(job.read_answers(out)) == ref["answers"]
    assert per_device(pub.sent) == ref["downs"]
    status = _status(out)
    assert status["d/d0"]["retired"] is True and sum(g.startswith("g/") for g in status) == 2


def test_a_kafka_broker_crash_mid_run_loses_nothing_and_repeats_nothing(job_spark, kafka_broker, tmp_path):
    """The job runs continuously while a writer appends in cuts; the broker is SIGKILLed mid-run and
    restarted on the same ports and data (the writer's appends wait for it, Spark's consumer reconnects):
    answers, downlinks and state equal the plain coordinator's, every record applied exactly once."""
    settings = {"protocol": "deadband", "period": 5.0}
    records, ref = record(settings, duration=20.0, seed=6)
    log, topic = _log(kafka_broker, "crash")
    out, pub = str(tmp_path / "out"), FakePublisher()
    rng = random.Random(8)
    ends = sorted(rng.sample(range(1, len(records)), 7)) + [len(records)]
    crashed = threading.Event()

    def feed():
        done = 0
        for i, end in enumerate(ends):
            log.append(records[done:end])
            done = end
            if i == 3:
                crashed.wait(60)
            time.sleep(rng.uniform(0.1, 0.4))
    q = job.start(job_spark, topic, out, FLEET, settings, publisher=pub, trigger=0.2, status_sources=True)
    feeder = threading.Thread(target=feed)
    feeder.start()
    restarts = 0
    try:
        deadline = time.monotonic() + 150
        while _status(out).get(FLEET, {}).get("records", 0) < ends[2]:
            assert q.isActive and time.monotonic() < deadline, q.exception()
            time.sleep(0.1)
        kafka_broker.kill()                 # a crash mid-run, between the job's batches and the writer's appends
        time.sleep(1.0)
        kafka_broker.start()
        crashed.set()
        while _status(out).get(FLEET, {}).get("records", 0) < len(records):
            if not q.isActive:              # Spark gave up on the broker: restart from the checkpoint
                restarts += 1
                assert restarts <= 2, q.exception()
                q = job.start(job_spark, topic, out, FLEET, settings, publisher=pub, trigger=0.2, status_sources=True)
            assert time.monotonic() < deadline, "the job did not catch up after the broker restart"
            time.sleep(0.1)
        q.processAllAvailable()
    finally:
        crashed.set()
        feeder.join()
        q.stop()
        log.close()
    compare(out, ref, len(records))
    assert downlinks(pub.sent) == ref["downs"]
