"""HIL scenarios (DESIGN.md §7): the flashed agent on a board (or an emulated one, see conftest) against
Mosquitto: report on bound exit, shrink, shutdown/resume, probe reply, reconnect, bounded heap."""
import os
import sys
import time

import pytest

from edge.core import codec, topics
from hilboard import HEAP, REAL, finish, reports_during, run_agent

if REAL == "qemu-microbit" or os.environ.get("QF_BOARD_KIND") == "microbit":
    pytest.skip("a micro:bit has no network: its scenarios are in test_microbit.py", allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "live"))
from helpers import client, close, connected, expect, subscribe  # noqa: E402


def _backend(broker):
    be = client(broker, "backend", client_id="hil-backend", clean_session=False)
    assert connected(be)[0]
    subscribe(be, topics.fleet_all("h"))
    return be


def _ctl(be, birth, kind, **fields):
    """A control from backend run 1 answering ``birth`` (times in integer ms)."""
    fields.update(inc=1, to=(birth["boot"] ^ birth["seq"]) & 0xFFFFFFFF)
    be.publish(topics.device("h", "hil", "ctl"), codec.encode(kind, fields), qos=1).wait_for_publish(2)


def _config(be, birth, seq, period=0, shrink=0.0, t0=0):
    _ctl(be, birth, "config", seq=seq, period=period, shrink=shrink, beat=0, t0=t0,
         now=int(time.time() * 1000), tick=0)


def _up(kind, why=None):
    return lambda t, k, f: t == topics.device("h", "hil", "up") and k == kind and (why is None or f["why"] == why)


def _heap_bytes():
    return int(HEAP[:-1]) * 1024 if HEAP.endswith("k") else int(HEAP)


def test_exit_shrink_shutdown_resume_probe_and_reconnect(hil, port):
    be = _backend(hil)
    proc = run_agent(port, 14)
    state = topics.device("h", "hil", "state")
    _, _, birth, _ = expect(be, lambda t, k, f: t == state and k == "birth", timeout=30 if REAL else 10)
    # report on bound exit: consecutive reports lie more than half a width apart
    _, _, a, _ = expect(be, _up("report"))
    _, _, b, _ = expect(be, _up("report", codec.WHY_EXIT))
    assert abs(b["v"] - a["v"]) > 0.5 and b["t"] > a["t"]
    # shrink: a wide bound that halves every 0.3 s soon excludes the walk's value again
    _config(be, birth, 1)
    _ctl(be, birth, "width", src=0, epoch=1, seq=2, period=0, width=50.0, ack=1)
    expect(be, lambda t, k, f: k == "report" and f["epoch"] == 1 and f["why"] == codec.WHY_ASSIGN)
    _config(be, birth, 3, period=300, shrink=0.5, t0=int(time.time() * 1000))
    expect(be, _up("report", codec.WHY_SHRINK), timeout=6)
    _config(be, birth, 4)
    # shutdown: the (inf, inf) constraint silences the source; then resume with a width
    inf = float("inf")
    _ctl(be, birth, "filter", src=0, epoch=2, seq=5, width=inf, ack=0, cons=[{"l": inf, "u": inf}])
    ups = reports_during(be, topics.device("h", "hil", "up"), 0.3, 1.0)
    assert not ups, "reports while shut down: %r" % ups
    _ctl(be, birth, "width", src=0, epoch=3, seq=6, period=0, width=1.0, ack=1)
    expect(be, lambda t, k, f: k == "report" and f["epoch"] == 3 and f["why"] == codec.WHY_ASSIGN)
    expect(be, lambda t, k, f: k == "report" and f["epoch"] == 3 and f["why"] == codec.WHY_EXIT)
    # probe reply
    _ctl(be, birth, "probe", src=0, seq=7, probe=4242)
    _, _, reply, _ = expect(be, _up("reply"))
    assert reply["probe"] == 4242 and reply["epoch"] == 3
    # reconnect: the broker goes away and comes back; the board re-births with the same boot
    hil.restart()
    _, _, again, _ = expect(be, lambda t, k, f: k == "birth" and f["seq"] > birth["seq"], timeout=15)
    assert again["boot"] == birth["boot"] and again["sources"][0]["epoch"] == 3
    stats, out = finish(proc, 30)
    assert stats["probes"] == 1 and stats["bad_messages"] == 0 and stats["link_failures"] >= 1, stats
    close(be)


def test_heap_stays_bounded_over_a_long_run(hil, port):
    short, _ = finish(run_agent(port, 2, period=0.01), 30)
    long, _ = finish(run_agent(port, 6, period=0.003), 40)
    print("heap peak/final: %d/%d B after %d samples, %d/%d B after %d samples (heap %s)" % (
        short["heap_peak"], short["heap_used"], short["samples"], long["heap_peak"], long["heap_used"],
        long["samples"], HEAP))
    assert long["samples"] > 3 * short["samples"]
    assert long["heap_used"] <= short["heap_used"] + 512            # what stays after a run: no leak
    assert long["heap_peak"] <= short["heap_peak"] + 2048          # transient peak: no growth with run length
    assert long["heap_peak"] < 0.8 * _heap_bytes()
    assert long["outbox"] == 0 and long["bad_samples"] == 0
