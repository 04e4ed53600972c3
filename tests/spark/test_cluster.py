"""The job on a real Spark standalone cluster (master + worker on loopback), against the plain reference.

The driver runs in a subprocess: a process holds one SparkContext, and the other Spark tests share a
``local[2]`` one. Its answers and final state must equal what the in-process reference computed.
"""
import json
import os
import subprocess
import sys
import textwrap
import time

from backend.spark.cluster import Standalone
from backend.spark.spool import Spool
from recorded import FLEET, record

SETTINGS = {"protocol": "adaptive", "period": 5.0, "shrink": 0.05}
DRIVER = textwrap.dedent("""
    import json, sys
    from backend.spark import job
    url, spool, out = sys.argv[1:4]
    spark = job.session(url, app="qf-cluster-test", partitions=2)
    q = job.start(spark, spool, out, %r, %r, available_now=True, status_sources=True)
    q.awaitTermination(240)
    print(json.dumps({"error": str(q.exception()) if q.exception() else None,
                      "executors": spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()}))
    spark.stop()
""" % (FLEET, SETTINGS))


def test_job_on_a_standalone_cluster_matches_the_reference(tmp_path):
    records, ref = record(SETTINGS, duration=15.0, seed=3)
    spool, out = str(tmp_path / "spool"), str(tmp_path / "out")
    with Spool(spool, fsync="never") as sp:
        sp.append(records)
    with Standalone(str(tmp_path / "cluster"), workers=1, cores=2) as cluster:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd()] + sys.path))
        p = subprocess.run([sys.executable, "-c", DRIVER, cluster.url, spool, out], env=env,
                           capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["error"] is None, res["error"]
    assert res["executors"] >= 2            # the driver and the worker's executor: not local mode
    from backend.spark import job
    answers = job.read_answers(out)
    assert answers and answers == ref["answers"]
    with open(os.path.join(out, "status.json")) as f:
        status = json.load(f)["groups"][FLEET]
    assert status["records"] == len(records)


KAFKA_DRIVER = textwrap.dedent("""
    import json, os, sys, time
    from backend.spark import job
    from backend.spark.kafkalog import Topic
    url, bootstrap, topic, out, total = sys.argv[1:6]
    spark = job.session(url, app="qf-cluster-kafka-test", partitions=2)
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
    q = job.start(spark, Topic(bootstrap, topic), out, %r, %r, trigger=0.2, status_sources=True)
    print("started", flush=True)
    end = time.monotonic() + 300
    def applied():
        try:
            with open(os.path.join(out, "status.json")) as f:
                return json.load(f)["groups"][%r]["records"]
        except (OSError, ValueError, KeyError):
            return 0
    while q.isActive and applied() < int(total) and time.monotonic() < end:
        executors = max(executors, spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size())
        time.sleep(0.2)
    error = q.exception()
    q.stop()
    print(json.dumps({"error": str(error) if error else None, "executors": executors}))
    spark.stop()
""" % (FLEET, SETTINGS, FLEET))


def test_job_on_kafka_on_two_workers_one_killed_mid_run(tmp_path, kafka_broker):
    """The multi-machine recipe on loopback: the bridge's log on Kafka, the job on a standalone cluster
    of two one-core workers; one worker (and its executor) is SIGKILLed mid-run, its tasks and state
    move to the other: the answers equal the in-process reference's, every record applied once."""
    from backend.spark.kafkalog import KafkaLog
    records, ref = record(SETTINGS, duration=10.0, seed=3)
    out, topic = str(tmp_path / "out"), "qf.rec.cluster"
    cuts = [len(records) // 3, 2 * len(records) // 3, len(records)]
    with Standalone(str(tmp_path / "cluster"), workers=2, cores=1, memory="1g") as cluster, \
            KafkaLog(kafka_broker.bootstrap, topic, FLEET) as log:
        log.append(records[:cuts[0]])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd()] + sys.path))
        p = subprocess.Popen([sys.executable, "-c", KAFKA_DRIVER, cluster.url, kafka_broker.bootstrap, topic, out,
                              str(len(records))], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            end = time.monotonic() + 240
            while _applied(out) < cuts[0]:
                assert p.poll() is None and time.monotonic() < end, p.communicate()[1][-3000:]
                time.sleep(0.2)
            log.append(records[cuts[0]:cuts[1]])
            time.sleep(0.5)
            cluster.kill_worker(1)
            log.append(records[cuts[1]:])
            stdout, stderr = p.communicate(timeout=300)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert p.returncode == 0, stderr[-3000:]
    res = json.loads(stdout.strip().splitlines()[-1])
    assert res["error"] is None, res["error"]
    assert res["executors"] >= 3            # the driver and both workers' executors
    from backend.spark import job
    assert job.read_answers(out) == ref["answers"]
    assert _applied(out) == len(records)


def _applied(out):
    try:
        with open(os.path.join(out, "status.json")) as f:
            return json.load(f)["groups"][FLEET]["records"]
    except (OSError, ValueError, KeyError):
        return 0
