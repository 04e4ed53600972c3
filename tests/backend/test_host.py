"""backend/host.py, the adapter every driver shares: the spec rule (event time, waiting specs, dynamic
"all", removal), robustness against bad specs, and one guarantee vocabulary on every answer path
(live adapter JSON, Spark rows)."""
import json
import math

import pytest

import drivers
from backend import host
from backend.bench.births import pump as _pump
from backend.host import Host
from backend.spark import job
from edge.agent import Agent
from edge.core import codec, topics

FLEET = drivers.FLEET


def born(device, names, values, now, boot=1):
    """A device's birth payload carrying ``values`` as its last readings."""
    a = Agent(device, names, boot=boot)
    for i, v in enumerate(values):
        a.handle_sample(now, i, v)
    return a, a.start(now)[0][1]


def kinds(out):
    return [a[0] for a in out]


def answers(out):
    return [a[1] for a in out if a[0] == "answer"]


def test_specs_take_effect_at_event_time_never_before_the_clock():
    h = Host(protocol="naive", latency=2.0, t0=0.0)
    _, birth = born("d1", ["a"], [5.0], 10.0)
    assert h.record(10.0, "d1", "state", birth) == []                  # held for λ
    h.record(13.0, None, "tick", b"")
    assert h.coord.clock == 10.0                                       # the tick at t0 + T = 10
    first = answers(h.record(13.0, "q1", "spec", b'{"kind": "sum", "sources": ["a"]}'))
    assert [a["time"] for a in first] == [11.0]                        # now - λ
    late = answers(h.record(13.5, "q2", "spec", b'{"kind": "max", "sources": ["a"]}'))
    assert [a["time"] for a in late] == [11.5]
    h.record(40.0, None, "tick", b"")
    assert h.coord.clock == 30.0
    early = answers(h.record(35.0, "q3", "spec", b'{"kind": "min", "sources": ["a"]}'))
    assert [a["time"] for a in early] == [38.0]                        # arrival times are made monotone
    assert h.event_time(0.0) == h.coord.clock == 30.0                  # and never before the clock


def test_specs_for_unborn_sources_wait_and_all_follows_births():
    h = Host(protocol="deadband", period=5.0)
    agents = {}
    out = h.spec(1.0, "tot", '{"kind": "sum", "sources": "all", "precision": 2}')
    assert out == [("error", "tot", "waiting for sources all to be born")]
    out = h.spec(1.0, "two", {"kind": "sum", "sources": ["a", "c"], "precision": 2})
    assert out == [("error", "two", "waiting for sources a, c to be born")] and sorted(h.pending) == ["tot", "two"]
    agents["d1"], birth = born("d1", ["a", "b"], [1.0, 2.0], 2.0)
    tot = answers(_pump(h, agents, 2.0, h.record(2.0, "d1", "state", birth)))
    assert {a["query"] for a in tot} == {"tot"} and tot[-1]["lo"] <= 3.0 <= tot[-1]["hi"] <= tot[-1]["lo"] + 2.0 + 1e-9
    assert h.coord.queries["tot"].sources == ["a", "b"] and list(h.pending) == ["two"]
    agents["d2"], birth = born("d2", ["c"], [10.0], 3.0)
    out = h.record(3.0, "d2", "state", birth)
    assert sorted({a["query"] for a in answers(out)}) == ["tot", "two"] and not h.pending
    assert h.coord.queries["tot"].sources == ["a", "b", "c"]          # "all" took the newcomer in
    _pump(h, agents, 3.0, out)                                       # the narrowings are acknowledged
    last = h.coord.last["tot"]
    assert last["lo"] <= 13.0 <= last["hi"] and last["hi"] - last["lo"] <= 2.0 + 1e-9
    assert h.stats["bad_specs"] == 0 and h.records == 7             # two births, five acknowledgements


class _Counted(dict):
    """A dict counting membership tests (``in``)."""
    tests = 0

    def __contains__(self, key):
        _Counted.tests += 1
        return dict.__contains__(self, key)


@pytest.mark.parametrize("order", ["spec", "reversed", "shuffled"])
def test_a_waiting_spec_over_many_sources_registers_at_its_last_birth_at_linear_cost(order):
    import random
    n = 300
    names = ["s%d" % i for i in range(n)]
    h = Host(protocol="naive", t0=0.0)
    h.coord.cache.sources = _Counted()
    assert h.spec(0.5, "big", {"kind": "sum", "sources": names, "precision": 5})[0][0] == "error"
    births = {"spec": names, "reversed": names[::-1], "shuffled": random.Random(7).sample(names, n)}[order]
    _Counted.tests = 0
    for k, name in enumerate(births):
        _, birth = born("d-" + name, [name], [float(k)], 1.0 + k)
        out = h.record(1.0 + k, "d-" + name, "state", birth)
        assert ("big" in h.pending) == (k < n - 1)          # brute force: a source of the spec is unborn
        assert bool(answers(out)) == (k == n - 1)
    assert h.coord.queries["big"].sources == names and answers(out)[0]["lo"] <= sum(range(n)) <= answers(out)[0]["hi"]
    # each source is looked for until it is born, not once per birth (that was n²/2 = 45,000 here)
    assert _Counted.tests <= 12 * n, _Counted.tests


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
    h = Host(protocol=protocol, t0=0.0)
    h.spec(0.5, "tot", {"kind": "avg", "sources": "all", "precision": precision})
    agents, values = {}, {}
    for k in range(n):
        dev, now = "d%d" % k, 1.0 + k
        agents[dev], birth = born(dev, ["s%d" % k], [float(k % 7)], now)
        values["s%d" % k] = float(k % 7)
        widths = {s.device: s.filt.width for s in h.coord.cache.sources.values()}
        out = h.record(now, dev, "state", birth)
        out = _pump(h, agents, now, out) if acked else out
        if acked:
            assert {a[1] for a in out if a[0] == "down"} == {dev}
        else:       # an unacknowledged narrowing is sent again as it is; no other device gets a new width
            others = [(a[1], codec.decode(a[2])) for a in out if a[0] == "down" and a[1] != dev]
            assert all(kind == "width" and m["width"] == widths[d] for d, (kind, m) in others), (k, others)
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
    h = Host(protocol=protocol, declared=names, t0=0.0)
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
    h = Host(protocol=protocol, t0=0.0)
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
    # brownian keeps per-query state, so an "all" query takes newborns in by a removal and an addition; the
    # removal alone took every device out of segment mode (and the addition put it back), restarting the
    # query's final answers at every birth. Oracle: only the newborn is told its segment mode.
    h = Host(protocol="brownian", latency=0.5, t0=0.0)
    h.spec(0.5, "q", {"kind": "sum", "sources": "all", "precision": 2.0, "lag": 2.0})
    agents, start = {}, None
    for k in range(6):
        dev, now = "d%d" % k, 1.0 + k
        agents[dev], birth = born(dev, ["s%d" % k], [float(k)], now)
        out = h.record(now, dev, "state", birth) + h.record(now + 0.6, None, "tick", b"")   # births wait λ
        told = [a[1] for a in out if a[0] == "down" and codec.decode(a[2])[0] == "segment"]
        assert told == [dev], (k, told)
        start = h.coord.segments.start["q"] if start is None else start
        assert h.coord.segments.start["q"] == start                    # its final answers go on from there
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


def test_a_birth_that_would_overfill_a_row_settles_the_fleet():
    # adaptive's fast path gives a newborn its share only when its rows have room; when moved widths
    # filled a row, the birth settles every width (oracle: Rows.fit of the widths with the newborn at its
    # share) and the row stays within its budget
    names = ["s%d" % i for i in range(4)]
    h = Host(protocol="adaptive", declared=names, t0=0.0)
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
    want = p.rows.fit(want)
    assert want["s0"] < 4.5                                     # 4.5 + 2 + 2 overfills the row of 8
    agents["ds2"], birth = born("ds2", ["s2"], [2.0], 4.0)
    _pump(h, agents, 4.0, h.record(4.0, "ds2", "state", birth))
    assert {key: s.filt.width for key, s in src.items()} == want
    assert sum(s.filt.width for s in src.values()) <= 8.0


@pytest.mark.parametrize("protocol", ["ft-nrp", "zt-nrp", "nofilter"])
def test_a_range_query_over_all_answers_over_every_newborn(protocol):
    # an "all" query takes newborns in by replacement; entity protocols keep per-query state built at
    # registration, so they get a removal and an addition (in place, the state kept the first sources
    # and the answer missed the newborns, undegraded). Oracle: the members in range among the born.
    h = Host(protocol=protocol, t0=0.0)
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


def test_bad_specs_are_refused_with_a_reason_and_removal_retracts():
    h = Host(protocol="naive", t0=0.0)
    _, birth = born("d1", ["a"], [1.0], 1.0)
    h.record(1.0, "d1", "state", birth)
    caller = {"kind": "sum", "sources": ["a"]}
    assert answers(h.spec(2.0, "q", caller)) and caller == {"kind": "sum", "sources": ["a"]}
    for bad, why in ((b"{x", "not JSON"), (b"\xff\xfe", "not JSON"), ("[1]", "JSON object"), (7, "JSON object"),
                     ({"kind": "sum", "id": "other"}, "differs"), ({"kind": "median"}, "kind must be"),
                     ({"kind": "sum", "sources": ["a"], "precision": "x"}, "precision")):
        out = h.spec(3.0, "bad", bad)
        assert kinds(out) == ["error"] and why in out[0][2], (bad, out)
    assert h.spec(3.0, "", {"kind": "sum"})[0][0] == "error" and h.spec(3.0, None, b"")[0][0] == "error"
    assert h.set_precision(3.0, "nope", 1.0)[0][0] == "error"
    assert h.stats["bad_specs"] == 10 and "bad" not in h.coord.queries
    assert h.record(4.0, "q", "spec", b"  ")[-1] == ("retract", "q") and "q" not in h.coord.queries
    assert h.record(4.0, None, "ctl", b"x") == [] and h.stats["foreign"] == 1 and h.records == 3


def test_a_protocol_refusing_a_query_leaves_nothing_behind():
    h = Host(protocol="relay", declared=["r1", "r2"], t0=0.0)
    out = h.spec(1.0, "j", {"kind": "sum", "sources": ["r1"], "window": "yesterday"})
    assert kinds(out) == ["error"] and "window" in out[0][2]
    assert not h.coord.queries and not h.specs and not any(h.coord.by_source.get(s) for s in ("r1", "r2"))


def test_t0_is_the_first_record_or_the_given_one():
    h = Host()
    h.record(1234.7, None, "tick", b"")
    assert h.t0 == h.coord.t0 == 1234.0
    live = Host(t0=99.25)
    live.record(1234.7, None, "tick", b"")
    assert live.coord.t0 == 99.25


def test_guarantee_vocabulary_and_strict_json():
    assert host.guarantee({"lo": 1, "hi": 2, "degraded": False}) == "interval"
    assert host.guarantee({"members": [], "degraded": False}) == "tolerance"
    assert host.guarantee({"lo": 1, "hi": 2, "guarantee": "probabilistic", "degraded": True}) == "degraded"
    with pytest.raises(ValueError):
        host.guarantee({"lo": 1, "hi": 2, "guarantee": "set"})
    rec = json.loads(host.answer_json({"time": 1.0, "query": "q", "lo": -math.inf, "hi": math.inf, "degraded": True}))
    assert rec == {"time": 1.0, "query": "q", "lo": "-inf", "hi": "inf", "degraded": True, "guarantee": "degraded",
                   "reason": "degraded by the protocol", "final": False}
    assert set(host.GUARANTEES) >= {"interval", "probabilistic", "tolerance", "degraded"}


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


def _fleet_records():
    """Two devices born, a range (entity) or sum query, then device d2's Last Will."""
    a1, b1 = born("d1", ["a", "b"], [100.0, 130.0], 1.0)
    a2, b2 = born("d2", ["c"], [101.0], 1.0)
    return [(1.0, topics.device(FLEET, "d1", "state"), b1), (1.0, topics.device(FLEET, "d2", "state"), b2),
            (2.0, topics.query(FLEET, "r", "spec"), b'{"kind": "range", "range": [90, 110], "fp_tolerance": 0.2}'),
            (2.0, topics.query(FLEET, "s", "spec"), b'{"kind": "sum", "sources": ["a", "c"], "precision": 1}'),
            (3.0, topics.tick(FLEET), b""), (4.0, topics.device(FLEET, "d2", "state"), a2.will())]


@pytest.mark.parametrize("protocol, query", [("ft-nrp", "r"), ("deadband", "s")])
def test_members_say_tolerance_and_degraded_answers_give_a_reason(tmp_path, protocol, query):
    records = [r for r in _fleet_records() if not r[1].endswith("/spec") or "/%s/" % query in r[1]]
    settings = host.settings(protocol=protocol, period=10.0)
    live = [a for a in _live(settings, records, tmp_path) if a["query"] == query]
    spark = [(g, a) for g, a in _spark(settings, records) if a["query"] == query]
    assert [a["guarantee"] for a in live] == [g for g, _ in spark]
    fine, degraded = live[-2], live[-1]
    assert fine["guarantee"] == ("tolerance" if protocol == "ft-nrp" else "interval")
    if protocol == "ft-nrp":
        assert fine["members"] == ["a", "c"]
    assert degraded["time"] == 4.0 and degraded["guarantee"] == "degraded" and degraded["reason"].startswith("offline: c")


@pytest.mark.parametrize("bad", [{"period": "10"}, {"latency": math.nan}, {"shrink": True}, {"t0": "now"},
                                 {"protocol": 3}, {"params": [1]}, {"colour": "red"},
                                 {"protocol": "adaptive", "params": {"nonsense": 1}}, {"protocol": "nope"}])
def test_bad_settings_are_a_clear_error(bad):
    with pytest.raises(ValueError):
        Host(bad)


def test_link_loss_degrades_answers_alike_in_the_live_and_spark_paths(tmp_path):
    """The live client's disconnect and the bridge's ``link`` records take one path (``Host``): answers
    degrade at the loss (twice lost is one loss), time moves on, and the restore asks every device
    for a fresh birth, once."""
    from backend.live.coordinator import LiveCoordinator
    settings = host.settings(protocol="deadband", period=10.0, latency=0.5)
    base = [r for r in _fleet_records()[:-1] if "/r/" not in r[1]]      # births, sum query s, a tick
    link = topics.spool(FLEET, "link")
    ticks = [(t, topics.tick(FLEET), b"") for t in (6.0, 8.0, 12.0)]
    records = base + [(5.0, link, b"lost"), (5.5, link, b"lost")] + ticks + [(13.0, link, b"restored")]
    from backend.spark.source import parse_topic
    cols = job.run_batch(Host(settings), [(t, *parse_topic(topic), p, False) for t, topic, p in records])
    spark = [json.loads(b) for k, b in zip(cols["kind"], cols["body"]) if k == "answer"]
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
    assert [(a["time"], a["degraded"], a["guarantee"]) for a in lines if "error" not in a] == \
        [(a["time"], a["degraded"], host.guarantee(a)) for a in spark]
    assert live.stats["dropped_down"] == len(downs) and not live.host.blind     # no broker here: counted


def _closed_loop(h, agent, records, deliver=True):
    """Feed ``records`` (``(now, name, channel, payload)``) to ``h``; its downlinks go to ``agent``
    (whose uplinks come back at once) unless ``deliver`` is false. Returns the downlink payloads."""
    downs, queue = [], list(records)
    while queue:
        now, name, channel, payload = queue.pop(0)
        for a in h.record(now, name, channel, payload):
            if a[0] == "down":
                downs.append(a[2])
                if deliver:
                    queue[:0] = [(now, "dev", ch, p) for ch, p in agent.handle_message(now, a[2])]
    return downs


def test_a_new_backend_run_configures_devices_first_and_the_old_runs_replay_is_dropped():
    """A crash between publishing and committing: the new run (a later incarnation, a spool record)
    replays from the last state; its first control to a device is a config of the new run, and the
    old run's controls, delivered late, are all dropped by the device, whose state follows the new run."""
    import copy
    import random
    settings = host.settings(protocol="adaptive", period=2.0, shrink=0.1)
    agent = Agent("dev", ["a", "b"], boot=5)
    h = Host(settings)
    start = [(0.0, None, "inc", b"100"), (0.0, "dev", "state", agent.start(0.0)[0][1]),
             (0.0, "q", "spec", b'{"kind": "sum", "sources": ["a", "b"], "precision": 4}')]
    _closed_loop(h, agent, start)
    assert agent.inc == 100
    rng, t, later = random.Random(3), 0.0, []
    values = [100.0, 50.0]
    for _ in range(120):                # the batch after the last commit: readings and ticks
        t = round(t + 0.25, 9)
        for i in range(2):
            values[i] += rng.uniform(-2, 2)
            later += [(t, "dev", "up", p) for _, p in agent.handle_sample(t, i, values[i])]
        later.append((t, None, "tick", b""))
        if t in (5.0, 10.0, 20.0):      # the user tightens and loosens the query: new widths for both
            later.append((t, "q", "spec", b'{"kind": "sum", "sources": ["a", "b"], "precision": %d}' % (t // 4)))
    committed, replayed = copy.deepcopy(h), copy.deepcopy(h)
    old = _closed_loop(h, agent, later, deliver=False)              # published, then the crash
    assert old and _closed_loop(replayed, agent, later, deliver=False) == old   # a replay is the same bytes
    new = _closed_loop(committed, agent, [(t, None, "inc", b"200")] + later, deliver=False)
    assert [codec.decode(p)[1]["inc"] for p in new] == [200] * len(new)
    assert codec.decode(new[0])[0] in ("config", "setup")
    for p in new:
        agent.handle_message(t, p)
    state = [(f.width, f.epoch) for f in agent.filters]
    stale = agent.stats["stale"]
    for p in old:                        # the old run's output arrives after all
        assert agent.handle_message(t + 1, p) == []
    assert agent.stats["stale"] == stale + len(old) and agent.inc == 200
    assert [(f.width, f.epoch) for f in agent.filters] == state


def test_a_new_run_after_one_that_died_blind_starts_linked():
    h = Host(host.settings(protocol="deadband", period=10.0))
    for now, topic, payload in _fleet_records()[:2]:
        h.record(now, topic.split("/")[3], "state", payload)
    assert h.record(2.0, None, "link", b"restored") == [] and not h.blind      # not lost: nothing to do
    h.record(3.0, None, "link", b"lost")
    assert h.blind
    out = h.record(9.0, None, "inc", b"7")           # the run died blind; the next one starts linked
    assert [(a[1], codec.decode(a[2])[0]) for a in out if a[0] == "down"] == [("d1", "rebirth"), ("d2", "rebirth")]
    assert not h.blind and h.coord.inc == 7
    assert h.record(9.0, None, "inc", b"x7") == [] and h.stats["foreign"] == 1 and h.coord.inc == 7


def test_reports_from_a_device_not_born_yet_ask_for_one_birth_not_one_per_report():
    """Each rebirth request makes the device send a new birth whose token voids the controls answering
    the previous one; a request per early report kept a live device from ever taking a control."""
    h = Host(host.settings(protocol="deadband", latency=0.5))
    agent = Agent("dev", ["a"], boot=3)
    agent.handle_sample(0.0, 0, 1.0)
    agent.start(0.0)
    asks = []
    for k in range(40):                  # 4 s of reports before the birth reaches this backend
        t = k / 10
        for _, p in agent.handle_sample(t, 0, float(k)):
            asks += [a for a in h.record(t, "dev", "up", p) if a[0] == "down" and codec.decode(a[2])[0] == "rebirth"]
    assert 1 <= len(asks) <= 3           # once per λ + 1 s = 1.5 s
    births = [p for a in asks for _, p in agent.handle_message(4.0, a[2])]
    assert len(births) == len(asks)


def test_a_birth_right_behind_early_reports_is_not_asked_for_again():
    """A device sends what it read before connecting, then its birth: asking at the first early report
    made a second birth that voided the controls answering the first (3 stale controls per device)."""
    h = Host(host.settings(protocol="deadband", latency=0.5))
    h.spec(0.0, "q", {"kind": "sum", "sources": ["a"], "precision": 2.0})
    agent = Agent("dev", ["a"], boot=3, width=1.0)
    out = []
    for t, v in ((0.0, 1.0), (0.1, 5.0)):           # read before the link is up: reported
        for ch, p in agent.handle_sample(t, 0, v):
            out += h.record(0.3, "dev", ch, p)
    out += h.record(0.3, "dev", "state", agent.start(0.3)[0][1])
    out += h.timer(2.0)
    downs = [a[2] for a in out if a[0] == "down"]
    assert downs and "rebirth" not in [codec.decode(p)[0] for p in downs]
    for p in downs:
        agent.handle_message(2.0, p)
    assert agent.stats["stale"] == 0 and agent.inc is not None
