"""Echo mode (DESIGN.md §6; issue #20): the Spark job's controls leave only after its micro-batch, so
the coordinator times a control's round trip from its echo (the bridge spools each control as the
broker passes it on), not from when the control was made. Driven here like the job under load: the
real edge agent, uplinks stamped when made, a first batch of 25 s (Python worker start) and 2.5 s
batches after it, every downlink delivered at the end of the batch that made it. Without echoes the
coordinator took every downlink still in its batch for lost and asked the device for a birth each
1.5 s; a burst of requests then voided every control (the live demo's storm: each reading reported)."""
import random

from backend.host import Host
from edge.agent import Agent
from edge.core import codec


def run(echo, first=25.0, batch=2.5, end=60.0, step=0.1, skew=0.0):
    h = Host(protocol="adaptive", period=5.0, latency=0.5, t0=0.0, echo=echo, skew=skew)
    h.spec(0.0, "q", {"kind": "sum", "sources": ["x"], "precision": 4.0})
    a = Agent("d1", ["x"], boot=7, width=4.0)
    rng = random.Random(5)
    v, out, kinds, missed, reports_late, samples_late = 20.0, [], {}, [], 0, 0
    history = [(0.0, v)]        # the device's readings: the truth at the coordinator's event time
    batch_end = first
    batches = 0

    def up(t, msgs):
        for ch, payload in msgs:
            out.extend(h.record(t, "d1", ch, payload))

    up(0.0, a.handle_sample(0.0, 0, v))         # readings before the link is up go out first ...
    up(0.05, a.start(0.05))                     # ... then the birth (the demo's order)
    k = 1
    while k * step <= end:
        t = k * step
        if t >= batch_end:                      # the batch's controls leave now, in order
            for act in [x for x in out if x[0] == "down"]:
                kind = codec.decode(act[2])[0]
                kinds[kind] = kinds.get(kind, 0) + 1
                if echo:
                    out.extend(h.record(t, "d1", "ctl", act[2]))
                up(t, a.handle_message(t, act[2]))
            del out[:]
            batch_end = t + batch
            batches += 1
        v += rng.choice((-0.3, 0.3))
        msgs = a.handle_sample(t, 0, v)
        if t > end - 20:
            samples_late += 1
            reports_late += sum(ch == "up" for ch, _ in msgs)
        history.append((t, v))
        up(t, msgs)
        out.extend(h.timer(t))
        c = h.coord
        truth = [x for at, x in history if at <= c.clock + 1e-9]
        lo, hi = c.cache.known("x")
        if truth and c.devices["d1"]["online"] and not lo <= truth[-1] <= hi:
            missed.append((t, truth[-1], lo, hi))   # a trusted mirror holds the value at its event time
        k += 1
    return {"kinds": kinds, "batches": batches, "stale": a.stats["stale"], "late": reports_late / samples_late, "missed": missed,
            "lost": h.coord.integrity.stats["lost"], "online": h.coord.devices["d1"]["online"]}


def test_echo_times_round_trips_from_when_controls_leave():
    r = run(echo=True)
    assert r["missed"] == [], r["missed"][:3]
    # the birth right behind the early reports is not asked for again: no control is voided
    assert r["kinds"].get("rebirth", 0) == 0 and r["stale"] == 0, r
    assert r["online"] and r["late"] < 0.3, r          # the filter is in force: most readings stay home


def test_without_echo_a_slow_driver_storms():
    r = run(echo=False)
    assert r["missed"] == []                            # still correct, but it never settles
    assert r["kinds"].get("rebirth", 0) >= 5 and r["stale"] >= 10, r


def test_a_clock_echo_is_asked_once_while_its_probe_waits_for_its_echo():
    # with clock skew the coordinator asks each device once for a clock echo (a probe); in echo mode that probe
    # is only ``unsent`` until its batch ends, and it was asked again at every uplink meanwhile: the live demo
    # under load made one probe per record (1,000 per batch), which its broker could not keep up with
    for skew in (0.1, 0.3):
        r = run(echo=True, skew=skew)
        assert r["missed"] == [], r["missed"][:3]
        assert r["kinds"].get("probe", 0) == 1, r      # main before: 9 and 10 over 15 batches
