"""The Spark job as its own process, for the driver-kill tests: ``python jobproc.py SPOOL OUT SETTINGS [MARKER]``.

SPOOL is a spool directory or ``kafka://HOST:PORT/TOPIC`` (the fleet's log on Kafka).

Runs ``backend.spark.job`` on the spool until SIGTERM, publishing to ``OUT/published.jsonl`` (one
``[topic, payload hex, qos, retain]`` line per message, as a broker would receive them). With MARKER,
every batch first appends its lowest spool offset there and then takes 2 s, so a test can kill the
process while a batch is being processed.
"""
import json
import os
import signal
import sys
import threading
import time


class FilePublisher:
    def __init__(self, path):
        self.f = open(path, "a", buffering=1)

    def publish(self, topic, payload, qos, retain=False):
        self.f.write(json.dumps([topic, bytes(payload).hex(), qos, retain]) + "\n")

    def flush(self):
        self.f.flush()


def main(spool, out, settings, marker=None):
    from backend.spark import job
    from recorded import FLEET
    processor = None
    if marker:
        base = job._processor_class()

        class Slow(base):
            def handleInputRows(self, key, rows, timerValues):
                rows = list(rows)
                with open(marker, "a") as f:
                    f.write("%d\n" % min(int(r["offset"].min()) for r in rows))
                time.sleep(2.0)
                return super().handleInputRows(key, iter(rows), timerValues)

        from backend import host
        processor = Slow(host.settings(settings), True)
    if spool.startswith("kafka://"):
        from backend.spark.kafkalog import Topic
        bootstrap, topic = spool[len("kafka://"):].split("/", 1)
        spool = Topic(bootstrap, topic)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    spark = job.session("local[2]", app="qf-test-jobproc")
    q = job.start(spark, spool, out, FLEET, settings, publisher=FilePublisher(os.path.join(out, "published.jsonl")),
                  trigger=0.2, status_sources=True, processor=processor)
    print("started", flush=True)
    while not stop.wait(0.2) and q.isActive:
        pass
    q.stop()
    spark.stop()
    return 0 if q.exception() is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), *sys.argv[4:5]))
