"""The MicroPython agent on a small heap under a broker that stalls (DESIGN.md §3 reconnect, §9): the unix port runs
the precompiled agent (qfagent's own loop) with ``-X heapsize`` on a stand-in link (tests/firmware/stalled/link.py)
that puts three sources in segment mode and ack mode, then stops taking anything for a while: the outbox is fed far
faster than it drains (about 300 segment records a second) and no ack comes. The agent must run on, its heap
bounded, and what it delivered must hold against its own ground-truth log: every segment record contains the
readings it covers, and a stretch of a source no record covers lies across a sequence number that never arrived
(the gap the backend resynchronises), never across a silent hole."""
import json
import os
import subprocess

import pytest

from backend.live.fleet import micropython_available, micropython_binary
from edge.core import codec
from firmware.build import MODULES, compile_modules

HERE = os.path.dirname(os.path.abspath(__file__))
HEAP = "96k"            # the heap an emulated agent died in (fresh-clone CI of 5f1a830)
SOURCES = [{"name": "s%d" % i, "kind": "walk", "start": 10.0 * i, "step": 0.5, "seed": 3 + i} for i in range(3)]


def _run(tmp, heap, stall=(3000, 8000), run_for=15):
    mpy = compile_modules(os.path.join(tmp, "mpy"), [m for m in MODULES if m[0] != "qfboard.py"])
    cfg = {"fleet": "t", "device": "m0", "password": "x", "period": 0.01, "width": 2.0, "outbox": 32,
           "ground_truth": os.path.join(tmp, "truth.csv"), "run_for": run_for, "sources": SOURCES,
           "stall": list(stall), "uplinks": os.path.join(tmp, "up.txt"), "seg_lag": 2000, "seg_width": 0.2}
    path = os.path.join(tmp, "m0.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    env = dict(os.environ, MICROPYPATH=os.path.join(HERE, "stalled") + os.pathsep + mpy)
    r = subprocess.run([micropython_binary(), "-X", "heapsize=" + heap, "-m", "qfagent", path], cwd=tmp, env=env,
                       capture_output=True, text=True, timeout=120)
    stats = [json.loads(line)["stats"] for line in r.stdout.splitlines() if line.startswith('{"stats"')]
    return r, (stats or [None])[0], cfg


def _uplinks(path):
    out = []
    with open(path) as f:
        for line in f:
            ms, hexed = line.split()
            out.append(codec.decode(bytes.fromhex(hexed)))
    return out


def _truth(path):
    rows = {}
    with open(path) as f:
        for line in f:
            t, s, v = line.strip().split(",")
            rows.setdefault(s, []).append((int(round(float(t) * 1000)), float(v)))
    return rows


def test_a_heap_limited_agent_rides_out_a_stalled_broker_and_what_it_sends_holds(tmp_path):
    if not micropython_available():
        pytest.skip("no MicroPython unix port")
    r, stats, cfg = _run(str(tmp_path), HEAP)
    assert r.returncode == 0 and stats is not None, (r.returncode, r.stdout[-1500:], r.stderr[-1500:])
    print("\nheap %s, stalled %d ms: %s" % (HEAP, cfg["stall"][1], {k: stats[k] for k in (
        "heap_peak", "heap_used", "outbox_dropped", "oom", "overflow", "resent", "reports", "samples")}))
    assert stats["heap_peak"] < 96 * 1024 and stats["outbox_dropped"] > 0 and stats["samples"] > 3000, stats
    assert stats["oom"] <= 1, stats     # (collections only on a failed allocation: 36-50 MemoryErrors, a gap and birth each)
    ups = _uplinks(cfg["uplinks"])
    births = [m["seq"] for kind, m in ups if kind == "birth"]
    assert len(births) >= 2, births                       # the first, after the broker came back (and after each oom)
    seqs = [m["seq"] for _, m in ups]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    missing = sorted(set(range(seqs[0], seqs[-1] + 1)) - set(seqs))
    assert missing                                        # what the outbox dropped: gaps the backend sees
    truth = _truth(cfg["ground_truth"])
    names = [s["name"] for s in SOURCES]
    last = {}                                             # source -> (record, seq of its message)
    checked = holes = 0
    for kind, m in ups:
        if kind not in ("segs", "rsegs"):
            continue
        for rec in m["segs"]:
            xs = [(t, x) for t, x in truth[names[rec["src"]]] if rec["a"] <= t < rec["e"]]
            for t, x in xs:
                y = rec["v"] + rec["s"] * (t - rec["a"])
                assert abs(x - y) <= rec["w"] / 2 + 1e-6 * (1 + abs(x)), (rec, t, x, y)
            checked += len(xs)
            prev = last.get(rec["src"])
            if prev is not None and rec["a"] > prev[0]["e"]:           # a stretch no record covers ...
                holes += 1
                assert any(prev[1] < k < m["seq"] for k in missing), (prev, rec, m["seq"])   # ... lies across a gap
            last[rec["src"]] = (rec, m["seq"])
    print("%d readings checked against %d records; %d uncovered stretches, each across a gap of %d missing numbers"
          % (checked, sum(len(m["segs"]) for k, m in ups if k in ("segs", "rsegs")), holes, len(missing)))
    assert checked > 300 and holes > 0
