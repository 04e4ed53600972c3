"""backend/host.py, the adapter every driver shares: the spec rule (event time, waiting specs, removal),
robustness against bad specs and settings, backend runs (incarnations) and birth requests. Births into
registered queries are test_births.py, the answers every path writes test_guarantees.py."""
import math

import pytest

import drivers
from backend import host
from backend.bench.births import pump as _pump
from backend.host import Host
from edge.agent import Agent
from edge.core import codec
from hostkit import answers, born, fleet_records, kinds

FLEET = drivers.FLEET


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


@pytest.mark.parametrize("bad", [{"period": "10"}, {"latency": math.nan}, {"shrink": True}, {"t0": "now"},
                                 {"protocol": 3}, {"params": [1]}, {"colour": "red"},
                                 {"protocol": "adaptive", "params": {"nonsense": 1}}, {"protocol": "nope"}])
def test_bad_settings_are_a_clear_error(bad):
    with pytest.raises(ValueError):
        Host(bad)


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
    for now, topic, payload in fleet_records()[:2]:
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


def test_the_spec_a_query_runs_or_waits_with_again_changes_nothing():
    """A retained spec delivered again (a reconnect re-subscribes; ``coordinator --query`` publishes what it
    registered) is the same query: no action, and the host ends where one that never saw it again ends."""
    import json
    spec = {"kind": "sum", "sources": ["a", "b"], "precision": 4}
    hosts, agents = [Host(host.settings(protocol="adaptive")), Host(host.settings(protocol="adaptive"))], []
    for h in hosts:
        agents.append(Agent("dev", ["a", "b"], boot=5))
        _closed_loop(h, agents[-1], [(0.0, None, "inc", b"100"), (0.0, "dev", "state", agents[-1].start(0.0)[0][1]),
                                     (0.0, "q", "spec", json.dumps(spec).encode()),
                                     (0.0, "w", "spec", b'{"kind": "avg", "sources": ["zz"], "precision": 1}')])
    again = hosts[1]
    assert again.record(1.0, "q", "spec", json.dumps(spec).encode(), True) == []
    assert again.spec(1.0, "q", dict(spec, id="q")) == [] and again.spec(1.0, "q", dict(spec)) == []
    assert again.record(1.0, "w", "spec", b'{"kind": "avg", "sources": ["zz"], "precision": 1}') == []
    for h, agent in zip(hosts, agents):
        for i in range(1, 40):
            out = agent.handle_sample(i * 0.5, i % 2, 10.0 + 3 * (i % 7)) + agent.handle_timer(i * 0.5)
            _closed_loop(h, agent, [(i * 0.5, "dev", ch, p) for ch, p in out] + [(i * 0.5, None, "tick", b"")])
    assert hosts[0].coord.clock > 19.0 and hosts[0].coord.last["q"]["hi"] - hosts[0].coord.last["q"]["lo"] <= 4 + 1e-6
    assert dict(host.digest(hosts[0]), records=0) == dict(host.digest(hosts[1]), records=0)
    changed = again.spec(30.0, "q", dict(spec, precision=6))         # a different spec is a new query
    assert "answer" in kinds(changed) and again.specs["q"]["precision"] == 6
