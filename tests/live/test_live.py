"""The live coordinator loop (backend/live/coordinator.py) against Mosquitto, with a scripted device: retained births
trigger a rebirth, query specs arrive on their topic, answers leave retained as JSON, a Last Will
degrades them, the latest final answer is retained on its own topic, bad specs are answered with an error on the
answer topic and bad payloads are counted without stopping the loop, and removing a spec clears its retained
answers."""
import json
import time

from backend.answers import answer_json
from backend.host import Host
from backend.live.coordinator import LiveCoordinator
from edge.agent import Agent
from edge.core import topics
from helpers import client, close, connected, expect, silent, subscribe

FLEET = "t"


def _answer(c, qid, pred, timeout=5.0, channel="answer"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            topic, payload, retain = c.inbox.get(timeout=0.2)
        except Exception:
            continue
        if topic == topics.query(FLEET, qid, channel) and payload:
            a = json.loads(payload)
            if pred(a):
                return a, retain
    raise AssertionError("no matching answer for %s" % qid)


def test_specs_births_answers_and_last_will(broker):
    now = time.time()
    host = Host(protocol="deadband", period=1.0, latency=0.2, t0=now)
    coord = host.coord
    answers = []
    live = LiveCoordinator(host, FLEET, broker.host, broker.port, broker.credentials("backend")[1], answers=answers)
    # A device (user A) that was born before the coordinator started: its birth is retained.
    dev = client(broker, "A")
    assert connected(dev)[0]
    subscribe(dev, topics.device(FLEET, "A", "ctl"))
    agent = Agent("A", ["a", "b"], boot=9, width=1.0)
    agent.handle_sample(now, 0, 10.0)
    agent.handle_sample(now, 1, 20.0)
    dev.publish(topics.device(FLEET, "A", "state"), agent.start(now)[0][1], qos=1, retain=True).wait_for_publish(2)
    thread = live.start_thread()
    # the retained birth may be stale: the coordinator asks for a fresh one
    expect(dev, lambda t, k, f: k == "rebirth")
    dev.publish(topics.device(FLEET, "A", "state"), agent.start(time.time())[0][1], qos=1, retain=True)
    user = client(broker, "backend")
    assert connected(user)[0]
    subscribe(user, topics.query(FLEET, "+", "answer"))
    user.publish(topics.query(FLEET, "bad", "spec"), b"{not json", qos=1, retain=True)
    user.publish(topics.query(FLEET, "worse", "spec"), json.dumps({"kind": "median", "sources": ["a"]}), qos=1, retain=True)
    user.publish(topics.query(FLEET, "tot", "spec"), json.dumps({"kind": "sum", "sources": ["a", "b"], "precision": 4.0}),
                 qos=1, retain=True)

    def feed(pred, timeout=5.0):
        """Play the device: apply control messages to the agent, publish what it sends, until pred."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            t = time.time()
            out = []
            while not dev.inbox.empty():
                out += agent.handle_message(t, dev.inbox.get()[1])
            for ch, payload in out:
                dev.publish(topics.device(FLEET, "A", ch), payload, qos=1, retain=(ch == "state"))
            if pred():
                return
            time.sleep(0.05)
        raise AssertionError("device exchange did not converge: %r %r" % (answers[-3:], coord.devices))

    def good(a):
        if a["query"] != "tot" or a.get("degraded") is not False or "inf" in (a["lo"], a["hi"]):
            return False            # strict JSON: an unbounded side is the string "inf"/"-inf"
        return a["lo"] <= 30.0 <= a["hi"] and a["hi"] - a["lo"] <= 4.0 + 1e-6

    feed(lambda: any(good(a) for a in answers))
    a, retained = _answer(user, "tot", good)
    assert a["guarantee"] == "interval"
    late = client(broker, "backend")                     # the answer is retained for late readers
    assert connected(late)[0]
    subscribe(late, topics.query(FLEET, "+", "answer"))
    assert _answer(late, "tot", lambda a: True)[1] is True
    close(late)
    # the device speaks again (a reading leaves its bound): its watermark passes the query's start, and the
    # latest final answer is retained on .../final beside the provisional one
    for ch, payload in agent.handle_sample(time.time(), 0, 14.0):
        dev.publish(topics.device(FLEET, "A", ch), payload, qos=1)
    feed(lambda: any(x.get("final") and not x["degraded"] and x["query"] == "tot" for x in answers))
    late = client(broker, "backend")
    assert connected(late)[0]
    subscribe(late, topics.query(FLEET, "+", "final"))
    f, retained = _answer(late, "tot", lambda x: True, channel="final")
    last = json.loads(answer_json([x for x in answers if x.get("final")][-1]))
    assert retained and f == last and f["final"] is True and f["watermark"] > f["time"], (f, last)
    close(late)
    late = client(broker, "backend")                     # refused specs say why, retained too
    assert connected(late)[0]
    subscribe(late, topics.query(FLEET, "+", "answer"))
    errors = {}
    while len(errors) < 2:
        topic, payload, retain = late.inbox.get(timeout=3)
        if "error" in json.loads(payload):
            errors[json.loads(payload)["query"]] = json.loads(payload)["error"]
    assert "not JSON" in errors["bad"] and "median" in errors["worse"]
    close(late)
    dev.publish(topics.device(FLEET, "A", "up"), b"\x01\x01garbage", qos=1)      # counted, not fatal
    # the device dies: its Last Will (published here by hand) degrades the answer
    dev.publish(topics.device(FLEET, "A", "state"), agent.will(), qos=1, retain=True)
    a, _ = _answer(user, "tot", lambda a: a.get("degraded"))
    assert a["guarantee"] == "degraded"
    # removing the spec removes the query
    user.publish(topics.query(FLEET, "tot", "spec"), b"", qos=1, retain=True)
    end = time.monotonic() + 3
    while "tot" in coord.queries and time.monotonic() < end:
        time.sleep(0.05)
    late = client(broker, "backend")                     # and its retained answers are cleared
    assert connected(late)[0]
    subscribe(late, topics.query(FLEET, "tot", "answer"))
    subscribe(late, topics.query(FLEET, "tot", "final"))
    silent(late, lambda t, p: bool(p), 0.5)
    close(late)
    live.stop()
    thread.join(5)
    assert "tot" not in coord.queries
    times = [a["time"] for a in answers if not a.get("final")]
    assert times == sorted(times)                  # answers advance in event time (and final ones apart)
    assert host.stats["bad_specs"] == 2 and coord.stats["bad_messages"] == 1
    close(user)
    close(dev)
