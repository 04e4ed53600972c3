"""End to end: Mosquitto + bridge + Spark job + CPython and MicroPython agents (the live demo, short).

The job's answer table must equal the answers of a ``Host`` fed the spooled messages in the same
order (one process, no Spark), and no answer may violate its guarantee against the agents' ground-truth logs.
"""
import json
import os

import pytest

from backend import host
from backend.live.broker import BrokerError, find_mosquitto
from backend.spark import job
from backend.spark.source import RETAINED, parse_topic
from backend.spark.spool import Spool


def reference(spool_dir, n, settings):
    """A ``Host`` (the driver-independent adapter) fed the first ``n`` spool records one by one, in
    one process, without Spark; returns its answers and its coordinator."""
    h = host.Host(settings)
    answers = []
    for rec in Spool(spool_dir, readonly=True).scan(0, n):
        name, channel = parse_topic(rec.topic)
        answers += [a[1] for a in h.record(rec.arrival, name, channel, rec.payload, rec.topic.endswith(RETAINED))
                    if a[0] == "answer"]
    return answers, h.coord


def test_live_fleet_through_spark_equals_a_host_replay_with_zero_violations(job_spark, tmp_path):
    try:
        find_mosquitto()
    except BrokerError as e:
        pytest.skip(str(e))
    from backend.live import demo
    lines = []
    r = demo.run(duration=10.0, cpython=2, micropython=1, workdir=str(tmp_path), spark=job_spark,
                 out=lines.append, show_every=4.0, protocol="deadband")
    assert r["violations"] == 0, "\n".join(lines)
    assert r["uplink"] < r["samples"]           # the filters kept the fleet quieter than send-everything
    assert any("interval" in line for line in lines)   # live answers with their guarantee were shown
    out_dir = os.path.join(str(tmp_path), "backend")
    with open(os.path.join(out_dir, "status.json")) as f:
        status = json.load(f)
    applied = status["groups"]["demo"]["records"]
    answers = job.read_answers(out_dir, upto=status["batch"])
    with open(os.path.join(out_dir, "settings.json")) as f:
        settings = json.load(f)
    assert settings["echo"]                     # the service's coordinator times round trips from echoes
    ref_answers, coord = reference(os.path.join(out_dir, "spool"), applied, host.settings(settings))
    assert len(answers) > 20
    assert answers == ref_answers
    assert status["groups"]["demo"]["stats"] == coord.stats
    assert {q["id"] for q in r["queries"]} == set(coord.queries)
