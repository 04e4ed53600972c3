"""Lagged and real-time queries on the same sources, live (DESIGN.md §4): CPython and heap-limited MicroPython
agent processes, Mosquitto and the live coordinator answer a lagged AVG (final answers from segments) and a
real-time MAX over half of the same sources; every real-time answer and every final answer is checked against
the agents' own ground-truth logs, and the devices' segments rode on their real-time reports (kind rsegs). The
coordinator covers clock skew as the live drivers do (σ = LIVE_SKEW): a MicroPython board's ms clock may lead the
backend's, and its segments are placed within its clock's bounds (sequence._segment)."""
import time

import pytest

from backend.host import LIVE_SKEW
from backend.live import checker
from backend.live.broker import Broker
from backend.live.fleet import Fleet, micropython_available
from edge.core import codec, topics
import fleetcheck as fc
from helpers import client, connected, subscribe

N_MP, N_CPY = 3, 3
LAG = 3.0


def _finals_checked(rows, answers, specs, end):
    """Every final answer of ``specs`` up to ``end`` against the truth rebuilt from the agents' logs (the demo's
    checker): {query: ``final_truth.check_final``'s figures}."""
    finals = {}
    checker.violations(specs, [r for r in rows if r[0] <= end], answers, end, finals=finals)
    return finals


@pytest.mark.parametrize("protocol", ["deadband", "adaptive"])
def test_a_lagged_avg_and_a_real_time_max_hold_against_the_agents_logs(mosquitto, tmp_path, protocol):
    if not micropython_available():
        pytest.skip("no MicroPython unix port")
    names = Fleet.names(N_MP, N_CPY)
    broker = Broker(str(tmp_path / "broker"), "t", [n for _, n in names]).start()
    sources = ["s_" + n for _, n in names]
    specs = [{"id": "mean", "kind": "avg", "sources": sources, "precision": 2.0, "lag": LAG},
             {"id": "top", "kind": "max", "sources": sources[::2], "precision": 3.0}]     # wider: its sources send segments too
    live, answers, _ = fc.coordinator(broker, specs, protocol=protocol, skew=LIVE_SKEW)
    obs = client(broker, "backend", client_id="observer-mixed", clean_session=False)
    assert connected(obs)[0]
    subscribe(obs, topics.device("t", "+", "up"))
    thread = live.start_thread()
    fleet = Fleet(broker, str(tmp_path / "fleet"), width=4.0, keepalive=5)
    try:
        fleet.start_all(N_MP, N_CPY, seed=9, step=0.6)
        fc.wait(lambda: fc.all_online(live, list(fleet.devices)), 60, "every device's birth",
                lambda: fc.offline(live, fleet, broker, list(fleet.devices)))
        time.sleep(12 + LAG)
        end = time.time() - 2 * fc.LATENCY
        stats = fleet.stop_all()
        assert all(s is not None for s in stats.values()), {n: fleet.devices[n].output for n in stats}
        horizon = live.coord.finals.horizon("mean")
    finally:
        fc.teardown(broker, live, thread, fleet, obs)
    rows = fleet.truth_rows()
    assert len({s for _, s, _ in rows}) == N_MP + N_CPY and live.coord.stats["bad_messages"] == 0
    checked = fc.violations(rows, answers, specs[1:], end)           # the real-time MAX, answer by answer
    assert checked["top"][0] == 0 and checked["top"][2] >= 5, checked
    finals = _finals_checked(rows, answers, specs, min(horizon, end))
    fin = finals["mean"]
    print("\n%s: real-time MAX %s, finals %s" % (protocol, checked["top"], finals))
    assert fin["final_violations"] == 0 and fin["finals"] >= 10 and fin["final_through"] >= end - LAG - 3.0, fin
    assert finals["top"]["final_violations"] == 0 and finals["top"]["final_revoked"] == 0, finals["top"]
    kinds = {}
    while not obs.inbox.empty():
        kind = codec.decode(obs.inbox.get()[1])[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    assert kinds.get("rsegs", 0) > 0 and kinds.get("segs", 0) > 0, kinds     # segments rode on reports, and alone
