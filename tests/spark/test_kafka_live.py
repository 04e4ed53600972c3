"""End to end on Kafka: Mosquitto -> bridge -> Kafka -> Spark job -> MQTT (``quietfleet backend --ingest
kafka``), with the Kafka broker SIGKILLed and restarted while devices publish.

The bridge acknowledges an MQTT message only once Kafka has it, so the messages published while Kafka is
down stay with Mosquitto (the bridge's persistent session) and reach Kafka after the restart: every report
published is in the fleet's topic, in order per device, and the job's answer table equals a ``Host``
fed the topic's records in order (one process, no Spark), every record applied exactly once.
"""
import json
import os
import time

import paho.mqtt.client as mqtt
import pytest

from backend import host
from backend.live.broker import Broker, BrokerError, find_mosquitto
from backend.spark import job, kafkalog
from backend.spark.service import Backend
from edge.core import codec, topics

FLEET = "kf"
DEVICES = ["d0", "d1", "d2"]


def _client(broker, user):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=user, protocol=mqtt.MQTTv311)
    c.username_pw_set(*broker.credentials(user))
    c.connect(broker.host, broker.port)
    c.loop_start()
    return c


def _topic_records(bootstrap, topic):
    """Every row of ``topic``, in log order: ``(offset, sub, arrival, device, channel, payload, retained)``."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False})
    rows = []
    try:
        for p in range(c.list_topics(topic, timeout=10).topics[topic].partitions.__len__()):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            c.assign([TopicPartition(topic, p, lo)])
            while lo < hi:
                m = c.poll(5.0)
                assert m is not None and not m.error()
                rows.append(kafkalog.decode(m.value(), m.headers()))
                lo += 1
    finally:
        c.close()
    return sorted(rows, key=lambda r: (r[0], r[1]))


def test_mqtt_to_kafka_to_spark_across_a_kafka_crash(job_spark, kafka_broker, tmp_path):
    try:
        find_mosquitto()
    except BrokerError as e:
        pytest.skip(str(e))
    mq = Broker(str(tmp_path / "mqtt"), FLEET, DEVICES).start()
    backend = Backend(str(tmp_path / "backend"), FLEET, mq.host, mq.port, mq.credentials("backend")[1],
                      {"protocol": "deadband", "period": 5.0}, spark=job_spark, ingest="kafka",
                      kafka=kafka_broker.bootstrap, trigger=0.2, status_sources=True)
    clients = {}
    try:
        backend.start()
        assert backend.bridge.subscribed.wait(20)
        admin = _client(mq, "backend")
        admin.publish(topics.query(FLEET, "total", "spec"),
                      json.dumps({"kind": "sum", "sources": ["s0", "s1", "s2"], "precision": 3.0}), qos=1,
                      retain=True).wait_for_publish(10)
        for i, d in enumerate(DEVICES):
            clients[d] = _client(mq, d)
            clients[d].publish(topics.device(FLEET, d, "state"), codec.encode("birth", {
                "seq": 1, "t": time.time(), "boot": 1, "fw": "test", "caps": 0, "first": 0,
                "sources": [{"name": "s%d" % i, "epoch": 0, "width": 0.0, "v": 100.0}]}), qos=1).wait_for_publish(10)
        sent = {d: [] for d in DEVICES}

        def reports(n):
            for k in range(n):
                for i, d in enumerate(DEVICES):
                    seq = len(sent[d]) + 2
                    payload = codec.encode("report", {"src": 0, "epoch": 0, "seq": seq, "t": time.time(),
                                                      "v": 100.0 + (seq % 7) - 3 * i, "why": 0})
                    sent[d].append(payload)
                    clients[d].publish(topics.device(FLEET, d, "up"), payload, qos=1)
                time.sleep(0.02)
        reports(40)
        assert backend.drain(60)
        kafka_broker.kill()             # Kafka crashes while the devices keep publishing
        time.sleep(0.5)
        acked = backend.bridge.stats["acked"]
        reports(30)
        time.sleep(1.0)
        acked_while_down = backend.bridge.stats["acked"] - acked
        kafka_broker.start()
        reports(30)
        deadline = time.monotonic() + 90
        while backend.bridge.stats["received"] < 3 * 100 + len(DEVICES) + 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert backend.drain(90)
        status = backend.status()
    finally:
        for c in clients.values():
            c.loop_stop()
            c.disconnect()
        backend.stop()
        mq.stop()
    assert acked_while_down == 0            # nothing published while Kafka was down was acknowledged to MQTT
    rows = _topic_records(kafka_broker.bootstrap, kafkalog.topic_name(FLEET))
    assert [r[0] for r in rows] == list(range(len(rows)))           # one dense log: nothing missing
    rows = rows[:status["groups"][FLEET]["records"]]                # what the job applied (ticks went on)
    for d in DEVICES:                                               # every report, in order, once
        assert [r[5] for r in rows if r[3] == d and r[4] == "up"] == sent[d]
    h = host.Host(backend.settings)
    answers = []
    for _, _, arrival, device, channel, payload, retained in rows:
        answers += [a[1] for a in h.record(arrival, device, channel, payload, retained) if a[0] == "answer"]
    out = str(tmp_path / "backend")
    assert job.read_answers(out, upto=status["batch"]) == answers and len(answers) > 20
    assert status["groups"][FLEET]["stats"] == h.coord.stats
