"""The live coordinator loop (backend/live.py) against Mosquitto, with a scripted device: retained births
trigger a rebirth, query specs arrive on their topic, answers leave retained as JSON, a Last Will
degrades them, bad specs and bad payloads are counted without stopping the loop."""
import json
import time

from backend.coordinator.core.coordinator import Coordinator
from backend.coordinator.protocols import make
from backend.live import LiveCoordinator
from edge.agent import Agent
from edge.core import codec
from helpers import client, close, connected, expect, subscribe


def _answer(c, qid, pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            topic, payload, retain = c.inbox.get(timeout=0.2)
        except Exception:
            continue
        if topic == "qf/t/q/%s/answer" % qid:
            a = json.loads(payload)
            if pred(a):
                return a, retain
    raise AssertionError("no matching answer for %s" % qid)


def test_specs_births_answers_and_last_will(broker):
    now = time.time()
    coord = Coordinator(make("deadband"), period=1.0, latency=0.2, t0=now)
    coord.declare_sources(["a", "b"])
    answers = []
    live = LiveCoordinator(coord, "t", broker.host, broker.port, broker.credentials("backend")[1], answers=answers)
    # A device (user A) that was born before the coordinator started: its birth is retained.
    dev = client(broker, "A")
    assert connected(dev)[0]
    subscribe(dev, "qf/t/d/A/ctl")
    agent = Agent("A", ["a", "b"], boot=9, width=1.0)
    agent.handle_sample(now, 0, 10.0)
    agent.handle_sample(now, 1, 20.0)
    dev.publish("qf/t/d/A/state", agent.start(now)[0][1], qos=1, retain=True).wait_for_publish(2)
    thread = live.start_thread()
    # the retained birth may be stale: the coordinator asks for a fresh one
    expect(dev, lambda t, k, f: k == "rebirth")
    dev.publish("qf/t/d/A/state", agent.start(time.time())[0][1], qos=1, retain=True)
    user = client(broker, "backend")
    assert connected(user)[0]
    subscribe(user, "qf/t/q/+/answer")
    user.publish("qf/t/q/bad/spec", b"{not json", qos=1, retain=True)
    user.publish("qf/t/q/worse/spec", json.dumps({"kind": "median", "sources": ["a"]}), qos=1, retain=True)
    user.publish("qf/t/q/tot/spec", json.dumps({"kind": "sum", "sources": ["a", "b"], "precision": 4.0}),
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
                dev.publish("qf/t/d/A/" + ch, payload, qos=1, retain=(ch == "state"))
            if pred():
                return
            time.sleep(0.05)
        raise AssertionError("device exchange did not converge: %r %r" % (answers[-3:], coord.devices))

    def good(a):
        return a["query"] == "tot" and not a["degraded"] and a["lo"] <= 30.0 <= a["hi"] and a["hi"] - a["lo"] <= 4.0 + 1e-6

    feed(lambda: any(good(a) for a in answers))
    a, retained = _answer(user, "tot", good)
    assert a["guarantee"] == "interval"
    late = client(broker, "backend")                     # the answer is retained for late readers
    assert connected(late)[0]
    subscribe(late, "qf/t/q/tot/answer")
    assert _answer(late, "tot", lambda a: True)[1] is True
    close(late)
    dev.publish("qf/t/d/A/up", b"\x01\x01garbage", qos=1)      # counted, not fatal
    # the device dies: its Last Will (published here by hand) degrades the answer
    dev.publish("qf/t/d/A/state", agent.will(), qos=1, retain=True)
    a, _ = _answer(user, "tot", lambda a: a["degraded"])
    assert a["guarantee"] == "degraded"
    # removing the spec removes the query
    user.publish("qf/t/q/tot/spec", b"", qos=1, retain=True)
    end = time.monotonic() + 3
    while "tot" in coord.queries and time.monotonic() < end:
        time.sleep(0.05)
    live.stop()
    thread.join(5)
    assert "tot" not in coord.queries
    times = [a["time"] for a in answers]
    assert times == sorted(times)                  # answers advance in event time
    assert live.stats["bad_specs"] == 2 and coord.stats["bad_messages"] == 1
    close(user)
    close(dev)
