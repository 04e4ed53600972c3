"""Ingest throughput: spool append/read and the qfspool Spark source, in records/s (DESIGN.md §8).

Run ``python -m backend.spark.bench_ingest [--records N] [--no-spark]``; a benchmark, not a test.
Records are report-sized (a 26-byte codec ``report`` on ``qf/bench/d/devNNN/up``).
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import paho.mqtt.client as mqtt

from edge.core import codec, topics
from backend.spark.bridge import Bridge
from backend.spark.spool import Spool

TARGET = 20000   # DESIGN.md §8: sustained reports/s of the Spark backend on 2 cores


def records(n, start=0):
    out = []
    for i in range(start, start + n):
        payload = codec.encode("report", {"src": 0, "epoch": 1, "seq": i, "t": float(i), "v": 0.5, "why": 0})
        out.append((time.time(), topics.device("bench", "dev%03d" % (i % 500), "up"), payload))
    return out


def bench_spool(root, n, batch, fsync):
    data = records(n)
    path = os.path.join(root, "spool-%s" % fsync)
    with Spool(path, fsync=fsync) as spool:
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            spool.append(data[i:i + batch])
        append_s = time.perf_counter() - t0
    reader = Spool(path, readonly=True)
    t0 = time.perf_counter()
    count = sum(1 for _ in reader.scan(0, n))
    read_s = time.perf_counter() - t0
    assert count == n
    return path, n / append_s, n / read_s


def bench_bridge(root, n, inflight):
    """Queue ``n`` QoS 1 messages in the bridge's persistent session while it is down, then time
    how fast a fresh bridge drains them into the spool. The broker's ``max_inflight_messages``
    caps the messages awaiting the bridge's (post-append) PUBACK. Returns (publish rate, drain rate)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = os.path.join(root, "mosquitto-%d.conf" % inflight)
    with open(conf, "w") as f:
        f.write("listener %d 127.0.0.1\nallow_anonymous true\nuser root\nmax_inflight_messages %d\n"
                "max_queued_messages 0\n" % (port, inflight))
    broker = subprocess.Popen([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", conf],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="qf-bench-pub", protocol=mqtt.MQTTv311)
    pub.max_inflight_messages_set(1000)
    pub.max_queued_messages_set(0)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.05)
        with Spool(os.path.join(root, "bridge-%d" % inflight)) as spool:
            bridge = Bridge(spool, "bench", port=port).start()
            bridge.subscribed.wait(10)
            bridge.stop()
            pub.connect("127.0.0.1", port)
            pub.loop_start()
            data = records(n)
            t0 = time.perf_counter()
            infos = [pub.publish(topic, payload, qos=1) for _, topic, payload in data]
            infos[-1].wait_for_publish(120)
            published = n / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            bridge = Bridge(spool, "bench", port=port).start()
            deadline = time.monotonic() + 120
            while spool.latest_offset() < n and time.monotonic() < deadline:
                time.sleep(0.002)
            drained = spool.latest_offset() / (time.perf_counter() - t0)
            bridge.stop()
        return published, drained
    finally:
        pub.disconnect()
        pub.loop_stop()
        broker.terminate()
        broker.wait(10)


def bench_spark(path, n):
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from backend.spark.source import SpoolDataSource
    spark = (SparkSession.builder.master("local[2]").appName("qf-bench-ingest")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(SpoolDataSource)
    figures = []
    with tempfile.TemporaryDirectory() as ckpt:
        for run in ("warm-up", "measured"):
            t0 = time.perf_counter()
            q = (spark.readStream.format("qfspool").option("path", path).load()
                 .writeStream.format("noop").option("checkpointLocation", os.path.join(ckpt, run))
                 .trigger(availableNow=True).start())
            q.awaitTermination()
            seconds = time.perf_counter() - t0
            rows = sum(p["numInputRows"] for p in q.recentProgress)
            assert rows == n, "source delivered %d of %d rows" % (rows, n)
            busy = sum(p["durationMs"].get("triggerExecution", 0) for p in q.recentProgress) / 1000.0
            figures.append((n / seconds, n / busy))
    spark.stop()
    return figures[-1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200000)
    ap.add_argument("--batch", type=int, default=500, help="records per append (the bridge's batch)")
    ap.add_argument("--no-spark", action="store_true")
    ap.add_argument("--no-mqtt", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        print("records: %d, append batch: %d" % (args.records, args.batch))
        for fsync in ("always", "never"):
            path, app, rd = bench_spool(root, args.records, args.batch, fsync)
            print("spool fsync=%-6s append %10.0f records/s   read %10.0f records/s" % (fsync, app, rd))
        if not args.no_mqtt:
            n = min(args.records, 50000)
            for inflight in (20, 1000):
                published, drained = bench_bridge(root, n, inflight)
                print("mqtt bridge, mosquitto max_inflight_messages=%-4d: drains %.0f records/s into the spool "
                      "(%d queued; one paho QoS 1 publisher reached %.0f/s)" % (inflight, drained, n, published))
        if not args.no_spark:
            wall, busy = bench_spark(path, args.records)
            print("spark qfspool source (local[2], availableNow, noop sink): %.0f records/s wall incl. query "
                  "start, %.0f records/s in micro-batches (target backend rate %d)" % (wall, busy, TARGET))
    return 0


if __name__ == "__main__":
    sys.exit(main())
