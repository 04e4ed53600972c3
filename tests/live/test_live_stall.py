"""A broker that stalls under heap-limited MicroPython agents (DESIGN.md §3 reconnect, §9): Mosquitto stopped
(SIGSTOP) for STALL seconds while the agents send lagged segments and real-time reports, then resumed. The agents
must run on through it within a small heap (their byte-bounded outbox, edge.runtime.outbox; a MemoryError survived,
edge.runtime.pump), and after the broker recovers the backend's answers must hold against the agents' own
ground-truth logs: every final answer that is not degraded, every real-time answer, and finals going on past the
stall (what the agents dropped shows as gaps the backend resynchronised, never as a silent hole)."""
import signal
import time

import pytest

from backend.live.broker import Broker
from backend.live.fleet import Fleet, micropython_available
import fleetcheck as fc
from test_live_mixed import LAG, _finals_checked

N_MP, N_CPY = 3, 1
HEAP = "96k"            # the heap an emulated agent died in (CI of 5f1a830), backend.live.fleet.HEAP
STALL = 30.0


def test_heap_limited_agents_ride_out_a_stalled_broker_and_the_finals_hold(tmp_path):
    if not micropython_available():
        pytest.skip("no MicroPython unix port")
    names = Fleet.names(N_MP, N_CPY)
    broker = Broker(str(tmp_path / "broker"), "t", [n for _, n in names]).start()
    sources = ["s_" + n for _, n in names]
    specs = [{"id": "mean", "kind": "avg", "sources": sources, "precision": 0.5, "lag": LAG},
             {"id": "top", "kind": "max", "sources": sources[::2], "precision": 3.0}]
    live, answers, _ = fc.coordinator(broker, specs, protocol="adaptive")
    thread = live.start_thread()
    fleet = Fleet(broker, str(tmp_path / "fleet"), heap=HEAP, width=4.0, period=0.02, keepalive=5)
    try:
        fleet.start_all(N_MP, N_CPY, seed=4, step=0.6)
        fc.wait(lambda: fc.all_online(live, list(fleet.devices)), 60, "every device's birth",
                lambda: fc.offline(live, fleet, broker, list(fleet.devices)))
        time.sleep(LAG + 3)
        broker.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(STALL)
        finally:
            broker.proc.send_signal(signal.SIGCONT)
        resumed = time.time()
        fc.wait(lambda: fc.all_online(live, list(fleet.devices)), 90, "every device back",
                lambda: fc.offline(live, fleet, broker, list(fleet.devices)))
        time.sleep(10 + LAG)
        alive = {n: d.proc.poll() is None for n, d in fleet.devices.items()}
        end = time.time() - 2 * fc.LATENCY
        stats = fleet.stop_all()
        horizon = live.coord.finals.horizon("mean")
    finally:
        for d in fleet.devices.values():
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()
        if broker.proc is not None:
            broker.proc.send_signal(signal.SIGCONT)
        live.stop()
        thread.join(5)
        broker.stop()
    mp = {n: stats[n] for k, n in names if k == "micropython"}
    assert all(alive.values()) and all(s is not None for s in stats.values()), \
        {n: fleet.devices[n].output[-2000:] for n in stats}
    heap = int(HEAP[:-1]) * 1024
    print("\nstalled %.0f s, heap %s: %s" % (STALL, HEAP, {n: {k: s.get(k) for k in ("heap_peak", "outbox_dropped", "oom",
                                                                            "link_failures", "reports")}
                                                        for n, s in mp.items()}))
    assert all(s["heap_peak"] < heap for s in mp.values()) and all(s["link_failures"] >= 1 for s in mp.values()), mp
    rows = fleet.truth_rows()
    checked = fc.violations(rows, answers, specs[1:], end)           # the real-time MAX, answer by answer
    finals = _finals_checked(rows, answers, specs, min(horizon, end))
    print("real-time MAX %s, finals %s" % (checked["top"], finals))
    assert checked["top"][0] == 0, checked
    fin = finals["mean"]
    assert fin["final_violations"] == 0 and finals["top"]["final_violations"] == 0, finals
    assert fin["final_through"] >= max(resumed, end - LAG - 3.0), (fin, resumed, end)    # finals go on after it,
    clean = [a for a in answers if a["query"] == "mean" and a.get("final") and not a["degraded"] and resumed < a["time"]]
    assert len(clean) >= 3, fin                                                          # resynchronised
