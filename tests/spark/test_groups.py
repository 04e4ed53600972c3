"""Query groups (backend.spark.groups) against brute-force connected components."""
import json
import random

from backend.spark.groups import Journal, Router, components
from edge.core import codec


def brute(specs, devices):
    """Devices joined through queries: a query touches a device when it names one of its sources (or
    is over "all"), and two queries touch when they name a common source (one not born yet, say).
    BFS over devices and queries; a group is named by its smallest device."""
    names = sorted(devices)
    nodes = [("d", d) for d in names] + [("q", q) for q in sorted(specs)]

    def srcs(q):
        return specs[q].get("sources", "all")

    def edge(a, b):
        if a[0] == "d" and b[0] == "d":
            return False
        if a[0] == "d":
            a, b = b, a
        if b[0] == "d":
            return srcs(a[1]) == "all" or any(s in srcs(a[1]) for s in devices[b[1]])
        sa, sb = srcs(a[1]), srcs(b[1])
        return sa != "all" and sb != "all" and any(s in sb for s in sa)
    group = {}
    for d in names:
        if d in group:
            continue
        seen, todo = {("d", d)}, [("d", d)]
        while todo:
            x = todo.pop()
            for n in nodes:
                if n not in seen and edge(x, n):
                    seen.add(n)
                    todo.append(n)
        members = [n[1] for n in seen if n[0] == "d"]
        for n in members:
            group[n] = min(members)
    return group


def random_case(rng):
    nd = rng.randrange(1, 12)
    devices = {"d%d" % i: ["s%d_%d" % (i, j) for j in range(rng.randrange(1, 4))] for i in range(nd)}
    pool = [s for srcs in devices.values() for s in srcs] + ["ghost%d" % i for i in range(3)]
    specs = {}
    for q in range(rng.randrange(0, 6)):
        if rng.random() < 0.08:
            specs["q%d" % q] = {"kind": "sum", "sources": "all"}
        else:
            specs["q%d" % q] = {"kind": "sum", "sources": rng.sample(pool, rng.randrange(1, 4))}
    return specs, devices


def birth(sources):
    return codec.encode("birth", {"seq": 1, "t": 0.0, "boot": 1, "fw": "x", "caps": 0, "first": 0,
                                  "sources": [{"name": s, "epoch": 0, "width": 0.0, "v": 1.0} for s in sources]})


def partition(group):
    blocks = {}
    for d, g in group.items():
        blocks.setdefault(g, set()).add(d)
    return sorted(sorted(b) for b in blocks.values())


def test_components_equal_brute_force():
    rng = random.Random(3)
    for _ in range(500):
        specs, devices = random_case(rng)
        assert components(specs, devices) == brute(specs, devices)


def test_router_in_any_order_gives_the_components_and_replays():
    """Births and specs in a random order (some spec first, some device first): the router's groups
    are the components of every spec it saw; a replay of its journal gives the same table."""
    rng = random.Random(4)
    for _ in range(300):
        specs, devices = random_case(rng)
        events = [(d, "state", birth(s)) for d, s in devices.items()]
        events += [(q, "spec", json.dumps(spec).encode()) for q, spec in specs.items()]
        events += [(d, "up", b"x") for d in devices]
        rng.shuffle(events)
        r, journal = Router(), []
        for e in events + [(None, "tick", b"")]:
            rows, changed = r.route(*e)
            if changed:
                journal.append(e)
            if e[0] is not None:        # the record itself goes last, to its node's group
                assert rows[-1] == (r.find(("q/" if e[1] == "spec" else "d/") + e[0]),) + e
        got = {d: r.find("d/" + d) for d in devices}
        assert partition(got) == partition(components(specs, devices))
        again = Router()
        again.replay(journal)
        assert {d: again.find("d/" + d) for d in devices} == got and again.info == r.info
        assert set(r.queried) == {g for g, i in r.info.items() if i["queries"]} and list(r.queried) == list(again.queried)


def test_removed_and_narrowed_queries_split_groups_like_the_components_of_what_remains():
    """Births, specs, removals and narrowings in a random order: after every record the router's groups
    are the components of the births and specs in force (brute force); a split retires the group that
    fell apart (after the spec, which its Host still takes), each part gets a fresh key with the part's
    specs and an adopt per device it had routed; a replay of the journal gives the same table."""
    rng = random.Random(6)
    splits = 0
    for _ in range(300):
        specs, devices = random_case(rng)
        pool = [s for srcs in devices.values() for s in srcs] + ["ghost0", "ghost1"]
        events = [(d, "state", birth(s)) for d, s in devices.items()]
        events += [(q, "spec", json.dumps(spec).encode()) for q, spec in specs.items()]
        events += [(d, "up", b"x") for d in devices]
        rng.shuffle(events)
        for q in list(specs) + ["q9"]:
            if rng.random() < 0.5:
                events.append((q, "spec", b""))                 # removed
            elif rng.random() < 0.5:
                narrow = {"kind": "sum", "sources": rng.sample(pool, 1)}
                events.append((q, "spec", json.dumps(narrow).encode()))
        events += [(d, "up", b"y") for d in devices]
        r, journal, live, born = Router(), [], {}, {}
        for e in events:
            groups_before = set(r.info)
            rows, changed = r.route(*e)
            if changed:
                journal.append(e)
            name, channel, payload = e
            if channel == "spec":
                if payload:
                    live[name] = json.loads(payload)
                else:
                    live.pop(name, None)
            elif channel == "state":
                born[name] = devices[name]
            got = {d: r.find("d/" + d) for d in born}
            assert partition(got) == partition(brute(live, born)), (e, live)
            fresh = {g for g in r.info if g.startswith("g/")} - groups_before
            if channel == "spec" and fresh:
                splits += 1
                at = next(i for i, row in enumerate(rows) if row[1:] == e)
                split = rows[at][0]                                  # the spec reached the group that split
                assert split not in r.info and all(row[0] != split for row in rows[at + 1:] if row[2] != "retire")
                assert split not in groups_before or (split, None, "retire", b"") in rows[at + 1:]
                for g in fresh:
                    mine = [row for row in rows if row[0] == g]
                    assert [row[1] for row in mine if row[2] == "spec"] == r.info[g]["queries"]
                    assert {row[1] for row in mine if row[2] == "adopt"} == set(r.info[g]["devices"]) & r.routed
        again = Router()
        again.replay(journal)
        assert {d: again.find("d/" + d) for d in born} == {d: r.find("d/" + d) for d in born}
        assert again.info == r.info and list(r.queried) == list(again.queried)
        assert {g for g, i in r.info.items() if set(i["queries"]) & set(r.specs)} <= set(r.queried) <= set(r.info)
    assert splits > 50


def test_merge_retires_the_younger_group_and_adopts_its_devices():
    r = Router()
    assert r.route(None, "inc", b"7")[0] == []                    # no group yet
    rows = r.route("a", "state", birth(["x"]))[0]
    assert rows == [("d/a", None, "inc", b"7"), ("d/a", "a", "state", birth(["x"]))]
    r.route("b", "state", birth(["y"]))
    r.route("qa", "spec", b'{"kind": "sum", "sources": ["x"]}')
    qb = b'{"kind": "sum", "sources": ["y"]}'
    r.route("qb", "spec", qb)
    assert [g for g, *_ in r.route(None, "tick", b"")[0]] == ["d/a", "d/b"]
    rows = r.route("ab", "spec", b'{"kind": "max", "sources": ["x", "y"]}')[0]
    assert rows == [("d/b", None, "retire", b""), ("d/a", "qb", "spec", qb), ("d/a", "b", "adopt", b""),
                    ("d/a", "ab", "spec", b'{"kind": "max", "sources": ["x", "y"]}')]
    assert r.route("b", "up", b"r")[0] == [("d/a", "b", "up", b"r")]
    assert r.route("b", "ctl", b"c")[0] == [("d/a", "b", "ctl", b"c")]     # an echo follows its device
    assert r.route("nobody", "ctl", b"c")[0] == []                         # ... and needs one
    # a device born later into an "all" query joins its group without an adoption
    r.route("every", "spec", b'{"kind": "count", "sources": "all"}')
    rows = r.route("c", "state", birth(["z"]))[0]
    assert rows == [("d/a", "c", "state", birth(["z"]))]


def test_journal_rebuilds_the_table_at_any_planned_offset(tmp_path):
    """A restart at offset k replays the entries below k and drops the rest (planned, never committed),
    and a torn last frame (a crash mid-append) is dropped too; the journal then takes appends again."""
    events = [("a", "state", birth(["x"])), ("b", "state", birth(["y"])),
              ("q", "spec", b'{"kind": "sum", "sources": ["x", "y"]}'), ("c", "state", birth(["z"]))]
    j = Journal(str(tmp_path))
    j.append([(i, *e) for i, e in enumerate(events[:2])])
    j.append([(i + 2, *e) for i, e in enumerate(events[2:])])
    full = j.router(10)
    assert full.find("d/b") == "d/a" and full.find("d/c") == "d/c"
    assert j.router(2).find("d/b") == "d/b"          # before the query: two groups; entries >= 2 dropped
    assert j.router(10).find("d/b") == "d/b" and j._entries() == ([(i, *e) for i, e in enumerate(events[:2])], False)
    with open(j.path, "ab") as f:
        f.write(b"\x00\x00\x01\x00junk")
    assert j._entries()[1] and j.router(10).find("d/a") == "d/a"
    assert j._entries() == ([(i, *e) for i, e in enumerate(events[:2])], False)
    j.append([(2, *events[2])])
    assert j.router(10).find("d/b") == "d/a"
