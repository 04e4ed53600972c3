"""Emulated micro:bits (QEMU, real MicroPython 1.9.2 firmware) behind gateways, end to end: the fleet command's
result against the boards' ground truth, and a relay query answered live from the gateway's relay node.
QEMU and the firmware are installed by scripts/setup.sh: without them these tests fail, they do not skip."""
import argparse
import json
import time

from backend.live.broker import Broker
from backend.host import Host
from backend.live.fleet import Fleet, fleet_main
from backend.live.coordinator import LiveCoordinator


def test_fleet_command_with_microbits(tmp_path):
    out = tmp_path / "result.json"
    args = argparse.Namespace(microbit=2, micropython=0, cpython=1, arm64=0, dir=str(tmp_path / "f"), fleet="t",
                              port=None, heap="48k", period=0.1, trace=None, seed=3, duration=25, out=str(out))
    assert fleet_main(args) == 0
    r = json.loads(out.read_text())
    assert r["agents"]["microbit"] == 2 and r["agents"]["cpython"] == 1
    assert r["violations"] == 0 and r["answers"] > 0
    assert r["messages"]["up"] >= 6 and r["messages"]["down"] >= 3          # births, first reports, configs
    bits = [r["devices"][n] for n in ("b0", "b1")]
    for st in bits:
        assert st["samples"] >= 150 and st["bad_frames"] == 0 and st["device_errors"] == 0, st
        assert st["reports"] < st["samples"] / 4, st                        # the filter keeps the UART uplink quiet
    assert 0 < r["microbit_min_free_heap"] < 9200
    print("micro:bit fleet: %s, min free heap %d B" % (r["messages"], r["microbit_min_free_heap"]))


def test_relay_count_query_live_from_microbits(tmp_path):
    """Zhang et al. 2005 live: the gateway's RelayNode turns the boards' samples into raw items and forecast and
    correct bodies; the coordinator's COUNT over a window holds the exact count (from the truth) in [lo, hi]."""
    bits = ["b0", "b1"]
    with Broker(tmp_path / "broker", "t", [], gateways={"g0": bits}) as broker:
        now = time.time()
        window = [now + 6.0, now + 18.0]
        spec = {"id": "c", "kind": "count", "sources": ["g0"], "window": window, "error": 0.1, "range": [0, 40]}
        coord = Host(protocol="relay", period=1.0, shrink=0.0, latency=0.5, t0=now, declared=["g0"])
        answers = []
        live = LiveCoordinator(coord, "t", broker.host, broker.port, broker.credentials("backend")[1],
                               queries=[spec], answers=answers)
        thread = live.start_thread()
        fleet = Fleet(broker, str(tmp_path / "fleet"), period=0.05)
        try:
            fleet.start_microbits(bits, seed=2, relay={"h": 10, "m": 32, "support": 0.02, "fdi": 50, "delta": 0.1,
                                                       "span": 2.0, "lag": 0.5, "domain": [0, 65535], "shift": 10})
            deadline = time.monotonic() + 60
            while not [a for a in answers if a.get("final")] and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            stats = fleet.stop_all()
            live.stop()
            thread.join(5)
    final = [a for a in answers if a.get("final")]
    assert final, answers[-3:]
    rows = fleet.truth_rows()
    exact = sum(1 for t, _, v in rows if window[0] < t <= window[1] and 0 <= int(v * 1024) >> 10 <= 40)
    a = final[-1]
    assert a["lo"] <= exact <= a["hi"], (exact, a)
    relay = stats["g0"]["g0"]
    assert relay["items"] > 0 and relay["prb"] > 0 and relay["filtered"] > 0, relay   # forecast bodies did replace items
    print("relay: exact %d in [%s, %s], estimate %s; relay stats %s" % (exact, a["lo"], a["hi"], a["estimate"], relay))
