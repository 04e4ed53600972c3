"""End to end: Mosquitto + bridge + Spark job + CPython and MicroPython agents (the live demo, short).

The job's answer table must equal the answers of a plain Coordinator fed the spooled messages in
the same order, and no answer may violate its guarantee against the agents' ground-truth logs.
"""
import json
import math
import os

import pytest

from backend.broker import BrokerError, find_mosquitto
from backend.coordinator.core.coordinator import Coordinator
from backend.coordinator.protocols import make
from backend.spark import job
from backend.spark.source import RETAINED
from backend.spark.spool import Spool


def reference(spool_dir, n, settings):
    """A plain Coordinator fed the first ``n`` spool records; returns its answers and itself."""
    proto = make(settings["protocol"])
    coord = None
    now, answers = -math.inf, []
    for rec in Spool(spool_dir, readonly=True).scan(0, n):
        if coord is None:
            coord = Coordinator(proto, period=settings["period"], shrink=settings["shrink"] if proto.shrinks else 0.0,
                                latency=settings["latency"], t0=float(math.floor(rec.arrival)))
        now = max(now, rec.arrival)
        topic = rec.topic[:-len(RETAINED)] if rec.topic.endswith(RETAINED) else rec.topic
        parts = topic.split("/")
        if parts[-1] in ("up", "state"):
            out = coord.handle_uplink(now, parts[3], rec.payload, retained=rec.topic.endswith(RETAINED))
        elif parts[-1] == "tick":
            out = coord.handle_timer(now)
        else:
            assert parts[-1] == "spec"
            out = coord.add_query(dict(json.loads(rec.payload), id=parts[3]), now)
        answers += [a[1] for a in out if a[0] == "answer"]
    return answers, coord


def test_live_fleet_through_spark_equals_plain_coordinator_with_zero_violations(job_spark, tmp_path):
    try:
        find_mosquitto()
    except BrokerError as e:
        pytest.skip(str(e))
    from backend import demo
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
    ref_answers, coord = reference(os.path.join(out_dir, "spool"), applied,
                                   {"protocol": "deadband", "period": 5.0, "shrink": 0.05, "latency": 0.5})
    assert len(answers) > 20
    assert answers == ref_answers
    assert status["groups"]["demo"]["stats"] == coord.stats
    assert {q["id"] for q in r["queries"]} == set(coord.queries)
