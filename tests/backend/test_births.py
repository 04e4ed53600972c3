"""Births into registered queries (backend/host.py, the coordinator's protocols): an ``"all"`` query takes
each newborn in at the cost of its own rows, not the fleet's, for every protocol family."""
import math

import pytest

import drivers
from backend.bench.births import pump as _pump
from backend.host import Host
from edge.agent import Agent
from edge.core import codec
from hostkit import answers, born

FLEET = drivers.FLEET
# (the agents here run no timers, so they send no heartbeat marks: the Hosts run without the watchdog)


def _same(config):
    """A config's content (its own number, send time and the period it was sent in aside)."""
    return {k: v for k, v in config.items() if k not in ("seq", "now", "tick")}


@pytest.mark.parametrize("acked", [True, False])
@pytest.mark.parametrize("precision", [2.0, 0.1])
@pytest.mark.parametrize("protocol", ["deadband", "adaptive"])
def test_an_all_query_takes_each_newborn_in_without_a_message_to_the_other_devices(protocol, precision, acked):
    # dynamic "all" re-registered the query at every birth: a removal (every source to no query, width ∞)
    # and an addition (every source back), two downlinks to every device per birth and a pending mirror
    # each, O(n²) messages and O(n³) work over a fleet's births. A uniform width an ulp off δ at some n
    # (δ·n/n) re-sent every width whose narrowing was not acknowledged yet (a fleet booting faster than
    # its acknowledgements: 2,000 adaptive births sent 488,695 downlinks). Oracle: after every birth the
    # query holds exactly the born sources, every filter has the uniform width δ, and no device but the
    # newborn hears, with the acknowledgements pumped back at once or never.
    n = 40
    h = Host(protocol=protocol, beat=0.0, t0=0.0)
    h.spec(0.5, "tot", {"kind": "avg", "sources": "all", "precision": precision})
    agents, values, configs = {}, {}, {}
    for k in range(n):
        dev, now = "d%d" % k, 1.0 + k
        agents[dev], birth = born(dev, ["s%d" % k], [float(k % 7)], now)
        values["s%d" % k] = float(k % 7)
        widths = {s.device: s.filt.width for s in h.coord.cache.sources.values()}
        out = h.record(now, dev, "state", birth)
        out = _pump(h, agents, now, out) if acked else out
        if acked:
            assert {a[1] for a in out if a[0] == "down"} == {dev}
        else:       # an unacknowledged narrowing is sent again as it is, and with it the config the device
            # never answered (resync.py: it may be waiting for a lost one); no other device gets a new width
            others = [(a[1], codec.decode(a[2])) for a in out if a[0] == "down" and a[1] != dev]
            assert all(kind == "width" and m["width"] == widths[d] or kind == "setup" and _same(m) == configs[d]
                       for d, (kind, m) in others), (k, others)
        configs.update({a[1]: _same(codec.decode(a[2])[1]) for a in out if a[0] == "down" and a[1] == dev
                        and codec.decode(a[2])[0] == "setup"})
        assert h.coord.queries["tot"].sources == ["s%d" % i for i in range(k + 1)]
        assert all(s.filt.width == precision and (not s.old or not acked) for s in h.coord.cache.sources.values())
        if acked:
            got = [a[1] for a in out if a[0] == "answer"][-1]
            truth = sum(values.values()) / len(values)
            assert got["lo"] <= truth <= got["hi"] and got["hi"] - got["lo"] <= precision * (1 + 1e-9)


class _Summed(dict):
    """A weights dict counting how often its values are walked (a uniform width sums them)."""
    walks = 0

    def values(self):
        _Summed.walks += 1
        return dict.values(self)


@pytest.mark.parametrize("protocol", ["deadband", "adaptive"])
def test_births_into_a_registered_query_cost_their_own_rows_not_the_fleet(protocol, monkeypatch):
    # a birth settled every width of the fleet (adaptive) or summed the query's weights again (deadband's
    # uniform width): O(n) per birth, O(n²) over a fleet. Oracle: the widths a full settle gives, after
    # every birth; the work counted (widths looked at, weight sums) stays linear in n.
    from backend.coordinator.precision import adaptive
    n = 120
    names = ["s%d" % i for i in range(n)]
    h = Host(protocol=protocol, declared=names, beat=0.0, t0=0.0)
    h.spec(0.5, "big", {"kind": "avg", "sources": names, "precision": 2.0})
    h.spec(0.5, "few", {"kind": "sum", "sources": names[:5], "weights": [1, 2, 1, 1, 3], "precision": 3.0})
    q = h.coord.queries["big"]
    q.weights = _Summed(q.weights)
    looked = [0]
    width = adaptive.Adaptive._width

    def counted(self, s):
        looked[0] += 1
        return width(self, s)
    monkeypatch.setattr(adaptive.Adaptive, "_width", counted)
    _Summed.walks = 0
    for k, name in enumerate(names):
        _, birth = born("d-" + name, [name], [float(k)], 1.0 + k)
        h.record(1.0 + k, "d-" + name, "state", birth)
        src = h.coord.cache.sources
        if protocol == "adaptive":          # brute force: the widths a settle of the whole fleet keeps
            p = h.coord.protocol
            want = {key: width(p, s) for key, s in src.items()}
            want[name] = p.rows.uniform(name)                # a settle gives the newborn its share
            want = p.rows.fit({key: (w if w < math.inf else p.rows.uniform(key)) for key, w in want.items()})
            assert {key: s.filt.width for key, s in src.items()} == want
        else:
            for key, s in src.items():
                assert s.filt.width == min(2.0 if key in q.weights else math.inf,
                                           3.0 / 8 if key in names[:5] else math.inf)
    assert _Summed.walks <= 2
    assert looked[0] <= 12 * n, looked[0]


@pytest.mark.parametrize("protocol", ["deadband", "adaptive"])
def test_float32_boards_in_an_all_query_hear_nothing_when_another_is_born(protocol):
    # a float32 board's mirror holds its width rounded to float32; a target compared unrounded (δ = 0.1 is
    # not a float32) always differed, and every birth narrowed every board: O(n²) messages
    from edge.core.float32 import f32
    h = Host(protocol=protocol, beat=0.0, t0=0.0)
    h.spec(0.5, "tot", {"kind": "avg", "sources": "all", "precision": 0.1})
    agents = {}
    for k in range(12):
        dev, now = "d%d" % k, 1.0 + k
        agents[dev] = Agent(dev, ["s%d" % k], boot=1, rnd=f32)
        agents[dev].handle_sample(now, 0, float(k))
        out = _pump(h, agents, now, h.record(now, dev, "state", agents[dev].start(now)[0][1]))
        assert {a[1] for a in out if a[0] == "down"} == {dev}, (k, out)
        assert all(s.filt.width == f32(0.1) for s in h.coord.cache.sources.values())


def test_a_lag_query_under_a_remove_and_add_protocol_keeps_its_devices_in_segment_mode_across_births():
    # a protocol that keeps per-query state (brownian did, before it refused lag: it has no final answers) takes
    # newborns into an "all" query by a removal and an addition; the removal alone took every device out of
    # segment mode (and the addition put it back), restarting the query's final answers at every birth.
    # Oracle: only the newborn is told its segment mode (an AVG: the segments' width, its precision, does not
    # depend on how many sources it has; a SUM's narrows for all).
    h = Host(protocol="deadband", latency=0.5, t0=0.0)
    h.coord.protocol.replaces = False       # the removal-and-addition path
    h.spec(0.5, "q", {"kind": "avg", "sources": "all", "precision": 2.0, "lag": 2.0})
    agents, start = {}, None
    for k in range(6):
        dev, now = "d%d" % k, 1.0 + k
        agents[dev], birth = born(dev, ["s%d" % k], [float(k)], now)
        out = h.record(now, dev, "state", birth) + h.record(now + 0.6, None, "tick", b"")   # births wait λ
        told = [a[1] for a in out if a[0] == "down" and codec.decode(a[2])[0] == "segment"]
        assert told == [dev], (k, told)
        start = h.coord.finals.qs["q"].start if start is None else start
        assert h.coord.finals.qs["q"].start == start                    # its final answers go on from there
        _pump(h, agents, now + 0.6, out)


def test_a_relay_join_a_birth_makes_invalid_is_dropped_by_the_relays_at_once():
    # a join needs two sources; a third relay born into a join over "all" makes the protocol refuse it,
    # and the removal's moq (op 0) to the first two was left queued with nothing due to send it
    from edge.core.relay import RelayNode
    h = Host(protocol="relay", declared=["r0", "r1"], t0=0.0)
    h.spec(0.5, "j", {"kind": "join", "sources": "all", "span": 5, "window": [0, 100]})
    moq = []
    for k in range(3):
        dev, now = "r%d" % k, 1.0 + k
        out = h.record(now, dev, "state", RelayNode(dev, boot=k + 1).start(now)[0][1])
        moq = [(a[1], codec.decode(a[2])[1]["op"]) for a in out if a[0] == "down" and codec.decode(a[2])[0] == "moq"]
    assert "j" not in h.coord.queries and ("error", "j") in [a[:2] for a in out]
    assert {"r0", "r1"} <= {d for d, op in moq if op == 0}, moq           # the two that ran the join
    assert h.coord.drain() == []


@pytest.mark.parametrize("rule", ["estimate", "shrink"])
def test_a_birth_that_would_overfill_a_row_settles_the_fleet(rule):
    # adaptive's fast path gives a newborn its share only when its rows have room; when moved widths
    # filled a row, the birth settles every width and the row stays within its budget. Oracle: §3.2's rule
    # scales the row down (Rows.fit of the widths with the newborn at its share); the default rule makes
    # every moved source deadband's twin again (precision.regret: a SYNC, deadband's width)
    names = ["s%d" % i for i in range(4)]
    h = Host(protocol="adaptive", declared=names, beat=0.0, t0=0.0, params={"rule": rule})
    h.spec(0.5, "q", {"kind": "avg", "sources": names, "precision": 2.0})
    agents = {}
    for k, name in enumerate(names[:2]):
        agents["d" + name], birth = born("d" + name, [name], [float(k)], 1.0 + k)
        _pump(h, agents, 1.0 + k, h.record(1.0 + k, "d" + name, "state", birth))
    p, src = h.coord.protocol, h.coord.cache.sources
    _pump(h, agents, 3.0, p._install(h.coord, "s0", 4.5) or h.coord._flush(3.0))  # a reallocation widened s0
    p._moved("s0")
    want = {key: p._width(s) for key, s in src.items()}
    assert want == {"s0": 4.5, "s1": 2.0}
    want["s2"] = p.rows.uniform("s2")
    want = p.rows.fit(want) if rule == "shrink" else dict.fromkeys(want, 2.0)
    assert want["s0"] < 4.5                                     # 4.5 + 2 + 2 overfills the row of 8
    agents["ds2"], birth = born("ds2", ["s2"], [2.0], 4.0)
    _pump(h, agents, 4.0, h.record(4.0, "ds2", "state", birth))
    assert {key: s.filt.width for key, s in src.items()} == want
    assert sum(s.filt.width for s in src.values()) <= 8.0
    if rule == "estimate":
        assert p.stats["syncs"] == 1 and not p.ledger.off and agents["ds0"].meter.shadows == [None]


@pytest.mark.parametrize("protocol", ["ft-nrp", "zt-nrp", "nofilter"])
def test_a_range_query_over_all_answers_over_every_newborn(protocol):
    # an "all" query takes newborns in by replacement; entity protocols keep per-query state built at
    # registration, so they get a removal and an addition (in place, the state kept the first sources
    # and the answer missed the newborns, undegraded). Oracle: the members in range among the born.
    h = Host(protocol=protocol, beat=0.0, t0=0.0)
    h.spec(0.5, "r", {"kind": "range", "sources": "all", "range": [0, 10], "fp_tolerance": 0.0,
                      "fn_tolerance": 0.0})
    agents, values = {}, {}
    for k, v in enumerate([5.0, 6.0, 20.0, 7.0, -3.0]):
        dev, now = "d%d" % k, 1.0 + k
        agents[dev], birth = born(dev, ["s%d" % k], [v], now)
        values["s%d" % k] = v
        out = _pump(h, agents, now, h.record(now, dev, "state", birth))
        out += _pump(h, agents, now + 0.5, h.record(now + 0.5, None, "tick", b""))
        got = answers(out)[-1]
        assert sorted(got["members"]) == sorted(s for s, x in values.items() if 0 <= x <= 10), (k, got)
        assert not got["degraded"]


def test_a_relay_count_over_all_reaches_every_newborn_relay():
    # the relay protocol sends a query's metadata (moq) to the relays it names; in place, a newborn
    # relay never got it (its moq was "sent" already). Oracle: every born relay holds the query.
    from edge.core.relay import RelayNode
    h = Host(protocol="relay", t0=0.0)
    h.spec(0.5, "c", {"kind": "count", "sources": "all", "error": 0.01, "window": [0, 100]})
    got = {}
    for k in range(3):
        dev, now = "r%d" % k, 1.0 + k
        node = RelayNode(dev, boot=k + 1)
        out = h.record(now, dev, "state", node.start(now)[0][1])
        for a in out:
            if a[0] == "down" and codec.decode(a[2])[0] == "moq":
                got.setdefault(a[1], []).append(codec.decode(a[2])[1]["qid"])
        assert sorted(d for d, q in got.items() if "c" in q) == ["r%d" % i for i in range(k + 1)], (k, got)


def test_an_all_query_a_birth_makes_invalid_is_removed_and_its_devices_hear_it():
    # a weighted "all" query stops fitting its weights when a device is born: it is refused and removed,
    # and the removal's downlink (no query: width ∞) reaches the devices (a failed replacement dropped it)
    h = Host(protocol="deadband", t0=0.0)
    h.spec(0.5, "w", {"kind": "sum", "sources": "all", "weights": [2], "precision": 1.0})
    agents = {}
    agents["d0"], birth = born("d0", ["a"], [1.0], 1.0)
    _pump(h, agents, 1.0, h.record(1.0, "d0", "state", birth))
    assert h.coord.cache.sources["a"].filt.width == 0.5
    agents["d1"], birth = born("d1", ["b"], [2.0], 2.0)
    out = h.record(2.0, "d1", "state", birth)
    assert ("error", "w") in [a[:2] for a in out] and "w" not in h.coord.queries and "w" not in h.specs
    down = [codec.decode(a[2]) for a in out if a[0] == "down" and a[1] == "d0"]
    assert [m["width"] for kind, m in down if kind == "width"] == [math.inf], down
    _pump(h, agents, 2.0, out)
    assert agents["d0"].filters[0].width == math.inf
