"""One guarantee vocabulary on every answer path (backend/answers.py): the live adapter's JSON and the Spark
job's rows agree, members say tolerance, degraded answers give a reason, a link loss degrades alike."""
import json
import math

import pytest

import drivers
from backend import host
from backend.answers import GUARANTEES, answer_json, guarantee
from backend.host import Host
from backend.spark import job
from edge.core import codec, topics
from hostkit import fleet_records

FLEET = drivers.FLEET


def test_guarantee_vocabulary_and_strict_json():
    assert guarantee({"lo": 1, "hi": 2, "degraded": False}) == "interval"
    assert guarantee({"members": [], "degraded": False}) == "tolerance"
    assert guarantee({"lo": 1, "hi": 2, "guarantee": "probabilistic", "degraded": True}) == "degraded"
    with pytest.raises(ValueError):
        guarantee({"lo": 1, "hi": 2, "guarantee": "set"})
    rec = json.loads(answer_json({"time": 1.0, "query": "q", "lo": -math.inf, "hi": math.inf, "degraded": True}))
    assert rec == {"time": 1.0, "query": "q", "lo": "-inf", "hi": "inf", "degraded": True, "guarantee": "degraded",
                   "reason": "degraded by the protocol", "final": False}
    assert set(GUARANTEES) >= {"interval", "probabilistic", "tolerance", "degraded"}


def _live(settings, records, tmp_path):
    """The JSON lines the live adapter writes for ``records`` (``(now, topic, payload)``)."""
    from backend.live.coordinator import LiveCoordinator
    path = tmp_path / "answers.jsonl"
    live = LiveCoordinator(Host(settings), FLEET, "127.0.0.1", 9, "unused", answers_path=str(path))
    for now, topic, payload in records:
        live.timer(now) if topic == topics.tick(FLEET) else live.message(now, topic, payload)
    live.close()
    return [json.loads(line) for line in path.read_text().splitlines()]


def _spark(settings, records):
    from backend.spark.source import parse_topic
    cols = job.run_batch(Host(settings), [(t, *parse_topic(topic), p, False) for t, topic, p in records])
    return [(g, json.loads(b)) for k, g, b in zip(cols["kind"], cols["guarantee"], cols["body"]) if k == "answer"]


def test_brownian_answers_stay_probabilistic_through_the_live_adapter(tmp_path):
    answers, inputs = drivers.record("brownian")
    lines = _live(drivers.settings("brownian"), drivers.spool_records(inputs), tmp_path)
    assert len(lines) == len(answers)
    fine = [a for a in lines if not a["degraded"]]
    assert fine and all(a["guarantee"] == ("probabilistic" if "confidence" in a else "none") for a in fine)
    assert sum(a["guarantee"] == "probabilistic" for a in fine) > 50


@pytest.mark.parametrize("protocol, query", [("ft-nrp", "r"), ("deadband", "s")])
def test_members_say_tolerance_and_degraded_answers_give_a_reason(tmp_path, protocol, query):
    records = [r for r in fleet_records() if not r[1].endswith("/spec") or "/%s/" % query in r[1]]
    settings = host.settings(protocol=protocol, period=10.0)
    live = [a for a in _live(settings, records, tmp_path) if a["query"] == query]
    spark = [(g, a) for g, a in _spark(settings, records) if a["query"] == query]
    assert [a["guarantee"] for a in live] == [g for g, _ in spark]
    fine, degraded = live[-2], live[-1]
    if protocol == "ft-nrp":
        assert fine["guarantee"] == "tolerance" and fine["members"] == ["a", "c"]
    else:       # the devices never confirm their narrowings here: an unbounded sum is no interval
        assert fine["guarantee"] == "degraded" and fine["reason"] == "no bound yet: waiting for a, c"
    assert degraded["time"] == 4.0 and degraded["guarantee"] == "degraded" and degraded["reason"].startswith("offline: c")


def test_link_loss_degrades_answers_alike_in_the_live_and_spark_paths(tmp_path):
    """The live client's disconnect and the bridge's ``link`` records take one path (``Host``): answers
    degrade at the loss (twice lost is one loss), time moves on, and the restore asks every device
    for a fresh birth, once."""
    from backend.live.coordinator import LiveCoordinator
    settings = host.settings(protocol="deadband", period=10.0, latency=0.5)
    base = [r for r in fleet_records()[:-1] if "/r/" not in r[1]]      # births, sum query s, a tick
    link = topics.spool(FLEET, "link")
    ticks = [(t, topics.tick(FLEET), b"") for t in (6.0, 8.0, 12.0)]
    records = base + [(5.0, link, b"lost"), (5.5, link, b"lost")] + ticks + [(13.0, link, b"restored")]
    from backend.spark.source import parse_topic
    cols = job.run_batch(Host(settings), [(t, *parse_topic(topic), p, False) for t, topic, p in records])
    spark = [json.loads(b) for k, f, b in zip(cols["kind"], cols["final"], cols["body"]) if k == "answer" and not f]
    downs = [(t, codec.decode(p)[0]) for k, t, p in zip(cols["kind"], cols["target"], cols["payload"]) if k == "down"]
    assert [d for d in downs if d[1] == "rebirth"] == [("d1", "rebirth"), ("d2", "rebirth")]
    assert [(a["time"], a["degraded"]) for a in spark][-1] == (4.5, True)
    assert spark[-1]["reason"].startswith("offline")
    clock = [0.0]
    path = tmp_path / "answers.jsonl"
    live = LiveCoordinator(Host(settings), FLEET, "127.0.0.1", 9, "unused", answers_path=str(path),
                           clock=lambda: clock[0])
    for now, topic, payload in records:
        clock[0] = now
        if topic == link and payload == b"lost":
            live.connected = True
            live._on_disconnect(None, None, None, "lost", None)
        elif topic == link:
            live._act(live.host.link_restored, now)                 # what its on_connect does
        elif topic == topics.tick(FLEET):
            live.timer(now)
        else:
            live.message(now, topic, payload)
    live.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(a["time"], a["degraded"], a["guarantee"]) for a in lines if "error" not in a and not a["final"]] == \
        [(a["time"], a["degraded"], guarantee(a)) for a in spark]
    assert live.stats["dropped_down"] == len(downs) and not live.host.blind     # no broker here: counted
