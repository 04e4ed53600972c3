"""The Spark job against a plain Coordinator fed the same recorded stream, across crashes and restarts."""
import json
import os
import random
import threading
import time

import pytest

from backend.coordinator.protocols import PROTOCOLS
from backend.spark import job
from backend import host as hostmod
from backend.answers import strict
from backend.host import Host
from backend.spark.answers import Table
from backend.spark.spool import Spool
from edge.core import codec
from backend.spark.source import parse_topic
from recorded import FLEET, record


class Crash(RuntimeError):
    pass


class FakePublisher:
    """Keeps what the sink publishes; ``fail_after`` makes the n-th publish raise (a crash mid-batch)."""

    def __init__(self):
        self.sent = []
        self.fail_after = None

    def publish(self, topic, payload, qos, retain=False):
        if self.fail_after is not None:
            if self.fail_after == 0:
                self.fail_after = None
                raise Crash("injected crash while publishing")
            self.fail_after -= 1
        self.sent.append((topic, payload, qos, retain))

    def flush(self):
        pass


class CrashingSink(job.Sink):
    """Crashes once after delivering its ``crash_at``-th batch, before Spark could commit it."""
    crash_at = None

    def __call__(self, df, batch_id):
        super().__call__(df, batch_id)
        if self.crash_at is not None:
            self.crash_at -= 1
            if self.crash_at == 0:
                self.crash_at = None
                raise Crash("injected crash after delivery")


def run_until_done(spark, spool, out, settings, sink, total, timeout=120, processor=None):
    """Run the job (re-starting it from its checkpoint after every crash) until it has applied
    ``total`` records; returns the number of crashes."""
    crashes = 0
    deadline = time.monotonic() + timeout
    status = os.path.join(out, "status.json")
    while True:
        q = job.start(spark, spool, out, FLEET, settings, trigger=0.2, status_sources=True, sink=sink,
                      processor=processor)
        try:
            while q.isActive and time.monotonic() < deadline:
                if os.path.exists(status):
                    with open(status) as f:
                        if json.load(f)["groups"].get(FLEET, {}).get("records") == total and _settled(q):
                            return crashes
                time.sleep(0.1)
            assert time.monotonic() < deadline, "job did not finish"
        finally:
            q.stop()
        assert "injected crash" in str(q.exception()), q.exception()
        crashes += 1


def _settled(q):
    """Whether the last batch was committed: the sink writes its status before it may still crash."""
    try:
        q.processAllAvailable()
    except Exception:
        return False        # it crashed after the status write; the caller counts the crash
    return q.exception() is None


def downlinks(sent):
    """ctl messages in publish order with replays removed (an agent drops a repeated sequence number)."""
    seen, out = set(), []
    for topic, payload, qos, retain in sent:
        if topic.endswith("/ctl"):
            device = topic.split("/")[3]
            key = (device, codec.decode(payload)[1]["seq"])
            if key not in seen:
                seen.add(key)
                out.append((device, payload))
    return out


def test_host_pending_specs_errors_and_removal():
    f = Host(protocol="naive", period=5.0)
    birth = codec.encode("birth", {"seq": 1, "t": 1.0, "boot": 3, "fw": "x", "caps": 0, "first": 0,
                                   "sources": [{"name": "a", "epoch": 0, "width": 0.0, "v": 10.0}]})
    out = f.record(1.0, "q1", "spec", json.dumps({"kind": "sum", "sources": ["a"], "precision": 2}).encode())
    assert out == [("error", "q1", "waiting for sources a to be born")] and f.pending
    out = f.record(2.0, "dev", "state", birth)
    answers = [a[1] for a in out if a[0] == "answer"]
    assert [(a["time"], a["query"], a["degraded"]) for a in answers] == [(2.0, "q1", False)] and not f.pending
    assert answers[0]["lo"] == pytest.approx(10.0) and answers[0]["hi"] == pytest.approx(10.0)
    assert f.record(3.0, "q2", "spec", b"{not json")[0][0] == "error"
    assert f.record(3.0, "q2", "spec", b"\xff\xfe")[0][0] == "error"           # not UTF-8: refused, no crash
    assert f.record(3.0, "q2", "spec", b"[1]") == [("error", "q2", "query spec must be a JSON object")]
    assert "kind" in f.record(3.0, "q2", "spec", b'{"kind": "median"}')[0][2]
    assert f.record(3.0, "q3", "spec", b'{"id": "other", "kind": "sum"}')[0][0] == "error"
    assert f.stats["bad_specs"] == 5
    assert f.record(4.0, "q1", "spec", b"")[-1] == ("retract", "q1") and "q1" not in f.coord.queries
    assert f.record(4.0, None, None, b"junk") == [] and f.stats["foreign"] == 1
    # a retained (possibly stale) birth is not trusted: the device is asked for a fresh one
    g = Host(protocol="deadband")
    out = g.record(5.0, "dev", "state", birth, retained=True)
    assert [codec.decode(a[2])[0] for a in out] == ["rebirth"] and not g.coord.cache.sources


def test_checker_sees_a_lost_record():
    """The comparison below is not vacuous: dropping one report changes answers and state."""
    records, ref = record({"protocol": "deadband", "period": 5.0}, duration=10.0)
    drop = next(i for i, r in enumerate(records) if r[1].endswith("/up") and codec.decode(r[2])[0] == "report" and i > 40)
    f = Host(protocol="deadband", period=5.0, shrink=0.0)
    answers = []
    for i, (t, topic, payload) in enumerate(records):
        if i != drop:
            answers += [a[1] for a in f.record(t, *parse_topic(topic), payload) if a[0] == "answer"]
    assert answers != ref["answers"] or hostmod.digest(f.coord) != hostmod.digest(ref["coord"])


def compare(out, ref, total):
    assert job.read_answers(out) == ref["answers"]
    with open(os.path.join(out, "status.json")) as f:
        status = json.load(f)["groups"][FLEET]
    assert status["records"] == total
    assert status["sources"] == strict(hostmod.digest(ref["coord"])["sources"])
    assert status["stats"] == ref["coord"].stats


def feed_in_cuts(spool, records, rng, cuts=6, delivered=None):
    """A thread appending ``records`` to ``spool`` in random cuts with pauses, as a bridge would;
    with ``delivered`` (a list) it waits until the previous cut has grown it, one batch per cut."""
    ends = sorted(rng.sample(range(1, len(records)), cuts - 1)) + [len(records)]

    def feed():
        done = 0
        give_up = time.monotonic() + 300       # the job failed: let the test report it, not hang
        for i, cut in enumerate(ends):
            while delivered is not None and len(delivered) < i and time.monotonic() < give_up:
                time.sleep(0.05)
            spool.append(records[done:cut])
            done = cut
            time.sleep(rng.uniform(0.1, 0.8))
    feeder = threading.Thread(target=feed)
    feeder.start()
    return feeder


def run_hooked(spark, tmp_path, before_batch, snapshot_records, seed, cuts):
    """The job over ``record``'s fleet, ``before_batch(first offset)`` called in the Python worker before
    each batch (to play with its cache of Hosts); checks the answers, downlinks and state against the
    plain reference bit for bit and returns the batches' statuses."""
    settings = {"protocol": "deadband", "period": 5.0}
    records, ref = record(settings, duration=30.0)
    spool, out = str(tmp_path / "spool"), str(tmp_path / "out")

    class Hooked(job._processor_class()):
        def handleInputRows(self, key, rows, timerValues):
            rows = list(rows)
            before_batch(min(int(r["offset"].min()) for r in rows))
            return super().handleInputRows(key, iter(rows), timerValues)

    statuses = []
    pub = FakePublisher()
    sink = job.Sink(out, FLEET, pub, on_batch=lambda b, status, a, t: statuses.append(status[FLEET]))
    processor = Hooked(hostmod.settings(settings), True, snapshot_records=snapshot_records)
    with Spool(spool, fsync="never") as sp:
        feeder = feed_in_cuts(sp, records, random.Random(seed), cuts=cuts, delivered=statuses)
        try:
            assert run_until_done(spark, spool, out, settings, sink, len(records), processor=processor) == 0
        finally:
            feeder.join()
    compare(out, ref, len(records))
    assert downlinks(pub.sent) == ref["downs"]
    assert sum(s["batch_records"] for s in statuses) == len(records)
    return statuses


def test_cache_misses_rebuild_from_snapshot_and_journal(job_spark, tmp_path):
    """Workers that lose their cached Host mid-run (a restart) rebuild it from the snapshot plus
    journal and give the plain reference's answers, downlinks and state bit for bit."""
    from backend.spark import state

    def forget_at_odd_offsets(first):
        if first % 2:
            state.forget()
    statuses = run_hooked(job_spark, tmp_path, forget_at_odd_offsets, 150, seed=9, cuts=12)
    assert len(statuses) >= 12 and any(s["rebuilt"] is True for s in statuses)


def test_a_host_left_behind_on_another_worker_catches_up_from_the_journal(job_spark, tmp_path):
    """Each batch runs on one of two simulated Python workers (their caches swapped in, as Spark gives
    a key no worker affinity): the other worker's Host is then batches behind and replays only the
    journal rows it missed, across a snapshot too; the answers, downlinks and
    state equal the plain reference's bit for bit."""
    from backend.spark import state

    def one_of_two_workers(first):
        # kept on the module: the processor is unpickled afresh for every batch
        workers = state.__dict__.setdefault("_two_workers", [({}, {}, [0]), ({}, {}, [0])])
        state._CACHE, state._SIZES, state._HELD = workers[random.Random(first).random() < 0.5]
    statuses = run_hooked(job_spark, tmp_path, one_of_two_workers, 600, seed=11, cuts=16)
    assert sum(s["rebuilt"] == "caught up" for s in statuses) >= 2, [s["rebuilt"] for s in statuses]


def test_crashes_and_restarts_lose_nothing_and_repeat_nothing(job_spark, tmp_path):
    settings = {"protocol": "deadband", "period": 5.0}
    records, ref = record(settings, duration=30.0)
    spool, out = str(tmp_path / "spool"), str(tmp_path / "out")
    rng = random.Random(5)
    pub = FakePublisher()
    pub.fail_after = rng.randrange(1, 6)     # crash in the middle of publishing the first batch
    sink = CrashingSink(out, FLEET, pub)
    sink.crash_at = 1                        # then after delivering its replay, before Spark's commit
    with Spool(spool, fsync="never") as sp:
        feeder = feed_in_cuts(sp, records, rng)
        try:
            crashes = run_until_done(job_spark, spool, out, settings, sink, len(records))
        finally:
            feeder.join()
    assert crashes == 2
    compare(out, ref, len(records))
    assert downlinks(pub.sent) == ref["downs"]
    last = {}
    for topic, payload, qos, retain in pub.sent:
        if topic.endswith("/answer"):
            last[topic.split("/")[3]] = json.loads(payload)
    for qid, fields in ref["coord"].last.items():
        assert last[qid]["lo"] == fields["lo"] and last[qid]["hi"] == fields["hi"]
        assert last[qid]["guarantee"] == "interval"


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_every_protocol_runs_through_the_job(job_spark, tmp_path, protocol):
    settings = {"protocol": protocol, "period": 5.0}
    records, ref = record(settings, duration=15.0, seed=2)
    with Spool(tmp_path / "spool", fsync="never") as sp:
        sp.append(records)
    q = job.start(job_spark, str(tmp_path / "spool"), str(tmp_path / "out"), FLEET,
                  settings, available_now=True, status_sources=True)
    q.awaitTermination(120)
    assert q.exception() is None
    compare(str(tmp_path / "out"), ref, len(records))


MIXED = [{"id": "mean", "kind": "avg", "sources": "all", "precision": 2.0, "lag": 3.0},
         {"id": "top", "kind": "max", "sources": ["s0", "s3", "s5"], "precision": 3.0}]


@pytest.mark.parametrize("protocol", ["deadband", "adaptive"])
def test_a_lagged_avg_and_a_real_time_max_on_the_same_sources_through_the_job(job_spark, tmp_path, protocol):
    # the MAX's sources keep their filters beside their segments (reports carry them: kind rsegs); the
    # answer table and its final column hold the final answers (the AVG's and the MAX's) as the reference
    # coordinator made them
    settings = {"protocol": protocol, "period": 5.0}
    records, ref = record(settings, duration=20.0, seed=3, queries=MIXED)
    kinds = [codec.decode(p)[0] for _, topic, p in records if topic.endswith("/up")]
    assert kinds.count("rsegs") > 5 and kinds.count("segs") > 5
    with Spool(tmp_path / "spool", fsync="never") as sp:
        sp.append(records)
    out = str(tmp_path / "out")
    q = job.start(job_spark, str(tmp_path / "spool"), out, FLEET, settings, available_now=True, status_sources=True)
    q.awaitTermination(120)
    assert q.exception() is None
    compare(out, ref, len(records))
    table = Table(os.path.join(out, "answers")).read(columns=("query", "final", "fields")).to_pylist()
    finals = [r for r in table if r["final"]]
    assert all(json.loads(r["fields"])["final"] for r in finals)       # (every aggregate query has finals: both)
    assert sum(r["query"] == "mean" for r in finals) >= 10 and any(r["query"] == "top" for r in finals)
    assert any(r["query"] == "top" and not r["final"] for r in table)


def test_a_checkpoint_resumes_after_settings_gain_a_key_at_its_default(tmp_path):
    out = str(tmp_path)
    job.check_settings(out, {"protocol": "deadband", "period": 5.0})
    with open(os.path.join(out, "settings.json")) as f:
        made = json.load(f)
    older = {k: v for k, v in made.items() if k not in ("rate", "registry")}     # made before those keys existed
    with open(os.path.join(out, "settings.json"), "w") as f:
        json.dump(older, f)
    job.check_settings(out, {"protocol": "deadband", "period": 5.0})           # resumes: the new keys at default
    with pytest.raises(ValueError, match="use a new --dir"):
        job.check_settings(out, {"protocol": "deadband", "period": 5.0, "rate": 50.0})  # not the default: refused
    with pytest.raises(ValueError, match="use a new --dir"):
        job.check_settings(out, {"protocol": "deadband", "period": 6.0})


def test_a_checkpoint_made_by_sparks_default_file_manager_resumes_under_the_jobs(job_spark, tmp_path):
    """The job writes its checkpoint through ``job.CHECKPOINT_FILE_MANAGER`` (renames without Hadoop's forked
    ``readlink``); a checkpoint that Spark's default FileContext manager wrote (every earlier release of the
    job) resumes under it, and back, with nothing lost or repeated: the plain reference's answers, downlinks
    and state bit for bit."""
    key = "spark.sql.streaming.checkpointFileManagerClass"
    assert job_spark.conf.get(key) == job.CHECKPOINT_FILE_MANAGER
    default = "org.apache.spark.sql.execution.streaming.FileContextBasedCheckpointFileManager"
    settings = {"protocol": "deadband", "period": 5.0}
    records, ref = record(settings, duration=30.0, seed=4)
    spool, out = str(tmp_path / "spool"), str(tmp_path / "out")
    pub = FakePublisher()
    sink = job.Sink(out, FLEET, pub)
    done = 0
    with Spool(spool, fsync="never") as sp:
        for manager, end in zip((default, job.CHECKPOINT_FILE_MANAGER, default),
                                (len(records) // 3, 2 * len(records) // 3, len(records))):
            job_spark.conf.set(key, manager)
            try:
                sp.append(records[done:end])
                done = end
                q = job.start(job_spark, spool, out, FLEET, settings, trigger=0.2, status_sources=True, sink=sink)
                try:
                    q.processAllAvailable()
                finally:
                    q.stop()
                assert q.exception() is None
            finally:
                job_spark.conf.set(key, job.CHECKPOINT_FILE_MANAGER)
    compare(out, ref, len(records))
    assert downlinks(pub.sent) == ref["downs"]
