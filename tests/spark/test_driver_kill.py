"""The Spark driver SIGKILLed while it processes a batch (DESIGN.md §6 restart), restarted with the same
``--dir``: the answer table equals a clean run's (the plain-coordinator reference of the recorded
stream), the state equals it (nothing applied twice, nothing lost) and the devices get every control
once (replayed publications carry sequence numbers they drop)."""
import json
import os
import signal
import subprocess
import sys
import time

from backend.spark.spool import Spool
from recorded import record
from test_job import compare, downlinks

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _job(spool, out, settings, marker=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE]))
    args = [sys.executable, os.path.join(HERE, "jobproc.py"), spool, out, json.dumps(settings)] + ([marker] if marker else [])
    return subprocess.Popen(args, env=env, cwd=out, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=open(os.path.join(out, "jobproc.log"), "ab"), text=True)


def _records(out):
    try:
        with open(os.path.join(out, "status.json")) as f:
            return json.load(f)["groups"]["rec"]["records"]
    except (OSError, ValueError, KeyError):
        return 0


def _wait(pred, timeout, what, proc):
    end = time.monotonic() + timeout
    while not pred():
        assert proc.poll() is None, "the job process exited: %s" % what
        assert time.monotonic() < end, "timed out waiting for " + what
        time.sleep(0.1)


def _published(out):
    with open(os.path.join(out, "published.jsonl")) as f:
        return [(t, bytes.fromhex(p), q, r) for t, p, q, r in map(json.loads, f)]


def test_driver_sigkill_mid_batch_then_restart_equals_a_clean_run(tmp_path):
    spool = str(tmp_path / "spool")
    with Spool(spool, fsync="never") as sp:
        _driver_kill(tmp_path, sp, spool)


def test_driver_sigkill_mid_batch_on_kafka_equals_a_clean_run(tmp_path, kafka_broker):
    """The same on Spark's Kafka source: the restarted driver re-reads the planned batch's Kafka offsets
    from its checkpoint."""
    from backend.spark.kafkalog import KafkaLog
    topic = "qf.rec.driverkill"
    with KafkaLog(kafka_broker.bootstrap, topic, "rec") as log:
        _driver_kill(tmp_path, log, "kafka://%s/%s" % (kafka_broker.bootstrap, topic))


def _driver_kill(tmp_path, sp, spool):
    settings = {"protocol": "deadband", "period": 5.0}
    records, ref = record(settings, duration=12.0)
    out = str(tmp_path / "out")
    os.makedirs(out)
    marker = os.path.join(out, "batches")
    cuts = [len(records) // 3, 2 * len(records) // 3, len(records)]
    t_begin = time.monotonic()
    sp.append(records[:cuts[0]])
    proc = _job(spool, out, settings, marker)
    try:
        _wait(lambda: _records(out) == cuts[0], 180, "the first batches", proc)
        sp.append(records[cuts[0]:cuts[1]])

        def processing():       # a batch past everything committed has started
            if not os.path.exists(marker):
                return False
            with open(marker) as f:
                return any(int(x) >= cuts[0] for x in f.read().split())
        _wait(processing, 60, "a batch in progress", proc)
        os.killpg(proc.pid, signal.SIGKILL)         # the driver, its JVM and its Python workers
        proc.wait()
        phases = [time.monotonic() - t_begin]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    killed_at = _records(out)
    proc = _job(spool, out, settings)
    try:
        sp.append(records[cuts[1]:])
        _wait(lambda: _records(out) == len(records), 180, "every record after the restart", proc)
        phases.append(time.monotonic() - t_begin)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print("\nSpark driver SIGKILL mid-batch (%s): %d of %d records committed at the kill (at %.1fs); caught up at "
          "%.1fs after a restart; %.1fs" % (spool, killed_at, len(records), phases[0], phases[1], time.monotonic() - t_begin))
    assert cuts[0] <= killed_at < cuts[1]       # killed before the batch in progress was committed
    compare(out, ref, len(records))             # answers, sources and counters of a clean run
    sent = _published(out)
    assert downlinks(sent) == ref["downs"]
    assert len([s for s in sent if s[0].endswith("/ctl")]) >= len(ref["downs"])
