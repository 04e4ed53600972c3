"""The Spark job keyed by query group (``job.start(groups=True)``) against plain coordinators."""
import json
import os

from backend.spark import job
from backend.spark.spool import Spool
from recorded import FLEET, GROUP_QUERIES, record, record_groups
from test_job import FakePublisher

SETTINGS = {"protocol": "adaptive", "period": 5.0}
JOIN = {"id": "join", "kind": "sum", "sources": ["s0", "s4"], "precision": 2.0}


def run(spark, spool, out, records, pub):
    """Append ``records`` to the spool and run the job over everything there (availableNow)."""
    with Spool(spool, fsync="never") as sp:
        sp.append(records)
    # two shuffle partitions: the groups' keys spread over both cores (fixed by the checkpoint after this)
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    try:
        q = job.start(spark, spool, out, FLEET, SETTINGS, publisher=pub, available_now=True, groups=True)
        q.awaitTermination(180)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
    assert q.exception() is None
    with open(os.path.join(out, "status.json")) as f:
        return json.load(f)["groups"]


def per_query(answers):
    out = {}
    for a in answers:
        out.setdefault(a["query"], []).append(a)
    return out


def per_device(sent):
    """ctl payloads per device in publish order (no crash here, so no replays; a device adopted by
    another group gets its sequence numbers anew from its new owner, after a rebirth)."""
    out = {}
    for topic, payload, qos, retain in sent:
        if topic.endswith("/ctl"):
            out.setdefault(topic.split("/")[3], []).append(payload)
    return out


def test_independent_groups_give_a_plain_coordinators_answers(job_spark, tmp_path):
    """Three independent groups, one state key each: per query, the answers equal those of one plain
    coordinator over the whole fleet, and per device the downlinks equal the in-process group run's."""
    records, ref = record_groups(SETTINGS)
    _, plain = record(SETTINGS, devices=6, duration=30.0, queries=GROUP_QUERIES)
    assert ref["checked"] > 300 and sorted(ref["hosts"]) == ["d/d0", "d/d2", "d/d4"]
    pub = FakePublisher()
    status = run(job_spark, str(tmp_path / "spool"), str(tmp_path / "out"), records, pub)
    got = per_query(job.read_answers(str(tmp_path / "out")))
    assert got == per_query(plain["answers"]) == ref["answers"]
    assert per_device(pub.sent) == ref["downs"]
    # devices were born before the queries, each into a group of its own, retired as the queries came
    assert {g for g, s in status.items() if not s["retired"]} == {"d/d0", "d/d2", "d/d4"}
    assert {g for g, s in status.items() if s["retired"]} == {"d/d1", "d/d3", "d/d5"}


def test_a_query_joining_two_groups_merges_them_across_a_restart(job_spark, tmp_path):
    """``join`` (t = 10 s) names sources of groups d/d0 and d/d2: d/d2 is retired, its query and devices
    move to d/d0 (a rebirth each). The job, stopped and restarted from its checkpoint after the join
    (the routing table rebuilt from its journal), gives the in-process run's answers and downlinks;
    that run's answers contain the exact aggregates (checked in ``record_groups``)."""
    records, ref = record_groups(SETTINGS, later=[(10.0, JOIN)])
    assert sorted(ref["hosts"]) == ["d/d0", "d/d4"] and ref["checked"] > 300 and ref["answers"]["join"]
    cut = next(i for i, r in enumerate(records) if r[0] > 15.0)
    spool, out, pub = str(tmp_path / "spool"), str(tmp_path / "out"), FakePublisher()
    first = run(job_spark, spool, out, records[:cut], pub)
    assert first["d/d2"]["retired"] is True
    run(job_spark, spool, out, records[cut:], pub)
    assert per_query(job.read_answers(out)) == ref["answers"]
    assert per_device(pub.sent) == ref["downs"]
    with open(os.path.join(out, "groups", "journal"), "rb") as f:
        assert f.read()


def test_removing_the_joining_query_splits_the_group_again(job_spark, tmp_path):
    """``join`` merges d/d0 and d/d2 at t = 10 s and is removed at t = 20 s: the merged group retires
    after retracting it, and its two parts run on as fresh groups (their queries registered again,
    their devices adopted). The job gives the in-process run's answers and downlinks; that run's
    answers contain the exact aggregates."""
    records, ref = record_groups(SETTINGS, later=[(10.0, JOIN), (20.0, {"id": "join", "remove": True})])
    assert [h for h in sorted(ref["hosts"]) if not h.startswith("g/")] == ["d/d4"] and len(ref["hosts"]) == 3
    assert ref["checked"] > 300 and max(a["time"] for a in ref["answers"]["join"]) <= 20.0
    spool, out, pub = str(tmp_path / "spool"), str(tmp_path / "out"), FakePublisher()
    status = run(job_spark, spool, out, records, pub)
    assert status["d/d0"]["retired"] is True and sum(g.startswith("g/") for g in status) == 2
    assert per_query(job.read_answers(out)) == ref["answers"]
    assert per_device(pub.sent) == ref["downs"]
