"""Live agents against Mosquitto (DESIGN.md §3, §7): the CPython (paho) and the heap-limited
MicroPython unix-port (umqtt) runtimes run the same scenarios as separate processes."""
import signal
import time

import pytest

from edge.core import codec, topics
from helpers import (client, close, connected, expect, read_truth, silent, start_cpython_agent,
                     start_micropython_agent, stop, subscribe)

from backend.live.fleet import HEAP     # the agent needs about 53k live on the 64-bit port
WALK = [("t", {"kind": "walk", "step": 0.5, "seed": 3})]


@pytest.fixture(params=["cpython", "micropython"])
def launch(request, tmp_path, mpy):
    procs = []

    def start(broker, device, sources=WALK, width=1.0):
        if request.param == "cpython":
            p = start_cpython_agent(str(tmp_path), broker, device, sources, width=width)
        else:
            p = start_micropython_agent(str(tmp_path), broker, device, sources, mpy, width=width, heap=HEAP)
        procs.append(p)
        return p

    start.kind = request.param
    start.tmp = tmp_path
    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def _ctl(be, device, kind, **fields):
    be.publish(topics.device("t", "%s", "ctl") % device, codec.encode(kind, fields), qos=1).wait_for_publish(2)


def _answer(be, device, birth):
    """Configure the device as a backend run (incarnation 1) answering ``birth``; the birth's token."""
    to = (birth["boot"] ^ birth["seq"]) & 0xFFFFFFFF
    _ctl(be, device, "config", seq=1, inc=1, to=to, period=0, shrink=0.0, beat=0, t0=0,
         now=int(time.time() * 1000), tick=0)
    return to


def _seconds(birth, t):
    """A device time in seconds: a board (CAP_MS) stamps integer milliseconds."""
    return t / 1000 if birth["caps"] & codec.CAP_MS else t


def _backend(broker):
    be = client(broker, "backend")
    assert connected(be)[0]
    subscribe(be, topics.fleet_all("t"))
    return be


def test_birth_reports_width_probe_and_bad_messages(broker, launch):
    be = _backend(broker)
    p = launch(broker, "A")
    topic, kind, birth, _ = expect(be, lambda t, k, f: k == "birth")
    assert topic == topics.device("t", "A", "state")
    assert birth["sources"][0]["name"] == "t" and birth["sources"][0]["width"] == 1.0
    up = topics.device("t", "A", "up")
    _, _, rep, _ = expect(be, lambda t, k, f: t == up and k == "report" and f["why"] == codec.WHY_EXIT)
    assert rep["epoch"] == 0

    to = _answer(be, "A", birth)
    _ctl(be, "A", "width", src=0, epoch=1, seq=2, inc=1, to=to, period=0, width=1e9, ack=1)
    _, _, ack, _ = expect(be, lambda t, k, f: k == "report" and f["epoch"] == 1)
    assert ack["why"] == codec.WHY_ASSIGN
    silent(be, lambda t, p: t == topics.device("t", "A", "up") and codec.decode(p)[0] == "report", 0.5)   # width applied

    bad = [b"", b"\x01", b"\x07\x10junk", b"\x01\x13\x00", codec.encode("mark", {"seq": 1, "t": 0.0}), b"\xff" * 5000]
    for payload in bad:
        be.publish(topics.device("t", "A", "ctl"), payload, qos=1).wait_for_publish(2)
    _ctl(be, "A", "probe", src=0, seq=3, inc=1, to=to, probe=77)
    _, _, reply, _ = expect(be, lambda t, k, f: k == "reply")
    assert reply["probe"] == 77 and reply["epoch"] == 1

    stats, out, err = stop(p, signal.SIGINT)
    assert stats is not None, err
    assert stats["bad_messages"] == len(bad) and stats["probes"] == 1 and stats["bad_samples"] == 0
    expect(be, lambda t, k, f: t == topics.device("t", "A", "state") and k == "gone")   # clean stop says offline
    truth = read_truth(str(launch.tmp / "truth-A.csv"))
    assert len(truth) == stats["samples"] >= 5
    assert (_seconds(birth, rep["t"]), "t", rep["v"]) in truth and (_seconds(birth, reply["t"]) >= truth[0][0])
    close(be)


def test_last_will_when_the_process_is_killed(broker, launch):
    be = _backend(broker)
    p = launch(broker, "B")
    _, _, birth, _ = expect(be, lambda t, k, f: k == "birth")
    p.kill()
    _, _, gone, _ = expect(be, lambda t, k, f: t == topics.device("t", "B", "state") and k == "gone", timeout=3)
    assert gone["boot"] == birth["boot"]
    late = client(broker, "backend")               # retained: a late subscriber learns it too
    assert connected(late)[0]
    subscribe(late, topics.device("t", "B", "state"))
    assert expect(late, lambda t, k, f: True)[1:] == ("gone", gone, True)
    close(late)
    close(be)


def test_reconnect_rebirths_and_flushes_reports_held_while_offline(broker, launch):
    # The observer's persistent session (and its subscription) survives the broker restart.
    be = client(broker, "backend", client_id="observer", clean_session=False)
    assert connected(be)[0]
    subscribe(be, topics.fleet_all("t"))
    p = launch(broker, "C")
    _, _, first, _ = expect(be, lambda t, k, f: k == "birth")
    broker.stop()
    down = time.time()
    time.sleep(0.6)
    broker.start()
    up = time.time()
    _, _, held, _ = expect(be, lambda t, k, f: k == "report" and down < _seconds(first, f["t"]) < up, timeout=8)
    _, _, again, _ = expect(be, lambda t, k, f: k == "birth", timeout=8)
    assert again["boot"] == first["boot"] and again["seq"] > held["seq"] > first["seq"]
    stats, _, err = stop(p, signal.SIGINT)
    assert stats is not None, err
    truth = read_truth(str(launch.tmp / "truth-C.csv"))
    assert (_seconds(first, held["t"]), "t", held["v"]) in truth
    close(be)
